"""The only module that imports cupy.

cupy is optional (the ``cuda`` extra).  It is imported the first time GPU
code runs; ``available`` tells whether that worked and ``check_available``
raises the saved import error with the fix.
"""

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
