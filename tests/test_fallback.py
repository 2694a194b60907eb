"""Without the compiled core, kdecal still works on numba and says so once."""

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
