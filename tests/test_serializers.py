import io

import numpy
import pytest

from chainiter.serializers import (
    DictionarySerializer,
    NpzDeserializer,
    load_npz,
    save_npz,
)


class Thing:
    def __init__(self):
        self.count = 0
        self.rate = 0.0
        self.flag = False
        self.weights = numpy.zeros(3)

    def serialize(self, serializer):
        self.count = serializer('count', self.count)
        self.rate = serializer('rate', self.rate)
        self.flag = serializer('flag', self.flag)
        serializer['child']('weights', self.weights)


@pytest.mark.parametrize('compression', [True, False])
def test_round_trip(tmp_path, compression):
    a = Thing()
    a.count, a.rate, a.flag, a.weights[:] = 3, 0.5, True, [1, 2, 3]
    path = str(tmp_path / 'a.npz')
    save_npz(path, a, compression=compression)
    with numpy.load(path) as npz:
        assert sorted(npz.files) == ['child/weights', 'count', 'flag', 'rate']
    b = Thing()
    load_npz(path, b)
    assert (b.count, b.rate, b.flag) == (3, 0.5, True)
    assert isinstance(b.count, int) and isinstance(b.flag, bool)
    numpy.testing.assert_array_equal(b.weights, [1, 2, 3])


def test_strict_and_non_strict_and_ignore_names():
    f = io.BytesIO()
    numpy.savez(f, count=numpy.asarray(4))
    f.seek(0)
    with pytest.raises(KeyError, match='rate'):
        load_npz(f, Thing())
    f.seek(0)
    t = Thing()
    load_npz(f, t, strict=False)
    assert t.count == 4 and t.rate == 0.0
    f.seek(0)
    t = Thing()
    load_npz(f, t, strict=False, ignore_names='count')
    assert t.count == 0
    f.seek(0)
    t = Thing()
    load_npz(f, t, strict=False, ignore_names=[lambda key: key == 'count'])
    assert t.count == 0


def test_path_prefix():
    target = {}
    thing = Thing()
    thing.count = 9
    thing.serialize(DictionarySerializer(target, 'model/'))
    assert 'model/count' in target and 'model/child/weights' in target
    other = Thing()
    other.serialize(NpzDeserializer(target, path='model/'))
    assert other.count == 9


def test_lossy_cast_is_refused():
    with pytest.raises(TypeError, match='without loss'):
        NpzDeserializer({'count': numpy.asarray(2.5)})('count', 0)
