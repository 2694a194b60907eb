"""The CUDA engine (kdecal._engine.cuda, numba-cuda): every accumulator against the brute force.

Marked ``cuda``. On a machine with an NVIDIA GPU and numba-cuda these run on the device;
elsewhere they run under numba's CUDA simulator, in a pytest process of their own:

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda

(the variable must be set before numba is imported). Without either they skip, saying
why. The simulator runs every thread of a block as a Python thread, so the problems here
are small (n <= 40); on a device the same tests run, and a few run larger sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln

import kdecal
from kdecal._engine import backends as _backends
from kdecal._engine import engines as _engines
from kdecal._engine import runtime as _runtime

cu = _engines.load_cuda()
core = _runtime._core
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(cu is None, reason=f"no CUDA engine: {_engines._cuda_error}"),
]
SIM = cu is not None and cu.SIMULATOR
needs_core = pytest.mark.skipif(core is None, reason="compiled core not available")


def _points(n, K, *, seed=0, alpha=0.7, zeros=False, ties=False):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    if zeros:  # exact zeros, as one-hot-like predictions give them
        P[rng.random((n, K)) < 0.3] = 0.0
        P[:, 0] += 1e-3
        P /= P.sum(axis=1, keepdims=True)
    if ties:  # repeated predictions: several centres at the class maximum
        P[n // 2 :] = P[: n - n // 2]
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    return P, rng.integers(0, K, size=n)


def _inputs(P, hs, dtype=np.float64):
    logq = np.ascontiguousarray(np.log(P), dtype=dtype)
    p = np.ascontiguousarray(P, dtype=dtype)
    bias = np.stack([-gammaln(P / h + 1.0).sum(axis=1) for h in hs])
    return logq, p, bias


def _brute(logq, p, labels, C, scale, bias, r0, r1):
    """m (H, R), S, Q, T, D (H, R, C) from the materialised float64 log-kernel."""
    L = (
        bias[:, None, :]
        + scale[:, None, None] * (logq.astype(np.float64) @ p.astype(np.float64).T)[None]
    )
    H, n = bias.shape
    L[:, np.arange(n), np.arange(n)] = -np.inf  # leave one out
    L = L[:, r0:r1]
    m = L.max(axis=-1)
    out = {k: np.zeros((H, r1 - r0, C)) for k in "SQTD"}
    for c in range(C):
        W = np.exp(L[..., labels == c] - m[..., None])
        out["S"][..., c] = W.sum(-1)
        out["Q"][..., c] = (W**2).sum(-1)
        out["T"][..., c] = (W**3).sum(-1)
        # pairs of distinct centres, summed exactly (fsum over the off-diagonal products)
        for t in range(H):
            for r in range(r1 - r0):
                w = W[t, r]
                out["D"][t, r, c] = math.fsum((np.outer(w, w) - np.diag(w * w)).ravel())
    return m, out["S"], out["Q"], out["T"], out["D"]


def _close(a, b, rtol, name, floor=1e-300):
    """Relative to each value, with a floor (terms clamped at exp(-230) of their class
    maximum may differ from the brute force's exact tiny values by that much)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, name
    assert np.all(np.isfinite(a)), name
    scale = np.maximum(np.abs(b), floor)
    err = np.max(np.abs(a - b) / scale) if b.size else 0.0
    assert err <= rtol, f"{name}: {err:.3g} > {rtol:.3g}"


CASES = [  # n, K, C, hs, options
    (23, 2, 2, [0.05], {}),
    (31, 3, 3, [0.02, 0.3, 4.0], {}),
    (29, 10, 10, [0.1], {}),
    (20, 3, 3, [1e-3, 50.0], {"zeros": True}),
    (24, 3, 2, [0.2], {"ties": True}),
]


@pytest.mark.parametrize("n,K,C,hs,opts", CASES)
def test_forward_float64_equals_the_brute_force(n, K, C, hs, opts):
    P, y = _points(n, K, seed=n + K, **opts)
    y = y % C
    hs = np.array(hs)
    logq, p, bias = _inputs(P, hs)
    r0, r1 = (3, n - 2) if n > 25 else (0, n)
    out = cu.loo_reduce(logq, p, y, C, 1.0 / hs, bias, 3, r0, r1, pairs=True)
    ref = _brute(logq, p, y, C, 1.0 / hs, bias, r0, r1)
    S = ref[1]
    floors = (1e-300, 1e-300, 1e-80 * S**2, 1e-80 * S**3, 1e-80 * S**2)
    for name, a, b, fl in zip("mSQTD", out, ref, floors):
        tol = 1e-11 if hs.min() >= 0.01 else 1e-9  # |L| ~ 1/h: its rounding grows with it
        _close(a, b, tol, name, np.maximum(fl, 1e-300))


@needs_core
@pytest.mark.parametrize("n,K,C,hs,opts", CASES)
def test_forward_float64_equals_the_cpu_engine(n, K, C, hs, opts):
    P, y = _points(n, K, seed=7 * n + K, **opts)
    y = y % C
    hs = np.array(hs)
    logq, p, bias = _inputs(P, hs)
    out = cu.loo_reduce(logq, p, y, C, 1.0 / hs, bias, 3, 0, n, pairs=True)
    ref = core.loo_reduce(logq, p, y, C, 1.0 / hs, bias, 3, 0, n, 1, pairs=True)
    # the compiled core drops chunks of terms below exp(-64) of their class maximum
    S = ref[1]
    floors = (1e-300, 1e-300, 1e-20 * S**2, 1e-20 * S**3, 1e-20 * S**2)
    for name, a, b, fl in zip("mSQTD", out, ref, floors):
        _close(a, b, 1e-10, name, np.maximum(fl, 1e-300))


@pytest.mark.parametrize("qb,rows", [(2, False), (3, True), (1, True)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernel_variants_equal_the_brute_force(monkeypatch, qb, rows, dtype):
    # several query rows per thread (a partial last group), the row layout of the tile
    monkeypatch.setattr(cu, "QUERIES_PER_THREAD", qb)
    monkeypatch.setattr(cu, "CENTRE_ROWS", rows)
    P, y = _points(27, 3, seed=qb, ties=True)
    hs = np.array([0.05, 0.8])
    logq, p, bias = _inputs(P, hs, dtype)
    out = cu.loo_reduce(logq, p, y, 3, 1.0 / hs, bias, 3, 1, 27, pairs=True)
    ref = _brute(logq, p, y, 3, 1.0 / hs, bias, 1, 27)
    tol = 1e-11 if dtype == np.float64 else 2e-5
    S = ref[1]
    for name, a, b, fl in zip(
        "mSQTD", out, ref, (1e-300, 1e-300, 1e-6 * S**2, 1e-6 * S**3, 1e-6 * S**2)
    ):
        _close(a, b, tol, f"{name} qb={qb} rows={rows}", np.maximum(fl, 1e-300))


@pytest.mark.parametrize("splits", [1, 3])
def test_launches_with_a_short_last_one_and_centre_splits(monkeypatch, splits):
    # several launches (the last one short), and the centres of each row split over
    # blocks whose partial maxima and sums are merged
    monkeypatch.setattr(cu, "LAUNCH_PAIRS", 11.0 * 30 * 2)  # 11 rows per launch -> 8
    monkeypatch.setattr(cu, "CENTRE_SPLITS", splits)
    P, y = _points(30, 3, seed=5, ties=True)
    hs = np.array([0.07, 0.6])
    logq, p, bias = _inputs(P, hs)
    out = cu.loo_reduce(logq, p, y, 3, 1.0 / hs, bias, 3, 2, 29, pairs=True)
    ref = _brute(logq, p, y, 3, 1.0 / hs, bias, 2, 29)
    S = ref[1]
    floors = (1e-300, 1e-300, 1e-80 * S**2, 1e-80 * S**3, 1e-80 * S**2)
    for name, a, b, fl in zip("mSQTD", out, ref, floors):
        _close(a, b, 1e-11, f"{name} splits={splits}", np.maximum(fl, 1e-300))


LEAN_SHAPES = [
    (1, 4, 1),
    (1, 8, 3),
    (2, 4, 3),
    (3, 2, 1),
    (2, 8, 2),
]  # rows per thread, group, splits


@pytest.mark.parametrize("n,K,C,hs,opts", CASES)
@pytest.mark.parametrize("qb,ng,splits", LEAN_SHAPES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lean_kernel_equals_the_brute_force(monkeypatch, n, K, C, hs, opts, qb, ng, splits, dtype):
    # powers = 1 without pairs or residuals takes the lean kernel: every class padded to
    # whole tiles, groups of ng centres, qb query rows per thread (a partial last group of
    # rows), centre splits merged
    monkeypatch.setattr(cu, "LEAN_SHAPE", {True: (qb, ng), False: (qb, ng)})
    monkeypatch.setattr(cu, "LEAN_MAX_K", 40)
    monkeypatch.setattr(cu, "CENTRE_SPLITS", splits)
    P, y = _points(n, K, seed=n + K, **opts)
    y = y % C
    hs = np.array(hs)
    logq, p, bias = _inputs(P, hs, dtype)
    r0, r1 = (3, n - 2) if n > 25 else (0, n)
    out = cu.loo_reduce(logq, p, y, C, 1.0 / hs, bias, 1, r0, r1)
    assert out[2].shape == (0, 0, 0) and out[3].shape == (0, 0, 0)
    ref = _brute(logq, p, y, C, 1.0 / hs, bias, r0, r1)
    if dtype == np.float64:
        tol = 1e-11 if hs.min() >= 0.01 else 1e-9
        _close(out[0], ref[0], tol, "m")
        _close(out[1], ref[1], tol, "S")
        return
    # fast mode: the row maximum to float32 rounding of the log-kernel (relative to
    # max(|m|, 1): m is near 0 at large bandwidths); S relative to the row total (a class
    # far below the row maximum has a large relative error, no weight)
    _close(out[0], ref[0], 1e-6, "m", floor=1.0)
    tot = ref[1].sum(-1, keepdims=True)
    assert np.max(np.abs(out[1] - ref[1]) / tot) < 1e-5
    assert np.max(np.abs(out[1] / out[1].sum(-1, keepdims=True) - ref[1] / tot)) < 1e-5


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lean_and_general_kernels_agree(monkeypatch, dtype):
    # the same sums from both kernels: powers = 1 through the lean one, and through the
    # general one (LEAN off); several launches, the last one short
    monkeypatch.setattr(cu, "LAUNCH_PAIRS", 11.0 * 37 * 2)
    P, y = _points(37, 4, seed=21, ties=True)
    hs = np.array([0.03, 0.5])
    logq, p, bias = _inputs(P, hs, dtype)
    lean = cu.loo_reduce(logq, p, y, 4, 1.0 / hs, bias, 1, 1, 36)
    monkeypatch.setattr(cu, "LEAN", False)
    monkeypatch.setattr(cu, "LEAN_SUMS", False)
    gen = cu.loo_reduce(logq, p, y, 4, 1.0 / hs, bias, 1, 1, 36)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    _close(lean[0], gen[0], tol, "m")
    tot = gen[1].sum(-1, keepdims=True)
    assert np.max(np.abs(lean[1] - gen[1]) / tot) < tol


@pytest.mark.parametrize("n,K,C,hs,opts", CASES)
@pytest.mark.parametrize("pairs", [False, True], ids=["powers2", "pairs"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lean_sums_kernel_equals_the_brute_force(n, K, C, hs, opts, pairs, dtype):
    # powers = 2, with or without pair sums, takes the lean kernel with squared and pair
    # sums (K <= LEAN_SUMS_MAX_K): Q and D summed online from non-negative products
    P, y = _points(n, K, seed=3 * n + K, **opts)
    y = y % C
    hs = np.array(hs)
    logq, p, bias = _inputs(P, hs, dtype)
    r0, r1 = (3, n - 2) if n > 25 else (0, n)
    out = cu.loo_reduce(logq, p, y, C, 1.0 / hs, bias, 2, r0, r1, pairs=pairs)
    assert len(out) == (5 if pairs else 4) and out[3].shape == (0, 0, 0)
    ref = _brute(logq, p, y, C, 1.0 / hs, bias, r0, r1)
    which = [(0, "m"), (1, "S"), (2, "Q")] + ([(4, "D")] if pairs else [])
    if dtype == np.float64:
        tol = 1e-11 if hs.min() >= 0.01 else 1e-9
        S = ref[1]
        floors = {0: 1e-300, 1: 1e-300, 2: 1e-80 * S**2, 4: 1e-80 * S**2}
        for i, name in which:
            _close(out[i], ref[i], tol, name, np.maximum(floors[i], 1e-300))
        return
    # fast mode: m to the float32 rounding of the log-kernel; S relative to the row total,
    # Q and D relative to its square
    _close(out[0], ref[0], 1e-6, "m", floor=1.0)
    tot = ref[1].sum(-1, keepdims=True)
    for i, name in which[1:]:
        scale = tot if i == 1 else tot**2
        assert np.max(np.abs(out[i] - ref[i]) / scale) < 1e-5, name


def test_lean_sums_pair_sums_without_cancellation():
    # one centre far nearer the query than the others of its class: D = S^2 - Q is about
    # 2 (S - 1), which a difference of S^2 and Q would lose; the online sums keep it
    t = np.array([0.5, 0.5 + 1e-4, 0.9, 0.1, 0.95, 0.05, 0.7, 0.3])
    P = np.stack([t, 1 - t], axis=1)
    y = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    hs = np.array([2e-3])
    logq, p, bias = _inputs(P, hs)
    out = cu.loo_reduce(logq, p, y, 2, 1.0 / hs, bias, 2, pairs=True)
    ref = _brute(logq, p, y, 2, 1.0 / hs, bias, 0, 8)
    assert 0.0 < ref[4][0, 0, 0] < 1e-20  # far below the cancellation of S^2 - Q
    _close(out[4], ref[4], 1e-9, "D", floor=1e-300)


def test_lean_kernel_with_sorted_centres_and_far_outliers():
    # centres in increasing order of their log-kernel (every group sets a new maximum)
    # and an isolated query whose every term is far below its own point's: the running
    # maximum follows, nothing underflows to a zero row
    t = np.linspace(0.05, 0.95, 24)
    P = np.stack([t, 1 - t], axis=1)
    P[-1] = [1 - 1e-9, 1e-9]  # far from every other point at h = 0.01
    y = np.arange(24) % 2
    hs = np.array([0.01, 0.2])
    for dtype in (np.float64, np.float32):
        logq, p, bias = _inputs(P, hs, dtype)
        out = cu.loo_reduce(logq, p, y, 2, 1.0 / hs, bias, 1)
        ref = _brute(logq, p, y, 2, 1.0 / hs, bias, 0, 24)
        tol = 1e-11 if dtype == np.float64 else 1e-5
        assert np.all(out[1].sum(-1) >= 1.0 - tol)  # the maximum's own term
        tot = ref[1].sum(-1, keepdims=True)
        assert np.max(np.abs(out[1] - ref[1]) / tot) < tol
        _close(out[0], ref[0], tol if dtype == np.float64 else 1e-6, "m", floor=1.0)


def test_batched_problems_and_powers():
    P, y = _points(21, 2, seed=3)
    # two problems of one batch (as class-wise calibration makes them)
    Pb = np.stack([P, P[::-1].copy()])
    yb = np.stack([y, 1 - y])
    hs = np.array([0.1, 0.7])
    logq = np.log(Pb)
    bias = np.stack([np.stack([-gammaln(x / h + 1).sum(-1) for h in hs]) for x in Pb])
    for powers in (1, 2, 3):
        out = cu.loo_reduce(logq, Pb, yb, 2, 1 / hs, bias, powers, 0, 21)
        assert len(out) == 4
        for b in range(2):
            ref = _brute(logq[b], Pb[b], yb[b], 2, 1 / hs, bias[b], 0, 21)
            for name, a, r, q in zip("mSQT", out, ref, (0, 1, 2, 3)):
                if q >= 2 and powers < q:
                    assert a.shape == (0, 0, 0)
                    continue
                _close(a[b], r, 1e-11, f"{name}[{b}] powers={powers}")


def test_one_centre_per_class_and_n_equal_one():
    # a class whose only centre is the query gets zero sums; n = 1 gives m = -inf
    P = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]])
    y = np.array([0, 1, 2, 2])
    logq, p, bias = _inputs(P, [0.3])
    _m, S, _Q, _T, D = cu.loo_reduce(logq, p, y, 3, np.array([1 / 0.3]), bias, 3, pairs=True)
    assert S[0, 0, 0] == 0.0 and S[0, 1, 1] == 0.0 and D[0, 2, 2] == 0.0
    ref = _brute(logq, p, y, 3, np.array([1 / 0.3]), bias, 0, 4)
    _close(S, ref[1], 1e-12, "S")
    m1, S1, _, _ = cu.loo_reduce(logq[:1], p[:1], y[:1], 3, np.array([2.0]), bias[:, :1], 1)
    assert m1[0, 0] == -np.inf and np.all(S1 == 0.0)


@pytest.mark.parametrize("K", [3, 10])
def test_fast_mode_within_its_bound(K):
    # float32 K-dot and exp, float64 sums: within 1e-5 of the float64 brute force at h >= 1e-3
    P, y = _points(30, K, seed=K)
    hs = np.array([1e-3, 0.05, 1.0])
    logq, p, bias = _inputs(P, hs, np.float32)
    _l64, _p64, _ = _inputs(P.astype(np.float32).astype(np.float64), hs)
    out = cu.loo_reduce(logq, p, y, K, 1.0 / hs, bias, 2, 0, 30)
    ref = _brute(logq, p, y, K, 1.0 / hs, bias, 0, 30)
    _close(out[0], ref[0], 1e-6, "m")
    # S relative to the row total (a class far below the row maximum has a large
    # relative error but no weight)
    tot = ref[1].sum(-1, keepdims=True)
    assert np.max(np.abs(out[1] - ref[1]) / tot) < 1e-5
    E, Er = out[1] / out[1].sum(-1, keepdims=True), ref[1] / tot
    assert np.max(np.abs(E - Er)) < 1e-5


def test_float32_inputs_run_in_float64_below_fast_min_h():
    # below FAST_MIN_H the fast mode's float32 K-dot would miss 1e-5 of E: float32 inputs
    # are converted on the device and give the float64 mode's sums (of the rounded inputs)
    P, y = _points(26, 3, seed=4)
    P32 = P.astype(np.float32)
    for hs, fast in (([1e-3], False), ([0.05], True), ([0.05, 2e-3], False)):
        hs = np.array(hs)
        l32, p32, bias = _inputs(P32.astype(np.float64), hs, np.float32)
        l64, p64 = l32.astype(np.float64), p32.astype(np.float64)
        for powers in (1, 3):  # the lean and the general kernel
            a = cu.loo_reduce(l32, p32, y, 3, 1.0 / hs, bias, powers, pairs=powers > 1)
            b = cu.loo_reduce(l64, p64, y, 3, 1.0 / hs, bias, powers, pairs=powers > 1)
            err = np.max(np.abs(a[1] - b[1]) / b[1].sum(-1, keepdims=True))
            if fast:
                assert 0 < err < 1e-5, (hs, powers, err)  # the float32 arithmetic
            else:
                assert err < 1e-13, (hs, powers, err)
        rest = (
            y,
            3,
            float(1 / hs[0]),
            bias[0],
            b[0][0] + np.log(b[1][0].sum(-1)),
            np.ones((26, 3)),
        )
        g = cu.loo_grad(l32, p32, *rest)
        g64 = cu.loo_grad(l64, p64, *rest)
        tol = 1e-4 if hs[0] >= cu.FAST_MIN_H else 1e-12
        np.testing.assert_allclose(g[0], g64[0], rtol=tol, atol=tol * np.abs(g64[0]).max())


def _multi_ref(logq, p, m, labels, C, scale, bias, weights, floor=-64.0):
    L = bias[None, :] + scale * (logq.astype(np.float64) @ p.astype(np.float64).T)
    n = L.shape[0]
    L[np.arange(n), np.arange(n)] = -np.inf
    X = L - m[:, None]
    W = np.where(X >= floor, np.exp(np.minimum(X, 0.0)), 0.0)
    B = labels.shape[0]
    S = np.zeros((B, n, C))
    Q = np.zeros((B, n, C))
    for b in range(B):
        for c in range(C):
            sel = (labels[b] == c) * weights[b]
            S[b, :, c] = W @ sel
            Q[b, :, c] = (W**2) @ sel
    return S, Q


@pytest.mark.parametrize("weighted", [False, True])
def test_multi_label_pass_equals_the_brute_force(weighted):
    n, K, B = 19, 3, 11  # B > one block of label sets under the simulator
    P, y = _points(n, K, seed=11)
    rng = np.random.default_rng(2)
    h = 0.1
    logq, p, bias = _inputs(P, [h])
    m = _brute(logq, p, y, K, np.array([1 / h]), bias, 0, n)[0][0]
    labels = rng.integers(0, K, (B, n)).astype(np.int64)
    w = rng.poisson(1.0, (B, n)).astype(np.float64) if weighted else None
    S, Q = cu.loo_reduce_multi(logq, p, m, labels, K, 1 / h, bias[0], w, 2, 2, n)
    Sr, Qr = _multi_ref(
        logq,
        p,
        m,
        labels,
        K,
        1 / h,
        bias[0],
        np.ones((B, n)) if w is None else w,
        -64.0 if w is None else -230.0,  # with centre weights, terms down to exp(-230)
    )
    np.testing.assert_allclose(S, Sr[:, 2:], rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(Q, Qr[:, 2:], rtol=1e-12, atol=1e-300)
    S1, Q1 = cu.loo_reduce_multi(logq, p, m, labels, K, 1 / h, bias[0], w, 1, 0, n)
    assert Q1.shape == (0, 0, 0)
    np.testing.assert_allclose(S1, Sr, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_multi_label_pass_keeps_far_terms_of_weighted_rows(dtype):
    """Centre weights 0 on a row's near centres (a bootstrap replicate that drew none of
    them): the row's sums are terms 64-230 nats below its maximum, kept (the compiled
    core and the dense products keep them too; float32 mode takes the float64 exp below
    -80, where the float32 one underflows)."""
    n, K, B, h = 40, 3, 4, 0.02
    P, _ = _points(n, K, seed=4, alpha=0.3)
    logq, p, bias = _inputs(P, [h], dtype)
    L = bias[0][None, :] + (logq.astype(np.float64) @ p.astype(np.float64).T) / h
    L[np.arange(n), np.arange(n)] = -np.inf
    m = L.max(axis=1)
    w = np.ones((B, n))
    deep = []
    for j in range(n):
        x = L[j] - m[j]
        if ((x < -90.0) & (x > -200.0)).any() and len(deep) < B:
            w[len(deep), x >= -90.0] = 0.0
            deep.append(j)
    assert len(deep) == B
    labels = np.random.default_rng(5).integers(0, K, (B, n)).astype(np.int64)
    S, Q = cu.loo_reduce_multi(logq, p, m, labels, K, 1 / h, bias[0], w, 2, 0, n)
    Sr, Qr = _multi_ref(logq, p, m, labels, K, 1 / h, bias[0], w, -230.0)
    rtol = 1e-12 if dtype == np.float64 else 1e-3  # float32 K-dots: 1e-7 |G| / h per term
    for b, j in enumerate(deep):
        assert 0.0 < Sr[b, j].sum() < np.exp(-90.0)
        np.testing.assert_allclose(S[b, j], Sr[b, j], rtol=rtol, atol=rtol * Sr[b, j].sum())
        np.testing.assert_allclose(Q[b, j], Qr[b, j], rtol=rtol, atol=rtol * Qr[b, j].sum())


def _grad_ref(logq, p, labels, C, scale, bias, lse, coef):
    L = bias[None, :] + scale * (logq @ p.T)  # [j, i]
    n = L.shape[0]
    W = np.exp(L - lse[:, None])
    W[np.arange(n), np.arange(n)] = 0.0
    A = W * coef[:, labels]  # A[j, i] = w_ij coef[j, y_i]
    return scale * A @ p, scale * A.T @ logq, A.sum(axis=0), A.sum(axis=1)


@pytest.mark.parametrize("K", [2, 4])
def test_backward_pass_equals_the_brute_force(K):
    n, h = 26, 0.15
    P, y = _points(n, K, seed=K + 40)
    rng = np.random.default_rng(K)
    logq, p, bias = _inputs(P, [h])
    m = _brute(logq, p, y, K, np.array([1 / h]), bias, 0, n)
    lse = m[0][0] + np.log(m[1][0].sum(-1))
    coef = rng.normal(size=(n, K))
    out = cu.loo_grad(logq, p, y, K, 1 / h, bias[0], lse, coef)
    ref = _grad_ref(logq, p, y, K, 1 / h, bias[0], lse, coef)
    for name, a, b in zip(("grad_logq", "grad_p", "grad_bias", "row_sum"), out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * np.abs(b).max(), err_msg=name)


def test_kernel_bias():
    P, _ = _points(17, 5, seed=1, zeros=True)
    scale = np.array([1e-2, 1.0, 1e3, 1e7])
    got = cu.kernel_bias(P, scale)
    ref = np.stack([-gammaln(P * s + 1.0).sum(-1) for s in scale])
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("calibration", ["canonical", "top_label", "classwise"])
def test_public_api_on_the_cuda_backend(calibration):
    rng = np.random.default_rng(4)
    P = rng.dirichlet(np.ones(3), size=22)
    y = rng.integers(0, 3, 22)
    a = kdecal.estimate(P, y, bandwidth=0.2, calibration=calibration, backend="cpp")
    b = kdecal.estimate(P, y, bandwidth=0.2, calibration=calibration, backend="cuda")
    np.testing.assert_allclose(b.conditional_expectation, a.conditional_expectation, rtol=1e-12)
    assert b.ece_kde(1) == pytest.approx(a.ece_kde(1), rel=1e-12)
    assert b.calibration_error("l2") == pytest.approx(a.calibration_error("l2"), rel=1e-9)
    assert b.calibration_error("kl") == pytest.approx(a.calibration_error("kl"), rel=1e-12)


def test_bootstrap_and_test_on_the_cuda_backend():
    rng = np.random.default_rng(6)
    P = rng.dirichlet(np.ones(3), size=20)
    y = rng.integers(0, 3, 20)
    est = {be: kdecal.estimate(P, y, bandwidth=0.3, backend=be) for be in ("cpp", "cuda")}
    ci = {be: e.confidence_interval("ce_l2", n_resamples=9, seed=1) for be, e in est.items()}
    assert ci["cuda"].low == pytest.approx(ci["cpp"].low, rel=1e-9, abs=1e-14)
    assert ci["cuda"].high == pytest.approx(ci["cpp"].high, rel=1e-9, abs=1e-14)


def test_backend_names():
    assert "cuda" in kdecal.available_backends()
    assert _backends.resolve_backend("cuda") == "cuda"
    dev = cu.kernel_bias(np.full((3, 2), 0.5), np.array([1.0]), device_out=True)
    assert _runtime.is_device_array(dev)
    assert not _runtime.is_device_array(np.zeros(3))
    # "auto" follows the data: CUDA arrays to the GPU engine, host arrays to the CPU
    assert _backends.resolve_backend("auto", np.zeros(3), dev) == "cuda"
    assert _backends.resolve_backend("auto", np.zeros(3)) in ("cpp", "numba")


torch = pytest.importorskip("torch") if cu is not None else None


@pytest.mark.parametrize("calibration", ["canonical", "classwise"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_gradient_through_the_cuda_engine(calibration, dtype):
    """The CUDA forward and backward passes give the CPU engine's loss and gradient.

    On a device the tensor lives on the GPU; under the simulator the CUDA code path of
    the autograd Function runs on a CPU tensor.
    """
    from kdecal import torch as kt

    if core is None:
        pytest.skip("compiled core not available (the CPU reference)")
    dt = getattr(torch, dtype)
    rng = np.random.default_rng(8)
    P0 = rng.dirichlet(np.ones(3), size=18)
    y = rng.integers(0, 3, 18)
    grads, losses = [], []
    for be in ("cpp", "cuda"):
        device = "cuda" if (be == "cuda" and not SIM) else "cpu"
        Pt = torch.tensor(P0, dtype=dt, device=device, requires_grad=True)
        if be == "cuda" and SIM:  # the CUDA code path on a CPU tensor
            points, lab, _, _, h, _ = kt._prepare(Pt, y, 0.2, calibration)
            E = kt._LooExpectation.apply(points, lab, h, "cuda")
        else:
            points, lab, _, _, h, got_be = kt._prepare(Pt, y, 0.2, calibration)
            assert got_be == be
            E = kt._LooExpectation.apply(points, lab, h, be)
        w = torch.arange(E.numel(), dtype=dt, device=E.device).reshape(E.shape) / E.numel()
        loss = torch.sum(w * E**2)
        loss.backward()
        losses.append(loss.item())
        grads.append(Pt.grad.detach().cpu().numpy().astype(np.float64))
    tol = 1e-10 if dtype == "float64" else 1e-4
    assert losses[1] == pytest.approx(losses[0], rel=tol)
    np.testing.assert_allclose(grads[1], grads[0], rtol=tol, atol=tol * np.abs(grads[0]).max())


@pytest.mark.skipif(SIM, reason="larger sizes run on a device only")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_larger_problems_on_the_device(dtype):
    """Against the compiled core in float64 on the same (for float32: rounded) inputs.

    float64: 1e-10. float32 (the fast mode): its K-dot errs by about
    u32 * scale * sum_k |log q_jk| |p_ik - p_jk| per log-weight, 1e-5 of E at h >= 0.01; at
    h = 1e-3 it grows with K (measured 1.8e-5 at K = 10, 2.0e-4 at K = 100).
    """
    if core is None:
        pytest.skip("compiled core not available (the CPU reference)")
    for n, K in ((3000, 10), (1000, 100)):
        P, y = _points(n, K, seed=n)
        hs = np.array([1e-3, 0.03, 1.0])
        logq, p, bias = _inputs(P, hs, dtype)
        l64, p64 = logq.astype(np.float64), p.astype(np.float64)
        ref = core.loo_reduce(l64, p64, y, K, 1.0 / hs, bias, 3, 0, n, 0, pairs=True)
        Er = ref[1] / ref[1].sum(-1, keepdims=True)
        # the general kernel, the lean one with squared and pair sums (powers 2, K <= 20),
        # and the lean one (powers 1)
        for powers in (3, 2, 1):
            out = cu.loo_reduce(logq, p, y, K, 1.0 / hs, bias, powers, 0, n, pairs=powers > 1)
            E = out[1] / out[1].sum(-1, keepdims=True)
            # fast mode at h = 1e-3: measured 1.8e-5 (K = 10) and 2.0e-4 (K = 100)
            tols = [1e-10] * 3 if dtype == np.float64 else [5e-5 if K == 10 else 3e-4, 1e-5, 1e-5]
            for t, tol in enumerate(tols):
                assert np.max(np.abs(E[t] - Er[t])) < tol, (n, K, hs[t], powers)
                np.testing.assert_allclose(out[0][t], ref[0][t], rtol=max(tol, 1e-6) / 10)


@pytest.mark.skipif(SIM, reason="CUDA tensors need a device")
def test_cuda_tensors_go_to_the_gpu_engine(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    rng = np.random.default_rng(9)
    P = rng.dirichlet(np.ones(4), size=300)
    y = rng.integers(0, 4, 300)
    calls = []
    real = cu.loo_reduce
    monkeypatch.setattr(cu, "loo_reduce", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = kdecal.ece_kde(torch.tensor(P, device="cuda"), y, bandwidth=0.1)
    assert calls, "backend='auto' did not pick the GPU engine for a CUDA tensor"
    assert got == pytest.approx(kdecal.ece_kde(P, y, bandwidth=0.1, backend="cpp"), rel=1e-10)
