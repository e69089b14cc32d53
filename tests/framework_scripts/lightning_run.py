"""Lightning's fit on a chainiter loader: run in the test process (the
uninterrupted run, the run stopped by max_steps) or as a script that
resumes from each checkpoint it is given, each in a fresh loader and
Trainer, and prints what every run saw as JSON.

    python lightning_run.py '[[REPEAT, N, RELOAD, EPOCHS, [CKPT, ...]], ...]'

One process for every configuration given (its imports take seconds):
for each, a list of ``(batches, weights)``, one for each checkpoint.
``RELOAD`` is Trainer's ``reload_dataloaders_every_n_epochs``.
"""

import json
import os
import sys
import warnings

import numpy

import chainiter

BATCH = 4


class Rows:
    """Example i is (features, i)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return numpy.full(3, i, numpy.float32), i


def make_loader(repeat, n, kind='serial'):
    if kind == 'serial':
        it = chainiter.SerialIterator(Rows(n), BATCH, repeat=repeat, seed=7)
    elif kind == 'thread':
        it = chainiter.MultithreadIterator(Rows(n), BATCH, repeat=repeat,
                                           seed=7, n_threads=2)
    else:
        it = chainiter.MultiprocessIterator(Rows(n), BATCH, repeat=repeat,
                                            seed=7, n_processes=2,
                                            start_method=kind)
    return it.loader()


def fit(loader, epochs, tmp, max_steps=-1, every=None, ckpt_path=None,
        reload=0):
    """Fit a linear model for ``epochs`` epochs; return the batches seen,
    as (Lightning's epoch, batch_idx, example indices), and the weights."""
    import torch
    import lightning.pytorch as pl

    seen = []

    class Linear(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            x, i = chainiter.concat_examples(batch)
            seen.append((self.current_epoch, batch_idx, i.tolist()))
            return self.layer(torch.from_numpy(x)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = []
    if every is not None:
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=tmp, every_n_train_steps=every, save_top_k=-1,
            filename='{step}'))
    trainer = pl.Trainer(
        max_epochs=epochs, max_steps=max_steps, callbacks=callbacks,
        default_root_dir=tmp, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=bool(callbacks),
        reload_dataloaders_every_n_epochs=reload,
        accelerator='cpu', devices=1, num_sanity_val_steps=0)
    model = Linear()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    return seen, model.layer.weight.detach().numpy().ravel().tolist()


if __name__ == '__main__':
    import logging
    logging.getLogger('lightning').setLevel(logging.ERROR)
    out = []
    for repeat, n, reload, epochs, paths in json.loads(sys.argv[1]):
        out.append([])
        for path in paths:
            with make_loader(repeat, n) as loader:
                out[-1].append(fit(loader, epochs, os.path.dirname(path),
                                   ckpt_path=path, reload=reload))
    print(json.dumps(out))
