#!/usr/bin/env bash
# The GPU checks in one go, on a machine with an NVIDIA GPU:
#
#   bash tests/gpu_check.sh [WHEEL_DIR]
#
# It uses the Python in $PYTHON (default: python3) with the cupy already
# installed there (any cupy-cudaXXx), and imports chainiter from this
# checkout: nothing is built or installed into that Python.  What is missing
# (pytest, pytest-timeout, numpy, cupy, NVRTC) is installed into
# $CHAINITER_GPU_DEPS (default: /tmp/chainiter-gpu-deps) and put on the path:
# from WHEEL_DIR when given (no network needed), else from the package index.
# A WHEEL_DIR for a machine without network is made elsewhere with, e.g.
# (match the target's Python and CUDA major version):
#
#   pip download -d wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 pytest pytest-timeout \
#       cupy-cuda13x nvidia-cuda-nvrtc
#
# (nvidia-cuda-nvrtc-cu12 for cupy-cuda12x).  It runs the tests marked gpu
# (tests/test_device.py) and prints the host-to-device bandwidth table;
# a few minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${1:-}
DEPS=${CHAINITER_GPU_DEPS:-/tmp/chainiter-gpu-deps}
export PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    || echo "nvidia-smi failed: is there a GPU and a driver?"
cuda_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)

install() {
    echo "installing into $DEPS: $*"
    if [ -n "$WHEELS" ]; then
        "$PY" -m pip install -q --no-index --find-links "$WHEELS" \
            --target "$DEPS" "$@"
    else
        "$PY" -m pip install -q --target "$DEPS" "$@"
    fi
}

missing=$("$PY" - <<'EOF'
import importlib.util
needed = {'numpy': 'numpy', 'pytest': 'pytest',
          'pytest_timeout': 'pytest-timeout'}
print(' '.join(package for module, package in needed.items()
               if importlib.util.find_spec(module) is None))
EOF
)
if ! "$PY" -c 'import cupy' 2>/dev/null; then
    if [ "${cuda_major:-12}" -ge 13 ]; then
        missing="$missing cupy-cuda13x"
    else
        missing="$missing cupy-cuda12x"
    fi
fi
if [ -n "${missing// /}" ]; then
    install $missing || { echo "could not install: $missing"; exit 1; }
fi

# cupy compiles its kernels with NVRTC; a machine with only the driver
# lacks it.  The NVRTC wheel matching cupy's CUDA major version fixes that.
kernel_check='import cupy; assert (cupy.arange(3) * 2).get().tolist() == [0, 2, 4]'
nvrtc_path() {
    local found
    found=$(find "$DEPS/nvidia" -name 'libnvrtc.so*' -printf '%h\n' 2>/dev/null \
        | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:-}"
}
nvrtc_path
log=${TMPDIR:-/tmp}/chainiter-gpu-kernel.log
if ! "$PY" -c "$kernel_check" 2>"$log"; then
    tail -3 "$log"
    if ! grep -qi nvrtc "$log"; then
        echo "cupy cannot run a kernel (see above)"; exit 1
    fi
    major=$("$PY" -c 'import cupy; print(cupy.cuda.runtime.runtimeGetVersion() // 1000)')
    if [ "$major" -ge 13 ]; then
        install nvidia-cuda-nvrtc
    else
        install "nvidia-cuda-nvrtc-cu$major"
    fi
    nvrtc_path
    "$PY" -c "$kernel_check" || { echo "cupy cannot run a kernel"; exit 1; }
fi

"$PY" - <<'EOF'
import sys, numpy, cupy, chainiter
print('python', sys.version.split()[0], '| numpy', numpy.__version__,
      '| cupy', cupy.__version__, '| CUDA runtime',
      cupy.cuda.runtime.runtimeGetVersion(), '| GPUs',
      cupy.cuda.runtime.getDeviceCount(), '| chainiter from',
      chainiter.__file__)
EOF
status=0
"$PY" -m pytest -m gpu -v -p no:cacheprovider tests/test_device.py || status=1
"$PY" -m chainiter.bench.h2d || status=1
exit $status
