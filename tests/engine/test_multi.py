"""The multi-label engine primitive: kdecal._core.loo_reduce_multi (and the numba twin).

Checks the class sums S, Q of B label sets (with and without centre weights) against a
float64 brute force that materialises the n x n log-kernel, against B ordinary
loo_reduce calls, numba against C++, independence of the thread count and of the row
range, every SIMD path, and the argument checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import gammaln

import kdecal
from kdecal._engine import backends as _backends
from kdecal._engine import runtime as _runtime

DROP = 64.0  # kdecal::kDrop: terms more than this below the row max are dropped
CLAMP = 230.0  # kdecal::kClamp: kernel_weights keeps the terms down to this

core = _runtime._core
needs_core = pytest.mark.skipif(core is None, reason="compiled core not available")


def _problem(n, K, C, B, h, *, seed=0, dtype=np.float64, weighted=False, alpha=0.7):
    """Clipped Dirichlet probabilities, B label sets, optional bootstrap weights."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    logq = np.ascontiguousarray(np.log(P), dtype=dtype)
    p = np.ascontiguousarray(P, dtype=dtype)
    bias = -gammaln(p.astype(np.float64) / h + 1).sum(axis=1)
    labels = rng.integers(0, C, size=(B, n)).astype(np.int64)
    weights = None
    if weighted:
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=B).astype(np.float64)
        weights[:, :3] = rng.random((B, 3)) * 2.5  # some non-integer weights too
    return logq, p, bias, labels, weights


def _log_kernel(logq, p, bias, scale):
    """L[j, i] = bias[i] + scale * <logq_j, p_i> in float64, -inf on the diagonal."""
    L = bias[None, :] + scale * (logq.astype(np.float64) @ p.astype(np.float64).T)
    np.fill_diagonal(L, -np.inf)
    return L


def _row_max(logq, p, bias, scale):
    return _log_kernel(logq, p, bias, scale).max(axis=1)


def _brute(logq, p, m, labels, C, scale, bias, weights):
    """Float64 brute force of (S, Q) with the n x n matrix.

    Terms below exp(-64) of the row maximum are dropped, with centre weights those
    below exp(-230).
    """
    L = _log_kernel(logq, p, bias, scale)
    X = L - m[:, None]
    W = np.where(X >= -(DROP if weights is None else CLAMP), np.exp(np.minimum(X, 0.0)), 0.0)
    B, n = labels.shape
    wts = np.ones((B, n)) if weights is None else weights
    S = np.empty((B, n, C))
    Q = np.empty((B, n, C))
    for b in range(B):
        Y = np.zeros((n, C))
        Y[np.arange(n), labels[b]] = wts[b]
        S[b] = W @ Y
        Q[b] = (W * W) @ Y
    return S, Q


def _close(got, want, rtol, what=""):
    """|got - want| <= rtol * (|want| + the largest entry of its row)."""
    assert got.shape == want.shape, what
    tol = rtol * (np.abs(want) + want.max(axis=-1, keepdims=True))
    err = np.abs(got - want)
    bad = err > tol
    assert not bad.any(), (
        f"{what}: {bad.sum()} entries off, worst {(err / np.maximum(tol, 1e-300)).max():.3g} x tol"
    )


@needs_core
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("weighted", [False, True], ids=["labels", "weights"])
@pytest.mark.parametrize(
    "n,K,C,B,h",
    [
        (50, 2, 2, 3, 0.3),
        (137, 3, 3, 5, 0.05),
        (300, 10, 10, 4, 0.5),
        (300, 10, 10, 4, 0.005),  # most terms dropped, most tiles skipped
        (280, 3, 7, 6, 0.1),
        (600, 2, 2, 3, 0.02),  # several panels of one tile
        (700, 3, 4, 3, 0.1),  # panels of two tiles, the last one partial
        (260, 10, 40, 3, 0.2),  # panels of 20 tiles, many empty classes
    ],
    ids=lambda v: str(v),
)
def test_matches_brute_force(dtype, weighted, n, K, C, B, h):
    logq, p, bias, labels, weights = _problem(n, K, C, B, h, dtype=dtype, weighted=weighted)
    scale = 1.0 / h
    m = _row_max(logq, p, bias, scale)
    rS, rQ = _brute(logq, p, m, labels, C, scale, bias, weights)
    # float32 dot products: ~1e-7 |G| / h relative in every term
    rtol = 1e-12 if dtype == np.float64 else 2e-6 * max(1.0, 0.1 / h) * K
    for powers in (1, 2):
        for a, b in [(0, n), (5, 37), (n - 9, n)]:
            S, Q = core.loo_reduce_multi(
                logq, p, m, labels, C, scale, bias, weights, powers, a, b, 0
            )
            assert S.shape == (B, b - a, C) and S.dtype == np.float64
            _close(S, rS[:, a:b], rtol, f"S rows {a}:{b}")
            if powers == 2:
                assert Q.shape == S.shape
                _close(Q, rQ[:, a:b], rtol, f"Q rows {a}:{b}")
            else:
                assert Q.shape == (0, 0, 0)


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_weighted_rows_keep_terms_far_below_the_row_maximum(backend, dtype):
    """Centre weights 0 on a row's near centres (a bootstrap replicate that drew none of
    them): its sums are terms 64-230 nats below the full sample's maximum, kept to
    rounding of the row's own total (the dense products keep them too); they were
    dropped, emptying the row (Dask and the GPU resample on this pass)."""
    if backend == "cpp" and core is None:
        pytest.skip("compiled core not available")
    if backend == "numba":
        pytest.importorskip("numba")
    n, K, C, B, h = 80, 3, 3, 4, 0.002
    logq, p, bias, labels, _ = _problem(n, K, C, B, h, seed=9, dtype=dtype)
    scale = 1.0 / h
    L = _log_kernel(logq, p, bias, scale)
    m = L.max(axis=1)
    weights = np.ones((B, n))
    deep = []
    for j in range(n):  # rows with terms between 64 and 200 nats below their maximum
        x = L[j] - m[j]
        near, far = x >= -DROP, (x < -DROP) & (x > -200.0)
        if far.any() and len(deep) < B:
            weights[len(deep), near] = 0.0
            deep.append(j)
    assert len(deep) == B
    S, Q = _backends.loo_reduce_multi(
        logq, p, m, labels, C, scale, bias, weights, powers=2, backend=backend
    )
    rS, rQ = _brute(logq, p, m, labels, C, scale, bias, weights)
    rtol = 1e-12 if dtype == np.float64 else 1e-3  # float32 K-dots: 1e-7 |G| / h per term
    for b, j in enumerate(deep):
        assert rS[b, j].sum() > 0.0 and rS[b, j].sum() < np.exp(-DROP)
        np.testing.assert_allclose(S[b, j], rS[b, j], rtol=rtol, atol=rtol * rS[b, j].sum())
        np.testing.assert_allclose(Q[b, j], rQ[b, j], rtol=rtol, atol=rtol * rQ[b, j].sum())


@needs_core
@pytest.mark.parametrize("h", [0.5, 0.05, 0.01])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_equals_separate_loo_reduce_calls(h, dtype):
    """B label sets in one call == B ordinary passes with those labels."""
    n, K, C, B = 290, 4, 4, 6
    logq, p, bias, labels, _ = _problem(n, K, C, B, h, seed=5, dtype=dtype)
    scale = np.array([1.0 / h])
    runs = [
        core.loo_reduce(logq, p, lab.copy(), C, scale, bias[None], 2, 0, n, 0) for lab in labels
    ]
    m = runs[0][0][0].copy()
    for r in runs[1:]:  # the row max does not depend on the labels
        np.testing.assert_array_equal(r[0][0], m)
    S, Q = core.loo_reduce_multi(logq, p, m, labels, C, 1.0 / h, bias, None, 2, 0, 0, 0)
    for b, (_, Sb, Qb, _) in enumerate(runs):
        # The ordinary pass keeps class sums below exp(-64) of the row max that this
        # one drops: absolute tolerance 1e-20 (the row's largest term is 1).
        np.testing.assert_allclose(S[b], Sb[0], rtol=1e-12, atol=1e-20, err_msg=f"S set {b}")
        np.testing.assert_allclose(Q[b], Qb[0], rtol=1e-12, atol=1e-20, err_msg=f"Q set {b}")
        np.testing.assert_allclose(
            S[b] / S[b].sum(1, keepdims=True),
            Sb[0] / Sb[0].sum(1, keepdims=True),
            rtol=1e-12,
            atol=1e-20,
        )


@needs_core
@pytest.mark.parametrize("weighted", [False, True], ids=["labels", "weights"])
@pytest.mark.parametrize("n,K,C,h", [(120, 3, 3, 0.1), (333, 10, 10, 0.02), (270, 2, 5, 0.5)])
def test_numba_equals_cpp(weighted, n, K, C, h):
    pytest.importorskip("numba")
    logq, p, bias, labels, weights = _problem(n, K, C, 5, h, seed=2, weighted=weighted)
    m = _row_max(logq, p, bias, 1.0 / h)
    for powers in (1, 2):
        for a, b in [(0, n), (17, 90)]:
            got = [
                _backends.loo_reduce_multi(
                    logq,
                    p,
                    m,
                    labels,
                    C,
                    1.0 / h,
                    bias,
                    weights,
                    powers=powers,
                    backend=be,
                    row_start=a,
                    row_stop=b,
                )
                for be in ("cpp", "numba")
            ]
            for k in range(2):
                assert got[0][k].shape == got[1][k].shape
                np.testing.assert_allclose(got[1][k], got[0][k], rtol=1e-12, atol=1e-25)


@needs_core
def test_numba_float32_close_to_cpp():
    pytest.importorskip("numba")
    n, K, C, h = 150, 3, 3, 0.2
    logq, p, bias, labels, weights = _problem(n, K, C, 4, h, dtype=np.float32, weighted=True)
    m = core.loo_reduce(logq, p, labels[0].copy(), C, np.array([1 / h]), bias[None], 1, 0, n, 0)
    m = m[0][0].copy()
    a = _backends.loo_reduce_multi(logq, p, m, labels, C, 1 / h, bias, weights, powers=2)
    b = _backends.loo_reduce_multi(
        logq, p, m, labels, C, 1 / h, bias, weights, powers=2, backend="numba"
    )
    for k in range(2):
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6 * a[k].max())


@needs_core
@pytest.mark.parametrize("weighted", [False, True], ids=["labels", "weights"])
def test_thread_count_and_row_range_independent(weighted):
    """Bitwise: every row is reduced by one thread, whatever the grouping of rows."""
    n, K, C, h = 403, 5, 5, 0.05
    logq, p, bias, labels, weights = _problem(n, K, C, 7, h, seed=3, weighted=weighted)
    m = _row_max(logq, p, bias, 1.0 / h)
    args = (logq, p, m, labels, C, 1.0 / h, bias, weights, 2)
    ref = core.loo_reduce_multi(*args, 0, n, 1)
    for nt in (2, 3, 0):
        got = core.loo_reduce_multi(*args, 0, n, nt)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])
    parts = [
        core.loo_reduce_multi(*args, a, b, 2) for a, b in [(0, 1), (1, 50), (50, 51), (51, n)]
    ]
    for k in range(2):
        np.testing.assert_array_equal(np.concatenate([x[k] for x in parts], axis=1), ref[k])


def test_numba_thread_count_independent():
    pytest.importorskip("numba")
    import numba

    n, K, C, h = 157, 3, 3, 0.1
    logq, p, bias, labels, weights = _problem(n, K, C, 4, h, seed=4, weighted=True)
    m = _row_max(logq, p, bias, 1.0 / h)
    runs = []
    for nt in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        old = _runtime._num_threads
        try:
            _runtime.set_num_threads(nt)
            runs.append(
                _backends.loo_reduce_multi(
                    logq, p, m, labels, C, 1.0 / h, bias, weights, powers=2, backend="numba"
                )
            )
        finally:
            _runtime.set_num_threads(old)
    for r in runs[1:]:
        np.testing.assert_array_equal(r[0], runs[0][0])
        np.testing.assert_array_equal(r[1], runs[0][1])


@pytest.mark.parametrize("backend", ["cpp", "numba"])
def test_edge_cases(backend):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    n, K, C, h = 40, 3, 3, 0.1
    logq, p, bias, labels, weights = _problem(n, K, C, 3, h, weighted=True)
    m = _row_max(logq, p, bias, 1.0 / h)
    f = _backends.loo_reduce_multi
    # no label set at all
    S, Q = f(logq, p, m, labels[:0], C, 1 / h, bias, weights[:0], powers=2, backend=backend)
    assert S.shape == Q.shape == (0, n, C)
    # an empty row range
    S, Q = f(
        logq, p, m, labels, C, 1 / h, bias, powers=2, backend=backend, row_start=7, row_stop=7
    )
    assert S.shape == Q.shape == (3, 0, C)
    # a row with m = -inf (no centres) gets zeros; the others are unchanged
    m2 = m.copy()
    m2[4] = -np.inf
    S0, _ = f(logq, p, m, labels, C, 1 / h, bias, weights, backend=backend)
    S, _ = f(logq, p, m2, labels, C, 1 / h, bias, weights, backend=backend)
    assert np.all(S[:, 4] == 0)
    np.testing.assert_array_equal(np.delete(S, 4, axis=1), np.delete(S0, 4, axis=1))
    # all weights zero -> zero sums; a single point -> no centres
    S, _ = f(logq, p, m, labels, C, 1 / h, bias, np.zeros((3, n)), backend=backend)
    assert np.all(S == 0)
    S, Q = f(
        logq[:1],
        p[:1],
        np.array([-np.inf]),
        np.ascontiguousarray(labels[:, :1]),
        C,
        1 / h,
        bias[:1],
        powers=2,
        backend=backend,
    )
    assert S.shape == (3, 1, C) and np.all(S == 0) and np.all(Q == 0)
    # the exact diagonal exclusion: duplicated points are each other's nearest centre
    lq2 = np.ascontiguousarray(np.concatenate([logq, logq]))
    p2 = np.ascontiguousarray(np.concatenate([p, p]))
    b2 = np.concatenate([bias, bias])
    lab2 = np.zeros((1, 2 * n), dtype=np.int64)
    m2 = _row_max(lq2, p2, b2, 1 / h)
    S, _ = f(lq2, p2, m2, lab2, 1, 1 / h, b2, backend=backend)
    rS, _ = _brute(lq2, p2, m2, lab2, 1, 1 / h, b2, None)
    np.testing.assert_allclose(S, rS, rtol=1e-12)


# ---------------------------------------------------------------------------- errors
def _args(n=30, K=3, C=3, B=2, h=0.1):
    logq, p, bias, labels, weights = _problem(n, K, C, B, h, weighted=True)
    m = _row_max(logq, p, bias, 1.0 / h)
    return {
        "logq": logq,
        "p": p,
        "m": m,
        "labels": labels,
        "n_classes": C,
        "scale": 1.0 / h,
        "bias": bias,
        "weights": weights,
    }


def _bad(name, value):
    def edit(a):
        a = dict(a)
        a[name] = value(a[name]) if callable(value) else value
        return a

    return edit


_VALUE_ERRORS = [
    ("labels-high", _bad("labels", lambda x: x + 1), r"labels\[0, \d+\] = 3 is outside"),
    ("labels-neg", _bad("labels", lambda x: np.where(x == 0, -1, x)), r"labels\[.*= -1"),
    ("weights-neg", _bad("weights", lambda x: np.where(x > 1, -x, x)), r"weights\[.*>= 0"),
    ("weights-nan", _bad("weights", lambda x: np.where(x > 1, np.nan, x)), r"weights\[.*nan"),
    ("weights-inf", _bad("weights", lambda x: np.where(x > 1, np.inf, x)), r"weights\[.*inf"),
    ("m-nan", _bad("m", lambda x: np.where(np.arange(x.size) == 3, np.nan, x)), r"m\[3\]"),
    ("m-inf", _bad("m", lambda x: np.where(np.arange(x.size) == 3, np.inf, x)), r"m\[3\]"),
    ("n_classes", _bad("n_classes", 0), "n_classes"),
    ("scale-zero", _bad("scale", 0.0), "scale"),
    ("scale-nan", _bad("scale", float("nan")), "scale"),
    ("logq-shape", _bad("logq", lambda x: np.ascontiguousarray(x[:-1])), "logq"),
    ("p-ndim", _bad("p", lambda x: np.ascontiguousarray(x.ravel())), r"\bp\b"),
    ("m-shape", _bad("m", lambda x: np.ascontiguousarray(x[:-1])), r"\bm\b"),
    ("labels-shape", _bad("labels", lambda x: np.ascontiguousarray(x[:, :-1])), "labels"),
    ("bias-shape", _bad("bias", lambda x: np.ascontiguousarray(x[:-1])), "bias"),
    ("weights-shape", _bad("weights", lambda x: np.ascontiguousarray(x[:1])), "weights"),
]


@needs_core
@pytest.mark.parametrize("case,edit,match", _VALUE_ERRORS, ids=[c[0] for c in _VALUE_ERRORS])
def test_core_value_errors(case, edit, match):
    a = edit(_args())
    with pytest.raises(ValueError, match=match):
        core.loo_reduce_multi(
            a["logq"],
            a["p"],
            a["m"],
            a["labels"],
            a["n_classes"],
            a["scale"],
            a["bias"],
            a["weights"],
            1,
            0,
            0,
            0,
        )


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("case,edit,match", _VALUE_ERRORS, ids=[c[0] for c in _VALUE_ERRORS])
def test_dispatch_value_errors(backend, case, edit, match):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    a = edit(_args())
    with pytest.raises(ValueError, match=match):
        _backends.loo_reduce_multi(**a, backend=backend)


@needs_core
@pytest.mark.parametrize(
    "powers,row_start,row_stop,match",
    [(3, 0, 0, "powers"), (0, 0, 0, "powers"), (1, 5, 4, "row_start"), (1, 0, 31, "row_stop")],
)
def test_core_scalar_errors(powers, row_start, row_stop, match):
    a = _args()
    with pytest.raises(ValueError, match=match):
        core.loo_reduce_multi(*a.values(), powers, row_start, row_stop, 0)


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize(
    "kw,match",
    [
        ({"powers": 3}, "powers"),
        ({"row_start": 5, "row_stop": 4}, "row_start"),
        ({"row_stop": 31}, "row_stop"),
        ({"row_start": -1}, "row_start"),
    ],
)
def test_dispatch_scalar_errors(backend, kw, match):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    with pytest.raises(ValueError, match=match):
        _backends.loo_reduce_multi(**_args(), backend=backend, **kw)


_TYPE_ERRORS = [
    ("labels-int32", _bad("labels", lambda x: x.astype(np.int32)), "labels"),
    ("m-float32", _bad("m", lambda x: x.astype(np.float32)), r"\bm\b"),
    ("bias-float32", _bad("bias", lambda x: x.astype(np.float32)), "bias"),
    ("weights-int", _bad("weights", lambda x: x.astype(np.int64)), "weights"),
    ("logq-mixed", _bad("logq", lambda x: x.astype(np.float32)), "logq"),
    ("p-list", _bad("p", lambda x: x.tolist()), r"\bp\b"),
    ("labels-strided", _bad("labels", lambda x: np.asfortranarray(x)), "labels"),
    ("n_classes-float", _bad("n_classes", 3.0), "n_classes"),
]


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("case,edit,match", _TYPE_ERRORS, ids=[c[0] for c in _TYPE_ERRORS])
def test_dispatch_type_errors(backend, case, edit, match):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    with pytest.raises(TypeError, match=match):
        _backends.loo_reduce_multi(**edit(_args()), backend=backend)


@needs_core
@pytest.mark.parametrize("case,edit,match", _TYPE_ERRORS[:7], ids=[c[0] for c in _TYPE_ERRORS[:7]])
def test_core_type_errors(case, edit, match):
    """noconvert: no hidden copies; pybind11's message lists the expected signature."""
    a = edit(_args())
    with pytest.raises(TypeError, match="loo_reduce_multi"):
        core.loo_reduce_multi(*a.values(), 1, 0, 0, 0)


# --------------------------------------------------------------------------- SIMD paths
_ISA_SCRIPT = r"""
import json, sys
import numpy as np
from scipy.special import gammaln
from kdecal._engine import runtime as _runtime
core = _runtime._core
rng = np.random.default_rng(7)
n, K, C, B = 517, 10, 10, 5
P = rng.dirichlet(np.full(K, 0.5), size=n); P = np.maximum(P, 1e-12); P /= P.sum(1, keepdims=True)
labels = rng.integers(0, C, (B, n)).astype(np.int64)
weights = rng.multinomial(n, np.full(n, 1 / n), size=B).astype(np.float64)
out = {"isa": core.simd_path()}
for h in (0.01, 0.3):
    bias = -gammaln(P / h + 1).sum(1)
    for dt in ("float64", "float32"):
        lq, pp = np.log(P).astype(dt), P.astype(dt)
        m = core.loo_reduce(lq, pp, labels[0].copy(), C, np.array([1 / h]), bias[None], 1, 0, n, 0)
        m = m[0][0].copy()
        for w in (None, weights):
            S, Q = core.loo_reduce_multi(lq, pp, m, labels, C, 1 / h, bias, w, 2, 0, 0, 0)
            key = f"{h}-{dt}-{w is None}"
            out[key] = [S.tolist(), Q.tolist()]
json.dump(out, sys.stdout)
"""


def _isa_run(isa):
    env = dict(os.environ, KDECAL_ISA=isa)
    res = subprocess.run(
        [sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(res.stdout.splitlines()[-1])


@needs_core
def test_every_simd_path_agrees():
    """The AVX-512, AVX2 and baseline kernels differ only in rounding (FMA contraction)."""
    runs = {isa: _isa_run(isa) for isa in ("avx512", "avx2", "baseline")}
    base = runs["baseline"]
    assert base["isa"] == "baseline"
    for isa, r in runs.items():
        for key, val in r.items():
            if key == "isa":
                continue
            # float32 K-dots: contraction changes them by ~1e-7 |G|, times 1/h in L
            rtol = 1e-9 if "float64" in key else (1e-3 if key.startswith("0.3") else 3e-2)
            for k in range(2):
                got, want = np.array(val[k]), np.array(base[key][k])
                np.testing.assert_allclose(
                    got, want, rtol=rtol, atol=rtol * want.max(), err_msg=f"{isa} {key} [{k}]"
                )


# ------------------------------------------------------------------- kernel_weights


@needs_core
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    ("n", "K", "h"), [(1, 3, 0.1), (2, 2, 0.5), (300, 3, 0.05), (700, 10, 0.01)]
)
def test_kernel_weights_match_brute_force(dtype, n, K, h):
    """The weights of the multi-label pass: exp(L_ij - m_j), 0 on the diagonal and
    below exp(-230) (the pass itself drops those below exp(-64)), the centres in the
    returned order (a permutation)."""
    logq, p, bias, labels, _ = _problem(n, K, 2, 1, h, dtype=dtype, alpha=0.3)
    scale = 1.0 / h
    L = _log_kernel(logq, p, bias, scale)
    m = L.max(axis=1) if n > 1 else np.array([-np.inf])
    W, order = core.kernel_weights(logq, p, m, scale, bias, 0, 0, 2, None)
    assert W.shape == (n, n) and order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    if n == 1:  # no centre: m = -inf, no term
        want = np.zeros((1, 1))
    else:
        X = L - m[:, None]
        want = np.where(X >= -CLAMP, np.exp(np.where(X >= -CLAMP, X, 0.0)), 0.0)
    got = W[:, np.argsort(order)]  # back to the original centre order
    # float32 K-dots: the log-kernel is off by ~1e-7 |scale * dot| in the exponent
    rtol = 1e-12 if dtype == np.float64 else 3e-3
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-300)
    assert np.all(np.diag(got) == 0.0)
    # the weights are the terms that loo_reduce_multi sums, and those it drops (each
    # below exp(-64) of the row maximum's term, 1 here) less than n exp(-64) in all
    S, _ = core.loo_reduce_multi(logq, p, m, labels, 2, scale, bias, None, 1, 0, 0, 2)
    lab = labels[0][order]
    for c in range(2):
        np.testing.assert_allclose(
            S[0, :, c], W[:, lab == c].sum(axis=1), rtol=1e-12, atol=n * np.exp(-DROP)
        )


@needs_core
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernel_weights_in_single_precision_are_the_weights_rounded(dtype):
    """single=True: the float64 weights rounded to float32, bit for bit, and 0 below
    float32's smallest normal number (subnormal operands slow products down), the same
    order, for any row range; the numba twin's the same way."""
    n, K, h = 500, 4, 0.004  # narrow: weights far below float32's smallest normal
    logq, p, bias, _, _ = _problem(n, K, 2, 1, h, dtype=dtype, alpha=0.3)
    scale = 1.0 / h
    m = _log_kernel(logq, p, bias, scale).max(axis=1)
    W, order = core.kernel_weights(logq, p, m, scale, bias, 0, 0, 2, None)
    W32, order32 = core.kernel_weights(logq, p, m, scale, bias, 0, 0, 2, None, True)
    assert W32.dtype == np.float32 and W32.shape == (n, n)
    np.testing.assert_array_equal(order32, order)
    tiny = np.finfo(np.float32).tiny
    want = np.where(W >= tiny, W, 0.0).astype(np.float32)
    np.testing.assert_array_equal(W32, want)
    assert np.any((W > 0) & (W < tiny))  # weights float32 holds only as subnormals
    assert np.all((W32 == 0) | (W32 >= tiny))
    part, _ = core.kernel_weights(logq, p, m, scale, bias, 100, 350, 1, None, True)
    np.testing.assert_array_equal(part, W32[100:350])
    empty, _ = _backends.kernel_weights(logq, p, m, scale, bias, 7, 7, single=True)
    assert empty.shape == (0, n) and empty.dtype == np.float32
    if importlib.util.find_spec("numba") is not None:
        Wn, _ = _backends.kernel_weights(logq, p, m, scale, bias, 0, n, "numba", single=True)
        W64n, _ = _backends.kernel_weights(logq, p, m, scale, bias, 0, n, "numba")
        np.testing.assert_array_equal(Wn, np.where(W64n >= tiny, W64n, 0.0).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    ("n", "K", "h"), [(1, 3, 0.1), (2, 2, 0.5), (300, 3, 0.05), (700, 10, 0.01)]
)
def test_numba_kernel_weights_match_brute_force(dtype, n, K, h):
    """The numba twin of kernel_weights (a BLAS product for the K-dots): the same
    weights as the brute force (0 on the diagonal and below exp(-230)), for any row
    range and thread count, bit for bit across thread counts."""
    pytest.importorskip("numba")
    logq, p, bias, _, _ = _problem(n, K, 2, 1, h, dtype=dtype, alpha=0.3)
    scale = 1.0 / h
    L = _log_kernel(logq, p, bias, scale)
    m = L.max(axis=1) if n > 1 else np.array([-np.inf])
    W, order = _backends.kernel_weights(logq, p, m, scale, bias, 0, n, backend="numba")
    assert W.shape == (n, n) and W.dtype == np.float64
    np.testing.assert_array_equal(order, np.arange(n))
    if n == 1:
        want = np.zeros((1, 1))
    else:
        X = L - m[:, None]
        want = np.where(X >= -CLAMP, np.exp(np.where(X >= -CLAMP, X, 0.0)), 0.0)
    rtol = 1e-12 if dtype == np.float64 else 3e-3
    np.testing.assert_allclose(W, want, rtol=rtol, atol=1e-300)
    assert np.all(np.diag(W) == 0.0)
    if core is not None:  # the core's weights, in the same centre order
        Wc, oc = core.kernel_weights(logq, p, m, scale, bias, 0, 0, 2, None)
        np.testing.assert_allclose(W, Wc[:, np.argsort(oc)], rtol=rtol, atol=1e-300)
    j0, j1 = n // 3, n - n // 4
    for nt in (1, 2):
        kdecal.set_num_threads(nt)
        try:
            part, _ = _backends.kernel_weights(logq, p, m, scale, bias, j0, j1, backend="numba")
        finally:
            kdecal.set_num_threads(None)
        np.testing.assert_array_equal(part, W[j0:j1])
    empty, _ = _backends.kernel_weights(logq, p, m, scale, bias, 5, 5, backend="numba")
    assert empty.shape == (0, n)


@needs_core
def test_kernel_weights_rows_and_threads():
    """A row range is those rows of the full matrix, for any thread count, bitwise."""
    logq, p, bias, _, _ = _problem(1200, 4, 2, 1, 0.05)
    m = _row_max(logq, p, bias, 20.0)
    full, order = core.kernel_weights(logq, p, m, 20.0, bias, 0, 0, 1, None)
    for nt in (1, 2, 3):
        part, o2 = core.kernel_weights(logq, p, m, 20.0, bias, 333, 1111, nt, None)
        np.testing.assert_array_equal(part, full[333:1111])
        np.testing.assert_array_equal(o2, order)
    empty, _ = _backends.kernel_weights(logq, p, m, 20.0, bias, 5, 5)
    assert empty.shape == (0, 1200)


@needs_core
def test_kernel_weights_errors():
    logq, p, bias, _, _ = _problem(30, 3, 2, 1, 0.1)
    m = _row_max(logq, p, bias, 10.0)
    with pytest.raises(ValueError, match="scale"):
        core.kernel_weights(logq, p, m, -1.0, bias, 0, 0, 1, None)
    with pytest.raises(ValueError, match=r"m\[4\] = nan"):
        bad = m.copy()
        bad[4] = np.nan
        core.kernel_weights(logq, p, bad, 10.0, bias, 0, 0, 1, None)
    with pytest.raises(ValueError, match="row_stop"):
        core.kernel_weights(logq, p, m, 10.0, bias, 0, 31, 1, None)
    with pytest.raises(ValueError, match="bias must have shape"):
        core.kernel_weights(logq, p, m, 10.0, bias[:5], 0, 0, 1, None)
    with pytest.raises(TypeError):
        core.kernel_weights(logq, p.astype(np.float32), m, 10.0, bias, 0, 0, 1, None)
