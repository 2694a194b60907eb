"""Tests of kdecal.skce: the SKCE of Widmann, Lindsten & Zachariah (NeurIPS 2019).

References are the published definitions written as plain loops over the pairs (i, j)
with the matrix-valued kernel k(p, q) = kappa(p, q) I_K materialised as a K x K matrix.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from kdecal import skce


# ------------------------------------------------------------------------ references
def kappa_laplacian(p, q, nu):
    return math.exp(-math.sqrt(sum((a - b) ** 2 for a, b in zip(p, q))) / nu)


def kappa_gaussian(p, q, nu):
    return math.exp(-sum((a - b) ** 2 for a, b in zip(p, q)) / (2.0 * nu * nu))


def ref_h(P, y, kappa):
    """h_ij = (e_yi - g_i)^T [kappa(g_i, g_j) I_K] (e_yj - g_j), every pair, by loops."""
    n, K = P.shape
    E = np.eye(K)[y]
    H = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            k = kappa(P[i], P[j]) * np.eye(K)
            H[i, j] = (E[i] - P[i]) @ k @ (E[j] - P[j])
    return H


def ref_uq(H):
    n = H.shape[0]
    return sum(H[i, j] for i in range(n) for j in range(i + 1, n)) / math.comb(n, 2)


def ref_ul(H):
    m = H.shape[0] // 2
    return sum(H[2 * i, 2 * i + 1] for i in range(m)) / m


def sample(n=41, K=3, power=1.0, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), n)
    Q = P**power / np.sum(P**power, axis=1, keepdims=True)
    y = np.array([rng.choice(K, p=q) for q in Q])
    return P, y


# ----------------------------------------------------------------------- estimators
@pytest.mark.parametrize("kernel", ["laplacian", "gaussian"])
@pytest.mark.parametrize("n", [40, 41])
def test_estimators_match_definition(kernel, n):
    P, y = sample(n, power=2.0, seed=n)
    nu = 0.4
    kap = kappa_laplacian if kernel == "laplacian" else kappa_gaussian
    H = ref_h(P, y, lambda p, q: kap(p, q, nu))
    got = skce.skce(P, y, kernel=kernel, bandwidth=nu)
    assert got == pytest.approx(ref_uq(H), abs=1e-12)
    got = skce.skce(P, y, kernel=kernel, bandwidth=nu, estimator="linear")
    assert got == pytest.approx(ref_ul(H), abs=1e-12)


def test_callable_kernel_and_binary_input():
    P, y = sample(30, K=2, power=3.0, seed=3)

    def imq(A, B):  # inverse multiquadric, a universal kernel
        d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(axis=2)
        return 1.0 / np.sqrt(1.0 + d2 / 0.1)

    H = ref_h(P, y, lambda p, q: 1.0 / math.sqrt(1.0 + float(np.sum((p - q) ** 2)) / 0.1))
    assert skce.skce(P, y, kernel=imq) == pytest.approx(ref_uq(H), abs=1e-12)
    # a 1-D input is P(y = 1): the rows (1 - p, p)
    assert skce.skce(P[:, 1], y, kernel=imq) == pytest.approx(ref_uq(H), abs=1e-12)


def test_median_heuristic_default():
    P, y = sample(50, seed=4)
    d = [np.linalg.norm(P[i] - P[j]) for i in range(50) for j in range(i + 1, 50)]
    nu = float(np.median(d))
    assert skce.median_distance(P) == pytest.approx(nu, rel=1e-14)
    assert skce.skce(P, y) == pytest.approx(skce.skce(P, y, bandwidth=nu), rel=1e-13)
    H = ref_h(P, y, lambda p, q: kappa_laplacian(p, q, nu))
    assert skce.skce(P, y) == pytest.approx(ref_uq(H), abs=1e-12)


@pytest.mark.parametrize("estimator", ["unbiased", "linear"])
def test_unbiased_under_calibration_exactly(estimator):
    # labels drawn from the predictions (a calibrated model): the expectation over all
    # K^n label vectors, weighted by their probabilities, is exactly 0 (Lemma 2)
    P, _ = sample(5, K=3, seed=5)
    total = 0.0
    for ys in itertools.product(range(3), repeat=5):
        w = float(np.prod(P[np.arange(5), ys]))
        total += w * skce.skce(P, np.array(ys), bandwidth=0.3, estimator=estimator)
    assert total == pytest.approx(0.0, abs=1e-15)
    # and the miscalibrated expectation is positive
    Q = P**3 / np.sum(P**3, axis=1, keepdims=True)
    total = sum(
        float(np.prod(Q[np.arange(5), ys]))
        * skce.skce(P, np.array(ys), bandwidth=0.3, estimator=estimator)
        for ys in itertools.product(range(3), repeat=5)
    )
    assert total > 1e-3


# ---------------------------------------------------------------------------- tests
def test_linear_test_statistic_and_pvalue():
    P, y = sample(61, power=2.0, seed=6)
    H = ref_h(P, y, lambda p, q: kappa_laplacian(p, q, 0.5))
    h = np.array([H[2 * i, 2 * i + 1] for i in range(30)])
    z = math.sqrt(30) * h.mean() / h.std(ddof=1)
    res = skce.skce_test(P, y, bandwidth=0.5)
    assert res.estimator == "linear" and res.null_distribution is None
    assert res.statistic == pytest.approx(h.mean(), abs=1e-12)
    assert res.pvalue == pytest.approx(norm.sf(z), rel=1e-10)
    assert res.bandwidth == 0.5


def test_bootstrap_test_matches_loops():
    # Arcones & Gine's bootstrap of the degenerate U-statistic, replicate by replicate
    # (the rows of replicate b are rng.integers(0, n, n), the b-th such draw of the seed)
    P, y = sample(30, power=2.0, seed=7)
    n, B = 30, 40
    H = ref_h(P, y, lambda p, q: kappa_laplacian(p, q, 0.5))
    rbar, hbar = H.mean(axis=1), H.mean()
    rng = np.random.default_rng(11)
    null = []
    for _ in range(B):
        idx = rng.integers(0, n, n)
        t = sum(
            H[idx[a], idx[b]] - rbar[idx[a]] - rbar[idx[b]] + hbar
            for a in range(n)
            for b in range(n)
            if a != b
        )
        null.append(t / (n * (n - 1)))
    res = skce.skce_test(P, y, bandwidth=0.5, estimator="unbiased", n_resamples=B, seed=11)
    np.testing.assert_allclose(res.null_distribution, null, rtol=0, atol=1e-13)
    assert res.statistic == pytest.approx(ref_uq(H), abs=1e-12)
    assert res.pvalue == (1 + np.sum(np.array(null) >= res.statistic)) / (1 + B)


def test_tests_detect_miscalibration():
    # calibrated (labels drawn from P): no rejection; miscalibrated: rejection.  The
    # linear test needs more data for the same power (its variance is O(1/n), not
    # O(1/n^2) as the U-statistic's under the null)
    kw = {"estimator": "unbiased", "n_resamples": 200, "seed": 0}
    P, y = sample(600, power=1.0, seed=8)
    assert skce.skce_test(P, y, **kw).pvalue > 0.05  # measured 0.90
    assert skce.skce_test(P, y).pvalue > 0.05  # linear, measured 0.38
    P, y = sample(600, power=3.0, seed=8)  # under-confident predictions
    assert skce.skce_test(P, y, **kw).pvalue == 1 / 201  # no replicate reaches it
    P, y = sample(6000, power=1.0, seed=8)
    assert skce.skce_test(P, y).pvalue > 0.05  # measured 0.72
    P, y = sample(6000, power=5.0, seed=8)
    assert skce.skce_test(P, y).pvalue < 1e-4  # measured 9.2e-7


def test_linear_test_pvalue_never_zero():
    # over-confident in class 1, labels always 0: z = sqrt(m) mean(h) / sd(h) is large.
    # The p-value is the normal upper tail Phi(-z) while float64 holds it, and the
    # smallest normal float64 (not 0.0, as before) once it underflows (z > ~38.5)
    floor = np.finfo(np.float64).tiny
    for n, z_want in [(500, 24.530797), (1200, 38.803779)]:
        p = np.random.default_rng(1).uniform(0.95, 1.0, n)
        y = np.zeros(n, dtype=np.int64)
        res = skce.skce_test(p, y)  # median-heuristic bandwidth
        P = np.column_stack([1.0 - p, p])
        r = np.eye(2)[y] - P
        h = np.array(
            [
                kappa_laplacian(P[2 * i], P[2 * i + 1], res.bandwidth)
                * float(r[2 * i] @ r[2 * i + 1])
                for i in range(n // 2)
            ]
        )
        z = math.sqrt(n // 2) * h.mean() / h.std(ddof=1)
        assert res.statistic == pytest.approx(h.mean(), rel=1e-10)
        assert z == pytest.approx(z_want, rel=1e-6)
        assert res.pvalue > 0.0
        assert res.pvalue == pytest.approx(max(norm.sf(z), floor), rel=1e-8)
    assert 0.0 < res.pvalue == floor  # was 0.0
    assert norm.sf(z) == 0.0 and norm.logsf(z) == pytest.approx(-757.44, abs=0.01)
    # every term equal and positive (sd 0, z = inf): the floor too, not 0.0
    P = np.tile([0.9, 0.1], (10, 1))
    res = skce.skce_test(P, np.ones(10, dtype=np.int64))
    assert res.statistic == pytest.approx(2 * 0.9**2) and res.pvalue == floor


def test_bad_input():
    P, y = sample(10, seed=9)
    with pytest.raises(ValueError, match="kernel"):
        skce.skce(P, y, kernel="rbf")
    with pytest.raises(TypeError, match="kernel"):
        skce.skce(P, y, kernel=3)
    with pytest.raises(ValueError, match="bandwidth"):
        skce.skce(P, y, kernel=lambda A, B: np.ones((len(A), len(B))), bandwidth=0.1)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="bandwidth"):
            skce.skce(P, y, bandwidth=bad)
    with pytest.raises(TypeError, match="bandwidth"):
        skce.skce(P, y, bandwidth="0.1")
    with pytest.raises(ValueError, match="estimator"):
        skce.skce(P, y, estimator="biased")
    with pytest.raises(ValueError, match="at least 2"):
        skce.skce(P[:1], y[:1])
    with pytest.raises(ValueError, match="at least 4"):
        skce.skce_test(P[:3], y[:3])
    with pytest.raises(ValueError, match=r"\(10, 10\) matrix"):
        skce.skce(P, y, kernel=lambda A, B: np.ones(len(A)))
    with pytest.raises(ValueError, match="non-finite"):
        skce.skce(P, y, kernel=lambda A, B: np.full((len(A), len(B)), np.nan))
    # strings gave numpy's "could not convert string to float"; complex values lost
    # their imaginary part with a ComplexWarning only
    with pytest.raises(TypeError, match="kernel must return real numbers.*<U1"):
        skce.skce(P, y, kernel=lambda A, B: np.full((len(A), len(B)), "a"))
    with pytest.raises(TypeError, match="kernel must return real numbers.*complex"):
        skce.skce(P, y, kernel=lambda A, B: np.ones((len(A), len(B))) * 1j)
    with pytest.raises(ValueError, match="n_resamples"):
        skce.skce_test(P, y, estimator="unbiased", n_resamples=0)
    with pytest.raises(ValueError, match="labels"):
        skce.skce(P, y + 3)
