#!/usr/bin/env bash
# Build kdecal with AddressSanitizer + UndefinedBehaviorSanitizer in a virtual environment
# of its own and run the tests that drive the compiled core under them.  Any report fails
# the run (halt_on_error), so a green run means zero reports.
#
#   bash scripts/sanitize.sh                 # all C++-facing test files
#   bash scripts/sanitize.sh tests/engine/test_engine.py -k grad   # a subset (pytest arguments)
#
# KDECAL_SAN_VENV names the environment (default: a fresh temporary one).  Needs gcc or
# clang with the sanitizer runtimes (Debian: libasan, libubsan; installed with gcc).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KDECAL_SAN_VENV:-$(mktemp -d)/venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet ".[test]" \
  -Ccmake.define.KDECAL_SANITIZERS=ON \
  -Ccmake.build-type=RelWithDebInfo \
  -Cbuild-dir=build/sanitize

# The sanitizer runtime must be the first library loaded into the (unsanitized) Python
# process, and libstdc++ with it so that operator new/delete are intercepted; without
# this preload the import aborts ("ASan runtime does not come first").
CXX_BIN="${CXX:-c++}"
ASAN_LIB="$("$CXX_BIN" -print-file-name=libasan.so)"
UBSAN_LIB="$("$CXX_BIN" -print-file-name=libubsan.so)"
STDCXX_LIB="$("$CXX_BIN" -print-file-name=libstdc++.so)"
export LD_PRELOAD="$ASAN_LIB $UBSAN_LIB $STDCXX_LIB"
# CPython and numba keep allocations alive until exit by design: leak checking would
# report them, not kdecal.  Everything else stops the run at the first report.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export KDECAL_PROGRESS=0

cd tests  # import the installed, sanitized kdecal, not the source tree
if [ "$#" -eq 0 ]; then
  set -- test_engine.py test_backends.py test_loo_grad.py test_multi.py test_debias.py \
    test_errors.py test_interrupt.py test_reference.py test_notions.py
fi
python -c "import kdecal._core as c; print('sanitized core:', c.__file__)"
python -m pytest -q -p no:cacheprovider --rootdir=.. -c ../pyproject.toml "$@"
