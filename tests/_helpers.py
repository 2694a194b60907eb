"""Tolerances and assertion helpers shared by the test modules.

Tolerances were first derived by comparing the brute-force reference against a
simulation of the engine's arithmetic (sequential accumulation of G_ij in the
input dtype, per-class running max, S / sum S; see _engine_sim in
test_reference_selfcheck.py), then checked against the real package (kdecal at
commit 85bb802 plus working-tree changes, cpp and numba backends, every
conftest dataset).  Worst relative errors vs the reference, real package:

float64      E (entries > 1e-200)   loo-LL    scalar estimators   cpp vs numba (E)
  h=1e-5     3.7e-10                6.2e-13   2.3e-10             2.3e-10
  h=1e-4     2.9e-11                2.5e-13   5.0e-12             2.9e-11
  h=1e-3     3.6e-12                8.9e-14   2.5e-13             1.8e-12
  h=1e-2     1.1e-12                1.9e-14   1.6e-14             1.1e-12
  h>=0.05    4.3e-13                1.6e-14   2.4e-14             2.8e-13
float32 input (G_ij in float32 as the spec says; reference = float64 on the
same float32 values):
  h=1e-3     E abs 5.5e-5, loo-LL 1.7e-5, scalars 2.9e-5
  h=1e-2     E abs 1.0e-5 (rel up to 1.4e-3 on small entries), loo-LL 6.0e-6, scalars 1.8e-6
  h=0.05     E abs 3.4e-6, loo-LL 2.1e-6, scalars 1.4e-6
  h>=0.2     E abs 1.4e-6, loo-LL 6.7e-7, scalars 1.3e-7
The simulation gave the same orders of magnitude (float32 h=1e-2: E abs 1.7e-5,
scalars 3.8e-6).  float32 is only checked for h >= 1e-2.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

# absolute floor for scalar estimators: they are sums of O(1) terms that can
# cancel to ~0 (e.g. refinement when E is nearly one-hot), so a pure relative
# bound is meaningless below ~1e-13.
SCALAR_ATOL = 1e-13
LL_ATOL = 1e-12  # loo log-likelihood can cross 0 (it is a log density)
E_ATOL = 1e-200  # entries of E below this are underflow noise

F32_RTOL = 1e-4  # >= 25x the worst observed (1.8e-6 package, 3.8e-6 simulation; LL 6e-6)
F32_E_ATOL = 2e-4  # >= 10x the worst observed abs error of E entries (1.0e-5 / 1.7e-5)
F32_BANDWIDTHS = [0.01, 0.05, 0.2, 1.0]

BACKEND_RTOL = 1e-10  # cpp vs numba, float64, h >= 1e-4 (use backend_rtol(h) below that)
THREADS_RTOL = 1e-12  # 1 vs 2 threads, cpp


def rtol64(bandwidth: float) -> float:
    """Relative tolerance for float64 results at bandwidth h.

    L_ij = bias_i + G_ij / h is a sum of terms of size up to ~|log EPS| / h =
    27.6 / h, so two correct float64 implementations (BLAS vs. a sequential
    loop, FMA or not) differ by ~ eps * 27.6 / h * few in L, i.e. by that
    relative amount in every kernel ratio: 1e-9 for h >= 1e-4, 1e-8 at 1e-5.
    """
    return max(1e-9, 1e-13 / float(bandwidth))


def backend_rtol(bandwidth: float) -> float:
    """Cpp vs numba: 1e-10, relaxed below h = 1e-4 like rtol64 (observed 2.3e-10 at 1e-5)."""
    return max(BACKEND_RTOL, rtol64(bandwidth) / 10)


def assert_close(actual, expected, *, rtol, atol=0.0, what=""):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values {actual}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def assert_scalar(actual, expected, *, rtol, atol=SCALAR_ATOL, what=""):
    assert np.ndim(actual) == 0, f"{what}: expected a scalar, got shape {np.shape(actual)}"
    assert isinstance(actual, float), (
        f"{what}: expected a float, got {type(actual)}"
    )  # np.float64 is a float
    assert_close(float(actual), expected, rtol=rtol, atol=atol, what=what)


def assert_simplex_rows(E, *, atol=1e-12, what="E"):
    E = np.asarray(E)
    assert np.all(np.isfinite(E)), f"{what}: non-finite"
    assert np.all(E >= 0.0), f"{what}: negative entries, min {E.min()}"
    dev = np.abs(E.sum(axis=1) - 1.0).max()
    assert dev <= atol, f"{what}: row sums deviate from 1 by {dev}"


def resolve_bw(dataset, bandwidth):
    """Return the bandwidth the reference should use for `bandwidth` ("loo-mle" or float).

    "loo-mle" is kdecal's LOO-likelihood rule, i.e. the reference's
    ref_select_bandwidth.  "auto" (the LOO Brier risk of the label regression) has
    no counterpart in the reference: tests resolve it with kdecal.select_bandwidth.
    """
    if isinstance(bandwidth, str):
        if bandwidth != "loo-mle":
            raise ValueError(f"resolve_bw: the reference has no bandwidth rule {bandwidth!r}")
        return dataset.ref_bandwidth
    return float(bandwidth)


def bw_id(bandwidth):
    return bandwidth if isinstance(bandwidth, str) else f"h={bandwidth:g}"


def record_warnings(fn, *args, **kwargs):
    """Call fn(*args, **kwargs) recording every warning: (result, [message strings])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught]


def auto_bandwidth(kd, probs, labels, **kwargs):
    """kdecal's bandwidth="auto" for (probs, labels): (h, expect_warning).

    Returns the bandwidth kd.select_bandwidth(probs, labels, **kwargs) chooses, and
    ``expect_warning(*others)``, a context manager for a call with bandwidth="auto"
    on the same data.  It asserts that the call warns (KdecalWarning) that h is at
    an end of the search range (kdecal._estimation.search.SEARCH_GRID) exactly when it is,
    and that its other warnings are exactly the messages ``others`` (e.g. those of
    the same call at the explicit bandwidth h: debias="ustat" warns about degenerate
    rows at tiny h).  Also checks that select_bandwidth itself warns exactly when h
    is at an end.
    """
    from kdecal._estimation.search import SEARCH_GRID  # kdecal is imported by the tests only

    h, caught = record_warnings(kd.select_bandwidth, probs, labels, **kwargs)
    h = float(h)
    at_end = h <= SEARCH_GRID[0] or h >= SEARCH_GRID[-1]
    assert len(caught) == int(at_end) and all("search range" in m for m in caught), (
        f"select_bandwidth chose h={h:g} (at an end of the range: {at_end}) but warned {caught}"
    )

    @contextlib.contextmanager
    def expect_warning(*others):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            yield
        ranged = [
            str(w.message)
            for w in got
            if issubclass(w.category, kd.KdecalWarning) and "search range" in str(w.message)
        ]
        rest = [str(w.message) for w in got if str(w.message) not in ranged]
        assert len(ranged) == int(at_end), (
            f'bandwidth="auto" chose h={h:g} (at an end of the range: {at_end}); '
            f"range warnings: {ranged}"
        )
        assert sorted(rest) == sorted(others), f"unexpected warnings {rest}, expected {others}"

    return h, expect_warning


def blas_threads():
    """The thread counts of the BLAS libraries threadpoolctl sees (skips without it)."""
    import pytest

    threadpoolctl = pytest.importorskip("threadpoolctl")
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
