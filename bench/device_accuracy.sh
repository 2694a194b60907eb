#!/usr/bin/env bash
# The accuracy study of bench/README.md ("Residual-centred estimators") on a lent
# 16-core device machine, in one call: build kdecal, run the GPU engine's residual-sum
# tests on the device, then bench/accuracy.py as parallel jobs of 2 threads each (one
# per K and n), their JSON lines in $OUT/acc_*.jsonl. Run from the repository root with
# $OUT set and the wheels of bench/gpu_device.sh in .whl/.
# Usage: bash bench/device_accuracy.sh [REPS] [SECONDS]
set -uo pipefail
export PYTHONUNBUFFERED=1 KDECAL_PROGRESS=0 CMAKE_BUILD_PARALLEL_LEVEL=16
OUT="${OUT:-/tmp/out}"
REPS="${1:-3}"
LIMIT="${2:-420}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 )) s"
R="$PWD"
cd /tmp  # import the installed package, not the source tree
(python3 -m pytest -q -m cuda "$R/tests/engine/test_residual_backends.py" -p no:cacheprovider \
   --rootdir "$R" -c "$R/pyproject.toml" 2>&1 | tail -4) > "$OUT/gpu_residual_tests.log" &
export OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1
for K in 2 4 10; do
  for n in 1000 5000 20000; do
    r=$REPS; [ "$n" = 20000 ] && r=1
    timeout "$LIMIT" python3 "$R/bench/accuracy.py" accuracy "$r" "$K" "$n" \
      > "$OUT/acc_${K}_${n}.jsonl" 2> "$OUT/acc_${K}_${n}.err" &
  done
done
wait
cat "$OUT/gpu_residual_tests.log"
wc -l "$OUT"/acc_*.jsonl
