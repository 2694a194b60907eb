"""The one-pass report :func:`evaluate`.

Every kernel quantity of one estimate, the other notions with bootstrap intervals and
the calibration test, and the context metrics (accuracy, log loss, Brier score, binned
ECE and its debiased L2 form, smooth ECE, calibration loss).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from . import scores
from ._calibration_estimate import CalibrationEstimate, ResamplingError, centred_interval
from ._engine.backends import Backend
from ._estimation import problem as _problem
from ._estimation import search as _search
from ._estimation.quantities import QUANTITIES
from ._estimation.replicates import (
    canonical_estimate_seconds,
    check_resamples,
    classwise_estimate_cost,
    dense_resampling_seconds,
    describe_bytes,
    describe_seconds,
)
from ._report import CalibrationReport
from ._row_metrics import ROW_METRICS, check_metric, row_bootstrap
from ._row_metrics import lower_bound as metric_lower_bound
from ._validation import Probs, check_choice, check_seed
from .kde import (
    CANONICAL_RELIABLE_MAX_K,
    _canonical_unreliable,
    _doc,
    _kl_unreliable,
    estimate,
    l2_floor_notions,
)
from .warnings import KdecalWarning, UnreliableEstimateWarning, quiet, warn_user

__all__ = ["evaluate"]


#: Notions summarised by :func:`evaluate` (estimate, interval, test) by default.
EVALUATE_NOTIONS = ("canonical", "top_label", "classwise")
#: The notions of ``notions="auto"`` beyond :data:`kdecal.kde.CANONICAL_RELIABLE_MAX_K`
#: classes, where no canonical kernel estimate is reliable.
EVALUATE_NOTIONS_MANY_CLASSES = ("top_label", "classwise")

#: Notions resampled by :func:`evaluate` with ``resample_notions="auto"`` (the default),
#: the canonical one within :data:`CANONICAL_RESAMPLING_MAX_WORK`.
AUTO_RESAMPLE_NOTIONS = ("canonical", "top_label")

#: Largest ``n^2 (K + 3)`` for which ``resample_notions="auto"`` resamples the canonical
#: notion, with :data:`CANONICAL_RESAMPLING_MAX_N`. Its bootstrap and test are dense
#: products with the kernel weights, about ``n^2 (K + 3)`` multiply-adds per replicate
#: and bandwidth (two bandwidths), so their cost grows with n^2 (and faster, as the
#: value columns outgrow the caches): 100 resamples take about 10 s on 2 cores for the
#: bundled example (n = 10,000, K = 10), 96 s for CIFAR-100's test set (n = 10,000,
#: K = 100), about a minute at n = 20,000 and an hour at n = 100,000 (K = 10). Beyond
#: the limits the report says what it left out, what it would cost and how to ask for it.
CANONICAL_RESAMPLING_MAX_WORK = 1.1e10
#: Largest n for which ``resample_notions="auto"`` resamples the canonical notion.
CANONICAL_RESAMPLING_MAX_N = 20_000


def _check_resample_notions(resample_notions: object) -> str | tuple[str, ...]:
    """Validate ``resample_notions``: "auto", or the notions named (a tuple)."""
    if isinstance(resample_notions, str):
        if resample_notions != "auto":
            raise ValueError(
                f"resample_notions must be 'auto', None or a sequence of notions of "
                f"{_problem.CALIBRATIONS}, got {resample_notions!r}"
            )
        return "auto"
    if resample_notions is not None and not isinstance(resample_notions, (list, tuple)):
        raise TypeError(
            f"resample_notions must be 'auto', None or a sequence of notions, got "
            f"{type(resample_notions).__name__}"
        )
    names = tuple(resample_notions or ())
    for name in names:
        check_choice(name, "resample_notions", _problem.CALIBRATIONS)
    return names


def _resampled_notions(
    spec: str | tuple[str, ...], calibration: str, n: int, K: int, R: int, backend: str
) -> tuple[tuple[str, ...], dict[str, str]]:
    """Return the notions to resample and, per notion left out by "auto", why.

    ``spec`` from :func:`_check_resample_notions`. The notions named are taken as
    given, with the notion ``calibration`` added (it is always resampled). ``"auto"``:
    :data:`AUTO_RESAMPLE_NOTIONS` and ``calibration``, the canonical notion only where
    its resampling's work per replicate ``n^2 (K + 3)`` is within
    :data:`CANONICAL_RESAMPLING_MAX_WORK` and n within
    :data:`CANONICAL_RESAMPLING_MAX_N`, or the backend is not the local CPU
    (``"cuda"``, ``"dask"``).
    """
    if spec != "auto":
        return tuple(dict.fromkeys((*spec, calibration))), {}
    wanted = tuple(dict.fromkeys((*AUTO_RESAMPLE_NOTIONS, calibration)))
    work = float(n) * n * (K + 3)
    small = work <= CANONICAL_RESAMPLING_MAX_WORK and n <= CANONICAL_RESAMPLING_MAX_N
    if small or backend in ("cuda", "dask"):
        return wanted, {}
    cost = describe_seconds(dense_resampling_seconds(n, K, R))
    why = (
        f"not made by default at n = {n:,} and K = {K}: its bootstrap and test cost "
        f"n^2 (K + 3) = {work:.2g} multiply-adds per replicate and bandwidth (the "
        f"default's limits: {CANONICAL_RESAMPLING_MAX_WORK:.2g} and n <= "
        f"{CANONICAL_RESAMPLING_MAX_N:,}), about {cost} for {R} resamples on 2 cores; "
        "ask for them "
        "with resample_notions=('canonical', 'top_label') (command line: "
        "--resample-notions canonical,top_label)"
    )
    return tuple(q for q in wanted if q != "canonical"), {"canonical": why}


#: Estimated seconds of the canonical estimate beyond which :func:`evaluate` warns.
LONG_ESTIMATE_SECONDS = 300.0


def _warn_long_estimates(
    probs: object, calibration: object, wanted: tuple[str, ...], bandwidth: object, backend: object
) -> None:
    """Warn, before they start, when the report's canonical or class-wise estimate will take long.

    The canonical engine sums all ``n^2`` pairs with a K-dimensional kernel (about 45
    minutes for n = 10^6, K = 10 on 2 cores); the class-wise notion is K binary problems
    of n points (about 8 minutes and 13 GB for n = 50,000, K = 1,000); the top-label
    notion is one. Only with the automatic bandwidth on the CPU backends.
    """
    if not isinstance(bandwidth, str) or backend not in ("auto", "cpp", "numba"):
        return
    shape = _shape(probs)
    if shape is None or len(shape) != 2 or _is_device_array(probs):
        return
    n, K = int(shape[0]), int(shape[1])
    if calibration == "canonical" or "canonical" in wanted:
        sec = canonical_estimate_seconds(n, K)
        if sec > LONG_ESTIMATE_SECONDS:
            warn_user(
                f"kdecal.evaluate: the canonical estimate at n = {n:,}, K = {K} takes about "
                f"{describe_seconds(sec)} on 2 cores (all n^2 pairs, a K-dimensional kernel; "
                "its bandwidth search and passes). For this many predictions, "
                "calibration='top_label' with notions=('top_label', 'classwise') (command "
                "line: --calibration top_label --notions top_label,classwise) runs on the "
                "fast binary engine",
                KdecalWarning,
            )
    if calibration == "classwise" or "classwise" in wanted:
        sec, size = classwise_estimate_cost(n, K)
        if sec > LONG_ESTIMATE_SECONDS:
            warn_user(
                f"kdecal.evaluate: the class-wise estimate at n = {n:,}, K = {K} takes about "
                f"{describe_seconds(sec)} and {describe_bytes(size)} of memory on 2 cores "
                "(K one-vs-rest kernel problems of n points, their bandwidth search and "
                "passes). calibration='top_label' with notions=('top_label',) (command "
                "line: --calibration top_label --notions top_label) is one such problem",
                KdecalWarning,
            )


def _is_device_array(x: object) -> bool:
    return hasattr(x, "__cuda_array_interface__") or type(x).__module__.startswith("dask")


def _notion_summary(
    est: CalibrationEstimate, n_resamples: int, seed: int | None
) -> dict[str, object]:
    """Estimate, bootstrap interval and calibration test of one notion, JSON-ready."""
    names = ("ece_kde_l1", "ce_l2")
    row: dict[str, object] = {"bandwidth": est.bandwidth, "bandwidth_l2": est.bandwidth_l2}
    for q in names:
        row[q] = est.value(q)
    if est.l2_lower_bounds:
        row["ce_l2_lower_bounds"] = est.l2_lower_bounds
    if n_resamples > 0:
        try:  # the intervals and the tests share one resampling pass
            cis, tests = est._intervals_and_tests(
                list(names), list(names), level=0.95, n_resamples=n_resamples, seed=seed
            )
        except ResamplingError as exc:
            row["resampling_skipped"] = str(exc)
            return row
        for q in names:
            row[f"{q}_ci"] = [cis[q].low, cis[q].high]
            row[f"{q}_null_mean"] = tests[q].null_mean
        row["pvalue"] = tests["ce_l2"].pvalue
        row["n_resamples"] = n_resamples
    return row


def _squared_notes(ce_l2: float, notions: dict[str, dict[str, object]]) -> list[str]:
    """Return a note on every negative squared L2 estimate (reported unclipped)."""
    neg = [("ce_l2", ce_l2)] if ce_l2 < 0 else []
    for name, row in notions.items():
        v = row.get("ce_l2")
        if isinstance(v, float) and v < 0:
            neg.append((f"{name.replace('_', '-')}", v))
    if not neg:
        return []
    which = "; ".join(f"{w} {v:.3g}" for w, v in neg)
    note = (
        f"Negative squared L2 calibration error ({which}): the estimate is unbiased and "
        "reported unclipped, so a negative value means the error is indistinguishable "
        "from 0 at this n; ece_kde_l2 is its signed square root."
    )
    return [note]


#: Cross-validation folds of the calibration loss in :func:`evaluate`.
_CAL_LOSS_FOLDS = 5

#: Rows per class (n / K) below which the report's calibration loss uses temperature
#: scaling (one parameter) instead of affine calibration (K + 1 parameters), and says so.
#: At n = 5,000, K = 1,000 (5 rows per class) the cross-validated affine calibrator
#: overfits: a calibrated model's loss -0.125 nats (temperature scaling: -0.0001), an
#: over-confident one's 0.154 (temperature scaling: 0.270), in 90 s against 4 s; at 33
#: and 100 rows per class the two agree within 0.006 nats (bench/README.md, "The
#: calibration loss at many classes").
CAL_LOSS_AFFINE_MIN_ROWS_PER_CLASS = 20

#: Classes beyond which the report notes the affine calibration loss's floor: its
#: stratified folds share the sample's class frequencies, so the K class biases fitted
#: on the training folds carry their sampling noise to the held-out fold as if it were
#: miscalibration. A calibrated model scores about ``(K - 1) / (2 n)`` nats there
#: (measured over 5 seeds: 0.24 +- 0.18 of it at K = 10, 0.31 at K = 30, 0.82 at
#: K = 100, 0.79 at K = 300; 0.96 at n = 50,000, K = 1,000; bench/README.md, "The affine
#: calibration loss's floor"). Temperature scaling has no such floor, but misses
#: miscalibrated class priors (0.009 against 0.106 nats on cifar100_lenet5_netcal), so
#: the affine calibrator stays.
CAL_LOSS_FLOOR_MIN_K = 10

#: The top-label metrics without a kernel that the full report gives intervals.
_DEFAULT_ROW_INTERVALS = ("smooth_ece", "ece_binned_debiased")

#: The kernel quantities of the notion table (with intervals and the test).
_NOTION_QUANTITIES = ("ece_kde_l1", "ce_l2")


def _check_metrics(metrics: object) -> list[str] | None:
    """Validate ``metrics``: None, one name, or a non-empty sequence of names.

    Raises
    ------
    TypeError
        Not None, a str or a sequence.
    ValueError
        Empty, or a name that is neither a kernel quantity nor a row metric.
    """
    if metrics is None:
        return None
    if isinstance(metrics, str):
        metrics = (metrics,)
    if not isinstance(metrics, Sequence):
        raise TypeError(
            f"metrics must be None, a metric name or a sequence of them, got "
            f"{type(metrics).__name__}"
        )
    names = [check_metric(q, "metrics") for q in metrics]
    if not names:
        raise ValueError("metrics is empty: name at least one, or None for the full report")
    return list(dict.fromkeys(names))


def _row_intervals(
    P: np.ndarray,
    y: np.ndarray,
    values: dict[str, float],
    n_resamples: int,
    seed: int | None,
) -> dict[str, list[float]]:
    """95 % bootstrap intervals of row metrics, on the kernel bootstrap's row samples."""
    if n_resamples == 0 or not values:
        return {}
    dist = row_bootstrap({"": P}, y, list(values), n_resamples, seed)[""]
    return {
        q: list(centred_interval(dist[q], v, 0.95, metric_lower_bound(q)))
        for q, v in values.items()
    }


def _rule(bandwidth: object, estimator: object = "plugin") -> str:
    if not isinstance(bandwidth, str):
        return "fixed"
    if bandwidth == "loo-mle":
        return "loo-mle"
    return "brier (L2, KL: brier / 2)" if estimator == "residual" else "brier (KL: log)"


def _bias_notes(notions: dict[str, dict[str, object]]) -> list[str]:
    notes = []
    for name, row in notions.items():
        value, null = row.get("ece_kde_l1"), row.get("ece_kde_l1_null_mean")
        if isinstance(value, float) and isinstance(null, float) and null > 0.5 * value:
            notes.append(
                f"The {name.replace('_', '-')} ECE^KDE L1 ({value:.4f}) is dominated by the "
                f"estimator's bias: a perfectly calibrated model with these predictions "
                f"scores {null:.4f} on average. Read the p-value and the interval, not the "
                "value alone."
            )
    return notes


#: The bounds of :func:`_ordering_notes` speak only from this squared L2 error up.
ORDERING_MIN_SQUARED = 1e-3


def _ordering_notes(notions: dict[str, dict[str, object]], K: int) -> list[str]:
    """Return a note where the canonical squared L2 error falls below its lower bounds.

    In truth the canonical squared L2 calibration error ``E ||E[y | f] - f||^2`` is at
    least the top-label one and K times the class-wise one (their mean over the
    classes): each conditions on a function of ``f`` (the confidence, or ``f_c``), so
    by Jensen's inequality ``(E[y_c - f_c | f_c])^2 <= E[(E[y_c | f] - f_c)^2 | f_c]``.
    The note is given where the canonical notion was resampled and the upper end of its
    interval is below half the larger bound, each bound taken at its interval's lower
    end where it has one (its estimate otherwise), and that bound is at least
    :data:`ORDERING_MIN_SQUARED`: the canonical kernel then smooths most of the
    miscalibration away (on CIFAR-10 models at the Brier bandwidth, h ~ 1.5-2.6, it
    reports 3.4-7 times less than the top-label estimate; bench/README.md). Without the
    canonical interval no note: the point estimates of a calibrated model at n ~ 1,000
    (K times the class-wise noise) cross the rule in about one case in five.
    """
    can = notions.get("canonical", {})
    value, ci = can.get("ce_l2"), can.get("ce_l2_ci")
    if not isinstance(value, float) or not isinstance(ci, list):
        return []
    high = float(ci[1])
    bounds: list[tuple[str, float, str]] = []  # (what, bound, how)
    for name, scale, what in (
        ("top_label", 1.0, "the top-label one"),
        ("classwise", float(K), f"{K} times the class-wise one"),
    ):
        row = notions.get(name, {})
        est, lo = row.get("ce_l2"), row.get("ce_l2_ci")
        bound = float(lo[0]) if isinstance(lo, list) else est
        how = ", its interval's lower end" if isinstance(lo, list) else ""
        if isinstance(bound, float) and math.isfinite(bound):
            bounds.append((what, scale * bound, how))
    if not bounds or not math.isfinite(high):
        return []
    what, bound, how = max(bounds, key=lambda b: b[1])
    if not (bound >= ORDERING_MIN_SQUARED and high < 0.5 * bound):
        return []
    h = can.get("bandwidth_l2")
    at = f" (h = {h:.3g})" if isinstance(h, float) else ""
    note = (
        f"The canonical squared L2 calibration error ({value:.3g}, interval up to "
        f"{high:.3g}) is below {what} ({bound:.3g}{how}), which it bounds from "
        "above in truth (the other notion conditions on less of the prediction: Jensen's "
        f"inequality). Here the canonical kernel{at} smooths most of the miscalibration "
        f"away: read the canonical squared L2 error as at least about {bound:.3g}."
    )
    return [note]


def _shape(probs: object) -> tuple[int, ...] | None:
    """Return the predictions' shape, read before validation (None: ragged input).

    Predictions validated already (a :class:`~kdecal._validation.Probs`, what the
    command line passes) give their ``(n, K)`` probabilities' shape.
    """
    if isinstance(probs, Probs):
        return tuple(probs.p.shape)
    shape = getattr(probs, "shape", None)
    if shape is None:
        try:
            shape = np.shape(cast(Any, probs))
        except (TypeError, ValueError):  # ragged input: refused by the validation
            return None
    return tuple(shape)


def _n_classes(shape: tuple[int, ...] | None) -> int | None:
    """K of predictions of this :func:`_shape` (2 for a binary ``(n,)`` input), or None.

    Read before validation, which the estimate does once; input of another shape is
    refused there.
    """
    if shape is None:
        return None
    if len(shape) == 1:
        return 2
    if len(shape) == 2 and shape[1] is not None:
        return int(shape[1])
    return None


def _n_rows(shape: tuple[int, ...] | None) -> int | None:
    """Return n of predictions of this :func:`_shape`, or None where it is not known yet."""
    if shape is None or len(shape) not in (1, 2):
        return None
    n = shape[0]
    return int(n) if isinstance(n, (int, np.integer)) else None


#: Most estimated seconds (2 cores) of the class-wise estimate for which
#: ``notions="auto"`` puts the class-wise notion in the report: K one-vs-rest problems
#: of n points (:func:`kdecal._estimation.replicates.classwise_estimate_cost`), n K up to
#: 1.2e7 on the fast binary engine. Beyond it (an ImageNet validation set, n = 50,000
#: and K = 1,000: about 8 minutes and 13 GB) the report says what it left out, what it
#: would cost and how to ask for it.
CLASSWISE_AUTO_MAX_SECONDS = 120.0


def _classwise_left_out(n: int, K: int) -> str:
    """Return the note of a report whose ``notions="auto"`` left the class-wise notion out."""
    sec, size = classwise_estimate_cost(n, K)
    return (
        f"No class-wise figures at n = {n:,}, K = {K} (notions='auto'): the class-wise "
        f"notion is K one-vs-rest kernel problems of n points, about "
        f"{describe_seconds(sec)} and {describe_bytes(size)} of memory on 2 cores "
        f"(notions='auto' includes it up to about {describe_seconds(CLASSWISE_AUTO_MAX_SECONDS)}). Ask "
        "for it with notions=('top_label', 'classwise') (command line: --notions "
        "top_label,classwise)."
    )


def _canonical_left_out(K: int, autos: str) -> str:
    """Return the note of a report whose ``autos`` left the canonical notion out at K."""
    return (
        f"No canonical figures at K = {K} ({autos}): beyond "
        f"K = {CANONICAL_RELIABLE_MAX_K} classes the canonical kernel estimates cannot "
        'tell a calibrated model from a miscalibrated one (bench/README.md, "Canonical '
        'estimates at many classes"), so the kernel figures are top-label. Ask for them '
        "with calibration='canonical' or notions=('canonical', 'top_label', 'classwise') "
        "(command line: --calibration canonical, --notions canonical,top_label,classwise)."
    )


def _share_floors(estimates: dict[str, CalibrationEstimate]) -> None:
    """Give the canonical estimate the other notions' estimates as its squared L2 bounds.

    Where the canonical estimate is bounded (:attr:`kdecal.CalibrationEstimate.l2_lower_bounds`)
    and the report holds every notion its bounds are made of, the same estimates (made
    with the same options), so that they are not made twice.
    """
    can = estimates.get("canonical")
    if can is None or can._floor_maker is None:
        return
    names = l2_floor_notions(can.n, can.n_classes)
    if all(k in estimates for k in names):
        can._set_floors([(estimates[k], float(f)) for k, f in names.items()])


def _bound_intervals(
    estimates: dict[str, CalibrationEstimate],
    summaries: dict[str, dict[str, object]],
    R: int,
    seed: int | None,
) -> None:
    """Give a bound's row the squared L2 interval that the canonical interval resampled.

    The canonical squared L2 replicates take their bounds' replicates on the same row
    samples (:meth:`CalibrationEstimate._resampled`): a bound notion that was not
    resampled itself (the class-wise one by default) gets its squared L2 interval from
    them, the same interval as its own ``confidence_interval("ce_l2", n_resamples=R,
    seed=seed)``, at no cost.
    """
    can = estimates.get("canonical")
    if can is None or R == 0 or seed is None or not can._floors:
        return
    key = (int(seed), R, "add")
    for bound, _ in can._floors:
        row = summaries.get(bound.calibration)
        made = bound._replicates_made.get(key)
        if row is None or made is None or "ce_l2_ci" in row or not np.all(np.isfinite(made)):
            continue
        ci = bound._intervals({"ce_l2": made}, 0.95)["ce_l2"]
        row["ce_l2_ci"] = [ci.low, ci.high]


def _estimate_quietly(probs: object, labels: object, **options: Any) -> CalibrationEstimate:
    """:func:`kdecal.estimate` without its warning on canonical estimates at many classes.

    The report gives its own (:func:`_canonical_notes`), where it prints such a figure.
    """
    with quiet(UnreliableEstimateWarning):
        return estimate(probs, labels, **options)


def _canonical_notes(
    est: CalibrationEstimate, kernel_rows: bool, summaries: dict[str, dict[str, object]]
) -> list[str]:
    """Return the note (and give the warning) on canonical figures at many classes.

    Where the report prints a canonical kernel estimate (the metrics of
    ``calibration="canonical"`` or the notion table's canonical row) at K above
    :data:`kdecal.kde.CANONICAL_RELIABLE_MAX_K`.
    """
    shown = (est.calibration == "canonical" and kernel_rows) or "canonical" in summaries
    why = _canonical_unreliable("canonical", est.n_classes)
    if not shown or why is None:
        return []
    if est.estimator == "residual":  # the plug-in is for reproductions: no warning
        warn_user(f"kdecal.evaluate: {why}", UnreliableEstimateWarning)
    return [why[0].upper() + why[1:] + "."]


#: How the notes name the calibration loss's recalibration.
_CALIBRATOR_NAMES = {"affine": "affine recalibration", "temperature": "temperature scaling"}


def _kl_notes(
    est: CalibrationEstimate, cal_loss: float | None, calibrator: str = "affine"
) -> list[str]:
    """Return the notes on the report's KL figure: its reliability, the calibration loss.

    ``calibrator``: the recalibration of the calibration loss ("affine" or
    "temperature"), which the note names.
    """
    notes = []
    why = _kl_unreliable(est.calibration, est.n_classes)
    if why is not None and _canonical_unreliable(est.calibration, est.n_classes) is None:
        notes.append(why[0].upper() + why[1:] + ".")
        if est.estimator == "residual":  # the plug-in is for reproductions: no warning
            warn_user(f"kdecal.evaluate: {why}", UnreliableEstimateWarning)
    ce_kl = float(est.value("ce_kl"))
    if cal_loss is not None and est.calibration == "canonical" and ce_kl < cal_loss:
        notes.append(
            f"ce_kl ({ce_kl:.4g} nats) is below calibration_loss ({cal_loss:.4g} nats), "
            "which it should bound from above: the KL calibration error is the log loss "
            "that the true recalibration E[y | f] removes, the calibration loss the part "
            f"that a cross-validated {_CALIBRATOR_NAMES[calibrator]} removes. The kernel estimate is "
            f"too low here (at h = {est.bandwidth_kl:.3g} its regression does not resolve "
            "these predictions' miscalibration); the calibration loss is the safer figure."
        )
    return notes


@_doc
@_search.grid_end_warnings_once
def evaluate(
    probs: object,
    labels: object,
    *,
    bandwidth: float | str = "auto",
    calibration: str = "auto",
    debias: str = "ustat",
    backend: Backend = "auto",
    progress: bool | None = None,
    source: str | None = None,
    notions: tuple[str, ...] | list[str] | str | None = "auto",
    resample_notions: tuple[str, ...] | list[str] | str | None = "auto",
    n_resamples: int = 100,
    seed: int | None = 0,
    calibration_loss: bool = True,
    estimator: str = "residual",
    metrics: Sequence[str] | str | None = None,
) -> CalibrationReport:
    """Every kernel estimator of kdecal, with intervals and a calibration test, plus context.

    For the notion ``calibration`` the report holds ECE^KDE (L1 and L2; Popordanoska et
    al. 2022, Eq. 9), the KL and squared L2 calibration errors, refinement and sharpness
    (Popordanoska et al. 2024, Eq. 4-5, 9-10, 15) from one estimate (one search and one
    pass). For each notion of ``notions`` it adds the L1 ECE^KDE and squared L2 error,
    their bootstrap 95 % intervals, the consistency-resampling calibration test (p-value
    of the squared L2 statistic, and the null mean of each: what a calibrated model would
    score) and a plain-language note where the estimate is dominated by its bias (null
    mean above half the estimate). Beside them: accuracy, log loss, Brier score, the
    15-bin top-label binned ECE and its debiased L2 form (Kumar, Liang & Ma, NeurIPS
    2019), the top-label smooth ECE (Blasiok & Nakkiran, ICLR 2024), so that a reader sees
    where the estimators agree, and the calibration loss of Ferrer & Ramos (log loss
    minus the log loss after 5-fold cross-validated affine calibration; temperature
    scaling below :data:`CAL_LOSS_AFFINE_MIN_ROWS_PER_CLASS` rows per class, where the
    affine calibrator's K + 1 parameters overfit, with a note). The smooth ECE
    and the debiased binned ECE get bootstrap 95 % intervals on the row samples of the
    kernel intervals (:func:`kdecal._row_metrics.row_bootstrap`: the same
    ``n_resamples`` and ``seed``, each metric recomputed on the resampled rows; the
    percentile interval centred on the estimate, as the kernel quantities'). ``metrics``
    narrows the report to a selection.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    bandwidth : float, "auto" or "loo-mle", default "auto"
        {bandwidth_doc}
    calibration : {"auto", "canonical", "classwise", "top_label"}, default "auto"
        The notion of the report's kernel figures. "auto": "canonical" up to K = 10
        classes (:data:`kdecal.kde.CANONICAL_RELIABLE_MAX_K`), "top_label" beyond, where
        no canonical kernel estimate can tell a calibrated model from a miscalibrated
        one (bench/README.md, "Canonical estimates at many classes"; a note says so).
        {calibration_notions}
    {debias_param}
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
    progress : bool or None, default None
        Progress bar with ETA; None shows one for long work where the output is a
        terminal or a notebook (none in logs and pipes).
    source : str, optional
        Description stored in the report (e.g. a file name).
    notions : "auto", sequence of str or None, default "auto"
        Notions summarised (estimate and bandwidth); None or () for none. "auto":
        ("canonical", "top_label", "classwise") up to K = 10, ("top_label",
        "classwise") beyond, class-wise only where its estimate is expected to take at
        most 2 minutes on 2 cores (K binary problems of n points: n K up to 1.2e7; about
        8 minutes and 13 GB at n = 50,000, K = 1,000; a note says what was left out,
        what it would cost and how to ask for it), and the notion
        ``calibration`` names first where it is not among them
        (``calibration="canonical"`` beyond K = 10).
    resample_notions : "auto", sequence of str or None, default "auto"
        Those of ``notions`` that also get bootstrap intervals and the calibration test
        (not with ``debias="ratio"``, whose third power sums resampling does not keep);
        the notion ``calibration`` always does when it is among ``notions``. A notion
        named here but not in ``notions`` raises ``ValueError`` (it has no row to hold
        the intervals). ``"auto"``: canonical and top-label,
        the canonical notion (also as ``calibration``) only up to ``n^2 (K + 3) =
        1.1e10`` and n = 20,000 on the CPU backends (n = 20,000 at K = 10, n = 10,000
        at K = 100): its resampling is dense, ``n^2 (K + 3)`` multiply-adds per
        replicate and bandwidth, about 10 s for the bundled example and an hour at
        n = 100,000, K = 10 on 2 cores; beyond, the report notes what it left out and how
        long it would take (``CANONICAL_RESAMPLING_MAX_WORK`` and ``_MAX_N`` in
        ``kdecal._evaluate``). A sequence is taken as given; None or () for the notion
        ``calibration`` alone.
        A notion whose resampling is undefined (every row of a replicate lost its
        neighbours: a bandwidth far too small) gets a note instead.
        Class-wise resampling costs K one-vs-rest problems per resample (about 14 s for
        100 resamples of the bundled K = 10 example on 2 cores), so it is opt-in.
    n_resamples : int, default 100
        Bootstrap replicates and resampled label sets per notion: 0 skips intervals
        and tests, else 2 to 1,000,000.
    seed : int or None, default 0
        Seed of the resampling (the default makes reports reproducible).
    calibration_loss : bool, default True
        Compute the Ferrer & Ramos calibration loss (needs K >= 2 classes present).
    {estimator_doc}
    metrics : sequence of str, str or None, default None
        What the report computes and prints, in this order: keys of
        ``kdecal.QUANTITIES`` (the kernel estimates of the notion ``calibration``) and
        of ``kdecal._compare.ROW_METRICS`` (the top-label metrics without a kernel:
        "ece_binned", "ece_binned_debiased", "mce_binned", "smooth_ece"), the names of
        ``kdecal compare --metrics``. The kernel estimate of ``calibration`` (one
        bandwidth search and pass) is always made; the notion table (the other notions'
        estimates, their intervals and tests: most of the time) only when "ece_kde_l1"
        or "ce_l2" is named; the calibration loss not; every named row metric gets an
        interval (``n_resamples`` > 0). None (default): the full report.

    Returns
    -------
    CalibrationReport
        ``str(report)`` is a table; ``report.to_dict()`` is JSON-ready.

    Raises
    ------
    TypeError, ValueError
        Invalid input (see :func:`conditional_expectation`), an unknown notion, an
        unknown or empty ``metrics``, or ``n_resamples`` of 1 or outside 0..1,000,000.

    Warns
    -----
    KdecalWarning
        Before a canonical estimate (the notion ``calibration`` or a row of the notion
        table) with the automatic bandwidth on the CPU backends estimated at more than
        5 minutes on 2 cores (n above about 330,000 at K = 10, 145,000 at K = 100: all
        n^2 pairs with a K-dimensional kernel), naming the estimate and the top-label
        and class-wise notions, which run on the fast binary engine; and before a
        class-wise estimate (asked for by name) estimated at more than 5 minutes (n K
        above about 3e7), naming its time and memory.
    UnreliableEstimateWarning
        Where the report prints a canonical kernel figure of the residual-centred
        estimator beyond K = 10 classes (:data:`kdecal.kde.CANONICAL_RELIABLE_MAX_K`),
        or the canonical KL error at 4 < K <= 10; the report's notes say the same.
    """
    t0 = time.perf_counter()
    R = check_resamples(n_resamples, "n_resamples", 0)
    if R == 1:  # (refused by the resampling, after the estimates)
        raise ValueError(
            "n_resamples must be 0 (no intervals or test) or at least 2, got 1; a few "
            "hundred give stable 95 % intervals and p-values"
        )
    check_seed(seed)  # before the estimates, not after them
    selected = _check_metrics(metrics)
    shape_in = _shape(probs)  # (a list is converted once here, and again when validated)
    K_in = _n_classes(shape_in)
    many = K_in is not None and K_in > CANONICAL_RELIABLE_MAX_K
    check_choice(calibration, "calibration", ("auto", *_problem.CALIBRATIONS))
    auto_notes = []
    autos = [
        f"{name}='auto'"
        for name, value in (("calibration", calibration), ("notions", notions))
        if isinstance(value, str) and value == "auto"
    ]
    asked = calibration != "auto"
    if calibration == "auto":
        calibration = "top_label" if many else "canonical"
    if isinstance(notions, str):
        if notions != "auto":
            raise ValueError(
                f"notions must be 'auto', a sequence of {list(_problem.CALIBRATIONS)} or "
                f"None, got the string {notions!r} (one notion: ({notions!r},))"
            )
        notions = EVALUATE_NOTIONS_MANY_CLASSES if many else EVALUATE_NOTIONS
        n_in = _n_rows(shape_in)
        if (
            calibration != "classwise"
            and n_in is not None
            and K_in is not None
            and classwise_estimate_cost(n_in, K_in)[0] > CLASSWISE_AUTO_MAX_SECONDS
        ):
            notions = tuple(q for q in notions if q != "classwise")
            auto_notes.append(_classwise_left_out(n_in, K_in))
        if asked and calibration not in notions:
            # a notion asked for by name gets its row (and so its intervals and test)
            # where "auto" would leave it out (canonical beyond K = 10)
            notions = (calibration, *notions)
    shown = calibration == "canonical" or "canonical" in (notions or ())
    if autos and K_in is not None and many and not shown:
        auto_notes.append(_canonical_left_out(K_in, ", ".join(autos)))
    wanted = tuple(notions or ())
    if selected is not None and not set(_NOTION_QUANTITIES) & set(selected):
        wanted = ()  # no notion table: neither its estimates nor its resampling
    for name in wanted:
        check_choice(name, "notions", _problem.CALIBRATIONS)
    resample_spec = _check_resample_notions(resample_notions)
    missing = [q for q in resample_spec if q not in wanted] if resample_spec != "auto" else []
    if missing:
        raise ValueError(
            f"resample_notions names {', '.join(map(repr, missing))}, which the notion table "
            f"does not hold (notions: {', '.join(wanted) or 'none'}); add "
            f"{'it' if len(missing) == 1 else 'them'} to notions (command line: --notions)"
        )
    _warn_long_estimates(probs, calibration, wanted, bandwidth, backend)
    main = _estimate_quietly(
        probs,
        labels,
        bandwidth=bandwidth,
        calibration=calibration,
        debias=debias,
        estimator=estimator,
        backend=backend,
        progress=progress,
    )
    est = main._est
    P, y = main._probs, main._labels
    K, n = main.n_classes, main.n
    resampled, left_out = _resampled_notions(
        resample_spec, str(calibration), n, K, R, str(main.backend)
    )
    summaries: dict[str, dict[str, object]] = {}
    estimates: dict[str, CalibrationEstimate] = {}
    for name in wanted:
        e = (
            main
            if name == calibration
            else _estimate_quietly(
                main._validated if main._validated is not None else P,
                y,
                bandwidth=bandwidth,
                calibration=name,
                debias=debias,
                estimator=estimator,
                backend=cast(Backend, main.backend),
                progress=progress,
            )
        )
        estimates[name] = e
    _share_floors(estimates)
    # the canonical notion last: its squared L2 replicates take its bounds' (the other
    # notions on the same row samples) where those were resampled
    for name in sorted(wanted, key=lambda k: k == "canonical"):
        # resampling has no third power sums: debias="ratio" gets estimates only; the
        # notion asked for with `calibration` is always resampled
        resample = name in resampled and str(debias) != "ratio"
        summaries[name] = _notion_summary(estimates[name], R if resample else 0, seed)
        if R > 0 and name in left_out and str(debias) != "ratio":
            summaries[name]["resampling_skipped"] = left_out[name]
    summaries = {name: summaries[name] for name in wanted}
    _bound_intervals(estimates, summaries, R, seed)
    estimates.setdefault(str(calibration), main)
    cal_loss = None
    cal_calibrator = "affine"
    notes: list[str] = []
    if R > 0 and wanted and str(debias) == "ratio":
        notes.append(
            "No intervals or test with debias='ratio': its corrections need the third "
            "power sums, which the resampling does not keep; debias='ustat' (the default) "
            "has both."
        )
    one_class = np.unique(y).size < 2
    if calibration_loss and selected is None and K >= 2 and one_class:
        notes.append(
            f"calibration_loss skipped: every label is class {int(y[0])}, and its "
            "cross-validated recalibration needs rows of two classes at least."
        )
    elif calibration_loss and selected is None and K >= 2:
        if np.bincount(y).max() < _CAL_LOSS_FOLDS:
            notes.append(
                f"calibration_loss skipped: its {_CAL_LOSS_FOLDS}-fold stratified "
                f"cross-validation needs a class with at least {_CAL_LOSS_FOLDS} rows "
                f"(class counts {np.bincount(y, minlength=K).tolist()[:20]})."
            )
        else:
            if n < CAL_LOSS_AFFINE_MIN_ROWS_PER_CLASS * K:
                cal_calibrator = "temperature"
                notes.append(
                    f"calibration_loss uses temperature scaling, not affine calibration: "
                    f"with {n / K:.1f} rows per class (n = {n:,}, K = {K}) the affine "
                    f"calibrator's {K + 1} parameters overfit the cross-validation folds "
                    "and understate the loss (below "
                    f"{CAL_LOSS_AFFINE_MIN_ROWS_PER_CLASS} rows per class)."
                )
            with quiet(KdecalWarning):
                cal_loss = float(
                    scores.calibration_loss(
                        P, y, input="probs", relative=False, seed=0, calibrator=cal_calibrator
                    )
                )
        floor = (K - 1) / (2 * n)
        if (
            cal_loss is not None
            and cal_calibrator == "affine"
            and K > CAL_LOSS_FLOOR_MIN_K
            and cal_loss < 3 * floor
        ):
            notes.append(
                f"calibration_loss ({cal_loss:.4g} nats) is within three times the floor "
                f"of the affine calibrator at n = {n:,}, K = {K}: its stratified "
                "cross-validation counts the sampling noise of the class frequencies as "
                f"loss, about (K - 1) / (2n) = {floor:.4g} nats for a calibrated model "
                "(bench/README.md). Losses of that size do not show miscalibration."
            )
    ce_l2 = main.value("ce_l2")
    rows = {q: f(P, y) for q, f in ROW_METRICS.items() if q != "mce_binned"}
    if selected is not None and "mce_binned" in selected:
        rows["mce_binned"] = ROW_METRICS["mce_binned"](P, y)
    boot = _DEFAULT_ROW_INTERVALS if selected is None else selected
    intervals = _row_intervals(P, y, {q: rows[q] for q in boot if q in rows}, R, seed)
    # the notes of the kernel figures only where one they speak of is printed
    chosen = set(QUANTITIES) if selected is None else set(selected)
    kl_note = any(QUANTITIES[q].divergence == "kl" for q in chosen & set(QUANTITIES))
    sq_note = bool(summaries) or bool({"ce_l2", "ece_kde_l2"} & chosen)
    assert main._validated is not None  # the context below takes the validated input
    log_p = main._validated.log_p  # one log of the probabilities for both scores
    report = CalibrationReport(
        n=n,
        n_classes=K,
        bandwidth=est.bandwidth,
        ece_kde_l1=main.value("ece_kde_l1"),
        ece_kde_l2=main.value("ece_kde_l2"),
        ce_kl=main.value("ce_kl"),
        ce_l2=ce_l2,
        refinement_kl=main.value("refinement_kl"),
        refinement_l2=main.value("refinement_l2"),
        sharpness_kl=main.value("sharpness_kl"),
        sharpness_l2=main.value("sharpness_l2"),
        accuracy=float(np.mean(P.argmax(axis=1) == y)),
        log_loss=scores._log_loss(log_p, y),
        brier_score=scores._brier_score(log_p, y),
        ece_binned=rows["ece_binned"],
        ece_binned_debiased=rows["ece_binned_debiased"],
        smooth_ece=rows["smooth_ece"],
        mce_binned=rows.get("mce_binned"),
        intervals=intervals,
        metrics=selected,
        backend=main.backend,
        wall_time_s=time.perf_counter() - t0,
        source=source,
        calibration=str(calibration),
        debias=str(debias),
        bandwidth_rule=_rule(bandwidth, estimator),
        bandwidth_kl=main.bandwidth_kl,
        bandwidth_l2=main.bandwidth_l2,
        estimator=main.estimator,
        calibration_loss=cal_loss,
        calibration_loss_calibrator=cal_calibrator,
        notions=summaries,
        notes=_canonical_notes(main, bool(chosen & set(QUANTITIES)), summaries)
        + _bias_notes(summaries)
        + (_ordering_notes(summaries, K) if sq_note else [])
        + (_squared_notes(ce_l2, summaries) if sq_note else [])
        + (_kl_notes(main, cal_loss, cal_calibrator) if kl_note else [])
        + [
            f"No intervals or test for {name.replace('_', '-')}: {row['resampling_skipped']}"
            for name, row in summaries.items()
            if "resampling_skipped" in row
        ]
        + notes
        + auto_notes,
        estimates=estimates,
    )
    return report
