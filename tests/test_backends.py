"""Backend selection, cross-backend agreement and thread-count independence."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import _reference as ref
from _helpers import (
    BACKEND_RTOL,
    E_ATOL,
    LL_ATOL,
    THREADS_RTOL,
    assert_close,
    assert_scalar,
    backend_rtol,
    rtol64,
)
from conftest import BACKENDS, make_synthetic

H = 0.05


@pytest.fixture(scope="module")
def kd(kdecal_module):
    """Return the kdecal module."""
    return kdecal_module


def _data(n=40, K=3, seed=0):
    P, y = make_synthetic(n, K, seed=seed)
    return P, y


def test_available_backends(kd):
    """available_backends() is a non-empty list of known backend names."""
    av = kd.available_backends()
    assert isinstance(av, list) and len(av) >= 1
    assert all(isinstance(b, str) for b in av)
    assert set(av) <= set(BACKENDS), av
    assert len(set(av)) == len(av)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*value of the search range")
        return fn(*args, **kwargs)


CALLS = {
    "conditional_expectation": lambda kd, P, y, b: kd.conditional_expectation(
        P, y, bandwidth=H, backend=b
    ),
    "ece_kde": lambda kd, P, y, b: kd.ece_kde(P, y, bandwidth=H, backend=b),
    "calibration_error": lambda kd, P, y, b: kd.calibration_error(P, y, bandwidth=H, backend=b),
    "refinement": lambda kd, P, y, b: kd.refinement(P, y, bandwidth=H, backend=b),
    "sharpness": lambda kd, P, y, b: kd.sharpness(P, y, bandwidth=H, backend=b),
    "loo_log_likelihood": lambda kd, P, y, b: kd.loo_log_likelihood(P, [H], backend=b),
    # (a two-value grid: its choice is an end of the range, which warns; not tested here)
    "select_bandwidth": lambda kd, P, y, b: _quiet(
        kd.select_bandwidth, P, grid=[H, 0.5], backend=b
    ),
    "evaluate": lambda kd, P, y, b: kd.evaluate(P, y, bandwidth=H, backend=b, n_resamples=0),
}


@pytest.mark.parametrize("fn", list(CALLS), ids=list(CALLS))
@pytest.mark.parametrize("bad", ["bogus", "", "openmp"], ids=["bogus", "empty", "openmp"])
def test_unknown_backend_lists_available(kd, fn, bad):
    """An unknown backend raises ValueError naming every available one."""
    P, y = _data()
    with pytest.raises(ValueError, match="backend") as exc:
        CALLS[fn](kd, P, y, bad)
    msg = str(exc.value)
    for name in kd.available_backends():
        assert name in msg, f"error message should list available backend {name!r}: {msg!r}"


@pytest.mark.parametrize("name", BACKENDS)
def test_unavailable_backend_raises(kd, name):
    """A known but unavailable backend raises ValueError."""
    if name in kd.available_backends():
        pytest.skip(f"{name} is available here")
    P, y = _data()
    with pytest.raises(ValueError, match="backend|" + name):
        kd.ece_kde(P, y, bandwidth=H, backend=name)


@pytest.mark.parametrize("fn", list(CALLS), ids=list(CALLS))
def test_auto_backend_matches_explicit(kd, fn):
    """backend='auto' gives the explicit backends' numbers."""
    P, y = _data(seed=3)
    auto = CALLS[fn](kd, P, y, "auto")
    explicit = {b: CALLS[fn](kd, P, y, b) for b in kd.available_backends()}
    for b, val in explicit.items():
        if fn == "evaluate":
            assert_scalar(auto.ce_kl, val.ce_kl, rtol=BACKEND_RTOL, what=f"auto vs {b}")
        else:
            assert_close(
                np.asarray(auto, dtype=float),
                np.asarray(val, dtype=float),
                rtol=BACKEND_RTOL,
                atol=E_ATOL,
                what=f"{fn}: auto vs {b}",
            )
    if fn == "ece_kde":
        assert_scalar(auto, ref.ref_ece_kde(P, y, 1, H), rtol=1e-9)
    if fn == "evaluate":
        assert auto.backend in kd.available_backends()


def test_report_backend_name(kd, backend):
    """The report records the backend that ran, and the right CE."""
    P, y = _data()
    rep = kd.evaluate(P, y, bandwidth=H, debias="none", backend=backend, n_resamples=0)
    assert rep.backend == backend
    assert_scalar(rep.ce_l2, ref.ref_calibration_error(P, y, "l2", H), rtol=1e-9)


# ------------------------------------------------------- cross-backend, real data
def test_backends_agree_real_data(kd, both_backends, real_dataset):
    """Backends cpp and numba agree (1e-10) on real data, and match the reference."""
    ds = real_dataset
    P, y = ds.probs, ds.labels
    grid = ref.DEFAULT_GRID
    res = {}
    for b in both_backends:
        res[b] = {
            "E": kd.conditional_expectation(P, y, bandwidth=0.02, backend=b),
            "E_tiny": {
                h: kd.conditional_expectation(P, y, bandwidth=h, backend=b) for h in (1e-5, 1e-4)
            },
            "ll": kd.loo_log_likelihood(P, grid, backend=b),
            "bw": kd.select_bandwidth(P, backend=b),
            "rep": kd.evaluate(
                P, y, bandwidth="loo-mle", debias="none", backend=b, n_resamples=0, notions=()
            ),
        }
    a, c = (res[b] for b in both_backends)
    assert_close(a["E"], c["E"], rtol=BACKEND_RTOL, atol=E_ATOL, what="E")
    for h in (
        1e-5,
        1e-4,
    ):  # 1/h amplifies rounding of G_ij: observed 2.3e-10 at h = 1e-5
        assert_close(
            a["E_tiny"][h],
            c["E_tiny"][h],
            rtol=backend_rtol(h),
            atol=E_ATOL,
            what=f"E h={h}",
        )
    assert_close(a["ll"], c["ll"], rtol=BACKEND_RTOL, atol=1e-12, what="LOO-LL cpp vs numba")
    assert float(a["bw"]) == float(c["bw"]) == ds.ref_bandwidth
    for f in (
        "ece_kde_l1",
        "ece_kde_l2",
        "ce_kl",
        "ce_l2",
        "refinement_kl",
        "refinement_l2",
        "sharpness_kl",
        "sharpness_l2",
    ):
        assert_scalar(
            getattr(a["rep"], f),
            getattr(c["rep"], f),
            rtol=backend_rtol(ds.ref_bandwidth),
            atol=1e-14,
            what=f,
        )
    want = ref.ref_evaluate(P, y, "loo-mle")
    assert_scalar(a["rep"].ce_kl, want["ce_kl"], rtol=rtol64(ds.ref_bandwidth))


# ------------------------------------------------------------- thread count
@pytest.fixture
def cpp_threads(kd):
    """kdecal.set_num_threads, restoring the previous thread count afterwards."""
    if "cpp" not in kd.available_backends():
        pytest.skip("cpp backend not available")
    getter = getattr(kd, "get_num_threads", None)
    before = getter() if getter is not None else None
    yield kd.set_num_threads
    kd.set_num_threads(before if before is not None else (os.cpu_count() or 1))


@pytest.mark.parametrize("name", ["syn-K10-n400", "real-densenet-K100", "syn-K2vec-n80"])
def test_thread_count_independence(kd, cpp_threads, name):
    """Results of cpp with 1 and 2 threads agree to 1e-12 and match the reference."""
    from conftest import dataset_or_skip

    ds = dataset_or_skip(name)
    P, y = ds.probs, ds.labels
    grid = ref.DEFAULT_GRID
    out = {}
    for k in (1, 2):
        cpp_threads(k)
        out[k] = {
            "E": kd.conditional_expectation(P, y, bandwidth=0.01, backend="cpp"),
            "ll": kd.loo_log_likelihood(P, grid, backend="cpp"),
            "ece": kd.ece_kde(P, y, bandwidth="loo-mle", debias="none", backend="cpp"),
            "ce": kd.calibration_error(
                P,
                y,
                divergence="l2",
                bandwidth=0.3,
                estimator="refinement",
                debias="none",
                backend="cpp",
            ),
        }
    a, b = out[1], out[2]
    assert_close(a["E"], b["E"], rtol=THREADS_RTOL, atol=E_ATOL, what="E 1 vs 2 threads")
    assert_close(a["ll"], b["ll"], rtol=THREADS_RTOL, atol=1e-13, what="LL 1 vs 2 threads")
    assert_scalar(a["ece"], b["ece"], rtol=THREADS_RTOL, atol=1e-15, what="ece 1 vs 2 threads")
    assert_scalar(a["ce"], b["ce"], rtol=THREADS_RTOL, atol=1e-15, what="CE 1 vs 2 threads")
    # and both are right
    assert_close(
        b["E"],
        ref.ref_conditional_expectation(P, y, 0.01),
        rtol=1e-9,
        atol=E_ATOL,
        what="E vs ref",
    )
    assert_scalar(
        b["ece"],
        ref.ref_ece_kde(P, y, 1, ds.ref_bandwidth),
        rtol=rtol64(ds.ref_bandwidth),
    )
    assert_scalar(b["ce"], ref.ref_calibration_error(P, y, "l2", 0.3, "refinement"), rtol=1e-9)
    ll_ref = ref.ref_loo_log_likelihood(P, grid)
    rt = np.array([rtol64(h) for h in grid])
    assert np.all(np.abs(b["ll"] - ll_ref) <= rt * np.abs(ll_ref) + LL_ATOL)


def test_more_threads_than_rows(kd, cpp_threads):
    """More threads than query rows still gives the reference answer."""
    P = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]])
    y = np.array([0, 1, 1, 2])
    cpp_threads(2)
    E2 = kd.conditional_expectation(P, y, bandwidth=0.1, backend="cpp")
    cpp_threads(1)
    E1 = kd.conditional_expectation(P, y, bandwidth=0.1, backend="cpp")
    assert_close(E2, E1, rtol=THREADS_RTOL, atol=E_ATOL)
    assert_close(E1, ref.ref_conditional_expectation(P, y, 0.1), rtol=1e-9, atol=E_ATOL)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("shape", [(1, 500, 10), (3, 41, 4), (2, 2, 3)])
def test_row_blocks_give_the_same_bits(kd, monkeypatch, threads, shape):
    """map_row_blocks(f, a) == f(a) bit for bit for the kernel bias, any thread count.

    The blocks split the rows (axis -2); the bias is elementwise lgamma then a sum over
    the last axis, so each row sees the same operations in the same order.
    """
    from scipy.special import gammaln

    from kdecal import _backends

    rng = np.random.default_rng(sum(shape) + threads)
    p = rng.dirichlet(np.full(shape[-1], 0.5), size=shape[:-1])
    p[..., 0, :] = 0.0  # exact zeros and ones
    p[..., 0, 0] = 1.0

    def f(a):
        return -gammaln(a / 0.013 + 1.0).sum(axis=-1)

    monkeypatch.setattr(_backends, "ROW_BLOCKS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(_backends.os, "cpu_count", lambda: 64)  # blocks = threads here
    old = _backends._num_threads
    try:
        kd.set_num_threads(threads)
        got = _backends.map_row_blocks(f, p)
    finally:
        _backends._num_threads = old
    want = f(p)
    assert got.shape == want.shape == shape[:-1]
    np.testing.assert_array_equal(got, want)
