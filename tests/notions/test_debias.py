"""Debiasing: "ustat" (Popordanoska et al. 2022, Eq. 7) and "ratio" (App. C Eq. 73-75,
App. D Eq. 89-91) against an independent brute force.

The reference materialises the leave-one-out kernel weights ``w_i`` of every query row
(relative to the row max, float64, tests/_reference.py) and computes the sample moments of
``X = w``, ``Y = w 1[y_i = c]`` directly with numpy (mean, var(ddof=1), centred
covariances; checked against np.cov here), never from power sums:

- "ustat": ``sq_c = sum_{i != k} Y_i Y_k / sum_{i != k} X_i X_k`` (checked against the
  literal double sum), ``E`` the plain ratio;
- "ratio": ``E`` from App. C (kdecal._debias.ratio_of_means fed with the reference's
  moments, cross-checked against an independent transcription of Eq. 73-75) and ``sq``
  from App. D (kdecal._debias.ratio_of_squares fed with the reference's moments), so the
  C++ power-sum-to-moment plumbing and the C++ transcription are checked against NumPy;
- rows with ``S0^2 - Q0 <= 1e-12 S0^2`` (one effective neighbour), or every row when
  ``n - 1 < 6`` in "ratio" mode, keep the plain ratio and its square.

Tolerances: rtol 1e-9 plus ``ref_debias_atol`` = 16 eps x mean row condition
``S0^2 / (S0^2 - Q0)`` (cancellation in ``S^2 - Q``; only matters at tiny bandwidths).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from scipy.special import xlogy
from test_notions import (
    BANDWIDTHS,
    BW_IDS,
    DATASET_IDS,
    DATASETS,
    NOTIONS,
    RTOL,
    SQUARED_QUANTITIES,
    Data,
    check_quantities,
    expect_warnings,
    formulas,
    get_data,
)

import _reference as ref
from _helpers import SCALAR_ATOL, assert_scalar, bw_id
from conftest import dataset_or_skip as _get

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

MODES = ["ustat", "ratio"]
MODE_NUMBER = {"ustat": 1, "ratio": 2}
EPS = np.finfo(np.float64).eps
FIXED_BANDWIDTHS = [0.05, 0.5]
FIXED_IDS = [bw_id(b) for b in FIXED_BANDWIDTHS]
SMALL = ["syn-K2-n60", "syn-K4-absentclass-n100"]  # literal O(n^3) double sums


@pytest.fixture(scope="module")
def kd(kdecal_module):
    """Return the kdecal module."""
    return kdecal_module


@pytest.fixture(scope="module")
def nd():
    """kdecal._debias, the NumPy twin of cpp/include/kdecal/debias.hpp."""
    return importlib.import_module("kdecal._debias")


@pytest.fixture(scope="module")
def core(kdecal_module):
    """kdecal._core (the compiled extension); skipped when the cpp backend is missing."""
    if "cpp" not in kdecal_module.available_backends():
        pytest.skip("cpp backend not available")
    return importlib.import_module("kdecal._core")


@pytest.fixture(scope="module", params=DATASETS, ids=DATASET_IDS)
def ds(request):
    """The datasets of test_notions.py (cut to N_MAX rows)."""
    return get_data(request.param)


def _samples(data, calibration, h):
    """Reference LOO samples per problem: list of (points, labels, X (n, N), Y (D, n, N))."""
    out = []
    for pts, lab in ref.ref_notion_problems(data.probs, data.labels, calibration):
        X, Y = ref.ref_loo_sample(pts, lab, h)
        out.append((pts, lab, X, Y))
    return out


def _power_sums(X, Y):
    """S, Q, T of shape (n, D) from the materialised weights (as the engine would return)."""
    return Y.sum(-1).T.copy(), (Y * X).sum(-1).T.copy(), (Y * X * X).sum(-1).T.copy()


def _engine_estimate(kd, data, calibration, h, debias, backend="cpp"):
    """kdecal's internal estimate (E, sq arrays) for one notion at bandwidth h.

    Internal API (kdecal._estimation: make_problem, estimate), used for entry-wise checks
    of the engine's power sums; the public functions are checked on the same numbers.
    """
    problem_mod = importlib.import_module("kdecal._estimation.problem")
    regression_mod = importlib.import_module("kdecal._estimation.regression")
    val = importlib.import_module("kdecal._validation")
    P = val.check_probs(data.probs)
    y = val.check_labels(data.labels, P.n, P.n_classes)
    be = kd._engine.backends.resolve_backend(backend)  # the internal API takes a resolved name
    return regression_mod.estimate(problem_mod.make_problem(P, y, calibration), h, debias, be)


def close(actual, expected, *, rtol, atol=0.0, what=""):
    """Elementwise |actual - expected| <= atol + rtol |expected| (atol may be an array)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    assert np.all(np.isfinite(expected)), f"{what}: non-finite expected values"
    err = np.abs(actual - expected)
    bound = np.broadcast_to(atol + rtol * np.abs(expected), err.shape)
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err / bound, 0.0)), err.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {err.size} entries differ; worst at {i}: "
            f"got {actual[i]!r}, expected {expected[i]!r}, allowed {bound[i]:.3g}"
        )


# ============================================================ reference self-checks
def test_reference_moments_are_numpy_moments():
    """ref_sample_moments equals np.mean / np.var(ddof=1) / np.cov row by row."""
    data = get_data("syn-K3-n150")
    ((_, _, X, Y),) = _samples(data, "canonical", 0.05)
    m = ref.ref_sample_moments(X[None], Y)
    N = X.shape[1]
    assert m["N"] == N == data.n - 1
    for j in range(0, data.n, 37):
        for c in range(Y.shape[0]):
            x, yv = X[j], Y[c, j]
            expected = {
                "mx": np.mean(x),
                "my": np.mean(yv),
                "varx": np.var(x, ddof=1),
                "vary": np.var(yv, ddof=1),
                "covxy": np.cov(x, yv)[0, 1],
                "covx2y": np.cov(x**2, yv)[0, 1],
                "covx2x": np.cov(x**2, x)[0, 1],
                "covy2x": np.cov(yv**2, x)[0, 1],
            }
            for k, v in expected.items():
                close(m[k][c, j], v, rtol=1e-12, atol=1e-300, what=f"{k} row {j} c {c}")


@pytest.mark.parametrize("h", FIXED_BANDWIDTHS, ids=FIXED_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
@pytest.mark.parametrize("name", SMALL)
def test_ustat_literal_double_sum(kd, core, nd, name, calibration, h):
    """Eq. 7: sum_{i != k} Y_i Y_k / sum_{i != k} X_i X_k, literally, vs kdecal.

    Checked against (a) the reference closed form, (b) kdecal._core.debias and
    kdecal._debias.debias fed with power sums of the reference weights (mode 1), and
    (c) the squares kdecal's engine produces (internal estimate, cpp and numba).
    """
    data = get_data(name)
    samples = _samples(data, calibration, h)
    literal = [ref.ref_ustat_ratio_literal(X, Y).T for _, _, X, Y in samples]  # (n, D) each
    cond = [X.sum(1) ** 2 / (X.sum(1) ** 2 - (X * X).sum(1)) for _, _, X, _ in samples]
    for (_, _, X, Y), lit, cnd in zip(samples, literal, cond):
        atol = 16 * EPS * cnd[:, None]
        close(ref.ref_ustat_ratio(X, Y).T, lit, rtol=1e-12, atol=atol, what="closed form")
        S, Q, _ = _power_sums(X, Y)
        for fn in (core.debias, nd.debias):
            E, sq, deg = fn(S, Q, None, float(data.n - 1), 1)
            assert not np.any(deg)
            close(sq, lit, rtol=1e-12, atol=atol, what=f"{fn.__module__} sq")
            close(E, S / S.sum(1, keepdims=True), rtol=1e-14, what="E is the plain ratio")
    for backend in ("cpp", "numba"):
        if backend not in kd.available_backends():
            continue
        est = _engine_estimate(kd, data, calibration, h, "ustat", backend)
        for b, (lit, cnd) in enumerate(zip(literal, cond)):
            atol = 16 * EPS * cnd[:, None]
            close(est.sq[b], lit, rtol=1e-9, atol=atol, what=f"engine sq ({backend})")


@pytest.mark.parametrize("h", FIXED_BANDWIDTHS, ids=FIXED_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
@pytest.mark.parametrize("name", ["syn-K3-n150", "syn-K10-n400", "real-vgg16-K10"])
def test_eq73_transcription(nd, name, calibration, h):
    """kdecal._debias.ratio_of_means = an independent transcription of Eq. 73-75."""
    data = get_data(name)
    n_checked, correction = 0, 0.0
    for _, _, X, Y in _samples(data, calibration, h):
        m = ref.ref_sample_moments(X[None], Y)
        mine = ref.ref_eq73_ratio_of_means(m)
        with np.errstate(all="ignore"):
            theirs = nd.ratio_of_means(m)
        # the literal formula divides by Cov(X, Y) and Var(X); both underflow (NaN) for
        # classes with a ~1e-170 share of the kernel mass
        ok = np.isfinite(mine) & (m["my"] > 1e-100)
        close(theirs[ok], mine[ok], rtol=1e-10, atol=1e-15, what="Eq. 73")
        correction = max(correction, float(np.max(np.abs(theirs[ok] - (m["my"] / m["mx"])[ok]))))
        n_checked += int(ok.sum())
    assert n_checked > data.n  # most (class, row) pairs
    assert correction > 1e-6  # App. C actually corrects the plain ratio (by O(1/N))


@pytest.mark.parametrize("h", FIXED_BANDWIDTHS, ids=FIXED_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
@pytest.mark.parametrize("name", ["syn-K3-n150", "syn-K4-absentclass-n100", "real-vgg16-K10"])
def test_core_power_sums_to_moments(core, nd, name, calibration, h):
    """kdecal._core.debias (C++) from power sums = NumPy App. C / D on numpy moments.

    The power sums S, Q, T are formed from the reference weights; the expected values feed
    the reference's two-pass moments into kdecal._debias.ratio_of_means/ratio_of_squares.
    """
    data = get_data(name)
    for _, _, X, Y in _samples(data, calibration, h):
        S, Q, T = _power_sums(X, Y)
        E, sq, deg = core.debias(S, Q, T, float(X.shape[1]), 2)
        E_ref, sq_ref = (
            a.T for a in ref.ref_debiased_ratio(X, Y, nd.ratio_of_means, nd.ratio_of_squares)
        )
        assert not np.any(deg)
        cnd = (X.sum(1) ** 2 / (X.sum(1) ** 2 - (X * X).sum(1)))[:, None]
        close(E, E_ref, rtol=1e-9, atol=1e-15, what="App. C E")
        close(sq, sq_ref, rtol=1e-9, atol=16 * EPS * cnd, what="App. D sq")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("h", FIXED_BANDWIDTHS, ids=FIXED_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
@pytest.mark.parametrize("name", ["syn-K2vec-n80", "syn-K3-n150", "syn-K10-n400"])
def test_engine_estimates_match_reference(kd, name, calibration, h, mode):
    """The engine's E and sq arrays (internal estimate) = the reference, entry by entry."""
    data = get_data(name)
    _, problems = ref.ref_notion_estimates(
        data.probs,
        data.labels,
        calibration,
        h,
        mode,
        **formulas(mode),
    )
    est = _engine_estimate(kd, data, calibration, h, mode, backend="auto")
    assert est.n_degenerate == 0 == sum(int(p["degenerate"].sum()) for p in problems)
    for b, prob in enumerate(problems):
        close(est.E[b], prob["E"], rtol=1e-9, atol=1e-15, what=f"E problem {b}")
        atol = 16 * EPS * prob["cond"][:, None]
        close(est.sq[b], prob["sq"], rtol=1e-9, atol=atol, what=f"sq problem {b}")


# ============================================================ public estimators
@pytest.mark.parametrize("debias", MODES)
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
def test_quantities_match_reference(kd, ds, calibration, bandwidth, debias):
    """Every function x divergence x estimator x notion with debiasing = the brute force.

    L2 quantities use ``sq - 2 E f + f^2`` (ustat: E plain, sq Eq. 7; ratio: E App. C, sq
    App. D); ece_kde(p=2) is its signed square root (negative when it is); p = 1, 3 use
    E; "kl" uses E clipped at 0 and renormalised in "ratio" mode.  Expected warnings
    (degenerate rows with their exact count) are asserted.
    """
    check_quantities(kd, ds, calibration, bandwidth, debias)


@pytest.mark.parametrize("calibration", NOTIONS)
def test_debiasing_changes_the_right_quantities(kd, calibration):
    """ustat changes only the L2 / p = 2 quantities; ratio changes all; ratio KL renormalises."""
    data = get_data("syn-K3-n150")
    h = 0.05
    args = (data.probs, data.labels)
    values = {}
    for mode in ref.DEBIAS_MODES:
        _, problems = ref.ref_notion_estimates(
            *args,
            calibration,
            h,
            mode,
            **formulas(mode),
        )
        for q in ref.QUANTITIES:
            with expect_warnings():
                values[mode, q] = ref.call_quantity(
                    kd, q, *args, bandwidth=h, calibration=calibration, debias=mode
                )
        if mode == "ratio":
            ratio_problems = problems
    l2_like = {"ece_p2", "ce_l2_direct", "ce_l2_refinement", "refinement_l2", "sharpness_l2"}
    for q in ref.QUANTITIES:
        none, ustat, ratio = (values[m, q] for m in ref.DEBIAS_MODES)
        if q in l2_like:
            assert abs(ustat - none) > 1e-6 * abs(none), q
        else:
            assert_scalar(ustat, none, rtol=1e-12, what=f"{q}: ustat keeps E plain")
        assert abs(ratio - none) > 1e-6 * abs(none), q
    # ratio KL: the App. C rows do not sum to 1; kdecal renormalises them.  (The clip at 0
    # cannot be reached here: with Y = X 1[y = c], App. C stayed above 0.027 x the plain
    # ratio in a random search over 1e6 weight vectors, N = 6..40.)
    E = np.concatenate([p["E"] for p in ratio_problems])
    assert np.max(np.abs(E.sum(axis=1) - 1.0)) > 1e-4
    unnormalised = np.mean(
        np.concatenate(
            [np.sum(xlogy(p["E"], p["E"]) - xlogy(p["E"], p["points"]), 1) for p in ratio_problems]
        )
    )
    got = values["ratio", "ce_kl_direct"]
    want = ref.ref_notion_calibration_error(ratio_problems, calibration, "kl", "direct", "ratio")
    assert_scalar(got, want, rtol=RTOL)
    assert abs(got - unnormalised) > 1e-6 * abs(want)
    # ece_kde(p=2) = sqrt of the debiased L2 CE (the same sq - 2 E f + f^2)
    for mode in MODES:  # signed root when negative (issue 26)
        e2 = values[mode, "ece_p2"]
        assert_scalar(np.sign(e2) * e2**2, values[mode, "ce_l2_direct"], rtol=1e-12, what=mode)


# ============================================================ degenerate rows
# Six groups of exact duplicates (sizes 2 and 3) at centres 0.065 apart in every
# coordinate and in the top-label confidence.  At h = 1e-5 the other groups' kernel
# weights underflow to exactly 0, so a row of a pair has a single effective neighbour
# (S0^2 - Q0 = 0: degenerate) and a row of a triplet has two equal ones (well conditioned).
CENTRES = np.array(
    [
        [0.03, 0.035, 0.935],
        [0.15, 0.119, 0.731],
        [0.27, 0.371, 0.359],
        [0.40, 0.455, 0.145],
        [0.52, 0.203, 0.277],
        [0.64, 0.287, 0.073],
    ]
)
SIZES = [2, 3, 2, 3, 2, 2]
TINY_H = 1e-5


def _clustered():
    P = np.repeat(CENTRES, SIZES, axis=0)
    y = np.array([0, 1, 0, 2, 2, 1, 1, 2, 0, 1, 0, 2, 1, 1])
    return P, y


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("calibration", NOTIONS)
def test_degenerate_rows_warn_and_keep_plain_ratio(kd, calibration, mode):
    """Single-neighbour rows: a KdecalWarning with their count, finite results, plain ratio."""
    P, y = _clustered()
    _, problems = ref.ref_notion_estimates(P, y, calibration, TINY_H, mode, **formulas("ratio"))
    pair_rows = np.repeat(np.array(SIZES) == 2, SIZES)
    for prob in problems:  # the construction does what it claims
        np.testing.assert_array_equal(prob["degenerate"], pair_rows)
        assert prob["cond"][~pair_rows].max() < 10.0
    n_deg = int(pair_rows.sum()) * len(problems)
    n_rows = P.shape[0] * len(problems)
    data = Data("clustered", P, y)
    for q in ref.QUANTITIES:
        expected, negative = ref.ref_notion_quantity(q, problems, calibration, mode)
        warned = n_deg if mode != "ustat" or q in SQUARED_QUANTITIES else 0
        with expect_warnings(warned, n_rows, negative):
            got = ref.call_quantity(
                kd,
                q,
                data.probs,
                data.labels,
                bandwidth=TINY_H,
                calibration=calibration,
                debias=mode,
            )
        assert np.isfinite(got)
        assert_scalar(got, expected, rtol=1e-8, atol=SCALAR_ATOL, what=q)
    # array level: degenerate rows hold exactly the plain ratio and its square
    with expect_warnings(n_deg, n_rows):
        est = _engine_estimate(kd, data, calibration, TINY_H, mode)
    assert est.n_degenerate == n_deg
    _, plain = ref.ref_notion_estimates(P, y, calibration, TINY_H, "none")
    for b, (prob, pl) in enumerate(zip(problems, plain)):
        close(est.E[b][pair_rows], pl["E"][pair_rows], rtol=1e-12, what="E plain")
        close(est.sq[b][pair_rows], pl["E"][pair_rows] ** 2, rtol=1e-12, what="sq plain")
        close(est.E[b], prob["E"], rtol=1e-8, atol=1e-15, what="E")
        close(est.sq[b], prob["sq"], rtol=1e-8, atol=1e-15, what="sq")


def test_ratio_needs_six_leave_one_out_terms(kd):
    """n - 1 < 6: "ratio" (Eq. 89 has factors n - 5) keeps every row plain, with a warning."""
    rng = np.random.default_rng(7)
    P = rng.dirichlet([1.0, 1.0, 1.0], size=6)
    y = np.array([0, 1, 2, 0, 1, 1])
    h = 0.5
    _, none = ref.ref_notion_estimates(P, y, "canonical", h, "none")
    _, ustat = ref.ref_notion_estimates(P, y, "canonical", h, "ustat")
    _, ratio = ref.ref_notion_estimates(P, y, "canonical", h, "ratio", **formulas("ratio"))
    assert ratio[0]["degenerate"].all() and not ustat[0]["degenerate"].any()
    with expect_warnings(6, 6):
        got_ratio = kd.calibration_error(P, y, divergence="l2", bandwidth=h, debias="ratio")
    got_ustat = kd.calibration_error(P, y, divergence="l2", bandwidth=h, debias="ustat")
    got_none = kd.calibration_error(P, y, divergence="l2", bandwidth=h, debias="none")
    want_none = ref.ref_notion_calibration_error(none, "canonical", "l2", "direct", "none")
    want_ustat = ref.ref_notion_calibration_error(ustat, "canonical", "l2", "direct", "ustat")
    assert_scalar(got_none, want_none, rtol=RTOL)
    assert_scalar(got_ratio, want_none, rtol=RTOL, what="ratio = plain when n - 1 < 6")
    assert_scalar(got_ustat, want_ustat, rtol=RTOL)
    assert abs(got_ustat - got_none) > 1e-6


# ============================================================ backends
@pytest.mark.parametrize("debias", ref.DEBIAS_MODES)
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
@pytest.mark.parametrize("name", ["syn-K3-n150", "real-pneumonia-K2"])
def test_backends_agree(kd, both_backends, name, calibration, bandwidth, debias):
    """cpp and numba evaluate() agree to 1e-10 (plus the conditioning allowance) in every mode.

    (Rows of the known ratio NaN bug must be NaN on both backends.)
    """
    data = get_data(name)
    _, problems = ref.ref_notion_estimates(
        data.probs,
        data.labels,
        calibration,
        bandwidth,
        debias,
        **formulas(debias),
    )
    n_deg = int(sum(p["degenerate"].sum() for p in problems))
    n_rows = sum(p["degenerate"].size for p in problems)
    reports = {}
    for backend in both_backends:
        with expect_warnings(n_deg, n_rows):
            reports[backend] = kd.evaluate(
                data.probs,
                data.labels,
                bandwidth=bandwidth,
                calibration=calibration,
                debias=debias,
                backend=backend,
                n_resamples=0,
                notions=(),
            )
    a, b = (reports[x] for x in both_backends)
    assert a.bandwidth == b.bandwidth
    atol = SCALAR_ATOL + ref.ref_debias_atol(problems)
    for field in ref.REPORT_FIELDS:
        np.testing.assert_allclose(
            getattr(a, field), getattr(b, field), rtol=1e-10, atol=atol, err_msg=field
        )


def _random_power_sums(rng, shape, N, C, spread):
    """Consistent power sums of random weights: S, Q, T of shape (*shape, C)."""
    w = np.exp(rng.normal(size=(*shape, N)) * spread)
    w /= w.max(axis=-1, keepdims=True)
    lab = rng.integers(0, C, size=(*shape, N))
    onehot = lab[..., None] == np.arange(C)
    w = w[..., None]
    S, Q, T = ((w**k * onehot).sum(axis=-2) for k in (1, 2, 3))
    return S, Q, T


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "shape, N, C",
    [((40,), 29, 3), ((2, 25), 12, 2), ((3, 2, 10), 60, 10), ((20,), 5, 3)],
    ids=["R40-N29-C3", "B2-R25-N12-C2", "B3-H2-R10-N60-C10", "R20-N5-C3"],
)
def test_core_debias_matches_numpy_twin(core, nd, shape, N, C, mode):
    """kdecal._core.debias (C++) = kdecal._debias.debias (NumPy) to 1e-12 on power sums.

    Includes single-neighbour rows, rows without a class and (N = 5) the n - 1 < 6 rule.
    """
    rng = np.random.default_rng(N * 100 + C)
    S, Q, T = _random_power_sums(rng, shape, N, C, spread=2.0)
    flat = (S.reshape(-1, C), Q.reshape(-1, C), T.reshape(-1, C))
    for arr in flat:  # row 0: one neighbour (w = 1 in class 0) -> degenerate
        arr[0] = 0.0
        arr[0, 0] = 1.0
    for k, arr in enumerate(flat, start=1):  # row 1: class 1 holds ~1e-200 of the weight
        arr[1, 1] *= 1e-200**k  # (Q, T underflow to 0 as they would in the engine)
    out_c = core.debias(S, Q, T if mode == "ratio" else None, float(N), MODE_NUMBER[mode])
    out_n = nd.debias(S, Q, T if mode == "ratio" else None, float(N), MODE_NUMBER[mode])
    for name, c, n in zip(("E", "sq", "degenerate"), out_c, out_n):
        assert c.shape == n.shape == (S.shape if name != "degenerate" else S.shape[:-1]), name
        assert np.all(np.isfinite(c)), name
        close(c, n, rtol=1e-12, atol=1e-15, what=name)
    deg = out_c[2].reshape(-1)
    assert deg[0]
    assert deg.all() if (mode == "ratio" and N < 6) else not deg[1:].any()
    E, sq = out_c[0].reshape(-1, C), out_c[1].reshape(-1, C)
    plain = flat[0] / flat[0].sum(axis=1, keepdims=True)
    close(E[0], plain[0], rtol=0, what="degenerate row E")
    close(sq[0], plain[0] ** 2, rtol=0, what="degenerate row sq")
    # a negligible class is finite and ~0 (kdecal keeps its plain / U-statistic values)
    assert 0 <= E[1, 1] < 1e-150 and abs(sq[1, 1]) < 1e-150
    # classes without members give exactly 0
    assert np.all(E[flat[0] == 0] == 0) and np.all(sq[flat[0] == 0] == 0)


def test_core_debias_ratio_requires_T(core):
    """mode 2 without T: ValueError from the compiled core (mode 1 needs none)."""
    S, Q, _ = _random_power_sums(np.random.default_rng(0), (4,), 10, 3, 1.0)
    with pytest.raises(ValueError, match="needs T"):
        core.debias(S, Q, None, 10.0, 2)
    _, sq, _ = core.debias(S, Q, None, 10.0, 1)
    close(sq, (S * S - Q) / (S.sum(1, keepdims=True) ** 2 - Q.sum(1, keepdims=True)), rtol=1e-13)


def test_numpy_twin_ratio_requires_T(nd):
    """The NumPy twin behaves like the core: mode 2 without T is a ValueError."""
    S, Q, _ = _random_power_sums(np.random.default_rng(0), (4,), 10, 3, 1.0)
    with pytest.raises(ValueError, match="T"):
        nd.debias(S, Q, None, 10.0, 2)


# ============================================================ tiny class mass
# A query row where a class holds a tiny but nonzero share of the kernel mass (~1e-87 ..
# 1e-192 here): mu_Y > 0 but mu_Y**2 underflows to 0, and App. C / D computed
# Var(Y) / mu_Y^2 = 0 / 0 = NaN in every public quantity (kdecal before a87ee2d; found
# by these tests, fixed meanwhile by leaving classes with S_c <= 1e-30 S0 uncorrected).
# The reference evaluates App. C / D on Y / max Y (homogeneity): finite, E_c ~ 0.
@pytest.mark.parametrize("backend", ["cpp", "numba"])
def test_ratio_tiny_class_mass_is_finite(kd, backend):
    """19 class-0 scores in [0.1, 0.3], one class-1 score at 0.9, h = 0.004: finite CE."""
    if backend not in kd.available_backends():
        pytest.skip(f"{backend} not available")
    q = np.concatenate([np.linspace(0.1, 0.3, 19), [0.9]])
    y = np.r_[np.zeros(19, dtype=int), 1]
    h = 0.004
    X, Y = ref.ref_loo_sample(ref.ref_clip(q), y, h)
    frac = Y[1].sum(1) / X.sum(1)
    assert 0 < frac[:19].min() and frac[:19].max() < 1e-80  # the triggering rows exist
    _, problems = ref.ref_notion_estimates(q, y, "canonical", h, "ratio", **formulas("ratio"))
    want = ref.ref_notion_quantity("ece_p1", problems, "canonical", "ratio")[0]
    assert abs(want - 0.47) < 1e-12  # E is one-hot up to 1e-87
    got = kd.ece_kde(q, y, bandwidth=h, debias="ratio", backend=backend)
    assert_scalar(got, want, rtol=RTOL)


@pytest.mark.parametrize("calibration", ["canonical", "classwise"])
def test_ratio_tiny_class_mass_real_data(kd, calibration):
    """PneumoniaMNIST ResNet-50, first 150 rows, 'loo-mle' bandwidth (1.33e-3): finite CE."""
    d = _get("real-pneumonia-K2")
    data = Data("pneumonia-150", d.probs[:150].copy(), d.labels[:150].copy())
    h = ref.ref_notion_bandwidth(data.probs, data.labels, calibration, "loo-mle")
    assert h == pytest.approx(1.3257e-3, rel=1e-3)
    check_quantities(kd, data, calibration, h, "ratio")


# ============================================================ bad input
CALLS = {
    "ece_kde": lambda kd, P, y, **kw: kd.ece_kde(P, y, bandwidth=0.1, **kw),
    "calibration_error": lambda kd, P, y, **kw: kd.calibration_error(P, y, bandwidth=0.1, **kw),
    "refinement": lambda kd, P, y, **kw: kd.refinement(P, y, bandwidth=0.1, **kw),
    "sharpness": lambda kd, P, y, **kw: kd.sharpness(P, y, bandwidth=0.1, **kw),
    "evaluate": lambda kd, P, y, **kw: kd.evaluate(P, y, bandwidth=0.1, **kw),
}


@pytest.mark.parametrize("value", ["bogus", "Ratio", "u-stat", None, True], ids=repr)
@pytest.mark.parametrize("fn", list(CALLS))
def test_bad_debias(kd, syn_k3, fn, value):
    """An unknown debias raises ValueError naming the argument (and the value)."""
    with pytest.raises(ValueError, match="debias") as info:
        CALLS[fn](kd, syn_k3.probs, syn_k3.labels, debias=value)
    assert repr(value) in str(info.value)
