#!/usr/bin/env bash
# On a lent GPU machine (its jax 0.11+ and CUDA plugin as preinstalled): install the carried wheel
# without dependencies into /tmp/lf (nothing else is installed or changed) and run the check; extra
# arguments go to bench/gpu_check.py. Without pip (a venv made without it), the pure-Python wheel is
# unzipped into /tmp/lf instead, which is what pip --target does with it.
#   here:    pip wheel --no-deps -w .whl .          (carry .whl with the working tree)
#   device:  bash bench/gpu_check.sh [--sections ...] [--quick]   (output in $OUT/gpu_check, else bench/out/gpu_check)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls .whl/loopfuse-*.whl)
if python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --upgrade --target /tmp/lf "$wheel"
else
  rm -rf /tmp/lf && python3 -m zipfile -e "$wheel" /tmp/lf
fi
PYTHONPATH=/tmp/lf exec python3 bench/gpu_check.py --out "${OUT:-bench/out}/gpu_check" "$@"
