"""Property-based tests (hypothesis): invariances and bounds.

Each property is also checked against the float64 reference, so that a
wrong-but-invariant implementation fails.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import _reference as ref
from _helpers import (
    BACKEND_RTOL,
    E_ATOL,
    LL_ATOL,
    assert_close,
    assert_scalar,
    assert_simplex_rows,
    rtol64,
)

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # reproducible CI runs
)


@st.composite
def problems(draw, n_min=4, n_max=40, k_max=6):
    """Draw (probs, labels, bandwidth).

    Dirichlet probs, some rows with exact zeros / one-hot rows, random labels
    (classes may be absent), log-uniform h in [1e-3, 1].
    """
    n = draw(st.integers(n_min, n_max))
    K = draw(st.integers(2, k_max))
    alpha = draw(st.sampled_from([0.2, 1.0, 5.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    n_onehot = draw(st.integers(0, n // 4))
    if n_onehot:
        P[:n_onehot] = np.eye(K)[rng.integers(0, K, n_onehot)]
    if draw(st.booleans()):  # exact zeros somewhere
        P[n_onehot:, 0] = np.where(rng.random(n - n_onehot) < 0.3, 0.0, P[n_onehot:, 0])
        P /= P.sum(axis=1, keepdims=True)
    labels = rng.integers(0, K, n)
    log10h = draw(st.floats(-3.0, 0.0, allow_nan=False))
    return P, labels, float(10.0**log10h)


@pytest.fixture(scope="module")
def kd(kdecal_module):
    """Return the kdecal module."""
    return kdecal_module


@SETTINGS
@given(prob=problems(), perm_seed=st.integers(0, 2**32 - 1))
def test_permutation_invariance(kd, backend, prob, perm_seed):
    """Permuting the rows leaves ece_kde / calibration_error unchanged."""
    P, y, h = prob
    perm = np.random.default_rng(perm_seed).permutation(len(y))
    r = rtol64(h)
    e0 = kd.ece_kde(P, y, p=1, bandwidth=h, debias="none", backend=backend)
    e1 = kd.ece_kde(P[perm], y[perm], p=1, bandwidth=h, debias="none", backend=backend)
    assert_scalar(e1, e0, rtol=1e-10, what="ece_kde permuted")
    assert_scalar(e0, ref.ref_ece_kde(P, y, 1, h), rtol=r, what="ece_kde vs ref")
    for div, est in (("kl", "direct"), ("l2", "refinement")):
        c0 = kd.calibration_error(
            P, y, divergence=div, estimator=est, bandwidth=h, debias="none", backend=backend
        )
        c1 = kd.calibration_error(
            P[perm],
            y[perm],
            divergence=div,
            estimator=est,
            bandwidth=h,
            debias="none",
            backend=backend,
        )
        assert_scalar(c1, c0, rtol=1e-10, what=f"CE {div}/{est} permuted")
        assert_scalar(
            c0,
            ref.ref_calibration_error(P, y, div, h, est),
            rtol=r,
            what=f"CE {div}/{est} vs ref",
        )
    # E is permutation-equivariant
    E0 = kd.conditional_expectation(P, y, bandwidth=h, backend=backend)
    E1 = kd.conditional_expectation(P[perm], y[perm], bandwidth=h, backend=backend)
    assert_close(E1, E0[perm], rtol=1e-10, atol=E_ATOL, what="E permuted")


@SETTINGS
@given(prob=problems())
def test_conditional_expectation_rows_on_simplex(kd, backend, prob):
    """Rows of E are on the simplex and match the reference."""
    P, y, h = prob
    E = kd.conditional_expectation(P, y, bandwidth=h, backend=backend)
    assert E.shape == (len(y), P.shape[1]) and E.dtype == np.float64
    assert_simplex_rows(E, atol=1e-12)
    absent = np.setdiff1d(np.arange(P.shape[1]), y)
    assert np.all(E[:, absent] == 0.0), "a class with no centres must get exactly 0"
    assert_close(
        E,
        ref.ref_conditional_expectation(P, y, h),
        rtol=rtol64(h),
        atol=E_ATOL,
        what="E vs ref",
    )


@SETTINGS
@given(prob=problems())
def test_calibration_error_nonnegative(kd, backend, prob):
    """The direct estimator (a mean of Bregman divergences) is >= 0.

    The refinement estimator can legitimately be negative, so it is not checked.
    """
    P, y, h = prob
    for div in ("kl", "l2"):
        ce = kd.calibration_error(
            P, y, divergence=div, estimator="direct", bandwidth=h, debias="none", backend=backend
        )
        assert ce >= -1e-12, f"CE {div} = {ce} < 0"
        assert_scalar(
            ce,
            ref.ref_calibration_error(P, y, div, h, "direct"),
            rtol=rtol64(h),
            what=div,
        )
    e = kd.ece_kde(P, y, p=2, bandwidth=h, debias="none", backend=backend)
    assert e >= 0.0
    assert_scalar(e, ref.ref_ece_kde(P, y, 2, h), rtol=rtol64(h), what="ece p=2")


@SETTINGS
@given(prob=problems(k_max=4))
def test_sharpness_refinement_decomposition(kd, backend, prob):
    """Refinement + sharpness = -F(freq) exactly (both built on mean F(E))."""
    P, y, h = prob
    K = P.shape[1]
    freq = np.bincount(y, minlength=K) / len(y)
    for div, Ffreq in (
        ("l2", np.sum(freq**2)),
        ("kl", np.sum(freq[freq > 0] * np.log(freq[freq > 0]))),
    ):
        r = kd.refinement(P, y, divergence=div, bandwidth=h, debias="none", backend=backend)
        s = kd.sharpness(P, y, divergence=div, bandwidth=h, debias="none", backend=backend)
        assert_scalar(r + s, -Ffreq, rtol=1e-12, atol=1e-13, what=f"{div}: refinement + sharpness")
        assert_scalar(
            r,
            ref.ref_refinement(P, y, div, h),
            rtol=rtol64(h),
            what=f"refinement {div}",
        )


@SETTINGS
@given(prob=problems())
def test_backend_agreement(kd, both_backends, prob):
    """Backends cpp and numba agree to 1e-10 on random problems."""
    P, y, h = prob
    out = {}
    for b in both_backends:
        out[b] = {
            "E": kd.conditional_expectation(P, y, bandwidth=h, backend=b),
            "ece": kd.ece_kde(P, y, p=1, bandwidth=h, debias="none", backend=b),
            "ce": kd.calibration_error(
                P, y, divergence="kl", bandwidth=h, debias="none", backend=b
            ),
            "ll": kd.loo_log_likelihood(P, [h, 0.5], backend=b),
        }
    a, b = (out[k] for k in both_backends)
    assert_close(a["E"], b["E"], rtol=BACKEND_RTOL, atol=E_ATOL, what="E cpp vs numba")
    assert_scalar(a["ece"], b["ece"], rtol=BACKEND_RTOL, atol=1e-14, what="ece cpp vs numba")
    assert_scalar(a["ce"], b["ce"], rtol=BACKEND_RTOL, atol=1e-14, what="CE cpp vs numba")
    assert_close(a["ll"], b["ll"], rtol=BACKEND_RTOL, atol=1e-13, what="LL cpp vs numba")
    assert_close(
        a["ll"],
        ref.ref_loo_log_likelihood(P, [h, 0.5]),
        rtol=rtol64(h),
        atol=LL_ATOL,
        what="LL vs ref",
    )
    assert_scalar(a["ece"], ref.ref_ece_kde(P, y, 1, h), rtol=rtol64(h), what="ece vs ref")


@SETTINGS
@given(prob=problems(n_max=25, k_max=4))
def test_select_bandwidth_is_argmax_of_loo_ll(kd, backend, prob):
    """select_bandwidth is the argmax of loo_log_likelihood."""
    P, _, _ = prob
    grid = np.array([1e-3, 1e-2, 0.05, 0.2, 1.0])
    ll = kd.loo_log_likelihood(P, grid, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = kd.select_bandwidth(P, grid=grid, backend=backend)
    assert float(h) == float(grid[int(np.argmax(ll))])
    # a warning exactly when the choice is an end of the grid
    at_end = float(h) in (float(grid[0]), float(grid[-1]))
    assert len([w for w in caught if "search range" in str(w.message)]) == int(at_end)
    ll_ref = ref.ref_loo_log_likelihood(P, grid)
    assert_close(ll, ll_ref, rtol=rtol64(1e-3), atol=LL_ATOL, what="LL vs ref")
    # the chosen bandwidth is optimal for the reference too (up to rounding ties)
    i = int(np.flatnonzero(grid == float(h))[0])
    assert ll_ref[i] >= ll_ref.max() - 1e-9 * max(1.0, abs(ll_ref.max()))


@SETTINGS
@given(prob=problems(k_max=2))
def test_binary_vector_convention(kd, backend, prob):
    """(n,) binary probs equal the (1 - p, p) two-column form."""
    P, y, h = prob
    p = P[:, 1].copy()
    a = kd.ece_kde(p, y, p=1, bandwidth=h, debias="none", backend=backend)
    P2 = np.stack([1 - p, p], axis=1)
    b = kd.ece_kde(P2, y, p=1, bandwidth=h, debias="none", backend=backend)
    assert_scalar(a, b, rtol=1e-12, what="(n,) vs (n,2)")
    assert_scalar(a, ref.ref_ece_kde(p, y, 1, h), rtol=rtol64(h), what="vs ref")
