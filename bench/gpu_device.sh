#!/usr/bin/env bash
# The GPU figures of bench/README.md on a lent device machine (an H100 with the
# workplace's 'cuda' image: numba-cuda, torch, cmake, pybind11, scikit-build-core there).
# Run from the repository root with $OUT set; real files in .devdata/ and wheels of
# missing packages in .whl/ (both carried). Usage: bash bench/gpu_device.sh [tests|bench|cpu]...
set -uo pipefail
export PYTHONUNBUFFERED=1 KDECAL_PROGRESS=0 CMAKE_BUILD_PARALLEL_LEVEL=16
OUT="${OUT:-/tmp/out}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# numba-cuda 0.30 calls np.row_stack, which numpy 2.5 removed: numpy 2.3 from .whl/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site
python3 -c "import numpy, numba, numba_cuda; print('numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__)"
mkdir -p ../shared/data && ln -sfn "$PWD/.devdata" ../shared/data/real
t0=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 )) s"
cd /tmp  # import the installed package, not the source tree
R="$OLDPWD"
for what in "$@"; do
  case "$what" in
    tests) python3 -m pytest -q -m cuda "$R/tests/engine/test_cuda.py" ${GPU_TEST_ARGS:-} -p no:cacheprovider \
             --rootdir "$R" -c "$R/pyproject.toml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -15 || true ;;
    torch) python3 -m pytest -q "$R/tests/estimators/test_torch.py" -p no:cacheprovider \
             --rootdir "$R" -c "$R/pyproject.toml" 2>&1 | tail -3 ;;
    bench) python3 "$R/bench/gpu.py" --out "$OUT/gpu.json" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu_bench.log" ;;
    cpu) (cd "$R/bench" && python3 large_n.py 1000000 none && python3 large_n.py 1000000 &&
          python3 scaling.py --n 100000 --threads 1,2,4,8,16) 2>&1 | tee "$OUT/cpu16.log" ;;
  esac
done
