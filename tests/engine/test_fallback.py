"""Without the compiled core, kdecal still works on numba and says so once; without
numba (an optional extra), on the compiled core; without either, one clear error."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import kdecal

_SCRIPT = r"""
import importlib.abc, json, sys, warnings

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "kdecal._core":
            raise ImportError("kdecal._core hidden by the test")
        return None

sys.meta_path.insert(0, _Block())
import numpy as np
import kdecal

rng = np.random.default_rng(5)
P = rng.dirichlet(np.ones(4), size=120)
y = rng.integers(0, 4, size=120)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = kdecal.ece_kde(P, y, bandwidth=0.1)
    b = kdecal.calibration_error(P, y, bandwidth=0.1)
try:
    kdecal.ece_kde(P, y, bandwidth=0.1, backend="cpp")
    cpp_error = ""
except ValueError as exc:
    cpp_error = str(exc)
json.dump({
    "backends": kdecal.available_backends(),
    "warnings": [(type(x.message).__name__, str(x.message)) for x in w],
    "ece": a, "ce": b, "cpp_error": cpp_error,
}, sys.stdout)
"""


def test_numba_fallback_when_core_is_missing():
    if "numba" not in kdecal.available_backends():
        pytest.skip("numba not installed")
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True
        ).stdout
    )
    assert out["backends"] == ["numba"]
    fallback = [m for cls, m in out["warnings"] if cls == "BackendFallbackWarning"]
    assert len(fallback) == 1, out["warnings"]  # once, not per call
    assert "numba" in fallback[0]
    assert "not available" in out["cpp_error"] and "numba" in out["cpp_error"]
    rng = np.random.default_rng(5)
    P = rng.dirichlet(np.ones(4), size=120)
    y = rng.integers(0, 4, size=120)
    ref_backend = kdecal.available_backends()[0]
    assert out["ece"] == pytest.approx(
        kdecal.ece_kde(P, y, bandwidth=0.1, backend=ref_backend), rel=1e-10
    )
    assert out["ce"] == pytest.approx(
        kdecal.calibration_error(P, y, bandwidth=0.1, backend=ref_backend), rel=1e-10
    )


# numba hidden as if it were not installed (a None entry in sys.modules makes every
# import of it fail); the compiled core hidden as well where argv[1] is "no-core"
_NO_NUMBA_SCRIPT = r"""
import importlib.abc, json, sys, warnings

sys.modules["numba"] = None

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "kdecal._core":
            raise ImportError("kdecal._core hidden by the test")
        return None

if sys.argv[1:] == ["no-core"]:
    sys.meta_path.insert(0, _Block())
import numpy as np
import kdecal

def error(**kw):
    try:
        kdecal.ece_kde(P, y, bandwidth=0.1, **kw)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None

rng = np.random.default_rng(5)
P = rng.dirichlet(np.ones(4), size=120)
y = rng.integers(0, 4, size=120)
out = {"backends": kdecal.available_backends(), "numba": error(backend="numba")}
if sys.argv[1:] == ["no-core"]:
    out["auto"] = error()
else:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the compiled core runs
        out["ece"] = kdecal.ece_kde(P, y, bandwidth=0.1)
out["imported"] = sorted(m for m in sys.modules if "numba" in m and sys.modules[m] is not None)
json.dump(out, sys.stdout)
"""


def _without_numba(*args: str) -> dict:
    cmd = [sys.executable, "-c", _NO_NUMBA_SCRIPT, *args]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_without_numba_the_compiled_core_runs():
    """numba is an optional extra: without it kdecal imports, lists no numba backend,
    refuses backend="numba" naming the extra, and computes on the compiled core."""
    if "cpp" not in kdecal.available_backends():
        pytest.skip("the compiled core is not available")
    out = _without_numba()
    assert out["backends"] == ["cpp"]
    kind, msg = out["numba"]
    assert kind == "ValueError" and 'pip install "kdecal[numba]"' in msg, msg
    assert "numba is not installed" in msg and "available backends: ['cpp']" in msg
    assert out["imported"] == []
    rng = np.random.default_rng(5)
    P = rng.dirichlet(np.ones(4), size=120)
    y = rng.integers(0, 4, size=120)
    assert out["ece"] == kdecal.ece_kde(P, y, bandwidth=0.1, backend="cpp")


def test_without_numba_and_core_one_clear_error():
    """Neither engine: import kdecal still works, and a call that needs an engine says
    what to install."""
    out = _without_numba("no-core")
    assert out["backends"] == []
    kind, msg = out["auto"]
    assert kind == "ImportError", msg
    assert "no engine" in msg and 'pip install "kdecal[numba]"' in msg and "wheel" in msg
    kind, msg = out["numba"]
    assert kind == "ValueError" and 'pip install "kdecal[numba]"' in msg, msg
