"""Residual-centred estimators (issue 25): against a materialised float64 brute force.

The reference (written here from the definitions, with the kernel of
``tests/_reference.py``): with the leave-one-out weights ``W[j, i]`` (diagonal 0) of a
notion's problem, residuals ``r_i = y_i - f_i`` and ``g_j = sum_i W_ji r_i / sum_i W_ji``:

- L1: ``mean_j sum_coords |g_j|``;
- squared L2 (U-statistic): ``mean_j sum_{i != k} W_ji W_jk <r_i, r_k> / sum_{i != k}
  W_ji W_jk``, the pairs formed explicitly;
- KL: ``mean_j KL(E_j || f_j)``, ``E_j = f_j + g_j`` where it is inside the simplex,
  else ``f_j + t_j g_j`` with ``t_j`` the largest ``t <= 1`` keeping the coordinates with
  ``f_jc >= 1e-3`` at or above ``1e-3 f_jc``, the others clipped there, renormalised.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kdecal
from _helpers import blas_threads
from _reference import ref_loo_weights, ref_notion_problems, ref_one_hot
from kdecal import datasets

NOTIONS = ("canonical", "top_label", "classwise")


def _backends():
    return [b for b in ("cpp", "numba") if b in kdecal.available_backends()]


def ref_residual(probs, labels, calibration, h):
    """(L1, squared L2 U-statistic, KL) of the residual estimator, averaged over problems."""
    out = np.zeros(3)
    problems = ref_notion_problems(probs, labels, calibration)
    for points, lab in problems:
        n, D = points.shape
        W = ref_loo_weights(points, h)  # (query, centre), diagonal 0
        c = slice(None) if calibration == "canonical" else slice(1, 2)
        r = ref_one_hot(lab, D) - points
        g = (W @ r) / W.sum(axis=1, keepdims=True)
        l1 = np.mean(np.abs(g[:, c]).sum(axis=1))
        rc = r[:, c]
        G = rc @ rc.T  # <r_i, r_k>
        sq = np.empty(n)
        for j in range(n):
            pair = np.outer(W[j], W[j])
            np.fill_diagonal(pair, 0.0)
            sq[j] = np.sum(pair * G) / np.sum(pair)
        E = np.empty_like(points)
        for j in range(n):  # shrink by the coordinates >= 1e-3, clip the rest, renormalise
            e = points[j] + g[j]
            if np.all(e >= 1e-3 * points[j]):
                E[j] = e
                continue
            t = 1.0
            for c_ in range(D):
                if g[j, c_] < 0 and points[j, c_] >= 1e-3:
                    t = min(t, (1.0 - 1e-3) * points[j, c_] / -g[j, c_])
            e = np.maximum(points[j] + t * g[j], 1e-3 * points[j])
            E[j] = e / e.sum()
        kl = np.mean(np.sum(E * np.log(E / points), axis=1))
        out += (l1, np.mean(sq), kl)
    return out / len(problems)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("calibration", NOTIONS)
@pytest.mark.parametrize("K,h", [(2, 0.05), (3, 0.2), (10, 1.0), (4, 0.02)])
def test_residual_quantities_match_brute_force(backend, calibration, K, h):
    s = datasets.make_seeds_synthetic(120, K, t1=0.8, t2=0.6, seed=K)
    est = kdecal.estimate(s.probs, s.labels, bandwidth=h, calibration=calibration, backend=backend)
    assert est.estimator == "residual" and est.bandwidth == est.bandwidth_l2 == h
    l1, sq, kl = ref_residual(s.probs, s.labels, calibration, h)
    assert est.ece_kde(1) == pytest.approx(l1, rel=1e-10)
    assert est.calibration_error("l2") == pytest.approx(sq, rel=1e-9, abs=1e-14)
    assert est.calibration_error("kl") == pytest.approx(kl, rel=1e-10)
    # the public one-quantity functions give the same numbers
    kw = {"bandwidth": h, "calibration": calibration, "backend": backend}
    assert kdecal.ece_kde(s.probs, s.labels, **kw) == pytest.approx(l1, rel=1e-10)
    assert kdecal.calibration_error(s.probs, s.labels, divergence="l2", **kw) == pytest.approx(
        sq, rel=1e-9, abs=1e-14
    )
    e2 = kdecal.ece_kde(s.probs, s.labels, p=2, **kw)
    assert np.sign(e2) * e2**2 == pytest.approx(sq, rel=1e-9, abs=1e-14)


@pytest.mark.filterwarnings("ignore:.*single effective neighbour")
@pytest.mark.parametrize("calibration", NOTIONS)
def test_float32_squared_errors_equal_float64_of_the_same_numbers(calibration):
    """float32 probabilities give the float64 squared L2 error of the same numbers within
    float32's rounding. The bundled example's rows are clipped and renormalised in
    float64, between float32 numbers: the engine's residual sums ``A`` read the centres
    rounded to float32, and ``U`` read them unrounded, a 6e-8 mismatch that flipped the
    sign of rows whose U-statistic cancels (off by 7 % and 11 % at these bandwidths)."""
    from kdecal._io import bundled_example_path

    with np.load(bundled_example_path()) as d:
        P32, y = d["probs"][:1500], d["labels"][:1500]
    assert P32.dtype == np.float32
    P64 = P32.astype(np.float64)
    for h in (0.003, 0.01):
        e32 = kdecal.estimate(P32, y, bandwidth=h, calibration=calibration)
        e64 = kdecal.estimate(P64, y, bandwidth=h, calibration=calibration)
        assert e32.calibration_error("l2") == pytest.approx(e64.calibration_error("l2"), rel=1e-5)
        assert e32.ece_kde(2) == pytest.approx(e64.ece_kde(2), rel=1e-5)
    # the test's null replicates (A of the estimate, U of the relabelled centres) too
    t32 = e32.calibration_test("ce_l2", n_resamples=8, seed=0)
    t64 = e64.calibration_test("ce_l2", n_resamples=8, seed=0)
    spread = float(np.std(t64.null_distribution))
    assert np.max(np.abs(t32.null_distribution - t64.null_distribution)) < 1e-3 * spread


def test_residual_differs_from_plugin_and_plugin_is_reachable():
    # calibrated, at a wide kernel: the plug-in reports its smoothing as miscalibration
    s = datasets.make_seeds_synthetic(300, 4, t1=0.6, t2=1.0, seed=3)
    res = kdecal.ece_kde(s.probs, s.labels, bandwidth=1.0)
    plug = kdecal.ece_kde(s.probs, s.labels, bandwidth=1.0, estimator="plugin")
    E = kdecal.conditional_expectation(s.probs, s.labels, bandwidth=1.0)
    P = np.clip(s.probs, 1e-12, None)
    P /= P.sum(axis=1, keepdims=True)
    assert plug == pytest.approx(np.mean(np.abs(E - P).sum(axis=1)), rel=1e-12)
    assert res < 0.5 * plug


def test_residual_auto_bandwidth_rule():
    s = datasets.make_seeds_synthetic(800, 4, t1=0.6, t2=0.6, seed=4)
    est = kdecal.estimate(s.probs, s.labels)
    plug = kdecal.estimate(s.probs, s.labels, estimator="plugin", criterion="brier")
    assert est.bandwidth == plug.bandwidth  # the same leave-one-out Brier search
    assert est.bandwidth_l2 == est.bandwidth_kl == pytest.approx(0.5 * est.bandwidth)
    fixed = kdecal.estimate(s.probs, s.labels, bandwidth=est.bandwidth_l2)
    # the squared L2 error: the U-statistic at h_B / 2, raised to its lower bounds
    bounds = est.l2_lower_bounds
    assert set(bounds) == {"top_label", "classwise_times_K"}
    assert est.calibration_error("l2") == max(fixed.calibration_error("l2"), *bounds.values())
    assert est.calibration_error("kl") == fixed.calibration_error("kl")
    assert est.ece_kde(1) == kdecal.ece_kde(s.probs, s.labels)


@pytest.mark.parametrize("calibration", ("canonical", "top_label"))
def test_squared_statistic_unbiased_under_calibration(calibration):
    """Mean over calibrated draws (labels ~ f, f fixed) is 0 within 3.5 standard errors.

    The plug-in's squared statistic, on the same draws, is biased upwards by many
    standard errors: the test can fail.
    """
    rng = np.random.default_rng(0)
    s = datasets.make_seeds_synthetic(150, 3, t1=0.7, t2=1.0, seed=0)
    P = np.clip(s.probs, 1e-12, None)
    P /= P.sum(axis=1, keepdims=True)
    cdf = np.cumsum(P, axis=1)
    vals, plug = [], []
    for _ in range(300):
        y = (rng.random(len(P))[:, None] > cdf).sum(axis=1).clip(0, 2)
        kw = {"bandwidth": 0.05, "calibration": calibration}
        vals.append(kdecal.calibration_error(P, y, divergence="l2", **kw))
        plug.append(
            kdecal.calibration_error(
                P, y, divergence="l2", estimator="plugin", debias="none", **kw
            )
        )
    vals, plug = np.array(vals), np.array(plug)
    se = vals.std(ddof=1) / np.sqrt(len(vals))
    assert abs(vals.mean()) < 3.5 * se
    assert plug.mean() > 10 * plug.std(ddof=1) / np.sqrt(len(plug))


def test_resampling_of_residual_estimates():
    s = datasets.make_seeds_synthetic(400, 3, t1=0.6, t2=1.0, seed=5)
    est = kdecal.estimate(s.probs, s.labels, bandwidth=0.1)
    ci = est.confidence_interval("ce_l2", n_resamples=40, seed=0)
    assert ci.low <= ci.estimate <= ci.high
    t = est.calibration_test("ce_l2", n_resamples=60, seed=0)
    # the residual statistic's null is centred at 0 (unbiased under calibration)
    se = t.null_distribution.std(ddof=1) / np.sqrt(60)
    assert abs(t.null_mean) < 4 * se
    assert 0.0 < t.pvalue <= 1.0


def test_bootstrap_replicate_with_unit_weights_equals_estimate():
    """A replicate whose multiplicities are all 1 is the estimate itself (all backends)."""
    from kdecal._estimation import replicates as _replicates

    s = datasets.make_seeds_synthetic(90, 3, t1=0.6, t2=0.6, seed=6)
    for calibration in NOTIONS:
        est = kdecal.estimate(s.probs, s.labels, bandwidth=0.2, calibration=calibration)
        base = est._est_sq
        labels = base.problem.labels[None]
        rep = next(_replicates.replicates(base, labels, np.ones((1, 90)), est.backend))
        assert rep.estimator == "residual"
        np.testing.assert_allclose(rep.E, base.E, rtol=1e-12, atol=1e-15)
        q = kdecal.QUANTITIES["ce_l2"]
        assert q(rep) == pytest.approx(q(base), rel=1e-9, abs=1e-15)


def test_ratio_debias_needs_plugin():
    s = datasets.make_seeds_synthetic(60, 3, seed=0)
    with pytest.raises(ValueError, match="estimator='plugin'"):
        kdecal.estimate(s.probs, s.labels, bandwidth=0.1, debias="ratio")
    with pytest.raises(ValueError, match="estimator"):
        kdecal.estimate(s.probs, s.labels, bandwidth=0.1, estimator="resid")
    kdecal.estimate(s.probs, s.labels, bandwidth=0.1, debias="ratio", estimator="plugin")


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("calibration", NOTIONS)
def test_dense_replicates_equal_the_multi_label_pass(calibration, backend, monkeypatch):
    """The residual replicates on the compiled core and on numba are BLAS products of
    the kernel weights (the core's, or its numba twin's) with value columns; the
    multi-label pass (label sets for S, single-class sets for A and U) computes the
    same sums: bootstrap and consistency replicates agree to rounding, for every
    quantity."""
    from kdecal._engine import runtime as _runtime
    from kdecal._estimation import replicates as _replicates

    if backend == "cpp" and _runtime._core is None:
        pytest.skip("compiled core not available")
    if backend == "numba":
        pytest.importorskip("numba")
    s = datasets.make_seeds_synthetic(400, 4, t1=0.6, t2=1.0, seed=3)
    est = kdecal.estimate(
        s.probs, s.labels, bandwidth=0.1, calibration=calibration, backend=backend
    )
    assert _replicates._dense_backend(backend) == backend
    names = ["ce_l2", "ece_kde_l1", "ce_kl", "refinement_l2"]
    # every consistency replicate as dense products too (the core's default sends them
    # to the multi-label pass from CONSISTENCY_MULTI_MIN_DIM classes on)
    monkeypatch.setattr(_replicates, "CONSISTENCY_MULTI_MIN_DIM", 10**9)
    got = est.confidence_intervals(names, n_resamples=12, seed=1)
    got_t = est.calibration_tests(names, n_resamples=12, seed=1)
    # bootstrap and consistency replicates in one resampling, split between the dense
    # products and (on the core, for any number of classes here) the multi-label pass
    monkeypatch.setattr(_replicates, "CONSISTENCY_MULTI_MIN_DIM", 2)
    monkeypatch.setattr(_replicates, "CONSISTENCY_SHARED_MAX_DIM", 0)
    both, both_t = est._intervals_and_tests(names, names, level=0.95, n_resamples=12, seed=1)
    for q in names:
        np.testing.assert_allclose(
            both[q].bootstrap_distribution, got[q].bootstrap_distribution, rtol=1e-12
        )
        np.testing.assert_allclose(
            both_t[q].null_distribution, got_t[q].null_distribution, rtol=1e-10, atol=1e-15
        )
    # a quantity without squares: the multi-label pass skips them (powers = 1)
    alone = est.calibration_tests(["ece_kde_l1"], n_resamples=12, seed=1)["ece_kde_l1"]
    np.testing.assert_allclose(
        alone.null_distribution, got_t["ece_kde_l1"].null_distribution, rtol=1e-10
    )
    monkeypatch.setattr(_replicates, "_dense_backend", lambda backend: None)
    want = est.confidence_intervals(names, n_resamples=12, seed=1)
    want_t = est.calibration_tests(names, n_resamples=12, seed=1)
    for q in names:
        np.testing.assert_allclose(
            got[q].bootstrap_distribution, want[q].bootstrap_distribution, rtol=1e-10, atol=1e-15
        )
        np.testing.assert_allclose(
            got_t[q].null_distribution, want_t[q].null_distribution, rtol=1e-10, atol=1e-15
        )


@pytest.mark.parametrize("backend", ["cpp", "numba"])
def test_float32_problems_resample_with_float32_products(monkeypatch, backend):
    """A float32 problem's dense replicates form their products in float32 (the weights
    rounded, blocks of PRODUCT_BLOCK centres summed in float64): every replicate within
    1e-6 relative of the float64 products and of the multi-label pass (float64 sums).
    A block of query rows where some row has fewer than SINGLE_MIN_CENTRES centres
    with weights >= SINGLE_MIN_WEIGHT (a bootstrap replicate could then hang on weights
    float32 cannot hold) is formed in float64, bit for bit as the float64 products."""
    from kdecal._engine import runtime as _runtime
    from kdecal._estimation import replicates as _replicates

    if backend == "cpp" and _runtime._core is None:
        pytest.skip("compiled core not available")
    if backend == "numba":
        pytest.importorskip("numba")
    s = datasets.make_seeds_synthetic(600, 4, t1=0.6, t2=1.0, seed=5)
    P = s.probs.astype(np.float32)
    monkeypatch.setattr(_replicates, "PRODUCT_BLOCK", 128)  # several blocks at this n
    monkeypatch.setattr(_replicates, "_CHUNK_BYTES", 16 * 600 * 16)  # 16 rows per block
    monkeypatch.setattr(_replicates, "CONSISTENCY_MULTI_MIN_DIM", 10**9)
    names = ["ce_l2", "ece_kde_l1", "ce_kl"]
    dtypes: list[np.dtype] = []
    products = _replicates._products
    monkeypatch.setattr(
        _replicates, "_products", lambda W, M: dtypes.append(W.dtype) or products(W, M)
    )

    def distributions(est):
        ci = est.confidence_intervals(names, n_resamples=10, seed=2)
        ct = est.calibration_tests(names, n_resamples=10, seed=2)
        return {q: (ci[q].bootstrap_distribution, ct[q].null_distribution) for q in names}

    est = kdecal.estimate(P, s.labels, bandwidth=1.0, backend=backend)
    assert est._est.problem.dtype == np.float32
    # some rows' kernel sums are below the floor of the shortcut: the blocks are counted
    low, check = _replicates._single_products(est._est, [True])
    assert low and check.all()
    held: list[bool] = []
    hold = _replicates._single_rows_hold
    monkeypatch.setattr(
        _replicates, "_single_rows_hold", lambda W: held.append(hold(W)) or held[-1]
    )
    got = distributions(est)
    # the three rows below 40 are counted in their blocks; 40 centres above 2^-40 hold
    assert held and all(held)
    assert dtypes and set(dtypes) == {np.dtype(np.float32)}
    single = _replicates._single_products
    monkeypatch.setattr(
        _replicates,
        "_single_products",
        lambda e, b: (False, single(e, b)[1]),
    )
    f64 = distributions(est)
    # the first block failing the count (the second here) and the later ones of the
    # pass are formed in float64, without counting
    counts: list[int] = []
    monkeypatch.setattr(_replicates, "_single_products", single)
    monkeypatch.setattr(
        _replicates, "_single_rows_hold", lambda W: counts.append(len(counts)) or not counts[1:]
    )
    dtypes.clear()
    mixed = distributions(est)
    assert len(counts) == 2  # one bootstrap pass, one chunk; consistency: no count
    n_blocks = -(-600 // 16)
    boot = dtypes[: 2 * n_blocks]  # its products and their squares' per block
    assert boot[:2] == [np.dtype(np.float32)] * 2
    assert set(boot[2:]) == {np.dtype(np.float64)}
    monkeypatch.setattr(_replicates, "_dense_backend", lambda backend: None)
    multi = distributions(est)
    for q in names:
        for k in range(2):
            assert not np.array_equal(got[q][k], f64[q][k])  # the float32 path ran
            np.testing.assert_allclose(got[q][k], f64[q][k], rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(got[q][k], multi[q][k], rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(mixed[q][k], f64[q][k], rtol=1e-6, atol=1e-12)
    # a narrow bandwidth: rows with few centres within 2^-40 of their largest weight
    monkeypatch.undo()
    monkeypatch.setattr(_replicates, "CONSISTENCY_MULTI_MIN_DIM", 10**9)
    with warnings.catch_warnings():  # a few rows with a single effective neighbour
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        narrow = kdecal.estimate(P, s.labels, bandwidth=0.003, backend=backend)
    dtypes.clear()
    monkeypatch.setattr(
        _replicates, "_products", lambda W, M: dtypes.append(W.dtype) or products(W, M)
    )
    a = narrow.confidence_intervals(names, n_resamples=6, seed=3)
    assert set(dtypes) == {np.dtype(np.float64)}
    monkeypatch.setattr(
        _replicates,
        "_single_products",
        lambda e, b: (False, single(e, b)[1]),
    )
    b = narrow.confidence_intervals(names, n_resamples=6, seed=3)
    for q in names:
        np.testing.assert_array_equal(a[q].bootstrap_distribution, b[q].bootstrap_distribution)
    # consistency replicates alone use every centre: float32 without counting
    low, check = single(narrow._est, [False])
    assert low and not check.any()


@pytest.mark.parametrize("estimator", ["residual", "plugin"])
@pytest.mark.parametrize("calibration", ["top_label", "classwise"])
def test_fast_binary_replicates_equal_the_dense_products(calibration, estimator, monkeypatch):
    """Binary problems at n >= BINARY_REPLICATES_MIN_N resample on the fast binary
    engine (one call per replicate, the bootstrap's multiplicities as centre weights);
    its bootstrap and consistency replicates equal the dense products' (residual) and
    the multi-label pass's (plug-in) within the engine's bound (every accumulator
    within 3e-9 relative), for every quantity."""
    from kdecal._engine import runtime as _runtime
    from kdecal._estimation import replicates as _replicates

    if _runtime._core is None or not hasattr(_runtime._core, "binary_reduce"):
        pytest.skip("compiled core with the binary engine not available")
    n = _replicates.BINARY_REPLICATES_MIN_N
    s = datasets.make_seeds_synthetic(n, 4, t1=0.6, t2=1.0, seed=4)
    est = kdecal.estimate(s.probs, s.labels, calibration=calibration, estimator=estimator)
    base = est._for("ece_kde_l1")
    assert _replicates._fast_binary(base, est.backend)
    names = ["ce_l2", "ece_kde_l1", "ce_kl"]
    calls = []
    real = _replicates._binary_replicates

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(_replicates, "_binary_replicates", counted)
    got, got_t = est._intervals_and_tests(names, names, level=0.9, n_resamples=6, seed=2)
    assert calls, "the fast binary replicates did not run"
    monkeypatch.setattr(_replicates, "_fast_binary", lambda est, backend: False)
    want, want_t = est._intervals_and_tests(names, names, level=0.9, n_resamples=6, seed=2)
    for q in names:
        np.testing.assert_allclose(
            got[q].bootstrap_distribution, want[q].bootstrap_distribution, rtol=1e-8, atol=1e-14
        )
        np.testing.assert_allclose(
            got_t[q].null_distribution, want_t[q].null_distribution, rtol=1e-8, atol=1e-14
        )
        assert got[q].low == pytest.approx(want[q].low, rel=1e-8, abs=1e-14)


@pytest.mark.filterwarnings("ignore:.*single effective neighbour")
def test_fast_binary_replicates_of_isolated_rows_against_brute_force():
    """Rows far from every other point (a few low confidences among high ones, a small
    bandwidth): a bootstrap sample can draw none of the centres near such a row's
    maximum, so its weighted sums are made of terms 50-70 nats below the maximum's.
    The fast engine keeps them (its windows go deeper where the weighted sum is small),
    and so do the dense products (their kernel weights reach 230 nats below the row's
    maximum); the replicate's E and squared error per row must match a brute force
    computed relative to the largest weighted term, within what the fast engine's bound
    (3e-9 on each sum) allows through the U-statistic's cancellation."""
    from kdecal._engine import runtime as _runtime
    from kdecal._estimation import problem as _problem
    from kdecal._estimation import replicates as _replicates

    if _runtime._core is None or not hasattr(_runtime._core, "binary_reduce"):
        pytest.skip("compiled core with the binary engine not available")
    rng = np.random.default_rng(11)
    n = 900
    conf = np.concatenate([1 - rng.random(n - 4) * 0.02, [0.35, 0.52, 0.61, 0.74]])
    K = 3
    P = np.empty((n, K))
    P[:, 0] = conf
    P[:, 1:] = ((1 - conf) / 2)[:, None]
    y = np.where(rng.random(n) < conf, 0, rng.integers(1, K, n))
    est = kdecal.estimate(P, y, calibration="top_label", bandwidth=3e-4)
    base = est._est_sq
    prob = base.problem
    h = base.bandwidth
    R = 12
    counts = _replicates.draw_bootstrap_counts(n, R, np.random.default_rng(3)).astype(float)
    lab = np.ascontiguousarray(np.broadcast_to(prob.labels, (R, *prob.labels.shape)))
    fast = [r[0] for r in _replicates._binary_replicates(base, [(lab, counts)], True, False)]
    dense = [r[0] for r in _replicates._residual_replicates(base, [(lab, counts)], True, False)]
    logq, pk = _problem.kernel_points(prob)
    bias = _problem.kernel_bias(prob, h)[0]
    L = bias[None, :] + (pk[0] @ logq[0].T).T / h  # (query, centre)
    np.fill_diagonal(L, -np.inf)
    r1 = (prob.labels[0] == 1) - pk[0, :, 1]
    eps = 3e-9
    deep = 0
    for k, way in [(k, way) for k in range(R) for way in (fast, dense)]:
        v = counts[k]
        with np.errstate(divide="ignore"):
            lt = L + np.log(v)[None, :]
        top = lt.max(axis=1)
        t = np.exp(lt - top[:, None])  # weighted terms, the largest 1
        S0, N = t.sum(1), t @ r1
        Q0, U = (t * t).sum(1), (t * t) @ (r1 * r1)
        srt = -np.sort(-t, axis=1)
        den = 2.0 * np.sum(srt[:, 1:] * np.cumsum(srt, axis=1)[:, :-1], axis=1)  # pairs
        num = N * N - U
        ok = den > 1e-8 * S0**2
        rep = way[k]
        live = rep.row_weights > 0
        # a drawn row leaves the replicate only when its weighted terms all lie beyond
        # the engine's deepest window (230 nats below the row's maximum)
        gone = (v > 0) & ~live
        assert np.all(v[live] > 0)
        assert np.all(top[gone] - L.max(axis=1)[gone] < -200.0), (top - L.max(axis=1))[gone]
        E_ref = pk[0, :, 1] + N / S0
        np.testing.assert_allclose(rep.E[0, live, 1], E_ref[live], rtol=0, atol=1e-9)
        sel = live & ok
        sq, num, den = rep.sqerr[0][sel], num[sel], den[sel]
        bound = (2 * eps * N[sel] ** 2 + eps * U[sel]) / den + np.abs(num / den) * eps * (
            2 * S0[sel] ** 2 + Q0[sel]
        ) / den
        assert np.all(np.abs(sq - num / den) <= bound + 1e-12)
        deep += int(np.sum(live & (top < np.log(1e-20) + L.max(axis=1))))
    assert deep > 0  # some replicate's rows had only far centres (the case above)


@pytest.mark.parametrize("per_chunk", [1, 3])
@pytest.mark.parametrize(
    "backend, n", [("cpp", 2500), ("cpp", 300), ("numba", 300)], ids=["cpp-fast", "cpp", "numba"]
)
def test_classwise_in_chunks_of_problems_equals_one_batch(monkeypatch, backend, n, per_chunk):
    """Batches of many problems (class-wise at many classes) are searched and fitted a
    chunk of problems at a time, so that the engine's outputs and inputs are held for
    one chunk: the numbers are those of one batch, bit for bit (the search's risks, the
    bandwidth, every field of both estimates), and the fit's peak of numpy's traced
    memory is lower (chunks of one problem, and of a few)."""
    import tracemalloc

    from kdecal._estimation import problem as _problem
    from kdecal._estimation import regression as _regression

    if backend not in kdecal.available_backends():
        pytest.skip(f"backend {backend} not available")
    s = datasets.make_seeds_synthetic(n, 12, seed=5)
    P, y = np.asarray(s.probs), np.asarray(s.labels)

    def run():
        est = kdecal.estimate(P, y, calibration="classwise", backend=backend)
        problem = est._est.problem
        hs = {"lp": est.bandwidth, "sq": est.bandwidth_l2}
        tracemalloc.start()
        try:
            _regression.fit_residual(problem, hs, "ustat", backend, False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return est, peak

    whole, peak_whole = run()
    monkeypatch.setattr(_problem, "PROBLEM_CHUNK_MIN_BYTES", 0.0)
    # chunks of one problem, or of 3 (the search), 2 (the fit) and 3 (the per-row terms)
    monkeypatch.setattr(_problem, "PROBLEM_CHUNK_BYTES", 1.0 if per_chunk == 1 else 3 * n * 208.0)
    chunked, peak_chunked = run()
    assert chunked.search.tried == whole.search.tried
    assert chunked.bandwidth == whole.bandwidth and chunked.bandwidth_l2 == whole.bandwidth_l2
    for a, b in ((whole._est, chunked._est), (whole._est_sq, chunked._est_sq)):
        assert a.n_degenerate == b.n_degenerate
        for name in ("E", "m", "S", "Q", "A", "sqerr"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for q in kdecal.QUANTITIES:  # per-row terms a chunk of problems at a time
        assert chunked.value(q) == whole.value(q), q
    for p in (1.5, 3.0):
        assert chunked.ece_kde(p) == whole.ece_kde(p)
    limit = 0.8 if per_chunk == 1 else 0.9  # chunks of 2 of the 12 problems in the fit
    assert peak_chunked < limit * peak_whole, (peak_chunked, peak_whole)
    tracemalloc.start()
    try:
        chunked.value("ce_kl")
        peak_kl = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    monkeypatch.setattr(_problem, "PROBLEM_CHUNK_MIN_BYTES", 1e9)
    tracemalloc.start()
    try:
        assert chunked.value("ce_kl") == whole.value("ce_kl")
        peak_kl_whole = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_kl < 0.5 * peak_kl_whole, (peak_kl, peak_kl_whole)


def _seeds(n, K, seed):
    s = datasets.make_seeds_synthetic(n, K, t1=0.6, t2=1.0, seed=seed)  # calibrated
    return np.asarray(s.probs), np.asarray(s.labels)


def test_evaluate_says_canonical_estimates_at_many_classes_are_not_reliable():
    """Beyond K = 10 a calibrated model scores a canonical L1 of 0.27-0.37 (truth 0) and
    a miscalibrated one no more (bench/README.md, "Canonical estimates at many
    classes"): the report says so, with a warning, wherever it prints a canonical kernel
    figure, and points to the top-label notion; not at K = 10, nor for a top-label
    report without a canonical row; the KL note then defers to it."""
    P, y = _seeds(300, 30, seed=3)
    kw = {"n_resamples": 0, "calibration_loss": False}
    match = "canonical kernel estimates at K = 30 cannot tell a calibrated model"
    three = ("canonical", "top_label", "classwise")
    # the metrics; the notion table's row (asked for: "auto" leaves them out, below)
    for extra in ({"calibration": "canonical"}, {"calibration": "top_label", "notions": three}):
        with pytest.warns(kdecal.KdecalWarning, match=match) as rec:
            rep = kdecal.evaluate(P, y, **extra, **kw)
        assert not any("least reliable" in str(w.message) for w in rec)
        notes = [note for note in rep.notes if "cannot tell a calibrated model" in note]
        assert len(notes) == 1 and "calibration='top_label'" in notes[0]
        assert not any("least reliable" in note for note in rep.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kdecal.KdecalWarning)
        rep = kdecal.evaluate(
            P, y, calibration="top_label", notions=("top_label", "classwise"), **kw
        )
    assert not any("cannot tell a calibrated" in note for note in rep.notes)
    P10, y10 = _seeds(300, 10, seed=3)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", kdecal.KdecalWarning)
        rep = kdecal.evaluate(P10, y10, **kw)
    assert not any("cannot tell a calibrated" in str(w.message) for w in rec)
    assert any("least reliable" in str(w.message) for w in rec)  # KL at K = 10 only


def test_canonical_estimates_at_many_classes_warn_in_the_core_api():
    """Every public function that fits a residual-centred canonical estimate beyond
    K = 10 gives an UnreliableEstimateWarning naming the top-label notion; not at
    K = 10, not for the top-label or class-wise notions, not for the papers' plug-in
    (kept for reproductions); calibration_error's KL warning then defers to it."""
    P, y = _seeds(300, 11, seed=4)
    match = "canonical kernel estimates at K = 11 cannot tell a calibrated model"
    calls = {
        "estimate": lambda **kw: kdecal.estimate(P, y, **kw),
        "ece_kde": lambda **kw: kdecal.ece_kde(P, y, **kw),
        "ece_kde p=2": lambda **kw: kdecal.ece_kde(P, y, p=2, **kw),
        "calibration_error kl": lambda **kw: kdecal.calibration_error(P, y, **kw),
        "calibration_error l2": lambda **kw: kdecal.calibration_error(P, y, divergence="l2", **kw),
        "refinement": lambda **kw: kdecal.refinement(P, y, **kw),
        "sharpness": lambda **kw: kdecal.sharpness(P, y, **kw),
        "calibration_test": lambda **kw: kdecal.calibration_test(P, y, n_resamples=2, **kw),
    }
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            call(bandwidth=0.1)
        msgs = [str(w.message) for w in rec]
        assert len(msgs) == 1, (name, msgs)
        assert rec[0].category is kdecal.UnreliableEstimateWarning, name
        assert match in msgs[0] and "calibration='top_label'" in msgs[0], name
        assert rec[0].filename == __file__, (name, rec[0].filename)  # the caller's line
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            call(bandwidth=0.1, calibration="top_label")
            call(bandwidth=0.1, calibration="classwise")
            call(bandwidth=0.1, estimator="plugin")
    # K = 10: no canonical warning; calibration_error's KL warning alone
    P10, y10 = _seeds(300, 10, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kdecal.ece_kde(P10, y10, bandwidth=0.1)
    with pytest.warns(kdecal.UnreliableEstimateWarning, match="least reliable") as rec:
        kdecal.calibration_error(P10, y10, bandwidth=0.1)
    assert len(rec) == 1


def test_evaluate_and_compare_leave_canonical_out_beyond_ten_classes():
    """calibration="auto" and notions="auto" (the defaults): canonical up to K = 10,
    top-label figures and no canonical row beyond, with a note that says how to ask
    for them; explicit choices are kept, and then the note is not given."""
    P, y = _seeds(300, 11, seed=5)
    kw = {"n_resamples": 0, "calibration_loss": False, "bandwidth": 0.05}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = kdecal.evaluate(P, y, **kw)
    assert rep.calibration == "top_label" and list(rep.notions) == ["top_label", "classwise"]
    assert rep.to_dict()["calibration"] == "top_label"
    top = kdecal.evaluate(P, y, calibration="top_label", notions=("top_label",), **kw)
    assert rep.ece_kde_l1 == top.ece_kde_l1  # the same top-label estimate
    left = [note for note in rep.notes if note.startswith("No canonical figures at K = 11")]
    assert len(left) == 1 and "--calibration canonical" in left[0]
    assert not any(note.startswith("No canonical figures") for note in top.notes)
    with pytest.warns(kdecal.UnreliableEstimateWarning):
        rep = kdecal.evaluate(P, y, calibration="canonical", **kw)
    # the notion asked for by name gets its row, hence its intervals and test (it had
    # headline figures and no row: no interval, null mean or p-value, and no note)
    assert rep.calibration == "canonical"
    assert list(rep.notions) == ["canonical", "top_label", "classwise"]
    assert rep.notions["canonical"]["ece_kde_l1"] == rep.ece_kde_l1
    assert not any(note.startswith("No canonical figures") for note in rep.notes)
    P10, y10 = _seeds(300, 10, seed=5)
    rep10 = kdecal.evaluate(P10, y10, metrics=["ece_kde_l1", "ce_l2"], **kw)
    assert rep10.calibration == "canonical"
    assert list(rep10.notions) == ["canonical", "top_label", "classwise"]
    assert not any(note.startswith("No canonical figures") for note in rep10.notes)
    # binary (n,) input: K = 2, canonical
    assert (
        kdecal.evaluate(P10[:, 0] / P10[:, :2].sum(1), (y10 == 0).astype(int), **kw).calibration
        == "canonical"
    )
    with pytest.raises(ValueError, match=r"notions must be 'auto'.*got the string 'all'"):
        kdecal.evaluate(P, y, notions="all", **kw)
    # compare: the same rule
    Q = np.roll(P, 1, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cmp = kdecal.compare({"a": P, "b": Q}, y, n_resamples=2, bandwidth=0.2)
    assert cmp.calibration == "top_label"
    cmp10 = kdecal.compare({"a": P10}, y10, n_resamples=2, bandwidth=0.2)
    assert cmp10.calibration == "canonical"


def test_dense_products_follow_set_num_threads(monkeypatch):
    """The resampling's BLAS products run on the engine's thread count where
    set_num_threads set it, and on the BLAS library's own default otherwise."""
    from kdecal._engine import runtime as _runtime
    from kdecal._estimation import replicates as _replicates

    if _runtime._core is None:
        pytest.skip("compiled core not available")

    default = blas_threads()
    if not default:
        pytest.skip("no BLAS library that threadpoolctl can see")
    seen: list[list[int]] = []
    matmul = np.matmul

    class Spy(np.ndarray):  # the weights, recording the BLAS threads at each product
        def __matmul__(self, other):
            seen.append(blas_threads())
            return matmul(np.asarray(self), other)

    products = _replicates._products
    monkeypatch.setattr(_replicates, "_products", lambda W, M: products(W.view(Spy), M))
    s = datasets.make_seeds_synthetic(300, 3, t1=0.6, t2=1.0, seed=1)
    est = kdecal.estimate(s.probs, s.labels, bandwidth=0.5)
    est.confidence_intervals(["ce_l2"], n_resamples=4, seed=0)
    assert seen and all(t == default for t in seen)
    seen.clear()
    kdecal.set_num_threads(1)
    try:
        est.confidence_intervals(["ce_l2"], n_resamples=4, seed=0)
    finally:
        kdecal.set_num_threads(None)
    assert seen and all(t == [1] * len(default) for t in seen)
    assert blas_threads() == default


def _isolated_pairs(K=3, groups=6, seed=0):
    """Pairs and triplets of exact duplicates far apart: at h = 1e-5 a row of a pair has one
    effective neighbour (its twin), a row of a triplet two."""
    rng = np.random.default_rng(seed)
    sizes = [2, 3] * (groups // 2)
    centres = rng.dirichlet(np.ones(K), size=groups)
    P = np.repeat(centres, sizes, axis=0)
    y = rng.integers(0, K, P.shape[0])
    return P, y, np.repeat(np.array(sizes) == 2, sizes)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("calibration", NOTIONS)
def test_rows_with_one_neighbour_leave_the_squared_error(backend, calibration):
    """A row with a single effective neighbour has no pair for its U-statistic. It took the
    plain square of that neighbour's residual (up to 2 per row: on pathmnist_resnet50,
    308 such rows of 7,180 raised the canonical squared L2 error from 0.054 to 0.079, and
    +40 ... +970 % on the K = 10 protocol at h = 0.01 ... 0.002); it now leaves the mean:
    the estimate is the brute force's mean over the other rows, problem by problem."""
    P, y, pair = _isolated_pairs()
    h = 1e-5
    with pytest.warns(kdecal.KdecalWarning, match="leave the squared L2 estimate"):
        est = kdecal.estimate(P, y, bandwidth=h, calibration=calibration, backend=backend)
    problems = ref_notion_problems(P, y, calibration)
    want, n_deg = 0.0, 0
    for points, lab in problems:
        W = ref_loo_weights(points, h)
        c = slice(None) if calibration == "canonical" else slice(1, 2)
        r = (ref_one_hot(lab, points.shape[1]) - points)[:, c]
        S0 = W.sum(axis=1)
        one = ~(S0**2 - (W**2).sum(axis=1) > 1e-8 * S0**2)  # one effective neighbour
        n_deg += int(one.sum())
        sq = []
        for j in np.flatnonzero(~one):  # the others: at least one pair of neighbours
            pr = np.outer(W[j], W[j])
            np.fill_diagonal(pr, 0.0)
            sq.append(np.sum(pr * (r @ r.T)) / np.sum(pr))
        want += np.mean(sq)
    want /= len(problems)
    if calibration == "canonical":  # the construction does what it says
        assert n_deg == pair.sum()
    assert n_deg > 0 and est._est_sq.n_degenerate == n_deg
    assert est.calibration_error("l2") == pytest.approx(want, rel=1e-9, abs=1e-15)
    # a bootstrap replicate weighs the other rows by their multiplicities
    ci = est.confidence_interval("ce_l2", n_resamples=20, seed=1)
    assert np.isfinite(ci.low) and np.isfinite(ci.high)


def test_every_row_with_one_neighbour_says_the_estimate_is_not_debiased():
    """With every row degenerate the "ustat" squared error is the plain one (the warning
    said the rows "take the mean of the other rows", of which there are none)."""
    P = np.random.default_rng(0).dirichlet(np.ones(3), 50)
    y = np.zeros(50, dtype=int)
    with pytest.warns(kdecal.KdecalWarning, match="50 of 50 query rows") as rec:
        got = kdecal.calibration_error(P, y, divergence="l2", bandwidth=5e-6)
    text = " ".join(str(w.message) for w in rec)
    assert "the plain (not debiased) one, as with debias='none'" in text
    assert "take the mean" not in text
    assert got == kdecal.calibration_error(P, y, divergence="l2", bandwidth=5e-6, debias="none")
