"""Keras 3 (torch backend): model.fit on a KerasDataset, a callback that
saves the iterator's state after 4 steps, and a new model that resumes."""

import os
import sys

os.environ.setdefault('KERAS_BACKEND', 'torch')

import keras  # noqa: E402
import numpy  # noqa: E402

import chainiter  # noqa: E402
from chainiter.datasets import TupleDataset  # noqa: E402
from chainiter.keras import KerasDataset  # noqa: E402

EPOCHS = 3


# [dataset]
def make_dataset():
    rng = numpy.random.default_rng(0)
    dataset = TupleDataset(rng.normal(size=(10, 3)).astype(numpy.float32),
                           numpy.arange(10, dtype=numpy.float32))
    it = chainiter.MultiprocessIterator(dataset, batch_size=4, n_processes=2,
                                        seed=0, repeat=False)
    return KerasDataset(it)        # each Keras epoch: one pass, 3 batches
# [/dataset]


class Net(keras.Sequential):
    def train_step(self, data):
        print('batch', [int(t) for t in data[1].tolist()])
        return super().train_step(data)


def make_model():
    model = Net([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer='sgd', loss='mse')
    return model


# [callback]
class Checkpoint(keras.callbacks.Callback):
    """Saves the iterator's state and the weights after ``steps`` steps
    (and stops, to stand for a run that is interrupted there)."""

    def __init__(self, ds, path, steps):
        super().__init__()
        self.ds, self.path, self.steps, self.done = ds, path, steps, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.done == self.steps:
            # After an epoch's last batch, the next fit starts the next.
            epoch = self.epoch + (batch + 1 == self.params['steps'])
            numpy.savez(self.path, epoch=epoch,
                        **{'ds/' + k: v
                           for k, v in self.ds.state_dict().items()})
            self.model.save_weights(self.path + '.weights.h5')
            self.model.stop_training = True
# [/callback]


def main(directory):
    path = os.path.join(directory, 'state.npz')
    with make_dataset() as ds:
        make_model().fit(ds, epochs=EPOCHS, verbose=0,
                         callbacks=[Checkpoint(ds, path, steps=4)])
    print('stopped')
    # [resume]
    # In a new process: a fresh iterator and model, loaded.
    with make_dataset() as ds, numpy.load(path) as saved:
        ds.load_state_dict({k[3:]: saved[k] for k in saved.files
                            if k.startswith('ds/')})
        epoch = int(saved['epoch'])
        model = make_model()
        model.load_weights(path + '.weights.h5')
        if ds.resumed_mid_epoch:
            # Keras counts the batches of a fit's epochs when it starts:
            # the rest of the interrupted epoch goes in a fit of its own.
            model.fit(ds, initial_epoch=epoch, epochs=epoch + 1, verbose=0)
            epoch += 1
        model.fit(ds, initial_epoch=epoch, epochs=EPOCHS, verbose=0)
    # [/resume]


if __name__ == '__main__':
    main(sys.argv[1])
