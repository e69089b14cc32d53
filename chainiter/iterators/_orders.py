"""Where each epoch's order comes from: a seeded shuffle's, kept for a few
epochs (``RecentOrders``), and an order sampler's, with its state taken and
put back (``capture``, ``restore``) so that a state can name the sampler's
state that goes with it."""

from chainiter.iterators import order_samplers
from chainiter.serializers.npz import DictionarySerializer, NpzDeserializer


class RecentOrders:
    """The last ``kept`` seeded orders, by ``(pass_seed, epoch, n)``: a
    batch loaded again (after an interrupt or a snapshot), or the next one
    of the same epoch, finds its order's indices already computed."""

    __slots__ = ('kept', '_orders')

    def __init__(self, kept):
        self.kept = kept
        self._orders = {}

    def get(self, pass_seed, epoch, n):
        """``SeededPermutation(pass_seed, epoch, n)``, computed once while
        it is among the last ``kept`` asked for."""
        key = (pass_seed, epoch, n)
        orders = self._orders
        order = orders.get(key)
        if order is None:
            order = orders[key] = order_samplers.SeededPermutation(*key)
            while len(orders) > self.kept:
                del orders[next(iter(orders))]
        return order

    def __len__(self):
        return len(self._orders)


def capture(sampler):
    """The state of an order sampler with one (a ``serialize`` method),
    flattened into a dict; None for one without."""
    serialize = getattr(sampler, 'serialize', None)
    if serialize is None:
        return None
    target = {}
    serialize(DictionarySerializer(target))
    return target


def restore(sampler, state):
    """Put back a state made by ``capture`` (None: nothing to do)."""
    if state is not None:
        sampler.serialize(NpzDeserializer(state))
