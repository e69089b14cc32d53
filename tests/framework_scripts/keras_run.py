"""Keras 3 (torch backend) fits on a chainiter KerasDataset: run in the
test process (the uninterrupted run, a run whose callback saves a snapshot
after k steps and stops), or as a script that resumes from each snapshot
it is given, in a fresh iterator and model, and prints what every run saw
(the labels of each batch trained on, the final weights) as JSON.

    python keras_run.py '[[REPEAT, N, EPOCHS, [SNAPSHOT.npz, ...]], ...]'

One process for every configuration given: for each, a list of
``(labels, weights)``, one for each snapshot.

With ``repeat=False`` every pass has the same number of batches: one fit
runs them all (a resumed one first finishes the interrupted epoch alone).
With ``repeat=True`` and ``N`` not a multiple of the batch size the epochs
differ by a batch: one fit per epoch.
"""

import json
import os
import sys

os.environ.setdefault('KERAS_BACKEND', 'torch')

import numpy  # noqa: E402

import chainiter  # noqa: E402

BATCH = 4


class Rows:
    """Example i is (features, i)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return numpy.full(3, i, numpy.float32), numpy.float32(i)


def make_dataset(repeat, n):
    from chainiter.keras import KerasDataset
    it = chainiter.SerialIterator(Rows(n), BATCH, repeat=repeat, seed=7)
    return KerasDataset(it)


def make_model(seen):
    import keras

    class Recording(keras.Sequential):
        def train_step(self, data):
            seen.append([int(v) for v in data[1].tolist()])   # torch
            return super().train_step(data)

    keras.utils.set_random_seed(0)
    model = Recording([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.001), loss='mse')
    return model


def save_and_stop(ds, k, path):
    """A callback that, after ``k`` steps, saves the dataset's state, the
    weights and the epoch to resume in, and stops training."""
    import keras

    class SaveAndStop(keras.callbacks.Callback):
        steps = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            SaveAndStop.steps += 1
            if SaveAndStop.steps == k:
                state = {'loader/' + key: value
                         for key, value in ds.state_dict().items()}
                weights = {'weight/{}'.format(j): w for j, w in
                           enumerate(self.model.get_weights())}
                # After an epoch's last batch, resume in the next one.
                epoch = self.epoch + (batch + 1 == self.params['steps'])
                numpy.savez(path, epoch=epoch, **state, **weights)
                self.model.stop_training = True

    return SaveAndStop()


def train(ds, repeat, epochs, initial_epoch=0, callbacks=(), weights=None):
    """Fit from ``initial_epoch`` to ``epochs`` as a user would; return the
    batches' labels and the final weights."""
    seen = []
    model = make_model(seen)
    if weights is not None:
        model.set_weights(weights)
    equal = not repeat or ds.iterator.epoch_size % BATCH == 0
    epoch = initial_epoch
    while epoch < epochs and not model.stop_training:
        # One fit for all epochs where they have the same number of
        # batches, after the rest of an interrupted one; else one a fit.
        last = epoch + 1 if ds.resumed_mid_epoch or not equal else epochs
        model.fit(ds, epochs=last, initial_epoch=epoch,
                  callbacks=list(callbacks), verbose=0)
        epoch = last
    return seen, [w.ravel().tolist() for w in model.get_weights()]


def resume(repeat, n, epochs, path):
    with numpy.load(path) as f:
        state = {k[len('loader/'):]: f[k] for k in f.files
                 if k.startswith('loader/')}
        weights = [f['weight/{}'.format(j)] for j in range(
            sum(k.startswith('weight/') for k in f.files))]
        epoch = int(f['epoch'])
    with make_dataset(repeat, n) as ds:
        ds.load_state_dict(state)
        return train(ds, repeat, epochs, epoch, weights=weights)


if __name__ == '__main__':
    # '[[REPEAT, N, EPOCHS, [PATH, ...]], ...]': one process for every
    # configuration (Keras and torch take seconds to import).
    print(json.dumps([[resume(repeat, n, epochs, path) for path in paths]
                      for repeat, n, epochs, paths in json.loads(
                          sys.argv[1])]))
