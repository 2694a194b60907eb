"""The fast engine of binary problems (kdecal._engine.binary) against the dense engine.

Every accumulator of the window, binned and local methods must be within 1e-8 relative of the
dense engine (``_backends.loo_reduce``, float64) on synthetic, real and adversarial
inputs; ``method="exact"`` must be the dense engine bit for bit.  The pair sums D get an
absolute floor of ``n e^-64 Q``: the dense engine's own truncation (it drops chunks of
centres more than 64 nats below a class maximum and clamps exp arguments at -230), which
is all that is left of D when a class maximum stands more than ~45 nats above every other
centre of its class.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from _reference import adversarial_scores
from conftest import load_real_file

core = pytest.importorskip("kdecal._core")
if not hasattr(core, "binary_reduce"):
    pytest.skip("compiled core without the binary engine", allow_module_level=True)

from kdecal._engine import backends as _backends
from kdecal._engine import binary as kb
from kdecal._engine import runtime as _runtime

TOL = 1e-8


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _max_rel(a, b, floor=None):
    a, b = np.asarray(a), np.asarray(b)
    d = np.abs(a - b)
    if floor is not None:
        d = np.where(d <= floor, 0.0, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d == 0, 0.0, d / np.abs(b))
    return float(r.max()) if r.size else 0.0


def _assert_close(out, ex, n, what=""):
    m, mx = out[0], ex[0]
    assert np.array_equal(np.isfinite(m), np.isfinite(mx)), what
    fin = np.isfinite(mx)
    assert np.all(np.abs(m[fin] - mx[fin]) <= TOL * np.maximum(1.0, np.abs(mx[fin]))), what
    for k, name in enumerate("SQT", start=1):
        if ex[k].size:
            assert _max_rel(out[k], ex[k]) <= TOL, f"{what} {name}"
    if len(ex) > 4:
        floor = n * np.exp(-64.0) * ex[2]
        assert _max_rel(out[4], ex[4], floor) <= TOL, f"{what} D"


def _run(x, y, C, hs, method, powers=3, pairs=True, **kw):
    return kb.loo_reduce_binary(x, y, C, hs, powers=powers, pairs=pairs, method=method, **kw)


def _compare(x, y, C, hs, powers=3, pairs=True, methods=("window", "binned", "local"), what=""):
    ex = _run(x, y, C, hs, "exact", powers, pairs)
    for method in methods:
        out = _run(x, y, C, hs, method, powers, pairs)
        _assert_close(out, ex, np.shape(x)[-1], f"{what} {method} h={hs}")


# ------------------------------------------------------------------- synthetic data
@pytest.mark.parametrize("h", [1e-4, 1e-3, 1e-2, 0.3])
def test_synthetic_top_label(h):
    rng = np.random.default_rng(0)
    x = rng.beta(5, 1, 3000)
    y = (rng.random(3000) < x).astype(np.int64)
    _compare(x, y, 2, [h])


def test_several_bandwidths_and_powers():
    rng = np.random.default_rng(1)
    x = rng.random(1500) ** 0.3
    y = (rng.random(1500) < x).astype(np.int64)
    hs = [3e-4, 2e-3, 0.05]
    for powers, pairs in [(1, False), (2, False), (2, True), (3, False)]:
        _compare(x, y, 2, hs, powers=powers, pairs=pairs, what=f"powers={powers}")
    _compare(x, np.zeros_like(y), 1, hs, what="unlabelled")


def test_batched_classwise_problems():
    rng = np.random.default_rng(2)
    P = _softmax(3.0 * rng.normal(size=(1200, 4)))
    y = np.array([rng.choice(4, p=p) for p in P])
    X = np.ascontiguousarray(P.T)  # (B, n): the one-vs-rest problems
    Y = (y[None, :] == np.arange(4)[:, None]).astype(np.int64)
    ex = _run(X, Y, 2, [1e-3, 1e-2], "exact")
    for method in ("window", "binned", "local"):
        out = _run(X, Y, 2, [1e-3, 1e-2], method)
        assert out[0].shape == ex[0].shape == (4, 2, 1200)
        _assert_close(out, ex, 1200, method)
        for b in range(4):  # a batch row equals its problem alone
            one = _run(X[b], Y[b], 2, [1e-3, 1e-2], method)
            for k in range(5):
                assert np.array_equal(one[k], out[k][b])


# ------------------------------------------------------------------------ real data
@pytest.mark.parametrize(
    "fname", ["cifar10_resnet50_psrcal.npz", "sst2_gpt2_zeroshot.npz", "agnews_gpt2_zeroshot.npz"]
)
def test_real_files(fname):
    kind = "logits"
    prefix = "test_" if fname.startswith("cifar10") else ""
    P, _, y = load_real_file(fname, prefix, kind)
    idx = np.random.default_rng(3).choice(len(y), min(len(y), 2500), replace=False)
    P, y = P[idx], y[idx]
    top = P.max(axis=1)
    correct = (P.argmax(axis=1) == y).astype(np.int64)
    for h in (2e-4, 1e-3, 1e-2):
        _compare(top, correct, 2, [h], what=f"{fname} top-label")
    X = np.ascontiguousarray(P.T[:2])
    Y = (y[None, :] == np.arange(2)[:, None]).astype(np.int64)
    _compare(X, Y, 2, [1e-3], what=f"{fname} class-wise")


# ------------------------------------------------------------------ adversarial inputs


@pytest.mark.parametrize("name", list(adversarial_scores()))
@pytest.mark.parametrize("h", [1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0])
def test_adversarial(name, h):
    x = adversarial_scores()[name]
    y = (np.random.default_rng(6).random(len(x)) < x).astype(np.int64)
    _compare(x, y, 2, [h], what=name)


def test_adversarial_unlabelled():
    for name, x in adversarial_scores().items():
        _compare(x, np.zeros(len(x), np.int64), 1, [1e-6, 1e-3, 0.05], what=name)


def test_one_point_and_lonely_classes():
    out = _run(np.array([0.3]), np.array([1]), 2, [0.01], "binned")
    ex = _run(np.array([0.3]), np.array([1]), 2, [0.01], "exact")
    assert np.array_equal(out[0], ex[0]) and np.all(np.isneginf(out[0]))
    for k in range(1, 5):
        assert np.array_equal(out[k], ex[k])
    x = np.array([0.1, 0.4, 0.8, 0.9])
    y = np.array([0, 1, 1, 1])  # class 0 has a single centre: empty for its own query
    _compare(x, y, 2, [1e-3, 0.1])


def test_large_n_all_equal_and_clustered():
    rng = np.random.default_rng(7)
    x = np.full(20000, 0.9)
    out = _run(x, np.zeros(20000, np.int64), 1, [1e-3], "binned", powers=2, pairs=True)
    assert np.all(out[0] == out[0][0, 0])
    np.testing.assert_allclose(out[1], 19999.0, rtol=1e-12)
    np.testing.assert_allclose(out[4], 19999.0 * 19998.0, rtol=1e-12)
    x = np.concatenate([1 - rng.random(15000) * 1e-3, rng.beta(2, 2, 5000)])
    y = (rng.random(20000) < x).astype(np.int64)
    ex = _run(x, y, 2, [2e-4], "exact", powers=2)
    for method in ("binned", "local"):
        out = _run(x, y, 2, [2e-4], method, powers=2)
        _assert_close(out, ex, 20000, f"clustered 20000 {method}")


# --------------------------------------------------------------------- residual sums
def _dense_residuals(x, y_unused, h, u):
    logq, p, bias = kb.binary_inputs(x, [h])
    logq, p, bias = logq[0], p[0], bias[0, 0]
    L = bias[None, :] + (1.0 / h) * (logq[:, :1] * p[None, :, 0] + logq[:, 1:] * p[None, :, 1])
    np.fill_diagonal(L, -np.inf)
    w = np.exp(L - L.max(axis=1, keepdims=True))
    return w @ p, (w * w) @ u


@pytest.mark.parametrize("h", [1e-4, 1e-3, 0.05, 2.0])
def test_residual_sums(h):
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.beta(6, 1, 700), [0.0, 1.0, 1 - 1e-12]])
    y = (rng.random(len(x)) < x).astype(np.int64)
    u = rng.random(len(x)) + 0.1
    A_ref, U_ref = _dense_residuals(x, y, h, u)
    ex = _run(x, y, 2, [h], "exact")
    for method in ("window", "binned", "local"):
        out = _run(x, y, 2, [h], method, resid=u)
        assert len(out) == 7
        _assert_close(out[:5], ex, len(x), method)
        assert _max_rel(out[5][0], A_ref) <= TOL
        assert _max_rel(out[6][0], U_ref) <= TOL


@pytest.mark.parametrize(
    "h, powers, pairs, resid, share",
    [(1e-3, 1, False, False, 0.85), (2e-4, 3, True, True, 0.7), (0.1, 3, True, True, 0.85)],
)
def test_local_expansions_serve_the_rows(h, powers, pairs, resid, share):
    """The local method answers most (query, class) pairs from its groups' series.

    (The rest: groups of fewer than 4 points, and the pair sums' own-precision check near
    the cluster at 1, go to the binned and window methods.)
    """
    rng = np.random.default_rng(13)
    n = 6000
    x = np.concatenate([rng.beta(8, 1, n - 1000), 1 - rng.random(1000) * 1e-4])
    y = (rng.random(n) < x).astype(np.int64)
    u = rng.random(n) + 0.1 if resid else None
    logq, p, bias = kb.binary_inputs(x, [h])
    args = (logq, p, y[None].copy(), 2, 1.0 / np.array([h]), bias)
    stats: dict[str, int] = {}
    out = kb.loo_reduce_k2(
        *args,
        powers=powers,
        pairs=pairs,
        method="local",
        stats=stats,
        u=None if u is None else u[None],
    )
    assert stats["groups_local"] > 0
    assert stats["rows_local"] >= share * 2 * n, stats
    ex = kb.loo_reduce_k2(*args, powers=powers, pairs=pairs, method="exact")
    first = [a[0] if a.size else a for a in out]
    _assert_close(first[: len(ex)], [a[0] if a.size else a for a in ex], n, f"local h={h}")
    if resid:
        A_ref, U_ref = _dense_residuals(x, y, h, u)
        assert _max_rel(out[-2][0, 0], A_ref) <= TOL
        assert _max_rel(out[-1][0, 0], U_ref) <= TOL


def test_plans_are_bit_identical_and_check_the_bias():
    """A search's plan (one sort, cached cells) changes no bit; a changed bias is not reused."""
    rng = np.random.default_rng(14)
    x = rng.beta(5, 1, 4000)
    y = (rng.random(4000) < x).astype(np.int64)
    u = rng.random((1, 4000))
    hs = np.array([1e-3, 0.03])
    logq, p, bias = kb.binary_inputs(x, hs)
    lab = y[None].copy()
    args = (logq, p, lab, 2, 1.0 / hs, bias)
    other = bias.copy()
    other[0, 0, 17] += 1e-3  # not the kernel's bias: must not meet the cached cells

    def calls():
        parts = [
            kb.loo_reduce_k2(*args, powers=3, pairs=True, method=m, rows=r)
            for m in ("local", "binned", "window")
            for r in ((0, 1500), (1500, 4000))
        ]
        parts.append(kb.loo_reduce_k2(*args, powers=2, pairs=True, method="local", u=u))
        parts.append(kb.loo_reduce_k2(*args[:5], other, powers=1, method="local"))
        return parts

    plain = calls()
    with kb.reuse_plans():
        again = calls()
        held = kb._PLANS.get()
        assert held is not None and len(held) == 1
        assert kb._plan(core, logq, p, lab, 2) is held[0][4]  # the same plan, found again
    assert kb._PLANS.get() is None
    for a, b in zip(plain, again):
        for u_, v in zip(a, b):
            assert np.array_equal(u_, v)
    # the changed bias gave its own sums (those of the changed bias, not the cached ones)
    assert not np.array_equal(plain[-1][1], kb.loo_reduce_k2(*args, powers=1, method="local")[1])


# ------------------------------------------------------------- exactness and plumbing
def test_exact_is_the_dense_engine():
    rng = np.random.default_rng(9)
    x = rng.random(500)
    y = (rng.random(500) < x).astype(np.int64)
    hs = np.array([1e-3, 0.02])
    out = _run(x, y, 2, hs, "exact")
    logq, p, bias = kb.binary_inputs(x, hs)
    ref = _backends.loo_reduce(
        logq, p, y[None].copy(), 2, 1.0 / hs, bias, powers=3, backend="cpp", pairs=True
    )
    for a, b in zip(out, ref):
        assert np.array_equal(a, b[0])


def test_rows_and_threads():
    rng = np.random.default_rng(10)
    x = rng.beta(3, 1, 3000)
    y = (rng.random(3000) < x).astype(np.int64)
    saved = _runtime.get_num_threads()
    try:
        for method in ("window", "binned", "local", "auto"):
            _runtime.set_num_threads(1)
            one = _run(x, y, 2, [1e-3, 0.03], method)
            _runtime.set_num_threads(2)
            two = _run(x, y, 2, [1e-3, 0.03], method)
            part = _run(x, y, 2, [1e-3, 0.03], method, rows=(700, 1900))
            for a, b, c in zip(one, two, part):
                assert np.array_equal(a, b)
                assert np.array_equal(a[:, 700:1900], c)
    finally:
        _runtime.set_num_threads(saved)


def test_auto_picks_a_method_and_agrees():
    rng = np.random.default_rng(11)
    x = rng.beta(5, 1, 2000)
    y = (rng.random(2000) < x).astype(np.int64)
    _compare(x, y, 2, [1e-7, 1e-3, 0.2], methods=("auto",))
    _, p, _ = kb.binary_inputs(x, [1e-3])
    assert kb.choose_method(p, y[None], 2, 1e-8) == "window"
    assert kb.choose_method(p, y[None], 2, 1e-3) in ("window", "local")


def test_bad_inputs():
    x = np.array([0.1, 0.5, 0.9])
    y = np.array([0, 1, 1])
    with pytest.raises(ValueError, match="method"):
        kb.loo_reduce_binary(x, y, 2, [0.1], method="fast")
    with pytest.raises(ValueError, match="hs"):
        kb.loo_reduce_binary(x, y, 2, [0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        kb.loo_reduce_binary(np.array([0.1, np.nan, 0.3]), y, 2, [0.1])
    with pytest.raises(ValueError, match="label"):
        kb.loo_reduce_binary(x, np.array([0, 2, 1]), 2, [0.1], method="binned")
    with pytest.raises(ValueError, match="labels must be"):
        kb.loo_reduce_binary(x, np.array([0, 1]), 2, [0.1], method="binned")
    with pytest.raises(ValueError, match="pairs"):
        kb.loo_reduce_binary(x, y, 2, [0.1], powers=1, pairs=True, method="window")
    with pytest.raises(ValueError, match="row"):
        kb.loo_reduce_binary(x, y, 2, [0.1], rows=(2, 5), method="binned")
    logq, p, bias = kb.binary_inputs(x, [0.1])
    lab = y[None].copy()
    with pytest.raises(ValueError, match="K = 2"):
        core.binary_reduce(
            np.zeros((1, 3, 3)), np.zeros((1, 3, 3)), lab, 2, np.array([10.0]), bias
        )
    with pytest.raises(TypeError):
        core.binary_reduce(logq.astype(np.float32), p, lab, 2, np.array([10.0]), bias)
    bad = p.copy()
    bad[0, 1, 1] = 1.5
    with pytest.raises(ValueError, match="p must lie"):
        core.binary_reduce(logq, bad, lab, 2, np.array([10.0]), bias)
    with pytest.raises(ValueError, match="method"):
        core.binary_reduce(logq, p, lab, 2, np.array([10.0]), bias, method="dense")


def test_progress_and_stop():
    rng = np.random.default_rng(12)
    x = rng.beta(4, 1, 2000)
    y = (rng.random(2000) < x).astype(np.int64)
    hs = np.array([1e-3, 1e-2])
    logq, p, bias = kb.binary_inputs(x, hs)
    lab = y[None].copy()
    args = (logq, p, lab, 2, 1.0 / hs, bias, 2, 100, 1900, 2)
    for method in ("binned", "local"):
        seen = []
        with_bar = core.binary_reduce(*args, seen.append, True, method)
        without = core.binary_reduce(*args, None, True, method)
        assert seen and seen[-1] == 2 * 1800 and seen == sorted(seen)
        for a, b in zip(with_bar[:7], without[:7]):
            assert np.array_equal(a, b)

    # a watched call (work >= WATCH_MIN_WORK) stops when the callback raises
    x = rng.beta(4, 1, 20000)
    hs = np.geomspace(1e-3, 0.1, 12)
    logq, p, bias = kb.binary_inputs(x, hs)

    def stop(done):
        raise RuntimeError("stop")

    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="stop"):
        core.binary_reduce(
            logq, p, np.zeros((1, 20000), np.int64), 1, 1.0 / hs, bias, 1, 0, 20000, 2, stop
        )
    assert time.perf_counter() - t0 < 30


# ------------------------------------------------------------------ the dispatch
def test_loo_reduce_runs_large_binary_problems_on_the_fast_engine(monkeypatch):
    """n >= BINARY_MIN_N: every accumulator within 1e-8 of the dense loop, m within a
    few units in the last place (the cell methods' shifted biases, binary.shifted_bias);
    BINARY_METHOD = "exact" (KDECAL_BINARY_METHOD) keeps the dense loop."""
    import kdecal
    from kdecal._engine import backends as _backends

    rng = np.random.default_rng(7)
    n = _backends.BINARY_MIN_N + 500
    x = np.concatenate([1.0 - rng.beta(1.0, 30.0, n - 100), rng.uniform(size=100)])
    X = np.stack([x, rng.uniform(size=n)])
    Y = (rng.uniform(size=X.shape) < X).astype(np.int64)
    hs = np.array([2e-4, 1e-2])
    logq, p, bias = kb.binary_inputs(X, hs)
    u = np.ascontiguousarray(rng.uniform(size=X.shape))
    args = (logq, p, Y, 2, np.ascontiguousarray(1.0 / hs), bias)
    kw = {"powers": 2, "pairs": True, "backend": "cpp", "resid": u}
    calls = []
    real = kb.loo_reduce_k2
    monkeypatch.setattr(kb, "loo_reduce_k2", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast = _backends.loo_reduce(*args, **kw)
    assert calls
    monkeypatch.setattr(_backends, "BINARY_METHOD", "exact")
    exact = _backends.loo_reduce(*args, **kw)
    assert len(calls) == 1  # the dense loop ran
    np.testing.assert_allclose(fast[0], exact[0], rtol=8 * np.finfo(np.float64).eps, atol=0)
    S_top = np.max(exact[1], axis=-1, keepdims=True)
    for i, (a, b) in enumerate(zip(fast[1:], exact[1:]), start=1):
        if b.size:  # relative to the row's largest class (a class at 1e-243 of it is 0);
            # the pair sums D (<= S^2) relative to the largest class sum squared
            scale = np.max(np.abs(b), axis=-1, keepdims=True) if b.ndim == 4 else np.abs(b)
            if i == 4:
                scale = np.maximum(scale, 1e-30 * S_top**2)
            assert np.all(np.abs(a - b) <= 1e-8 * scale)
    # and an estimate through the public API
    P = np.stack([1.0 - x, x], axis=1)
    v_exact = kdecal.ece_kde(P, Y[0], bandwidth=1e-3, calibration="top_label")
    monkeypatch.setattr(_backends, "BINARY_METHOD", "auto")
    v_fast = kdecal.ece_kde(P, Y[0], bandwidth=1e-3, calibration="top_label")
    assert v_fast == pytest.approx(v_exact, rel=1e-8)


def test_shifted_bias_serves_small_bandwidths_near_one(monkeypatch):
    """Scores within 1e-8 … 1e-4 of 1 at h = 3e-5: the shift halves the fallbacks.

    Unshifted, the logs' magnitudes (|bias| ~ lgamma(1/h), 3e5 here) failed the cell
    methods' rounding check for most queries (5,182 of 6,000 (query, class) fell back to
    exact windows), shifted by their median (binary.shifted_bias) for 2,679 (the rest
    are classes whose own sums are tiny there); every accumulator stays within 1e-8 of
    the dense loop, m within a few ulp.
    """
    rng = np.random.default_rng(3)
    x = np.concatenate([1.0 - 10.0 ** rng.uniform(-8, -4, 2500), rng.beta(5, 1, 500)])
    y = (rng.random(x.size) < x).astype(np.int64)
    hs = np.array([3e-5])
    logq, p, bias = kb.binary_inputs(x, hs)
    args = (logq, p, y[None].copy(), 2, 1.0 / hs, bias)
    assert np.all(kb.shifted_bias(bias, 1.0 / hs)[1] < -1e5)  # the shift is on here
    shifted: dict[str, int] = {}
    out = kb.loo_reduce_k2(*args, powers=3, pairs=True, method="local", stats=shifted)
    monkeypatch.setattr(kb, "SHIFT_MIN_H", 1.0)  # no shift at h < 1
    unshifted: dict[str, int] = {}
    kb.loo_reduce_k2(*args, powers=3, pairs=True, method="local", stats=unshifted)
    assert shifted["fallbacks"] * 1.5 < unshifted["fallbacks"]
    ex = _run(x, y, 2, hs, "exact", 3, True)
    _assert_close(tuple(a[0] for a in out), ex, x.size, "near one h=3e-5")


# ------------------------------------------------------- centre weights (the bootstrap)
def _weighted_reference(x, y, h, v, u):
    """The dense multi-label pass: S with weights v, Q with v^2, A with v p, U with u."""
    logq, p, bias = kb.binary_inputs(x, [h])
    logq, p, bias = logq[0], p[0], bias[0, 0]
    m = _run(x, y, 2, [h], "exact", powers=1, pairs=False)[0][0]
    lab = np.ascontiguousarray(y[None], dtype=np.int64)
    S, Q = _backends.loo_reduce_multi(
        logq,
        p,
        m,
        np.concatenate([lab, lab]),
        2,
        1.0 / h,
        bias,
        np.stack([v, v * v]),
        powers=2,
    )[:2]
    zero = np.zeros((2, len(x)), np.int64)
    A = _backends.loo_reduce_multi(
        logq, p, m, zero, 1, 1.0 / h, bias, np.stack([v * p[:, 0], v * p[:, 1]])
    )[0][:, :, 0].T
    U = _backends.loo_reduce_multi(
        logq,
        p,
        m,
        zero[:1],
        1,
        1.0 / h,
        bias,
        np.ones((1, len(x))),
        powers=2,
        resid=u[None],
    )[2][0]
    return m, S[0], Q[1], A, U


@pytest.mark.parametrize("h", [1e-6, 1e-4, 1e-3, 1e-2, 0.3, 10.0])
def test_centre_weights_against_the_dense_multi_label_pass(h):
    # every accumulator of every method within TOL of the dense pass, whose S and Q
    # take the weights as they are given (so v and v^2 here); weights drawn as a
    # bootstrap's (many zeros) on the adversarial inputs and a clustered sample
    rng = np.random.default_rng(21)
    cases = dict(adversarial_scores())
    cases["clustered_3000"] = np.concatenate([1 - rng.random(2400) * 1e-3, rng.beta(3, 1, 600)])
    for name, x in cases.items():
        n = len(x)
        y = (rng.random(n) < x).astype(np.int64)
        v = rng.poisson(1.0, n).astype(np.float64)
        u = rng.random(n) * v * v
        m, S, Q, A, U = _weighted_reference(x, y, h, v, u)
        # the dense pass drops chunks of centres more than 64 nats below a class
        # maximum: an absolute floor of n e^-64 (units of the row maximum's term),
        # all that is left where the centres near the maximum were drawn 0 times
        floor = n * np.exp(-64.0) * (1.0 + v.max() ** 2)
        for method in ("window", "binned", "local"):
            out = _run(x, y, 2, [h], method, powers=2, pairs=False, resid=u, weights=v)
            what = f"{name} {method} h={h}"
            fin = np.isfinite(m)
            assert np.array_equal(np.isfinite(out[0][0]), fin), what
            assert np.all(np.abs(out[0][0][fin] - m[fin]) <= TOL * np.maximum(1, np.abs(m[fin])))
            assert _max_rel(out[1][0], S, floor) <= TOL, f"{what} S"
            assert _max_rel(out[2][0], Q, floor) <= TOL, f"{what} Q"
            assert _max_rel(out[4][0], A, floor) <= TOL, f"{what} A"
            assert _max_rel(out[5][0], U, floor) <= TOL, f"{what} U"


def test_unit_centre_weights_are_bit_identical_to_none():
    rng = np.random.default_rng(22)
    x = np.concatenate([1 - rng.random(3000) * 1e-3, rng.beta(2, 2, 1000)])
    y = (rng.random(len(x)) < x).astype(np.int64)
    u = rng.random(len(x))
    for h in (2e-4, 0.02):
        for method in ("window", "binned", "local"):
            a = _run(x, y, 2, [h], method, powers=2, pairs=False, resid=u)
            b = _run(x, y, 2, [h], method, powers=2, pairs=False, resid=u, weights=np.ones(len(x)))
            for k in range(len(a)):
                assert np.array_equal(a[k], b[k]), (h, method, k)


def test_centre_weights_scale_and_zero():
    # weights 2 double S and A and quadruple Q; a centre of weight 0 is left out
    rng = np.random.default_rng(23)
    x = rng.beta(5, 1, 2500)
    y = (rng.random(len(x)) < x).astype(np.int64)
    for method in ("window", "local"):
        one = _run(x, y, 2, [1e-3], method, powers=2, pairs=False, resid=np.zeros(len(x)))
        two = _run(
            x,
            y,
            2,
            [1e-3],
            method,
            powers=2,
            pairs=False,
            resid=np.zeros(len(x)),
            weights=np.full(len(x), 2.0),
        )
        assert _max_rel(two[1], 2.0 * one[1]) <= TOL
        assert _max_rel(two[2], 4.0 * one[2]) <= TOL
        assert _max_rel(two[4], 2.0 * one[4]) <= TOL
        keep = np.ones(len(x), bool)
        keep[::3] = False
        w = keep.astype(np.float64)
        sub = _run(x, y, 2, [1e-3], method, powers=2, pairs=False, weights=w)
        ref = _weighted_reference(x, y, 1e-3, w, np.zeros(len(x)))
        assert _max_rel(sub[1][0], ref[1], len(x) * np.exp(-64.0)) <= TOL, method


def test_centre_weights_bad_inputs():
    x = np.array([0.1, 0.5, 0.9, 0.95])
    y = np.array([0, 1, 1, 1])
    with pytest.raises(ValueError, match="v must be finite and >= 0"):
        kb.loo_reduce_binary(
            x, y, 2, [0.1], weights=np.array([1.0, -1.0, 1.0, 1.0]), method="window"
        )
    with pytest.raises(ValueError, match="v must be finite"):
        kb.loo_reduce_binary(
            x, y, 2, [0.1], weights=np.array([1.0, np.nan, 1.0, 1.0]), method="local"
        )
    with pytest.raises(ValueError, match="powers <= 2"):
        kb.loo_reduce_binary(x, y, 2, [0.1], powers=3, weights=np.ones(4), method="binned")
    with pytest.raises(ValueError, match="powers <= 2"):
        kb.loo_reduce_binary(
            x, y, 2, [0.1], powers=2, pairs=True, weights=np.ones(4), method="window"
        )
    with pytest.raises(ValueError, match="not method='exact'"):
        kb.loo_reduce_binary(x, y, 2, [0.1], weights=np.ones(4), method="exact")
    with pytest.raises(ValueError, match="v must have shape"):
        logq, p, bias = kb.binary_inputs(x, [0.1])
        core.binary_reduce(
            logq,
            p,
            y[None].astype(np.int64),
            2,
            np.array([10.0]),
            bias,
            1,
            0,
            4,
            1,
            None,
            False,
            "window",
            False,
            None,
            0.8,
            None,
            np.ones((1, 3)),
        )


@pytest.mark.parametrize("h", [1e-5, 1e-3, 0.05, 3.0])
def test_consistency_sums_against_the_dense_engine_on_the_replicate_labels(h):
    # a consistency replicate's label sums as one class with the labels as centre
    # weights: S_1 and U of the dense engine run on the replicate's labels, within the
    # bound relative to the row's whole kernel sum (S_1) and to the row maximum's term
    # times the largest u (U): ref_floor = 1, since S_1 of a row whose near centres all
    # drew label 0 is far below the row maximum's term, and the estimator divides it by
    # that sum; every method, with the zero-label plan bit for bit as without, and numba
    rng = np.random.default_rng(24)
    cases = dict(adversarial_scores())
    cases["clustered_3000"] = np.concatenate([1 - rng.random(2400) * 1e-3, rng.beta(3, 1, 600)])
    numba = kb._engines.load_numba() is not None
    for name, x in cases.items():
        n = len(x)
        ystar = (rng.random(n) < x).astype(np.int64)
        logq, p, bias = kb.binary_inputs(x, [h])
        u = (ystar - p[0, :, 1]) ** 2  # the residuals of the clipped points, as the engine's
        ex = _run(x, ystar, 2, [h], "exact", powers=2, pairs=False, resid=u)
        S1, U, total = ex[1][0][:, 1], ex[5][0], ex[1][0].sum(axis=-1)
        scale = np.array([1.0 / h])
        # the dense engine drops chunks of centres 64 nats below a class maximum: an
        # absolute floor of n e^-64 (units of the row maximum's term) on U
        floor = 2.0 * n * np.exp(-64.0)
        for method in ("window", "binned", "local"):
            what = f"{name} {method} h={h}"
            plan = kb.zero_label_plan(logq, p)
            got = kb.consistency_sums(logq, p, scale, bias, method, True, ystar[None], plan)
            again = kb.consistency_sums(logq, p, scale, bias, method, True, ystar[None])
            assert np.array_equal(got[0], again[0]) and np.array_equal(got[1], again[1])
            fin = total > 0
            assert np.all(np.abs(got[0][0] - S1)[fin] <= TOL * total[fin]), what
            assert np.all(np.abs(got[1][0] - U) <= TOL * np.maximum(U, u.max()) + floor), what
            assert kb.consistency_sums(logq, p, scale, bias, method, False, ystar[None])[1] is None
            if numba:
                nb = kb.consistency_sums(
                    logq, p, scale, bias, method, True, ystar[None], backend="numba"
                )
                assert np.all(np.abs(nb[0][0] - S1)[fin] <= TOL * total[fin]), f"{what} numba"
                assert np.all(np.abs(nb[1][0] - U) <= TOL * np.maximum(U, u.max()) + floor), what
