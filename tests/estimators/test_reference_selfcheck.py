"""Checks of the reference itself (no kdecal import).

These run even when the package is broken, and validate the formulas and the
tolerances used elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import gammaln

import _reference as ref
from _helpers import F32_BANDWIDTHS, F32_E_ATOL, F32_RTOL, rtol64
from conftest import ALL_NAMES, dataset_or_skip, load_real_file, make_synthetic

README_ECE15 = {  # file -> (key prefix, kind, accuracy %, ECE15 %) from the data README
    "cifar10_vgg16_keras_verifiedcal.npz": ("", "probs", 93.59, 3.98),
    "cifar100_densenetbc100_netcal.npz": ("", "probs", 75.41, 14.22),
    "pneumoniamnist_resnet50.npz": ("", "logits", 89.58, 7.67),
    "adrenalmnist3d_resnet50.npz": ("", "logits", 78.52, 11.08),
}


@pytest.mark.parametrize(
    "fname",
    [
        # tests/data has only 300 rows of the DenseNet file; the README figures need all
        pytest.param(f, marks=pytest.mark.realdata) if f.startswith("cifar100") else f
        for f in README_ECE15
    ],
)
def test_binned_ece_reproduces_readme(fname):
    """The reference ECE15 / accuracy equal the data README's numbers."""
    prefix, kind, acc, ece = README_ECE15[fname]
    P, _, y = load_real_file(fname, prefix, kind)
    assert round(100 * ref.ref_ece_binned(P, y), 2) == ece
    assert round(100 * ref.ref_accuracy(P, y), 2) == acc
    # clip + renormalisation (float32 rows sum to 1 within 1e-4) moves the
    # confidences by <= 1e-4 relative; no sample crosses a bin edge, so the
    # value on the raw probs differs only at the 1e-8 level
    conf = P.max(axis=1)
    bins = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)
    correct = P.argmax(axis=1) == y
    raw = sum(
        np.mean(bins == b) * abs(correct[bins == b].mean() - conf[bins == b].mean())
        for b in range(15)
        if np.any(bins == b)
    )
    assert abs(raw - ref.ref_ece_binned(P, y)) < 1e-7


def test_vgg16_full_file_ece15_is_3_98():
    """Binned ECE of the full VGG-16 file is 3.98 %."""
    P, _, y = load_real_file("cifar10_vgg16_keras_verifiedcal.npz", "", "probs")
    assert P.shape == (10000, 10)
    e = ref.ref_ece_binned(P, y)
    assert abs(100 * e - 3.98) <= 0.005  # 3.978007 %


def test_clip_binary_and_zeros():
    """ref_clip: binary expansion, EPS clip, renormalisation."""
    p = np.array([0.0, 1.0, 0.25])
    P = ref.ref_clip(p)
    assert P.shape == (3, 2)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=4e-16)
    np.testing.assert_allclose(P[2], [0.75, 0.25], rtol=1e-15)
    np.testing.assert_allclose(P[0], [1 / (1 + 1e-12), 1e-12 / (1 + 1e-12)], rtol=1e-15)


def test_log_kernel_is_scipy_dirichlet_logpdf():
    """The log kernel is scipy's Dirichlet log-density."""
    P = ref.ref_clip(make_synthetic(8, 4, seed=11)[0])
    for h in (0.01, 0.3, 2.0):
        A = ref.ref_log_kernel(P, h)
        for i in range(8):
            for j in range(8):
                if i == j:
                    assert A[i, j] == -np.inf
                    continue
                want = stats.dirichlet.logpdf(P[j], P[i] / h + 1.0)
                assert abs(A[i, j] - want) <= 1e-9 * max(1.0, abs(want))


@pytest.mark.parametrize("h", [0.05, 0.5])
def test_kernel_integrates_to_one_K2(h):
    """For K = 2 the kernel is a Beta density in x = P(class 1)."""
    for c in ([0.3, 0.7], [0.9, 0.1]):

        def k(x, c=c):
            Q = np.array([[c[0], c[1]], [1 - x, x]])
            return np.exp(ref.ref_log_kernel(Q, h)[0, 1])

        val, _ = integrate.quad(k, 0, 1, limit=200)
        assert abs(val - 1.0) < 1e-6


def test_conditional_expectation_by_explicit_loops():
    """E and the LOO-LL equal explicit math-module loops."""
    P, y = make_synthetic(9, 3, seed=5)
    y[:3] = [0, 1, 2]
    Pc = ref.ref_clip(P)
    for h in (0.1, 1.0):
        E = ref.ref_conditional_expectation(P, y, h)
        for j in range(9):
            w = np.zeros(3)
            for i in range(9):
                if i == j:
                    continue
                lk = (
                    math.lgamma(1 / h + 3)
                    - sum(math.lgamma(Pc[i, k] / h + 1) for k in range(3))
                    + sum(Pc[i, k] * math.log(Pc[j, k]) for k in range(3)) / h
                )
                w[y[i]] += math.exp(lk)
            np.testing.assert_allclose(E[j], w / w.sum(), rtol=1e-12, atol=1e-300)
        ll = ref.ref_loo_log_likelihood(P, [h])[0]
        want = np.mean(
            [
                math.log(
                    sum(
                        math.exp(
                            math.lgamma(1 / h + 3)
                            - sum(math.lgamma(Pc[i, k] / h + 1) for k in range(3))
                            + sum(Pc[i, k] * math.log(Pc[j, k]) for k in range(3)) / h
                        )
                        for i in range(9)
                        if i != j
                    )
                    / 8
                )
                for j in range(9)
            ]
        )
        assert abs(ll - want) <= 1e-12 * max(1, abs(want))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_reference_sanity(name):
    """Simplex rows, CE >= 0, identities, grid argmax with a clear margin."""
    ds = dataset_or_skip(name)
    P, y = ds.probs, ds.labels
    bw = ds.ref_bandwidth
    assert bw in set(ref.DEFAULT_GRID.tolist())
    assert len(ref.DEFAULT_GRID) == 55
    # select_bandwidth is argmax of the LOO-LL, with a clear margin (no rounding tie)
    ll = ref.ref_loo_log_likelihood(P, ref.DEFAULT_GRID)
    top2 = np.sort(ll)[-2:]
    assert ref.DEFAULT_GRID[np.argmax(ll)] == bw
    assert (top2[1] - top2[0]) / abs(top2[1]) > 1e-4
    for h in (1e-3, 0.05, bw):
        E = ref.ref_conditional_expectation(P, y, h)
        assert np.all(E >= 0) and np.abs(E.sum(axis=1) - 1).max() < 1e-14
        for div in ("kl", "l2"):
            assert ref.ref_calibration_error(P, y, div, h, "direct") >= 0
            # direct - refinement = mean <gradF(P~), y - E>  (algebraic identity)
            Pc = ref.ref_clip(P)
            Y = ref.ref_one_hot(y, Pc.shape[1])
            grad = np.log(Pc) + 1 if div == "kl" else 2 * Pc
            diff = np.mean(np.sum(grad * (Y - E), axis=1))
            d = ref.ref_calibration_error(P, y, div, h, "direct")
            r = ref.ref_calibration_error(P, y, div, h, "refinement")
            assert abs((d - r) - diff) < 1e-10 * max(1, abs(diff))
            # refinement + sharpness = -F(freq)
            freq = np.bincount(y, minlength=Pc.shape[1]) / len(y)
            Ff = (
                np.sum(freq[freq > 0] * np.log(freq[freq > 0])) if div == "kl" else np.sum(freq**2)
            )
            assert (
                abs(ref.ref_refinement(P, y, div, h) + ref.ref_sharpness(P, y, div, h) + Ff)
                < 1e-12
            )
        # ECE p=2 squared = CE l2 (direct)
        assert (
            abs(ref.ref_ece_kde(P, y, 2, h) ** 2 - ref.ref_calibration_error(P, y, "l2", h))
            < 1e-12
        )


# ------------------------------------------------ tolerance justification
def _engine_sim(probs, labels, h, dtype):
    """Re-implement the spec's loo_reduce arithmetic in numpy.

    Clip and G_ij in the input dtype, sequential accumulation over k,
    per-class max, S / sum S.
    """
    P = np.asarray(probs, dtype=dtype)
    if P.ndim == 1:
        P = np.stack([1 - P, P], 1).astype(dtype)
    P = np.maximum(P, dtype(ref.EPS))
    P = (P / P.sum(1, keepdims=True)).astype(dtype)
    logq = np.log(P).astype(dtype)
    n, K = P.shape
    G = np.zeros((n, n), dtype=dtype)
    for k in range(K):
        G = (G + P[:, k, None] * logq[None, :, k]).astype(dtype)
    P64 = P.astype(np.float64)
    L = -gammaln(P64 / h + 1).sum(1)[:, None] + (1.0 / h) * G.astype(np.float64)
    np.fill_diagonal(L, -np.inf)
    S = np.zeros((n, K))
    mc = np.full((n, K), -np.inf)
    for c in range(K):
        mem = labels == c
        if mem.any():
            mc[:, c] = L[mem].max(0)
            with np.errstate(invalid="ignore"):  # -inf - -inf on the diagonal
                S[:, c] = np.nan_to_num(np.exp(L[mem] - mc[None, :, c]), nan=0.0).sum(0)
    m = mc.max(1)
    S = np.where(
        np.isfinite(mc),
        S * np.exp(np.where(np.isfinite(mc), mc - m[:, None], 0.0)),
        0.0,
    )
    E = S / S.sum(1, keepdims=True)
    ll = np.mean(gammaln(1 / h + K) + m + np.log(S.sum(1)) - np.log(n - 1))
    return P64, E, ll


@pytest.mark.parametrize("name", ["syn-K3-n150", "real-adrenal-K2", "real-vgg16-K10"])
def test_float64_tolerance_covers_simulated_engine(name):
    """rtol64 covers a simulated engine with another summation order."""
    ds = dataset_or_skip(name)
    for h in (1e-5, 1e-3, 0.05):
        _, E, ll = _engine_sim(ds.probs, ds.labels, h, np.float64)
        E_ref = ref.ref_conditional_expectation(ds.probs, ds.labels, h)
        big = E_ref > 1e-200
        assert np.max(np.abs(E[big] - E_ref[big]) / E_ref[big]) < rtol64(h) / 2
        ll_ref = ref.ref_loo_log_likelihood(ds.probs, [h])[0]
        assert abs(ll - ll_ref) < rtol64(h) / 2 * abs(ll_ref)


@pytest.mark.parametrize("name", ["syn-K10-n400", "real-pneumonia-K2", "real-densenet-K100"])
def test_float32_tolerance_covers_simulated_engine(name):
    """The float32 bounds cover a simulated float32 engine."""
    ds = dataset_or_skip(name)
    P = ds.probs32.astype(np.float64)
    for h in F32_BANDWIDTHS:
        P64, E, ll = _engine_sim(ds.probs32, ds.labels, h, np.float32)
        E_ref = ref.ref_conditional_expectation(P, ds.labels, h)
        assert np.max(np.abs(E - E_ref)) < F32_E_ATOL / 5
        ll_ref = ref.ref_loo_log_likelihood(P, [h])[0]
        assert abs(ll - ll_ref) < F32_RTOL / 5 * abs(ll_ref)
        ece = np.mean(np.abs(E - P64).sum(1))
        assert abs(ece - ref.ref_ece_kde(P, ds.labels, 1, h)) < F32_RTOL / 5 * ece
