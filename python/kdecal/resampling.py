"""Resampling for the scoring rules: cross-validation folds and bootstrap intervals.

Cross-validation folds reproduce scikit-learn's ``StratifiedKFold`` / ``KFold`` with
``shuffle=True`` exactly (without depending on scikit-learn), as Ferrer & Ramos's code
draws them for the calibration loss; the percentile bootstrap refits whatever a metric
fits on every resample (Ferrer & Ramos 2025, App. E).

References
----------
- L. Ferrer, D. Ramos. "Evaluating Posterior Probabilities: Decision Theory, Proper
  Scoring Rules, and Calibration". Transactions on Machine Learning Research (TMLR),
  2025, App. E. Code: github.com/luferrer/expected_cost.
- B. Efron, R. J. Tibshirani. "An Introduction to the Bootstrap". Chapman & Hall, 1993,
  Ch. 13 (percentile intervals).
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ._estimation.replicates import check_resamples
from ._validation import _numeric_array, as_array, check_int, check_seed

__all__ = ["BootstrapCI", "bootstrap_ci", "cv_folds"]


def _check_bool(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _legacy_state(seed: object) -> np.random.RandomState:
    """``sklearn.utils.check_random_state``: int/None -> new RandomState; RandomState as is."""
    if isinstance(seed, np.random.RandomState):
        return seed
    if seed is None:
        return np.random.RandomState()
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"seed must be a non-negative integer, None or a RandomState, got {seed!r}"
        )
    if int(seed) < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.RandomState(int(seed))


def _stratified_folds(y: np.ndarray, n_folds: int, rs: np.random.RandomState) -> np.ndarray:
    """Test-fold index per sample, as ``StratifiedKFold(n_folds, shuffle=True)``.

    The allocation of scikit-learn (>= 0.22): classes in order of first appearance,
    per-class fold counts from a round robin over the sorted labels, then each class's
    block of fold indices shuffled by ``rs`` (so a RandomState(seed) reproduces
    ``random_state=seed``, Ferrer & Ramos's ``calibration_with_crossval``).
    """
    _, y_idx, y_inv = np.unique(y, return_index=True, return_inverse=True)
    _, class_perm = np.unique(y_idx, return_inverse=True)
    y_enc = class_perm[y_inv.ravel()]
    n_cls = y_idx.shape[0]
    counts = np.bincount(y_enc, minlength=n_cls)
    if np.all(n_folds > counts):
        raise ValueError(
            f"n_folds = {n_folds} is larger than the number of samples of every class "
            f"(class counts {counts.tolist()}); use fewer folds or stratified=False"
        )
    y_order = np.sort(y_enc)
    alloc = np.asarray([np.bincount(y_order[i::n_folds], minlength=n_cls) for i in range(n_folds)])
    folds = np.empty(y.shape[0], dtype=np.int64)
    for k in range(n_cls):
        f = np.arange(n_folds).repeat(alloc[:, k])
        rs.shuffle(f)
        folds[y_enc == k] = f
    return folds


def _plain_folds(n: int, n_folds: int, rs: np.random.RandomState) -> np.ndarray:
    """Test-fold index per sample, as ``KFold(n_folds, shuffle=True)``."""
    idx = np.arange(n)
    rs.shuffle(idx)
    sizes = np.full(n_folds, n // n_folds, dtype=np.int64)
    sizes[: n % n_folds] += 1
    folds = np.empty(n, dtype=np.int64)
    folds[idx] = np.repeat(np.arange(n_folds), sizes)
    return folds


def cv_folds(
    labels: object,
    *,
    n_folds: int = 5,
    seed: object = 0,
    stratified: bool = True,
    groups: object = None,
) -> np.ndarray:
    """Cross-validation fold of every sample, as Ferrer & Ramos's ``calibration_with_crossval`` draws them.

    ``stratified=True`` reproduces scikit-learn's
    ``StratifiedKFold(n_folds, shuffle=True, random_state=seed)`` exactly (the allocation
    of scikit-learn >= 0.22: per-class fold counts by a round robin over the sorted
    labels, each class's block of fold indices shuffled by ``RandomState(seed)``), and
    ``stratified=False`` ``KFold(n_folds, shuffle=True, random_state=seed)``; Ferrer & Ramos use the
    former with seed 0 on real data (notes: ``expected_cost.calibration``). scikit-learn
    is not needed.

    Parameters
    ----------
    labels : array-like, shape (n,), int
        Class labels (the strata).
    n_folds : int, default 5
        Number of folds, ``>= 2``.
    seed : int, None or numpy.random.RandomState, default 0
        An int or None makes a fresh ``RandomState(seed)``; a RandomState is used and
        advanced in place (to continue a stream, e.g. after
        ``make_gaussian_posteriors(..., rng=state)``, as the synthetic experiments of Ferrer & Ramos 2025
        did with numpy's global state).
    stratified : bool, default True
        Stratify by ``labels``.
    groups : array-like, shape (n,), optional
        Group ids: the folds are drawn over the distinct groups (sorted), each
        stratified by the label of its first sample, so that a group never straddles
        folds (Ferrer & Ramos 2025, App. E: bootstrap copies of one sample).

    Returns
    -------
    ndarray, shape (n,), int64
        Fold index in ``0..n_folds-1`` of every sample (its test fold). A fold may be
        empty when a class has fewer samples than folds.

    Raises
    ------
    TypeError
        Non-integer ``n_folds``; bad ``seed``; non-bool ``stratified``.
    ValueError
        ``labels`` not a non-empty 1-D integer array; ``n_folds < 2`` or larger than the
        number of samples (groups), or, stratified, than the count of every class;
        ``groups`` of the wrong shape.
    """
    arr = _numeric_array(labels, "labels")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {arr.shape}")
    if np.issubdtype(arr.dtype, np.floating) and np.any(
        ~np.isfinite(arr) | (arr != np.round(arr))
    ):
        raise ValueError("labels must be integers")
    y = arr.astype(np.int64)
    n_folds = check_int(n_folds, "n_folds", 2)
    stratified = _check_bool(stratified, "stratified")
    return _cv_folds(y, n_folds, seed, stratified, groups)


def _cv_folds(
    y: np.ndarray, n_folds: int, seed: object, stratified: bool, groups: object
) -> np.ndarray:
    """:func:`cv_folds` of validated int64 labels, ``n_folds`` and ``stratified``."""
    rs = _legacy_state(seed)
    if groups is None:
        if y.shape[0] < n_folds:
            raise ValueError(f"n_folds = {n_folds} exceeds the number of samples n = {y.shape[0]}")
        if stratified:
            return _stratified_folds(y, n_folds, rs)
        return _plain_folds(y.shape[0], n_folds, rs)
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != y.shape[0]:
        raise ValueError(f"groups must have shape ({y.shape[0]},), got shape {g.shape}")
    uniq, first, inv = np.unique(g, return_index=True, return_inverse=True)
    if uniq.shape[0] < n_folds:
        raise ValueError(
            f"n_folds = {n_folds} exceeds the number of distinct groups ({uniq.shape[0]})"
        )
    if stratified:
        gf = _stratified_folds(y[first], n_folds, rs)  # stratum: label of the first sample
    else:
        gf = _plain_folds(uniq.shape[0], n_folds, rs)
    return gf[inv.ravel()]


class BootstrapCI(NamedTuple):
    """Full-sample estimate and percentile bootstrap interval of :func:`bootstrap_ci`.

    Attributes
    ----------
    estimate : float
        The statistic on the full sample.
    lower, upper : float
        The interval's endpoints, in the statistic's units.
    """

    estimate: float
    lower: float
    upper: float


def _accepts_groups(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get("groups")
    return p is not None and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)


#: The kernel estimators of :mod:`kdecal.kde` that :func:`bootstrap_ci` refuses.
_KERNEL_ESTIMATORS = ("ece_kde", "calibration_error", "refinement", "sharpness")


def bootstrap_ci(
    metric: Callable[..., float],
    probs: object,
    labels: object,
    *,
    n_boot: int = 100,
    alpha: float = 0.05,
    seed: int | np.random.Generator | np.random.SeedSequence | None = 0,
    **metric_kwargs: Any,
) -> BootstrapCI:
    """Percentile bootstrap confidence interval of any metric (Ferrer & Ramos 2025, App. E).

    Draws ``n_boot`` bootstrap sets of n rows with replacement, evaluates
    ``metric(probs[idx], labels[idx], **metric_kwargs)`` on each, and returns the
    full-sample value with the ``100 alpha/2`` and ``100 (1 - alpha/2)`` percentiles
    (linear interpolation, :func:`numpy.percentile`). The system is frozen; anything the
    metric fits on the test data (the calibrator of :func:`calibration_loss` with
    ``mode="tt"``/``"xv"``, the bins of a quantile-binned ECE) is refitted inside every bootstrap set, as Ferrer & Ramos 2025 (App. E) require. If ``metric`` has a
    ``groups`` parameter that is not given, the original row indices are passed as
    ``groups`` so that cross-validation keeps the copies of a sample in one fold
    (Ferrer & Ramos 2025, App. E); a given ``groups`` array is resampled with the rows.

    Parameters
    ----------
    metric : callable
        ``metric(probs, labels, **metric_kwargs) -> float``, e.g. :func:`log_loss`,
        :func:`calibration_loss`, :func:`kdecal.binned.ece`. Not the kernel estimators
        (:func:`kdecal.ece_kde`, ``calibration_error``, ``refinement``, ``sharpness``):
        a bootstrap set's copies of a row are each other's leave-one-out neighbours, so
        their intervals sit above the estimate (refused; use
        :meth:`kdecal.CalibrationEstimate.confidence_interval`).
    probs : array-like, shape (n, ...)
        Scores passed to ``metric`` (probabilities or logits, whatever it expects);
        rows are resampled.
    labels : array-like, shape (n,)
        Labels, resampled with the rows.
    n_boot : int, default 100
        Number of bootstrap sets, ``>= 1`` (Ferrer & Ramos use 100).
    alpha : float, default 0.05
        Significance level in (0, 1): a ``100 (1 - alpha)`` % interval (Ferrer & Ramos's "gamma" is
        ``100 alpha``).
    seed : int, Generator, SeedSequence or None, default 0
        For :func:`numpy.random.default_rng`; the resamples are reproducible.
    **metric_kwargs
        Passed to every ``metric`` call (e.g. ``normalize=True``, ``mode="xv"``).

    Returns
    -------
    BootstrapCI
        ``(estimate, lower, upper)``, floats in the metric's units; ``estimate`` is the
        metric on the full sample (not the bootstrap mean). NaN values of the metric
        propagate to the bounds.

    Raises
    ------
    TypeError
        ``metric`` not callable; non-integer ``n_boot``; non-real ``alpha``.
    ValueError
        ``n_boot`` outside 1..1,000,000; ``alpha`` outside (0, 1); ``probs`` and ``labels`` of different
        lengths or empty; ``metric`` a kernel estimator of :mod:`kdecal.kde`; whatever
        ``metric`` raises.
    """
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}")
    name = getattr(metric, "__name__", "")
    if getattr(metric, "__module__", None) == "kdecal.kde" and name in _KERNEL_ESTIMATORS:
        raise ValueError(
            f"bootstrap_ci cannot resample kdecal.{name}: a bootstrap set holds copies of "
            "rows, which the leave-one-out kernel estimator reads as each other's "
            "neighbours, so its intervals sit above, and can miss, the estimate. Use "
            f"kdecal.estimate(probs, labels, ...).confidence_interval(...), whose "
            "replicates leave a query's copies out with it."
        )
    n_boot = check_resamples(n_boot, "n_boot", 1, "a call of the metric on n rows")
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a float in (0, 1), got {alpha!r}")
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha must lie in the open interval (0, 1), got {alpha!r}")
    X = as_array(probs, "probs")
    y = as_array(labels, "labels")
    if X.ndim == 0 or y.ndim != 1:
        raise ValueError(
            f"probs must be at least 1-D and labels 1-D, got shapes {X.shape} and {y.shape}"
        )
    n = y.shape[0]
    if X.shape[0] != n or n == 0:
        raise ValueError(
            f"probs has {X.shape[0]} rows and labels {n} entries; they must be equal and > 0"
        )
    groups = metric_kwargs.get("groups")
    g = None if groups is None else np.asarray(groups)
    if g is not None and (g.ndim != 1 or g.shape[0] != n):
        raise ValueError(f"groups must have shape ({n},), got shape {g.shape}")
    auto_groups = g is None and _accepts_groups(metric)
    rng = check_seed(seed)
    estimate = float(metric(X, y, **metric_kwargs))
    values = np.empty(n_boot)
    kw = dict(metric_kwargs)
    for b in range(n_boot):
        idx = rng.integers(0, n, size=n)
        if auto_groups:
            kw["groups"] = idx
        elif g is not None:
            kw["groups"] = g[idx]
        values[b] = float(metric(X[idx], y[idx], **kw))
    lower, upper = np.percentile(values, [50.0 * a, 100.0 * (1.0 - a / 2.0)])
    return BootstrapCI(estimate, float(lower), float(upper))
