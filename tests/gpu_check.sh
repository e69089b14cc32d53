#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU:
#   bash tests/gpu_check.sh [WHEEL_DIR]
# WHEEL_DIR holds a cupy wheel (e.g. cupy_cuda12x-*.whl) for machines without
# network; without it, cupy-cuda12x is installed from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -m venv /tmp/chainiter-gpu
. /tmp/chainiter-gpu/bin/activate
if [ -n "${1:-}" ]; then
    pip install -q --no-index --find-links "$1" cupy-cuda12x numpy \
        pytest pytest-timeout fastrlock
    pip install -q --no-index --no-build-isolation --no-deps -e .
else
    pip install -q -e ".[test]" cupy-cuda12x
fi
python -c "import cupy; print('cupy', cupy.__version__, 'GPUs:', cupy.cuda.runtime.getDeviceCount())"
python -m pytest -m gpu -v -p no:cacheprovider tests/test_device.py
python -m chainiter.bench.h2d
