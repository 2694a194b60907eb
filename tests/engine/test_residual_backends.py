"""The residual sums A and U of the leave-one-out reduction (issue 25, item 1).

Besides S, Q, T (and D), ``_backends.loo_reduce(..., resid=u)`` returns, per query row j,

    A_k(j) = sum_{i != j} exp(L_ij - m_j) p[i, k]        (all centres, every class)
    U(j)   = sum_{i != j} exp(2 (L_ij - m_j)) u[i]

and ``_backends.loo_reduce_multi(..., resid=u_sets)`` appends
``U[b, j] = sum_{i != j} weights[b, i] w_ij^2 u[b, i]``.  Checked against a float64 brute
force that materialises the n x n log-kernel, on the numba backend (1e-12), the CUDA
backend (numba's simulator or a GPU; marked ``cuda``), the dask backend (row blocks) and,
once the compiled core takes ``resid``, the cpp backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import gammaln

import kdecal
from kdecal._engine import backends as _backends
from kdecal._engine import engines as _engines
from kdecal._engine import runtime as _runtime

CLAMP = -230.0  # the numba and CUDA engines clamp terms at exp(-230) of their class max
DROP = -64.0  # loo_reduce_multi drops terms below exp(-64) of the row max

core = _runtime._core
cu = _engines.load_cuda()
needs_numba = pytest.mark.skipif(
    "numba" not in kdecal.available_backends(), reason="numba not installed"
)


def _core_takes_resid():
    if core is None:
        return False
    P = np.full((3, 2), 0.5)
    try:
        core.loo_reduce(
            np.log(P), P, np.zeros(3, np.int64), 1, np.ones(1), np.zeros((1, 3)), 1, 0, 3, 1,
            resid=np.zeros(3),
        )  # fmt: skip
    except TypeError:
        return False
    return True


def _core_multi_takes_resid():
    if core is None:
        return False
    P = np.full((3, 2), 0.5)
    try:
        core.loo_reduce_multi(
            np.log(P), P, np.zeros(3), np.zeros((1, 3), np.int64), 1, 1.0, np.zeros(3), None,
            1, 0, 3, 1, resid=np.zeros((1, 3)),
        )  # fmt: skip
    except TypeError:
        return False
    return True


CORE_RESID = _core_takes_resid()
needs_core_resid = pytest.mark.skipif(
    not CORE_RESID,
    reason="kdecal._core.loo_reduce does not accept resid= yet (compiled core without the "
    "residual sums, or not built)",
)
needs_core_multi_resid = pytest.mark.skipif(
    not _core_multi_takes_resid(),
    reason="kdecal._core.loo_reduce_multi does not accept resid= yet (compiled core without "
    "the residual sums, or not built)",
)


# ------------------------------------------------------------------------------- inputs
def _points(n, K, C, *, seed=0, ties=False, alpha=0.7):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    if ties:  # repeated predictions: several centres at the class maximum
        P[n // 2 :] = P[: n - n // 2]
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    labels = rng.integers(0, C, size=n).astype(np.int64)
    u = rng.normal(size=n)
    return P, labels, u


def _inputs(P, hs, dtype=np.float64):
    logq = np.ascontiguousarray(np.log(P), dtype=dtype)
    p = np.ascontiguousarray(P, dtype=dtype)
    hs = np.asarray(hs, dtype=np.float64)
    bias = np.stack([-gammaln(p.astype(np.float64) / h + 1.0).sum(axis=1) for h in hs])
    return logq, p, 1.0 / hs, bias


def _dot(logq, p, f64=False):
    """G[j, i] = sum_k logq[j, k] p[i, k], summed k = 0 .. K-1 in the input dtype (or in
    float64) as the numba engine does, then float64."""
    dt = np.float64 if f64 else logq.dtype
    lq, pp = logq.astype(dt), p.astype(dt)
    G = lq[:, :1] * pp[:, 0][None, :]
    for k in range(1, lq.shape[1]):
        G = G + lq[:, k : k + 1] * pp[:, k][None, :]
    return G.astype(np.float64)


def _brute(logq, p, labels, C, scale, bias, u, r0=0, r1=None, f64=False):
    """m (H, R), A (H, R, K), U (H, R), |U| (H, R): the materialised float64 log-kernel.

    Every term is ``exp(max(L_ij - m_c, -230)) exp(m_c - m)``, with ``m_c`` its class
    maximum, as the engines clamp; |U| sums ``|u|`` (the scale of U's rounding).  The K-dot
    in the input dtype, as numba computes it (``f64``: in float64, for the CUDA fast mode).
    """
    n = p.shape[0]
    r1 = n if r1 is None else r1
    G = _dot(logq, p, f64)
    pp = p.astype(np.float64)
    H = len(scale)
    m = np.full((H, r1 - r0), -np.inf)
    A = np.zeros((H, r1 - r0, p.shape[1]))
    U = np.zeros((H, r1 - r0))
    Uabs = np.zeros((H, r1 - r0))
    for t in range(H):
        L = bias[t][None, :] + scale[t] * G
        np.fill_diagonal(L, -np.inf)
        L = L[r0:r1]
        m[t] = L.max(axis=1)
        for c in range(C):
            sel = labels == c
            if not sel.any():
                continue
            Lc = L[:, sel]
            mc = Lc.max(axis=1)
            ok = mc > -np.inf
            W = np.zeros_like(Lc)
            W[ok] = np.exp(np.maximum(Lc[ok] - mc[ok, None], CLAMP))
            W[~np.isfinite(Lc)] = 0.0  # the query itself
            W[ok] *= np.exp(mc[ok] - m[t, ok])[:, None]
            A[t] += W @ pp[sel]
            U[t] += (W * W) @ u[sel]
            Uabs[t] += (W * W) @ np.abs(u[sel])
    return m, A, U, Uabs


def _rel(got, want, scale, floor=1e-300):
    return float(np.max(np.abs(got - want) / np.maximum(scale, floor))) if want.size else 0.0


def _check(A, U, ref, tol_a, tol_u=None, what=""):
    _, rA, rU, rUabs = ref
    assert A.shape == rA.shape and U.shape == rU.shape, what
    assert np.all(np.isfinite(A)) and np.all(np.isfinite(U)), what
    ea, eu = _rel(A, rA, np.abs(rA)), _rel(U, rU, rUabs)
    assert ea <= tol_a, f"A {what}: {ea:.3g} > {tol_a:.3g}"
    assert eu <= (tol_u or tol_a), f"U {what}: {eu:.3g} > {tol_u or tol_a:.3g}"


HS = [1e-3, 0.1, 10.0]


# -------------------------------------------------------------------------------- numba
@needs_numba
@pytest.mark.parametrize(
    "n,K,C,ties",
    [
        (2, 2, 2, False),
        (3, 3, 3, False),
        (3, 3, 1, True),
        (50, 10, 10, False),
        (50, 3, 2, True),
        (300, 2, 2, False),
        (300, 3, 3, True),
        (300, 10, 4, False),
    ],
    ids=lambda v: str(v),
)
def test_numba_matches_brute_force(n, K, C, ties):
    P, labels, u = _points(n, K, C, seed=n + K, ties=ties)
    logq, p, scale, bias = _inputs(P, HS)
    ranges = [(0, n)] + ([(1, n - 1), (n // 3, n // 3 + 7)] if n > 10 else [(1, n)])
    for r0, r1 in ranges:
        kw = {"powers": 3, "backend": "numba", "rows": (r0, r1), "progress": False}
        plain = _backends.loo_reduce(logq, p, labels, C, scale, bias, pairs=True, **kw)
        out = _backends.loo_reduce(logq, p, labels, C, scale, bias, pairs=True, resid=u, **kw)
        assert len(out) == 7
        for name, a, b in zip("mSQTD", plain, out):  # unchanged by resid, bit for bit
            np.testing.assert_array_equal(a, b, err_msg=name)
        ref = _brute(logq, p, labels, C, scale, bias, u, r0, r1)
        np.testing.assert_array_equal(out[0], ref[0])
        _check(out[5], out[6], ref, 1e-12, what=f"rows {r0}:{r1}")
        # without pairs and with fewer powers: the same A and U
        few = _backends.loo_reduce(logq, p, labels, C, scale, bias, resid=u, **{**kw, "powers": 1})
        assert len(few) == 6
        np.testing.assert_array_equal(few[4], out[5])
        np.testing.assert_array_equal(few[5], out[6])


@needs_numba
@pytest.mark.parametrize("K", [2, 3, 10])
def test_numba_batched_problems(K):
    n, B = 60, 3
    probs, labs, us = zip(*(_points(n, K, K, seed=10 * K + b, ties=b == 1) for b in range(B)))
    ins = [_inputs(P, HS) for P in probs]
    logq = np.stack([x[0] for x in ins])
    p = np.stack([x[1] for x in ins])
    bias = np.stack([x[3] for x in ins])
    scale = ins[0][2]
    labels, u = np.stack(labs), np.stack(us)
    kw = {"powers": 2, "backend": "numba", "progress": False, "rows": (2, n)}
    out = _backends.loo_reduce(logq, p, labels, K, scale, bias, resid=u, **kw)
    T, A, U = out[3:]
    assert A.shape == (B, 3, n - 2, K) and U.shape == (B, 3, n - 2) and T.shape == (0, 0, 0)
    plain = _backends.loo_reduce(logq, p, labels, K, scale, bias, **kw)
    for a, b in zip(plain, out):
        np.testing.assert_array_equal(a, b)
    for b in range(B):
        ref = _brute(logq[b], p[b], labels[b], K, scale, bias[b], u[b], 2, n)
        _check(A[b], U[b], ref, 1e-12, what=f"problem {b}")
    # row ranges concatenate to the full pass, bit for bit
    parts = [
        _backends.loo_reduce(logq, p, labels, K, scale, bias, resid=u, **{**kw, "rows": rr})
        for rr in [(2, 20), (20, 20), (20, n)]
    ]
    np.testing.assert_array_equal(A, np.concatenate([x[4] for x in parts], axis=2))
    np.testing.assert_array_equal(U, np.concatenate([x[5] for x in parts], axis=2))


@needs_numba
def test_numba_float32_inputs():
    # float32 K-dot; A takes p in float64 (its float32 values, exactly)
    n, K = 80, 4
    P, labels, u = _points(n, K, K, seed=4)
    logq, p, scale, bias = _inputs(P, [0.05, 1.0], np.float32)
    out = _backends.loo_reduce(logq, p, labels, K, scale, bias, backend="numba", resid=u)
    ref = _brute(logq, p, labels, K, scale, bias, u)
    _check(out[4], out[5], ref, 1e-12)  # _brute follows the float32 inputs in float64


@needs_numba
def test_numba_one_centre_per_class_and_n_equal_one():
    P = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]])
    labels = np.array([0, 1, 2, 2])
    u = np.array([1.0, -2.0, 0.5, 3.0])
    logq, p, scale, bias = _inputs(P, [0.3])
    out = _backends.loo_reduce(logq, p, labels, 3, scale, bias, backend="numba", resid=u)
    _check(out[4], out[5], _brute(logq, p, labels, 3, scale, bias, u), 1e-13)
    one = _backends.loo_reduce(
        logq[:1], p[:1], labels[:1], 3, scale, bias[:, :1], backend="numba", resid=u[:1]
    )
    assert one[0][0, 0] == -np.inf and np.all(one[4] == 0.0) and np.all(one[5] == 0.0)


@pytest.mark.parametrize("backend", ["numba", "cpp"])
def test_resid_validation(backend):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    P, labels, u = _points(10, 3, 3)
    logq, p, scale, bias = _inputs(P, [0.1])
    for bad, what in [
        (u[:9], "shape"),
        (u[None], "shape"),
        (np.where(np.arange(10) == 4, np.nan, u), "finite"),
        (np.where(np.arange(10) == 2, np.inf, u), "finite"),
    ]:
        with pytest.raises(ValueError, match="resid") as exc:
            _backends.loo_reduce(logq, p, labels, 3, scale, bias, backend=backend, resid=bad)
        assert what in str(exc.value)
    with pytest.raises(ValueError, match="resid"):  # batched: (B, n) wanted
        _backends.loo_reduce(
            logq[None], p[None], labels[None], 3, scale, bias[None], backend=backend, resid=u
        )


# --------------------------------------------------------------------- multi label sets
def _multi_ref(logq, p, m, scale, bias, weights, u, f64=False, weighted=False):
    """U[b, j] and the sum of its |terms| (terms below exp(-64) of the row max dropped;
    with centre weights, ``weighted``, those below exp(-230))."""
    L = bias[None, :] + scale * _dot(logq, p, f64)
    np.fill_diagonal(L, -np.inf)
    X = L - m[:, None]
    W = np.where(X >= (-230.0 if weighted else DROP), np.exp(np.minimum(X, 0.0)), 0.0)
    wu = weights * u
    return (W * W) @ wu.T, (W * W) @ np.abs(wu).T  # (n, B)


@needs_numba
@pytest.mark.parametrize("weighted", [False, True], ids=["labels", "weights"])
@pytest.mark.parametrize(
    "n,K,C,B,h", [(3, 2, 2, 2, 0.3), (120, 3, 3, 5, 0.05), (300, 10, 4, 4, 1e-3)]
)
def test_multi_numba_matches_brute_force(weighted, n, K, C, B, h):
    rng = np.random.default_rng(n + B)
    P, _, _ = _points(n, K, C, seed=n)
    logq, p, scale, bias = _inputs(P, [h])
    m = _brute(logq, p, np.zeros(n, np.int64), 1, scale, bias, np.zeros(n))[0][0]
    labels = rng.integers(0, C, size=(B, n)).astype(np.int64)
    weights = rng.poisson(1.0, size=(B, n)).astype(np.float64) if weighted else None
    u = rng.normal(size=(B, n))
    wts = np.ones((B, n)) if weights is None else weights
    rU, rUabs = _multi_ref(logq, p, m, scale[0], bias[0], wts, u, weighted=weighted)
    for powers in (1, 2):
        for r0, r1 in [(0, n), (1, n), (n // 2, n // 2)]:
            args = (logq, p, m, labels, C, scale[0], bias[0], weights)
            kw = {"powers": powers, "backend": "numba", "row_start": r0, "row_stop": r1}
            plain = _backends.loo_reduce_multi(*args, **kw)
            out = _backends.loo_reduce_multi(*args, resid=u, **kw)
            assert len(out) == 3 and out[2].shape == (B, r1 - r0)
            for a, b in zip(plain, out):
                np.testing.assert_array_equal(a, b)
            assert _rel(out[2], rU[r0:r1].T, rUabs[r0:r1].T) <= 1e-12


@pytest.mark.parametrize("backend", ["numba", "cpp"])
def test_multi_resid_validation(backend):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    P, labels, _ = _points(10, 3, 3)
    logq, p, scale, bias = _inputs(P, [0.1])
    m = np.zeros(10)
    labs = np.stack([labels, labels])
    args = (logq, p, m, labs, 3, scale[0], bias[0])
    with pytest.raises(ValueError, match="resid"):
        _backends.loo_reduce_multi(*args, backend=backend, resid=np.zeros((3, 10)))
    with pytest.raises(TypeError, match="resid"):
        _backends.loo_reduce_multi(*args, backend=backend, resid=np.zeros((2, 10), np.float32))
    bad = np.zeros((2, 10))
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"resid\[1, 3\]"):
        _backends.loo_reduce_multi(*args, backend=backend, resid=bad)


# --------------------------------------------------------------------------------- cpp
@needs_core_resid
@pytest.mark.parametrize("batched", [False, True])
def test_cpp_matches_brute_force(batched):
    n, K, C = 120, 3, 3
    P, labels, u = _points(n, K, C, seed=9, ties=True)
    logq, p, scale, bias = _inputs(P, [0.01, 0.2, 5.0])
    if batched:
        logq, p, labels, bias = logq[None], p[None], labels[None], bias[None]
        logq, p, labels, bias = (np.concatenate([x, x]) for x in (logq, p, labels, bias))
        u = np.stack([u, -u])
    kw = {"powers": 3, "pairs": True, "resid": u, "rows": (3, n)}
    a = _backends.loo_reduce(logq, p, labels, C, scale, bias, backend="cpp", **kw)
    plain = _backends.loo_reduce(
        logq, p, labels, C, scale, bias, backend="cpp", **{**kw, "resid": None}
    )
    assert len(a) == 7
    for x, y in zip(plain, a):
        np.testing.assert_array_equal(x, y)
    for b in range(2 if batched else 1):
        sl = (b,) if batched else ()
        ref = _brute(logq[sl], p[sl], labels[sl], C, scale, bias[sl], u[sl], 3, n)
        # the engines' K-dots round differently (eps |L|, |L| ~ 1 / h)
        _check(a[5][sl], a[6][sl], ref, 1e-10, what=f"problem {b}")


# -------------------------------------------------------------------------------- dask
def _dask_client(processes):
    pytest.importorskip("dask", reason='backend="dask" needs dask: pip install "kdecal[dask]"')
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed")
    from kdecal._engine import dask as _dask

    if core is None:
        pytest.skip("backend='dask' runs kdecal's compiled core, which is not built here")
    # one single-threaded worker in-process (numba's default threading layer is not safe
    # for concurrent calls), two worker processes otherwise
    cluster = distributed.LocalCluster(
        n_workers=1 if not processes else 2,
        threads_per_worker=1,
        processes=processes,
        dashboard_address=None,
    )
    client = distributed.Client(cluster)
    old = _dask.MIN_BLOCK_WORK
    _dask.MIN_BLOCK_WORK = 1e3  # several blocks even for these small problems
    return client, cluster, old


def _dask_close(client, cluster, old):
    from kdecal._engine import dask as _dask

    _dask.MIN_BLOCK_WORK = old
    _dask.clear_cache()
    client.close()
    cluster.close()


class _NumbaCore:
    """The compiled core's two reductions on the numba engine (to test the dask plumbing
    in-process while the compiled core has no residual sums)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def loo_reduce(self, *args, progress=None, pairs=False, resid=None):
        args, _n_threads = args[:9], args[9]
        kw = {} if resid is None else {"resid": resid}
        return _engines.engine("numba").loo_reduce(*args, pairs=pairs, **kw)

    def loo_reduce_multi(self, *args, progress=None, resid=None):
        from kdecal._engine import numba as _numba

        return _numba.loo_reduce_multi(*args[:11], resid=resid)


def _dask_problem():
    n, K, C = 90, 3, 3
    P, labels, u = _points(n, K, C, seed=21, ties=True)
    logq, p, scale, bias = _inputs(P, [0.02, 0.3])
    return n, C, logq, p, labels, scale, bias, u


@needs_numba
def test_dask_row_blocks_concatenate(monkeypatch):
    """The dask plumbing (blocks of rows on the workers, A and U concatenated along the row
    axis) on an in-process cluster whose "core" is the numba engine: equal to one numba
    pass, bit for bit (numba's rows do not depend on the row range)."""
    client, cluster, old = _dask_client(processes=False)
    try:
        monkeypatch.setattr(_runtime, "_core", _NumbaCore(core))
        n, C, logq, p, labels, scale, bias, u = _dask_problem()
        for batched in (False, True):
            if batched:
                lq, pp, lab, bb = (np.stack([x, x[::-1].copy()]) for x in (logq, p, labels, bias))
                uu = np.stack([u, u[::-1].copy()])
            else:
                lq, pp, lab, bb, uu = logq, p, labels, bias, u
            for pairs in (False, True):
                kw = {"powers": 2, "pairs": pairs, "resid": uu, "rows": (4, n - 1)}
                got = _backends.loo_reduce(lq, pp, lab, C, scale, bb, backend="dask", **kw)
                want = _backends.loo_reduce(lq, pp, lab, C, scale, bb, backend="numba", **kw)
                assert len(got) == len(want) == (7 if pairs else 6)
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b)
        B = 3
        rng = np.random.default_rng(0)
        labs = rng.integers(0, C, (B, n)).astype(np.int64)
        w, us = rng.random((B, n)), rng.normal(size=(B, n))
        full_m = _backends.loo_reduce(logq, p, labels, C, scale[:1], bias[:1], backend="numba")
        args = (logq, p, np.ascontiguousarray(full_m[0][0]), labs, C, scale[0], bias[0], w)
        kw = {"powers": 2, "row_start": 4, "row_stop": n - 1, "resid": us}
        got = _backends.loo_reduce_multi(*args, backend="dask", **kw)
        want = _backends.loo_reduce_multi(*args, backend="numba", **kw)
        assert len(got) == 3
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    finally:
        _dask_close(client, cluster, old)


@needs_core_resid
def test_dask_equals_cpp():
    client, cluster, old = _dask_client(processes=True)
    try:
        n, C, logq, p, labels, scale, bias, u = _dask_problem()
        for pairs in (False, True):
            kw = {"powers": 3, "pairs": pairs, "resid": u, "rows": (2, n)}
            got = _backends.loo_reduce(logq, p, labels, C, scale, bias, backend="dask", **kw)
            want = _backends.loo_reduce(logq, p, labels, C, scale, bias, backend="cpp", **kw)
            assert len(got) == len(want) == (7 if pairs else 6)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
    finally:
        _dask_close(client, cluster, old)


@needs_core_multi_resid
def test_dask_multi_equals_cpp():
    client, cluster, old = _dask_client(processes=True)
    try:
        n, C, logq, p, labels, scale, bias, _ = _dask_problem()
        rng = np.random.default_rng(1)
        labs = rng.integers(0, C, (4, n)).astype(np.int64)
        w, us = rng.random((4, n)), rng.normal(size=(4, n))
        m = _backends.loo_reduce(logq, p, labels, C, scale[:1], bias[:1], backend="cpp")[0][0]
        args = (logq, p, np.ascontiguousarray(m), labs, C, scale[0], bias[0], w)
        kw2 = {"powers": 2, "row_start": 1, "row_stop": n, "resid": us}
        got = _backends.loo_reduce_multi(*args, backend="dask", **kw2)
        want = _backends.loo_reduce_multi(*args, backend="cpp", **kw2)
        assert len(got) == 3
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    finally:
        _dask_close(client, cluster, old)


# -------------------------------------------------------------------------------- cuda
# on a GPU, or under numba's simulator in a pytest process of its own (the variable must
# be set before numba is imported): NUMBA_ENABLE_CUDASIM=1 pytest -m cuda
needs_cuda = pytest.mark.skipif(cu is None, reason=f"no CUDA engine: {_engines._cuda_error}")
SIM = cu is not None and cu.SIMULATOR


def _cuda_case(n, K, C, hs, dtype, *, seed=0, ties=False):
    P, labels, u = _points(n, K, C, seed=seed, ties=ties)
    logq, p, scale, bias = _inputs(P, hs, dtype)
    return logq, p, labels, scale, bias, u


def _cuda_tols(dtype):
    return (1e-10, 1e-10) if dtype == np.float64 else (1e-5, 1e-5)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "fast"])
@pytest.mark.parametrize(
    "n,K,C,ties", [(2, 2, 2, False), (3, 3, 3, True), (37, 3, 2, True), (29, 10, 10, False)]
)
def test_cuda_matches_brute_force(dtype, n, K, C, ties):
    hs = HS if dtype == np.float64 else [0.01, 0.1, 10.0]
    logq, p, labels, scale, bias, u = _cuda_case(n, K, C, hs, dtype, seed=n, ties=ties)
    r0, r1 = (1, n - 1) if n > 10 else (0, n)
    kw = {"powers": 3, "pairs": True, "backend": "cuda", "rows": (r0, r1)}
    plain = _backends.loo_reduce(logq, p, labels, C, scale, bias, **kw)
    out = _backends.loo_reduce(logq, p, labels, C, scale, bias, resid=u, **kw)
    assert len(out) == 7
    for name, a, b in zip("mSQTD", plain, out):  # the same terms with or without resid
        if SIM:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=0, err_msg=name)
    ref = _brute(logq, p, labels, C, scale, bias, u, r0, r1, f64=True)
    tol_a, tol_u = _cuda_tols(dtype)
    if dtype == np.float64:
        _check(out[5], out[6], ref, tol_a, tol_u)
    else:  # fast mode: A relative to its row total (sum_k A_k = S_0), U to its |terms|
        tot = ref[1].sum(-1, keepdims=True)
        assert _rel(out[5], ref[1], tot) <= tol_a
        assert _rel(out[6], ref[2], ref[3]) <= tol_u


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "fast"])
def test_cuda_launches_centre_splits_and_variants(monkeypatch, splits, dtype):
    # several launches (the last short), centres split over blocks (merged), and two
    # query rows per thread with the (K, TILE) layout of the centre tile
    monkeypatch.setattr(cu, "LAUNCH_PAIRS", 11.0 * 30 * 2)
    monkeypatch.setattr(cu, "CENTRE_SPLITS", splits)
    monkeypatch.setattr(cu, "LEAN_SUMS", False)  # the general kernel's variants
    if splits == 1:
        monkeypatch.setattr(cu, "QUERIES_PER_THREAD", 2)
        monkeypatch.setattr(cu, "CENTRE_ROWS", False)
    hs = [0.02, 0.6] if dtype == np.float32 else [1e-3, 0.6]
    logq, p, labels, scale, bias, u = _cuda_case(30, 3, 3, hs, dtype, seed=5, ties=True)
    out = cu.loo_reduce(logq, p, labels, 3, scale, bias, 2, 2, 29, resid=u)
    plain = cu.loo_reduce(logq, p, labels, 3, scale, bias, 2, 2, 29)
    assert len(out) == 6
    for a, b in zip(plain, out):
        np.testing.assert_allclose(a, b, rtol=1e-13 if not SIM else 0, atol=0)
    ref = _brute(logq, p, labels, 3, scale, bias, u, 2, 29, f64=True)
    tol_a, tol_u = _cuda_tols(dtype)
    if dtype == np.float64:
        _check(out[4], out[5], ref, tol_a, tol_u, what=f"splits={splits}")
    else:
        assert _rel(out[4], ref[1], ref[1].sum(-1, keepdims=True)) <= tol_a
        assert _rel(out[5], ref[2], ref[3]) <= tol_u


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("pairs", [False, True], ids=["powers2", "pairs"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "fast"])
@pytest.mark.parametrize(
    "n,K,C,ties", [(2, 2, 2, False), (3, 3, 3, True), (37, 3, 2, True), (29, 10, 10, False)]
)
def test_cuda_lean_sums_match_brute_force_and_general_kernel(
    monkeypatch, pairs, dtype, n, K, C, ties
):
    # powers 2 with residual sums (the default residual estimate's pass) takes the lean
    # kernel with squared, pair and residual sums; several launches, the last one short
    monkeypatch.setattr(cu, "LAUNCH_PAIRS", 7.0 * n * 3)
    hs = HS if dtype == np.float64 else [0.01, 0.1, 10.0]
    logq, p, labels, scale, bias, u = _cuda_case(n, K, C, hs, dtype, seed=n + 1, ties=ties)
    r0, r1 = (1, n - 1) if n > 10 else (0, n)
    kw = {"powers": 2, "pairs": pairs, "backend": "cuda", "rows": (r0, r1)}
    lean = _backends.loo_reduce(logq, p, labels, C, scale, bias, resid=u, **kw)
    monkeypatch.setattr(cu, "LEAN_SUMS", False)
    gen = _backends.loo_reduce(logq, p, labels, C, scale, bias, resid=u, **kw)
    assert len(lean) == len(gen) == (7 if pairs else 6)
    ref = _brute(logq, p, labels, C, scale, bias, u, r0, r1, f64=True)
    tol_a, tol_u = _cuda_tols(dtype)
    A, U = lean[-2], lean[-1]
    if dtype == np.float64:
        _check(A, U, ref, tol_a, tol_u)
    else:  # fast mode: A relative to its row total (sum_k A_k = S_0), U to its |terms|;
        # U's squared weights double the log-weight's error (the general kernel's U errs
        # by 1.8e-6 to 2.5e-5 on such draws, the lean one's by 8e-6 to 2.8e-5)
        assert _rel(A, ref[1], ref[1].sum(-1, keepdims=True)) <= tol_a
        assert _rel(U, ref[2], ref[3]) <= 5 * tol_u
    # m, S, Q (and D) as the general kernel's; S relative to the row total, Q and D to
    # its square (classes far below the row maximum carry no weight)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert _rel(lean[0], gen[0], np.maximum(np.abs(gen[0]), 1.0)) <= tol
    tot = gen[1].sum(-1, keepdims=True)
    for i in (1, 2, 4) if pairs else (1, 2):
        assert _rel(lean[i], gen[i], tot if i == 1 else tot**2) <= tol, i


@pytest.mark.cuda
@needs_cuda
def test_cuda_batched_problems():
    n, K, B = 21, 2, 2
    probs, labs, us = zip(*(_points(n, K, K, seed=30 + b) for b in range(B)))
    ins = [_inputs(P, [0.05, 0.7]) for P in probs]
    logq, p, bias = (np.stack([x[i] for x in ins]) for i in (0, 1, 3))
    scale, labels, u = ins[0][2], np.stack(labs), np.stack(us)
    out = cu.loo_reduce(logq, p, labels, K, scale, bias, 1, 0, n, resid=u)
    assert out[4].shape == (B, 2, n, K) and out[5].shape == (B, 2, n)
    for b in range(B):
        ref = _brute(logq[b], p[b], labels[b], K, scale, bias[b], u[b])
        _check(out[4][b], out[5][b], ref, 1e-10, what=f"problem {b}")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("weighted", [False, True], ids=["labels", "weights"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "fast"])
def test_cuda_multi_matches_brute_force(weighted, dtype):
    n, K, C, B, h = 19, 3, 3, 11, 0.1  # B > one block of label sets under the simulator
    rng = np.random.default_rng(3)
    logq, p, labels, scale, bias, _ = _cuda_case(n, K, C, [h], dtype, seed=11)
    m = cu.loo_reduce(logq, p, labels, C, scale, bias, 1)[0][0]
    labs = rng.integers(0, C, (B, n)).astype(np.int64)
    weights = rng.poisson(1.0, (B, n)).astype(np.float64) if weighted else None
    u = rng.normal(size=(B, n))
    wts = np.ones((B, n)) if weights is None else weights
    args = (logq, p, m, labs, C, scale[0], bias[0], weights)
    kw = {"powers": 2, "backend": "cuda", "row_start": 2, "row_stop": n}
    plain = _backends.loo_reduce_multi(*args, **kw)
    out = _backends.loo_reduce_multi(*args, resid=u, **kw)
    assert len(out) == 3 and out[2].shape == (B, n - 2)
    for a, b in zip(plain, out):
        # to the last bit under the simulator; on a device the kernel compiled with the
        # residual sums may contract a multiply-add differently (1 ulp seen on an H200)
        np.testing.assert_allclose(a, b, rtol=1e-15, atol=0)
    rU, rUabs = _multi_ref(logq, p, m, scale[0], bias[0], wts, u, f64=True, weighted=weighted)
    tol = 1e-10 if dtype == np.float64 else 1e-5
    assert _rel(out[2], rU[2:].T, rUabs[2:].T) <= tol
