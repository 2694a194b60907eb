"""Input validation (spec "Errors") and numerically hostile but valid inputs.

Bad inputs: the right exception type, with `match=` on the argument name the
spec requires in the message ("probs", "labels", "bandwidth").
Valid edge cases (exact 0/1 probabilities, all-underflow rows at h = 1e-5,
rows off by < 1e-3, float labels with integral values, n = 3, singleton
classes): finite results equal to the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
from _helpers import (
    E_ATOL,
    LL_ATOL,
    assert_close,
    assert_scalar,
    assert_simplex_rows,
    rtol64,
)
from conftest import make_synthetic

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

H = 0.1


@pytest.fixture(scope="module")
def kd(kdecal_module):
    """Return the kdecal module."""
    return kdecal_module


def _good(n=12, K=3, seed=0):
    P, y = make_synthetic(n, K, seed=seed)
    y[:K] = np.arange(K)  # every class present
    return P, y


# Every public function taking (probs, labels), called with a valid bandwidth.
LABELLED = {
    "conditional_expectation": lambda kd, P, y: kd.conditional_expectation(P, y, bandwidth=H),
    "ece_kde": lambda kd, P, y: kd.ece_kde(P, y, bandwidth=H),
    "calibration_error": lambda kd, P, y: kd.calibration_error(P, y, bandwidth=H),
    "refinement": lambda kd, P, y: kd.refinement(P, y, bandwidth=H),
    "sharpness": lambda kd, P, y: kd.sharpness(P, y, bandwidth=H),
    "evaluate": lambda kd, P, y: kd.evaluate(P, y, bandwidth=H),
}
# ... and those taking probs only.
PROBS_ONLY = {
    "loo_log_likelihood": lambda kd, P, y: kd.loo_log_likelihood(P, [H]),
    "select_bandwidth": lambda kd, P, y: kd.select_bandwidth(P, grid=[0.05, H]),
}
ALL_FUNCS = {**LABELLED, **PROBS_ONLY}


# ------------------------------------------------------------------ bad probs
def _nan(P):
    P = P.copy()
    P[3, 1] = np.nan
    return P


def _inf(P):
    P = P.copy()
    P[3, 1] = np.inf
    return P


def _negative(P):
    P = P.copy()
    P[3] = [-0.1, 0.6, 0.5]
    return P  # still sums to 1


def _rowsum_high(P):
    P = P.copy()
    P[3] = P[3] * 1.15
    return P  # |sum - 1| = 0.15 > PROBS_ROW_SUM_ATOL = 0.1


def _rowsum_low(P):
    P = P.copy()
    P[5] = P[5] * (1 - 0.12)
    return P


def _K1(P):
    return np.ones((P.shape[0], 1))


def _empty(P):
    return np.zeros((0, 3))


BAD_PROBS_VALUE = {
    "nan": _nan,
    "inf": _inf,
    "negative": _negative,
    "rowsum+0.15": _rowsum_high,
    "rowsum-0.12": _rowsum_low,
    "K=1": _K1,
    "empty": _empty,
    "binary>1": lambda P: np.where(np.arange(P.shape[0]) == 2, 1.5, P[:, 1]),
    "binary<0": lambda P: np.where(np.arange(P.shape[0]) == 2, -0.2, P[:, 1]),
    "binary-nan": lambda P: np.where(np.arange(P.shape[0]) == 2, np.nan, P[:, 1]),
}


@pytest.mark.parametrize("fn", list(ALL_FUNCS), ids=list(ALL_FUNCS))
@pytest.mark.parametrize("case", list(BAD_PROBS_VALUE), ids=list(BAD_PROBS_VALUE))
def test_bad_probs_raise_valueerror(kd, case, fn):
    """Each invalid probs value raises ValueError naming 'probs'."""
    P, y = _good()
    if case.startswith("binary"):
        P, y = _good(K=2)
    bad = BAD_PROBS_VALUE[case](P)
    if case == "empty":
        y = np.zeros(0, dtype=np.int64)
    elif case == "K=1":
        y = np.zeros(P.shape[0], dtype=np.int64)
    with pytest.raises(ValueError, match="probs"):
        ALL_FUNCS[fn](kd, bad, y)
    # the valid version of the same data works and matches the reference
    if fn == "ece_kde" and case not in ("empty", "K=1"):
        assert_scalar(ALL_FUNCS[fn](kd, P, y), ref.ref_ece_kde(P, y, 1, H), rtol=1e-9)


@pytest.mark.parametrize("fn", list(ALL_FUNCS), ids=list(ALL_FUNCS))
def test_too_few_rows(kd, fn):
    """Fewer than 3 rows raise ValueError."""
    P, y = _good()
    with pytest.raises(ValueError, match="probs|labels"):
        ALL_FUNCS[fn](kd, P[:2], y[:2])


@pytest.mark.parametrize("fn", list(ALL_FUNCS), ids=list(ALL_FUNCS))
@pytest.mark.parametrize(
    "bad",
    [
        np.array([["a", "b", "c"]] * 5),
        np.array([[object(), 0.5, 0.5]] * 5, dtype=object),
        "probs",
    ],
    ids=["str-array", "object-array", "plain-str"],
)
def test_non_numeric_probs_typeerror(kd, fn, bad):
    """Non-numeric probs raise TypeError naming 'probs'."""
    y = np.array([0, 1, 2, 0, 1])
    with pytest.raises(TypeError, match="probs"):
        ALL_FUNCS[fn](kd, bad, y)


# ----------------------------------------------------------------- bad labels
BAD_LABELS = {
    "too-large": lambda y, K: np.where(np.arange(y.size) == 4, K, y),
    "negative": lambda y, K: np.where(np.arange(y.size) == 4, -1, y),
    "non-integer-float": lambda y, K: np.where(np.arange(y.size) == 4, 0.5, y.astype(float)),
    "float-nan": lambda y, K: np.where(np.arange(y.size) == 4, np.nan, y.astype(float)),
    "2d": lambda y, K: y.reshape(-1, 1),
    "2d-row": lambda y, K: y.reshape(1, -1),
    "too-short": lambda y, K: y[:-1],
    "too-long": lambda y, K: np.concatenate([y, [0]]),
}


@pytest.mark.parametrize("fn", list(LABELLED), ids=list(LABELLED))
@pytest.mark.parametrize("case", list(BAD_LABELS), ids=list(BAD_LABELS))
def test_bad_labels_raise_valueerror(kd, case, fn):
    """Each invalid labels value raises ValueError naming 'labels'."""
    P, y = _good()
    bad = BAD_LABELS[case](y, P.shape[1])
    # shape mismatch may legitimately be reported against either argument
    match = "probs|labels" if case.startswith("too-") and case != "too-large" else "labels"
    with pytest.raises(ValueError, match=match):
        LABELLED[fn](kd, P, bad)


@pytest.mark.parametrize("fn", list(LABELLED), ids=list(LABELLED))
def test_binary_labels_out_of_range(kd, fn):
    """Label 2 with binary (n,) probs raises ValueError."""
    P, y = _good(K=2)
    with pytest.raises(ValueError, match="labels"):
        LABELLED[fn](kd, P[:, 1], np.where(np.arange(y.size) == 0, 2, y))


@pytest.mark.parametrize("fn", list(LABELLED), ids=list(LABELLED))
def test_non_numeric_labels_typeerror(kd, fn):
    """String labels raise TypeError naming 'labels'."""
    P, _ = _good()
    with pytest.raises(TypeError, match="labels"):
        LABELLED[fn](kd, P, np.array(["a", "b", "c"] * 4))


# -------------------------------------------------------------- bad bandwidth
BW_FUNCS = {
    "conditional_expectation": lambda kd, P, y, h: kd.conditional_expectation(P, y, bandwidth=h),
    "ece_kde": lambda kd, P, y, h: kd.ece_kde(P, y, bandwidth=h),
    "calibration_error": lambda kd, P, y, h: kd.calibration_error(P, y, bandwidth=h),
    "refinement": lambda kd, P, y, h: kd.refinement(P, y, bandwidth=h),
    "sharpness": lambda kd, P, y, h: kd.sharpness(P, y, bandwidth=h),
    "evaluate": lambda kd, P, y, h: kd.evaluate(P, y, bandwidth=h),
    "loo_log_likelihood": lambda kd, P, y, h: kd.loo_log_likelihood(P, [0.1, h]),
}
BAD_BW = {
    "zero": 0.0,
    "negative": -0.1,
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
}


@pytest.mark.parametrize("fn", list(BW_FUNCS), ids=list(BW_FUNCS))
@pytest.mark.parametrize("case", list(BAD_BW), ids=list(BAD_BW))
def test_bad_bandwidth_raises(kd, case, fn):
    """A bandwidth <= 0, NaN or inf raises ValueError naming 'bandwidth'."""
    P, y = _good()
    with pytest.raises(ValueError, match="bandwidth"):  # also matches "bandwidths"
        BW_FUNCS[fn](kd, P, y, BAD_BW[case])


@pytest.mark.parametrize("fn", [f for f in BW_FUNCS if f != "loo_log_likelihood"])
def test_unknown_bandwidth_string(kd, fn):
    """A bandwidth string other than 'auto' / 'loo-mle' raises ValueError."""
    P, y = _good()
    with pytest.raises(ValueError, match="bandwidth"):
        BW_FUNCS[fn](kd, P, y, "scott")


# --------------------------------------------- calibration / divergence / p / estimator
CAL_FUNCS = ["ece_kde", "calibration_error", "refinement", "sharpness"]


@pytest.mark.parametrize("fn", CAL_FUNCS)
def test_calibration_unknown_string(kd, fn):
    """An unknown calibration string raises ValueError."""
    P, y = _good()
    with pytest.raises(ValueError, match="calibration"):
        getattr(kd, fn)(P, y, bandwidth=H, calibration="bogus")


@pytest.mark.parametrize("fn", ["calibration_error", "refinement", "sharpness"])
def test_unknown_divergence(kd, fn):
    """An unknown divergence name raises ValueError."""
    P, y = _good()
    with pytest.raises(ValueError, match="divergence"):
        getattr(kd, fn)(P, y, bandwidth=H, divergence="hellinger")


def test_unknown_estimator(kd):
    """An unknown estimator name raises ValueError."""
    P, y = _good()
    with pytest.raises(ValueError, match="estimator"):
        kd.calibration_error(P, y, bandwidth=H, estimator="bogus")


@pytest.mark.parametrize("p", [0.5, 0.0, -1.0, float("nan")], ids=["0.5", "0", "-1", "nan"])
def test_ece_kde_p_below_one(kd, p):
    """A power p < 1 (or NaN) raises ValueError."""
    P, y = _good()
    with pytest.raises(ValueError, match=r"\bp\b"):
        kd.ece_kde(P, y, p=p, bandwidth=H)


def test_keyword_only(kd):
    """Arguments after (probs, labels) are keyword-only."""
    P, y = _good()
    with pytest.raises(TypeError):
        kd.ece_kde(P, y, 1, H)  # p and bandwidth are keyword-only
    with pytest.raises(TypeError):
        kd.conditional_expectation(P, y, H)


# ================================================ valid but hostile inputs
def _exact01(K, n=40, seed=0):
    """Mixture of one-hot rows, rows with exact zeros, and ordinary rows."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), size=n)
    P[: n // 3] = np.eye(K)[rng.integers(0, K, n // 3)]  # exactly one-hot
    P[n // 3 : n // 2, 0] = 0.0  # an exact zero
    P[n // 3 : n // 2] /= P[n // 3 : n // 2].sum(axis=1, keepdims=True)
    y = rng.integers(0, K, n)
    y[:K] = np.arange(K)
    return P, y


def _exact01_binary_vector():
    P, y = _exact01(2)
    return P[:, 1].copy(), y


EXACT01 = {
    "K2": lambda: _exact01(2),
    "K3": lambda: _exact01(3),
    "K10": lambda: _exact01(10, n=80),
    "binary-vector": lambda: _exact01_binary_vector(),
}


@pytest.mark.parametrize("bandwidth", [1e-3, 0.1, 1.0], ids=["h=1e-3", "h=0.1", "h=1"])
@pytest.mark.parametrize("case", list(EXACT01), ids=list(EXACT01))
def test_exact_zero_one_probabilities(kd, case, bandwidth, backend):
    """Exact 0/1 probabilities give finite results equal to the reference."""
    P, y = EXACT01[case]()
    assert np.any(P == 0.0) and np.any(P == 1.0)
    h = bandwidth
    r = rtol64(h)
    E = kd.conditional_expectation(P, y, bandwidth=h, backend=backend)
    assert_close(E, ref.ref_conditional_expectation(P, y, h), rtol=r, atol=E_ATOL, what="E")
    assert_simplex_rows(E)
    # debias="none": the reference is the plain plug-in ("ustat" also warns about the
    # rows with a single effective neighbour here)
    assert_scalar(
        kd.ece_kde(P, y, bandwidth=h, debias="none", backend=backend),
        ref.ref_ece_kde(P, y, 1, h),
        rtol=r,
    )
    for div in ("kl", "l2"):
        for est in ("direct", "refinement"):
            assert_scalar(
                kd.calibration_error(
                    P,
                    y,
                    divergence=div,
                    estimator=est,
                    bandwidth=h,
                    debias="none",
                    backend=backend,
                ),
                ref.ref_calibration_error(P, y, div, h, est),
                rtol=r,
                what=f"CE {div}/{est}",
            )
        assert_scalar(
            kd.refinement(P, y, divergence=div, bandwidth=h, debias="none", backend=backend),
            ref.ref_refinement(P, y, div, h),
            rtol=r,
        )
        assert_scalar(
            kd.sharpness(P, y, divergence=div, bandwidth=h, debias="none", backend=backend),
            ref.ref_sharpness(P, y, div, h),
            rtol=r,
        )
    assert_close(
        kd.loo_log_likelihood(P, [h], backend=backend),
        ref.ref_loo_log_likelihood(P, [h]),
        rtol=r,
        atol=LL_ATOL,
    )


def test_exact_zero_one_report(kd, backend):
    """evaluate() on exact 0/1 probabilities matches the reference."""
    P, y = _exact01(3)
    rep = kd.evaluate(P, y, bandwidth=0.1, debias="none", backend=backend, n_resamples=0)
    want = ref.ref_evaluate(P, y, 0.1)
    for f in (
        "log_loss",
        "brier_score",
        "ece_binned",
        "accuracy",
        "ce_kl",
        "ece_kde_l1",
    ):
        assert_scalar(getattr(rep, f), want[f], rtol=1e-9, what=f)
    # log loss uses clipped probs: finite even where P[y] == 0 is possible
    assert np.isfinite(rep.log_loss)


def _underflow_data():
    """20 distinct points, each repeated 3 times with (mostly) different labels.

    At h <= 1e-4 every kernel value underflows: L_ij = bias_i + G_ij / h is
    about -(1/h)(log(1/h) - 1) < -1e5 for every pair, so exp(L_ij) == 0 in
    float64 and a naive sum gives 0/0.  Leave-one-out, each row's nearest
    centres are its two duplicates (identical L), so the exact E has
    non-trivial ratios such as (1/2, 1/2, 0).
    """
    base, _ = make_synthetic(20, 3, alpha=1.0, seed=7)
    P = np.repeat(base, 3, axis=0)
    y = np.tile(np.array([0, 1, 2]), 20)
    y[::7] = 0  # some duplicates share a label
    return P, y


@pytest.mark.parametrize("h", [1e-5, 1e-4], ids=["h=1e-5", "h=1e-4"])
def test_all_underflow_rows(kd, backend, h):
    """Tiny bandwidths (every exp(L) underflows) give the reference ratios, not 0/NaN."""
    P, y = _underflow_data()
    A0 = ref.ref_log_kernel(ref.ref_clip(P), h, include_constant=False)  # = L_ij of the spec
    assert np.all(np.exp(A0) == 0.0), "precondition: every exp(L_ij) must underflow"
    E = kd.conditional_expectation(P, y, bandwidth=h, backend=backend)
    E_ref = ref.ref_conditional_expectation(P, y, h)
    assert_simplex_rows(E)
    assert_close(E, E_ref, rtol=rtol64(h), atol=E_ATOL, what="E at tiny bandwidth")
    # the exact answer has non-trivial ratios (duplicates with different labels)
    assert np.sum((E_ref > 0.3) & (E_ref < 0.7)) >= 20
    assert_scalar(
        kd.ece_kde(P, y, bandwidth=h, backend=backend),
        ref.ref_ece_kde(P, y, 1, h),
        rtol=rtol64(h),
    )
    for est in ("direct", "refinement"):
        assert_scalar(
            kd.calibration_error(P, y, bandwidth=h, estimator=est, backend=backend),
            ref.ref_calibration_error(P, y, "kl", h, est),
            rtol=rtol64(h),
            what=est,
        )
    ll = kd.loo_log_likelihood(P, [h], backend=backend)
    assert_close(ll, ref.ref_loo_log_likelihood(P, [h]), rtol=rtol64(h), atol=LL_ATOL, what="LL")
    # select_bandwidth on duplicated data: the reference picks the smallest grid value,
    # and kdecal says that it chose an end of its range
    with pytest.warns(kd.KdecalWarning, match="smallest value of the search range"):
        h_sel = float(kd.select_bandwidth(P, backend=backend))
    assert h_sel == ref.ref_select_bandwidth(P)


def test_rows_within_tolerance_are_renormalised(kd, backend):
    """Rows off by < 1e-3 are accepted and renormalised."""
    P, y = _good(n=30)
    P2 = P.copy()
    P2[::2] *= 1 + 5e-4  # |sum - 1| = 5e-4 < 1e-3: accepted
    P2[1::4] *= 1 - 9e-4
    h = 0.1
    E = kd.conditional_expectation(P2, y, bandwidth=h, backend=backend)
    assert_close(E, ref.ref_conditional_expectation(P2, y, h), rtol=1e-9, atol=E_ATOL)
    assert_scalar(
        kd.calibration_error(P2, y, divergence="l2", bandwidth=h, debias="none", backend=backend),
        ref.ref_calibration_error(P2, y, "l2", h),
        rtol=1e-9,
    )
    # renormalised data is the same as the original (up to rounding)
    assert_close(E, ref.ref_conditional_expectation(P, y, h), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize(
    "dtype",
    [np.float64, np.float32, np.int32, np.int64, np.uint8],
    ids=["f64", "f32", "i32", "i64", "u8"],
)
def test_label_dtypes(kd, dtype, backend):
    """Integer and integral-float label dtypes give the same result."""
    P, y = _good(n=25)
    h = 0.1
    want = ref.ref_ece_kde(P, y, 2, h)
    got = kd.ece_kde(P, y.astype(dtype), p=2, bandwidth=h, debias="none", backend=backend)
    assert_scalar(got, want, rtol=1e-9)


def test_list_labels(kd):
    """A plain list of labels is accepted."""
    P, y = _good(n=25)
    assert_scalar(
        kd.ece_kde(P, y.tolist(), bandwidth=0.1),
        ref.ref_ece_kde(P, y, 1, 0.1),
        rtol=1e-9,
    )


def test_minimal_n3(kd, backend):
    """The minimal n = 3 works and matches the reference."""
    P = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    y = np.array([0, 1, 1])
    for h in (0.01, 0.5):
        E = kd.conditional_expectation(P, y, bandwidth=h, backend=backend)
        assert_close(E, ref.ref_conditional_expectation(P, y, h), rtol=1e-9, atol=E_ATOL)
        assert E[1, 1] > 0 and E[2, 1] > 0  # leave-one-out: row 1 sees row 2 only in class 1
        assert_scalar(
            kd.ece_kde(P, y, bandwidth=h, debias="none", backend=backend),
            ref.ref_ece_kde(P, y, 1, h),
            rtol=1e-9,
        )
    assert_close(
        kd.loo_log_likelihood(P, [0.01, 0.5], backend=backend),
        ref.ref_loo_log_likelihood(P, [0.01, 0.5]),
        rtol=1e-9,
        atol=LL_ATOL,
    )


def test_singleton_class_leave_one_out(kd, backend):
    """Row j alone in its class: leave-one-out gives E_j[y_j] = 0 exactly."""
    P, y = _good(n=20, K=3)
    y[:] = np.where(np.arange(20) % 2 == 0, 0, 1)
    y[7] = 2  # the only member of class 2
    E = kd.conditional_expectation(P, y, bandwidth=0.1, backend=backend)
    E_ref = ref.ref_conditional_expectation(P, y, 0.1)
    assert E[7, 2] == 0.0 and E_ref[7, 2] == 0.0
    assert np.all(E[np.arange(20) != 7, 2] > 0)
    assert_close(E, E_ref, rtol=1e-9, atol=E_ATOL)


def test_absent_class_column_is_zero(kd, backend):
    """A class absent from the labels gets E = 0 in its column."""
    P, y = _good(n=30, K=4)
    y[y == 3] = 0  # class 3 never observed
    E = kd.conditional_expectation(P, y, bandwidth=0.2, backend=backend)
    assert np.all(E[:, 3] == 0.0)
    assert_close(E, ref.ref_conditional_expectation(P, y, 0.2), rtol=1e-9, atol=E_ATOL)
    assert_scalar(
        kd.sharpness(P, y, bandwidth=0.2, backend=backend),
        ref.ref_sharpness(P, y, "kl", 0.2),
        rtol=1e-9,
    )


_TEMPORAL_TAIL = (
    ": datetimes and timedeltas are not read as numbers (convert them explicitly if they "
    "encode numbers)"
)


def test_datetime_and_timedelta_inputs_raise_typeerror(kd):
    """timedelta64 labels were read as integers (ece_kde gave 1.0125 for labels in
    seconds), a pandas timedelta Series got 'labels must lie in 0..2, got
    datetime.timedelta(seconds=2)', datetime64 a bare dtype error: every date or
    duration dtype, and an object array of timedeltas, is refused with one TypeError
    naming the argument and the dtype."""
    pd = pytest.importorskip("pandas")
    import datetime

    P, y = _good(n=20)
    cases = [
        (
            lambda: kd.ece_kde(P, y.astype("timedelta64[s]"), bandwidth=H),
            "labels",
            "timedelta64[s]",
        ),
        (lambda: kd.ece_kde(P, y.astype("datetime64[s]"), bandwidth=H), "labels", "datetime64[s]"),
        (
            lambda: kd.ece_kde(P, pd.Series(pd.to_timedelta(y, unit="s")), bandwidth=H),
            "labels",
            str(np.asarray(pd.Series(pd.to_timedelta(y, unit="s"))).dtype),
        ),
        (
            lambda: kd.ece_kde((P * 10).astype("timedelta64[s]"), y, bandwidth=H),
            "probs",
            "timedelta64[s]",
        ),
        (
            lambda: kd.scores.log_loss(P.astype("datetime64[ms]"), y, input="auto"),
            "probs",
            "datetime64[ms]",
        ),
        (
            lambda: kd.recalibration.TemperatureScaling().fit(
                (P * 10).astype("timedelta64[s]"), y
            ),
            "scores",
            "timedelta64[s]",
        ),
        (lambda: kd.softmax(P.astype("timedelta64[s]")), "logits", "timedelta64[s]"),
    ]
    for call, name, dtype in cases:
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == f"{name} must be a numeric array, got dtype {dtype}" + (
            _TEMPORAL_TAIL
        )
    labels = np.array([datetime.timedelta(seconds=int(v)) for v in y], dtype=object)
    with pytest.raises(TypeError) as info:
        kd.ece_kde(P, labels, bandwidth=H)
    assert str(info.value) == (
        "labels must be a numeric array, got dtype object holding datetime.timedelta "
        "values" + _TEMPORAL_TAIL
    )


def test_text_labels_are_refused_from_numpy_and_pandas_alike(kd):
    """A helper's probe: digit strings as labels were refused from NumPy but read as
    numbers from pandas (string, string[pyarrow] and object columns; " 3.0" too), where
    class names in text usually follow another order than the probability columns
    ("10" before "2"): a silently wrong number. Both are refused, naming the text."""
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(12), 60)
    y = rng.integers(0, 12, 60)
    text = y.astype(str)
    forms = [text, pd.Series(text, dtype="string"), pd.Series(text, dtype=object)]
    for labels in forms:
        with pytest.raises(TypeError, match=r"labels must be a numeric array, got text"):
            kd.ece_kde(P, labels, bandwidth=0.1)
    # nullable numeric pandas columns are still numbers
    assert kd.ece_kde(P, pd.Series(y, dtype="Int64"), bandwidth=0.1) == kd.ece_kde(
        P, y, bandwidth=0.1
    )


def test_boolean_seeds_and_a_missing_stderr(kd, monkeypatch):
    """A helper's probe: seed=True was read as the seed 1 (numpy's rule), where booleans
    are refused for every other numeric option; and estimate(progress=True) with no
    standard error (sys.stderr None: pythonw, some services) raised AttributeError from
    the progress bar. A boolean seed is a TypeError naming the argument; without stderr
    there is no bar and the same number."""
    import sys

    P, y = _good(n=40)
    est = kd.estimate(P, y, bandwidth=0.3)
    for bad in (True, False, np.True_):
        with pytest.raises(TypeError, match=r"seed must be None, a non-negative integer"):
            est.confidence_interval("ce_l2", n_resamples=5, seed=bad)
    want = kd.estimate(P, y, bandwidth=0.3).ece_kde(1)
    monkeypatch.setattr(sys, "stderr", None)
    assert kd.estimate(P, y, bandwidth=0.3, progress=True).ece_kde(1) == want
