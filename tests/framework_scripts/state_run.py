"""torch.distributed.checkpoint and Accelerate round trips of a chainiter
loader.  The test process saves (``save_dcp``, ``save_accelerate``); this
script, in a new process, loads each checkpoint into a fresh, never
iterated loader of each kind (comma-separated) and prints the batches that
follow as JSON, kind by kind.

    python state_run.py dcp|accelerate KIND[,KIND...] DIR...
"""

import json
import sys
import warnings

import chainiter

N, BATCH, EPOCHS = 10, 4, 3


def make_loader(kind, seed=11):
    dataset = list(range(N))
    if kind == 'serial':
        it = chainiter.SerialIterator(dataset, BATCH, seed=seed)
    elif kind == 'thread':
        it = chainiter.MultithreadIterator(dataset, BATCH, seed=seed,
                                           n_threads=2)
    else:
        it = chainiter.MultiprocessIterator(dataset, BATCH, seed=seed,
                                            n_processes=2, start_method=kind)
    return it.loader()


def rest(loader, epochs=EPOCHS):
    """The batches up to the end of epoch ``epochs - 1``, as lists."""
    out = []
    while loader.epoch < epochs:
        out += [[int(i) for i in batch] for batch in loader]
    return out


def quietly(call, *args, **kwargs):
    # DCP warns that it saves and loads in a single process.
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)
        return call(*args, **kwargs)


def save_dcp(loader, path):
    import torch.distributed.checkpoint as dcp
    quietly(dcp.save, {'loader': loader}, checkpoint_id=path)


def load_dcp(loader, path):
    import torch.distributed.checkpoint as dcp
    quietly(dcp.load, {'loader': loader}, checkpoint_id=path)


def accelerator():
    from accelerate import Accelerator
    return Accelerator(cpu=True)


def save_accelerate(loader, path):
    acc = accelerator()
    assert acc.prepare(loader) is loader
    acc.register_for_checkpointing(loader)
    acc.save_state(path)


def load_accelerate(loader, path):
    acc = accelerator()
    assert acc.prepare(loader) is loader
    acc.register_for_checkpointing(loader)
    acc.load_state(path)


if __name__ == '__main__':
    how, kinds = sys.argv[1], sys.argv[2].split(',')
    load = load_dcp if how == 'dcp' else load_accelerate
    out = {}
    for kind in kinds:
        out[kind] = []
        for path in sys.argv[3:]:
            with make_loader(kind, seed=0) as loader:   # the seed comes back
                load(loader, path)
                out[kind].append(rest(loader))
    print(json.dumps(out))
