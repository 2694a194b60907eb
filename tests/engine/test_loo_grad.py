"""The engine's backward pass, kdecal._core.loo_grad, without torch.

Checks the four streaming reductions against a float64 brute force that materialises
the n x n weight matrix, the batch axis, thread independence, every SIMD path, and the
C++ argument checks.  (The torch losses built on it are tested in test_torch.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp

from kdecal._engine import runtime as _runtime

core = _runtime._core
pytestmark = pytest.mark.skipif(core is None, reason="compiled core not available")


def _problem(n, K, C, h, seed=0, dtype=np.float64, alpha=0.7):
    """Points, engine inputs and the forward's lse = m + log S0 for one bandwidth."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    labels = rng.integers(0, C, size=n).astype(np.int64)
    bias = -gammaln(P / h + 1).sum(axis=1)
    logq = np.ascontiguousarray(np.log(P), dtype=dtype)
    p = np.ascontiguousarray(P, dtype=dtype)
    m, S, _, _ = core.loo_reduce(logq, p, labels, C, np.array([1 / h]), bias[None], 1, 0, n, 0)
    lse = m[0] + np.log(S[0].sum(axis=1))
    coef = rng.normal(size=(n, C))
    return P, logq, p, labels, bias, lse, coef


def _brute(P, labels, h, bias, coef):
    """Float64 brute force: R[i, j] = w_ij coef[j, y_i] from the materialised matrix."""
    L = bias[:, None] + (P @ np.log(P).T) / h  # L[i, j]: centre i, query j
    np.fill_diagonal(L, -np.inf)
    W = np.exp(L - logsumexp(L, axis=0, keepdims=True))  # normalised over centres i
    R = W * coef.T[labels, :]
    return (R.T @ P) / h, (R @ np.log(P)) / h, R.sum(axis=1), R.sum(axis=0)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize(
    "n,K,C,h",
    [(7, 3, 3, 0.3), (300, 10, 10, 0.02), (290, 2, 2, 0.5), (333, 5, 7, 0.05), (270, 3, 3, 1e-3)],
    ids=lambda v: str(v),
)
def test_matches_brute_force_float64(n, K, C, h):
    P, logq, p, labels, bias, lse, coef = _problem(n, K, C, h)
    got = core.loo_grad(logq, p, labels, C, 1 / h, bias, lse, coef, 0)
    ref = _brute(P, labels, h, bias, coef)
    for name, a, b in zip(("grad_logq", "grad_p", "grad_bias"), got[:3], ref[:3]):
        assert _rel(a, b) < 1e-11, name
    np.testing.assert_allclose(got[3], ref[3], rtol=0, atol=1e-12 * np.abs(coef).max())


def test_float32_within_its_rounding():
    """float32 K-dots (as in the forward): ~1e-7 relative at h = 0.1."""
    h = 0.1
    P, logq, p, labels, bias, lse, coef = _problem(400, 4, 4, h, dtype=np.float32)
    got = core.loo_grad(logq, p, labels, 4, 1 / h, bias, lse, coef, 0)
    ref = _brute(P, labels, h, bias, coef)
    for a, b in zip(got[:3], ref[:3]):
        assert a.dtype == np.float64
        assert _rel(a, b) < 2e-6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_weights_sum_to_one(dtype):
    """With coef = 1 the row sums are sum_i w_ij = 1: the recomputed weights are the forward's."""
    h = 0.02
    _, logq, p, labels, bias, lse, _ = _problem(700, 10, 10, h, dtype=dtype)
    out = core.loo_grad(logq, p, labels, 10, 1 / h, bias, lse, np.ones((700, 10)), 0)
    np.testing.assert_allclose(out[3], 1.0, rtol=0, atol=1e-12)


def test_batch_equals_separate_problems():
    h = 0.05
    parts = [_problem(150, 3, 3, h, seed=s) for s in range(3)]
    stacked = [np.ascontiguousarray(np.stack([x[k] for x in parts])) for k in range(1, 7)]
    logq, p, labels, bias, lse, coef = stacked
    batched = core.loo_grad(logq, p, labels, 3, 1 / h, bias, lse, coef, 0)
    for b, x in enumerate(parts):
        single = core.loo_grad(*x[1:4], 3, 1 / h, *x[4:], 0)
        for a, s in zip(batched, single):
            np.testing.assert_array_equal(a[b], s)


def test_results_do_not_depend_on_threads():
    h = 0.05
    _, logq, p, labels, bias, lse, coef = _problem(600, 6, 6, h)
    one = core.loo_grad(logq, p, labels, 6, 1 / h, bias, lse, coef, 1)
    two = core.loo_grad(logq, p, labels, 6, 1 / h, bias, lse, coef, 2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "change,exc,match",
    [
        ({"labels": 9}, ValueError, "label 9"),
        ({"scale": 0.0}, ValueError, "scale"),
        ({"scale": float("nan")}, ValueError, "scale"),
        ({"coef": (30, 2)}, ValueError, "coef must have shape"),
        ({"lse": 29}, ValueError, "lse must have shape"),
        ({"bias": 31}, ValueError, "bias must have shape"),
        ({"p": np.float32}, TypeError, "incompatible function arguments"),
    ],
    ids=lambda v: str(v),
)
def test_argument_errors(change, exc, match):
    h = 0.1
    _, logq, p, labels, bias, lse, coef = _problem(30, 3, 3, h)
    scale = change.get("scale", 1 / h)
    if "labels" in change:
        labels = labels.copy()
        labels[4] = change["labels"]
    if "coef" in change:
        coef = np.zeros(change["coef"])
    if "lse" in change:
        lse = np.zeros(change["lse"])
    if "bias" in change:
        bias = np.zeros(change["bias"])
    if "p" in change:
        p = p.astype(change["p"])
    with pytest.raises(exc, match=match):
        core.loo_grad(logq, p, labels, 3, scale, bias, lse, coef, 0)


_ISA_SCRIPT = r"""
import json, sys
import numpy as np
from scipy.special import gammaln
from kdecal._engine import runtime as _runtime
core = _runtime._core
rng = np.random.default_rng(3)
n, K, h = 517, 10, 0.02
P = rng.dirichlet(np.full(K, 0.5), size=n); P = np.maximum(P, 1e-12); P /= P.sum(1, keepdims=True)
y = rng.integers(0, K, n).astype(np.int64)
bias = -gammaln(P / h + 1).sum(1)
coef = rng.normal(size=(n, K))
out = {"isa": core.simd_path()}
for dt in ("float64", "float32"):
    lq, p = np.log(P).astype(dt), P.astype(dt)
    m, S, _, _ = core.loo_reduce(lq, p, y, K, np.array([1 / h]), bias[None], 1, 0, n, 0)
    lse = m[0] + np.log(S[0].sum(1))
    out[dt] = [a.tolist() for a in core.loo_grad(lq, p, y, K, 1 / h, bias, lse, coef, 0)]
json.dump(out, sys.stdout)
"""


def test_every_simd_path_agrees():
    runs = {}
    for isa in ("avx512", "avx2", "baseline"):
        env = dict(os.environ, KDECAL_ISA=isa)
        res = subprocess.run(
            [sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True, text=True,
            check=True,
        )  # fmt: skip
        runs[isa] = json.loads(res.stdout.splitlines()[-1])
    base = runs["baseline"]
    assert base["isa"] == "baseline"
    for isa, r in runs.items():
        for k in range(4):
            b64, b32 = np.array(base["float64"][k]), np.array(base["float32"][k])
            assert _rel(np.array(r["float64"][k]), b64) < 1e-11, (isa, k)
            assert _rel(np.array(r["float32"][k]), b32) < 1e-4, (isa, k)
