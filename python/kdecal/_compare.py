"""Compare the calibration of several models' predictions on the same labels.

:func:`compare` estimates every model's calibration errors at one common bandwidth
(chosen on the pooled criterion, see :func:`compare`), bootstrap intervals, and paired
bootstrap differences: the same resampled rows for every model, so that the interval of
a difference reflects how much the two models' errors move together.  A difference is
also recomputed at other bandwidths (each model's own choice, half and twice the common
one) and flagged when its sign depends on the bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._calibration_estimate import (
    _check_level,
    bootstrap_distributions,
    centred_interval,
    quantity_interval,
)
from ._engine import backends as _backends
from ._engine.backends import Backend
from ._estimation import problem as _problem
from ._estimation import regression as _regression
from ._estimation import replicates as _replicates
from ._estimation import search as _search
from ._estimation.quantities import QUANTITIES
from ._numerics import ValueEq
from ._report import format_pvalue
from ._row_metrics import ROW_METRICS, check_metric, lower_bound, row_bootstrap
from ._validation import check_choice, check_labels, check_probs, check_seed
from .kde import CANONICAL_RELIABLE_MAX_K, _estimate
from .tolerances import MIN_BANDWIDTH
from .warnings import KdecalWarning, quiet, warn_user

__all__ = ["ROW_METRICS", "Comparison", "compare"]


#: A difference's sign at another bandwidth counts towards "sensitive" only where the
#: difference exceeds this much of the larger of its two values (the same predictions
#: in two forms, e.g. probabilities and their round trip through logits, differ by the
#: rounding of their estimates, about 1e-16, whose sign means nothing).
SIGN_RTOL = 1e-9


@dataclass(frozen=True, eq=False)
class Comparison(ValueEq):
    """Result of :func:`compare`.

    Attributes
    ----------
    names : list of str
        Model names, in input order.
    quantities : list of str
        Quantities compared (keys of ``kdecal.QUANTITIES`` or of :data:`ROW_METRICS`).
    estimates : dict
        ``estimates[model][quantity] = {"value", "low", "high", "bandwidth"}``
        (bootstrap percentile interval at ``level``; the bandwidth the quantity is
        computed at, None for the metrics without a kernel) plus
        ``estimates[model]["bandwidth"]`` (the common bandwidth) and
        ``estimates[model]["own_bandwidth"]`` (the model's own choice under the same
        rule; equal to the common one for a fixed bandwidth). With ``bandwidth="auto"``
        and the residual estimator the squared L2, L2 and KL quantities are at half the
        common bandwidth.
    differences : list of dict
        One per pair (A, B) and quantity: ``{"a", "b", "quantity", "difference"
        (A - B), "low", "high" (paired bootstrap interval), "pvalue" (two-sided paired
        bootstrap), "significant" (the interval excludes 0 and the p-value is at most
        ``1 - level``, which needs ``n_resamples >= 1 / (1 - level) - 1``), "by_bandwidth" ({h:
        difference at h} for the bandwidths checked, h the bandwidth the quantity is
        computed at (a list of ``[h, difference]`` pairs in :meth:`to_dict`; empty for
        a metric without a kernel), "sensitive" (the difference changes sign at one of
        them; a difference within :data:`SIGN_RTOL` of its values has no sign)}``.
    level : float
        Confidence level of the intervals.
    n_resamples : int
        Paired bootstrap samples.
    calibration : str
        The notion of the kernel quantities.
    bootstrap : dict
        ``bootstrap[model][quantity]``: the replicates, ndarray of shape
        (n_resamples,), float64, on the same row samples for every model (the
        difference of two models' arrays is the paired bootstrap of their difference).
        Not part of :meth:`to_dict`.
    bandwidth : float
        The one bandwidth every model is evaluated at (NaN when no kernel quantity is
        compared).
    bandwidth_rule : str
        How it was chosen (see :func:`compare`).
    bandwidth_l2 : float
        The bandwidth of the squared L2 and L2 quantities (half of :attr:`bandwidth`
        with ``bandwidth="auto"`` and the residual estimator, else equal to it).
    bandwidth_kl : float
        The bandwidth of the KL quantities (as :attr:`bandwidth_l2`).
    """

    names: list[str]
    quantities: list[str]
    estimates: dict[str, dict[str, Any]]
    differences: list[dict[str, Any]]
    level: float
    n_resamples: int
    calibration: str
    bootstrap: dict[str, dict[str, np.ndarray]] = field(repr=False, default_factory=dict)
    bandwidth: float = math.nan
    bandwidth_rule: str = "fixed"
    bandwidth_l2: float = math.nan
    bandwidth_kl: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (no arrays; what ``kdecal compare --json`` prints).

        Returns
        -------
        dict
            The attributes but :attr:`bootstrap`, as plain Python values, with each
            difference's ``by_bandwidth`` as a list of ``[h, difference]`` pairs.
        """
        diffs = [
            {**d, "by_bandwidth": [[h, v] for h, v in d["by_bandwidth"].items()]}
            for d in self.differences
        ]
        return {
            "names": list(self.names),
            "quantities": list(self.quantities),
            "calibration": self.calibration,
            "bandwidth": _number(self.bandwidth),
            "bandwidth_rule": self.bandwidth_rule,
            "bandwidth_l2": _number(self.bandwidth_l2),
            "bandwidth_kl": _number(self.bandwidth_kl),
            "level": self.level,
            "n_resamples": self.n_resamples,
            "estimates": self.estimates,
            "differences": diffs,
        }

    def __str__(self) -> str:
        pct = f"{100 * self.level:g} %"
        w = max(5, *(len(n) for n in self.names))
        lines = [
            (
                f"kdecal model comparison ({self.calibration}; {pct} bootstrap intervals, "
                f"{self.n_resamples} paired resamples)"
            ),
            self._bandwidth_line(),
            "",
        ]
        kernel = not math.isnan(self.bandwidth)
        head = f"{'model':<{w}}" + (f"  {'own h':>9}" if kernel else "")
        for q in self.quantities:
            head += f"  {q + ' [CI]':<32}"
        lines.append(head)
        for name in self.names:
            row = f"{name:<{w}}"
            if kernel:
                row += f"  {self.estimates[name]['own_bandwidth']:>9.4g}"
            for q in self.quantities:
                e = self.estimates[name][q]
                row += f"  {e['value']:.5f} [{e['low']:.5f}, {e['high']:.5f}]".ljust(34)
            lines.append(row)
        if kernel:
            lines.append("(own h: the bandwidth the rule picks for the model alone; not used)")
        if self.differences:
            lines.append("")
            lines.append("paired differences (A - B):")
            for d in self.differences:
                mark = "significant" if d["significant"] else "not significant"
                if not d["significant"] and 1.0 / (self.n_resamples + 1) > 1.0 - self.level:
                    mark += f"; {self.n_resamples} resamples cannot show p <= {1 - self.level:.2g}"
                p = format_pvalue(d["pvalue"], self.n_resamples)
                lines.append(
                    f"  {d['quantity']:<11} {d['a']} - {d['b']}: {d['difference']:+.5f} "
                    f"[{d['low']:+.5f}, {d['high']:+.5f}], p {'' if p[0] == '<' else '= '}"
                    f"{p} ({mark})"
                )
                if d["sensitive"]:
                    alt = ", ".join(
                        f"{v:+.5f} at h = {h:.4g}" for h, v in d["by_bandwidth"].items()
                    )
                    lines.append(
                        f"    sensitive to the bandwidth: the difference changes sign ({alt}); "
                        "the verdict holds at this bandwidth only"
                    )
        return "\n".join(lines)

    def _bandwidth_line(self) -> str:
        """Return the table's line on the bandwidths, each quantity's where they differ."""
        if math.isnan(self.bandwidth):
            return "no kernel quantity: no bandwidth is used"
        line = f"every model at bandwidth h = {self.bandwidth:.4g} ({self.bandwidth_rule})"
        kinds = {QUANTITIES[q].fit for q in self.quantities if q in QUANTITIES}
        other = {"sq": self.bandwidth_l2, "kl": self.bandwidth_kl}
        moved = sorted({other[k] for k in kinds if k in other} - {self.bandwidth})
        if moved:
            what = {
                self.bandwidth_l2: "the squared L2 and L2 quantities",
                self.bandwidth_kl: "the KL quantities",
            }
            if self.bandwidth_l2 == self.bandwidth_kl:
                what[self.bandwidth_l2] = "the squared L2, L2 and KL quantities"
            line += "; " + "; ".join(f"{what[g]} at h = {g:.4g}" for g in moved)
        return line


def _number(x: float) -> float | None:
    """Return ``x``, or None for NaN (JSON has no NaN): a bandwidth that is not used."""
    return None if math.isnan(x) else x


def _bandwidth_of(est: Any, q: str) -> float | None:
    """Return the bandwidth quantity ``q`` of ``est`` is computed at (None: no kernel)."""
    if q not in QUANTITIES:
        return None
    fit = QUANTITIES[q].fit
    return float(
        est.bandwidth_kl if fit == "kl" else est.bandwidth_l2 if fit == "sq" else est.bandwidth
    )


@_search.grid_end_warnings_once
def compare(
    models: Mapping[str, object] | Sequence[object],
    labels: object,
    *,
    quantities: Sequence[str] | str = ("ece_kde_l1", "ce_l2"),
    calibration: str = "auto",
    bandwidth: float | str = "auto",
    debias: str = "ustat",
    n_resamples: int = 200,
    level: float = 0.95,
    seed: int | None = 0,
    backend: Backend = "auto",
    estimator: str = "residual",
) -> Comparison:
    """Compare several models' calibration on the same labels, with paired intervals.

    Every model is evaluated at one common bandwidth, so that a difference measures the
    models and not their bandwidths (the L1 ECE^KDE of one model can triple between
    h = 0.9 and h = 1.9; two models at their own bandwidths can swap places). With
    ``bandwidth="auto"`` (or "loo-mle") each model's own bandwidth is chosen by that
    rule (:func:`kdecal.select_bandwidth`), and the common bandwidth is the candidate
    among them with the best pooled criterion: the smallest sum over the models of the
    exact leave-one-out Brier risk of the kernel regression ("auto"), or the largest
    sum of the leave-one-out log-likelihoods ("loo-mle"). A float is used as it is.
    With "auto" and the residual estimator, the squared L2, L2 and KL quantities are at
    half the common bandwidth (the rule of :func:`kdecal.estimate`), else every
    quantity uses the common bandwidth.

    Then the same ``n_resamples`` bootstrap row samples are applied to every model (a
    paired bootstrap), giving intervals of each quantity and of each pairwise
    difference (percentile intervals centred on the estimate, as
    :meth:`CalibrationEstimate.confidence_interval`), and a two-sided bootstrap p-value
    ``min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` per difference, ``d`` the paired
    replicates' differences centred on the observed one (percentile intervals and
    the paired bootstrap of Efron & Tibshirani, "An Introduction to the Bootstrap",
    Chapman & Hall 1993, Ch. 13 and 16). Each difference is also computed at the
    models' own bandwidths and at half and twice the common one, and flagged
    ``sensitive`` when its sign differs at one of them. The estimators are those of
    :func:`kdecal.estimate` (Popordanoska et al. 2022, Eq. 9; 2024, Eq. 9-10).

    Parameters
    ----------
    models : mapping name -> probs, or sequence of probs
        Predicted probabilities of each model, all of shape (n, K) (or (n,) binary);
        a sequence is named "model 0", "model 1", ...
    labels : array-like, shape (n,), int
        The true classes, shared by every model.
    quantities : sequence of str or str, default ("ece_kde_l1", "ce_l2")
        Keys (or one key) of ``kdecal.QUANTITIES`` (the kernel estimates, in the notion
        ``calibration``), or of :data:`ROW_METRICS` (top-label metrics without a kernel:
        "ece_binned", "ece_binned_debiased", "mce_binned", "smooth_ece"), bootstrapped on
        row samples paired across the models (with an integer ``seed``, the kernel
        quantities' samples); their values do not depend on the bandwidth.
    calibration : {"auto", "canonical", "classwise", "top_label"}, default "auto"
        The notion of the kernel quantities: "auto" is "canonical" up to K = 10
        classes (:data:`kdecal.kde.CANONICAL_RELIABLE_MAX_K`) and "top_label" beyond,
        where the canonical kernel estimates cannot tell a calibrated model from a
        miscalibrated one and so cannot rank models (bench/README.md, "Canonical
        estimates at many classes"); the result's ``calibration`` says which.
    bandwidth : float, "auto" or "loo-mle", default "auto"
        The common bandwidth, or the rule of the candidates (see above).
    debias : {"none", "ustat"}, default "ustat"
    n_resamples : int, default 200
        Paired bootstrap samples (2 to 1,000,000).
    level : float, default 0.95
    seed : int or None, default 0
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
    estimator : {"residual", "plugin"}, default "residual"
        The regression of :func:`kdecal.estimate`.

    Returns
    -------
    Comparison
        ``str(result)`` is a table; ``result.to_dict()`` is JSON-ready.

    Raises
    ------
    TypeError, ValueError
        Fewer than one model, models of different shapes, invalid labels, an unknown
        quantity, ``level`` outside (0, 1) or ``n_resamples`` outside 2..1,000,000.

    Warns
    -----
    KdecalWarning
        Before a paired bootstrap of canonical kernel quantities on the CPU backends
        estimated at more than 5 minutes on 2 cores (its replicates are dense,
        ``n^2 (K + 3)`` multiply-adds per bandwidth: about 16 minutes for two models at
        n = 30,000, K = 10, 200 resamples), naming the estimate and the fast notions.
    """
    if isinstance(models, Mapping):
        items = [(str(k), v) for k, v in models.items()]
    elif isinstance(models, Sequence) and not isinstance(models, (str, bytes)):
        items = [(f"model {i}", v) for i, v in enumerate(models)]
    else:
        raise TypeError(
            f"models must be a mapping name -> probs or a sequence of probs, got "
            f"{type(models).__name__}"
        )
    if not items:
        raise ValueError("models is empty: pass at least one model's predictions")
    names = [k for k, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"models has duplicate names: {names}")
    check_choice(calibration, "calibration", ("auto", "canonical", "classwise", "top_label"))
    check_choice(estimator, "estimator", _regression.ESTIMATORS)
    qs = [
        check_metric(q, "quantities")
        for q in ([quantities] if isinstance(quantities, str) else quantities)
    ]
    if not qs:
        raise ValueError("quantities is empty")
    level = _check_level(level)
    R = _replicates.check_resamples(n_resamples, "n_resamples", 2)
    check_seed(seed)  # before the estimates, not after them
    checked = {k: check_probs(v, f"models[{k!r}]") for k, v in items}
    shapes = {k: P.p.shape for k, P in checked.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"every model must have predictions of the same shape, got {shapes}")
    n, K = next(iter(shapes.values()))
    y = check_labels(labels, n, K)
    if calibration == "auto":
        calibration = "canonical" if K <= CANONICAL_RELIABLE_MAX_K else "top_label"
    _warn_long_bootstrap(
        len(items),
        n,
        K,
        R,
        str(calibration),
        [q for q in qs if q not in ROW_METRICS],
        _backends.resolve_backend(backend, *(v for _, v in items)),
    )

    def at(h: float | str, criterion: str = "auto") -> dict[str, Any]:
        # a float is a common bandwidth under the estimator's rule (residual: the
        # squared quantities at RESIDUAL_SQ_FACTOR * h, as "auto" would put them)
        rule_at = None if isinstance(h, str) or not auto else float(h)
        return {  # the validated models: their warnings were given once, by name
            k: _estimate(
                v, y, h, calibration, debias, criterion, estimator, backend, None, rule_at
            )
            for k, v in checked.items()
        }

    auto = isinstance(bandwidth, str) and bandwidth != "loo-mle"
    kernel_qs = [q for q in qs if q not in ROW_METRICS]
    row_qs = [q for q in qs if q in ROW_METRICS]
    ests: dict[str, Any]
    own_h: dict[str, Any]  # None for each model without a kernel quantity
    if not kernel_qs:  # metrics without a kernel: no bandwidth to choose
        h, rule, own_h = math.nan, "not used", {k: None for k in names}
        ests = {k: None for k in names}
    elif isinstance(bandwidth, str):
        own = at(bandwidth, "brier")  # the rule's choice for each model alone
        own_h = {k: e.bandwidth for k, e in own.items()}
        h, rule = _pooled_bandwidth(checked, y, str(calibration), bandwidth, own_h, backend)
        ests = at(h)
    else:
        ests = at(bandwidth)
        h = next(iter(ests.values())).bandwidth
        own_h = {k: h for k in names}
        rule = "fixed"
    rows = {k: {q: ROW_METRICS[q](P.p, y) for q in row_qs} for k, P in checked.items()}

    def value_of(k: str, e: Any, q: str) -> float:
        return rows[k][q] if q in rows[k] else _quiet_value(e, q)

    boot_list = (
        bootstrap_distributions(list(ests.values()), kernel_qs, R, check_seed(seed))
        if kernel_qs
        else [{} for _ in ests]
    )
    boot = dict(zip(ests, boot_list))
    if row_qs:  # the same paired row samples (the same seed), no kernel
        for k, dist in row_bootstrap(
            {k: P.p for k, P in checked.items()}, y, row_qs, R, seed
        ).items():
            boot[k].update(dist)
    estimates: dict[str, dict[str, Any]] = {}
    for k, e in ests.items():
        row: dict[str, Any] = {"bandwidth": h if kernel_qs else None, "own_bandwidth": own_h[k]}
        for q in qs:
            value = value_of(k, e, q)
            lower = QUANTITIES[q].lower_bound_for(debias) if q in QUANTITIES else lower_bound(q)
            lo, hi = quantity_interval(q, boot[k][q], value, level, lower)
            row[q] = {"value": value, "low": lo, "high": hi, "bandwidth": _bandwidth_of(e, q)}
        estimates[k] = row
    # the same differences at the other bandwidths a user might have used, each keyed
    # by the bandwidth the quantity is computed at there
    # (h / 2 and 2 h only where they are bandwidths the engine takes: a fixed bandwidth
    # at either end of the supported range is compared at the others)
    others = (
        []
        if not kernel_qs
        else sorted(
            g for g in {*own_h.values(), h / 2.0, 2.0 * h} - {h} if MIN_BANDWIDTH <= g < math.inf
        )
    )
    first = names[0]
    values_at = {
        q: {estimates[first][q]["bandwidth"]: {k: estimates[k][q]["value"] for k in names}}
        for q in kernel_qs
    }
    for g in others:
        at_g = at(float(g))
        for q in kernel_qs:
            g_q = _bandwidth_of(at_g[first], q)
            values_at[q][g_q] = {k: value_of(k, e, q) for k, e in at_g.items()}
    diffs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for q in qs:
                diff = estimates[a][q]["value"] - estimates[b][q]["value"]
                # the paired replicates' spread, centred on the difference (as the
                # intervals of the estimates); the p-value from the same distribution
                d = boot[a][q] - boot[b][q]
                d = diff + (d - float(np.median(d)))
                lo, hi = centred_interval(d, diff, level)
                p = min(1.0, 2.0 * min(np.mean(d <= 0.0), np.mean(d >= 0.0)))
                at_h = sorted(values_at.get(q, {}).items())
                by_h = {g: v[a] - v[b] for g, v in at_h}
                # a sign counts where the difference exceeds the two values' rounding
                signs = {
                    np.sign(by_h[g])
                    for g, v in at_h
                    if abs(by_h[g]) > SIGN_RTOL * max(abs(v[a]), abs(v[b]))
                }
                diffs.append(
                    {
                        "a": a,
                        "b": b,
                        "quantity": q,
                        "difference": diff,
                        "low": lo,
                        "high": hi,
                        "pvalue": float(max(p, 1.0 / (R + 1))),
                        # the interval excludes 0 and the p-value can show it: with
                        # R + 1 < 1 / (1 - level) resamples (a 95 % interval from 2 or
                        # 10) the interval's ends are the replicates' extremes, and
                        # "significant" beside "p < 0.33" said more than they show
                        "significant": bool(
                            (lo > 0.0 or hi < 0.0) and max(p, 1.0 / (R + 1)) <= 1.0 - level
                        ),
                        "by_bandwidth": by_h,
                        "sensitive": bool(1.0 in signs and -1.0 in signs),
                    }
                )
    e0 = ests[first]
    return Comparison(
        names,
        qs,
        estimates,
        diffs,
        level,
        R,
        str(calibration),
        boot,
        float(h),
        rule,
        math.nan if e0 is None else float(e0.bandwidth_l2),
        math.nan if e0 is None else float(e0.bandwidth_kl),
    )


#: Estimated seconds of the paired bootstrap beyond which :func:`compare` warns.
LONG_BOOTSTRAP_SECONDS = 300.0


def _warn_long_bootstrap(
    models: int, n: int, K: int, R: int, calibration: str, kernel_qs: list[str], backend: object
) -> None:
    """Warn, before it starts, when the canonical paired bootstrap will take long.

    Its replicates are dense products with the kernel weights (``n^2 (K + 3)``
    multiply-adds per replicate and bandwidth; the bootstrap is about 0.8 of
    :func:`_replicates.dense_resampling_seconds`, which counts the test too), on the
    local CPU backends only.
    """
    if calibration != "canonical" or not kernel_qs:
        return
    if backend not in ("cpp", "numba"):  # resolved: cuda and dask have their own devices
        return
    sec = 0.8 * models * _replicates.dense_resampling_seconds(n, K, R)
    if sec > LONG_BOOTSTRAP_SECONDS:
        warn_user(
            f"kdecal.compare: the paired bootstrap of the canonical notion ({models} models, "
            f"n = {n:,}, K = {K}, {R} resamples) takes about "
            f"{_replicates.describe_seconds(sec)} on 2 cores: each replicate is dense, "
            "n^2 (K + 3) multiply-adds per bandwidth. calibration='top_label' or "
            "'classwise' resamples on the fast binary engine (seconds); n_resamples sets "
            "the count (command line: --calibration top_label, --n-resamples)",
            KdecalWarning,
        )


def _pooled_bandwidth(
    checked: dict[str, Any],
    y: np.ndarray,
    calibration: str,
    rule: str,
    own: dict[str, float],
    backend: str,
) -> tuple[float, str]:
    """Return the candidate bandwidth (the models' own) with the best pooled criterion."""
    candidates = np.array(sorted(set(own.values())), dtype=np.float64)
    if candidates.size == 1:
        return float(candidates[0]), f"{rule}: every model's own choice"
    be = _backends.resolve_backend(backend)
    total = np.zeros(candidates.size)
    for P in checked.values():
        problem = _problem.make_problem(P, y, calibration, be)
        if rule == "loo-mle":
            total -= _search.loo_log_likelihood(problem, candidates, be).sum(axis=0)
        else:
            total += _search.cv_risk_grid(problem, candidates, "brier", be)
    best = float(candidates[int(np.argmin(total))])
    what = "leave-one-out log-likelihood" if rule == "loo-mle" else "leave-one-out Brier risk"
    return best, f"{rule}: the models' own bandwidths, best pooled {what}"


def _quiet_value(est: Any, q: str) -> float:
    with quiet(KdecalWarning):
        v = float(est.value(q))
    if not math.isfinite(v):  # pragma: no cover - estimates are finite
        raise ValueError(f"{q} is not finite ({v})")
    return v
