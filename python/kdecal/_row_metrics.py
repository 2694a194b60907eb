"""The top-label metrics without a kernel, and their bootstrap on row samples.

:data:`ROW_METRICS` (binned ECE, its debiased L2 form, binned MCE, smooth ECE) are
functions of the predictions alone: they have no bandwidth and no engine sums to
resample, so a bootstrap replicate recomputes them on the resampled rows.
:func:`row_bootstrap` does so on the row samples that the kernel quantities'
bootstrap draws from the same seed, so that :func:`kdecal.compare` (paired across
models) and :func:`kdecal.evaluate` (beside the kernel intervals) put every metric on
the same resampled rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from . import binned, smooth
from ._estimation import replicates as _replicates
from ._estimation.quantities import QUANTITIES
from ._validation import check_seed

__all__ = ["ROW_METRICS", "check_metric", "lower_bound", "row_bootstrap"]


#: The metrics of :data:`ROW_METRICS` as functions of the top-label binary problem
#: ``[(confidence, correct)]`` (:func:`kdecal.binned._problems`), which a bootstrap
#: replicate resamples as two n-vectors instead of the (n, K) probabilities.
_ON_TOP_LABEL: dict[str, Callable[[list[tuple[np.ndarray, np.ndarray]]], float]] = {
    "ece_binned": lambda pr: binned._problems_ece(pr, 15),
    "ece_binned_debiased": lambda pr: binned._problems_ece(pr, 15, q=2.0, debias=True),
    "mce_binned": lambda pr: binned._problems_ece(pr, 15, q=math.inf),
    "smooth_ece": lambda pr: smooth._smooth_ece(pr, None),
}


def _top_label(P: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    return binned._problems(P, y, "top_label", None)


#: Metrics of the predictions taken beside the kernel quantities (``kdecal.QUANTITIES``)
#: by :func:`kdecal.compare` and :func:`kdecal.evaluate`: each a function of validated
#: probabilities ``P`` (n, K) and labels ``y`` (n,). They have no bandwidth, and are
#: bootstrapped on the kernel quantities' row samples (:func:`row_bootstrap`). All
#: top-label: the binned ECE with 15 equal-width bins (Guo et al., ICML 2017), its
#: debiased L2 form (Kumar, Liang & Ma, NeurIPS 2019; the signed root), the binned
#: maximum calibration error (Naeini et al., AAAI 2015) and the smooth ECE at its
#: fixed-point bandwidth (Blasiok & Nakkiran, ICLR 2024; the costliest: a bandwidth
#: search per replicate, about 0.025 s at n = 10,000).
def _on_probs(
    f: Callable[[list[tuple[np.ndarray, np.ndarray]]], float],
) -> Callable[[np.ndarray, np.ndarray], float]:
    return lambda P, y: f(_top_label(P, y))


ROW_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    q: _on_probs(f) for q, f in _ON_TOP_LABEL.items()
}

#: The least value of each metric, where its interval is cut (None: no cut). The binned
#: ECE and MCE and the smooth ECE are means or maxima of absolute gaps, >= 0; the
#: debiased L2 form is a signed root and may be negative.
_ROW_LOWER_BOUNDS: dict[str, float | None] = {
    "ece_binned": 0.0,
    "ece_binned_debiased": None,
    "mce_binned": 0.0,
    "smooth_ece": 0.0,
}


def lower_bound(name: str) -> float | None:
    """Return the least value of a metric (a kernel quantity or a key of ROW_METRICS).

    0 where every estimate is >= 0 (:attr:`kdecal._estimation.quantities.Quantity.lower_bound`
    for the kernel quantities), None where an estimate may be negative; the intervals
    of :func:`kdecal.evaluate` and :func:`kdecal.compare` are cut there.
    """
    if name in _ROW_LOWER_BOUNDS:
        return _ROW_LOWER_BOUNDS[name]
    return QUANTITIES[name].lower_bound if name in QUANTITIES else None


def check_metric(name: object, what: str = "quantities") -> str:
    """Return ``name`` if it is a kernel quantity or a key of :data:`ROW_METRICS`.

    Raises
    ------
    ValueError
        Naming the argument ``what``, the bad value and every known name.
    """
    if isinstance(name, str) and name in ROW_METRICS:
        return name
    if not isinstance(name, str) or name not in QUANTITIES:
        raise ValueError(
            f"{what} must be keys of kdecal.QUANTITIES {sorted(QUANTITIES)} or of "
            f"the metrics without a kernel {sorted(ROW_METRICS)}, got {name!r}"
        )
    return name


def row_bootstrap(
    probs: Mapping[str, np.ndarray],
    y: np.ndarray,
    names: Sequence[str],
    n_resamples: int,
    seed: int | None,
) -> dict[str, dict[str, np.ndarray]]:
    """Return the row metrics ``names`` of every model on the same bootstrap row samples.

    The samples are those of the kernel quantities' bootstrap with the same integer
    seed (:func:`kdecal._calibration_estimate.bootstrap_distributions` and
    :meth:`kdecal.CalibrationEstimate.confidence_intervals` draw them with
    :func:`kdecal._estimation.replicates.draw_bootstrap_counts` from
    ``np.random.default_rng(seed)``, as here, a chunk at a time); replicate ``r`` of a
    metric is the metric of the rows repeated by their multiplicities in sample ``r``.

    Parameters
    ----------
    probs : mapping name -> array, shape (n, K), float
        Validated probabilities of each model (one model for a report).
    y : ndarray, shape (n,), int
        The labels.
    names : sequence of str
        Keys of :data:`ROW_METRICS`.
    n_resamples : int
        Bootstrap samples (checked by the caller).
    seed : int or None
        Seed of ``np.random.default_rng``.

    Returns
    -------
    dict
        ``out[model][name]``: the replicates, shape (n_resamples,).
    """
    n = y.shape[0]
    R = n_resamples
    out = {k: {q: np.empty(R) for q in names} for k in probs}
    rng = check_seed(seed)
    step = _replicates.draw_chunk(n, 2, R)
    rows = np.arange(n)
    # each model's top-label problem once; a replicate takes its rows (the same arrays as
    # the problem of P[idx], y[idx], bit for bit)
    problems = {k: _top_label(P, y)[0] for k, P in probs.items()}
    for r0 in range(0, R, step):
        counts = _replicates.draw_bootstrap_counts(n, min(step, R - r0), rng)
        for r, c in enumerate(counts):
            idx = np.repeat(rows, c)
            for k, (conf, correct) in problems.items():
                sample = [(conf[idx], correct[idx])]
                for q in names:
                    out[k][q][r0 + r] = _ON_TOP_LABEL[q](sample)
    return out
