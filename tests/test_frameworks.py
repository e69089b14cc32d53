"""The training frameworks with a chainiter loader, the real packages
(``pip install -e ".[frameworks]"``): Lightning's and Keras' epochs are
chainiter's, checkpoints taken mid-epoch and after an epoch's last batch
resume exactly in a new process, DCP and Accelerate round trips, HF
datasets' batched access.  Each test skips where its framework does not
import.

The runs stopped mid-way and the uninterrupted runs are made here; each
resume check is one new process (``framework_scripts/``) that resumes
from every checkpoint it is given.
"""

import json
import os
import subprocess
import sys
import warnings

import pytest

import chainiter

from helpers import shm_files, wait_processes_gone, worker_pids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, 'tests', 'framework_scripts')
sys.path.insert(0, SCRIPTS)


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """After each test: no worker process of this process's iterators and
    no shared-memory file of chainiter's (those of the new processes the
    test ran went with them: their files are counted too)."""
    before = shm_files()
    yield
    assert wait_processes_gone(worker_pids(), timeout=10)
    assert shm_files() <= before


def need(*names):
    """Import the frameworks, or skip (their import-time warnings are
    theirs, not the test's)."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for name in names:
            pytest.importorskip(name)


def in_new_process(script, *args):
    env = dict(os.environ, KERAS_BACKEND='torch', PYTHONPATH=os.pathsep.join(
        [ROOT, SCRIPTS] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    done = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, script)] + [
            str(a) for a in args],
        env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def reference(n, repeat, epochs, batch=4, seed=7):
    """Chainiter's epochs: (epoch, labels of each batch)."""
    with chainiter.SerialIterator(list(range(n)), batch, repeat=repeat,
                                  seed=seed) as it:
        return [(e, [int(i) for i in b]) for e in range(epochs)
                for b in it.one_epoch()]


# ---- Lightning --------------------------------------------------------------

def lightning_batches(seen):
    return [(epoch, labels) for epoch, _, labels in seen]


@pytest.mark.parametrize('repeat, kind', [
    (True, 'serial'), (False, 'thread'), (True, 'forkserver')])
def test_lightning_epochs_are_chainiter_epochs(tmp_path, repeat, kind):
    """fit(train_dataloaders=it.loader()): Lightning's epoch e is
    chainiter's epoch e, batch for batch (10 examples in batches of 4:
    with repeat=True epochs of 3, 2, 3, 2 batches)."""
    need('torch', 'lightning')
    import lightning_run
    with lightning_run.make_loader(repeat, 10, kind) as loader:
        seen, _ = lightning_run.fit(loader, 4, str(tmp_path))
    assert lightning_batches(seen) == reference(10, repeat, 4)
    # batch_idx counts each epoch's batches from 0
    assert [i for _, i, _ in seen] == [
        i for e in range(4) for i in range(
            sum(1 for epoch, _ in reference(10, repeat, 4) if epoch == e))]


# (repeat, examples, reload_dataloaders_every_n_epochs, checkpoint steps)
LIGHTNING_RESUMES = {
    # every pass 3 batches: mid-epoch 0, after its last batch, mid-epoch 1
    'repeat-false': (False, 10, 0, [2, 3, 5]),
    # 12 examples: every epoch 3 batches, no batch wraps around
    'repeat-true-even': (True, 12, 0, [2, 3, 4]),
    # 10 examples: epochs of 3, 2, 3, 2 batches; Lightning reads len()
    # once per fit unless it reloads its loaders each epoch.  Not here: a
    # checkpoint after the last batch of epoch 1 (step 5), shorter than
    # epoch 2 (the guide says why).
    'repeat-true-uneven-reload': (True, 10, 1, [2, 3, 4, 7]),
}


@pytest.fixture(scope='module')
def lightning_resumed(tmp_path_factory):
    """Every configuration's uninterrupted run and runs stopped at each
    checkpoint step, here; then one new process (Lightning and torch take
    seconds to import) that resumes each configuration from each of its
    checkpoints: ``{config: (full, weights, heads, resumed)}``."""
    need('torch', 'lightning')
    import lightning_run
    runs, args = {}, []
    for config in sorted(LIGHTNING_RESUMES):
        repeat, n, reload, steps = LIGHTNING_RESUMES[config]
        tmp = tmp_path_factory.mktemp('lightning-' + config)
        with lightning_run.make_loader(repeat, n) as loader:
            full, weights = lightning_run.fit(loader, 4, str(tmp),
                                              reload=reload)
        heads, paths = [], []
        for k in steps:
            directory = str(tmp / 'k{}'.format(k))
            with lightning_run.make_loader(repeat, n) as loader:
                head, _ = lightning_run.fit(loader, 4, directory,
                                            max_steps=k, every=k,
                                            reload=reload)
            heads.append(head)
            paths.append(os.path.join(directory, 'step={}.ckpt'.format(k)))
        runs[config] = (full, weights, heads)
        args.append([repeat, n, reload, 4, paths])
    resumed = in_new_process('lightning_run.py', json.dumps(args))
    return {config: runs[config] + (resumed[j],)
            for j, config in enumerate(sorted(LIGHTNING_RESUMES))}


@pytest.mark.parametrize('config', sorted(LIGHTNING_RESUMES))
def test_lightning_resumes_in_a_new_process(lightning_resumed, config):
    """ModelCheckpoint(every_n_train_steps=k), then fit(ckpt_path=...) in a
    new process with a fresh loader: the batches (and their Lightning
    epochs, and the weights at the end) are the uninterrupted run's.  (The
    configurations share that new process: lightning_resumed.)"""
    repeat, n, reload, steps = LIGHTNING_RESUMES[config]
    full, weights, heads, resumed = lightning_resumed[config]
    assert lightning_batches(full) == reference(n, repeat, 4)
    for k, head in zip(steps, heads):
        assert head == full[:k], k
    assert len(resumed) == len(steps)
    for k, (tail, final) in zip(steps, resumed):
        assert [tuple(b) for b in tail] == full[k:], k
        assert final == weights, k


# ---- Keras 3 ----------------------------------------------------------------

# (repeat, examples, checkpoint steps): every pass 3 batches; every epoch
# 3 batches; epochs of 3 and 2 batches (one fit per epoch).
KERAS_RUNS = {
    'repeat-false': (False, 10, [2, 3, 4]),
    'repeat-true-even': (True, 12, [1, 3, 5]),
    'repeat-true-uneven': (True, 10, [2, 3, 4, 5]),
}


#: Keras 3.15's Variable.__array__ (get_weights, set_weights) under numpy 2
#: warns from inside Keras.
keras_warnings = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword"
    ":DeprecationWarning")


@pytest.fixture
def keras_run(monkeypatch):
    monkeypatch.setenv('KERAS_BACKEND', 'torch')
    need('torch', 'keras')
    import keras
    if keras.backend.backend() != 'torch':
        pytest.skip('keras was imported with another backend')
    import keras_run
    return keras_run


@pytest.fixture(scope='module')
def keras_resumed(tmp_path_factory):
    """Every configuration's uninterrupted run and runs stopped after each
    step, here; then one new process (Keras and torch take seconds to
    import) that resumes each from each of its snapshots: ``{config:
    (full, weights, heads, resumed)}``."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv('KERAS_BACKEND', 'torch')
        need('torch', 'keras')
        import keras
        if keras.backend.backend() != 'torch':
            pytest.skip('keras was imported with another backend')
        import keras_run
        runs, args = {}, []
        with warnings.catch_warnings():
            warnings.filterwarnings(
                'ignore', "__array__ implementation doesn't accept a copy "
                'keyword', DeprecationWarning)
            for config in sorted(KERAS_RUNS):
                repeat, n, steps = KERAS_RUNS[config]
                tmp = tmp_path_factory.mktemp('keras-' + config)
                with keras_run.make_dataset(repeat, n) as ds:
                    full, weights = keras_run.train(ds, repeat, KERAS_EPOCHS)
                heads, paths = [], []
                for k in steps:
                    path = str(tmp / 'k{}.npz'.format(k))
                    with keras_run.make_dataset(repeat, n) as ds:
                        head, _ = keras_run.train(
                            ds, repeat, KERAS_EPOCHS,
                            callbacks=[keras_run.save_and_stop(ds, k, path)])
                    heads.append(head)
                    paths.append(path)
                runs[config] = (full, weights, heads)
                args.append([repeat, n, KERAS_EPOCHS, paths])
        resumed = in_new_process('keras_run.py', json.dumps(args))
    return {config: runs[config] + (resumed[j],)
            for j, config in enumerate(sorted(KERAS_RUNS))}


KERAS_EPOCHS = 3


@pytest.mark.parametrize('config', sorted(KERAS_RUNS))
def test_keras_epochs_are_chainiter_epochs_and_resume(keras_resumed, config):
    """model.fit(KerasDataset(it)): Keras' epochs are chainiter's; a
    callback saves the state after k steps and stops; a new process loads
    it into a fresh iterator and model and goes on: the same batches and,
    at the end, the same weights as the uninterrupted run.  (The
    configurations share that new process: keras_resumed.)"""
    repeat, n, steps = KERAS_RUNS[config]
    full, weights, heads, resumed = keras_resumed[config]
    assert full == [labels for _, labels in reference(n, repeat,
                                                      KERAS_EPOCHS)]
    for k, head in zip(steps, heads):
        assert head == full[:k], k
    assert len(resumed) == len(steps)
    for k, (tail, final) in zip(steps, resumed):
        assert tail == full[k:], k
        assert final == weights, k


@keras_warnings
def test_keras_stops_a_fit_whose_epochs_would_be_cut(keras_run):
    """Keras gives every epoch of a fit the batch count it read at the
    start: a fit that goes on into an epoch of another length raises
    instead of cutting it, after the epochs before it trained exactly."""
    seen = []
    model = keras_run.make_model(seen)
    with keras_run.make_dataset(True, 10) as ds:     # 3, then 2 batches
        with pytest.raises(ValueError, match='one epoch at a time'):
            model.fit(ds, epochs=2, verbose=0)
    assert seen == [labels for _, labels in reference(10, True, 1)]


# ---- torch.distributed.checkpoint and Accelerate ---------------------------

# Checkpoint steps: mid-epoch 0, after the batch that wraps into epoch 1,
# mid-epoch 1 (10 examples, batches of 4).
STATE_STEPS = [2, 3, 4]


def saved_checkpoints(tmp_path, save):
    import state_run
    with state_run.make_loader('serial') as loader:
        full = state_run.rest(loader)
    paths = []
    for k in STATE_STEPS:
        path = str(tmp_path / 'k{}'.format(k))
        with state_run.make_loader('thread') as loader:
            batches = iter(loader)
            for _ in range(k):
                if next(batches, None) is None:
                    batches = iter(loader)      # the next epoch
                    next(batches)
            save(loader, path)
        paths.append(path)
    return full, paths


def count_batches(full, k):
    return sum(len(b) for b in full[:k])


def test_dcp_loads_into_a_fresh_loader_in_a_new_process(tmp_path):
    """dcp.save({'loader': loader}), then dcp.load into a fresh, never
    iterated loader (another seed) of each kind in a new process: the rest
    of the run."""
    need('torch')
    import state_run
    full, paths = saved_checkpoints(tmp_path, state_run.save_dcp)
    kinds = ['serial', 'thread', 'forkserver']
    resumed = in_new_process('state_run.py', 'dcp', ','.join(kinds), *paths)
    assert sorted(resumed) == sorted(kinds)
    for kind in kinds:
        for k, tail in zip(STATE_STEPS, resumed[kind]):
            assert tail == full[k:], (kind, k)


def test_dcp_one_key_for_all_ranks_of_a_sharded_run(tmp_path):
    """Two gloo ranks, each with its shard of one run, save {'loader':
    loader} after 3 steps (one key: the state is global, the same on every
    rank); two fresh ranks load it and go on with their shares of the next
    global batches, and so does a single process (another number of
    ranks)."""
    need('torch')
    import torch.distributed
    if not torch.distributed.is_available():
        pytest.skip('torch.distributed is not available')
    out = in_new_process('dcp_ranks.py', tmp_path)
    with chainiter.SerialIterator(list(range(10)), 4, seed=3) as it:
        steps = [[int(i) for i in next(it)] for _ in range(8)][3:]
    assert out['load1-0'] == steps
    for rank in range(2):
        assert out['load2-{}'.format(rank)] == [
            step[2 * rank:2 * rank + 2] for step in steps]


def test_accelerate_checkpoints_the_loader(tmp_path):
    """register_for_checkpointing(loader), save_state; in a new process
    load_state: the rest of the run.  prepare() hands the loader back."""
    need('torch', 'accelerate')
    import state_run
    full, paths = saved_checkpoints(tmp_path, state_run.save_accelerate)
    resumed = in_new_process('state_run.py', 'accelerate', 'serial', *paths)
    for k, tail in zip(STATE_STEPS, resumed['serial']):
        assert tail == full[k:], k


# ---- HuggingFace datasets ---------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize('method, fmt', [
    ('fork', 'numpy'), ('forkserver', 'numpy'), ('spawn', 'numpy'),
    ('fork', None)])
def test_hf_datasets_load_in_batches_as_they_are(method, fmt):
    """A datasets.Dataset as it is (numpy format; the python one under
    fork): MultiprocessIterator's batches are SerialIterator's over the
    same Dataset, read by __getitems__ (the dataset here refuses
    dataset[i])."""
    need('datasets')
    import hf_data
    from helpers import fingerprint
    with chainiter.SerialIterator(hf_data.make(fmt, False), 6,
                                  seed=2) as ref, \
            chainiter.MultiprocessIterator(
                hf_data.make(fmt, True), 6, seed=2, n_processes=2,
                start_method=method) as it:
        for _ in range(8):
            assert fingerprint(next(it)) == fingerprint(next(ref))


# ---- the guide's examples (docs/frameworks.rst) ----------------------------

EXAMPLES = os.path.join(ROOT, 'docs', '_examples', 'frameworks')


def run_example(name, capsys, *args):
    """Run ``main()`` of a guide example here (the frameworks are imported
    already); return its printed lines.  The frameworks' own warnings are
    theirs."""
    import runpy
    example = runpy.run_path(os.path.join(EXAMPLES, name + (
        '' if name.endswith('_speed') else '_example') + '.py'))
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.filterwarnings(
            'ignore', module=r'(torch|lightning|keras|accelerate|datasets)\.')
        example['main'](*args)
    return example, capsys.readouterr().out.splitlines()


def printed_batches(lines, with_epoch):
    """The ``[epoch E] batch [labels]`` lines, parsed."""
    out = []
    for line in lines:
        words = line.split(' ', 3 if with_epoch else 1)
        if with_epoch and words[0] == 'epoch':
            out.append((int(words[1]), json.loads(words[3])))
        elif not with_epoch and words[0] == 'batch':
            out.append(json.loads(words[1]))
    return out


def test_guide_lightning_example(tmp_path, capsys):
    need('torch', 'lightning')
    _, lines = run_example('lightning', capsys, str(tmp_path))
    assert 'batches per epoch: 3' in lines
    assert printed_batches(lines, True) == reference(10, False, 3, seed=0)


@keras_warnings
def test_guide_keras_example(keras_run, tmp_path, capsys):
    _, lines = run_example('keras', capsys, str(tmp_path))
    assert 'stopped' in lines
    assert printed_batches(lines, False) == [
        labels for _, labels in reference(10, False, 3, seed=0)]


def test_guide_accelerate_example(tmp_path, capsys):
    need('torch', 'accelerate')
    _, lines = run_example('accelerate', capsys, str(tmp_path))
    assert printed_batches(lines, False) == [
        labels for _, labels in reference(10, False, 2, seed=0)]


def test_guide_dcp_example(tmp_path, capsys):
    need('torch')
    _, lines = run_example('dcp', capsys, str(tmp_path))
    assert printed_batches(lines, False) == [
        labels for _, labels in reference(10, True, 1, seed=0)]


def test_guide_torch_save_example(tmp_path, capsys):
    """The loop stopped after 4 steps and resumed from its torch.save file
    sees the uninterrupted run's batches and ends with its weights."""
    need('torch')
    import torch
    example, lines = run_example('torch_save', capsys, str(tmp_path))
    assert printed_batches(lines, True) == reference(10, True, 3, seed=0)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    with example['make_iterator']() as it:
        example['train'](it, model, torch.optim.SGD(model.parameters(),
                                                    lr=0.01),
                         3, str(tmp_path / 'again.pt'))
    capsys.readouterr()
    assert lines[-1] == 'weights {}'.format(
        [round(w, 6) for w in model.weight.ravel().tolist()])


def test_torch_load_weights_only_takes_an_order_samplers_state(tmp_path):
    """A seeded iterator's state is Python scalars, which torch.load reads
    with weights_only=True; an order sampler's holds numpy arrays, which it
    refuses: saved as tensors, they load back."""
    need('torch')
    import numpy
    import torch

    def make(sampler):
        return chainiter.SerialIterator(list(range(10)), 4, seed=1,
                                        order_sampler=sampler)

    for sampler in (None, chainiter.ShuffleOrderSampler(
            numpy.random.RandomState(0))):
        with make(sampler) as it:
            next(it)
            state = {k: torch.tensor(v) if isinstance(v, numpy.ndarray)
                     else v for k, v in it.state_dict().items()}
            torch.save({'iterator': state}, str(tmp_path / 'c.pt'))
            expected = [next(it) for _ in range(5)]
        loaded = torch.load(str(tmp_path / 'c.pt'), weights_only=True)
        with make(None if sampler is None else chainiter.ShuffleOrderSampler(
                numpy.random.RandomState(5))) as it:
            it.load_state_dict(loaded['iterator'])
            assert [next(it) for _ in range(5)] == expected


def test_guide_hf_speed_command_runs(capsys):
    """The guide's speed comparison, on a few examples (its figures are
    measured by hand: nothing here is timed)."""
    need('torch', 'datasets')
    _, lines = run_example('hf_speed', capsys, 300, 1)
    assert len(lines) == 1 and lines[0].startswith('chainiter ') and \
        'examples/s, DataLoader' in lines[0] and lines[0].endswith('x')


def test_guide_hf_datasets_example(capsys):
    need('datasets')
    _, lines = run_example('hf_datasets', capsys)
    assert lines == [
        "{'x': ((32, 3), 'float32'), 'label': ((32,), 'int64')}",
        '32 batches in epoch 0']
