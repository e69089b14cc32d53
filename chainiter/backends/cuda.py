"""The only module that imports cupy.

cupy is optional (the ``cuda`` extra).  It is imported the first time GPU
code runs; ``available`` tells whether that worked and ``check_available``
raises the saved import error with the fix.
"""

import numpy

_cupy = None
_import_error = None
_tried = False


def _import():
    global _cupy, _import_error, _tried
    if not _tried:
        _tried = True
        try:
            import cupy
            _cupy = cupy
        except Exception as e:  # ImportError, or a broken CUDA install
            _import_error = e
    return _cupy


def is_available():
    """True when cupy imports and sees at least one GPU."""
    cupy = _import()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def check_available(device):
    """Return the cupy module, or raise an error that says why the GPU
    ``device`` cannot be used and how to fix it."""
    cupy = _import()
    if cupy is None:
        raise RuntimeError(
            'device {!r} is a GPU, but cupy cannot be imported ({}: {}). '
            'Install the cuda extra: pip install "chainiter[cuda]" (or the '
            'cupy wheel matching your CUDA, e.g. cupy-cuda12x), or pass '
            'device=None for the host'.format(
                device, type(_import_error).__name__, _import_error))
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise RuntimeError(
            'device {!r} is a GPU, but CUDA finds no usable GPU ({}); pass '
            'device=None for the host'.format(device, e)) from e
    if count == 0:
        raise RuntimeError(
            'device {!r} is a GPU, but this machine has no CUDA GPU; pass '
            'device=None for the host'.format(device))
    return cupy


def is_gpu_array(x):
    cupy = _cupy
    return cupy is not None and isinstance(x, cupy.ndarray)


def to_gpu(x, device_id):
    """Copy a host array to GPU ``device_id`` (synchronous)."""
    cupy = check_available(device_id)
    with cupy.cuda.Device(device_id):
        return cupy.asarray(x)


def to_cpu(x):
    return _cupy.asnumpy(x)


# ---- asynchronous host-to-device transfer --------------------------------

def device(device_id):
    """The cupy ``Device`` context for ``device_id``."""
    return check_available(device_id).cuda.Device(device_id)


def new_stream():
    return _cupy.cuda.Stream(non_blocking=True)


def current_stream():
    return _cupy.cuda.get_current_stream()


def alloc_pinned(nbytes):
    """A uint8 numpy array of ``nbytes`` in page-locked host memory."""
    memory = _cupy.cuda.alloc_pinned_memory(nbytes)
    return numpy.frombuffer(memory, dtype=numpy.uint8, count=nbytes)


_registered = {}


def register_host(address, nbytes):
    """Page-lock ``nbytes`` of host memory at ``address`` (once), so that
    copies from it to a GPU are direct DMA."""
    if address in _registered:
        return
    _cupy.cuda.runtime.hostRegister(address, nbytes, 0)
    _registered[address] = nbytes


def copy_to_device(host, stream):
    """A new device array holding the C-contiguous ``host`` array, copied
    on ``stream`` (asynchronously when ``host`` is page-locked)."""
    with stream:
        out = _cupy.empty(host.shape, dtype=host.dtype)
    out.set(host, stream=stream)
    return out
