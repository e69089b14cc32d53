"""Lightning: Trainer.fit on it.loader(), a checkpoint every 4 steps, and a
second run that resumes from the one written mid-epoch."""

import os
import sys

import numpy
import torch
import lightning.pytorch as pl

import chainiter
from chainiter.datasets import TupleDataset


# [setup]
def make_loader():
    rng = numpy.random.default_rng(0)
    dataset = TupleDataset(rng.normal(size=(10, 3)).astype(numpy.float32),
                           numpy.arange(10))      # (features, label)
    it = chainiter.MultiprocessIterator(
        dataset, batch_size=4, n_processes=2, seed=0, repeat=False,
        converter=chainiter.concat_examples)   # every epoch 3 batches
    # Batches as torch tensors (sharing the workers' memory); Lightning
    # moves them to its device.
    return chainiter.DevicePrefetcher(it, '@torch').loader()


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, t = batch
        print('epoch', self.current_epoch, 'batch', t.tolist())
        return (self.layer(x).squeeze(1) - t.float()).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(directory, **kwargs):
    return pl.Trainer(
        max_epochs=3, default_root_dir=directory, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[pl.callbacks.ModelCheckpoint(
            dirpath=directory, every_n_train_steps=4, save_top_k=-1,
            filename='{step}')],
        **kwargs)
# [/setup]


def main(directory):
    # [fit]
    with make_loader() as loader:
        print('batches per epoch:', len(loader))
        # A run stopped after 4 steps (here by max_steps): in epoch 1,
        # after its first batch.
        trainer(directory, max_steps=4).fit(Model(), train_dataloaders=loader)
    # Later, in a new process: a fresh loader, the same Trainer, ckpt_path.
    with make_loader() as loader:
        trainer(directory).fit(Model(), train_dataloaders=loader,
                               ckpt_path=os.path.join(directory,
                                                      'step=4.ckpt'))
    # [/fit]


if __name__ == '__main__':
    main(sys.argv[1])
