"""Backend selection, cross-backend agreement and thread-count independence."""

from __future__ import annotations

import os
import re
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
from kdecal._engine import runtime as _runtime

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

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
                P,
                y,
                bandwidth="loo-mle",
                calibration="canonical",
                debias="none",
                backend=b,
                n_resamples=0,
                notions=(),
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

    rng = np.random.default_rng(sum(shape) + threads)
    p = rng.dirichlet(np.full(shape[-1], 0.5), size=shape[:-1])
    p[..., 0, :] = 0.0  # exact zeros and ones
    p[..., 0, 0] = 1.0

    def f(a):
        return -gammaln(a / 0.013 + 1.0).sum(axis=-1)

    monkeypatch.setattr(_runtime, "ROW_BLOCKS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(_runtime.os, "cpu_count", lambda: 64)  # blocks = threads here
    old = _runtime._num_threads
    try:
        kd.set_num_threads(threads)
        got = _runtime.map_row_blocks(f, p)
    finally:
        _runtime._num_threads = old
    want = f(p)
    assert got.shape == want.shape == shape[:-1]
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------- the compiled kernel biases


def _core_or_skip():
    if _runtime._core is None:
        pytest.skip("kdecal._core is not built")
    return _runtime._core


def _bias_probs(rng, rows, D):
    p = rng.dirichlet(np.full(D, 0.3), size=rows)
    p[0] = 0.0  # exact zeros and ones, and values far below one ulp of 1
    p[0, 0] = 1.0
    if rows > 1:
        p[1] = 1e-300
        p[1, -1] = 1.0 - 1e-300 * (D - 1)
    return p


@pytest.mark.parametrize("isa", ["default", "avx2", "baseline"])
@pytest.mark.parametrize("D", [1, 2, 10, 100, 2500])
def test_compiled_kernel_bias_matches_gammaln(kd, monkeypatch, isa, D):
    """_core.kernel_bias = -sum_k gammaln(p s + 1) to a few ulp per term, on each SIMD path.

    The arguments p s + 1 span [1, 1e7] (bandwidths 1e-7 to 1e4, which the public API
    allows). Per value, the engine's lgamma is within 64 ulp of max(1, |lgamma|) of SciPy's
    (measured: about 30 near x = 1-2, where lgamma(x + 8) - log(x ... (x + 7)) cancels,
    and about 12 for large x); the tolerance of a row is the sum of its terms' bounds. A
    wrong Stirling coefficient (z^-5 term: ~1e-6 at z = 9) or a mishandled exponent in
    the log would exceed it by orders of magnitude. D = 2500 takes the chunked path (rows
    longer than the kernel's 2048-value buffer).
    """
    from scipy.special import gammaln

    core = _core_or_skip()
    if isa != "default":
        monkeypatch.setenv("KDECAL_ISA", isa)
    rng = np.random.default_rng(D)
    rows = 3 if D > 100 else 400
    p = _bias_probs(rng, rows, D) if D > 1 else rng.random((rows, 1))
    for scale in (1e-4, 0.3, 1.0, 7.9, 20.0, 333.3, 1e5, 1e7):
        got = core.kernel_bias(p, scale)
        terms = gammaln(p * scale + 1.0)
        want = -terms.sum(axis=-1)
        tol = 64 * np.finfo(float).eps * np.maximum(np.abs(terms), 1.0).sum(axis=-1)
        assert got.shape == (rows,)
        bad = np.abs(got - want) > tol
        assert not bad.any(), (scale, np.flatnonzero(bad)[:5], (got - want)[bad][:5])
    # lgamma(1) = lgamma(2) = 0 and lgamma(3) = log 2: on the grid where x is exact
    x = np.array([[0.0], [1.0], [0.5]])
    np.testing.assert_allclose(core.kernel_bias(x, 2.0), [0.0, -np.log(2.0), 0.0], atol=1e-14)


@pytest.mark.parametrize("shape", [(700, 10), (5, 2500), (40001, 2)])
def test_compiled_kernel_bias_same_bits_for_any_threads_and_rows(kd, shape):
    """The bias of a row does not depend on the thread count or on the other rows."""
    core = _core_or_skip()
    p = _bias_probs(np.random.default_rng(shape[0]), *shape)
    one = core.kernel_bias(p, 1 / 0.013, 1)
    for threads in (2, 3, 7):
        np.testing.assert_array_equal(core.kernel_bias(p, 1 / 0.013, threads), one)
    cut = shape[0] // 3 + 1
    parts = [
        core.kernel_bias(np.ascontiguousarray(p[a:b]), 1 / 0.013, 2)
        for a, b in ((0, cut), (cut, shape[0]))
    ]
    np.testing.assert_array_equal(np.concatenate(parts), one)


def test_compiled_kernel_bias_rejects_bad_input(kd):
    core = _core_or_skip()
    p = np.full((4, 3), 1 / 3)
    for bad, where in ((-1e-9, "p[2, 1]"), (1.5, "p[2, 1]"), (np.nan, "p[2, 1]")):
        q = p.copy()
        q[2, 1] = bad
        with pytest.raises(ValueError, match=r"p must lie in \[0, 1\]; " + re.escape(where)):
            core.kernel_bias(q, 2.0)
    for scale in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="scale must be finite and > 0"):
            core.kernel_bias(p, scale)
    with pytest.raises(ValueError, match="2-D"):
        core.kernel_bias(p.ravel(), 2.0)
    with pytest.raises(TypeError):
        core.kernel_bias(p.astype(np.float32), 2.0)  # noconvert: no hidden copy


def test_search_bias_is_the_compiled_one(kd):
    """_estimation.problem.kernel_bias uses the compiled lgamma when the core is built."""
    from kdecal._estimation import problem as _problem
    from kdecal._validation import check_probs

    core = _core_or_skip()
    P, y = make_synthetic(300, 4, seed=3)
    pb = _problem.make_problem(check_probs(P), y, "classwise")
    got = _problem.kernel_bias(pb, 0.02)
    want = core.kernel_bias(np.ascontiguousarray(pb.p.reshape(-1, pb.p.shape[-1])), 1 / 0.02)
    assert got.shape == pb.p.shape[:2]
    np.testing.assert_array_equal(got, want.reshape(got.shape))
