"""The numba twin of the fast binary engine (kdecal._engine.numba_binary).

Every accumulator of ``numba_binary.binary_reduce`` against (a) the compiled
``core.binary_reduce`` with the same method and inputs (the window method: the same
terms summed in another order, within 1e-13 relative; the binned and local methods: the
same cells, orders, groups, expansions and fallbacks, within the bound both keep, TOL;
every method: the same counters) and (b) the dense engine with the
tolerances of ``tests/engine/test_binary_engine.py`` (TOL = 1e-8 relative; the pair sums
D with the absolute floor ``n e^-64 Q`` of the dense engine's own truncation; centre
weights against the dense multi-label pass with its floor ``n e^-64 (1 + vmax^2)``).  The
class maxima ``m`` of both methods are the compiled core's bit for bit.  The inputs are
those of the compiled engine's tests: ties, scores exactly 0 and 1, all scores equal,
scores at 1 - 1e-12, n = 3 and 4, clusters near 1, at h from 1e-8 to 10.
"""

from __future__ import annotations

import numpy as np
import pytest

from _reference import adversarial_scores

pytest.importorskip("numba")
core = pytest.importorskip("kdecal._core")
if not hasattr(core, "binary_reduce"):
    pytest.skip("compiled core without the binary engine", allow_module_level=True)

from kdecal._engine import backends as _backends
from kdecal._engine import binary as kb
from kdecal._engine import engines as _engines
from kdecal._engine import numba_binary as nb

pytestmark = pytest.mark.numba

TOL = 1e-8  # against the dense engine (tests/engine/test_binary_engine.py)
TWIN = 1e-13  # window method against the compiled core's
NAMES = ("m", "S", "Q", "T", "D", "A", "U")
METHODS = ("window", "binned", "local")
WORST: dict[str, float] = {}  # largest differences seen (printed with -s)


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    """Print the largest differences the module's tests saw (shown with ``-s``)."""
    yield
    for key in sorted(WORST):
        print(f"{key:45s} {WORST[key]:.3g}")


def _max_rel(a, b, floor=None):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    d = np.abs(a - b)
    if floor is not None:
        d = np.where(d <= floor, 0.0, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d == 0, 0.0, d / np.abs(b))
    return float(r.max()) if r.size else 0.0


def _note(key, value):
    WORST[key] = max(WORST.get(key, 0.0), value)


def _inputs(x, hs):
    """logq, p, bias of the problems (1 - x, x) (x of shape (n,) or (B, n))."""
    return kb.binary_inputs(np.asarray(x, dtype=np.float64), np.asarray(hs, dtype=np.float64))


def _call(
    fn,
    logq,
    p,
    lab,
    C,
    scale,
    bias,
    method,
    powers=3,
    pairs=True,
    u=None,
    v=None,
    rows=None,
    residuals=None,
    threads=2,
    progress=None,
    ref_floor=0.0,
    weighted_rows=False,
):
    """fn (either engine's binary_reduce) with the arguments loo_reduce_k2 passes."""
    r0, r1 = (0, p.shape[-2]) if rows is None else rows
    return fn(
        logq,
        p,
        lab,
        C,
        scale,
        bias,
        powers=powers,
        row_start=r0,
        row_stop=r1,
        n_threads=threads,
        progress=progress,
        pairs=pairs,
        method=method,
        residuals=u is not None if residuals is None else residuals,
        u=u,
        cell_width=kb.CELL_WIDTH,
        plan=None,
        v=v,
        ref_floor=ref_floor,
        weighted_rows=weighted_rows,
    )


def _pair(
    x,
    y,
    C,
    hs,
    method,
    powers=3,
    pairs=True,
    u=None,
    v=None,
    rows=None,
    residuals=None,
    threads=2,
    ref_floor=0.0,
    weighted_rows=False,
):
    """Return (numba, compiled): both engines' outputs on the inputs of loo_reduce_k2.

    The binned method runs on shifted biases (kb.shifted_bias), as the dispatch passes
    them, and both results' m are shifted back.
    """
    logq, p, bias = _inputs(x, hs)
    lab = np.ascontiguousarray(np.atleast_2d(y), dtype=np.int64)
    scale = np.ascontiguousarray(1.0 / np.asarray(hs, dtype=np.float64))
    shift = np.zeros(bias.shape[:2])
    if method != "window":
        bias, shift = kb.shifted_bias(bias, scale)
    B, n = lab.shape
    uu = None if u is None else np.ascontiguousarray(np.broadcast_to(u, (B, n)), dtype=np.float64)
    vv = None if v is None else np.ascontiguousarray(np.broadcast_to(v, (B, n)), dtype=np.float64)
    args = (logq, p, lab, C, scale, bias, method, powers, pairs, uu, vv, rows, residuals, threads)
    kw = {"ref_floor": ref_floor, "weighted_rows": weighted_rows}
    a = list(_call(nb.binary_reduce, *args, **kw))
    c = list(_call(core.binary_reduce, *args, **kw))
    for r in (a, c):
        r[0] = np.asarray(r[0]) + shift[:, :, None]
    return a, c


def _check_twin(a, c, method, what):
    """Every output of the numba engine against the compiled one's (same method)."""
    assert len(a) == len(c) == 8, what
    assert set(a[7]) == set(c[7]), what
    # the same decisions per (query, class): the same counters
    assert a[7] == c[7], f"{what} stats {a[7]} != {c[7]}"
    assert np.array_equal(a[0], c[0]), f"{what} m"  # the same L and the same search
    tol = TWIN if method == "window" else TOL
    for k in range(1, 7):
        x, y = np.asarray(a[k]), np.asarray(c[k])
        assert x.shape == y.shape, f"{what} {NAMES[k]}"
        err = _max_rel(x, y)
        _note(f"{method} vs compiled {NAMES[k]}", err)
        assert err <= tol, f"{what} {NAMES[k]}: {err:.3g}"


def _check_dense(a, x, y, C, hs, powers, pairs, u, what, method):
    """Every accumulator of the numba engine against the dense engine (float64)."""
    logq, p, bias = _inputs(x, hs)
    lab = np.ascontiguousarray(np.atleast_2d(y), dtype=np.int64)
    n = lab.shape[1]
    uu = (
        None
        if u is None
        else np.ascontiguousarray(np.broadcast_to(u, lab.shape), dtype=np.float64)
    )
    scale = np.ascontiguousarray(1.0 / np.asarray(hs, dtype=np.float64))
    ex = _engines.dense_loo_reduce(
        "cpp", logq, p, lab, C, scale, bias, powers, 0, n, progress=False, pairs=pairs, resid=uu
    )
    m, mx = a[0], ex[0]
    assert np.array_equal(np.isfinite(m), np.isfinite(mx)), what
    fin = np.isfinite(mx)
    dm = np.abs(m[fin] - mx[fin]) / np.maximum(1.0, np.abs(mx[fin]))
    _note(f"{method} vs dense m", float(dm.max()) if dm.size else 0.0)
    if method == "window":  # the dense engine's own logs: its maxima, bit for bit
        assert np.array_equal(m[fin], mx[fin]), f"{what} m"
    assert np.all(dm <= TOL), f"{what} m"
    for k in range(1, 4):
        if k <= powers:
            err = _max_rel(a[k], ex[k])
            _note(f"{method} vs dense {NAMES[k]}", err)
            assert err <= TOL, f"{what} {NAMES[k]}: {err:.3g}"
    if pairs:
        floor = n * np.exp(-64.0) * ex[2]
        err = _max_rel(a[4], ex[4], floor)
        _note(f"{method} vs dense D", err)
        assert err <= TOL, f"{what} D: {err:.3g}"
    if u is not None:
        for k, name in ((-2, "A"), (-1, "U")):
            err = _max_rel(a[5 if name == "A" else 6], ex[k])
            _note(f"{method} vs dense {name}", err)
            assert err <= TOL, f"{what} {name}: {err:.3g}"


# ------------------------------------------------------------------ adversarial inputs
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("h", [1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0])
def test_adversarial_against_compiled_and_dense(method, h):
    rng = np.random.default_rng(6)
    for name, x in adversarial_scores().items():
        y = (rng.random(len(x)) < x).astype(np.int64)
        u = rng.random(len(x)) + 0.1
        what = f"{name} {method} h={h}"
        a, c = _pair(x, y, 2, [h], method, u=u)
        _check_twin(a, c, method, what)
        _check_dense(a, x, y, 2, [h], 3, True, u, what, method)
        # unlabelled (one class), powers = 1 without residuals
        z = np.zeros(len(x), np.int64)
        a, c = _pair(x, z, 1, [h], method, powers=1, pairs=False)
        _check_twin(a, c, method, what + " unlabelled")
        _check_dense(a, x, z, 1, [h], 1, False, None, what + " unlabelled", method)


@pytest.mark.parametrize("method", METHODS)
def test_powers_pairs_and_residual_options(method):
    rng = np.random.default_rng(1)
    n = 1500
    x = rng.random(n) ** 0.3
    y = (rng.random(n) < x).astype(np.int64)
    u = rng.random(n)
    hs = [3e-4, 2e-3, 0.05]  # H > 1
    for powers, pairs in [(1, False), (2, False), (2, True), (3, False), (3, True)]:
        for uu in (None, u):
            what = f"{method} powers={powers} pairs={pairs} u={uu is not None}"
            a, c = _pair(x, y, 2, hs, method, powers=powers, pairs=pairs, u=uu)
            _check_twin(a, c, method, what)
            if method == "local":  # the groups' expansions serve most (query, class)
                assert a[7]["groups_local"] > 0, what
                assert a[7]["rows_local"] > n, what
            assert a[2].shape == ((1, 3, n, 2) if powers >= 2 else (0, 0, 0))
            assert a[3].shape == ((1, 3, n, 2) if powers >= 3 else (0, 0, 0))
            assert a[4].shape == ((1, 3, n, 2) if pairs else (0, 0, 0))
            assert a[5].shape == ((1, 3, n, 2) if uu is not None else (0, 0, 0))
            assert a[6].shape == ((1, 3, n) if uu is not None else (0, 0, 0))
            _check_dense(a, x, y, 2, hs, powers, pairs, uu, what, method)
    # residuals without u: A, and an empty U (as the compiled core returns)
    a, c = _pair(x, y, 2, hs, method, powers=1, pairs=False, residuals=True)
    assert a[5].shape == (1, 3, n, 2) and a[6].shape == (0, 0, 0) == c[6].shape
    _check_twin(a, c, method, "residuals without u")
    # u without residuals: neither
    a, c = _pair(x, y, 2, hs, method, powers=1, pairs=False, u=u, residuals=False)
    assert a[5].shape == a[6].shape == (0, 0, 0)


def test_batched_classwise_problems_and_two_dimensional_inputs():
    rng = np.random.default_rng(2)
    z = 3.0 * rng.normal(size=(1200, 4))
    P = np.exp(z - z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    yy = np.array([rng.choice(4, p=q) for q in P])
    X = np.ascontiguousarray(P.T)  # (B, n): the one-vs-rest problems
    Y = (yy[None, :] == np.arange(4)[:, None]).astype(np.int64)
    u = rng.random((4, 1200))
    hs = [1e-3, 1e-2]
    for method in METHODS:
        a, c = _pair(X, Y, 2, hs, method, u=u)
        assert a[0].shape == (4, 2, 1200) and a[1].shape == (4, 2, 1200, 2)
        _check_twin(a, c, method, f"batched {method}")
        _check_dense(a, X, Y, 2, hs, 3, True, u, f"batched {method}", method)
        # a batch row equals its problem alone, and (n, 2) inputs give the batch's shapes
        # without B
        logq, p, bias = _inputs(X[1], hs)
        scale = np.ascontiguousarray(1.0 / np.asarray(hs))
        if method != "window":
            bias = kb.shifted_bias(bias, scale)[0]
        args = (logq[0], p[0], Y[1].copy(), 2, scale, np.ascontiguousarray(bias[0]), method)
        one = _call(nb.binary_reduce, *args, u=u[1].copy())
        ref = _call(core.binary_reduce, *args, u=u[1].copy())
        for k in range(7):
            assert one[k].shape == ref[k].shape, k
        shift = kb.shifted_bias(_inputs(X, hs)[2], scale)[1] if method != "window" else None
        for k in range(7):
            got = one[k] if k else one[0] + (0.0 if shift is None else shift[1][:, None])
            assert np.array_equal(got, a[k][1]), (method, k)


def test_large_clustered_and_all_equal():
    rng = np.random.default_rng(7)
    n = 3000
    x = np.concatenate([1 - rng.random(2200) * 1e-3, rng.beta(2, 2, 800)])
    y = (rng.random(n) < x).astype(np.int64)
    u = rng.random(n)
    for method in METHODS:
        a, c = _pair(x, y, 2, [2e-4, 0.02], method, powers=2, pairs=True, u=u)
        _check_twin(a, c, method, f"clustered {method}")
        _check_dense(a, x, y, 2, [2e-4, 0.02], 2, True, u, f"clustered {method}", method)
    x = np.full(n, 0.9)
    for method in METHODS:
        a, c = _pair(x, np.zeros(n, np.int64), 1, [1e-3], method, powers=2, pairs=True)
        _check_twin(a, c, method, f"all equal {method}")
        assert np.all(a[0] == a[0][0, 0, 0])
        np.testing.assert_allclose(a[1], n - 1.0, rtol=1e-12)
        np.testing.assert_allclose(a[4], (n - 1.0) * (n - 2.0), rtol=1e-12)


def test_one_point_and_lonely_classes():
    for method in METHODS:
        a, c = _pair(np.array([0.3]), np.array([1]), 2, [0.01], method)
        assert np.all(np.isneginf(a[0]))
        for k in range(7):
            assert np.array_equal(a[k], c[k]), (method, k)
        x = np.array([0.1, 0.4, 0.8, 0.9])
        y = np.array([0, 1, 1, 1])  # class 0 has a single centre: empty for its own query
        a, c = _pair(x, y, 2, [1e-3, 0.1], method)
        _check_twin(a, c, method, f"lonely {method}")
        _check_dense(a, x, y, 2, [1e-3, 0.1], 3, True, None, "lonely", method)


def test_signed_residual_weights():
    """u of any sign: U may cancel, so both engines' U are compared against the scale
    the bound is stated for, sum_i w_ij^2 |u_i| (the dense engine's U of |u|)."""
    rng = np.random.default_rng(31)
    x = np.concatenate([rng.beta(6, 1, 700), [0.0, 1.0, 1 - 1e-12], np.full(50, 0.5)])
    y = (rng.random(len(x)) < x).astype(np.int64)
    u = rng.random(len(x)) - 0.4
    hs = [1e-4, 1e-3, 0.05, 2.0]
    logq, p, bias = _inputs(x, hs)
    scale = np.ascontiguousarray(1.0 / np.asarray(hs))
    lab = y[None].copy()

    def dense(uu):
        return _engines.dense_loo_reduce(
            "cpp", logq, p, lab, 2, scale, bias, 2, 0, len(x), progress=False, resid=uu[None]
        )

    ex = dense(u)
    scale_u = dense(np.abs(u))[-1]
    for method in METHODS:
        a, c = _pair(x, y, 2, hs, method, powers=2, pairs=False, u=u)
        assert np.array_equal(a[0], c[0])
        for k in (1, 2, 5):
            assert _max_rel(a[k], c[k]) <= (TWIN if method == "window" else TOL), (method, k)
            assert _max_rel(a[k], ex[1 if k == 1 else (2 if k == 2 else 4)]) <= TOL, (method, k)
        twin = float(np.max(np.abs(a[6] - c[6]) / scale_u))
        err = float(np.max(np.abs(a[6] - ex[5]) / scale_u))
        _note(f"{method} signed U vs compiled (of sum w^2 |u|)", twin)
        _note(f"{method} signed U vs dense (of sum w^2 |u|)", err)
        assert twin <= (TWIN if method == "window" else TOL), method
        assert err <= TOL, method


# ------------------------------------------------------- centre weights (the bootstrap)
def _weighted_reference(x, y, h, v, u):
    """The dense multi-label pass: S with weights v, Q with v^2, A with v p, U with u."""
    logq, p, bias = _inputs(x, [h])
    logq, p, bias = logq[0], p[0], bias[0, 0]
    lab = np.ascontiguousarray(y[None], dtype=np.int64)
    m = _engines.dense_loo_reduce(
        "cpp", logq, p, lab[0], 2, np.array([1.0 / h]), bias[None], 1, 0, len(x), progress=False
    )[0][0]
    S, Q = _backends.loo_reduce_multi(
        logq, p, m, np.concatenate([lab, lab]), 2, 1.0 / h, bias, np.stack([v, v * v]), powers=2
    )[:2]
    zero = np.zeros((2, len(x)), np.int64)
    A = _backends.loo_reduce_multi(
        logq, p, m, zero, 1, 1.0 / h, bias, np.stack([v * p[:, 0], v * p[:, 1]])
    )[0][:, :, 0].T
    U = _backends.loo_reduce_multi(
        logq, p, m, zero[:1], 1, 1.0 / h, bias, np.ones((1, len(x))), powers=2, resid=u[None]
    )[2][0]
    return m, S[0], Q[1], A, U


@pytest.mark.parametrize("h", [1e-6, 1e-3, 0.3, 10.0])
def test_centre_weights_against_compiled_and_the_dense_multi_label_pass(h):
    rng = np.random.default_rng(21)
    cases = dict(adversarial_scores())
    cases["clustered_2000"] = np.concatenate([1 - rng.random(1600) * 1e-3, rng.beta(3, 1, 400)])
    for name, x in cases.items():
        n = len(x)
        y = (rng.random(n) < x).astype(np.int64)
        v = rng.poisson(1.0, n).astype(np.float64)  # many zero weights
        u = rng.random(n) * v * v
        m, S, Q, A, U = _weighted_reference(x, y, h, v, u)
        floor = n * np.exp(-64.0) * (1.0 + v.max() ** 2)
        for method in METHODS:
            what = f"{name} {method} h={h}"
            a, c = _pair(x, y, 2, [h], method, powers=2, pairs=False, u=u, v=v)
            _check_twin(a, c, method, what)
            fin = np.isfinite(m)
            assert np.array_equal(np.isfinite(a[0][0, 0]), fin), what
            assert np.all(np.abs(a[0][0, 0][fin] - m[fin]) <= TOL * np.maximum(1, np.abs(m[fin])))
            for got, ref, nm in ((a[1], S, "S"), (a[2], Q, "Q"), (a[5], A, "A"), (a[6], U, "U")):
                err = _max_rel(got[0, 0], ref, floor)
                _note(f"{method} weighted vs dense {nm}", err)
                assert err <= TOL, f"{what} {nm}: {err:.3g}"
            # powers = 1 without residuals
            a, c = _pair(x, y, 2, [h], method, powers=1, pairs=False, v=v)
            _check_twin(a, c, method, what + " powers=1")


@pytest.mark.parametrize("method", ["window", "binned", "local"])
def test_label_weights_with_the_floor_against_compiled(method):
    # the consistency replicates' call (kb.consistency_sums): one class, the labels as
    # centre weights, ref_floor = 1: the same decisions as the compiled engine's (the
    # same counters) and the same sums within the bound; without the floor a one-vs-rest
    # problem whose positive labels are rare sends rows to deep exact windows
    rng = np.random.default_rng(31)
    x = np.concatenate([rng.beta(0.3, 6.0, 2500), 1 - rng.random(300) * 1e-3])
    ystar = (rng.random(x.size) < x).astype(np.float64)
    zeros = np.zeros(x.size, dtype=np.int64)
    u = (ystar - np.clip(x, 1e-12, 1 - 1e-12)) ** 2
    for h in (1e-3, 0.02):
        a, c = _pair(
            x, zeros, 1, [h], method, 1, False, u=u, v=ystar, residuals=True, ref_floor=1.0
        )
        _check_twin(a, c, method, f"label weights {method} h={h}")
        if method != "window":
            _, c0 = _pair(x, zeros, 1, [h], method, 1, False, u=u, v=ystar, residuals=True)
            assert c[7]["pairs_fallback"] <= c0[7]["pairs_fallback"], h
    with pytest.raises(ValueError, match="ref_floor"):
        _pair(x, zeros, 1, [1e-3], method, 1, False, v=ystar, ref_floor=-1.0)


@pytest.mark.parametrize("method", METHODS)
def test_weighted_rows_leave_the_undrawn_rows_out(method):
    # weighted_rows (a bootstrap replicate's call): the rows drawn (v > 0) bit-identical
    # to the call without it, on both engines; the others the outputs of a row without
    # centres (m = -inf, every sum 0); the twins make the same decisions (counters)
    rng = np.random.default_rng(41)
    x = np.concatenate([1 - rng.random(1500) * 1e-3, rng.beta(2, 2, 500), [0.5, 0.5]])
    y = (rng.random(len(x)) < x).astype(np.int64)
    v = rng.poisson(1.0, len(x)).astype(np.float64)
    v[-2:] = [0.0, 3.0]  # a tie: one copy drawn, the other not
    u = rng.random(len(x)) * v * v
    drawn = v > 0
    for h in (2e-4, 0.02):
        for powers, uu in ((2, u), (1, None)):
            full = _pair(x, y, 2, [h], method, powers=powers, pairs=False, u=uu, v=v)
            a, c = _pair(
                x, y, 2, [h], method, powers=powers, pairs=False, u=uu, v=v, weighted_rows=True
            )
            what = f"{method} h={h} powers={powers}"
            _check_twin(a, c, method, what)
            for got, ref in zip((a, c), full):
                for k in range(7):
                    g, r = np.asarray(got[k]), np.asarray(ref[k])
                    if g.size == 0:
                        continue
                    assert np.array_equal(g[:, :, drawn], r[:, :, drawn]), (what, k)
                    left = g[:, :, ~drawn]
                    assert np.all(left == (-np.inf if k == 0 else 0.0)), (what, k)
            assert c[7]["rows_local"] <= full[1][7]["rows_local"], what
    with pytest.raises(ValueError, match="weighted_rows=True needs v"):
        _pair(x, y, 2, [1e-3], method, powers=1, pairs=False, weighted_rows=True)


def test_unit_and_zero_centre_weights():
    rng = np.random.default_rng(22)
    x = np.concatenate([1 - rng.random(1500) * 1e-3, rng.beta(2, 2, 500)])
    y = (rng.random(len(x)) < x).astype(np.int64)
    u = rng.random(len(x))
    for method in METHODS:
        for h in (2e-4, 0.02):
            a, _ = _pair(x, y, 2, [h], method, powers=2, pairs=False, u=u)
            b, _ = _pair(x, y, 2, [h], method, powers=2, pairs=False, u=u, v=np.ones(len(x)))
            for k in range(7):
                assert np.array_equal(a[k], b[k]), (method, h, k)
        # all weights zero: every weighted sum 0, m and U as without weights
        a, c = _pair(x, y, 2, [1e-3], method, powers=2, pairs=False, u=u, v=np.zeros(len(x)))
        b, _ = _pair(x, y, 2, [1e-3], method, powers=2, pairs=False, u=u)
        assert np.all(a[1] == 0) and np.all(a[2] == 0) and np.all(a[5] == 0)
        assert np.array_equal(a[0], b[0])
        # (U: the windows of the weighted call go deeper, and the binned sums keep their bound)
        assert _max_rel(a[6], b[6]) <= (TWIN if method == "window" else TOL), method
        _check_twin(a, c, method, f"zero weights {method}")


def test_without_the_compiled_core_as_the_numba_dense_engine(monkeypatch):
    """Without the compiled core the log-kernel is unfused, as the numba dense engine's:
    its class maxima bit for bit, its sums to rounding (the window method) or within the
    bound (binned)."""
    rng = np.random.default_rng(3)
    cases = {
        "beta": rng.beta(5, 1, 1500),
        "ties": np.round(rng.beta(4, 1, 400), 2),
        "near_one": np.concatenate(
            [np.full(10, 1 - 1e-12), 1 - rng.random(100) * 1e-6, rng.beta(8, 1, 200)]
        ),
    }
    hs = np.array([1e-6, 1e-3, 0.05, 2.0])
    for name, x in cases.items():
        n = len(x)
        y = (rng.random(n) < x).astype(np.int64)
        u = rng.random((1, n))
        logq, p, bias = _inputs(x, hs)  # (the bias from the compiled core, as the estimators')
        lab = y[None].copy()
        scale = np.ascontiguousarray(1.0 / hs)
        ex = _engines.engine("numba").loo_reduce(
            logq, p, lab, 2, scale, bias, 2, 0, n, pairs=True, resid=u
        )
        with monkeypatch.context() as mp:
            mp.setattr(nb._runtime, "_core", None)
            assert not nb.fused_kernel()
            outs = {
                method: _call(nb.binary_reduce, logq, p, lab, 2, scale, bias, method, 2, u=u)
                for method in METHODS
            }
        floor = n * np.exp(-64.0) * ex[2]
        for method, a in outs.items():
            tol = TWIN if method == "window" else TOL
            assert np.array_equal(a[0], ex[0]), (name, method)
            for k, e, fl in (
                (1, 1, None),
                (2, 2, None),
                (4, 4, floor),
                (5, 5, None),
                (6, 6, None),
            ):
                err = _max_rel(a[k], ex[e], fl)
                _note(f"{method} (no core) vs numba dense {NAMES[k]}", err)
                assert err <= tol, (name, method, NAMES[k], err)


# ------------------------------------------------------- rows, threads, progress
def test_rows_threads_and_chunks_are_bit_identical(monkeypatch):
    rng = np.random.default_rng(10)
    n = 3000
    x = rng.beta(3, 1, n)
    y = (rng.random(n) < x).astype(np.int64)
    u = rng.random(n)
    for method in METHODS:
        one, _ = _pair(x, y, 2, [1e-3, 0.03], method, u=u, threads=1)
        two, _ = _pair(x, y, 2, [1e-3, 0.03], method, u=u, threads=2)
        part, _ = _pair(x, y, 2, [1e-3, 0.03], method, u=u, rows=(700, 1900))
        empty, _ = _pair(x, y, 2, [1e-3, 0.03], method, u=u, rows=(5, 5))
        for k in range(7):
            assert np.array_equal(one[k], two[k]), (method, k)
            if one[k].shape != (0, 0, 0):
                assert np.array_equal(one[k][:, :, 700:1900], part[k]), (method, k)
                assert empty[k].shape[2] == 0
        assert one[7] == two[7]
        monkeypatch.setattr(nb, "CHUNK_SECONDS", 1e-9)  # chunks of the least size
        seen: list[int] = []
        logq, p, bias = _inputs(x, [1e-3, 0.03])
        scale = np.ascontiguousarray(1.0 / np.array([1e-3, 0.03]))
        if method != "window":
            bias = kb.shifted_bias(bias, scale)[0]
        small = _call(
            nb.binary_reduce,
            logq,
            p,
            y[None].copy(),
            2,
            scale,
            bias,
            method,
            u=u[None].copy(),
            progress=seen.append,
        )
        monkeypatch.undo()
        assert len(seen) > 4 and seen == sorted(set(seen)) and seen[-1] == 2 * n
        for k in range(1, 7):
            assert np.array_equal(small[k], one[k]), (method, k)


def test_progress_stops_on_an_exception():
    rng = np.random.default_rng(12)
    x = rng.beta(4, 1, 2000)
    logq, p, bias = _inputs(x, [1e-3, 1e-2])
    calls = []

    def stop(done):
        calls.append(done)
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        lab = np.zeros((1, 2000), np.int64)
        sc = np.array([1e3, 1e2])
        _call(nb.binary_reduce, logq, p, lab, 1, sc, bias, "window", 1, False, progress=stop)
    assert len(calls) == 1  # no chunk ran after the callback raised


# --------------------------------------------------------------------- bad arguments
def test_bad_arguments_raise():
    x = np.array([0.1, 0.5, 0.9, 0.95])
    y = np.array([[0, 1, 1, 1]], np.int64)
    logq, p, bias = _inputs(x, [0.1])
    sc = np.array([10.0])

    def call(**kw):
        args = {
            "logq": logq,
            "p": p,
            "labels": y,
            "n_classes": 2,
            "scale": sc,
            "bias": bias,
            "powers": 1,
            "row_start": 0,
            "row_stop": 4,
            "method": "window",
        }
        args.update(kw)
        return nb.binary_reduce(**args)

    call()  # the good call runs
    for method in ("binned", "local"):
        call(method=method)
    with pytest.raises(ValueError, match="method"):
        call(method="dense")
    with pytest.raises(ValueError, match="K = 2"):
        call(logq=np.zeros((1, 4, 3)), p=np.zeros((1, 4, 3)))
    with pytest.raises(ValueError, match="same shape"):
        call(logq=np.zeros((1, 5, 2)))
    with pytest.raises(ValueError, match="both"):
        call(logq=logq[0])
    with pytest.raises(TypeError):
        call(logq=logq.astype(np.float32))
    with pytest.raises(TypeError):
        call(labels=y.astype(np.int32))
    with pytest.raises(ValueError, match="labels must have shape"):
        call(labels=np.zeros((1, 3), np.int64))
    with pytest.raises(ValueError, match="label 2"):
        call(labels=np.array([[0, 2, 1, 1]], np.int64))
    with pytest.raises(ValueError, match="scale must be 1-D"):
        call(scale=np.array([[10.0]]))
    with pytest.raises(ValueError, match="scale must be finite"):
        call(scale=np.array([0.0]))
    with pytest.raises(ValueError, match="bias must have shape"):
        call(bias=np.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="bias must be finite"):
        call(bias=np.full((1, 1, 4), np.nan))
    with pytest.raises(ValueError, match="row_start"):
        call(row_start=2, row_stop=5)
    with pytest.raises(ValueError, match="row_start"):
        call(row_start=3, row_stop=2)
    with pytest.raises(ValueError, match="powers"):
        call(powers=4)
    with pytest.raises(ValueError, match="pairs"):
        call(powers=1, pairs=True)
    with pytest.raises(ValueError, match="n_classes"):
        call(n_classes=0)
    bad = p.copy()
    bad[0, 1, 1] = 1.5
    with pytest.raises(ValueError, match="p must lie"):
        call(p=bad)
    badq = logq.copy()
    badq[0, 2, 0] = np.inf
    with pytest.raises(ValueError, match="logq must be finite"):
        call(logq=badq)
    with pytest.raises(ValueError, match="u must have shape"):
        call(residuals=True, u=np.ones((1, 3)))
    with pytest.raises(ValueError, match="u must be finite"):
        call(residuals=True, u=np.array([[1.0, np.nan, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="v must have shape"):
        call(v=np.ones((1, 3)))
    with pytest.raises(ValueError, match="v must be finite and >= 0"):
        call(v=np.array([[1.0, -1.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="powers <= 2"):
        call(powers=3, v=np.ones((1, 4)))
    with pytest.raises(ValueError, match="powers <= 2"):
        call(powers=2, pairs=True, v=np.ones((1, 4)))
    with pytest.raises(ValueError, match="cell_width"):
        call(cell_width=0.0)


# --------------------------------------------- the numba backend reaches the twin


def test_numba_backend_runs_binary_problems_on_the_twin(monkeypatch):
    """``backend="numba"`` sends binary problems of n >= BINARY_MIN_N to the twin (through
    ``backends.loo_reduce``, the estimators and the bootstrap's replicates), whose
    accumulators and estimates equal the compiled fast engine's within its bound and the
    dense numba engine's within TOL; below BINARY_MIN_N the dense loop runs."""
    import kdecal
    from kdecal._estimation import replicates as _replicates

    calls = []
    real = nb.binary_reduce

    def counted(*args, **kwargs):
        calls.append(args[12])  # the method of each call
        return real(*args, **kwargs)

    monkeypatch.setattr(nb, "binary_reduce", counted)
    rng = np.random.default_rng(5)
    n = max(_backends.BINARY_MIN_N, _replicates.BINARY_REPLICATES_MIN_N)
    x = rng.beta(6.0, 1.5, size=n)
    lab = (rng.random(n) < x).astype(np.int64)
    hs = np.array([3e-3, 2e-2])
    logq, p, bias = kb.binary_inputs(x, hs)
    args = (logq[0], p[0], lab, 2, 1.0 / hs, bias[0])
    got = _backends.loo_reduce(*args, powers=2, backend="numba", pairs=True)
    assert calls and set(calls) <= {"window", "binned", "local"}
    want = _backends.loo_reduce(*args, powers=2, backend="cpp", pairs=True)
    dense = _engines.dense_loo_reduce("numba", *args, 2, 0, n, progress=False, pairs=True)
    for name, a, b, d in zip(NAMES, got, want, dense):
        assert _max_rel(a, b) <= TOL, name
        floor = n * np.exp(-64.0) * np.asarray(dense[2]) if name == "D" else None
        assert _max_rel(a, d, floor) <= TOL, name
    calls.clear()
    small = _backends.loo_reduce(
        logq[0, :100], p[0, :100], lab[:100], 2, 1.0 / hs, bias[0, :, :100], backend="numba"
    )
    assert not calls and small[1].shape == (2, 100, 2)

    P = np.stack([1.0 - x, x], axis=1)
    for notion in ("top_label", "classwise"):
        est_n = kdecal.estimate(P, lab, calibration=notion, bandwidth=0.01, backend="numba")
        est_c = kdecal.estimate(P, lab, calibration=notion, bandwidth=0.01, backend="cpp")
        for q in ("ece_kde_l1", "ce_l2"):
            assert est_n.value(q) == pytest.approx(est_c.value(q), rel=1e-8, abs=1e-12)
        calls.clear()
        ci_n = est_n.confidence_interval("ce_l2", n_resamples=3, seed=1)
        assert calls  # the replicates ran on the twin
        ci_c = est_c.confidence_interval("ce_l2", n_resamples=3, seed=1)
        np.testing.assert_allclose(
            ci_n.bootstrap_distribution, ci_c.bootstrap_distribution, rtol=1e-7, atol=1e-12
        )
