"""kdecal.curves (plot arrays without matplotlib), the bin rule of kdecal.binned and the
array-API formulas shared by kdecal and kdecal.torch, against independent references."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import kdecal
from kdecal import _formulas as F
from kdecal import curves

H = 0.05


def _data(n=200, K=4, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), size=n)
    y = np.array([rng.choice(K, p=p) for p in P])
    return P, y


# ------------------------------------------------------------------------- bin rule
def test_bin_index_right_closed_first_bin_closed():
    edges = np.array([0.0, 0.25, 0.5, 1.0])
    x = np.array([-0.1, 0.0, 0.1, 0.25, 0.2500001, 0.5, 0.75, 1.0, 1.5])
    # brute force: the first b with x <= edges[b + 1], clamped to the bins
    want = [min(next((b for b in range(3) if v <= edges[b + 1]), 2), 2) for v in x]
    assert kdecal.binned.bin_index(x, edges).tolist() == want == [0, 0, 0, 0, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError, match="edges must be 1-D with at least 2"):
        kdecal.binned.bin_index(x, [0.5])


def test_bin_means_against_loop():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.random(50), [0.0, 0.2, 1.0]])
    y = rng.random(x.size)
    bx, by = curves.bin_means(x, y, 5)
    ref = {}
    for a, b in zip(x, y):
        k = max(0, int(np.ceil(a * 5)) - 1)  # (k/5, (k+1)/5], 0 in the first bin
        ref.setdefault(k, []).append((a, b))
    keys = sorted(ref)
    np.testing.assert_allclose(bx, [np.mean([a for a, _ in ref[k]]) for k in keys], rtol=1e-14)
    np.testing.assert_allclose(by, [np.mean([b for _, b in ref[k]]) for k in keys], rtol=1e-14)


# --------------------------------------------------------------------------- curves
@pytest.mark.usefixtures("plugin_estimator")
def test_curves_equal_plot_arrays_and_kernel_estimates():
    P, y = _data()
    rd = curves.reliability_diagram(P, y, kind="kernel", calibration="classwise", bandwidth=H)
    same = kdecal.plot.reliability_diagram(
        P, y, kind="kernel", calibration="classwise", bandwidth=H, draw=False
    )
    np.testing.assert_array_equal(rd.y, same.y)
    np.testing.assert_array_equal(rd.grid_curve, same.grid_curve)
    assert rd.ax is None
    # the kernel values at the data points are the class-wise conditional expectations
    E = kdecal.estimate(P, y, bandwidth=H, calibration="classwise", debias="none")
    E = E.conditional_expectation
    for c in range(4):
        order = np.argsort(np.clip(P[:, c], 1e-12, None), kind="stable")
        np.testing.assert_allclose(rd.y[c], E[order, c], rtol=1e-12)
    cs = curves.calibration_sharpness_diagram(P, y, n_grid=11)
    assert cs.total == pytest.approx(kdecal.scores.brier_score(P, y), rel=1e-12)
    br = curves.bayes_risk_curve(P[:, 1] / P[:, :2].sum(1), (y == 1).astype(int), n_grid=11)
    assert br.risk.shape == (1, 11)


def test_dirichlet_grid_against_scipy():
    rng = np.random.default_rng(2)
    C = rng.dirichlet(np.ones(3), size=40)
    U = rng.dirichlet(np.ones(3), size=7)
    v = rng.random((2, 40))
    log_dens, m = curves._dirichlet_grid(C, np.log(U), 0.1, v)
    for g, u in enumerate(U):
        k = np.array([stats.dirichlet.pdf(u, c / 0.1 + 1) for c in C])
        assert np.exp(log_dens[g]) == pytest.approx(np.mean(k), rel=1e-10)
        np.testing.assert_allclose(m[:, g], v @ k / k.sum(), rtol=1e-10)
    # far from every centre the regression is the value of the nearest kernel, not 0/0
    C2 = np.array([[0.9, 0.1], [0.1, 0.9]])
    far = np.log(np.array([[1 - 1e-12, 1e-12]]))
    _, m2 = curves._dirichlet_grid(C2, far, 1e-4, np.array([[3.0, 5.0]]))
    assert m2[0, 0] == 3.0


def test_curves_import_no_matplotlib():
    code = (
        "import sys, numpy as np, kdecal.curves as c\n"
        "P = np.random.default_rng(0).dirichlet(np.ones(3), 50); y = P.argmax(1)\n"
        "c.reliability_diagram(P, y, kind='kernel', bandwidth=0.1)\n"
        "c.simplex_density(P, y, bandwidth=0.1, resolution=5)\n"
        "print('matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


# ------------------------------------------------------------------------- formulas
def test_formulas_closed_forms():
    rng = np.random.default_rng(3)
    E = rng.dirichlet(np.ones(4), size=(2, 30))
    f = rng.dirichlet(np.ones(4), size=(2, 30))
    lab = rng.integers(0, 4, size=(2, 30))
    np.testing.assert_allclose(F.kl_rows(E, f), stats.entropy(E, f, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(F.neg_entropy_rows(E), -stats.entropy(E, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(F.lp_rows(E, f, 3.0), np.sum(np.abs(E - f) ** 3, -1), rtol=1e-14)
    # the debiased form with sq = E^2 is the plain squared distance
    np.testing.assert_allclose(F.lp_rows(E, f, 2.0, E * E), F.squared_rows(E, f), atol=1e-15)
    Y = np.eye(4)[lab]
    np.testing.assert_allclose(F.risk_rows("kl", f, lab, False), -np.log(f[Y == 1].reshape(2, 30)))
    np.testing.assert_allclose(
        F.risk_rows("l2", f, lab, False), np.sum((Y - f) ** 2, -1) - 1.0, atol=1e-15
    )
    # binary problems: the positive coordinate only
    np.testing.assert_allclose(
        F.divergence_rows("l2", E, f, True), (E[..., 1] - f[..., 1]) ** 2, atol=1e-15
    )


def test_problem_arrays_notions():
    P = np.array([[0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.0, 0.0, 1.0]])
    P = F.clip_rows(P)
    y = np.array([1, 2, 2])
    pts, lab = F.problem_arrays(P, y, "top_label")
    assert lab.tolist() == [[1, 0, 1]]
    np.testing.assert_allclose(pts[0, :, 1], P.max(axis=1), rtol=1e-15)
    pts, lab = F.problem_arrays(P, y, "classwise")
    assert pts.shape == (3, 3, 2) and lab.tolist() == [[0, 0, 0], [1, 0, 0], [0, 1, 1]]
    np.testing.assert_allclose(pts[:, :, 1], P.T, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(pts.sum(-1), 1.0, rtol=1e-15)


def test_formulas_same_numbers_on_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    P = rng.dirichlet(np.ones(3), size=20)
    y = rng.integers(0, 3, size=20)
    E = rng.dirichlet(np.ones(3), size=(1, 20))
    Pt, yt, Et = torch.from_numpy(P), torch.from_numpy(y), torch.from_numpy(E)
    for cal in ("canonical", "top_label", "classwise"):
        a, la = F.problem_arrays(F.simplex_points(P), y, cal)
        b, lb = F.problem_arrays(F.simplex_points(Pt), yt, cal)
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-15)
        np.testing.assert_array_equal(lb.numpy(), la)
    for div in ("kl", "l2"):
        a = F.divergence_rows(div, E, P[None], False)
        b = F.divergence_rows(div, Et, Pt[None], False)
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-13)
    # x log x has a finite gradient at 0 on torch
    x = torch.tensor([0.0, 0.5], dtype=torch.float64, requires_grad=True)
    F.xlogx(x).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0] == 0.0


def test_canonical_curve_from_a_report_needs_no_kernel_pass(monkeypatch):
    """The evaluation page's canonical panel reuses the report's canonical estimate:
    the plug-in ratio of its kernel sums, the same arrays as a fresh plug-in estimate at
    that bandwidth (to rounding), and no engine call."""
    from kdecal import curves as _curves
    from kdecal._engine import backends as _engine_backends

    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.ones(4), size=400)
    y = np.array([rng.choice(4, p=p) for p in P])
    report = kdecal.evaluate(P, y, n_resamples=0, calibration_loss=False)
    canon = report.estimates["canonical"]
    h = canon.bandwidth
    fresh = _curves._reliability_arrays(P, y, "kernel", "canonical", None, 15, h, 200, "auto")

    def no_pass(*args, **kwargs):
        raise AssertionError("a kernel pass ran")

    monkeypatch.setattr(_engine_backends, "loo_reduce", no_pass)
    reused = _curves._reliability_arrays(
        P, y, "kernel", "canonical", None, 15, h, 200, "auto", canon
    )
    assert reused.bandwidth == fresh.bandwidth == h
    np.testing.assert_allclose(reused.x, fresh.x, rtol=0, atol=0)
    np.testing.assert_allclose(reused.y, fresh.y, rtol=1e-12, atol=1e-15)
    assert reused.ece == pytest.approx(fresh.ece, rel=1e-12)
