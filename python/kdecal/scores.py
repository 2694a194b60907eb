"""Proper scoring rules, Bayes risk and calibration loss.

The evaluation framework of Ferrer & Ramos (TMLR 2025): the quality of posteriors is measured
by expected proper scoring rules (EPSRs) -- the cross-entropy (log loss), the Brier
score and the Bayes risk of a cost matrix -- preferably normalised by the EPSR of the
best naive system; calibration is diagnosed by the *calibration loss*, the part of the
EPSR that a calibrator removes.

Conventions
-----------
- **Inputs.** ``probs`` as everywhere in kdecal: shape (n, K) rows on the simplex, or
  (n,) holding P(y = 1) of a binary problem; probabilities are clipped to
  ``kdecal.tolerances.PROB_EPS = 1e-12`` and renormalised (so one sample adds at most
  ``-log(1e-12) = 27.6`` nats to the log loss). ``input="logits"`` takes unnormalised
  log-probabilities instead (log-softmax applied; (n,) means the log-odds of class 1)
  and keeps the full precision of very small posteriors, as Ferrer & Ramos's code does with
  log-posteriors. ``labels`` are integers in ``0..K-1``.
- **Priors.** ``priors=None`` uses the empirical test priors ``P_i = N_i / N``.
  Given ``priors`` (Ferrer & Ramos 2025, App. A, Eq. 36-37), each sample of class ``h`` is weighted by
  ``P_h / (N_h / N)``: the EPSR is ``sum_h P_h * (mean loss over the class-h samples)``,
  which equals the plain average when ``priors`` are the empirical ones.
- **Naive system.** ``normalize=True`` divides by the same EPSR of the best naive
  system, the one that outputs the priors for every sample (Ferrer & Ramos 2025, Sec. 2.3.2, citing
  Brümmer 2010, Sec. 2.4.1: "the prior distribution in the test data"): the empirical
  test priors, or ``priors`` when given (Ferrer & Ramos's code does the same). This gives
  NCE (normaliser ``-sum_i P_i log P_i``), NBS (``sum_i P_i (1 - P_i)``, divided by K
  under ``convention="mean"``) and NRisk / NEC (``min_j sum_i c_ij P_i``, the cost of
  always taking the least costly decision, Ferrer & Ramos 2025, Eq. 7 and below). The naive system
  therefore scores exactly 1.
- **Brier.** ``convention="sum"`` (default): ``sum_i (q_i - y_i)^2`` per sample, in
  [0, 2] (Brier 1950). ``convention="mean"``: Ferrer & Ramos 2025, Eq. 9, the same divided by K (in
  [0, 1] for K = 2: ``(1 - q_h)^2``). Normalised values are equal.
- **Cost matrices** are (K, M) arrays ``C[i, j]`` = cost of decision j when the true
  class is i; M may exceed K (e.g. an abstention column). Bayes decisions are
  ``argmin_j sum_i C[i, j] q_i`` (Ferrer & Ramos 2025, Eq. 1, 22), ties to the lowest index.

Cross-validation folds and bootstrap intervals live in :mod:`kdecal.resampling`;
``cv_folds``, ``bootstrap_ci`` and ``BootstrapCI`` are re-exported here.

References
----------
- L. Ferrer, D. Ramos. "Evaluating Posterior Probabilities: Decision Theory,
  Proper Scoring Rules, and Calibration". TMLR 2025. Code:
  github.com/luferrer/expected_cost and github.com/luferrer/psr-calibration.
- N. Brümmer. "Measuring, refining and calibrating speaker and language
  information extracted from speech". PhD thesis, Stellenbosch University, 2010.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.special import xlogy

from . import recalibration
from ._validation import (
    LogProbs,
    _numeric_array,
    check_choice,
    check_int,
    check_labels,
    clip_renormalise,
    log_probs,
)
from .resampling import BootstrapCI, _check_bool, _cv_folds, bootstrap_ci, cv_folds
from .tolerances import ROW_SUM_ATOL

__all__ = [
    "BootstrapCI",
    "bayes_decisions",
    "bayes_risk",
    "bootstrap_ci",
    "brier_score",
    "calibrate_scores",
    "calibration_loss",
    "cost_matrix_01",
    "cost_matrix_abstain",
    "cost_matrix_imbalanced",
    "cv_folds",
    "expected_cost",
    "log_loss",
]

_INPUTS = ("auto", "probs", "logits")
_MODES = ("xv", "tt", "heldout")
_CONVENTIONS = ("sum", "mean")
_METRICS = ("log_loss", "brier_score")
#: calibrator names of :func:`calibration_loss` -> class names in kdecal.recalibration
_CALIBRATORS = {
    "affine": "AffineCalibration",
    "temperature": "TemperatureScaling",
    "vector": "VectorScaling",
    "isotonic": "IsotonicCalibration",
    "histogram": "HistogramBinning",
}


# ------------------------------------------------------------------------- validation


def _check_priors(priors: object, K: int) -> np.ndarray:
    arr = _numeric_array(priors, "priors").astype(np.float64)
    if arr.shape != (K,):
        raise ValueError(f"priors must have shape ({K},) (one per class), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"priors must be finite and >= 0, got {arr.tolist()!r}")
    s = float(arr.sum())
    if abs(s - 1.0) > ROW_SUM_ATOL:
        raise ValueError(f"priors must sum to 1 (tolerance {ROW_SUM_ATOL}), got sum {s!r}")
    return arr / s


def _class_weights(y: np.ndarray, K: int, priors: object) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample weights ``w_t = P_{h_t} / (N_{h_t} / N)`` and the priors ``P`` (K,)."""
    N = y.shape[0]
    counts = np.bincount(y, minlength=K)
    if priors is None:
        return np.ones(N), counts / N
    P = _check_priors(priors, K)
    missing = (P > 0) & (counts == 0)
    if np.any(missing):
        k = int(np.argmax(missing))
        raise ValueError(
            f"priors gives class {k} the prior {float(P[k])!r} but labels has no sample of class "
            f"{k}: the prior-weighted average (Ferrer & Ramos 2025, App. A) needs at least one"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        per_class = np.where(counts > 0, P * N / np.maximum(counts, 1), 0.0)
    return per_class[y], P


def _weighted_mean(loss: np.ndarray, w: np.ndarray) -> float:
    """``mean_t w_t loss_t``; a zero-weight sample contributes 0 even if its loss is inf."""
    mask = w > 0
    return float(np.sum(w[mask] * loss[mask]) / loss.shape[0])


def _normalised(value: float, naive: float, what: str, P: np.ndarray) -> float:
    if not (np.isfinite(naive) and naive > 0):
        raise ValueError(
            f"normalize=True divides by the {what} of the naive system that outputs the "
            f"priors {np.round(P, 6).tolist()}, which is {abs(naive) if naive == 0 else float(naive)!r}; it must be > 0 (a "
            "single class present, or a cost matrix whose cheapest fixed decision costs "
            "nothing)"
        )
    return value / naive


def _check_cost_matrix(cost_matrix: object, K: int | None = None) -> np.ndarray:
    C = _numeric_array(cost_matrix, "cost_matrix").astype(np.float64)
    if C.ndim != 2 or C.shape[0] < 2 or C.shape[1] < 1:
        raise ValueError(
            f"cost_matrix must have shape (K, M) with K >= 2 classes (rows) and M >= 1 "
            f"decisions (columns), got shape {C.shape}"
        )
    if not np.all(np.isfinite(C)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(C))[0])
        raise ValueError(
            f"cost_matrix contains a non-finite value {float(C[idx])!r} at index {idx}"
        )
    if K is not None and C.shape[0] != K:
        raise ValueError(
            f"cost_matrix has {C.shape[0]} rows but probs has K = {K} classes "
            f"(shape {C.shape}; rows are true classes, columns decisions)"
        )
    return C


def _check_index_vector(x: object, name: str, upper: int, what: str, n: int | None) -> np.ndarray:
    """Integers in ``0..upper-1``, 1-D (length ``n`` when given), int64."""
    arr = _numeric_array(x, name)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but labels has {n} (shape mismatch)")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(
                f"{name} must be integers in 0..{upper - 1}, got {float(arr[i])!r} at index {i}"
            )
    out = arr.astype(np.int64)
    bad = (out < 0) | (out >= upper)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"{name} must lie in 0..{upper - 1} ({upper} = {what}), got {int(out[i])!r} at index {i}"
        )
    return np.ascontiguousarray(out)


# ------------------------------------------------------------------------- EPSRs


def log_loss(
    probs: object,
    labels: object,
    *,
    normalize: bool = False,
    priors: object = None,
    input: str = "probs",
) -> float:
    """Cross-entropy (log loss) ``CE = -mean_t log q_{h_t}(x_t)``, or NCE (Ferrer & Ramos 2025, Eq. 8).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors (rows on the simplex; (n,) is P(y = 1) of a binary problem), or
        logits with ``input="logits"`` (see the module docstring).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    normalize : bool, default False
        Divide by the cross-entropy of the naive system that outputs the priors,
        ``-sum_i P_i log P_i`` (the prior entropy): the NCE of Ferrer & Ramos 2025, Sec. 2.3.2. Values
        above 1 mean the system is worse than that naive system.
    priors : array-like, shape (K,), optional
        Target class priors (Ferrer & Ramos 2025, App. A, Eq. 36): ``CE = -sum_t P_{h_t}/N_{h_t}
        log q_{h_t}``. Default: the empirical priors ``N_i / N`` (then Eq. 36 is Eq. 8).
        Must sum to 1; every class with a positive prior needs a sample.
    input : {"probs", "logits", "auto"}, default "probs"
        How to read ``probs`` (``"auto"`` infers it; ``"logits"`` refuses rows that
        are all probability vectors).

    Returns
    -------
    float
        CE in nats (natural log), ``>= 0``; or NCE (dimensionless).

    Raises
    ------
    TypeError
        Non-numeric arrays, non-bool ``normalize``.
    ValueError
        Invalid ``probs``/logits or ``labels`` (see :func:`kdecal.ece_kde`), bad
        ``priors`` (shape, negative, not summing to 1, prior > 0 for an absent class),
        unknown ``input``, or ``normalize=True`` with a zero normaliser (one class only).
    """
    L = log_probs(probs, input, "probs").L
    y = check_labels(labels, L.shape[0], L.shape[1])
    normalize = _check_bool(normalize, "normalize")
    return _log_loss(L, y, normalize, priors)


def _log_loss(
    L: np.ndarray, y: np.ndarray, normalize: bool = False, priors: object = None
) -> float:
    """:func:`log_loss` of validated log-probabilities ``L`` (n, K) and labels ``y``.

    ``priors`` (None or as given to :func:`log_loss`) is checked here, with the labels.
    """
    n, K = L.shape
    w, P = _class_weights(y, K, priors)
    value = _weighted_mean(-L[np.arange(n), y], w)
    if normalize:
        return _normalised(value, float(-np.sum(xlogy(P, P))), "cross-entropy", P)
    return value


def brier_score(
    probs: object,
    labels: object,
    *,
    normalize: bool = False,
    priors: object = None,
    convention: str = "sum",
    input: str = "probs",
) -> float:
    """Brier score ``mean_t sum_i (q_i(x_t) - 1[h_t = i])^2``, or NBS (Ferrer & Ramos 2025, Eq. 9).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors, or logits with ``input="logits"``.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    normalize : bool, default False
        Divide by the Brier score of the naive system that outputs the priors,
        ``sum_i P_i (1 - P_i)`` (``/ K`` under ``convention="mean"``): NBS, Ferrer & Ramos 2025
        Sec. 2.3.3. The normalised value does not depend on ``convention``.
    priors : array-like, shape (K,), optional
        Target class priors (Ferrer & Ramos 2025, App. A, Eq. 37); default the empirical ones.
    convention : {"sum", "mean"}, default "sum"
        "sum": the squared error summed over the K classes (range [0, 2]); "mean": Ferrer & Ramos's
        Eq. 9 with the factor 1/K (psrcal's ``Brier``), i.e. "sum" divided by K.
    input : {"probs", "logits", "auto"}, default "probs"
        How to read ``probs`` (``"auto"`` infers it; ``"logits"`` refuses rows that
        are all probability vectors).

    Returns
    -------
    float
        Brier score in squared probability units, or NBS (dimensionless).

    Raises
    ------
    TypeError, ValueError
        As :func:`log_loss`, and for an unknown ``convention``.
    """
    check_choice(convention, "convention", _CONVENTIONS)
    L = log_probs(probs, input, "probs").L
    y = check_labels(labels, L.shape[0], L.shape[1])
    normalize = _check_bool(normalize, "normalize")
    return _brier_score(L, y, normalize, priors, convention)


def _brier_score(
    L: np.ndarray,
    y: np.ndarray,
    normalize: bool = False,
    priors: object = None,
    convention: str = "sum",
) -> float:
    """:func:`brier_score` of validated log-probabilities ``L`` (n, K) and labels ``y``.

    ``convention`` is checked already; ``priors`` is checked here (see :func:`_log_loss`).
    """
    n, K = L.shape
    w, P = _class_weights(y, K, priors)
    d = np.exp(L)
    d[np.arange(n), y] -= 1.0
    per = np.sum(d * d, axis=1)
    div = float(K) if convention == "mean" else 1.0
    value = _weighted_mean(per, w) / div
    if normalize:
        return _normalised(value, float(1.0 - np.sum(P * P)) / div, "Brier score", P)
    return value


# ------------------------------------------------------------------ cost matrices


def cost_matrix_01(n_classes: int) -> np.ndarray:
    """Return the 0-1 cost matrix ``c_ij = 1 - delta_ij`` (Ferrer & Ramos 2025, Sec. 2.3.1; "C01" of Table 2).

    Its expected cost is the error rate; its Bayes decision is the argmax.

    Parameters
    ----------
    n_classes : int
        K >= 2.

    Returns
    -------
    ndarray, shape (K, K), float64
        Rows are true classes, columns decisions.

    Raises
    ------
    TypeError, ValueError
        ``n_classes`` not an integer >= 2.
    """
    K = check_int(n_classes, "n_classes", 2)
    return 1.0 - np.eye(K)


def cost_matrix_abstain(n_classes: int, abstain_cost: float = 0.1) -> np.ndarray:
    """0-1 costs plus an abstention decision of fixed cost (Ferrer & Ramos 2025, Table 2: "NRisk-01r", "Cab").

    Parameters
    ----------
    n_classes : int
        K >= 2.
    abstain_cost : float, default 0.1
        Cost of the extra last decision "abstain" for every true class; Ferrer & Ramos use 0.1
        (Fig. 5-6, Table 2). Finite and >= 0.

    Returns
    -------
    ndarray, shape (K, K + 1), float64
        ``[1 - I | abstain_cost * 1]``: column K is the abstention.

    Raises
    ------
    TypeError, ValueError
        ``n_classes`` not an integer >= 2; ``abstain_cost`` not a finite real >= 0.
    """
    K = check_int(n_classes, "n_classes", 2)
    if isinstance(abstain_cost, (bool, np.bool_)) or not isinstance(abstain_cost, numbers.Real):
        raise TypeError(f"abstain_cost must be a finite float >= 0, got {abstain_cost!r}")
    a = float(abstain_cost)
    if not np.isfinite(a) or a < 0:
        raise ValueError(f"abstain_cost must be a finite float >= 0, got {abstain_cost!r}")
    return np.concatenate([1.0 - np.eye(K), np.full((K, 1), a)], axis=1)


def cost_matrix_imbalanced(
    n_classes: int, cost: float = 10.0, costly_class: int = -1
) -> np.ndarray:
    """0-1 costs except that missing one class costs more (Ferrer & Ramos 2025, Table 2: "NRisk-imb", "Cimb").

    ``c_ij = 1`` for ``i != j``, ``c_ii = 0``, except the row of ``costly_class``:
    ``c_kj = cost`` for ``j != k``. Ferrer & Ramos's default is the last class with cost 10 (binary:
    ``c_12 = 1``, ``c_21 = 10``; Fig. 5-6, Table 2).

    Parameters
    ----------
    n_classes : int
        K >= 2.
    cost : float, default 10.0
        Cost of every error on a sample of ``costly_class``; finite and >= 0.
    costly_class : int, default -1
        Row with the higher cost (Python indexing; -1 is the last class).

    Returns
    -------
    ndarray, shape (K, K), float64

    Raises
    ------
    TypeError, ValueError
        ``n_classes`` not an integer >= 2, ``cost`` not finite/>= 0, ``costly_class``
        not an integer in ``-K..K-1``.
    """
    K = check_int(n_classes, "n_classes", 2)
    if isinstance(cost, (bool, np.bool_)) or not isinstance(cost, numbers.Real):
        raise TypeError(f"cost must be a finite float >= 0, got {cost!r}")
    c = float(cost)
    if not np.isfinite(c) or c < 0:
        raise ValueError(f"cost must be a finite float >= 0, got {cost!r}")
    if isinstance(costly_class, (bool, np.bool_)) or not isinstance(
        costly_class, numbers.Integral
    ):
        raise TypeError(f"costly_class must be an integer, got {costly_class!r}")
    if not -K <= int(costly_class) < K:
        raise ValueError(f"costly_class must lie in {-K}..{K - 1}, got {costly_class!r}")
    C = 1.0 - np.eye(K)
    k = int(costly_class) % K
    C[k] *= c
    return C


# ------------------------------------------------------------ expected cost, Bayes risk


def bayes_decisions(
    probs: object, cost_matrix: object = None, *, input: str = "probs"
) -> np.ndarray:
    """Bayes decisions ``argmin_j sum_i C[i, j] q_i`` (Ferrer & Ramos 2025, Eq. 1 and 22).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors (renormalised), or logits with ``input="logits"``.
    cost_matrix : array-like, shape (K, M), optional
        ``C[i, j]``: cost of decision j for true class i. Default: 0-1 costs (argmax).
    input : {"probs", "logits", "auto"}, default "probs"
        How to read ``probs`` (``"auto"`` infers it; ``"logits"`` refuses rows that
        are all probability vectors).

    Returns
    -------
    ndarray, shape (n,), int64
        Decisions in ``0..M-1``; ties go to the lowest index (Ferrer & Ramos 2025, footnote 2 allows any
        tie-breaker).

    Raises
    ------
    TypeError, ValueError
        Invalid ``probs``, ``cost_matrix`` of the wrong shape (rows != K) or non-finite.
    """
    q = np.exp(log_probs(probs, input, "probs").L)
    K = q.shape[1]
    C = cost_matrix_01(K) if cost_matrix is None else _check_cost_matrix(cost_matrix, K)
    return np.ascontiguousarray(np.argmin(q @ C, axis=1), dtype=np.int64)


def expected_cost(
    labels: object,
    decisions: object,
    cost_matrix: object,
    *,
    normalize: bool = False,
    priors: object = None,
) -> float:
    """Compute the expected cost ``EC = sum_ij c_ij P_i R_ij`` of decisions (Ferrer & Ramos 2025, Eq. 7).

    ``R_ij = N_ij / N_i`` is the fraction of class-i samples given decision j. With the
    empirical priors this is the average cost ``mean_t C[h_t, d_t]``; with 0-1 costs it
    is the error rate.

    Parameters
    ----------
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    decisions : array-like, shape (n,), int
        Decisions in ``0..M-1`` (they need not be Bayes decisions).
    cost_matrix : array-like, shape (K, M)
        ``C[i, j]``: cost of decision j for true class i (e.g. :func:`cost_matrix_01`).
    normalize : bool, default False
        Divide by the cost of the naive system that always takes the least costly
        decision, ``min_j sum_i C[i, j] P_i`` (NEC; Ferrer & Ramos 2025, Eq. 7 and below).
    priors : array-like, shape (K,), optional
        Target priors ``P_i`` (Ferrer & Ramos 2025, Sec. 2.3.1: EC written with ``P_i``, App. A); default
        the empirical ones. Also used in the normaliser.

    Returns
    -------
    float
        EC in the units of the costs, or NEC (dimensionless).

    Raises
    ------
    TypeError
        Non-numeric arrays, non-bool ``normalize``.
    ValueError
        ``cost_matrix`` not (K, M) with K >= 2 or non-finite; labels or decisions not
        integers in range or of different lengths; bad ``priors``; a naive cost <= 0
        with ``normalize=True``.
    """
    C = _check_cost_matrix(cost_matrix)
    K, M = C.shape
    y = _check_index_vector(labels, "labels", K, "rows of cost_matrix", None)
    d = _check_index_vector(decisions, "decisions", M, "columns of cost_matrix", y.shape[0])
    normalize = _check_bool(normalize, "normalize")
    return _expected_cost(y, d, C, normalize, priors)


def _expected_cost(
    y: np.ndarray, d: np.ndarray, C: np.ndarray, normalize: bool, priors: object
) -> float:
    """:func:`expected_cost` of validated labels, decisions and cost matrix."""
    w, P = _class_weights(y, C.shape[0], priors)
    value = _weighted_mean(C[y, d], w)
    if normalize:
        return _normalised(value, float(np.min(P @ C)), "expected cost", P)
    return value


def bayes_risk(
    probs: object,
    labels: object,
    cost_matrix: object = None,
    *,
    normalize: bool = False,
    priors: object = None,
    input: str = "probs",
) -> float:
    """Bayes risk: the expected cost of the Bayes decisions (Ferrer & Ramos 2025, Sec. 2.3.1), or NRisk.

    ``expected_cost(labels, bayes_decisions(probs, cost_matrix), cost_matrix)``. An EPSR,
    proper but not strict. With the default 0-1 costs it is the argmax error rate.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors, or logits with ``input="logits"``.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    cost_matrix : array-like, shape (K, M), optional
        Default :func:`cost_matrix_01`.
    normalize : bool, default False
        NRisk: divide by ``min_j sum_i C[i, j] P_i`` (Ferrer & Ramos 2025, Fig. 5-6, Table 2).
    priors : array-like, shape (K,), optional
        Target priors (see :func:`expected_cost`). They weight the costs only; the
        decisions use ``probs`` as given.
    input : {"probs", "logits", "auto"}, default "probs"
        How to read ``probs`` (``"auto"`` infers it; ``"logits"`` refuses rows that
        are all probability vectors).

    Returns
    -------
    float
        Risk in cost units, or NRisk.

    Raises
    ------
    TypeError, ValueError
        As :func:`bayes_decisions` and :func:`expected_cost`.
    """
    L = log_probs(probs, input, "probs").L
    n, K = L.shape
    y = check_labels(labels, n, K)
    C = cost_matrix_01(K) if cost_matrix is None else _check_cost_matrix(cost_matrix, K)
    d = np.argmin(np.exp(L) @ C, axis=1)
    normalize = _check_bool(normalize, "normalize")
    return _expected_cost(y, d, C, normalize, priors)


# ------------------------------------------------------------------ calibration loss


def _make_calibrator(calibrator: object, input: str) -> Callable[[], Any]:
    """Return a factory of fresh, unfitted calibrators."""
    if isinstance(calibrator, str):
        if calibrator not in _CALIBRATORS:
            raise ValueError(
                f"calibrator must be one of {list(_CALIBRATORS)} or a calibrator instance, "
                f"got {calibrator!r}"
            )
        cls = getattr(recalibration, _CALIBRATORS[calibrator])
        return lambda: cls(input=input)
    if not (
        callable(getattr(calibrator, "fit", None))
        and callable(getattr(calibrator, "transform", None))
    ):
        raise TypeError(
            "calibrator must be a name or an object with fit(scores, labels) and "
            f"transform(scores), got {type(calibrator).__name__}"
        )
    own = getattr(calibrator, "input", None)
    if isinstance(own, str) and own not in ("auto", input):
        raise ValueError(
            f"calibrator.input is {own!r} but the scores are {input} (input resolved to "
            f"{input!r}); they must agree"
        )
    return lambda: copy.deepcopy(calibrator)


def _scores_array(x: object, input: str, name: str, min_n: int = 1) -> tuple[np.ndarray, LogProbs]:
    """Validate scores; return them as the calibrators take them, shape (n, K), and ``lp``.

    Probabilities are returned as ``exp(log q)`` of the validated values, logits as given
    (float64; a 1-D array of log-odds ``t`` as the two columns ``(0, t)``); ``lp`` is
    what :func:`log_probs` read (``lp.kind``: which of the two).
    """
    arr = _numeric_array(x, name)
    lp = log_probs(arr, input, name, min_n=min_n)
    if lp.kind == "probs":
        return np.exp(lp.L), lp
    z = np.asarray(arr, dtype=np.float64)
    if z.ndim == 1:
        z = np.stack([np.zeros_like(z), z], axis=1)
    return z, lp


def _fit_transform(
    cal: Any, X_fit: np.ndarray, y_fit: np.ndarray, X_new: np.ndarray, kind: str
) -> tuple[np.ndarray, bool]:
    """Fit a fresh calibrator on validated rows and transform others.

    Returns the calibrated scores and whether a kdecal calibrator made them (then they
    are valid probabilities, and the rows were not validated again); any other object
    gets its own ``fit`` and ``transform`` called.
    """
    if isinstance(cal, recalibration._Calibrator) and cal._own_fit_transform():
        return cal._fit_validated(X_fit, y_fit, kind)._transform_validated(X_new), True
    cal.fit(X_fit, y_fit)
    return np.asarray(cal.transform(X_new), dtype=np.float64), False


def calibrate_scores(
    scores: object,
    labels: object,
    *,
    calibrator: object = "affine",
    mode: str = "xv",
    n_folds: int = 5,
    seed: object = 0,
    input: str = "auto",
    val: tuple[object, object] | None = None,
    stratified: bool = True,
    groups: object = None,
) -> np.ndarray:
    """Calibrated scores ``s_t`` of every test sample, as :func:`calibration_loss` uses them.

    Parameters
    ----------
    scores, labels, calibrator, mode, n_folds, seed, input, val, stratified, groups
        As in :func:`calibration_loss`.

    Returns
    -------
    ndarray, shape (n, K), float64
        Calibrated probabilities ``s_t`` (rows on the simplex; entries may be exactly 0
        or 1 for isotonic and histogram calibration) as the calibrator's ``transform``
        returned them; with ``mode="xv"`` each from the calibrator fitted on the other
        folds.  Probabilities are read as every scoring function reads them, clipped at
        ``kdecal.tolerances.PROB_EPS = 1e-12`` and renormalised, where a calibrator's
        own ``fit`` reads them as given (an exact 0 as an underflow): on probabilities
        with entries below 1e-12 the two differ slightly (temperature scaling of
        cifar100_densenetbc100_netcal: T = 2.1165 here, 2.1176 from ``fit``), and on
        rounded probabilities with exact zeros, which ``fit`` warns of, by much more.

    Raises
    ------
    TypeError, ValueError
        See :func:`calibration_loss`.
    """
    check_choice(mode, "mode", _MODES)
    check_choice(input, "input", _INPUTS)
    X, lp = _scores_array(scores, input, "scores")
    y = check_labels(labels, X.shape[0], X.shape[1])
    S, _ = _calibrate(X, lp.kind, y, calibrator, mode, n_folds, seed, val, stratified, groups)
    return S


def _calibrate(
    X: np.ndarray,
    kind: str,
    y: np.ndarray,
    calibrator: object,
    mode: str,
    n_folds: object,
    seed: object,
    val: tuple[object, object] | None,
    stratified: object,
    groups: object,
) -> tuple[np.ndarray, bool]:
    """:func:`calibrate_scores` of validated scores and labels (``mode`` checked).

    ``X`` and ``kind`` as :func:`_scores_array` returns them, ``y`` validated labels.
    Returns the calibrated scores and whether kdecal calibrators made them (see
    :func:`_fit_transform`).
    """
    n, K = X.shape
    n_folds = check_int(n_folds, "n_folds", 2)
    stratified = _check_bool(stratified, "stratified")
    new = _make_calibrator(calibrator, kind)
    if mode == "heldout":
        if val is None:
            raise ValueError("mode='heldout' needs val=(scores, labels) to fit the calibrator on")
        if not (isinstance(val, (tuple, list)) and len(val) == 2):
            raise TypeError("val must be a pair (scores, labels)")
        Xv, _ = _scores_array(val[0], kind, "val scores")
        if Xv.shape[1] != K:
            raise ValueError(f"val scores have K = {Xv.shape[1]} classes but scores have K = {K}")
        yv = check_labels(val[1], Xv.shape[0], K, name="val labels")
        return _fit_transform(new(), Xv, yv, X, kind)
    if val is not None:
        raise ValueError(f"val is only used with mode='heldout', got mode={mode!r}")
    if mode == "tt":
        return _fit_transform(new(), X, y, X, kind)
    folds = _cv_folds(y, n_folds, seed, stratified, groups)
    out: np.ndarray | None = None
    own = True
    for k in range(n_folds):
        test = folds == k
        if not np.any(test):
            continue
        s, own_k = _fit_transform(new(), X[~test], y[~test], X[test], kind)
        own = own and own_k
        if out is None:
            out = np.empty((n,) + s.shape[1:], dtype=np.float64)
        out[test] = s
    assert out is not None
    return out, own


def calibration_loss(
    probs_or_logits: object,
    labels: object,
    *,
    metric: str | Callable[..., float] = "log_loss",
    calibrator: object = "affine",
    mode: str = "xv",
    n_folds: int = 5,
    seed: object = 0,
    relative: bool = True,
    input: str = "auto",
    val: tuple[object, object] | None = None,
    stratified: bool = True,
    groups: object = None,
) -> float:
    """Calibration loss: the EPSR before minus after a calibrator (Ferrer & Ramos 2025, Sec. 2.5.3, Eq. 30-33).

    ``CalLoss = EPSR_raw - EPSR_cal`` with both EPSRs empirical averages over the same
    test samples and labels, ``EPSR_cal`` computed on the calibrated scores ``s_t``;
    ``RCL = 100 (EPSR_raw - EPSR_cal) / EPSR_raw``, the percentage of the EPSR that the
    calibrator removes (invariant to normalising the EPSR). Ferrer & Ramos's recommended diagnostic
    is RCL-CE with affine ("DP") calibration trained by 5-fold stratified
    cross-validation on the test data (the defaults here), or on held-out data.

    It can be negative when an xv- or held-out-trained calibrator hurts. With
    ``mode="tt"``, a family containing the identity and the calibrator's own training
    loss as ``metric`` (affine or temperature with log loss; isotonic with any EPSR) it
    is ``>= 0`` up to the optimiser's tolerance.

    Parameters
    ----------
    probs_or_logits : array-like, shape (n, K) or (n,), float
        Test scores: logits / log-probabilities ((n,) = binary log-odds) or
        probabilities ((n,) = P(y = 1)); see ``input``.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    metric : {"log_loss", "brier_score"} or callable, default "log_loss"
        The EPSR. "log_loss": :func:`log_loss` (nats), "brier_score": :func:`brier_score`
        (sum convention; RCL does not depend on it). The raw EPSR uses the scores as
        given (``input``); the calibrated one the probabilities the calibrator returns,
        clipped to ``kdecal.tolerances.PROB_EPS`` (so the exact zeros of isotonic / histogram
        calibration give a large but finite log loss, where Ferrer & Ramos's code gives inf). A
        callable is called as ``metric(probs, labels) -> float`` with probabilities
        (n, K), e.g. ``functools.partial(bayes_risk, cost_matrix=C)``.
    calibrator : str or object, default "affine"
        A name -- "affine" (DP: ``softmax(alpha z + beta)``, Ferrer & Ramos 2025, Eq. 23), "temperature",
        "vector", "isotonic", "histogram" -- of a :mod:`kdecal.recalibration` class, built
        with ``input=input``; or an unfitted object with ``fit(scores, labels)`` and
        ``transform(scores)``, deep-copied before every fit.
    mode : {"xv", "tt", "heldout"}, default "xv"
        "xv": ``n_folds``-fold cross-validation on the test data, each fold transformed
        by a calibrator fitted on the others (Ferrer & Ramos 2025, Sec. 3.4 "xv"); "tt": fit and transform
        on the whole test set (optimistic; "tt" of Ferrer & Ramos 2025, Sec. 3.4); "heldout": fit on ``val``.
    n_folds : int, default 5
        Number of folds, ``>= 2`` ("xv" only).
    seed : int, None or numpy.random.RandomState, default 0
        Fold shuffling (see :func:`cv_folds`). An int gives exactly the folds of
        scikit-learn's ``StratifiedKFold(n_folds, shuffle=True, random_state=seed)``
        (``KFold`` with ``stratified=False``), which Ferrer & Ramos use with seed 0 on real data; a
        RandomState is used (and advanced) as is.
    relative : bool, default True
        Return RCL in percent (NaN when ``EPSR_raw <= 0``); else the absolute CalLoss in
        the metric's units (nats for log loss).
    input : {"auto", "logits", "probs"}, default "auto"
        How to read the scores (and ``val``'s, which must be of the same kind):
        ``"auto"`` infers it (entries outside [0, 1]: logits; entries in [0, 1] with rows
        summing to 1 within 0.02: probabilities; anything in between raises a
        ``ValueError`` naming both choices); ``"logits"`` refuses rows that are all
        probability vectors (it names ``input='probs'``). See
        ``kdecal._validation.resolve_input``.
    val : (scores, labels), optional
        Held-out calibration data for ``mode="heldout"`` (not allowed otherwise).
    stratified : bool, default True
        Stratify the folds by class (Ferrer & Ramos's default).
    groups : array-like, shape (n,), optional
        Group ids for "xv": all samples of a group fall in the same fold (stratified by
        the label of the group's first sample). :func:`bootstrap_ci` passes the original
        sample indices here so that copies of a sample never straddle folds (Ferrer & Ramos 2025, App. E).
        Ignored by "tt" and "heldout".

    Returns
    -------
    float
        RCL in percent, or CalLoss in metric units.

    Raises
    ------
    TypeError
        Non-numeric arrays; non-bool ``relative``/``stratified``; non-integer
        ``n_folds``; a calibrator object without ``fit``/``transform``; bad ``seed``.
    ValueError
        Invalid scores or labels; unknown ``metric``, ``calibrator``, ``mode`` or
        ``input``; ``n_folds < 2`` or larger than every class count (stratified), the
        sample or the group count; ``val`` missing for "heldout" or given otherwise;
        ``calibrator.input`` different from ``input``.
    """
    relative = _check_bool(relative, "relative")
    check_choice(input, "input", _INPUTS)
    if isinstance(metric, str):
        check_choice(metric, "metric", _METRICS)
    elif not callable(metric):
        raise TypeError(f"metric must be 'log_loss', 'brier_score' or a callable, got {metric!r}")

    def epsr(L: np.ndarray, y: np.ndarray) -> float:
        """Return the EPSR of validated log-probabilities."""
        if not isinstance(metric, str):
            return float(metric(np.exp(L), y))
        return _log_loss(L, y) if metric == "log_loss" else _brier_score(L, y)

    X, lp = _scores_array(probs_or_logits, input, "probs_or_logits")
    y = check_labels(labels, X.shape[0], X.shape[1])
    check_choice(mode, "mode", _MODES)
    S, own = _calibrate(X, lp.kind, y, calibrator, mode, n_folds, seed, val, stratified, groups)
    # the EPSR of the scores as the calibrators saw them: logits' log-probabilities, and
    # probabilities X = exp(log q) read as every probability is (clipped to PROB_EPS
    # and renormalised); then the same of the calibrated probabilities
    before = epsr(lp.L if lp.kind == "logits" else np.log(clip_renormalise(X)), y)
    if own:  # kdecal's calibrators return valid probabilities
        after = epsr(np.log(clip_renormalise(S)), y)
    elif isinstance(metric, str):  # another calibrator's output is checked as input
        after = (log_loss if metric == "log_loss" else brier_score)(S, y, input="probs")
    else:
        after = float(metric(np.exp(log_probs(S, "probs", "scores").L), y))
    if not relative:
        return before - after
    if not (np.isfinite(before) and before > 0):
        return float("nan")
    return 100.0 * (before - after) / before
