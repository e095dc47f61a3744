#!/usr/bin/env bash
# Regenerate every figure of BENCHMARKS.md: run each bench script once (default settings, each a
# few minutes on 2 cores), then paste bench/out/NAME.md into BENCHMARKS.md's figure blocks.
#   bench/run_all.sh            # the whole set (~35 min on an idle 2-core machine)
#   bench/run_all.sh --quick    # smoke test of every script; does not touch BENCHMARKS.md
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=bench/out
[[ "${1:-}" == "--quick" ]] && OUT=bench/out/quick
mkdir -p "$OUT"
start=$SECONDS
run() {  # run NAME SCRIPT [ARGS...]
  local name=$1; shift
  echo "== $name: $PY bench/$*" >&2
  local t=$SECONDS
  "$PY" "bench/$@" --out "$OUT" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1 || { tail -30 "$OUT/$name.log"; exit 1; }
  echo "   $((SECONDS - t)) s" >&2
}
run loop bench_loop.py "$@"
run memory bench_memory.py "$@"
run gate bench_gate.py "$@"
run simplify bench_simplify.py "$@"
run all_reduce bench_all_reduce.py "$@"
run call bench_call.py "$@"
run call_executables bench_call.py --executables "$@"
run until bench_until.py "$@"
run minimize_until bench_minimize_until.py "$@"
run minimize_call bench_minimize_call.py "$@"
run static_leaves bench_static_leaves.py "$@"
run repeated_solves bench_repeated_solves.py "$@"
run data bench_data.py "$@"
run data_1mx16 bench_data.py --sizes "1M x 16" --rounds 5 "$@"
run compile_options bench_compile_options.py "$@"
run compile bench_compile.py "$@"
run first_call bench_first_call.py "$@"
run cache bench_cache.py "$@"
run odefit bench_odefit.py "$@"
run gpt bench_gpt.py "$@"
run layers bench_layers.py "$@"
run layers_gpt_24 bench_layers.py --layers 24 --compile-rounds 1 --rounds 3 "$@"
run layers_nnx_12 bench_layers.py --model nnx --rounds 15 --calls 5 --compile-rounds 5 "$@"
run roll_models bench_roll_models.py --devices "$@"
run roll_pass_seconds roll_pass_seconds.py "$@"
run compile_depth bench_compile_depth.py "$@"
run micro_batch bench_micro_batch.py "$@"
run roll_micro_batch bench_roll_micro_batch.py "$@"
run memory_limit bench_memory_limit.py "$@"
run ensemble bench_ensemble.py "$@"
echo "all figures in $((SECONDS - start)) s" >&2
if [[ "$OUT" == bench/out ]]; then "$PY" bench/harness.py paste BENCHMARKS.md "$OUT"; fi
