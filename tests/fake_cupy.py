"""A recording stand-in for the few cupy calls chainiter makes, for tests
without a GPU.

It keeps CUDA's ordering rules and makes their races deterministic:

- a copy to the device from page-locked host memory (``alloc_pinned_memory``
  or a ``hostRegister``-ed range) is queued on its stream and reads the host
  memory, by address, only when the stream runs: it keeps nothing alive,
  so memory freed or reused before then shows in the values; a copy from
  pageable memory runs at once, as CUDA stages it before returning;
- a stream runs only when it, or an event recorded on it, is synchronised,
  or when an array is read back with ``get()``, which runs the current
  stream (and, through ``wait_event``, what it waits for), as cupy does;
- ``event.done`` is False until the stream has run up to the event;
- page-locked memory comes from a pool, as cupy's: a block freed is handed
  out again at the same address;
- ``hostRegister`` of a range that overlaps a registered one raises, and
  ``hostUnregister`` of a range that is not registered raises, as CUDA does.

Install it with ``monkeypatch.setitem(sys.modules, 'cupy', FakeCupy())``.
"""

import ctypes
import types
import weakref

import numpy


class CUDARuntimeError(RuntimeError):
    pass


def _address(array):
    return array.__array_interface__['data'][0]


class Event:

    def __init__(self, stream, position):
        self.stream = stream
        self.position = position

    @property
    def done(self):
        return self.stream.executed >= self.position

    def synchronize(self):
        self.stream.run(self.position)


class Stream:

    def __init__(self, gpu, non_blocking=False):
        self.gpu = gpu
        self.ops = []            # callables, in issue order
        self.executed = 0        # how many of them have run
        self.ptr = id(self)

    def __enter__(self):
        self.gpu.stream_stack.append(self)
        return self

    def __exit__(self, *exc):
        self.gpu.stream_stack.pop()

    def enqueue(self, op):
        self.ops.append(op)

    def run(self, position=None):
        position = len(self.ops) if position is None else position
        while self.executed < position:
            op, self.ops[self.executed] = self.ops[self.executed], None
            self.executed += 1
            op()        # (the list keeps positions; ran ops are dropped)

    def record(self):
        return Event(self, len(self.ops))

    def wait_event(self, event):
        self.enqueue(lambda: event.stream.run(event.position))

    def synchronize(self):
        self.run()


class ndarray:
    """Device memory: a numpy array only reachable through get()."""

    def __init__(self, gpu, shape, dtype):
        self.gpu = gpu
        self._data = numpy.empty(shape, dtype=dtype)
        self.shape = self._data.shape
        self.dtype = self._data.dtype
        self.ndim = self._data.ndim
        self.nbytes = self._data.nbytes

    def set(self, host, stream=None):
        stream = stream or self.gpu.current_stream()
        host = numpy.asarray(host)
        if host.shape != self.shape or host.dtype != self.dtype or \
                not host.flags.c_contiguous:
            raise ValueError('shape, dtype or layout mismatch')
        source = self.gpu.memory_of(host)
        self.gpu.copies.append(source)
        address, nbytes, data = _address(host), host.nbytes, self._data

        def copy():
            ctypes.memmove(data.ctypes.data, address, nbytes)
        if source != 'pageable':
            stream.enqueue(copy)
        else:
            stream.run()
            copy()

    def get(self, stream=None):
        (stream or self.gpu.current_stream()).synchronize()
        return self._data.copy()


class FakeCupy(types.ModuleType):
    """The ``cupy`` module of a machine with ``n_gpus`` GPUs."""

    def __init__(self, n_gpus=1):
        super().__init__('cupy')
        gpu = self
        self.ndarray = ndarray
        self.n_gpus = n_gpus
        self.streams = []
        self.stream_stack = []
        self.default_stream = self._new_stream()
        self.pinned = []          # (address, nbytes, block): every block
        self.free_pinned = []     # blocks back in the pool
        self.registered = {}      # address -> nbytes
        self.registrations = []   # every hostRegister: (address, nbytes)
        self.copies = []          # per copy, what memory_of() its source
        self.refuse_registration = False
        self.fail_pinned = 0      # allocations of page-locked memory to fail

        class Device:
            def __init__(self, device_id=0):
                if not 0 <= device_id < gpu.n_gpus:
                    raise CUDARuntimeError(
                        'cudaErrorInvalidDevice: invalid device ordinal')
                self.id = device_id

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def synchronize(self):
                gpu.synchronize()

        def get_device_count():
            return gpu.n_gpus

        def host_register(address, nbytes, flags):
            if gpu.refuse_registration:
                raise CUDARuntimeError('cudaErrorNotSupported')
            for start, size in gpu.registered.items():
                if address < start + size and start < address + nbytes:
                    raise CUDARuntimeError(
                        'cudaErrorHostMemoryAlreadyRegistered')
            gpu.registered[address] = nbytes
            gpu.registrations.append((address, nbytes))

        def host_unregister(address):
            if gpu.registered.pop(address, None) is None:
                raise CUDARuntimeError('cudaErrorHostMemoryNotRegistered')

        def alloc_pinned_memory(nbytes):
            """A block from the pool (the smallest free one that fits),
            returned to it when the array handed out is collected."""
            if gpu.fail_pinned:
                gpu.fail_pinned -= 1
                raise CUDARuntimeError('cudaErrorMemoryAllocation')
            fitting = [b for b in gpu.free_pinned if len(b) >= nbytes]
            if fitting:
                block = min(fitting, key=len)
                gpu.free_pinned.remove(block)
            else:
                block = numpy.zeros(max(nbytes, 1), dtype=numpy.uint8)
                gpu.pinned.append((_address(block), block.nbytes, block))
            # Not an ndarray (numpy would make the block itself the base
            # of arrays made from it): like cupy's PinnedMemoryPointer.
            memory = (ctypes.c_uint8 * nbytes).from_buffer(block)
            weakref.finalize(memory, gpu.free_pinned.append, block)
            return memory

        runtime = types.SimpleNamespace(
            getDeviceCount=get_device_count, hostRegister=host_register,
            hostUnregister=host_unregister, CUDARuntimeError=CUDARuntimeError)
        self.cuda = types.SimpleNamespace(
            Device=Device, Stream=lambda non_blocking=False:
                self._new_stream(non_blocking),
            get_current_stream=self.current_stream, runtime=runtime,
            alloc_pinned_memory=alloc_pinned_memory)

    def _new_stream(self, non_blocking=False):
        stream = Stream(self, non_blocking)
        self.streams.append(stream)
        return stream

    def current_stream(self):
        return self.stream_stack[-1] if self.stream_stack else \
            self.default_stream

    def synchronize(self):
        while any(s.executed < len(s.ops) for s in self.streams):
            for stream in self.streams:
                stream.run()

    def memory_of(self, host):
        """'allocated' (alloc_pinned_memory), 'registered' or 'pageable'."""
        start, end = _address(host), _address(host) + host.nbytes
        if any(a <= start and end <= a + n for a, n, _ in self.pinned):
            return 'allocated'
        if any(a <= start and end <= a + n
               for a, n in self.registered.items()):
            return 'registered'
        return 'pageable'

    # ---- array functions ----

    def empty(self, shape, dtype=numpy.float64):
        return ndarray(self, shape, dtype)

    def asarray(self, x):
        if isinstance(x, ndarray):
            return x
        x = numpy.asarray(x)
        out = ndarray(self, x.shape, x.dtype)
        out.set(x)
        return out

    def asnumpy(self, x):
        return x.get() if isinstance(x, ndarray) else numpy.asarray(x)

    def stack(self, arrays):
        return self.asarray(numpy.stack([a.get() for a in arrays]))

    def full(self, shape, value, dtype=None):
        return self.asarray(numpy.full(shape, value, dtype=dtype))
