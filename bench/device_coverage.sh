#!/usr/bin/env bash
# The bootstrap coverage of bench/README.md ("Bootstrap intervals of the residual
# estimators") on a lent 16-core device machine, in one call: build kdecal, then
# bench/bootstrap_coverage.py as 12 parallel jobs of one thread (one per K, n and t),
# their Markdown rows gathered in $OUT/coverage.md (stderr tails in $OUT/coverage.err). Run from the repository root
# with $OUT set and the wheels of bench/gpu_device.sh in .whl/.
# Usage: bash bench/device_coverage.sh [SECONDS]
set -uo pipefail
export PYTHONUNBUFFERED=1 KDECAL_PROGRESS=0 CMAKE_BUILD_PARALLEL_LEVEL=16
OUT="${OUT:-/tmp/out}"
LIMIT="${1:-360}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 )) s"
R="$PWD"
W=/tmp/cov; mkdir -p "$W"
cd /tmp  # import the installed package, not the source tree
export OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for n in 1000 5000; do
  for K in 2 4 10; do
    for t in 1 2; do
      draws=200; reps=200
      if [ "$n" = 5000 ]; then
        reps=100
        [ "$K" = 4 ] && draws=120
        [ "$K" = 10 ] && draws=60
      fi
      timeout "$LIMIT" python3 "$R/bench/bootstrap_coverage.py" --K "$K" --n "$n" --t "$t" \
        --draws "$draws" --R "$reps" > "$W/cov_${K}_${n}_${t}.md" 2> "$W/cov_${K}_${n}_${t}.err" &
    done
  done
done
wait
echo "total: $(( $(date +%s) - t0 )) s"
cat "$W"/cov_*.md | grep -v "^| n |\|^|---" | sort -t'|' -k2,2n -k3,3n -k4,4n > "$OUT/coverage.md"
cat "$OUT/coverage.md"
tail -n 3 "$W"/cov_*.err > "$OUT/coverage.err" 2>&1; tail -n 20 "$OUT/coverage.err"
