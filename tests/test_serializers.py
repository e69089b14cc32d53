import io
import os
import stat
import subprocess
import sys
import zipfile

import numpy
import pytest

from chainiter import SnapshotMismatchError
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


class Keys:
    """An object with an array of a narrow dtype, as an order sampler's
    generator keys (uint32)."""

    def __init__(self, dtype):
        self.keys = numpy.zeros(3, dtype=dtype)

    def serialize(self, serializer):
        serializer('keys', self.keys)


@pytest.mark.parametrize('dtype, stored', [
    (numpy.uint32, [0, 7, 2 ** 32 - 1]),     # JSON's lists are int64
    (numpy.int8, [-128, 0, 127]),
    (numpy.bool_, [0, 1, 1]),
    (numpy.int32, [1.0, 2.0, -3.0]),          # integral floats
    (numpy.float32, [0.5, 1.5, 2.0]),
])
def test_arrays_convert_where_every_value_survives(dtype, stored):
    thing = Keys(dtype)
    NpzDeserializer({'keys': stored}).load(thing)
    assert thing.keys.dtype == dtype
    assert thing.keys.tolist() == [dtype(v).item() for v in stored]


@pytest.mark.parametrize('dtype, stored, lost', [
    (numpy.uint32, [0, -1, 2], -1),
    (numpy.uint32, [0, 2 ** 32, 2], 2 ** 32),
    (numpy.int8, [0, 1, 300], 300),
    (numpy.int32, [0.0, 2.5, 1.0], 2.5),
    (numpy.int32, [0.0, float('nan'), 1.0], 'nan'),
    (numpy.bool_, [0, 1, 2], 2),
    (numpy.int32, ['a', 'b', 'c'], 'a'),
])
def test_arrays_that_would_lose_a_value_are_refused(dtype, stored, lost):
    thing = Keys(dtype)
    with pytest.raises(SnapshotMismatchError,
                       match=r"'keys' holds .* \(e\.g\. '?{}'?\)".format(
                           lost)):
        NpzDeserializer({'keys': stored}).load(thing)
    assert thing.keys.tolist() == [0, 0, 0]


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


class Counter:
    """An object with Chainer's serialize protocol."""

    def __init__(self, count=0):
        self.count = count

    def serialize(self, serializer):
        self.count = serializer('count', self.count)


@pytest.mark.parametrize('compression', [True, False])
@pytest.mark.parametrize('as_path', [False, True], ids=['str', 'Path'])
def test_save_npz_writes_exactly_the_given_name(tmp_path, compression,
                                                as_path):
    # Chainer's trainer names its snapshots 'snapshot_iter_100'.
    name = tmp_path / 'snapshot_iter_100'
    save_npz(name if as_path else str(name), Counter(7),
             compression=compression)
    assert [p.name for p in tmp_path.iterdir()] == ['snapshot_iter_100']
    with zipfile.ZipFile(str(name)) as z:
        kinds = {info.compress_type for info in z.infolist()}
    assert kinds == {zipfile.ZIP_DEFLATED if compression
                     else zipfile.ZIP_STORED}
    loaded = Counter()
    load_npz(str(name), loaded)
    assert loaded.count == 7


def test_serializer_save_and_deserializer_load():
    target = {}
    DictionarySerializer(target).save(Counter(5))
    assert target == {'count': numpy.asarray(5)}
    loaded = Counter()
    NpzDeserializer(target).load(loaded)
    assert loaded.count == 5


def test_none_round_trips_as_none(tmp_path):
    target = {}
    assert DictionarySerializer(target)('x', None) is None
    assert target['x'].dtype == object and target['x'][()] is None
    deserializer = NpzDeserializer(target)
    assert deserializer('x', None) is None
    assert deserializer('x', numpy.zeros(3)) is None    # as Chainer
    assert deserializer('x', 4) is None


def test_none_in_a_file_is_read_without_allowing_pickles(tmp_path):
    path = str(tmp_path / 'f')
    with open(path, 'wb') as f:
        numpy.savez(f, x=None, y=numpy.arange(2))
    with open(path, 'rb') as f, numpy.load(f, allow_pickle=False) as npz:
        deserializer = NpzDeserializer(npz)
        assert deserializer('x', numpy.zeros(2)) is None
        assert deserializer('y', None).tolist() == [0, 1]


class _Boom:
    def __reduce__(self):
        return (os.system, ('echo pwned',))


@pytest.mark.parametrize('value', [
    numpy.array([None, None]),           # not a 0-d None
    numpy.array([_Boom()], dtype=object),   # would run a command
    numpy.asarray('x', dtype=object),
], ids=['vector', 'code', 'string'])
def test_other_pickled_values_are_refused(tmp_path, value, capfd):
    path = str(tmp_path / 'f')
    with open(path, 'wb') as f:
        numpy.savez(f, count=value)
    with pytest.raises(SnapshotMismatchError, match='pickled'):
        load_npz(path, Counter())
    assert 'pwned' not in capfd.readouterr().out


def test_a_pickle_naming_only_numpy_is_never_run(tmp_path):
    # ndarray((4e8,), 'O8') in 31 bytes: unpickling it would take 3.2 GB
    # (and such pickles can corrupt memory); the limit makes that fail.
    path = tmp_path / 'f'
    pickled = (b'\x80\x04cnumpy\nndarray\n(J' + (4 * 10 ** 8).to_bytes(4, 'little')
               + b'\x85\x8c\x02O8tR.')
    header = io.BytesIO()
    numpy.lib.format.write_array_header_1_0(
        header, {'descr': '|O', 'fortran_order': False, 'shape': ()})
    with zipfile.ZipFile(str(path), 'w') as z:
        z.writestr('count.npy', header.getvalue() + pickled)
    code = (
        'import resource, sys\n'
        # 2 GiB: a free-threaded CPython's allocator needs more than 1 to
        # import chainiter; 3.2 GB still cannot be had.
        'resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))\n'
        'import chainiter\n'
        'from chainiter.serializers import load_npz\n'
        'class Counter:\n'
        '    def serialize(self, s):\n'
        '        s("count", 0)\n'
        'try:\n'
        '    load_npz(sys.argv[1], Counter())\n'
        'except chainiter.SnapshotMismatchError as e:\n'
        '    print("refused:", e)\n')
    result = subprocess.run([sys.executable, '-c', code, str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith('refused:') and 'pickled' in result.stdout


_FAILING_SAVE = r'''
import os, resource, signal, sys
import numpy
from chainiter.serializers import save_npz
sys.path.insert(0, {tests!r})
from test_serializers import Thing

path = sys.argv[1]
thing = Thing()
thing.count = 7
save_npz(path, thing)
# A full disk, as a file size limit: writes past 4 KiB fail with EFBIG.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE,
                   (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
thing.count = 8
thing.weights = numpy.random.default_rng(0).random(100000)
try:
    save_npz(path, thing)
except OSError as e:
    print('failed:', e)
else:
    print('saved')
'''


@pytest.mark.timeout(60)
def test_a_save_that_fails_keeps_the_previous_snapshot(tmp_path):
    """A snapshot that cannot be written whole (here: past a file size
    limit, as on a full disk) raises, and the file keeps the previous
    snapshot, which loads; nothing else is left in the directory."""
    name = tmp_path / 'snapshot_iter_100'
    script = _FAILING_SAVE.format(
        tests=os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, '-c', script, str(name)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('failed:'), done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ['snapshot_iter_100']
    loaded = Thing()
    load_npz(str(name), loaded)
    assert loaded.count == 7
    assert (loaded.weights == 0).all()


def test_a_snapshot_file_has_the_permissions_of_a_new_file(tmp_path):
    """Written through a temporary file, the snapshot still gets the
    permissions ``open()`` would give it (0666 less the umask), and
    saving over a symbolic link writes the file it points to."""
    old = os.umask(0o027)
    try:
        save_npz(str(tmp_path / 'a'), Counter(3))
    finally:
        os.umask(old)
    assert (tmp_path / 'a').stat().st_mode & 0o777 == 0o640
    os.symlink('a', str(tmp_path / 'latest'))
    save_npz(str(tmp_path / 'latest'), Counter(4))
    assert os.path.islink(str(tmp_path / 'latest'))
    loaded = Counter()
    load_npz(str(tmp_path / 'a'), loaded)
    assert loaded.count == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a', 'latest']


def test_a_snapshot_saved_over_keeps_its_mode_and_owner(tmp_path):
    """Saved over, a snapshot keeps its mode (a private one stays private)
    and, where this process may set it, its owner; a name too long for a
    temporary name beside it still saves; a directory is refused as
    open() refuses it, before anything is written."""
    name = tmp_path / 'snap'
    save_npz(str(name), Counter(1))
    os.chmod(str(name), 0o600)
    if os.geteuid() == 0:
        os.chown(str(name), 1234, 1234)
    save_npz(str(name), Counter(2))
    assert name.stat().st_mode & 0o777 == 0o600
    if os.geteuid() == 0:
        assert (name.stat().st_uid, name.stat().st_gid) == (1234, 1234)
    loaded = Counter()
    load_npz(str(name), loaded)
    assert loaded.count == 2
    for long_name in (tmp_path / ('s' * 250), tmp_path / ('\u00e9' * 127)):
        save_npz(str(long_name), Counter(3))
        save_npz(str(long_name), Counter(4))
        load_npz(str(long_name), loaded)
        assert loaded.count == 4
    for directory in (str(tmp_path), str(tmp_path / 'new') + os.sep):
        with pytest.raises(IsADirectoryError):
            save_npz(directory, Counter(5))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ['snap', 's' * 250, '\u00e9' * 127])


@pytest.mark.timeout(30)
def test_a_snapshot_saved_to_a_pipe_goes_into_the_pipe(tmp_path):
    """A path that is no regular file (a named pipe) is written into, as
    open() writes, not replaced by a file."""
    import threading
    fifo = str(tmp_path / 'pipe')
    os.mkfifo(fifo)
    got = []

    def read():
        with open(fifo, 'rb') as f:
            got.append(f.read())
    reader = threading.Thread(target=read)
    reader.start()
    save_npz(fifo, Counter(6))
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    loaded = Counter()
    load_npz(io.BytesIO(got[0]), loaded)
    assert loaded.count == 6
