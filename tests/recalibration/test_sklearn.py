"""kdecal.recalibration calibrators as scikit-learn estimators (scikit-learn: test only).

scikit-learn's own estimator checks run where they apply; the checks that assume a
generic feature matrix (labels unrelated to the number of columns, features anywhere in
[0, 1] whatever their row sums) or scikit-learn's own error types and messages are listed
with the reason they do not apply to a calibrator of scores.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import log_softmax, softmax

from kdecal import recalibration as rc

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, cross_val_predict
from sklearn.pipeline import Pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

ALL = [
    rc.TemperatureScaling,
    rc.ExpectationConsistency,
    rc.AffineCalibration,
    rc.VectorScaling,
    rc.IsotonicCalibration,
    rc.HistogramBinning,
    rc.MeanReplacement,
]
IDS = [c.__name__ for c in ALL]

_GENERIC_DATA = (
    "the check fits on generic data whose labels (0..2) exceed the number of score "
    "columns or whose entries lie in [0, 1] without summing to 1 (neither probabilities "
    "nor logits); a calibrator needs labels in 0..K-1 and unambiguous scores"
)
_COMMON = {
    "check_fit_score_takes_y": _GENERIC_DATA,
    "check_estimators_overwrite_params": _GENERIC_DATA,
    "check_estimators_fit_returns_self": _GENERIC_DATA,
    "check_readonly_memmap_input": _GENERIC_DATA,
    "check_n_features_in_after_fitting": _GENERIC_DATA,
    "check_sample_weights_not_an_array": _GENERIC_DATA,
    "check_sample_weights_list": _GENERIC_DATA,
    "check_sample_weights_shape": _GENERIC_DATA,
    "check_sample_weights_pandas_series": _GENERIC_DATA,
    "check_sample_weights_not_overwritten": _GENERIC_DATA,
    "check_sample_weight_equivalence_on_dense_data": _GENERIC_DATA
    + " (the equivalence is tested in test_integer_weights_equal_repeated_rows)",
    "check_complex_data": "complex scores raise TypeError (kdecal's rule for a bad dtype)",
    "check_dtype_object": "object scores raise TypeError (kdecal's rule for a bad dtype)",
    "check_estimators_empty_data_messages": "kdecal's own message for empty scores",
    "check_estimators_nan_inf": "kdecal's own message ('non-finite value nan at index')",
    "check_fit2d_1sample": "kdecal's own message ('needs at least 2 samples')",
    "check_fit2d_1feature": "one score column is K = 1 class, refused with kdecal's message",
    "check_fit2d_predict1d": "a 1-D array is the binary form (class-1 scores), not an error",
}
_EC_NO_ROOT = (
    "generic data at or below chance accuracy: no expectation-consistent temperature "
    "exists, which ExpectationConsistency reports with a ValueError"
)
_EXPECTED = {cls: dict(_COMMON) for cls in ALL}
_EXPECTED[rc.ExpectationConsistency].update(
    {
        name: _EC_NO_ROOT
        for name in (
            "check_dont_overwrite_parameters",
            "check_estimators_dtypes",
            "check_f_contiguous_array_estimator",
            "check_methods_sample_order_invariance",
            "check_methods_subset_invariance",
            "check_dict_unchanged",
            "check_fit_idempotent",
        )
    }
)


with warnings.catch_warnings():  # "does not inherit from BaseEstimator": by design
    warnings.simplefilter("ignore", UserWarning)
    _CHECKS = parametrize_with_checks(
        [cls() for cls in ALL], expected_failed_checks=lambda est: _EXPECTED[type(est)]
    )


@_CHECKS
@pytest.mark.filterwarnings("ignore::UserWarning")  # includes KdecalWarning, SkipTestWarning
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# ----------------------------------------------------------------------------- data
def _data(n=600, K=4, seed=0):
    rng = np.random.default_rng(seed)
    z = 3.0 * rng.normal(size=(n, K))
    p = softmax(z / 1.7, axis=1)
    y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, K - 1)
    return z, y


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_clone_get_set_params(cls):
    # the failure of the issue: clone() called get_params(deep=False)
    est = cls()
    params = est.get_params(deep=True)
    assert params == est.get_params(deep=False)
    assert params["input"] == "auto"
    c = clone(est)
    assert type(c) is cls and c is not est and c.get_params() == params
    assert est.set_params(input="logits") is est and est.input == "logits"
    assert clone(est).input == "logits"
    with pytest.raises(ValueError, match="Invalid parameter 'nope'"):
        est.set_params(nope=1)
    # clone of a fitted calibrator is unfitted
    z, y = _data()
    fitted = cls().fit(z, y)
    check_is_fitted(fitted)
    with pytest.raises(sklearn.exceptions.NotFittedError):
        check_is_fitted(clone(fitted))


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_fitted_attributes_and_predict_proba(cls):
    z, y = _data()
    est = cls().fit(z, y)
    assert est.n_features_in_ == 4 and est.n_classes_ == 4 and est.input_ == "logits"
    np.testing.assert_array_equal(est.classes_, np.arange(4))
    np.testing.assert_array_equal(est.predict_proba(z), est.transform(z))
    # nothing but fitted attributes (trailing underscore) is added by fit
    assert set(vars(est)) - set(cls().get_params()) == {k for k in vars(est) if k.endswith("_")}


def test_cross_val_predict_and_pipeline_and_grid_search():
    z, y = _data(900)
    pred = cross_val_predict(rc.TemperatureScaling(), z, y, cv=3, method="predict_proba")
    assert pred.shape == z.shape
    np.testing.assert_allclose(pred.sum(axis=1), 1.0, rtol=1e-12)
    # the same as fitting by hand on each of the (unshuffled) KFold training sets
    from sklearn.model_selection import KFold

    for train, test in KFold(3).split(z):
        ref = rc.TemperatureScaling().fit(z[train], y[train]).transform(z[test])
        np.testing.assert_allclose(pred[test], ref, rtol=1e-12)
    pipe = Pipeline([("cal", rc.HistogramBinning())])
    out = pipe.fit(z, y).transform(z)
    np.testing.assert_array_equal(out, rc.HistogramBinning().fit(z, y).transform(z))

    def neg_nll(est, X, yy):
        P = est.transform(X)
        return float(np.mean(np.log(np.maximum(P[np.arange(len(yy)), yy], 1e-300))))

    gs = GridSearchCV(rc.HistogramBinning(), {"n_bins": [2, 10]}, scoring=neg_nll, cv=3)
    gs.fit(z, y)
    assert gs.best_params_["n_bins"] in (2, 10)
    assert np.isfinite(gs.best_score_)


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_integer_weights_equal_repeated_rows(cls):
    z, y = _data(300, K=3, seed=3)
    w = np.random.default_rng(1).integers(0, 4, size=300)
    w[:3] = 1  # keep every class present
    rep = np.repeat(np.arange(300), w)
    a = cls().fit(z, y, sample_weight=w).transform(z)
    b = cls().fit(z[rep], y[rep]).transform(z)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    # all-ones weights are no weights
    np.testing.assert_allclose(
        cls().fit(z, y, sample_weight=np.ones(300)).transform(z),
        cls().fit(z, y).transform(z),
        rtol=1e-10,
        atol=1e-12,
    )


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_bad_sample_weight(cls):
    z, y = _data(50)
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(50,\)"):
        cls().fit(z, y, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="sample_weight must be finite and >= 0, got -1.0"):
        cls().fit(z, y, sample_weight=-np.ones(50))
    with pytest.raises(ValueError, match="sample_weight sums to zero"):
        cls().fit(z, y, sample_weight=np.zeros(50))


def test_probs_and_logits_through_sklearn_clone():
    z, y = _data()
    q = softmax(z, axis=1)
    cal = clone(rc.AffineCalibration()).fit(q, y)
    assert cal.input_ == "probs"
    np.testing.assert_allclose(
        cal.transform(q),
        rc.AffineCalibration().fit(log_softmax(z, axis=1), y).transform(z),
        rtol=1e-6,
        atol=1e-9,
    )


# ------------------------------------------------------------- issue 28: the edges
def test_not_fitted_error_is_sklearns():
    assert issubclass(rc.NotFittedError, sklearn.exceptions.NotFittedError)
    assert issubclass(rc.NotFittedError, ValueError)
    assert issubclass(rc.NotFittedError, AttributeError)
    assert rc.NotFittedError is rc.NotFittedError  # made once
    z, _ = _data(20)
    with pytest.raises(sklearn.exceptions.NotFittedError, match="not fitted yet") as info:
        rc.TemperatureScaling().transform(z)
    assert type(info.value) is rc.NotFittedError
    import pickle

    e = pickle.loads(pickle.dumps(info.value))
    assert type(e) is rc.NotFittedError and str(e) == str(info.value)


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_score_is_negative_log_loss(cls):
    from sklearn.metrics import log_loss

    z, y = _data(400, K=3, seed=4)
    est = cls().fit(z[:200], y[:200])
    w = np.random.default_rng(2).random(200)
    Q = est.predict_proba(z[200:])
    for sw in (None, w):
        ref = -log_loss(y[200:], Q, sample_weight=sw, labels=[0, 1, 2])
        assert est.score(z[200:], y[200:], sample_weight=sw) == pytest.approx(ref, rel=1e-12)
    # binary 1-D scores: the calibrated P(y = 1) is scored as the two columns
    t = z[:, 1] - z[:, 0]
    yb = (y == 1).astype(np.int64)
    eb = cls().fit(t[:200], yb[:200])
    ref = -log_loss(yb[200:], eb.predict_proba(t[200:]), labels=[0, 1])
    assert eb.score(t[200:], yb[200:]) == pytest.approx(ref, rel=1e-12)


def test_grid_search_without_scoring_uses_score():
    from sklearn.model_selection import KFold

    z, y = _data(600)
    gs = GridSearchCV(rc.HistogramBinning(), {"n_bins": [2, 5, 20]}, cv=KFold(3)).fit(z, y)
    means = []
    for nb in (2, 5, 20):
        folds = [
            rc.HistogramBinning(n_bins=nb).fit(z[tr], y[tr]).score(z[te], y[te])
            for tr, te in KFold(3).split(z)
        ]
        means.append(np.mean(folds))
    np.testing.assert_allclose(gs.cv_results_["mean_test_score"], means, rtol=1e-12)
    assert gs.best_params_["n_bins"] == (2, 5, 20)[int(np.argmax(means))]
