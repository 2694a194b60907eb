"""Tests of kdecal.plot: arrays against independent computations, rendering, errors, CLI.

The arrays are checked without matplotlib (``draw=False``); the rendering tests need
matplotlib (skipped without it) and use the Agg backend.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats
from scipy.special import softmax

import kdecal
from kdecal import plot as kp
from kdecal.cli import main

H = 0.05  # fixed Dirichlet/Beta bandwidth: no bandwidth search, fast


def _data(n=300, K=4, seed=0, temperature=1.6, alpha=1.0):
    """Dirichlet predictions, labels from the tempered predictions (miscalibrated)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    T = P ** (1.0 / temperature)
    T /= T.sum(axis=1, keepdims=True)
    u = rng.random(n)
    y = (u[:, None] > np.cumsum(T, axis=1)).sum(axis=1).clip(0, K - 1).astype(np.int64)
    return P, y


def _trapz(y, x):
    """Trapezoid rule (np.trapezoid needs NumPy >= 2)."""
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2.0)


def _top_label(P, y):
    pred = P.argmax(axis=1)
    return P[np.arange(len(y)), pred], (pred == y).astype(np.int64)


# ----------------------------------------------------------------- reliability diagram
def test_reliability_binned_matches_binned_statistics():
    P, y = _data()
    rd = kp.reliability_diagram(P, y, n_bins=10, draw=False)
    st = kdecal.binned.binned_statistics(P, y, n_bins=10)
    np.testing.assert_array_equal(rd.counts, st.counts)
    np.testing.assert_array_equal(rd.edges, st.edges)
    np.testing.assert_allclose(rd.x, st.mean_confidence, equal_nan=True)
    np.testing.assert_allclose(rd.y, st.frequency, equal_nan=True)
    assert rd.ece == pytest.approx(kdecal.binned.ece(P, y, n_bins=10), rel=1e-12)
    assert rd.ax is None and rd.bandwidth is None
    cw = kp.reliability_diagram(P, y, calibration="classwise", n_bins=10, draw=False)
    assert cw.x.shape == (4, 10)
    assert np.mean(cw.ece) == pytest.approx(
        kdecal.binned.ece(P, y, n_bins=10, calibration="classwise"), rel=1e-12
    )


@pytest.mark.usefixtures("plugin_estimator")
def test_reliability_kernel_top_label_is_conditional_expectation():
    """The curve is the LOO E of the binary top-label problem, sorted by confidence."""
    P, y = _data()
    rd = kp.reliability_diagram(P, y, kind="kernel", bandwidth=H, draw=False, estimator="plugin")
    conf, correct = _top_label(P, y)
    E = kdecal.conditional_expectation(conf, correct, bandwidth=H)[:, 1]
    order = np.argsort(conf, kind="stable")
    np.testing.assert_allclose(rd.x, conf[order], rtol=1e-12)
    np.testing.assert_allclose(rd.y, E[order], rtol=1e-10, atol=1e-14)
    assert np.all(np.diff(rd.x) >= 0)
    assert rd.ece == pytest.approx(
        kdecal.ece_kde(P, y, p=1, bandwidth=H, calibration="top_label"), rel=1e-10
    )
    auto = kp.reliability_diagram(P, y, kind="kernel", draw=False, estimator="plugin")  # "auto"
    assert auto.ece == pytest.approx(kdecal.ece_kde(P, y, p=1, calibration="top_label"))


@pytest.mark.usefixtures("plugin_estimator")
def test_reliability_kernel_classwise_and_canonical():
    P, y = _data()
    one = kp.reliability_diagram(
        P,
        y,
        kind="kernel",
        calibration="classwise",
        class_index=2,
        bandwidth=H,
        draw=False,
        estimator="plugin",
    )
    E2 = kdecal.conditional_expectation(P[:, 2], (y == 2).astype(int), bandwidth=H)[:, 1]
    order = np.argsort(P[:, 2], kind="stable")
    np.testing.assert_allclose(one.y, E2[order], rtol=1e-10, atol=1e-14)
    allk = kp.reliability_diagram(
        P, y, kind="kernel", calibration="classwise", bandwidth=H, draw=False, estimator="plugin"
    )
    assert allk.x.shape == (4, 300) and allk.density.shape == (4, 200)
    np.testing.assert_allclose(allk.y[2], one.y, rtol=1e-12)
    assert np.mean(allk.ece) == pytest.approx(
        kdecal.ece_kde(P, y, p=1, bandwidth=H, calibration="classwise"), rel=1e-10
    )
    can = kp.reliability_diagram(
        P, y, kind="kernel", calibration="canonical", bandwidth=H, draw=False, estimator="plugin"
    )
    E = kdecal.conditional_expectation(P, y, bandwidth=H)
    conf = P.max(axis=1)
    order = np.argsort(conf, kind="stable")
    np.testing.assert_allclose(can.y, E[np.arange(300), P.argmax(axis=1)][order], rtol=1e-10)
    assert can.ece == pytest.approx(kdecal.ece_kde(P, y, p=1, bandwidth=H), rel=1e-10)
    binned = kdecal.binned.binned_statistics(P, y)  # the same (right-closed) bins
    np.testing.assert_array_equal(can.counts, binned.counts)


def test_reliability_grid_curve_and_density_are_beta_kernel_nw():
    """Grid curve = plain (not LOO) Beta-kernel regression: t + that of the residuals by
    default, the Nadaraya-Watson ratio for the plug-in; density = KDE."""
    P, y = _data(n=120)
    rd = kp.reliability_diagram(P, y, kind="kernel", bandwidth=H, n_grid=11, draw=False)
    plug = kp.reliability_diagram(
        P, y, kind="kernel", bandwidth=H, n_grid=11, draw=False, estimator="plugin"
    )
    conf, correct = _top_label(P, y)
    q = np.clip(conf, 1e-12, 1 - 1e-12)
    for i in range(1, 10):
        t = rd.grid[i]
        k = stats.beta.pdf(t, q / H + 1, (1 - q) / H + 1)
        assert rd.grid_curve[i] == pytest.approx(
            t + np.sum(k * (correct - q)) / np.sum(k), rel=1e-9, abs=1e-12
        )
        assert plug.grid_curve[i] == pytest.approx(np.sum(k * correct) / np.sum(k), rel=1e-9)
        assert rd.density[i] == plug.density[i] == pytest.approx(np.mean(k), rel=1e-9)
    # the density integrates to ~1 over [0, 1]
    fine = kp.reliability_diagram(P, y, kind="kernel", bandwidth=H, n_grid=2001, draw=False)
    assert _trapz(fine.density, fine.grid) == pytest.approx(1.0, abs=2e-3)


# ------------------------------------------------------ calibration-sharpness diagram
def _gauss_nw(t, x, v, s):
    k = stats.norm.pdf(t, loc=x, scale=s)
    return np.sum(k * v) / np.sum(k), np.mean(k)


@pytest.mark.filterwarnings("ignore:kdecal.evaluate. the canonical KL")  # K = 5
def test_sharpness_curves_against_brute_force():
    P, y = _data(n=250, K=5)
    cs = kp.calibration_sharpness_diagram(P, y, n_grid=21, draw=False)
    conf, correct = _top_label(P, y)
    brier = np.sum((P - np.eye(5)[y]) ** 2, axis=1)
    for i in (0, 5, 13, 20):
        t = cs.t[i]
        m_acc, kde = _gauss_nw(t, conf, correct, 0.05)
        m_loss, _ = _gauss_nw(t, conf, brier, 0.05)
        assert cs.accuracy_curve[i] == pytest.approx(m_acc, rel=1e-9)
        assert cs.loss_curve[i] == pytest.approx(m_loss, rel=1e-9)
        assert cs.kde[i] == pytest.approx(kde, rel=1e-9)
        assert cs.rho[i] == pytest.approx(m_loss - (m_acc - t) ** 2, rel=1e-9)
    band = cs.kde * cs.rho
    np.testing.assert_allclose(cs.upper, cs.accuracy_curve + band / 2)
    np.testing.assert_allclose(cs.lower, np.maximum(cs.accuracy_curve - band / 2, 0))
    assert cs.density.max() == 1.0
    # box values: plug-in CAL at every point, TOT = the Brier score of kdecal.evaluate
    m_at = np.array([_gauss_nw(h, conf, correct, 0.05)[0] for h in conf])
    assert cs.calibration == pytest.approx(np.mean((m_at - conf) ** 2), rel=1e-9)
    assert cs.calibration_std is None
    a5 = np.mean(m_at**2 - conf**2 - 2 * conf * (correct - conf))
    assert cs.calibration_a5 == pytest.approx(a5, rel=1e-9)
    ev = kdecal.evaluate(P, y, bandwidth=H, n_resamples=0, notions=())
    assert cs.total == pytest.approx(ev.brier_score, rel=1e-12)


@pytest.mark.filterwarnings("ignore:kdecal.evaluate. the canonical KL")  # K = 5
def test_sharpness_band_area_is_total_minus_calibration():
    """Chidambaram & Ge 2024, Sec. 6.5: integral of p * rho ~ TOT - CAL; exact for the loss term."""
    P, y = _data(n=2000, K=10, alpha=0.5, temperature=1.3)
    cs = kp.calibration_sharpness_diagram(P, y, draw=False)
    assert cs.band_area == pytest.approx(cs.total - cs.calibration, rel=0.03)
    # over the whole line the loss regression integrates exactly to TOT
    wide = np.linspace(-0.5, 1.5, 4001)
    full = kdecal.curves._sharpness_arrays(P, y, "l2", 0.05, 2, 0, 5000, 0, grid=wide)
    assert _trapz(full.kde * full.loss_curve, wide) == pytest.approx(full.total, rel=1e-6)
    # KL: TOT is the log loss; every band length is finite
    kl = kp.calibration_sharpness_diagram(P, y, divergence="kl", draw=False)
    ev = kdecal.evaluate(P, y, bandwidth=H, debias="none", n_resamples=0, notions=())
    assert kl.total == pytest.approx(ev.log_loss, rel=1e-12)
    assert np.all(np.isfinite(kl.rho)) and kl.band_area == pytest.approx(
        kl.total - kl.calibration, rel=0.05
    )


def test_sharpness_large_n_binned_sums_match_exact():
    """Past 2e8 kernel evaluations the sums are linearly binned: same curves to ~1e-6."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.beta(8, 1, 3000), rng.uniform(0.3, 0.6, 50)])
    v = np.stack([(rng.random(x.size) < x).astype(float), rng.random(x.size)])
    t = np.linspace(0, 1, 500)
    m1, k1 = kdecal.curves._gaussian_nw(t, x, v, 0.05, exact=True)
    m2, k2 = kdecal.curves._gaussian_nw(t, x, v, 0.05, exact=False)
    np.testing.assert_allclose(m2, m1, atol=1e-5)
    np.testing.assert_allclose(k2, k1, rtol=1e-4, atol=1e-6 * k1.max())
    # narrow kernels get finer nodes (8192 at every sigma erred by 1e-2 at sigma = 3e-4)
    for sigma in (3e-3, 3e-4):
        m1, k1 = kdecal.curves._gaussian_nw(t, x, v, sigma, exact=True)
        m2, k2 = kdecal.curves._gaussian_nw(t, x, v, sigma, exact=False)
        dense = k1 > 1e-3 * k1.max()
        np.testing.assert_allclose(m2[:, dense], m1[:, dense], atol=3e-5)
        np.testing.assert_allclose(k2[dense], k1[dense], rtol=2e-4)


def test_sharpness_at_tiny_bandwidths_is_the_nearest_points_value():
    # z^2 overflowed at sigma = 1e-160: every curve and the density were NaN
    rng = np.random.default_rng(7)
    x = rng.random(40)
    v = (rng.random((1, 40)) < x).astype(float)
    t = np.linspace(0, 1, 33)
    m, kde = kdecal.curves._gaussian_nw_exact(t, x, v, 1e-160)
    nearest = np.argmin(np.abs(t[:, None] - x[None, :]), axis=1)
    np.testing.assert_array_equal(m[0], v[0, nearest])
    assert np.all(kde == 0.0)  # no grid point on a score
    m2, _ = kdecal.curves._gaussian_nw_exact(t, x, v, 0.05)
    m3, _ = kdecal.curves._gaussian_nw_exact(t, x, v, 0.05 * (1 + 1e-15))
    np.testing.assert_allclose(m2, m3, rtol=1e-12)


def test_sharpness_binary_and_subsampling():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, 600)
    y = (rng.random(600) < p**1.5).astype(int)
    cs = kp.calibration_sharpness_diagram(p, y, n_grid=11, draw=False)
    # binary: h = p, a = y (Chidambaram & Ge 2024, binary case)
    m, _ = _gauss_nw(cs.t[4], p, y, 0.05)
    assert cs.accuracy_curve[4] == pytest.approx(m, rel=1e-9)
    assert cs.total == pytest.approx(np.mean((p - y) ** 2), rel=1e-12)
    sub = kp.calibration_sharpness_diagram(p, y, n_subsamples=10, n_points=200, draw=False)
    again = kp.calibration_sharpness_diagram(p, y, n_subsamples=10, n_points=200, draw=False)
    assert sub.calibration_std > 0 and sub.calibration == again.calibration
    assert sub.calibration == pytest.approx(cs.calibration, rel=0.5)


# -------------------------------------------------------------------- simplex density
@pytest.mark.usefixtures("plugin_estimator")
def test_simplex_density_cells_and_kde():
    s = kdecal.datasets.make_seeds_synthetic(400, 3, seed=1)
    sd = kp.simplex_density(
        s.probs, s.labels, bandwidth=0.05, resolution=40, draw=False, estimator="plugin"
    )
    assert sd.estimator == "plugin"
    m = sd.n_bins_per_side
    assert sd.cell_vertices.shape == (m * m, 3, 3) and sd.cell_counts.sum() == 400
    # equal-area cells tiling the simplex (chart area 1/2)
    V = sd.cell_vertices[:, :, :2]
    d1, d2 = V[:, 1] - V[:, 0], V[:, 2] - V[:, 0]
    area = 0.5 * np.abs(d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])
    np.testing.assert_allclose(area, 0.5 / m**2, rtol=1e-9)
    # every point lies in its cell (the rule of kdecal.binned.simplex_ece)
    keys = kdecal.binned._simplex_cell_keys(np.asarray(s.probs), m)
    lookup = {tuple(k): i for i, k in enumerate(kdecal.curves._all_cells(m)[0].tolist())}
    for p, key in zip(s.probs[:50], np.concatenate(keys, axis=1).tolist()):
        lam = np.linalg.solve(sd.cell_vertices[lookup[tuple(key)]].T, p)
        assert np.all(lam >= -1e-9)
    assert np.sum(sd.cell_density * 0.5 / m**2) == pytest.approx(1.0)
    assert sd.simplex_ece == kdecal.binned.simplex_ece(s.probs, s.labels, n_bins_per_side=m)
    assert sd.ece_kde == pytest.approx(kdecal.ece_kde(s.probs, s.labels, p=1, bandwidth=0.05))
    # the KDE is the mean of Dirichlet densities; it integrates to ~1 over the simplex
    P = np.clip(s.probs, 1e-12, None)
    for i in (100, 400, 700):
        u = sd.grid[i]
        if np.all(u > 0):
            ref = np.mean([stats.dirichlet.pdf(u, row / 0.05 + 1) for row in P])
            assert sd.kde[i] == pytest.approx(ref, rel=1e-8)
    big = kp.simplex_density(s.probs, bandwidth=0.2, resolution=240, draw=False)
    # piecewise-linear quadrature on the grid's triangles (area 1 / (2 r^2)): a grid point
    # is a vertex of 6 (interior), 3 (edge) or 1 (corner) of them
    n_tri = np.array([6, 3, 1])[np.sum(big.grid == 0, axis=1)]
    assert np.sum(n_tri * big.kde) / (6 * 240**2) == pytest.approx(1.0, rel=1e-2)  # O(1/r)
    assert big.cell_frequency is None and big.simplex_ece is None
    # predictions on vertices and edges fall in cells of the triangulation too
    corner = np.array(
        [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.5, 0], [0, 0.5, 0.5], [0.2, 0.3, 0.5]]
    )
    sd = kp.simplex_density(
        corner, [0, 1, 2, 0, 1, 2], bandwidth=0.1, n_bins_per_side=4, resolution=8, draw=False
    )
    assert sd.cell_counts.sum() == 6 and sd.simplex_ece == kdecal.binned.simplex_ece(
        corner, [0, 1, 2, 0, 1, 2], n_bins_per_side=4
    )


# -------------------------------------------------------------------- Bayes risk curve
def _binary(n=500, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(int)
    z = rng.normal(1.2 * (2 * y - 1), 1.0)
    return 1 / (1 + np.exp(-scale * z)), y


def test_bayes_risk_area_is_cross_entropy():
    p, y = _binary()
    ends = np.geomspace(1e-7, 0.01, 3000)
    t = np.unique(np.concatenate([[0.0], ends, np.linspace(0.01, 0.99, 200001), 1 - ends, [1]]))
    br = kp.bayes_risk_curve(p, y, thresholds=t, draw=False)
    ev = kdecal.evaluate(p, y, bandwidth=H, n_resamples=0, notions=())
    assert br.cross_entropy[0] == pytest.approx(ev.log_loss, rel=1e-12)
    assert _trapz(br.risk[0], t) == pytest.approx(ev.log_loss, rel=1e-3)
    bs = kp.bayes_risk_curve(p, y, weight="beta22", thresholds=t, draw=False)
    assert bs.brier[0] == pytest.approx(ev.brier_score, rel=1e-12)
    assert _trapz(bs.risk[0], t) == pytest.approx(1.5 * ev.brier_score, rel=1e-3)
    nb = kp.bayes_risk_curve(p, y, normalize=True, thresholds=t, draw=False)
    pi = y.mean()
    assert _trapz(nb.risk[0], t) == pytest.approx(
        ev.log_loss / -(pi * np.log(pi) + (1 - pi) * np.log(1 - pi)), rel=1e-3
    )
    assert nb.normalized_cross_entropy[0] == pytest.approx(_trapz(nb.risk[0], t), 1e-3)


def test_bayes_risk_against_cost_matrix():
    """Risk(t) from Ferrer & Ramos Eq. 34 with a_1 = 1 - t: decide D2 iff q1 < a1."""
    p, y = _binary(n=80, seed=2)
    br = kp.bayes_risk_curve(p, y, n_grid=11, draw=False)
    q = np.stack([1 - p, p], axis=1)
    for t, r in zip(br.threshold[1:-1], br.risk[0, 1:-1]):
        a1 = 1 - t
        C = np.array([[0, 1 / a1], [1 / (1 - a1), 0]])
        d = np.where(q[:, 0] < a1, 1, 0)
        assert r == pytest.approx(np.mean(C[y, d]), rel=1e-12)
    i = np.argmin(np.abs(br.threshold - 0.5))
    assert br.risk[0, i] == pytest.approx(2 * br.error_rate[0])
    # several systems: mapping, per-system labels; (n, 2) input == (n,) input
    p2, y2 = _binary(n=60, seed=3, scale=3.0)
    many = kp.bayes_risk_curve(
        {"a": p, "b": np.stack([1 - p2, p2], 1)}, {"a": y, "b": y2}, n_grid=11, draw=False
    )
    assert many.names == ("a", "b") and many.risk.shape == (2, 11)
    np.testing.assert_allclose(many.risk[0], br.risk[0])
    np.testing.assert_allclose(
        many.risk[1], kp.bayes_risk_curve(p2, y2, n_grid=11, draw=False).risk[0]
    )


# ----------------------------------------------------------------------------- errors
def _msg(fn, *args, **kw):
    with pytest.raises((ValueError, TypeError)) as e:
        fn(*args, **kw)
    return type(e.value), str(e.value)


@pytest.mark.parametrize(
    "probs, labels",
    [
        ([[0.5, 0.5, 0.0], [np.nan, 0.5, 0.5], [0.2, 0.3, 0.5]], [0, 1, 2]),
        ([[0.5, 0.6, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]], [0, 1, 2]),
        ([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]], [0, 1, 3]),
        ([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]], [0, 1]),
        ([["a", "b", "c"]] * 3, [0, 1, 2]),
    ],
)
def test_bad_input_same_errors_as_metrics(probs, labels):
    ref = _msg(kdecal.ece_kde, probs, labels, bandwidth=H)
    assert _msg(kp.reliability_diagram, probs, labels, kind="kernel", draw=False) == ref
    assert _msg(kp.reliability_diagram, probs, labels, draw=False) == _msg(
        kdecal.binned.ece, probs, labels
    )
    assert _msg(kp.calibration_sharpness_diagram, probs, labels, draw=False) == ref
    assert _msg(kp.simplex_density, probs, labels, bandwidth=H, draw=False) == ref


def test_bad_options():
    P, y = _data(n=30)
    with pytest.raises(ValueError, match="kind must be one of"):
        kp.reliability_diagram(P, y, kind="bars", draw=False)
    with pytest.raises(ValueError, match="needs kind='kernel'"):
        kp.reliability_diagram(P, y, calibration="canonical", draw=False)
    with pytest.raises(ValueError, match="class_index must be an integer in 0..3"):
        kp.reliability_diagram(
            P, y, kind="kernel", calibration="classwise", class_index=4, draw=False
        )
    with pytest.raises(ValueError, match="n_bins must be an integer >= 1"):
        kp.reliability_diagram(P, y, n_bins=0, draw=False)
    with pytest.raises(TypeError, match="n_bins must be an integer >= 1"):
        kp.reliability_diagram(P, y, kind="kernel", n_bins=2.0, draw=False)
    with pytest.raises(ValueError, match="bandwidth must be a finite float > 0"):
        kp.reliability_diagram(P, y, kind="kernel", bandwidth=-1.0, draw=False)
    with pytest.raises(TypeError, match="Gaussian kernel"):
        kp.calibration_sharpness_diagram(P, y, bandwidth="auto", draw=False)
    with pytest.raises(ValueError, match="divergence must be one of"):
        kp.calibration_sharpness_diagram(P, y, divergence="brier", draw=False)
    with pytest.raises(ValueError, match="K = 3 classes"):
        kp.simplex_density(P, y, draw=False)
    with pytest.raises(ValueError, match="binary problems"):
        kp.bayes_risk_curve(P, y, draw=False)
    with pytest.raises(ValueError, match="must lie in 0..1"):
        kp.bayes_risk_curve(np.full(5, 0.3), [0, 1, 2, 0, 1], draw=False)
    with pytest.raises(ValueError, match="labels has 1 arrays for 2 systems"):
        kp.bayes_risk_curve([np.full(5, 0.3)] * 2, [np.zeros(5, int)], draw=False)
    with pytest.raises(TypeError, match="draw must be True or False"):
        kp.reliability_diagram(P, y, draw="no")


def test_compute_does_not_import_matplotlib():
    code = (
        "import sys, numpy as np, kdecal.plot as kp\n"
        "P = np.random.default_rng(0).dirichlet([1, 1, 1], 50); y = P.argmax(1)\n"
        "kp.reliability_diagram(P, y, kind='kernel', bandwidth=0.1, draw=False)\n"
        "kp.calibration_sharpness_diagram(P, y, draw=False)\n"
        "kp.simplex_density(P, y, bandwidth=0.1, resolution=10, draw=False)\n"
        "kp.bayes_risk_curve(P[:, 0], (y == 0).astype(int), draw=False)\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_matplotlib_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    P, y = _data(n=30)
    with pytest.raises(ImportError, match=r"pip install 'kdecal\[plot\]'"):
        kp.reliability_diagram(P, y)
    with pytest.raises(ImportError, match=r"kdecal\[plot\]"):
        kp.evaluation_page(P, y)


# -------------------------------------------------------------------------- rendering
@pytest.fixture
def plt():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def _png(fig, tmp_path, dpi=50):
    """Save, read back, and check the image is not blank; return its (h, w)."""
    import matplotlib.image

    path = tmp_path / "fig.png"
    fig.savefig(path, dpi=dpi)
    img = matplotlib.image.imread(path)
    assert img[..., :3].std() > 0.05  # not blank
    w, h = fig.get_size_inches() * dpi
    assert img.shape[:2] == (round(h), round(w))
    return img.shape[:2]


def test_render_reliability(plt, tmp_path):
    P, y = _data()
    for kw in (
        {},
        {"kind": "kernel", "bandwidth": H},
        {"kind": "kernel", "calibration": "canonical", "bandwidth": H},
    ):
        rd = kp.reliability_diagram(P, y, **kw)
        assert rd.hist_ax is not None and rd.ax.figure is rd.hist_ax.figure
        _png(rd.ax.figure, tmp_path)
    fig, axs = plt.subplots(2, 2, figsize=(6, 6))
    cw = kp.reliability_diagram(P, y, calibration="classwise", ax=axs)
    assert len(cw.ax) == 4 and len(cw.hist_ax) == 4
    _png(fig, tmp_path)
    cw = kp.reliability_diagram(P, y, kind="kernel", calibration="classwise", bandwidth=H)
    assert sum(a.get_visible() for a in cw.ax[0].figure.axes) >= 8
    with pytest.raises(ValueError, match="sequence of K = 4 Axes"):
        kp.reliability_diagram(P, y, calibration="classwise", ax=axs[0])


def test_render_other_plots(plt, tmp_path):
    P, y = _data(n=200, K=3)
    cs = kp.calibration_sharpness_diagram(P, y, n_grid=200)
    assert cs.ax.get_ylim()[0] == 0 and cs.ax.get_xlim() == (0, 1)
    _png(cs.ax.figure, tmp_path)
    sd = kp.simplex_density(P, y, bandwidth=0.05, resolution=30)
    assert len(sd.ax) == 2
    _png(sd.ax[0].figure, tmp_path)
    p, yb = _binary()
    br = kp.bayes_risk_curve([p, p**2], yb, names=["a", "a squared"], n_grid=201)
    assert len(br.ax.get_lines()) == 2
    _png(br.ax.figure, tmp_path)
    fig = kp.evaluation_page(P, y, bandwidth=H)
    assert _png(fig, tmp_path, dpi=20) == (240, 360)


def _texts(ax):
    """Title, axis labels and the legend's texts of an Axes (what a picture says)."""
    legend = ax.get_legend()
    entries = [] if legend is None else [t.get_text() for t in legend.get_texts()]
    return ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), entries, len(ax.get_lines())


def test_draw_computed_curves_as_the_drawing_functions(plt, tmp_path):
    """kp.draw(data) draws what the function of the same diagram draws, from the arrays."""
    P, y = _data(n=200, K=3)
    p, yb = _binary()
    cases = [
        (kp.reliability_diagram, (P, y), {"kind": "kernel", "bandwidth": H}, {"title": "t"}),
        (kp.reliability_diagram, (P, y), {"calibration": "classwise"}, {}),
        (kp.calibration_sharpness_diagram, (P, y), {"n_grid": 50}, {"title": "cs"}),
        (kp.simplex_density, (P, y), {"bandwidth": H, "resolution": 12}, {"max_points": 50}),
        (kp.bayes_risk_curve, ([p, p**2], yb), {"n_grid": 51}, {"ylim": 3.0}),
    ]
    for fn, args, kw, style in cases:
        data = fn(*args, **kw, draw=False)
        drawn = kp.draw(data, **style)
        direct = fn(*args, **kw, **style)
        assert data.ax is None and type(drawn) is type(data)
        for name in ("x", "t", "kde", "risk"):
            if hasattr(data, name):
                assert getattr(drawn, name) is getattr(data, name)  # nothing recomputed
        axs, ref = np.ravel(drawn.ax), np.ravel(direct.ax)
        assert len(axs) == len(ref)
        for a, b in zip(axs, ref):
            assert _texts(a) == _texts(b)
        _png(axs[0].figure, tmp_path)
    # from an estimate: its kernel sums, on Axes of one's own
    est = kdecal.estimate(P, y, bandwidth=H, progress=False)
    _, ax = plt.subplots()
    rd = kp.draw(kdecal.curves.ReliabilityDiagram.from_estimate(est), ax=ax)
    assert rd.ax is ax and "h = 0.05" in ax.get_title()
    sd = kp.draw(kdecal.curves.SimplexDensity.from_estimate(est, resolution=12))
    assert len(sd.ax) == 2 and "ECE" in sd.ax[1].get_title()


def test_draw_errors(plt):
    P, y = _data(n=60, K=3)
    rd = kdecal.curves.ReliabilityDiagram.from_predictions(P, y)
    with pytest.raises(TypeError, match="style option.*'max_points'.*its options: title"):
        kp.draw(rd, max_points=10)
    with pytest.raises(TypeError, match="data must be a ReliabilityDiagram"):
        kp.draw((P, y))
    sd = kdecal.curves.SimplexDensity.from_predictions(P, y, bandwidth=H, resolution=5)
    with pytest.raises(ValueError, match="class_names must have 3 entries"):
        kp.draw(sd, class_names=["a", "b"])
    with pytest.raises(ValueError, match="ax must be a sequence of 2 Axes"):
        kp.draw(sd, ax=[plt.subplots()[1]])


def test_drawing_functions_compute_once(plt, monkeypatch):
    """A drawing function computes its arrays by one from_predictions call, nothing else."""
    P, y = _data(n=60, K=3)
    calls = []
    for cls in (
        kdecal.curves.ReliabilityDiagram,
        kdecal.curves.CalibrationSharpnessDiagram,
        kdecal.curves.SimplexDensity,
        kdecal.curves.BayesRiskCurve,
    ):

        def counted(*args, _orig=cls.from_predictions, _name=cls.__name__, **kwargs):
            calls.append(_name)
            return _orig(*args, **kwargs)

        monkeypatch.setattr(cls, "from_predictions", counted)
    kp.reliability_diagram(P, y, kind="kernel", bandwidth=H)
    kp.calibration_sharpness_diagram(P, y, n_grid=20)
    kp.simplex_density(P, y, bandwidth=H, resolution=5)
    kp.bayes_risk_curve(P[:, 0], (y == 0).astype(int), n_grid=11)
    assert calls == [
        "ReliabilityDiagram",
        "CalibrationSharpnessDiagram",
        "SimplexDensity",
        "BayesRiskCurve",
    ]


# -------------------------------------------------------------------------------- CLI
def test_cli_plot_writes_png(plt, tmp_path, capsys):
    P, y = _data(n=200, K=3)
    f = tmp_path / "preds.npz"
    np.savez(f, probs=P, labels=y)
    out = tmp_path / "page.png"
    argv = ["evaluate", str(f), "--bandwidth", "0.05", "--n-resamples", "0", "--quiet", "--json"]
    assert main([*argv, "--plot", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n"] == 200
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.shape[:2] == (1200, 1800) and img[..., :3].std() > 0.05
    for bad, what in (
        (tmp_path / "no" / "page.png", "does not exist"),
        (tmp_path / "p.xyz", "xyz"),
    ):
        assert main([*argv, "--plot", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kdecal: error: --plot") and what in err[0]


def test_cli_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    P, y = _data(n=50, K=3)
    f = tmp_path / "preds.npz"
    np.savez(f, probs=softmax(np.log(P), axis=1), labels=y)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main(["evaluate", str(f), "--quiet", "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "kdecal[plot]" in err and len(err.strip().splitlines()) == 1
