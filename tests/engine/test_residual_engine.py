"""The residual sums of the compiled engine (issue 25, item 1).

``kdecal._core.loo_reduce(..., resid=u)`` appends, per bandwidth t and query row j, over
ALL centres i != j (every label class), relative to the row max m[t, j]:

    A[t, j, k] = sum_i exp(L_ij - m) p[i, k]        U[t, j] = sum_i exp(2 (L_ij - m)) u[i]

and ``loo_reduce_multi(..., resid=u)`` appends U[b, j] = sum_i weights[b, i] w_ij^2 u[b, i].
Checked against a float64 brute force that materialises the n x n log-kernel
(tests/_reference.py), for tiny to huge bandwidths, ties, exact zeros, one to several
tiles, row ranges, batches, float32, thread counts, task sizes and every SIMD path; and
m, S, Q, T, D must be bit for bit the same with and without resid.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import gammaln

import _reference as ref
from kdecal._engine import runtime as _runtime

core = _runtime._core
pytestmark = pytest.mark.skipif(core is None, reason="compiled core not available")

HS = (1e-3, 0.1, 10.0)  # tiny to huge bandwidths, one pass
DROP = 64.0  # kdecal::kDrop


def _problem(n, K, C, hs=HS, *, seed=0, kind="plain", dtype=np.float64, B=None):
    """Engine inputs (logq, p, labels, scale, bias, u) the way kdecal.Problem builds them.

    kind: "plain"; "ties" (half the rows one point, a few more duplicated pairs);
    "zeros" (exact zeros in the probabilities, clipped at 1e-12 and renormalised as the
    Problem does); "raw0" (the same zeros handed to the engine as p, with logq from the
    clipped rows: the terms of A with p[i, k] = 0 are exact zeros).
    With B, a batch of B such problems (B, n, K) with labels and u of shape (B, n).
    """
    if B is not None:
        parts = [_problem(n, K, C, hs, seed=seed + b, kind=kind, dtype=dtype) for b in range(B)]
        return tuple(
            parts[0][i] if i == 3 else np.ascontiguousarray(np.stack([q[i] for q in parts]))
            for i in range(6)
        )
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, 0.5), size=n)
    if kind in ("zeros", "raw0"):
        P[rng.random((n, K)) < 0.4] = 0.0
        P[np.arange(n), rng.integers(0, K, n)] += 0.05  # no empty row
        P /= P.sum(axis=1, keepdims=True)
    if kind == "ties" and n >= 4:
        P[: n // 2] = P[0]
        P[-2] = P[-1]
    Pc = ref.ref_clip(P)  # the Problem's clip (max(P, 1e-12), rows renormalised)
    p = P if kind == "raw0" else Pc
    hs = np.asarray(hs, dtype=np.float64)
    bias = np.stack([-gammaln(p / h + 1.0).sum(axis=1) for h in hs])
    labels = rng.integers(0, C, size=n).astype(np.int64)
    u = rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))  # mixed signs and sizes
    logq = np.ascontiguousarray(np.log(Pc), dtype=dtype)
    return logq, np.ascontiguousarray(p, dtype=dtype), labels, 1.0 / hs, bias, u


def _brute(logq, p, scale, bias, u):
    """Float64 (m, A, U, Uabs) from the n x n log-kernel, per bandwidth.

    Uabs = sum_i w_ij^2 |u_i| is the scale of U's rounding (u has both signs).  Where p is
    the clipped P (logq = log p), the log-kernel is tests/_reference.py's; otherwise the
    same formula on the given p.
    """
    lq = logq.astype(np.float64)
    pp = p.astype(np.float64)
    canonical = (pp > 0).all() and np.array_equal(np.log(pp), lq)
    out = []
    for t, s in enumerate(scale):
        if canonical:  # (its bias: the engine's input up to rounding)
            L = ref.ref_log_kernel(pp, 1.0 / s, include_constant=False).T  # [query, centre]
        else:
            L = bias[t][None, :] + s * (lq @ pp.T)
            np.fill_diagonal(L, -np.inf)
        m = L.max(axis=1)
        W = np.exp(L - m[:, None])
        out.append((m, W @ pp, (W * W) @ u, (W * W) @ np.abs(u)))
    return out


def _rtol(scale, power, dtype=np.float64):
    """The log-kernel's own rounding (~ eps |G| / h, |G| <= 28) times the power of w."""
    if dtype == np.float32:
        return 4e-6 * scale * power + 1e-6
    return 1e-13 + 2e-15 * scale * power


def _check(got, logq, p, scale, bias, u, rows=None, dtype=np.float64):
    """got = (m, ..., A, U) of one problem against the brute force, rows [a, b)."""
    m, A, U = got[0], got[-2], got[-1]
    n, K = p.shape
    a, b = rows or (0, n)
    assert A.shape == (len(scale), b - a, K) and U.shape == (len(scale), b - a)
    assert A.dtype == U.dtype == np.float64
    for t, (rm, rA, rU, rUabs) in enumerate(_brute(logq, p, scale, bias, u)):
        rm, rA, rU, rUabs = rm[a:b], rA[a:b], rU[a:b], rUabs[a:b]
        # (|L| <= |bias| + 28 scale, its rounding relative to that)
        atol = _rtol(scale[t], 1, dtype) * (np.abs(bias[t]).max() + 28.0 * scale[t])
        np.testing.assert_allclose(m[t], rm, rtol=0, atol=atol)
        # every term of A is >= 0: relative to itself, plus what the engine may drop
        # (terms below exp(-64) of a class maximum, n of them at most)
        tol_a = _rtol(scale[t], 1, dtype) * rA + n * np.exp(-DROP)
        bad = np.abs(A[t] - rA) > tol_a
        assert not bad.any(), f"A, h = {1 / scale[t]}: {bad.sum()} entries off"
        tol_u = _rtol(scale[t], 2, dtype) * rUabs + 1e-300
        bad = np.abs(U[t] - rU) > tol_u
        assert not bad.any(), f"U, h = {1 / scale[t]}: {bad.sum()} entries off"
        # the row's largest term (w = 1) is in A, whose row sums are S_0 >= 1
        assert (A[t].sum(axis=1) >= 1.0 - 1e-6).all()


def _call(logq, p, labels, C, scale, bias, u, powers=2, a=0, b=None, nt=0, pairs=True):
    b = logq.shape[-2] if b is None else b
    return core.loo_reduce(logq, p, labels, C, scale, bias, powers, a, b, nt, pairs=pairs, resid=u)


# ----------------------------------------------------------------------- loo_reduce
@pytest.mark.parametrize(
    "n,K,C,kind",
    [
        (2, 2, 2, "plain"),
        (3, 3, 3, "plain"),
        (3, 2, 1, "ties"),
        (50, 2, 2, "plain"),
        (50, 3, 3, "zeros"),
        (50, 10, 10, "raw0"),
        (300, 2, 2, "ties"),
        (300, 3, 3, "raw0"),
        (700, 10, 10, "plain"),  # three tiles of 256 centres
        (700, 3, 5, "ties"),
        (700, 10, 4, "zeros"),
        (150, 100, 100, "plain"),  # K = 100: 17 register blocks of the tile's rows
        (90, 7, 1, "raw0"),  # one class, K not a multiple of the block
    ],
    ids=lambda v: str(v),
)
def test_residual_sums_match_brute_force(n, K, C, kind):
    logq, p, labels, scale, bias, u = _problem(n, K, C, kind=kind, seed=n + K)
    full = _call(logq, p, labels, C, scale, bias, u)
    assert len(full) == 7
    _check(full, logq, p, scale, bias, u)
    # a row range: the same bits as the full pass's rows
    a, b = n // 3, n - n // 5
    part = _call(logq, p, labels, C, scale, bias, u, a=a, b=b)
    _check(part, logq, p, scale, bias, u, rows=(a, b))
    for k in range(7):
        np.testing.assert_array_equal(part[k], full[k][:, a:b], err_msg=str(k))


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize(
    "n,K,C,kind,dtype",
    [
        (50, 3, 3, "zeros", np.float64),
        (700, 10, 10, "plain", np.float64),
        (150, 100, 100, "plain", np.float64),
        (300, 4, 2, "ties", np.float32),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_residual_sums_by_blocks_where_the_scratch_would_be_large(
    monkeypatch, backend, n, K, C, kind, dtype
):
    """The pass keeps (K + 1) partial sums per label group, query row and bandwidth in
    every thread: 3.2 GB per thread at K = 5,000 (a helper's probe: n = 50, K = 5,000
    took 6.2 GB and 42 s). Beyond RESIDUAL_SCRATCH_BYTES loo_reduce runs the pass without
    them and forms A = W p, U = W^2 u from blocks of kernel weights: against the brute
    force as the in-pass sums, and within rounding of them; the other outputs the same
    bits."""
    from kdecal._engine import backends as be
    from kdecal._engine import engines as _engines

    if backend == "numba" and _engines.load_numba() is None:
        pytest.skip("numba not installed")
    hs = HS if dtype == np.float64 else (0.05, 0.3, 10.0)
    logq, p, labels, scale, bias, u = _problem(n, K, C, hs, kind=kind, seed=n + K, dtype=dtype)
    a, b = n // 4, n - n // 6

    def run():
        return be.loo_reduce(
            logq,
            p,
            labels,
            C,
            scale,
            bias,
            powers=2,
            backend=backend,
            rows=(a, b),
            pairs=True,
            resid=u,
            progress=False,
        )

    in_pass = run()
    monkeypatch.setattr(be, "RESIDUAL_SCRATCH_BYTES", 0.0)
    blocked = run()
    assert len(blocked) == len(in_pass) == 7
    for k in range(5):
        np.testing.assert_array_equal(blocked[k], in_pass[k], err_msg=str(k))
    _check(blocked, logq, p, scale, bias, u, rows=(a, b), dtype=dtype)
    np.testing.assert_allclose(blocked[5], in_pass[5], rtol=1e-12, atol=n * np.exp(-DROP))
    scale_u = np.abs(in_pass[6]).max()
    np.testing.assert_allclose(blocked[6], in_pass[6], rtol=1e-10, atol=1e-12 * scale_u)
    # the decision: a canonical problem of K = 5,000 classes takes the blocked path
    assert (
        be._residual_scratch_bytes(np.zeros((50, 5000)), 5000, 1)
        > 256e6
        > (be._residual_scratch_bytes(np.zeros((50, 100)), 100, 3))
    )


def test_single_point_has_no_terms():
    logq, p, labels, scale, bias, u = _problem(1, 3, 2)
    got = _call(logq, p, labels, 2, scale, bias, u)
    assert (got[0] == -np.inf).all()
    assert got[-2].shape == (3, 1, 3) and (got[-2] == 0.0).all() and (got[-1] == 0.0).all()


def test_raw_zero_columns_give_exact_zeros():
    """A column k of p that is exactly zero gives A[..., k] = 0 exactly."""
    logq, p, labels, scale, bias, u = _problem(80, 4, 2, kind="raw0", seed=5)
    p = p.copy()
    p[:, 2] = 0.0
    p[:, 3] += 0.01
    p /= p.sum(axis=1, keepdims=True)
    bias = np.stack([-gammaln(p / h + 1.0).sum(axis=1) for h in 1.0 / scale])
    got = _call(logq, p, labels, 2, scale, bias, u)
    assert (got[-2][..., 2] == 0.0).all()
    _check(got, logq, p, scale, bias, u)


@pytest.mark.parametrize(
    "powers,pairs", [(1, False), (2, False), (2, True), (3, False), (3, True)]
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_other_outputs_do_not_change(powers, pairs, dtype):
    """m, S, Q, T, D are the same bits with and without resid; A, U do not depend on
    powers or pairs."""
    n, K, C = 613, 6, 6
    logq, p, labels, scale, bias, u = _problem(n, K, C, seed=8, dtype=dtype, kind="ties")
    args = (logq, p, labels, C, scale, bias, powers, 0, n, 0)
    plain = core.loo_reduce(*args, pairs=pairs)
    with_r = core.loo_reduce(*args, pairs=pairs, resid=u)
    assert len(with_r) == len(plain) + 2
    for k in range(len(plain)):
        np.testing.assert_array_equal(with_r[k], plain[k], err_msg=str(k))
    ref_AU = core.loo_reduce(logq, p, labels, C, scale, bias, 1, 0, n, 0, resid=u)[-2:]
    np.testing.assert_array_equal(with_r[-2], ref_AU[0])
    np.testing.assert_array_equal(with_r[-1], ref_AU[1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_threads_and_task_sizes_give_the_same_bits(monkeypatch, dtype):
    """1 and 2 threads, tasks of 16 to 64 rows, odd row ranges: the same bits (a row's
    residual sums do not depend on the rows grouped with it)."""
    n, K, C = 523, 5, 4
    logq, p, labels, scale, bias, u = _problem(n, K, C, seed=4, dtype=dtype)
    runs = {}
    for rows in ("16", "32", "64"):
        monkeypatch.setenv("KDECAL_TASK_ROWS", rows)
        for nt in (1, 2):
            runs[rows, nt] = _call(logq, p, labels, C, scale, bias, u, 3, 5, 500, nt)
    first = runs["16", 1]
    for key, got in runs.items():
        for k in range(7):
            np.testing.assert_array_equal(got[k], first[k], err_msg=f"{key} [{k}]")
    if dtype == np.float64:
        _check(first, logq, p, scale, bias, u, rows=(5, 500))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_every_simd_path(monkeypatch, isa, dtype):
    """Each SIMD path (KDECAL_ISA forces a lower one) against the brute force, with the
    other outputs unchanged by resid; float32 at h >= 0.05 (its K-dot's rounding is
    amplified by 1 / h)."""
    monkeypatch.setenv("KDECAL_ISA", isa)
    order = ["baseline", "avx2", "avx512"]
    assert order.index(core.simd_path()) <= order.index(isa)
    hs = HS if dtype == np.float64 else (0.05, 0.3, 10.0)
    for n, K, C in ((517, 10, 10), (300, 3, 2), (40, 13, 3)):
        logq, p, labels, scale, bias, u = _problem(n, K, C, hs, seed=7, dtype=dtype)
        got = _call(logq, p, labels, C, scale, bias, u)
        _check(got, logq, p, scale, bias, u, dtype=dtype)
        plain = core.loo_reduce(logq, p, labels, C, scale, bias, 2, 0, n, 0, pairs=True)
        for k in range(5):
            np.testing.assert_array_equal(got[k], plain[k], err_msg=f"{isa} [{k}]")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_batched_problems(dtype):
    """(B, n, K) problems with resid (B, n): each one as its own call, bit for bit."""
    B, n, K, C = 3, 260, 4, 2
    hs = HS if dtype == np.float64 else (0.05, 0.3, 10.0)
    logq, p, labels, scale, bias, u = _problem(n, K, C, hs, seed=11, dtype=dtype, B=B)
    got = _call(logq, p, labels, C, scale, bias, u, 3, 7, 250)
    assert len(got) == 7
    assert got[-2].shape == (B, 3, 243, K) and got[-1].shape == (B, 3, 243)
    for b in range(B):
        one = _call(logq[b], p[b], labels[b], C, scale, bias[b], u[b], 3, 7, 250)
        for k in range(7):
            np.testing.assert_array_equal(got[k][b], one[k], err_msg=f"{b} [{k}]")
        _check(one, logq[b], p[b], scale, bias[b], u[b], rows=(7, 250), dtype=dtype)


def test_resid_errors():
    n, K, C = 30, 3, 3
    logq, p, labels, scale, bias, u = _problem(n, K, C)
    args = (logq, p, labels, C, scale, bias, 2, 0, n, 0)
    for bad in (u[:-1], np.stack([u, u]), np.zeros((n, 1))):
        with pytest.raises(ValueError, match="resid must have shape"):
            core.loo_reduce(*args, resid=np.ascontiguousarray(bad))
    for x in (np.nan, np.inf, -np.inf):
        v = u.copy()
        v[17] = x
        with pytest.raises(ValueError, match=r"resid must be finite; resid\[17\]"):
            core.loo_reduce(*args, resid=v)
    with pytest.raises(TypeError):  # no hidden conversion
        core.loo_reduce(*args, resid=u.astype(np.float32))
    # batched: (B, n) only
    lb, pb, yb, _, _, ub = _problem(n, K, C, B=2)
    bb = np.ascontiguousarray(np.stack([bias, bias]))
    bargs = (lb, pb, yb, C, scale, bb, 2, 0, n, 0)
    with pytest.raises(ValueError, match=r"resid must have shape \(B, n\)"):
        core.loo_reduce(*bargs, resid=ub[0].copy())
    ub = ub.copy()
    ub[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"resid\[1, 3\]"):
        core.loo_reduce(*bargs, resid=ub)
    assert len(core.loo_reduce(*bargs)) == 4  # no resid: the tuple as before


# ----------------------------------------------------------------- loo_reduce_multi
def _multi_problem(n, K, C, B, h, *, seed=0, dtype=np.float64, weighted=False):
    logq, p, labels, scale, bias, _ = _problem(n, K, C, (h,), seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    labels = rng.integers(0, C, size=(B, n)).astype(np.int64)
    weights = None
    if weighted:
        weights = rng.multinomial(n, np.full(n, 1.0 / n), size=B).astype(np.float64)
        weights[:, :3] = rng.random((B, min(n, 3))) * 2.5  # some non-integer weights
    u = rng.standard_normal((B, n)) * np.exp(rng.uniform(-3, 3, (B, n)))
    m = core.loo_reduce(logq, p, labels[0], C, scale, bias, 1, 0, n, 0)[0][0].copy()
    return logq, p, m, labels, scale[0], bias[0], weights, u


def _multi_brute(logq, p, m, scale, bias, weights, u):
    """Float64 (U, Uabs) with the multi pass's drop rule (terms < exp(-64) of m; with
    centre weights, < exp(-230))."""
    L = bias[None, :] + scale * (logq.astype(np.float64) @ p.astype(np.float64).T)
    np.fill_diagonal(L, -np.inf)
    X = L - m[:, None]
    floor = -DROP if weights is None else -230.0
    W2 = np.where(X >= floor, np.exp(np.minimum(X, 0.0)), 0.0) ** 2
    wu = u if weights is None else weights * u
    return wu @ W2.T, np.abs(wu) @ W2.T


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("weighted", [False, True], ids=["labels", "weights"])
@pytest.mark.parametrize(
    "n,K,C,B,h",
    [
        (2, 2, 2, 2, 0.1),
        (50, 2, 2, 3, 0.3),
        (300, 10, 10, 4, 0.005),  # most terms dropped
        (700, 3, 4, 3, 0.1),  # several panels, the last one partial
        (260, 10, 40, 3, 10.0),  # many empty classes, huge bandwidth
    ],
    ids=lambda v: str(v),
)
def test_multi_u_matches_brute_force(dtype, weighted, n, K, C, B, h):
    logq, p, m, labels, scale, bias, weights, u = _multi_problem(
        n, K, C, B, h, dtype=dtype, weighted=weighted
    )
    rU, rUabs = _multi_brute(logq, p, m, scale, bias, weights, u)
    rtol = 1e-12 if dtype == np.float64 else 4e-6 * max(1.0, 0.1 / h) * K
    for powers in (1, 2):
        for a, b in [(0, n), (n // 3, n - n // 4)]:
            args = (logq, p, m, labels, C, scale, bias, weights, powers, a, b, 0)
            S, Q, U = core.loo_reduce_multi(*args, resid=u)
            assert U.shape == (B, b - a) and U.dtype == np.float64
            bad = np.abs(U - rU[:, a:b]) > rtol * rUabs[:, a:b] + 1e-300
            assert not bad.any(), f"U rows {a}:{b}: {bad.sum()} entries off"
            S0, Q0 = core.loo_reduce_multi(*args)
            np.testing.assert_array_equal(S, S0)
            np.testing.assert_array_equal(Q, Q0)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
def test_multi_u_threads_and_simd_paths(monkeypatch, isa):
    monkeypatch.setenv("KDECAL_ISA", isa)
    n, K, C, B, h = 517, 10, 10, 5, 0.05
    logq, p, m, labels, scale, bias, weights, u = _multi_problem(n, K, C, B, h, weighted=True)
    rU, rUabs = _multi_brute(logq, p, m, scale, bias, weights, u)
    runs = [
        core.loo_reduce_multi(logq, p, m, labels, C, scale, bias, weights, 2, 0, 0, nt, resid=u)
        for nt in (1, 2)
    ]
    for k in range(3):
        np.testing.assert_array_equal(runs[0][k], runs[1][k])
    assert not (np.abs(runs[0][2] - rU) > 1e-12 * rUabs + 1e-300).any()


def test_multi_resid_errors():
    n, K, C, B = 30, 3, 3, 2
    logq, p, m, labels, scale, bias, weights, u = _multi_problem(n, K, C, B, 0.1)
    args = (logq, p, m, labels, C, scale, bias, weights, 1, 0, 0, 0)
    for bad in (u[0], u[:, :-1], np.concatenate([u, u])):
        with pytest.raises(ValueError, match="resid must have the shape of labels"):
            core.loo_reduce_multi(*args, resid=np.ascontiguousarray(bad))
    v = u.copy()
    v[1, 4] = np.inf
    with pytest.raises(ValueError, match=r"resid\)\[1, 4\] = inf must be finite"):
        core.loo_reduce_multi(*args, resid=v)
    with pytest.raises(TypeError):
        core.loo_reduce_multi(*args, resid=u.astype(np.float32))
    assert len(core.loo_reduce_multi(*args)) == 2
