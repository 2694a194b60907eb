"""Tests of kdecal.smooth: the smooth ECE of Błasiok & Nakkiran (ICLR 2024).

The reference is the published definition materialised in float64: the reflected Gaussian
kernel as an explicit sum over 2 x 61 images, the integral of |g| by scipy's adaptive
quadrature (QUADPACK) between the roots of g, found on a grid and refined by brentq.
It shares no code with the module (which uses a cosine series or a windowed image sum
and Gauss-Legendre panels).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize
from scipy.special import softmax

from kdecal import smooth

# ------------------------------------------------------------------------ reference
_K = np.arange(-30, 31, dtype=np.float64)


def ref_g(t, f, r, sigma):
    """(1/n) sum_i r_i K^R_sigma(t, f_i), K^R = sum_k phi(t - f - 2k) + phi(t + f - 2k)."""
    t = np.atleast_1d(np.asarray(t, dtype=np.float64))
    c = np.concatenate([f[None, :] + 2.0 * _K[:, None], -f[None, :] + 2.0 * _K[:, None]])
    d = (t[:, None, None] - c[None, :, :]) / sigma
    K = np.exp(-0.5 * d * d).sum(axis=1) / (math.sqrt(2.0 * math.pi) * sigma)  # (m, n)
    return K @ r / f.shape[0]


def ref_smece_sigma(f, y, sigma, grid=2001):
    """int_0^1 |g(t)| dt by QUADPACK on the pieces between the roots of g."""
    f = np.asarray(f, dtype=np.float64)
    r = np.asarray(y, dtype=np.float64) - f
    t = np.linspace(0.0, 1.0, grid)
    g = ref_g(t, f, r, sigma)
    cuts = [0.0]
    for j in np.flatnonzero(g[1:] * g[:-1] < 0):
        cuts.append(
            optimize.brentq(lambda x: ref_g(x, f, r, sigma)[0], t[j], t[j + 1], xtol=1e-15)
        )
    cuts.append(1.0)
    total = 0.0
    for a, b in zip(cuts[:-1], cuts[1:]):
        v, _ = integrate.quad(
            lambda x: abs(ref_g(x, f, r, sigma)[0]), a, b, epsabs=1e-15, epsrel=1e-13, limit=200
        )
        total += v
    return total


def binary_sample(n, seed):
    rng = np.random.default_rng(seed)
    f = rng.beta(2.0, 3.0, n)
    y = (rng.random(n) < np.clip(f + 0.1 * np.sin(6.0 * f), 0.0, 1.0)).astype(np.int64)
    return f, y


# ------------------------------------------------------------------ definition, exact
@pytest.mark.parametrize("sigma", [0.004, 0.03, 0.2, 1.0])
def test_smece_sigma_matches_materialised_definition(sigma):
    # sigma = 0.004 uses the windowed image sum, the others the cosine series
    f, y = binary_sample(80, seed=1)
    got = smooth.smooth_ece(f, y, sigma=sigma, calibration="classwise")
    assert got == pytest.approx(ref_smece_sigma(f, y, sigma), abs=1e-9)


@pytest.mark.parametrize("sigma", [0.004, 0.03, None])
def test_tied_predictions_match_the_definition_over_rows(sigma):
    # rows with equal predictions are summed as one value (their residuals added), and
    # the fixed point's bracket takes the rows' own mass sum |r_i| / n: the definition
    # over all rows, with ties of both outcomes at one prediction
    f, y = binary_sample(90, seed=5)
    f = np.round(f, 1)  # about ten distinct values
    f[:6] = 0.5
    y[:6] = [0, 1, 0, 1, 1, 0]
    got = smooth.smooth_ece(f, y, sigma=sigma, calibration="classwise")
    if sigma is None:
        assert ref_smece_sigma(f, y, got) == pytest.approx(got, abs=1e-9)
        assert ref_smece_sigma(f, y, 0.9 * got) > 0.9 * got
        assert ref_smece_sigma(f, y, 1.1 * got) < 1.1 * got
    else:
        assert got == pytest.approx(ref_smece_sigma(f, y, sigma), abs=1e-9)
    res = smooth._Residuals(f, y - f)
    assert res.f.shape[0] == np.unique(f).shape[0]
    assert res.mass == pytest.approx(np.abs(y - f).mean(), rel=1e-15)


def test_fixed_point_matches_definition():
    f, y = binary_sample(80, seed=2)
    val = smooth.smooth_ece(f, y, calibration="classwise")
    sig = smooth.smooth_ece_bandwidth(f, y, calibration="classwise")
    np.testing.assert_allclose(sig, [val, val], rtol=1e-12)  # both columns, one value
    # the published fixed point: smECE_sigma* = sigma*, checked on the definition
    assert ref_smece_sigma(f, y, val) == pytest.approx(val, abs=1e-9)
    # and it is the unique one: smECE_sigma - sigma changes sign there
    assert ref_smece_sigma(f, y, 0.9 * val) > 0.9 * val
    assert ref_smece_sigma(f, y, 1.1 * val) < 1.1 * val


def test_top_label_is_the_confidence_problem():
    rng = np.random.default_rng(3)
    P = softmax(2.5 * rng.normal(size=(120, 4)), axis=1)
    y = rng.integers(0, 4, 120)
    conf = P.max(axis=1)
    correct = (P.argmax(axis=1) == y).astype(np.int64)
    top = smooth.smooth_ece(P, y)
    assert top == pytest.approx(smooth.smooth_ece(conf, correct, calibration="classwise"))
    assert smooth.smooth_ece_bandwidth(P, y) == pytest.approx(top, rel=1e-12)
    # class-wise: the mean of the K one-vs-rest problems
    cw = [
        smooth.smooth_ece(P[:, c], (y == c).astype(int), calibration="classwise") for c in range(4)
    ]
    assert smooth.smooth_ece(P, y, calibration="classwise") == pytest.approx(np.mean(cw))
    assert ref_smece_sigma(conf, correct, 0.07) == pytest.approx(
        smooth.smooth_ece(P, y, sigma=0.07), abs=1e-9
    )


def test_non_increasing_in_sigma_and_bounds():
    # Błasiok & Nakkiran, Sec. 4: smECE_sigma is non-increasing for the reflected kernel;
    # |mean r| <= smECE_sigma <= mean |r|
    f, y = binary_sample(400, seed=4)
    sig = np.geomspace(0.002, 1.0, 25)
    vals = np.array([smooth.smooth_ece(f, y, sigma=s, calibration="classwise") for s in sig])
    assert np.all(np.diff(vals) <= 1e-14)
    r = y - f
    assert abs(r.mean()) - 1e-15 <= vals.min() and vals.max() <= np.abs(r).mean() + 1e-15


def test_exactly_cancelling_residuals_give_zero():
    f = np.full(10, 0.5)
    y = np.array([0, 1] * 5)
    assert smooth.smooth_ece(f, y, calibration="classwise") == pytest.approx(0.0, abs=1e-15)
    assert smooth.smooth_ece_bandwidth(f, y, calibration="classwise")[0] == smooth.SIGMA_MIN
    # all wrong and certain: every residual is 1, smECE = 1 for every sigma
    assert smooth.smooth_ece(np.zeros(5), np.ones(5, dtype=int), calibration="classwise") == 1.0


def test_bad_input():
    f, y = binary_sample(20, seed=5)
    for bad in (0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sigma"):
            smooth.smooth_ece(f, y, sigma=bad)
    for bad in ("0.1", True, [0.1]):
        with pytest.raises(TypeError, match="sigma"):
            smooth.smooth_ece(f, y, sigma=bad)
    with pytest.raises(ValueError, match="calibration"):
        smooth.smooth_ece(f, y, calibration="canonical")
    with pytest.raises(ValueError, match="labels"):
        smooth.smooth_ece(f, y + 2)
    with pytest.raises(ValueError, match="probs"):
        smooth.smooth_ece(f * 2.0, y)


# ------------------------------------------------------------------ relplot (optional)
@pytest.fixture
def one_blas_thread():
    # relplot's np.convolve calls BLAS dot once per output point: with several BLAS
    # threads on a loaded machine that is up to 100 times slower
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


def test_relplot_agrees_within_its_discretisation(monkeypatch, one_blas_thread):
    relplot = pytest.importorskip("relplot")
    import relplot.config as rcfg
    import relplot.kernels as rk

    f, y = binary_sample(2000, seed=7)
    yf = y.astype(np.float64)
    for s in (0.02, 0.05, 0.1):
        k = smooth.smooth_ece(f, y, sigma=s, calibration="classwise")
        # default grids: measured 1.3e-4, 1.2e-3, 6.4e-4 relative
        assert relplot.smECE_sigma(f, yf, s) == pytest.approx(k, rel=3e-3)
    # refining relplot's two grids (kernel grid 10001 points, 20000-point Riemann sum)
    # brings it to kdecal's value: measured -8.7e-6 relative (default grids: -1.2e-3)
    orig = rk.GaussianKernel.apply

    def refined(self, f, y, x_eval, eval_points=None):
        return orig(self, f, y, x_eval, eval_points=20001)

    monkeypatch.setattr(rk.GaussianKernel, "apply", refined)
    monkeypatch.setattr(rcfg, "smECE_mesh_pts", 20000)
    k = smooth.smooth_ece(f, y, sigma=0.05, calibration="classwise")
    assert relplot.smECE_sigma(f, yf, 0.05) == pytest.approx(k, rel=3e-5)
    monkeypatch.undo()
    # the fixed point: relplot's 10 bisection steps give sigma to 2^-10 (its upper end)
    val, width = relplot.smECE(f, yf, return_width=True)
    k = smooth.smooth_ece(f, y, calibration="classwise")
    assert width - 2.0**-10 <= k <= width
    assert val == pytest.approx(k, rel=5e-3)  # measured -2.1e-3


@pytest.mark.parametrize(
    ("n", "m0", "m1"), [(1, 1, 5), (7, 1, 31), (300, 1, 33), (300, 32, 97), (20000, 5, 70)]
)
def test_cosine_sums_match_the_direct_cosines(n, m0, m1, monkeypatch):
    # the cosine series' sums by powers of exp(i pi f) against one cos per term summed
    # exactly: block edges of 32 harmonics, scores at 0 and 1, and (n = 20,000 with a
    # smaller row block) several row blocks
    monkeypatch.setattr(smooth, "_BLOCK", 1 << 16)
    rng = np.random.default_rng(n + m0)
    f = rng.random(n)
    f[: min(n, 3)] = [0.0, 1.0, 1.0 - 1e-12][: min(n, 3)]
    w = rng.standard_normal(n) / n
    got = smooth._cosine_sums(f, w, m0, m1)
    ref = [math.fsum(w * np.cos(math.pi * m * f)) for m in range(m0, m1 + 1)]
    assert got.shape == (m1 - m0 + 1,)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-14 * np.abs(w).sum())
    assert smooth._cosine_sums(f, w, m1 + 1, m1).shape == (0,)


# ------------------------------------------------------- roots of g, smallest sigma
def calibrated_sample(n, seed):
    rng = np.random.default_rng(seed)
    f = rng.beta(2.0, 2.0, n)
    return f, (rng.random(n) < f).astype(np.int64)


def scalar_brent_smece_sigma(f, y, sigma):
    """smECE_sigma as before this change: the module's panels and g, one brentq per root."""
    res = smooth._Residuals(f, y - f)
    pan = smooth._panels(res.f, sigma)
    t, wt = smooth._gl_points(pan[:, 0], pan[:, 1])
    g = res.smoothed(t.ravel(), sigma).reshape(t.shape)
    noise = 1e-14 * np.abs(res.w).sum() * (1.0 + 1.0 / (math.sqrt(2 * math.pi) * sigma))
    total = 0.0
    for i in range(pan.shape[0]):
        a, b = pan[i]
        tt = np.concatenate([[a], t[i], [b]])
        vals = res.smoothed(tt, sigma)
        s = np.sign(np.where(np.abs(vals) <= noise, 0.0, vals))
        cross = np.flatnonzero(s[1:] * s[:-1] < 0)
        if cross.size == 0:
            total += float(np.sum(np.abs(g[i]) * wt[i]))
            continue
        g1 = lambda x: float(res.smoothed(np.array([x]), sigma)[0])
        cuts = [
            a,
            *(optimize.brentq(g1, tt[j], tt[j + 1], xtol=1e-15, rtol=1e-15) for j in cross),
            b,
        ]
        t2, wt2 = smooth._gl_points(np.array(cuts[:-1]), np.array(cuts[1:]))
        total += float(np.sum(np.abs(res.smoothed(t2.ravel(), sigma)) * wt2.ravel()))
    return total


@pytest.mark.parametrize("sigma", [0.002, 0.005, 0.03])
@pytest.mark.parametrize("sample", ["calibrated", "miscalibrated"])
def test_all_roots_at_once_match_one_brent_search_per_root(sample, sigma):
    f, y = calibrated_sample(3000, 11) if sample == "calibrated" else binary_sample(3000, 12)
    got = smooth.smooth_ece(f, y, sigma=sigma, calibration="classwise")
    assert got == pytest.approx(scalar_brent_smece_sigma(f, y, sigma), rel=1e-11, abs=1e-13)


def test_root_search_passes_do_not_grow_with_the_roots(monkeypatch):
    # a calibrated model's g crosses 0 hundreds of times at small sigma; the roots are
    # refined together, one evaluation of g per pass over all brackets (before: one
    # brentq, ~10 scalar evaluations, per root)
    f, y = calibrated_sample(5000, 13)
    sigma = 0.002
    res = smooth._Residuals(f, y - f)
    g = res.smoothed(np.linspace(0.0, 1.0, 20001), sigma)
    assert np.count_nonzero(g[1:] * g[:-1] < 0) > 100
    calls = []
    orig = smooth._Residuals.smoothed

    def counted(self, t, s):
        calls.append(t.shape[0])
        return orig(self, t, s)

    monkeypatch.setattr(smooth._Residuals, "smoothed", counted)
    smooth.smooth_ece(f, y, sigma=sigma, calibration="classwise")
    assert len(calls) <= 2 * 40  # two problems (class-wise), at most 40 passes each
    calls.clear()
    smooth.smooth_ece_bandwidth(f, y)  # the fixed point, ~15 bandwidths
    assert len(calls) <= 15 * 40


def test_sigma_below_the_floor_is_refused():
    # sigma = 1e-10 asked for a grid of 1e10 nodes (MemoryError, 75 GiB)
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(3), 200)
    y = rng.integers(0, 3, 200)
    for bad in (1e-10, 1e-8, 0.5 * smooth.SIGMA_FLOOR):
        with pytest.raises(ValueError, match=r"sigma must be at least SIGMA_FLOOR = 1e-06"):
            smooth.smooth_ece(P, y, sigma=bad)
    # at the floor the kernels of these distinct predictions do not overlap: the limit
    # sigma -> 0, mean |r| of the top-label problem
    conf = P.max(axis=1)
    r = (P.argmax(axis=1) == y) - conf
    got = smooth.smooth_ece(P, y, sigma=smooth.SIGMA_FLOOR)
    assert got == pytest.approx(np.abs(r).mean(), rel=1e-9)
