"""The only module that touches torch.

torch is optional and imported the first time a ``'@torch'`` device is
used (a torch the user imported already is taken from ``sys.modules``), so
that ``import chainiter`` and the numpy and cupy devices never load it.
``is_available()`` tells whether torch imports, and
``check_available(index)`` raises an error that says why torch, or its
CUDA GPU ``index``, cannot be used and how to fix it.

``to_cpu_tensor`` makes a CPU tensor that shares the numpy array's memory
(``torch.from_numpy``), except where torch cannot view it: a read-only
array (torch would warn that writing to the tensor is undefined), negative
or uneven strides, and a byte order that is not the machine's are copied
first.  ``to_cuda_tensor`` packs the array into page-locked memory from
torch's caching host allocator and copies it with ``non_blocking=True``;
that allocator does not reuse the memory before the copy has run.
"""

import sys

import numpy

_import_error = None
_tried = False

# The dtype kinds torch holds: bool, signed and unsigned ints, floats,
# complex numbers.
_KINDS = 'biufc'


def _module():
    """The torch module, or None when it cannot be imported."""
    global _import_error, _tried
    torch = sys.modules.get('torch')
    if torch is not None or _tried:
        return torch
    _tried = True
    try:
        import torch
    except Exception as e:      # ImportError, or a broken install
        _import_error = e
        return None
    return torch


def is_available():
    """True when torch imports."""
    return _module() is not None


def check_available(index):
    """Return the torch module, or raise an error that says why torch
    tensors (on the CPU when ``index`` is None, else on CUDA GPU ``index``)
    cannot be made and how to fix it."""
    torch = _module()
    what = "'@torch'" if index is None else "'@torch:cuda:{}'".format(index)
    if torch is None:
        raise RuntimeError(
            '{} was asked for, but torch cannot be imported ({}: {}). '
            'Install it (pip install torch), or pass device=None for numpy '
            'arrays'.format(what, type(_import_error).__name__,
                            _import_error))
    if index is None:
        return torch
    if not torch.cuda.is_available():
        build = 'without CUDA' if torch.version.cuda is None else \
            'for CUDA {}, but it finds no usable GPU'.format(
                torch.version.cuda)
        raise RuntimeError(
            "{} was asked for, but torch.cuda.is_available() is False: "
            "this torch {} is built {}. Pass '@torch' for CPU tensors, or "
            "install a CUDA build of torch on a machine with an NVIDIA "
            "GPU".format(what, torch.__version__, build))
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(
            'GPU {} does not exist: torch sees {} GPU{} (ids 0 to {}). '
            "Pass '@torch:cuda:N' with one of those, or '@torch' for the "
            'CPU'.format(index, count, '' if count == 1 else 's', count - 1))
    return torch


def is_tensor(x):
    torch = sys.modules.get('torch')
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x):
    """The host numpy array of tensor ``x`` (sharing a CPU tensor's
    memory)."""
    return x.detach().cpu().numpy()


def _check_dtype(x, what):
    if x.dtype.kind not in _KINDS or x.dtype.fields is not None:
        raise TypeError(
            'cannot make a torch tensor of {}an array of dtype {} and shape '
            '{}: torch holds bool, int, float and complex numbers only. '
            'Leave such a field out of the batch, turn it into numbers in '
            'the dataset, or convert with device=None and send the numeric '
            'fields with to_device'.format(
                what + ': ' if what else '', x.dtype, x.shape))


def _viewable(x):
    """``x``, or a copy of it that ``torch.from_numpy`` takes without a
    warning or an error."""
    if not x.dtype.isnative:
        return _viewable(x.astype(x.dtype.newbyteorder('=')))
    itemsize = x.dtype.itemsize
    if not x.flags.writeable or \
            any(s < 0 or s % itemsize for s in x.strides):
        return numpy.array(x, order='K' if x.flags.f_contiguous else 'C')
    return x


def to_cpu_tensor(x, what=''):
    """A CPU tensor of ``x``: a numpy array (shared where torch can view
    it), a cupy array (copied to the host) or a tensor."""
    torch = _module()
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if not isinstance(x, numpy.ndarray):        # a cupy array
        x = sys.modules['cupy'].asnumpy(x)
    _check_dtype(x, what)
    return torch.from_numpy(_viewable(x))


_pinning = [True]    # False once torch refused to allocate pinned memory


def to_cuda_tensor(x, index, what=''):
    """A tensor of ``x`` on CUDA GPU ``index``, on torch's current stream:
    a numpy array through page-locked memory (``non_blocking``), a cupy
    array through DLPack, a tensor by ``.to()``."""
    torch = _module()
    device = torch.device('cuda', index)
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if not isinstance(x, numpy.ndarray):        # a cupy array
        return torch.from_dlpack(x).to(device, non_blocking=True)
    _check_dtype(x, what)
    if _pinning[0]:
        dtype = torch.from_numpy(
            numpy.empty(0, x.dtype.newbyteorder('='))).dtype
        try:
            host = torch.empty(x.shape, dtype=dtype, pin_memory=True)
        except RuntimeError:
            _pinning[0] = False
        else:
            numpy.copyto(host.numpy(), x)
            return host.to(device, non_blocking=True)
    return torch.from_numpy(_viewable(x)).to(device)


# ---- side streams (DevicePrefetcher, ConcatWithAsyncTransfer) -------------

def new_stream(index):
    torch = _module()
    return torch.cuda.Stream(torch.device('cuda', index))


def on_stream(stream):
    """The context in which torch's current stream is ``stream``."""
    return _module().cuda.stream(stream)


def current_stream(index):
    return _module().cuda.current_stream(index)
