"""Proper scoring rules, Bayes risk, calibration loss and bootstrap intervals.

The evaluation framework of Ferrer & Ramos (004): the quality of posteriors is measured
by expected proper scoring rules (EPSRs) -- the cross-entropy (log loss), the Brier
score and the Bayes risk of a cost matrix -- preferably normalised by the EPSR of the
best naive system; calibration is diagnosed by the *calibration loss*, the part of the
EPSR that a calibrator removes.

Conventions
-----------
- **Inputs.** ``probs`` as everywhere in kdecal: shape (n, K) rows on the simplex, or
  (n,) holding P(y = 1) of a binary problem; probabilities are clipped to
  ``kdecal.PROB_EPS = 1e-12`` and renormalised (so one sample adds at most
  ``-log(1e-12) = 27.6`` nats to the log loss). ``input="logits"`` takes unnormalised
  log-probabilities instead (log-softmax applied; (n,) means the log-odds of class 1)
  and keeps the full precision of very small posteriors, as 004's code does with
  log-posteriors. ``labels`` are integers in ``0..K-1``.
- **Priors.** ``priors=None`` uses the empirical test priors ``P_i = N_i / N``.
  Given ``priors`` (004 App. A, Eq. 36-37), each sample of class ``h`` is weighted by
  ``P_h / (N_h / N)``: the EPSR is ``sum_h P_h * (mean loss over the class-h samples)``,
  which equals the plain average when ``priors`` are the empirical ones.
- **Naive system.** ``normalize=True`` divides by the same EPSR of the best naive
  system, the one that outputs the priors for every sample (004 Sec. 2.3.2, citing
  Brümmer 2010, Sec. 2.4.1: "the prior distribution in the test data"): the empirical
  test priors, or ``priors`` when given (the code of 004 does the same). This gives
  NCE (normaliser ``-sum_i P_i log P_i``), NBS (``sum_i P_i (1 - P_i)``, divided by K
  under ``convention="mean"``) and NRisk / NEC (``min_j sum_i c_ij P_i``, the cost of
  always taking the least costly decision, 004 Eq. 7 and below). The naive system
  therefore scores exactly 1.
- **Brier.** ``convention="sum"`` (default): ``sum_i (q_i - y_i)^2`` per sample, in
  [0, 2] (Brier 1950). ``convention="mean"``: 004 Eq. 9, the same divided by K (in
  [0, 1] for K = 2: ``(1 - q_h)^2``). Normalised values are equal.
- **Cost matrices** are (K, M) arrays ``C[i, j]`` = cost of decision j when the true
  class is i; M may exceed K (e.g. an abstention column). Bayes decisions are
  ``argmin_j sum_i C[i, j] q_i`` (004 Eq. 1, 22), ties to the lowest index.

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
import inspect
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from scipy.special import logsumexp, xlogy

from ._validation import (
    ROW_SUM_ATOL,
    _numeric_array,
    check_choice,
    check_int,
    check_labels,
    check_probs,
)

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

_INPUTS = ("probs", "logits")
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


def _check_bool(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _log_probs(x: object, input: str, name: str, min_n: int = 1) -> np.ndarray:
    """Validate scores; return natural-log probabilities (n, K), float64, rows lse to 0."""
    check_choice(input, "input", _INPUTS)
    if input == "probs":
        return np.log(check_probs(x, name, min_n=min_n).p)
    z = _numeric_array(x, name).astype(np.float64)
    if z.size == 0:
        raise ValueError(f"{name} is empty (shape {z.shape})")
    if z.ndim == 1:  # binary log-odds of class 1
        z = np.stack([np.zeros_like(z), z], axis=1)
    elif z.ndim != 2:
        raise ValueError(f"{name} must have shape (n, K) or (n,), got shape {z.shape}")
    elif z.shape[1] == 1:
        raise ValueError(
            f"{name} has shape {z.shape}: K = 1 class is not a classification problem; "
            "pass a 1-D array of log-odds for binary problems"
        )
    if not np.all(np.isfinite(z)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(z))[0])
        raise ValueError(f"{name} contains a non-finite value {z[idx]!r} at index {idx}")
    if z.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {z.shape[0]}")
    return z - logsumexp(z, axis=1, keepdims=True)


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
            f"priors gives class {k} the prior {P[k]!r} but labels has no sample of class "
            f"{k}: the prior-weighted average (004 App. A) needs at least one"
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
            f"priors {np.round(P, 6).tolist()}, which is {naive!r}; it must be > 0 (a "
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
        raise ValueError(f"cost_matrix contains a non-finite value {C[idx]!r} at index {idx}")
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
            raise ValueError(f"{name} must be integers in 0..{upper - 1}, got {arr[i]!r} at {i}")
    out = arr.astype(np.int64)
    bad = (out < 0) | (out >= upper)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"{name} must lie in 0..{upper - 1} ({upper} = {what}), got {out[i]!r} at index {i}"
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
    """Cross-entropy (log loss) ``CE = -mean_t log q_{h_t}(x_t)``, or NCE (004 Eq. 8).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors (rows on the simplex; (n,) is P(y = 1) of a binary problem), or
        logits with ``input="logits"`` (see the module docstring).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    normalize : bool, default False
        Divide by the cross-entropy of the naive system that outputs the priors,
        ``-sum_i P_i log P_i`` (the prior entropy): the NCE of 004 Sec. 2.3.2. Values
        above 1 mean the system is worse than that naive system.
    priors : array-like, shape (K,), optional
        Target class priors (004 App. A, Eq. 36): ``CE = -sum_t P_{h_t}/N_{h_t}
        log q_{h_t}``. Default: the empirical priors ``N_i / N`` (then Eq. 36 is Eq. 8).
        Must sum to 1; every class with a positive prior needs a sample.
    input : {"probs", "logits"}, default "probs"
        How to read ``probs``.

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
    logp = _log_probs(probs, input, "probs")
    n, K = logp.shape
    y = check_labels(labels, n, K)
    normalize = _check_bool(normalize, "normalize")
    w, P = _class_weights(y, K, priors)
    value = _weighted_mean(-logp[np.arange(n), y], w)
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
    """Brier score ``mean_t sum_i (q_i(x_t) - 1[h_t = i])^2``, or NBS (004 Eq. 9).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors, or logits with ``input="logits"``.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    normalize : bool, default False
        Divide by the Brier score of the naive system that outputs the priors,
        ``sum_i P_i (1 - P_i)`` (``/ K`` under ``convention="mean"``): NBS, 004
        Sec. 2.3.3. The normalised value does not depend on ``convention``.
    priors : array-like, shape (K,), optional
        Target class priors (004 App. A, Eq. 37); default the empirical ones.
    convention : {"sum", "mean"}, default "sum"
        "sum": the squared error summed over the K classes (range [0, 2]); "mean": 004's
        Eq. 9 with the factor 1/K (psrcal's ``Brier``), i.e. "sum" divided by K.
    input : {"probs", "logits"}, default "probs"
        How to read ``probs``.

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
    logp = _log_probs(probs, input, "probs")
    n, K = logp.shape
    y = check_labels(labels, n, K)
    normalize = _check_bool(normalize, "normalize")
    w, P = _class_weights(y, K, priors)
    d = np.exp(logp)
    d[np.arange(n), y] -= 1.0
    per = np.sum(d * d, axis=1)
    div = float(K) if convention == "mean" else 1.0
    value = _weighted_mean(per, w) / div
    if normalize:
        return _normalised(value, float(1.0 - np.sum(P * P)) / div, "Brier score", P)
    return value


# ------------------------------------------------------------------ cost matrices


def cost_matrix_01(n_classes: int) -> np.ndarray:
    """Return the 0-1 cost matrix ``c_ij = 1 - delta_ij`` (004 Sec. 2.3.1; "C01" of Table 2).

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
    """0-1 costs plus an abstention decision of fixed cost (004 "NRisk-01r", "Cab").

    Parameters
    ----------
    n_classes : int
        K >= 2.
    abstain_cost : float, default 0.1
        Cost of the extra last decision "abstain" for every true class; 004 uses 0.1
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
    """0-1 costs except that missing one class costs more (004 "NRisk-imb", "Cimb").

    ``c_ij = 1`` for ``i != j``, ``c_ii = 0``, except the row of ``costly_class``:
    ``c_kj = cost`` for ``j != k``. 004's default is the last class with cost 10 (binary:
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
    """Bayes decisions ``argmin_j sum_i C[i, j] q_i`` (004 Eq. 1 and 22).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Posteriors (renormalised), or logits with ``input="logits"``.
    cost_matrix : array-like, shape (K, M), optional
        ``C[i, j]``: cost of decision j for true class i. Default: 0-1 costs (argmax).
    input : {"probs", "logits"}, default "probs"
        How to read ``probs``.

    Returns
    -------
    ndarray, shape (n,), int64
        Decisions in ``0..M-1``; ties go to the lowest index (004 footnote 2 allows any
        tie-breaker).

    Raises
    ------
    TypeError, ValueError
        Invalid ``probs``, ``cost_matrix`` of the wrong shape (rows != K) or non-finite.
    """
    q = np.exp(_log_probs(probs, input, "probs"))
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
    """Compute the expected cost ``EC = sum_ij c_ij P_i R_ij`` of decisions (004 Eq. 7).

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
        decision, ``min_j sum_i C[i, j] P_i`` (NEC; 004 Eq. 7 and below).
    priors : array-like, shape (K,), optional
        Target priors ``P_i`` (004 Sec. 2.3.1: EC written with ``P_i``, App. A); default
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
    w, P = _class_weights(y, K, priors)
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
    """Bayes risk: the expected cost of the Bayes decisions (004 Sec. 2.3.1), or NRisk.

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
        NRisk: divide by ``min_j sum_i C[i, j] P_i`` (004 Fig. 5-6, Table 2).
    priors : array-like, shape (K,), optional
        Target priors (see :func:`expected_cost`). They weight the costs only; the
        decisions use ``probs`` as given.
    input : {"probs", "logits"}, default "probs"
        How to read ``probs``.

    Returns
    -------
    float
        Risk in cost units, or NRisk.

    Raises
    ------
    TypeError, ValueError
        As :func:`bayes_decisions` and :func:`expected_cost`.
    """
    logp = _log_probs(probs, input, "probs")
    n, K = logp.shape
    y = check_labels(labels, n, K)
    C = cost_matrix_01(K) if cost_matrix is None else _check_cost_matrix(cost_matrix, K)
    d = np.argmin(np.exp(logp) @ C, axis=1)
    return expected_cost(y, d, C, normalize=normalize, priors=priors)


# ------------------------------------------------------------------ calibration loss


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
    ``random_state=seed``, 004's ``calibration_with_crossval``).
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
    """Cross-validation fold of every sample, as 004's ``calibration_with_crossval`` draws them.

    ``stratified=True`` reproduces scikit-learn's
    ``StratifiedKFold(n_folds, shuffle=True, random_state=seed)`` exactly (the allocation
    of scikit-learn >= 0.22: per-class fold counts by a round robin over the sorted
    labels, each class's block of fold indices shuffled by ``RandomState(seed)``), and
    ``stratified=False`` ``KFold(n_folds, shuffle=True, random_state=seed)``; 004 uses the
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
        ``make_gaussian_posteriors(..., rng=state)``, as the synthetic experiments of 004
        did with numpy's global state).
    stratified : bool, default True
        Stratify by ``labels``.
    groups : array-like, shape (n,), optional
        Group ids: the folds are drawn over the distinct groups (sorted), each
        stratified by the label of its first sample, so that a group never straddles
        folds (004 App. E: bootstrap copies of one sample).

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


def _make_calibrator(calibrator: object, input: str) -> Callable[[], Any]:
    """Return a factory of fresh, unfitted calibrators."""
    if isinstance(calibrator, str):
        if calibrator not in _CALIBRATORS:
            raise ValueError(
                f"calibrator must be one of {list(_CALIBRATORS)} or a calibrator instance, "
                f"got {calibrator!r}"
            )
        from . import recalibration

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
    if isinstance(own, str) and own != input:
        raise ValueError(f"calibrator.input is {own!r} but input={input!r}; they must agree")
    return lambda: copy.deepcopy(calibrator)


def _scores_array(x: object, input: str, name: str, min_n: int = 1) -> np.ndarray:
    """Validate scores; return them as the calibrators take them, shape (n, K)."""
    logp = _log_probs(x, input, name, min_n=min_n)
    return np.exp(logp) if input == "probs" else logp


def calibrate_scores(
    scores: object,
    labels: object,
    *,
    calibrator: object = "affine",
    mode: str = "xv",
    n_folds: int = 5,
    seed: object = 0,
    input: str = "logits",
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
        folds.

    Raises
    ------
    TypeError, ValueError
        See :func:`calibration_loss`.
    """
    check_choice(mode, "mode", _MODES)
    X = _scores_array(scores, input, "scores")
    n, K = X.shape
    y = check_labels(labels, n, K)
    n_folds = check_int(n_folds, "n_folds", 2)
    stratified = _check_bool(stratified, "stratified")
    new = _make_calibrator(calibrator, input)
    if mode == "heldout":
        if val is None:
            raise ValueError("mode='heldout' needs val=(scores, labels) to fit the calibrator on")
        if not (isinstance(val, (tuple, list)) and len(val) == 2):
            raise TypeError("val must be a pair (scores, labels)")
        Xv = _scores_array(val[0], input, "val scores")
        if Xv.shape[1] != K:
            raise ValueError(f"val scores have K = {Xv.shape[1]} classes but scores have K = {K}")
        yv = check_labels(val[1], Xv.shape[0], K, name="val labels")
        cal = new()
        cal.fit(Xv, yv)
        return np.asarray(cal.transform(X), dtype=np.float64)
    if val is not None:
        raise ValueError(f"val is only used with mode='heldout', got mode={mode!r}")
    if mode == "tt":
        cal = new()
        cal.fit(X, y)
        return np.asarray(cal.transform(X), dtype=np.float64)
    folds = cv_folds(y, n_folds=n_folds, seed=seed, stratified=stratified, groups=groups)
    out: np.ndarray | None = None
    for k in range(n_folds):
        test = folds == k
        if not np.any(test):
            continue
        cal = new()
        cal.fit(X[~test], y[~test])
        s = np.asarray(cal.transform(X[test]), dtype=np.float64)
        if out is None:
            out = np.empty((n,) + s.shape[1:], dtype=np.float64)
        out[test] = s
    assert out is not None
    return out


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
    input: str = "logits",
    val: tuple[object, object] | None = None,
    stratified: bool = True,
    groups: object = None,
) -> float:
    """Calibration loss: the EPSR before minus after a calibrator (004 Sec. 2.5.3, Eq. 30-33).

    ``CalLoss = EPSR_raw - EPSR_cal`` with both EPSRs empirical averages over the same
    test samples and labels, ``EPSR_cal`` computed on the calibrated scores ``s_t``;
    ``RCL = 100 (EPSR_raw - EPSR_cal) / EPSR_raw``, the percentage of the EPSR that the
    calibrator removes (invariant to normalising the EPSR). 004's recommended diagnostic
    is RCL-CE with affine ("DP") calibration trained by 5-fold stratified
    cross-validation on the test data (the defaults here), or on held-out data.

    It can be negative when an xv- or held-out-trained calibrator hurts. With
    ``mode="tt"``, a family containing the identity and the calibrator's own training
    loss as ``metric`` (affine or temperature with log loss; isotonic with any EPSR) it
    is ``>= 0`` up to the optimiser's tolerance.

    Parameters
    ----------
    probs_or_logits : array-like, shape (n, K) or (n,), float
        Test scores: logits / log-probabilities (``input="logits"``; (n,) = binary
        log-odds) or probabilities (``input="probs"``; (n,) = P(y = 1)).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    metric : {"log_loss", "brier_score"} or callable, default "log_loss"
        The EPSR. "log_loss": :func:`log_loss` (nats), "brier_score": :func:`brier_score`
        (sum convention; RCL does not depend on it). The raw EPSR uses the scores as
        given (``input``); the calibrated one the probabilities the calibrator returns,
        clipped to ``kdecal.PROB_EPS`` (so the exact zeros of isotonic / histogram
        calibration give a large but finite log loss, where 004's code gives inf). A
        callable is called as ``metric(probs, labels) -> float`` with probabilities
        (n, K), e.g. ``functools.partial(bayes_risk, cost_matrix=C)``.
    calibrator : str or object, default "affine"
        A name -- "affine" (DP: ``softmax(alpha z + beta)``, 004 Eq. 23), "temperature",
        "vector", "isotonic", "histogram" -- of a :mod:`kdecal.recalibration` class, built
        with ``input=input``; or an unfitted object with ``fit(scores, labels)`` and
        ``transform(scores)``, deep-copied before every fit.
    mode : {"xv", "tt", "heldout"}, default "xv"
        "xv": ``n_folds``-fold cross-validation on the test data, each fold transformed
        by a calibrator fitted on the others (004 Sec. 3.4 "xv"); "tt": fit and transform
        on the whole test set (optimistic, 004 "tt"); "heldout": fit on ``val``.
    n_folds : int, default 5
        Number of folds, ``>= 2`` ("xv" only).
    seed : int, None or numpy.random.RandomState, default 0
        Fold shuffling (see :func:`cv_folds`). An int gives exactly the folds of
        scikit-learn's ``StratifiedKFold(n_folds, shuffle=True, random_state=seed)``
        (``KFold`` with ``stratified=False``), which 004 uses with seed 0 on real data; a
        RandomState is used (and advanced) as is.
    relative : bool, default True
        Return RCL in percent (NaN when ``EPSR_raw <= 0``); else the absolute CalLoss in
        the metric's units (nats for log loss).
    input : {"logits", "probs"}, default "logits"
        How to read the scores (and ``val``'s).
    val : (scores, labels), optional
        Held-out calibration data for ``mode="heldout"`` (not allowed otherwise).
    stratified : bool, default True
        Stratify the folds by class (004's default).
    groups : array-like, shape (n,), optional
        Group ids for "xv": all samples of a group fall in the same fold (stratified by
        the label of the group's first sample). :func:`bootstrap_ci` passes the original
        sample indices here so that copies of a sample never straddle folds (004 App. E).
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
        fn = log_loss if metric == "log_loss" else brier_score

        def epsr(x: np.ndarray, y: np.ndarray, kind: str) -> float:
            return fn(x, y, input=kind)

    elif callable(metric):

        def epsr(x: np.ndarray, y: np.ndarray, kind: str) -> float:
            return float(metric(np.exp(_log_probs(x, kind, "scores")), y))

    else:
        raise TypeError(f"metric must be 'log_loss', 'brier_score' or a callable, got {metric!r}")
    X = _scores_array(probs_or_logits, input, "probs_or_logits")
    y = check_labels(labels, X.shape[0], X.shape[1])
    S = calibrate_scores(
        probs_or_logits,
        y,
        calibrator=calibrator,
        mode=mode,
        n_folds=n_folds,
        seed=seed,
        input=input,
        val=val,
        stratified=stratified,
        groups=groups,
    )
    before = epsr(X, y, input)
    after = epsr(S, y, "probs")  # calibrators return probabilities
    if not relative:
        return before - after
    if not (np.isfinite(before) and before > 0):
        return float("nan")
    return 100.0 * (before - after) / before


# ------------------------------------------------------------------------ bootstrap


class BootstrapCI(NamedTuple):
    """Full-sample estimate and percentile bootstrap interval."""

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
    """Percentile bootstrap confidence interval of any metric (004 App. E).

    Draws ``n_boot`` bootstrap sets of n rows with replacement, evaluates
    ``metric(probs[idx], labels[idx], **metric_kwargs)`` on each, and returns the
    full-sample value with the ``100 alpha/2`` and ``100 (1 - alpha/2)`` percentiles
    (linear interpolation, :func:`numpy.percentile`). The system is frozen; anything the
    metric fits on the test data (the calibrator of :func:`calibration_loss` with
    ``mode="tt"``/``"xv"``, the bandwidth of ``kdecal.ece_kde(..., bandwidth="auto")``)
    is refitted inside every bootstrap set, as 004 App. E requires. If ``metric`` has a
    ``groups`` parameter that is not given, the original row indices are passed as
    ``groups`` so that cross-validation keeps the copies of a sample in one fold
    (004 App. E); a given ``groups`` array is resampled with the rows.

    Parameters
    ----------
    metric : callable
        ``metric(probs, labels, **metric_kwargs) -> float``, e.g. :func:`log_loss`,
        :func:`calibration_loss`, :func:`kdecal.ece_kde` (pass ``bandwidth`` explicitly,
        or "auto" to reselect it per resample).
    probs : array-like, shape (n, ...)
        Scores passed to ``metric`` (probabilities or logits, whatever it expects);
        rows are resampled.
    labels : array-like, shape (n,)
        Labels, resampled with the rows.
    n_boot : int, default 100
        Number of bootstrap sets, ``>= 1`` (004 uses 100).
    alpha : float, default 0.05
        Significance level in (0, 1): a ``100 (1 - alpha)`` % interval (004's "gamma" is
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
        ``n_boot < 1``; ``alpha`` outside (0, 1); ``probs`` and ``labels`` of different
        lengths or empty; whatever ``metric`` raises.
    """
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}")
    n_boot = check_int(n_boot, "n_boot", 1)
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a float in (0, 1), got {alpha!r}")
    a = float(alpha)
    if not 0.0 < a < 1.0:
        raise ValueError(f"alpha must lie in the open interval (0, 1), got {alpha!r}")
    X = np.asarray(probs)
    y = np.asarray(labels)
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
    rng = np.random.default_rng(seed)
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
