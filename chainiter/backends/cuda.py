"""The only module that touches cupy.

cupy is optional (the ``cuda`` extra).  The cupy a user imported is used as
it is (``sys.modules``), so GPU arrays are recognised before chainiter ever
asked for cupy; otherwise it is imported the first time GPU code runs.
``is_available()`` tells whether a GPU can be used, and
``check_available(device)`` raises an error that says why not and how to
fix it.
"""

import sys
import threading
from typing import Dict

import numpy

_import_error = None
_tried = False


def _module():
    """The cupy module, or None when it cannot be imported."""
    global _import_error, _tried
    cupy = sys.modules.get('cupy')
    if cupy is not None or _tried:
        return cupy
    _tried = True
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        _import_error = e
        return None
    return cupy


def is_available():
    """True when cupy imports and sees at least one GPU."""
    cupy = _module()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


_HOST_HINT = {False: '; pass device=None for the host',
              True: '; bring the arrays to the host with to_device(-1, x)'}


def check_available(device_id):
    """Return the cupy module, or raise an error that says why GPU
    ``device_id`` (an int, or None for "any GPU") cannot be used and how to
    fix it."""
    cupy = _module()
    what = 'cupy arrays were given' if device_id is None else \
        'GPU {} was asked for'.format(device_id)
    if cupy is None:
        raise RuntimeError(
            '{}, but cupy cannot be imported ({}: {}). '
            'Install the extra of your CUDA: pip install '
            '"chainiter[cuda12]" (cupy-cuda12x; "chainiter[cuda]" is the '
            'same) or "chainiter[cuda13]" (cupy-cuda13x), or pass '
            'device=None for the host'.format(
                what, type(_import_error).__name__, _import_error))
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:    # no driver, or a driver too old for this cupy
        raise RuntimeError(
            '{}, but there is no usable CUDA GPU: {}: {}. Check nvidia-smi '
            'and that the cupy wheel matches the driver{}'.format(
                what, type(e).__name__, e, _HOST_HINT[device_id is None])
        ) from e
    if count == 0:
        raise RuntimeError(
            '{}, but there is no usable CUDA GPU: CUDA finds none on this '
            'machine{}'.format(what, _HOST_HINT[device_id is None]))
    if device_id is not None and device_id >= count:
        raise ValueError(
            'GPU {} does not exist: this machine has {} GPU{} (ids 0 to {}). '
            'Pass one of those, or None for the host'.format(
                device_id, count, '' if count == 1 else 's', count - 1))
    return cupy


def is_gpu_array(x):
    cupy = sys.modules.get('cupy')
    return cupy is not None and isinstance(x, cupy.ndarray)


def to_gpu(x, device_id):
    """Copy a host array to GPU ``device_id`` (synchronous)."""
    cupy = check_available(device_id)
    with cupy.cuda.Device(device_id):
        return cupy.asarray(x)


def to_cpu(x):
    return sys.modules['cupy'].asnumpy(x)


# ---- asynchronous host-to-device transfer --------------------------------

def device(device_id):
    """The cupy ``Device`` context for ``device_id``."""
    return check_available(device_id).cuda.Device(device_id)


def new_stream():
    return _module().cuda.Stream(non_blocking=True)


def current_stream():
    return _module().cuda.get_current_stream()


def alloc_pinned(nbytes):
    """A uint8 numpy array of ``nbytes`` in page-locked host memory."""
    memory = _module().cuda.alloc_pinned_memory(nbytes)
    return numpy.frombuffer(memory, dtype=numpy.uint8, count=nbytes)


# Page-locked ranges of memory chainiter registered: address -> nbytes.
# Registrations are process-wide (cudaHostRegisterPortable: every device).
_registered: Dict[int, int] = {}
_registered_lock = threading.RLock()
_PORTABLE = 1


def register_host(address, nbytes):
    """Page-lock ``nbytes`` of host memory at ``address``, so that copies
    from it to a GPU are direct DMA.  The caller must ``unregister_host``
    before that memory is unmapped.  Returns None, or the CUDA error when
    the memory cannot be registered (then copy through a staging buffer)."""
    with _registered_lock:
        if address in _registered:     # never released: do not trust it
            return RuntimeError('0x{:x} is registered already'.format(
                address))
        try:
            _module().cuda.runtime.hostRegister(address, nbytes, _PORTABLE)
        except Exception as e:
            return e
        _registered[address] = nbytes
        return None


def unregister_host(address):
    """Undo ``register_host``; the memory may be unmapped afterwards."""
    with _registered_lock:
        if _registered.pop(address, None) is not None:
            _module().cuda.runtime.hostUnregister(address)


def copy_to_device(host, stream):
    """A new device array holding the C-contiguous ``host`` array, copied
    on ``stream`` (asynchronously when ``host`` is page-locked)."""
    cupy = _module()
    with stream:
        out = cupy.empty(host.shape, dtype=host.dtype)
    out.set(host, stream=stream)
    return out
