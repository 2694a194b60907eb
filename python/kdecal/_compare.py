"""Compare the calibration of several models' predictions on the same labels.

:func:`compare` estimates each model's calibration errors (each at its own automatic
bandwidth), bootstrap intervals, and paired bootstrap differences: the same resampled
rows for every model, so that the interval of a difference reflects how much the two
models' errors move together.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._result import _check_level, _check_quantity, bootstrap_counts
from ._result import percentile_interval as _interval
from ._validation import check_choice, check_int, check_probs
from .warnings import KdecalWarning

__all__ = ["Comparison", "compare"]


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare`.

    Attributes
    ----------
    names : list of str
        Model names, in input order.
    quantities : list of str
        Quantities compared (keys of ``kdecal.QUANTITIES``).
    estimates : dict
        ``estimates[model][quantity] = {"value", "low", "high"}`` (bootstrap percentile
        interval at ``level``) plus ``estimates[model]["bandwidth"]``.
    differences : list of dict
        One per pair (A, B) and quantity: ``{"a", "b", "quantity", "difference"
        (A - B), "low", "high" (paired bootstrap interval), "pvalue" (two-sided paired
        bootstrap), "significant" (the interval excludes 0)}``.
    level : float
    n_resamples : int
    calibration : str
    """

    names: list[str]
    quantities: list[str]
    estimates: dict[str, dict[str, Any]]
    differences: list[dict[str, Any]]
    level: float
    n_resamples: int
    calibration: str
    bootstrap: dict[str, dict[str, np.ndarray]] = field(repr=False, default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (no arrays)."""
        return {
            "names": list(self.names),
            "quantities": list(self.quantities),
            "calibration": self.calibration,
            "level": self.level,
            "n_resamples": self.n_resamples,
            "estimates": self.estimates,
            "differences": self.differences,
        }

    def __str__(self) -> str:
        pct = f"{100 * self.level:g} %"
        w = max(5, *(len(n) for n in self.names))
        lines = [
            (
                f"kdecal model comparison ({self.calibration}; {pct} bootstrap intervals, "
                f"{self.n_resamples} paired resamples)"
            ),
            "",
        ]
        head = f"{'model':<{w}}  {'bandwidth':>9}"
        for q in self.quantities:
            head += f"  {q + ' [CI]':<32}"
        lines.append(head)
        for name in self.names:
            row = f"{name:<{w}}  {self.estimates[name]['bandwidth']:>9.4g}"
            for q in self.quantities:
                e = self.estimates[name][q]
                row += f"  {e['value']:.5f} [{e['low']:.5f}, {e['high']:.5f}]".ljust(34)
            lines.append(row)
        if self.differences:
            lines.append("")
            lines.append("paired differences (A - B):")
            for d in self.differences:
                mark = "significant" if d["significant"] else "not significant"
                lines.append(
                    f"  {d['quantity']:<11} {d['a']} - {d['b']}: {d['difference']:+.5f} "
                    f"[{d['low']:+.5f}, {d['high']:+.5f}], p = {d['pvalue']:.3g} ({mark})"
                )
        return "\n".join(lines)


def compare(
    models: Mapping[str, object] | Sequence[object],
    labels: object,
    *,
    quantities: Sequence[str] = ("ece_kde_l1", "ce_l2"),
    calibration: str = "canonical",
    bandwidth: float | str = "auto",
    debias: str = "ustat",
    n_resamples: int = 200,
    level: float = 0.95,
    seed: int | None = 0,
    backend: str = "auto",
) -> Comparison:
    """Compare several models' calibration on the same labels, with paired intervals.

    Each model gets its own estimate (:func:`kdecal.estimate`, its own automatic
    bandwidth); then the same ``n_resamples`` bootstrap row samples are applied to every
    model (a paired bootstrap), giving percentile intervals of each quantity and of each
    pairwise difference, and a two-sided bootstrap p-value
    ``min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` per difference (percentile intervals and
    the paired bootstrap of Efron & Tibshirani, "An Introduction to the Bootstrap",
    Chapman & Hall 1993, Ch. 13 and 16). The estimators are those of
    :func:`kdecal.estimate` (Popordanoska et al. 2022, Eq. 9; 2024, Eq. 9-10).

    Parameters
    ----------
    models : mapping name -> probs, or sequence of probs
        Predicted probabilities of each model, all of shape (n, K) (or (n,) binary);
        a sequence is named "model 0", "model 1", ...
    labels : array-like, shape (n,), int
        The true classes, shared by every model.
    quantities : sequence of str, default ("ece_kde_l1", "ce_l2")
        Keys of ``kdecal.QUANTITIES``.
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"
    bandwidth : float, "auto" or "loo-mle", default "auto"
        Passed to :func:`kdecal.estimate` for every model.
    debias : {"none", "ustat"}, default "ustat"
    n_resamples : int, default 200
        Paired bootstrap samples (>= 2).
    level : float, default 0.95
    seed : int or None, default 0
    backend : {"auto", "cpp", "numba"}, default "auto"

    Returns
    -------
    Comparison
        ``str(result)`` is a table; ``result.to_dict()`` is JSON-ready.

    Raises
    ------
    TypeError, ValueError
        Fewer than one model, models of different shapes, invalid labels, an unknown
        quantity, ``level`` outside (0, 1) or ``n_resamples < 2``.
    """
    from .kde import estimate

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
    check_choice(calibration, "calibration", ("canonical", "classwise", "top_label"))
    qs = [_check_quantity(q, "quantities") for q in quantities]
    if not qs:
        raise ValueError("quantities is empty")
    level = _check_level(level)
    R = check_int(n_resamples, "n_resamples", 2)
    shapes = {k: check_probs(v, f"models[{k!r}]").p.shape for k, v in items}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"every model must have predictions of the same shape, got {shapes}")
    ests = {
        k: estimate(
            v, labels, bandwidth=bandwidth, calibration=calibration, debias=debias, backend=backend
        )
        for k, v in items
    }
    n = next(iter(ests.values())).n
    counts = bootstrap_counts(n, R, np.random.default_rng(seed))
    boot = {k: e._bootstrap(qs, counts) for k, e in ests.items()}
    estimates: dict[str, dict[str, Any]] = {}
    for k, e in ests.items():
        row: dict[str, Any] = {"bandwidth": e.bandwidth}
        for q in qs:
            lo, hi = _interval(boot[k][q], level)
            row[q] = {"value": _quiet_value(e, q), "low": lo, "high": hi}
        estimates[k] = row
    diffs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for q in qs:
                d = boot[a][q] - boot[b][q]
                lo, hi = _interval(d, level)
                p = min(1.0, 2.0 * min(np.mean(d <= 0.0), np.mean(d >= 0.0)))
                diffs.append(
                    {
                        "a": a,
                        "b": b,
                        "quantity": q,
                        "difference": estimates[a][q]["value"] - estimates[b][q]["value"],
                        "low": lo,
                        "high": hi,
                        "pvalue": float(max(p, 1.0 / (R + 1))),
                        "significant": bool(lo > 0.0 or hi < 0.0),
                    }
                )
    return Comparison(names, qs, estimates, diffs, level, R, str(calibration), boot)


def _quiet_value(est: Any, q: str) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KdecalWarning)
        v = float(est.value(q))
    if not math.isfinite(v):  # pragma: no cover - estimates are finite
        raise ValueError(f"{q} is not finite ({v})")
    return v
