#!/usr/bin/env bash
# On a lent GPU machine (its jax 0.11+ and CUDA plugin as preinstalled): install the carried wheel
# without dependencies into /tmp/lf (nothing else is installed or changed) and run the check.
#   here:    pip wheel --no-deps -w .whl .          (carry .whl with the working tree)
#   device:  bash bench/gpu_check.sh [--out DIR]    (default $OUT/gpu_check when $OUT is set)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls .whl/loopfuse-*.whl)
pip install -q --no-deps --upgrade --target /tmp/lf "$wheel"
PYTHONPATH=/tmp/lf exec python bench/gpu_check.py --out "${OUT:-bench/out}/gpu_check" "$@"
