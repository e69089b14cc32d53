"""What a notebook cell defines reaches the workers under every start method.

A dataset class, a transform, a ``worker_init_fn`` or an exception class
defined in a notebook (module ``__main__`` of a Jupyter kernel), by
``python -c``, or as a lambda or a closure cannot be imported by a spawned
or forkserver worker: it goes by value, through cloudpickle, and examples
and exceptions of its classes come back as those classes.  Checked in a
real Jupyter kernel (nbclient runs a notebook built here), in scripts run
as files and with ``-c``, and without cloudpickle (a clear error before any
worker starts).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy
import pytest

from chainiter import MultiprocessIterator, SerialIterator
from chainiter.datasets import TransformDataset

import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A notebook's first cell, or the top of a script: everything in __main__.
DEFINITIONS = textwrap.dedent('''\
    import json
    import sys

    import numpy

    import chainiter
    from chainiter.datasets import TransformDataset

    WORKER = {}


    def remember_worker(worker_id):       # a worker_init_fn
        WORKER['id'] = worker_id


    class Noisy:
        """Example i: row i of a table plus noise from example_rng()."""

        def __init__(self, n):
            self.table = numpy.arange(n * 4, dtype=numpy.float32).reshape(
                n, 4)

        def __len__(self):
            return len(self.table)

        def __getitem__(self, i):
            noise = chainiter.example_rng().integers(0, 10, size=4)
            return self.table[i] + noise, numpy.int32(i)


    class Tagged:
        """An example of a class of the notebook's own."""

        def __init__(self, i, worker):
            self.i, self.worker = i, worker


    class Tags:
        """Example i is Tagged(i, the id worker_init_fn saw)."""

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return Tagged(i, WORKER.get('id'))


    class BadExample(Exception):
        """An exception of the notebook's own."""


    class Bad:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            raise BadExample('example {} is bad'.format(i))


    def scaled_by(factor):
        def scale(example):               # a closure
            x, t = example
            return x * factor, t
        return scale


    def dataset():
        return TransformDataset(TransformDataset(Noisy(10), scaled_by(2)),
                                lambda e: (e[0] + 1, e[1]))


    def run(method):
        with chainiter.MultiprocessIterator(
                dataset(), 4, n_processes=2, seed=3, start_method=method,
                converter=chainiter.concat_examples) as it:
            got = [next(it) for _ in range(5)]
        with chainiter.SerialIterator(dataset(), 4, seed=3) as it:
            expected = [chainiter.concat_examples(next(it)) for _ in range(5)]
        with chainiter.MultiprocessIterator(
                Tags(), 3, n_processes=2, shuffle=False, start_method=method,
                worker_init_fn=remember_worker) as it:
            tags = next(it) + next(it)
        try:
            with chainiter.MultiprocessIterator(
                    Bad(), 1, n_processes=1, shuffle=False,
                    start_method=method) as it:
                next(it)
        except BadExample as e:
            raised = str(e)
        return {
            'raised': raised,
            'method': it.start_method,
            'stacked': [[x.tolist(), t.tolist()] for x, t in got],
            'serial': [[x.tolist(), t.tolist()] for x, t in expected],
            'tags': [[type(tag) is Tagged, tag.i, tag.worker]
                     for tag in tags],
        }
''')

SCRIPT = DEFINITIONS + textwrap.dedent('''

    if __name__ == '__main__':
        print(json.dumps(run(sys.argv[1])))
''')


def _check(result, method):
    """The batches ``run(method)`` returned are the serial ones, and right."""
    assert result['method'] == method
    assert result['raised'] == 'example 0 is bad'
    assert result['stacked'] == result['serial']
    table = numpy.arange(40, dtype=numpy.float32).reshape(10, 4)
    for x, t in result['stacked']:
        noise = (numpy.array(x) - 1) / 2 - table[t]
        assert ((noise >= 0) & (noise < 10) & (noise % 1 == 0)).all()
    assert [tag[:2] for tag in result['tags']] == [[True, i]
                                                   for i in range(6)]
    assert {tag[2] for tag in result['tags']} <= {0, 1}


def _env():
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    return env


def _run_script(tmp_path, how, script, method):
    """Run ``script`` as a file or with ``-c``; its last stdout line."""
    if how == 'file':
        path = tmp_path / 'script.py'
        path.write_text(script)
        argv = [sys.executable, str(path), method]
    else:
        argv = [sys.executable, '-c', script, method]
    done = subprocess.run(argv, cwd=str(tmp_path), env=_env(),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- a real Jupyter kernel ----------------------------------------------

def _kernel_dir(tmp_path):
    """A kernel spec named python3 that runs this Python (the test's venv),
    found before any other python3 spec of the machine or the user."""
    spec = tmp_path / 'jupyter' / 'kernels' / 'python3'
    spec.mkdir(parents=True)
    (spec / 'kernel.json').write_text(json.dumps({
        'argv': [sys.executable, '-m', 'ipykernel_launcher',
                 '-f', '{connection_file}'],
        'display_name': 'Python 3 (chainiter tests)', 'language': 'python'}))
    return str(tmp_path / 'jupyter')


@pytest.mark.timeout(180)
def test_dataset_defined_in_a_notebook_cell(method, tmp_path, monkeypatch):
    pytest.importorskip('cloudpickle')
    pytest.importorskip('ipykernel')
    nbformat = pytest.importorskip('nbformat')
    nbclient = pytest.importorskip('nbclient')
    monkeypatch.setenv('JUPYTER_PATH', _kernel_dir(tmp_path))
    monkeypatch.setenv('JUPYTER_RUNTIME_DIR', str(tmp_path / 'runtime'))
    monkeypatch.setenv('JUPYTER_PLATFORM_DIRS', '1')
    monkeypatch.setenv('PYTHONPATH', _env()['PYTHONPATH'])
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(DEFINITIONS),
        nbformat.v4.new_code_cell('print(json.dumps(run({!r})))'.format(
            method)),
    ]
    client = nbclient.NotebookClient(
        notebook, kernel_name='python3', timeout=120,
        resources={'metadata': {'path': str(tmp_path)}})
    client.execute()     # raises CellExecutionError, with the traceback
    out = ''.join(output.get('text', '')
                  for output in notebook.cells[1].outputs
                  if output.get('name') == 'stdout')
    _check(json.loads(out.strip().splitlines()[-1]), method)


# ---- scripts: a file (__main__ runs again in spawned workers) or -c -------

@pytest.mark.parametrize('how', ['file', '-c'])
def test_dataset_defined_in_a_script(method, how, tmp_path):
    pytest.importorskip('cloudpickle')
    _check(_run_script(tmp_path, how, SCRIPT, method), method)


WITHOUT_CLOUDPICKLE = textwrap.dedent('''\
    import json
    import multiprocessing
    import sys

    sys.modules['cloudpickle'] = None     # as if it were not installed

    import chainiter


    class Rows:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i


    def attempt(**kwargs):
        try:
            with chainiter.MultiprocessIterator(
                    n_processes=2, shuffle=False, start_method=sys.argv[1],
                    **kwargs) as it:
                return {'batch': [int(i) for i in next(it)]}
        except TypeError as e:
            return {'error': str(e), 'cause': type(e.__cause__).__name__,
                    'children': len(multiprocessing.active_children())}


    if __name__ == '__main__':
        print(json.dumps({
            'class': attempt(dataset=Rows(), batch_size=4),
            'lambda': attempt(dataset=[0, 1, 2, 3], batch_size=4,
                              worker_init_fn=lambda worker_id: None),
        }))
''')


@pytest.mark.parametrize('how', ['file', '-c'])
def test_without_cloudpickle(method, how, tmp_path):
    result = _run_script(tmp_path, how, WITHOUT_CLOUDPICKLE, method)
    works = {'batch': [0, 1, 2, 3]}
    if method == 'fork':         # nothing is pickled
        assert result == {'class': works, 'lambda': works}
        return
    # A script's classes are imported by the workers, by reference.
    needs = ['class', 'lambda'] if how == '-c' else ['lambda']
    for case in ['class', 'lambda']:
        if case not in needs:
            assert result[case] == works
            continue
        error = result[case]
        assert error['cause'] == 'ModuleNotFoundError'
        assert error['children'] == 0            # before any worker started
        assert method in error['error']
        assert 'pip install cloudpickle' in error['error']
        assert {'class': '__main__.Rows (defined in a notebook',
                'lambda': 'the lambda __main__.<lambda>'}[case] in \
            error['error']


def test_cloudpickle_is_imported_only_when_needed(method, tmp_path):
    # A dataset the workers can import is pickled by pickle alone.
    script = textwrap.dedent('''\
        import json
        import sys

        sys.path.insert(0, {tests!r})

        import chainiter
        import helpers

        if __name__ == '__main__':
            with chainiter.MultiprocessIterator(
                    helpers.Examples(8, 'array'), 2, n_processes=1,
                    start_method=sys.argv[1]) as it:
                next(it)
            print(json.dumps('cloudpickle' in sys.modules))
    ''').format(tests=os.path.dirname(os.path.abspath(__file__)))
    assert _run_script(tmp_path, 'file', script, method) is False


# ---- lambdas and closures, in this process ----------------------------------

def test_lambdas_and_closures_go_by_value(method):
    pytest.importorskip('cloudpickle')
    big = numpy.arange(2 ** 18, dtype=numpy.float64)   # goes as shared memory
    dataset = TransformDataset(helpers.Examples(12, 'array'),
                               lambda x: x + big[:6].reshape(2, 3))
    # Replaced workers (maxtasksperchild) get them too.
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=1,
                              start_method=method, maxtasksperchild=2,
                              worker_init_fn=lambda worker_id: None) as it:
        got = [next(it) for _ in range(4)]
    with SerialIterator(dataset, 4, seed=1) as it:
        expected = [next(it) for _ in range(4)]
    assert [helpers.fingerprint(b) for b in got] == \
        [helpers.fingerprint(b) for b in expected]
