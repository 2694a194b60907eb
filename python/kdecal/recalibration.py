"""Post-hoc recalibration maps (calibrators), scikit-learn estimators.

Every calibrator is fitted on held-out (validation) scores and labels and then maps new
scores of the same classifier to calibrated probabilities::

    cal = TemperatureScaling().fit(val_logits, val_labels)   # input="auto": logits here
    probs = cal.transform(test_logits)                       # (n, K) float64
    cal.temperature_

=================================  ========================================================
class                              map
=================================  ========================================================
:class:`TemperatureScaling`        ``softmax(z / T)``, T minimises the validation NLL
:class:`ExpectationConsistency`    ``softmax(z / T)``, mean top-k confidence = accuracy
:class:`AffineCalibration`         ``softmax(alpha * log q + beta)``, scalar alpha, vector beta
:class:`VectorScaling`             ``softmax(w * log q + b)``, per-class w and b
:class:`IsotonicCalibration`       one-vs-rest PAV (isotonic regression), renormalised
:class:`HistogramBinning`          one-vs-rest equal-width bins, bin frequencies, renormalised
:class:`MeanReplacement`           the trivial recalibration of Chidambaram & Ge (MRR)
=================================  ========================================================

Common conventions
------------------
- ``scores`` is any array object (NumPy, pandas, torch, ...; see
  ``kdecal._validation.as_array``). ``input`` says what it holds: ``"logits"`` (real
  logits, shape ``(n, K)``), ``"probs"`` (rows on the simplex, checked and renormalised
  like every other kdecal function, but *not* clipped to ``kdecal.tolerances.PROB_EPS``: the
  calibrators fit on the logarithms of the probabilities as given, and only an exact 0,
  a probability that underflowed, is read as the smallest positive number of its dtype,
  ``4.9e-324`` in float64 and ``1.4e-45`` in float32) or ``"auto"``
  (the default): scores with an entry outside [0, 1] are logits, scores in [0, 1] whose
  rows sum to 1 within 0.02 are probabilities, and anything in between raises a
  ``ValueError`` that names both choices. Probabilities passed with ``input="logits"``
  (every row on the simplex) raise a ``ValueError`` telling to pass ``input="probs"``;
  nothing is guessed silently. :meth:`transform` reads its scores as the kind resolved in
  :meth:`fit` (attribute ``input_``).
- Since ``softmax`` is invariant to a constant added to a row, a row of logits and the
  log of its softmax describe the same prediction; every calibrator works on the
  log-probabilities ``log q = log_softmax(z)``, so the two inputs give the same fitted map
  (up to rounding). Logits up to the float64 range (+-1e308) are accepted: log q is
  kept finite, and the optimisers work on a rescaled copy of it when its typical
  magnitude is far from 1.
- Binary problems: a 1-D ``scores`` of shape ``(n,)`` is the logit ``log(p / (1 - p))`` of
  class 1 or ``P(y = 1)``, i.e. the two-class problem with logits ``(0, t)``. For a 1-D
  input :meth:`transform` returns the calibrated ``P(y = 1)``, shape ``(n,)``; for a 2-D
  input it returns ``(n, K)``. A calibrator fitted on one form can transform the other.
- ``labels`` are integers in ``0..K-1``. Classes that do not occur in the fit labels are
  allowed (K is the number of score columns).
- ``sample_weight`` (optional, shape ``(n,)``, finite, ``>= 0``, positive sum) weights the
  fit objective of every calibrator: the NLL, the expectation-consistency equation, PAV,
  the bin frequencies and the accuracy / class frequencies of :class:`MeanReplacement`.
  Integer weights give the same fit as repeated rows.
- Output is always float64; rows of 2-D outputs sum to 1. :meth:`predict_proba` is an
  alias of :meth:`transform`, so a calibrator can stand where code expects the output of
  a scikit-learn classifier. The calibrators are not tagged as classifiers (they need
  labels in ``0..K-1``, not any class labels): scikit-learn scorers that take one
  column of a binary classifier's ``predict_proba`` (``"roc_auc"``,
  ``"average_precision"``) get both columns of a 2-D binary input and fail; pass the
  binary scores in their 1-D form, where ``transform`` returns ``P(y = 1)``, or score
  ``predict_proba(X)[:, 1]`` yourself. ``"neg_log_loss"``, ``"neg_brier_score"``,
  ``"accuracy"``, ``"roc_auc_ovr"`` and the default :meth:`score` work.
- scikit-learn conventions (without depending on scikit-learn): constructor arguments
  are stored unchanged and validated in :meth:`fit`; ``get_params(deep=True)``,
  ``set_params``, ``sklearn.base.clone``, ``Pipeline``, ``GridSearchCV`` and
  ``cross_val_predict`` work; fitted attributes end with an underscore (``n_features_in_``,
  ``classes_``, ``n_classes_``, ``input_`` and each method's own); :meth:`transform` before
  :meth:`fit` raises :class:`NotFittedError`, which ``sklearn.utils.validation.
  check_is_fitted`` also detects. A data frame's column names (all strings) are kept as
  ``feature_names_in_``, and :meth:`transform` refuses a frame whose columns are named
  otherwise or come in another order (the columns are classes), with scikit-learn's
  message; it warns, as scikit-learn does, where only one of the two has names. Bad input raises ``ValueError`` or ``TypeError`` naming
  the argument and the bad value, as everywhere in kdecal.
- Solvers are those of :mod:`scipy.optimize` (``brentq``, ``minimize`` with L-BFGS-B and
  analytic gradients, ``isotonic_regression``). Every loop has an iteration bound and
  every objective value is checked to be finite (a non-finite one raises ``ValueError``).
  ``converged_`` is judged by the gradient at the returned point, not by the solver's
  own stopping rule (and is False where the solver's last run reached its iteration
  limit: it was still moving).

References
----------
- L. Clarté, B. Loureiro, F. Krzakala, L. Zdeborová. "Expectation consistency for
  calibration of neural networks". arXiv:2303.02644, 2023.
- M. Chidambaram, R. Ge. "Reassessing How to Compare and Improve the Calibration of
  Machine Learning Models". arXiv, 2024.
- L. Ferrer, D. Ramos. "Evaluating Posterior Probabilities: Decision Theory, Proper
  Scoring Rules, and Calibration". Transactions on Machine Learning Research (TMLR), 2025.
- C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger. "On Calibration of Modern Neural
  Networks". ICML 2017.
- B. Zadrozny, C. Elkan. "Obtaining calibrated probability estimates from decision trees
  and naive Bayesian classifiers". ICML 2001.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from scipy import optimize
from scipy.special import logsumexp

from ._engine import runtime as _runtime
from ._validation import (
    LogProbs,
    _numeric_array,
    check_choice,
    check_int,
    check_labels,
    check_n_bins,
    log_probs,
    log_softmax_rows,
)
from .binned import bin_index
from .warnings import KdecalWarning, warn_user

if sys.version_info >= (3, 11):
    from typing import Self
elif TYPE_CHECKING:  # typing_extensions is not a dependency: for the type checker only
    from typing_extensions import Self

__all__ = [
    "AffineCalibration",
    "ExpectationConsistency",
    "HistogramBinning",
    "IsotonicCalibration",
    "MeanReplacement",
    "NotFittedError",
    "TemperatureScaling",
    "VectorScaling",
]

#: Accepted values of the ``input`` argument.
INPUTS = ("auto", "logits", "probs")
#: The type of the ``input`` argument.
Input = Literal["auto", "logits", "probs"]
#: Fewest samples :meth:`fit` accepts.
MIN_FIT_SAMPLES = 2
#: L-BFGS-B options of the affine and vector-scaling fits (max |gradient| ~ 1e-8 at the end
#: on real data; the defaults stop at ~1e-5).
_LBFGS_OPTIONS = {"maxiter": 5000, "maxls": 50, "ftol": 1e-14, "gtol": 1e-9}
#: L-BFGS-B is restarted from its own result at most this many times while the gradient
#: test below fails (a restart drops the curvature memory, which helps on badly scaled
#: problems).
_LBFGS_RESTARTS = 3
#: ``converged_`` of the NLL fits: largest entry of the gradient with respect to the
#: logarithm of each scale parameter and to each bias (nats; invariant to rescaling the
#: scores) at the returned point.
GRAD_TOL = 1e-6
#: brentq tolerances on log T (relative precision of T ~ 1e-14) and its iteration bound.
_BRENT_XTOL = 1e-14
_BRENT_RTOL = 4 * np.finfo(float).eps
_BRENT_MAXITER = 500
#: The temperature searches stay within ``|log(T / s)| <= _LOG_T_MAX`` where ``s`` is the
#: power-of-two scale of the scores (so ``exp`` of it neither overflows nor underflows).
_LOG_T_MAX = 700.0


_NOT_FITTED_DOC = """A calibrator was used before :meth:`fit`.

    A subclass of ``sklearn.exceptions.NotFittedError`` when scikit-learn is installed (so
    ``except sklearn.exceptions.NotFittedError`` catches it), else of its bases
    ``ValueError`` and ``AttributeError``.  kdecal does not import scikit-learn when it is
    imported itself: the class is made on first use (the first access to
    ``kdecal.recalibration.NotFittedError`` or the first unfitted call), once.
    """
_not_fitted: list[type[ValueError]] = []


def _not_fitted_error() -> type[ValueError]:
    """Return the class :class:`NotFittedError`, made on the first call (see its doc)."""
    if not _not_fitted:
        try:
            from sklearn.exceptions import NotFittedError as base

            bases: tuple[type, ...] = (base,)
        except ImportError:
            bases = (ValueError, AttributeError)
        cls = type("NotFittedError", bases, {"__doc__": _NOT_FITTED_DOC, "__module__": __name__})
        cls.__qualname__ = "NotFittedError"
        _not_fitted.append(cast("type[ValueError]", cls))
    return _not_fitted[0]


if TYPE_CHECKING:

    class NotFittedError(ValueError, AttributeError):
        """A calibrator was used before :meth:`fit` (see ``_NOT_FITTED_DOC``)."""

else:

    def __getattr__(name: str) -> object:
        if name == "NotFittedError":
            return _not_fitted_error()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _as_given(arr: np.ndarray, lp: LogProbs) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities and probabilities of validated scores, probabilities unclipped.

    ``arr`` is the numeric array of the scores that :func:`log_probs` read into ``lp``.
    Logits: ``lp`` as it is.  Probabilities: :func:`_probs_as_given` of ``arr``.
    """
    if lp.kind != "probs":
        return lp.L, lp.q
    return _probs_as_given(arr)


#: How :meth:`_Calibrator.transform`'s messages name the kind of scores: resolved in
#: ``fit``, not passed to ``transform`` (the message of a batch of probabilities given to
#: a calibrator fitted on logits named an ``input='logits'`` its caller never passed).
_FITTED_FLAGS = {
    kind: {"logits": f"input_={kind!r}, resolved in fit", "probs": "input='probs' to a new fit"}
    for kind in ("probs", "logits")
}


def _probs_as_given(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities and probabilities of valid probabilities, unclipped.

    The values as given in float64, with what :func:`check_probs` does to every input
    (entries within its range tolerance of [0, 1] clipped into it, with its warning;
    every row divided by its sum) but without its clipping to ``PROB_EPS``; their
    logarithms, except that an exact 0 (a probability that underflowed) has the log of
    the smallest positive (subnormal) number of the input's floating dtype (float64 for
    other dtypes): ``log(1.4e-45) = -103.3`` for float32, ``log(4.9e-324) = -744.4`` for
    float64.  (Dividing a row by its sum adds a constant to its logarithms, which
    changes no softmax-based calibrator.)
    """
    dt = arr.dtype if arr.dtype.kind == "f" and arr.dtype.itemsize <= 8 else np.dtype(np.float64)
    a = np.clip(arr.astype(np.float64), 0.0, 1.0)
    if a.ndim == 1:
        a = np.stack([1.0 - a, a], axis=1)
    a = np.ascontiguousarray(a / a.sum(axis=1, keepdims=True))
    zero = a <= 0.0
    with np.errstate(divide="ignore"):
        L = np.log(np.where(zero, 1.0, a))
    L[zero] = np.log(float(np.finfo(dt).smallest_subnormal))
    return L, a


def _rounded_decimals(a: np.ndarray, dtype: np.dtype) -> int | None:
    """Return the fewest decimals ``d <= 6`` of which every entry of ``a`` is a multiple.

    Within 4 units of the dtype's rounding of values up to 1 (float32: ``d <= 4``); None
    where there is no such ``d``.
    """
    eps = float(np.finfo(dtype).eps) if dtype.kind == "f" else float(np.finfo(np.float64).eps)
    for d in range(1, 7):
        scale = 10.0**d
        tol = max(1e-6, 4.0 * eps * scale)
        if tol > 1e-2:
            return None
        r = a * scale
        if np.all(np.abs(r - np.rint(r)) <= tol):
            return d
    return None


def _warn_rounded_zeros(arr: np.ndarray) -> None:
    """Warn of exact zeros in probabilities that look rounded (:func:`_probs_as_given`).

    A 0 is read as an underflow, the log of the dtype's smallest subnormal number; in
    probabilities rounded to d decimals it means "below 0.5 10^-d", and at -744 nats
    such entries dominate a fit (temperature scaling of cifar10_resnet20_chenyaofo's
    probabilities rounded to 3 decimals: T = 104, against 2.6 with the zeros clipped at
    1e-12).
    """
    dtype = arr.dtype
    P = np.asarray(arr, dtype=np.float64)
    if P.ndim == 1:
        P = np.stack([1.0 - P, P], axis=1)
    zero = P <= 0.0
    if not zero.any():
        return
    d = _rounded_decimals(P, dtype)
    if d is None:
        return
    dt = dtype if dtype.kind == "f" and dtype.itemsize <= 8 else np.dtype(np.float64)
    tiny = float(np.finfo(dt).smallest_subnormal)
    warn_user(
        f"scores: {int(zero.sum())} of {zero.size} probabilities are exactly 0 and every "
        f"entry is a multiple of 1e-{d} (probabilities rounded to {d} decimals?). The "
        f"calibrators read a 0 as an underflow, log({tiny:.2g}) = {np.log(tiny):.1f}, "
        "which can dominate the fit (temperature scaling of a CIFAR-10 model's "
        "probabilities rounded to 3 decimals: T = 104 instead of 2.6). Clip them first, "
        "e.g. np.clip(probs, 1e-12, None) as kdecal.scores.calibration_loss does, or "
        "pass the logits."
    )


def _validated_scores(X: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities and probabilities of scores that kdecal validated already.

    ``X`` is float64, shape (n, K), of the kind ``kind``: rows of the scores that
    :func:`kdecal.scores.calibrate_scores` read once (probabilities ``exp(log q)`` of
    validated ones, or finite logits).  The numbers are those :meth:`_Calibrator.fit`
    and :meth:`_Calibrator.transform` compute from the same rows, without the checks.
    """
    if kind == "probs":
        return _probs_as_given(X)
    L = log_softmax_rows(X)
    return L, np.exp(L)


# ---------------------------------------------------------------------------- helpers


def _softmax_rows(U: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Row-wise ``softmax(scale * U)`` of finite ``U``, finite ``scale > 0``.

    The row maximum is subtracted before scaling, so the largest exponent is exactly 0 and
    very large scales (tiny temperatures) only underflow the other entries to 0.
    """
    with np.errstate(over="ignore", under="ignore"):
        E = np.exp((U - U.max(axis=1, keepdims=True)) * scale)
    return E / E.sum(axis=1, keepdims=True)


def _weighted_mean(x: np.ndarray, w: np.ndarray | None) -> float:
    if w is None:
        return float(np.mean(x))
    return float(np.sum(w * x) / np.sum(w))


def _nll(U: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    """Mean (weighted) negative log-likelihood of ``softmax(U)`` at labels ``y``."""
    return _weighted_mean(logsumexp(U, axis=1) - U[np.arange(U.shape[0]), y], w)


def _renormalise(Q: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Divide rows by their sums; rows summing to 0 become ``fallback``."""
    s = Q.sum(axis=1)
    zero = s <= 0
    s[zero] = 1.0
    Q = Q / s[:, None]
    Q[zero] = fallback
    return Q


def _check_bounds(bounds: object, name: str = "bounds") -> tuple[float, float]:
    try:
        lo, hi = (float(b) for b in bounds)  # type: ignore[attr-defined]
    except Exception as exc:
        raise TypeError(f"{name} must be a pair (T_min, T_max) of floats, got {bounds!r}") from exc
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < hi):
        raise ValueError(f"{name} must satisfy 0 < T_min < T_max < inf, got {bounds!r}")
    return lo, hi


def _check_sample_weight(sample_weight: object, n: int) -> np.ndarray | None:
    """Validate ``sample_weight``: None, or shape (n,), finite, >= 0, positive sum."""
    if sample_weight is None:
        return None
    w = _numeric_array(sample_weight, "sample_weight")
    if w.dtype == np.bool_:
        raise TypeError(f"sample_weight must be real numbers, got dtype {w.dtype}")
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 0:
        w = np.full(n, float(w))
    if w.shape != (n,):
        raise ValueError(f"sample_weight must have shape ({n},), got shape {w.shape}")
    bad = ~np.isfinite(w) | (w < 0)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"sample_weight must be finite and >= 0, got {float(w[i])!r} at index {i}"
        )
    if not np.sum(w) > 0:
        raise ValueError("sample_weight sums to zero; at least one sample needs a positive weight")
    return np.ascontiguousarray(w)


def _pow2(x: float) -> float:
    """Return the power of two nearest to ``x > 0`` (exact to multiply and divide by)."""
    return float(2.0 ** np.round(np.log2(x)))


def _overflow_scale(L: np.ndarray) -> float:
    """Power of two ``s >= 1`` such that sums of the entries of ``L / s`` stay below 2**480.

    Their squares (the optimisers' curvature estimates) then stay finite too.
    """
    m = float(np.max(np.abs(L)))
    limit = 2.0**480 / max(L.shape[0], 1) / max(L.shape[1], 1)
    return 1.0 if m <= limit else float(2.0 ** np.ceil(np.log2(m / limit)))


def _problem_scale(L: np.ndarray) -> float:
    """Scale of log-probabilities for the L-BFGS fits: 1 unless badly scaled.

    The typical spread of ``log q`` within a row (median of the non-zero ``|log q_ik -
    median_k log q_ik|``), what the fitted scale multiplies, rounded to a power of two
    when it lies outside [1/16, 16], else 1 (ordinary logits are fitted unscaled); never
    below :func:`_overflow_scale` where that exceeds 1. (The magnitude of ``log q``
    itself is about log K for logits of tiny spread, 1e-9 times ordinary ones: read
    instead, it left them unscaled, and the fit stopped at its start.)
    """
    # an element of each row ("lower"): the mean of two middle values may overflow
    with np.errstate(invalid="ignore", over="ignore"):
        dev = np.abs(L - np.quantile(L, 0.5, axis=1, keepdims=True, method="lower"))
    dev = dev[np.isfinite(dev) & (dev > 0)]
    s = 1.0
    if dev.size:
        typical = float(np.median(dev))
        if typical > 0 and not 1.0 / 16 <= typical <= 16.0:
            s = _pow2(typical)
    o = _overflow_scale(L)  # 1 unless sums of L could overflow: then at least that
    return s if o == 1.0 else max(s, o)


def _class_centres(L: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """Per-class centres ``c_k`` of ``L`` (n, K) for the vector-scaling fit, shape (K,).

    ``c_k`` is the lower median of ``L[i, k]`` over the fit rows of class k (weight > 0),
    or over every row where the class has none (its bias then diverges anyway); 0 where
    those values are all non-finite. A data value ("lower"): the mean of two middle
    values may overflow.
    """
    K = L.shape[1]
    own = y if w is None else np.where(w > 0, y, -1)
    c = np.zeros(K)
    for k in range(K):
        col = L[own == k, k]
        if col.size == 0:
            col = L[:, k]
        col = col[np.isfinite(col)]
        if col.size:
            c[k] = float(np.quantile(col, 0.5, method="lower"))
    return c


def _column_names(X: object) -> np.ndarray | None:
    """Return the column names of a data frame (pandas, polars) if all are strings, else None."""
    columns = getattr(X, "columns", None)
    if columns is None or len(getattr(X, "shape", ())) != 2:
        return None
    names = [str(c) if isinstance(c, str) else c for c in columns]
    if not names or not all(isinstance(c, str) for c in names):
        return None
    return np.asarray(names, dtype=object)


def _all_weighted(mask: np.ndarray, w: np.ndarray | None) -> bool:
    """Whether ``mask`` holds on every row of positive weight (rows of weight 0 do not count)."""
    return bool(np.all(mask if w is None else mask | (w <= 0.0)))


def _finite_or_raise(value: float, who: str, what: str) -> float:
    if not np.isfinite(value):
        raise ValueError(
            f"{who}: the {what} is not finite ({value!r}) although the scores are; the "
            "scores are too extreme for this calibrator (rescale them)"
        )
    return value


def _class_frequencies(y: np.ndarray, K: int, w: np.ndarray | None) -> np.ndarray:
    """(Weighted) class frequencies of the labels, shape (K,)."""
    counts = np.bincount(y, weights=w, minlength=K).astype(np.float64)
    return counts / counts.sum()


def _ovr_log_odds(L: np.ndarray) -> np.ndarray:
    """One-vs-rest log-odds ``log q_k - log(1 - q_k)`` from log-probabilities, stably.

    ``log(1 - q_k)`` is ``log sum_{j != k} q_j``: for the non-maximal classes the sum of the
    others is at least the row maximum, so ``S - E_k`` has no cancellation; for the row's
    argmax it is a log-sum-exp over the other classes (finite even when they underflow).
    """
    n = L.shape[0]
    rows = np.arange(n)
    kmax = np.argmax(L, axis=1)
    D = L - L[rows, kmax][:, None]  # <= 0, 0 at the argmax
    E = np.exp(D)
    with np.errstate(divide="ignore"):
        log_others = np.log(E.sum(axis=1, keepdims=True) - E)
    masked = D.copy()
    masked[rows, kmax] = -np.inf
    log_others[rows, kmax] = logsumexp(masked, axis=1)
    return D - log_others


# ------------------------------------------------------------------------- base class


class _Calibrator:
    """Shared ``fit`` / ``transform`` plumbing and the scikit-learn estimator protocol."""

    def __init__(self, input: Input = "auto") -> None:
        self.input = input

    # scikit-learn estimator protocol (as sklearn.base.BaseEstimator) ------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return sorted(
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Return the constructor arguments of this calibrator (scikit-learn convention).

        Parameters
        ----------
        deep : bool, default True
            Also return the parameters of parameters that are estimators themselves, as
            ``name__param`` (none of the calibrators has such a parameter).

        Returns
        -------
        dict
            Parameter name -> value, as passed to the constructor or :meth:`set_params`.
        """
        out: dict[str, Any] = {}
        for key in self._get_param_names():
            value = getattr(self, key)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{key}__{k}", v) for k, v in value.get_params().items())
            out[key] = value
        return out

    def set_params(self, **params: object) -> Self:
        """Set constructor arguments (scikit-learn convention); validated by :meth:`fit`.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            For a name that is not a constructor argument.
        """
        valid = self._get_param_names()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(
                    f"Invalid parameter {key!r} for estimator {type(self).__name__}; valid "
                    f"parameters are {valid}"
                )
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._get_param_names())
        return f"{type(self).__name__}({args})"

    #: Whether the fit is a function of the log-probabilities' values (temperature,
    #: affine and vector scaling, expectation consistency), where an exact 0 read as an
    #: underflow weighs; the others depend on the scores' order or on the probabilities.
    _fits_logs = True

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "n_classes_")

    def __sklearn_tags__(self) -> Any:
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags

        return Tags(
            estimator_type=None,
            target_tags=TargetTags(required=True),
            transformer_tags=TransformerTags(preserves_dtype=["float64"]),
            input_tags=InputTags(two_d_array=True),
        )

    # subclasses implement these two on validated log-probabilities -------------------
    def _fit(
        self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    # public API ------------------------------------------------------------------------
    def fit(self, X: object, y: object, sample_weight: object = None) -> Self:
        """Fit the calibrator on held-out scores and labels.

        Parameters
        ----------
        X : array-like, shape (n, K) or (n,)
            The scores (called ``scores`` in messages): logits or probabilities
            (``input``) of the classifier on the calibration (validation) set; see the
            module docstring for the binary ``(n,)`` form. At least 2 samples.
        y : array-like of int, shape (n,)
            The labels (``labels`` in messages): true classes in ``0..K-1``.
        sample_weight : array-like, shape (n,), optional
            Non-negative finite weights of the samples in the fit objective (default: all
            1); integer weights are equivalent to repeating rows.

        Returns
        -------
        self
            The fitted calibrator.

        Raises
        ------
        TypeError
            Non-numeric ``scores``, ``labels`` or ``sample_weight``.
        ValueError
            Unknown ``input``; wrong shapes; NaN or infinite scores; scores that are
            neither clearly probabilities nor clearly logits (``input="auto"``) or
            probabilities passed as logits; probabilities off the simplex; labels out of
            range or not integers; n < 2; bad ``sample_weight``; a non-finite objective;
            and the method-specific cases listed in each class.
        """
        L, P, labels, w, lp = self._read_fit(X, y, sample_weight)
        self._fit(L, P, labels, w)
        self._set_fitted(lp.kind, L.shape[1], lp.binary)
        self._set_feature_names(X)
        return self

    def _set_feature_names(self, X: object) -> None:
        """Keep the column names of a data frame as ``feature_names_in_`` (scikit-learn's rule).

        The columns are classes: :meth:`transform` refuses a frame whose columns are
        named otherwise or in another order (their probabilities would belong to other
        classes).
        """
        names = _column_names(X)
        if names is not None:
            self.feature_names_in_ = names
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _check_feature_names(self, X: object) -> None:
        """Compare the columns of ``X`` with those of :meth:`fit` (scikit-learn's messages)."""
        names = _column_names(X)
        fitted = getattr(self, "feature_names_in_", None)
        who = type(self).__name__
        if names is None and fitted is None:
            return
        if fitted is None:
            if hasattr(X, "columns"):
                warn_user(f"X has feature names, but {who} was fitted without feature names")
            return
        if names is None:
            warn_user(
                f"X does not have valid feature names, but {who} was fitted with feature names"
            )
            return
        if names.shape != fitted.shape or not np.all(names == fitted):
            raise ValueError(
                "The feature names should match those that were passed during fit: "
                f"{who} was fitted on the columns {fitted.tolist()} and got "
                f"{names.tolist()}; the columns are classes, so a frame must hold them in "
                "the order of fit"
            )

    def _read_fit(
        self, X: object, y: object, sample_weight: object
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, LogProbs]:
        """Validate the arguments of :meth:`fit`: ``L``, ``P``, labels, weights, ``lp``."""
        inp = check_choice(self.input, "input", INPUTS)
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None "
                "(labels, integers in 0..K-1, are needed to fit a calibrator)"
            )
        arr = _numeric_array(X, "scores")
        lp = log_probs(arr, inp, "scores", MIN_FIT_SAMPLES)
        L, P = _as_given(arr, lp)
        if lp.kind == "probs" and self._fits_logs:
            _warn_rounded_zeros(arr)
        labels = check_labels(y, L.shape[0], L.shape[1], scores="scores")
        w = _check_sample_weight(sample_weight, L.shape[0])
        return L, P, labels, w, lp

    def _set_fitted(self, kind: str, n_classes: int, binary: bool) -> None:
        self.input_ = kind
        self.n_classes_ = int(n_classes)
        self.classes_ = np.arange(self.n_classes_)
        self.n_features_in_ = 1 if binary else self.n_classes_

    def _own_fit_transform(self) -> bool:
        """Whether :meth:`fit` and :meth:`transform` are these (not a subclass's own)."""
        cls = type(self)
        return cls.fit is _Calibrator.fit and cls.transform is _Calibrator.transform

    def _fit_validated(self, X: np.ndarray, y: np.ndarray, kind: str) -> Self:
        """:meth:`fit` on scores and labels that kdecal validated already.

        For :func:`kdecal.scores.calibrate_scores`, which reads its scores and labels
        once and fits on rows of them: ``X`` float64, shape (n, K) (see
        :func:`_validated_scores`), of the kind ``kind``; ``y`` int64 labels in
        ``0..K-1``.  Fits what :meth:`fit` fits on the same rows (bit for bit); only
        the checks that the rows cannot have passed already remain.
        """
        check_choice(self.input, "input", INPUTS)
        if X.shape[0] < MIN_FIT_SAMPLES:
            raise ValueError(
                f"scores needs at least {MIN_FIT_SAMPLES} samples, got n = {X.shape[0]}"
            )
        L, P = _validated_scores(X, kind)
        self._fit(L, P, y, None)
        self._set_fitted(kind, L.shape[1], False)
        return self

    def _transform_validated(self, X: np.ndarray) -> np.ndarray:
        """:meth:`transform` of validated scores (see :meth:`_fit_validated`), 2-D."""
        L, P = _validated_scores(X, self.input_)
        return np.ascontiguousarray(self._transform(L, P), dtype=np.float64)

    def transform(self, X: object) -> np.ndarray:
        """Calibrated probabilities of new scores.

        Parameters
        ----------
        X : array-like, shape (n, K) or (n,)
            Scores of the kind resolved in :meth:`fit` (``input_``) and with its number of
            classes.

        Returns
        -------
        ndarray, float64, shape (n, K), or shape (n,) for a 1-D input
            Calibrated probabilities (rows sum to 1), or the calibrated ``P(y = 1)`` of a
            binary 1-D input.

        Raises
        ------
        NotFittedError
            If :meth:`fit` has not been called.
        TypeError, ValueError
            Bad ``scores`` (as in :meth:`fit`), or a number of classes different from the
            one seen in :meth:`fit`.
        """
        if not self.__sklearn_is_fitted__():
            raise _not_fitted_error()(
                f"this {type(self).__name__} instance is not fitted yet; call "
                "fit(X, y) before transform"
            )
        self._check_feature_names(X)
        arr = _numeric_array(X, "scores")
        lp = log_probs(arr, self.input_, "scores", 1, _FITTED_FLAGS[self.input_])
        L, P = _as_given(arr, lp)
        if L.shape[1] != self.n_classes_:
            shape = np.shape(X)  # type: ignore[call-overload]  # (no copy of a dask array)
            raise ValueError(
                f"scores has K = {L.shape[1]} classes (shape {shape}) but "
                f"{type(self).__name__} was fitted with K = {self.n_classes_} (X has "
                f"{shape[-1] if len(shape) == 2 else 1} features, but {type(self).__name__} "
                f"is expecting {self.n_features_in_} features as input)"
            )
        Q = np.ascontiguousarray(self._transform(L, P), dtype=np.float64)
        return Q[:, 1].copy() if lp.binary else Q

    def predict_proba(self, X: object) -> np.ndarray:
        """Alias of :meth:`transform`, for code written for scikit-learn classifiers."""
        return self.transform(X)

    def predict(self, X: object) -> np.ndarray:
        """Most probable class of the calibrated probabilities (ties to the lower index).

        Parameters
        ----------
        X : array-like, shape (n, K) or (n,)
            As in :meth:`transform`.

        Returns
        -------
        ndarray, shape (n,), int64
            ``argmax`` of :meth:`transform`'s rows (for a 1-D input: 1 where the
            calibrated ``P(y = 1) > 1/2``).
        """
        Q = self.transform(X)
        if Q.ndim == 1:
            return (Q > 0.5).astype(np.int64)
        return np.argmax(Q, axis=1).astype(np.int64)

    def fit_transform(self, X: object, y: object, sample_weight: object = None) -> np.ndarray:
        """``fit(X, y, sample_weight).transform(X)``; see :meth:`fit` and :meth:`transform`.

        The scores are validated once, and the log-probabilities of the fit transformed.
        """
        if not self._own_fit_transform():  # a subclass's own fit or transform: call them
            return self.fit(X, y, sample_weight).transform(X)
        L, P, labels, w, lp = self._read_fit(X, y, sample_weight)
        self._fit(L, P, labels, w)
        self._set_fitted(lp.kind, L.shape[1], lp.binary)
        self._set_feature_names(X)
        Q = np.ascontiguousarray(self._transform(L, P), dtype=np.float64)
        return Q[:, 1].copy() if lp.binary else Q

    def score(self, X: object, y: object, sample_weight: object = None) -> float:
        """Negative mean log loss of the calibrated probabilities (higher is better).

        ``sum_i w_i log q_i[y_i] / sum_i w_i`` with ``q = transform(X)`` clipped to
        ``[eps, 1 - eps]`` (``eps`` the float64 machine epsilon, 2.2e-16), i.e.
        ``-sklearn.metrics.log_loss(y, predict_proba(X), sample_weight=sample_weight,
        labels=classes_)``, the value of scikit-learn's ``"neg_log_loss"`` scorer; it is
        what ``GridSearchCV`` and ``cross_val_score`` maximise when no ``scoring`` is
        given.

        Parameters
        ----------
        X : array-like, shape (n, K) or (n,)
            Scores, as in :meth:`transform`.
        y : array-like of int, shape (n,)
            True classes in ``0..K-1``.
        sample_weight : array-like, shape (n,), optional
            Non-negative finite weights (default: all 1).

        Returns
        -------
        float
            The negative log loss, in nats per sample (<= 0).

        Raises
        ------
        NotFittedError
            If :meth:`fit` has not been called.
        TypeError, ValueError
            Bad ``scores`` (as in :meth:`transform`), ``labels`` or ``sample_weight``.
        """
        Q = self.transform(X)
        if Q.ndim == 1:
            Q = np.stack([1.0 - Q, Q], axis=1)
        labels = check_labels(y, Q.shape[0], Q.shape[1], scores="scores")
        w = _check_sample_weight(sample_weight, Q.shape[0])
        eps = float(np.finfo(np.float64).eps)
        q = np.clip(Q[np.arange(Q.shape[0]), labels], eps, 1.0 - eps)
        return _weighted_mean(np.log(q), w)


# ----------------------------------------------------------------- temperature methods


class _TemperatureMixin:
    temperature_: float

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        return _softmax_rows(L, 1.0 / self.temperature_)


class TemperatureScaling(_TemperatureMixin, _Calibrator):
    r"""Temperature scaling: ``softmax(z / T)`` with T minimising the validation NLL.

    ``T_TS = argmin_T (1/n) sum_i [ log sum_k exp(z_ik / T) - z_{i,y_i} / T ]``
    (Guo et al. 2017; Clarté et al. 2023, Eq. 4, whose extra minus sign is a typo). The NLL
    is convex in ``beta = 1/T`` (a log-sum-exp of a linear map minus a linear term), so its
    analytic derivative is non-decreasing in ``beta`` and has at most one sign change in
    ``[1/T_max, 1/T_min]``; the root is found by :func:`scipy.optimize.brentq` in
    ``log beta`` (relative precision of T ~ 1e-14, at most 500 iterations)

    .. math:: \frac{d\,\mathrm{NLL}}{d\beta} = \frac1n \sum_i \Big(\sum_k p_{ik}(\beta)
       z_{ik} - z_{i,y_i}\Big), \qquad p_i(\beta) = \mathrm{softmax}(\beta z_i).

    Parameters
    ----------
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).
    bounds : (float, float), default (1e-6, 1e12)
        Search interval ``(T_min, T_max)`` for the temperature, in the units of the
        logits (``log q``). The default is wide enough for log-probabilities down to
        about -1e13 (Gaussian naive Bayes, for example, produces -1e9 and needs T ~ 1e7).

    Attributes
    ----------
    temperature_ : float
        The fitted temperature T.
    converged_ : bool
        True when ``|d NLL / d log T| <= GRAD_TOL`` (1e-6 nats) at ``temperature_``, an
        interior optimum; False when the NLL has no minimum inside ``bounds`` (see
        Warns; ``temperature_`` is then the bound that the NLL decreases towards).
    nll_ : float
        Validation NLL (nats, mean) at ``temperature_``.
    n_classes_ : int
        K seen in :meth:`fit`.

    Warns
    -----
    KdecalWarning
        When there is no interior optimum, and ``temperature_`` is clipped to a bound:

        - every validation label is a top-scoring class (100 % validation accuracy,
          separable data): the NLL decreases monotonically as T -> 0 and has no finite
          minimiser, ``temperature_ = T_min``;
        - otherwise the NLL is still decreasing at ``T_min`` (widen ``bounds``), or is
          non-increasing up to ``T_max`` (the scores carry no usable information, e.g.
          ``mean_i z_{i,y_i} <= mean_i mean_k z_ik``): ``temperature_ = T_max``.

        The existence condition is ``dNLL/dbeta(0) < 0 < dNLL/dbeta(infinity)``
        (Clarté et al. 2023, Sec. 3).

    Notes
    -----
    ``argmax`` (accuracy) does not depend on T. Scaling the logits by ``c > 0`` scales the
    fitted T by ``c``; adding a constant to a row changes nothing; so ``input="logits"``
    and ``input="probs"`` on ``softmax(z)`` give the same T (up to rounding: the
    probabilities are not clipped, see the module docstring).

    References
    ----------
    Guo et al. 2017, Sec. 4.2; Clarté et al. 2023, Sec. 3, Eq. 4; Ferrer & Ramos 2025,
    Sec. 3 (temperature scaling as affine calibration with beta = 0).

    Examples
    --------
    >>> import numpy as np
    >>> from kdecal.recalibration import TemperatureScaling
    >>> rng = np.random.default_rng(0)
    >>> z = 3 * rng.normal(size=(2000, 5))
    >>> p = np.exp(z / 2); p /= p.sum(1, keepdims=True)     # labels from softmax(z / 2)
    >>> y = (rng.random(2000)[:, None] > p.cumsum(1)).sum(1)
    >>> round(TemperatureScaling().fit(z, y).temperature_, 1)
    2.0
    """

    def __init__(self, input: Input = "auto", bounds: tuple[float, float] = (1e-6, 1e12)) -> None:
        super().__init__(input)
        self.bounds = bounds

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        t_min, t_max = _check_bounds(self.bounds)
        # work on L / s (s a power of two, 1 unless sums of L could overflow) and
        # gamma = s / T, searched in u = log gamma
        s = _overflow_scale(L)
        Ls = L / s
        ly = Ls[np.arange(L.shape[0]), y]

        def grad(u: float) -> float:
            """Return s * dNLL/dgamma of softmax(gamma * L / s) at gamma = exp(u)."""
            S = _softmax_rows(Ls, float(np.exp(u)))
            g = _weighted_mean(np.sum(S * Ls, axis=1) - ly, w)
            return _finite_or_raise(g, "TemperatureScaling", "NLL gradient")

        u_lo = float(np.clip(np.log(s) - np.log(t_max), -_LOG_T_MAX, _LOG_T_MAX))
        u_hi = float(np.clip(np.log(s) - np.log(t_min), -_LOG_T_MAX, _LOG_T_MAX))
        g_lo, g_hi = grad(u_lo), grad(u_hi)
        self.converged_ = False
        if g_hi <= 0.0:  # NLL still decreasing at the smallest temperature
            T = t_min
            top = Ls.max(axis=1)
            if _all_weighted(ly == top, w):
                tied = int(np.count_nonzero(np.sum(Ls == top[:, None], axis=1) > 1))
                why = (
                    "100% validation accuracy"
                    if tied == 0
                    else f"counting tied top scores, which {tied} of {len(ly)} rows have: "
                    "the scores cannot rank these classes"
                )
                msg = (
                    f"TemperatureScaling: every validation label is a top-scoring class "
                    f"({why}): the NLL decreases or stays flat as T -> 0 "
                    f"and has no finite minimiser; temperature_ is clipped to T_min = {t_min:g} "
                    "(converged_ = False). Use more or harder validation data."
                )
            else:
                msg = (
                    f"TemperatureScaling: the NLL is still decreasing at T_min = {t_min:g}; "
                    "temperature_ is clipped to it (converged_ = False); widen bounds"
                )
            warn_user(msg, KdecalWarning)
        elif g_lo >= 0.0:  # NLL non-increasing up to the largest temperature
            T = t_max
            spread = float(np.median(np.ptp(L, axis=1)))  # typical spread of log q in a row
            why = (
                f"the scores' typical spread of log-probabilities in a row is {spread:.3g}, "
                f"so the optimum may lie beyond bounds: widen them, e.g. bounds=(1e-6, "
                f"{max(t_max, 1e3 * spread):.3g})"
                if spread > 1e-3 * t_max
                else "the scores carry little or no information about the labels"
            )
            warn_user(
                f"TemperatureScaling: the NLL does not increase up to T_max = {t_max:g} "
                f"({why}); temperature_ is clipped to T_max (converged_ = False)",
                KdecalWarning,
            )
        else:
            # the NLL is convex in gamma, so grad is non-decreasing: one sign change
            u, info = optimize.brentq(
                grad,
                u_lo,
                u_hi,
                xtol=_BRENT_XTOL,
                rtol=_BRENT_RTOL,
                maxiter=_BRENT_MAXITER,
                full_output=True,
                disp=False,
            )
            T = float(np.clip(s * np.exp(-u), t_min, t_max))
            # stationarity in log T: |d NLL / d log T| = gamma * |d NLL / d gamma|
            gmax = float(abs(np.exp(u) * grad(u)))
            self.converged_ = bool(info.converged and gmax <= GRAD_TOL)
            if not self.converged_:
                warn_user(
                    f"TemperatureScaling: the root search stopped at T = {T:.6g} with "
                    f"|d NLL / d log T| = {gmax:.3g} > {GRAD_TOL:g} (converged_ = False)",
                    KdecalWarning,
                )
        self.temperature_ = float(T)
        gamma = float(np.exp(np.clip(np.log(s) - np.log(T), -_LOG_T_MAX, _LOG_T_MAX)))
        self.nll_ = _finite_or_raise(_nll(Ls * gamma, y, w), "TemperatureScaling", "NLL")


class ExpectationConsistency(_TemperatureMixin, _Calibrator):
    r"""Expectation consistency: ``softmax(z / T)`` with mean confidence = accuracy.

    ``T_EC`` solves (Clarté et al. 2023, Algorithm 1 and Eq. 5, with the top-k extension
    of their Sec. 3)

    .. math:: \frac1n \sum_i \sum_{k \in \mathrm{top}_k(z_i)} \mathrm{softmax}(z_i / T)_k
       \;=\; \frac1n \sum_i \mathbf 1\big(y_i \in \mathrm{top}_k(z_i)\big).

    The left side is continuous and strictly decreasing in T (for top-1 each
    ``max_k softmax(z_i/T)_k = 1 / sum_l exp(-(z_i,max - z_il)/T)``), from
    ``(1/n) sum_i |top_k ∩ argmax set| / m_i`` (= 1 without ties; ``m_i`` tied maxima) as
    T -> 0 to ``k/K`` as T -> infinity (not 0 as printed in the paper), so the root is
    unique when it exists. It is found by expanding a bracket in ``log T`` from
    ``[-1, 1]`` until the sign changes, then :func:`scipy.optimize.brentq` on ``log T``
    (relative precision of T ~ 1e-14).

    Parameters
    ----------
    top_k : int, default 1
        Use the top-k accuracy and the total probability of the k top-scoring classes;
        ``1 <= top_k < K``. ``top_k = 1`` is the paper's method.
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).

    Attributes
    ----------
    temperature_ : float
        T_EC.
    accuracy_ : float
        Validation top-k accuracy (the right-hand side).
    confidence_ : float
        Mean top-k confidence at ``temperature_`` (equal to ``accuracy_`` to ~1e-14).
    converged_ : bool
        Always True after a successful fit (failures raise).
    n_classes_ : int
        K seen in :meth:`fit`.

    Raises
    ------
    ValueError
        In :meth:`fit`, when no finite temperature exists:

        - top-k accuracy <= k/K (e.g. a binary classifier at or below 50 %): the mean
          confidence exceeds k/K at every finite T, T_EC -> infinity;
        - top-k accuracy = 1: the mean confidence is below 1 at every T > 0, T_EC -> 0;
        - accuracy above the T -> 0 limit of the confidence (tied top logits);

        and when ``top_k`` is not an integer in ``1..K-1`` (TypeError if not an integer).

    Notes
    -----
    The top-k set of a row is its k largest scores, ties broken towards the lower class
    index (``numpy.argmax`` for k = 1), used for both the accuracy and the confidence.
    Scale equivariance and shift invariance hold as for :class:`TemperatureScaling`. Under
    a well-specified model (labels drawn from ``softmax(z / T0)``) both T_EC and T_TS are
    consistent for T0 (Clarté et al. 2023, Sec. 5).

    References
    ----------
    Clarté et al. 2023, Algorithm 1, Eq. 5, Sec. 3 (top-N variant).
    """

    def __init__(self, top_k: int = 1, input: Input = "auto") -> None:
        super().__init__(input)
        self.top_k = top_k

    @staticmethod
    def _top_sets(L: np.ndarray, k: int) -> np.ndarray:
        return np.argsort(-L, axis=1, kind="stable")[:, :k]

    @staticmethod
    def _mean_confidence(
        L: np.ndarray, top: np.ndarray, T: float, w: np.ndarray | None = None
    ) -> float:
        S = _softmax_rows(L, 1.0 / T)
        return _weighted_mean(np.take_along_axis(S, top, axis=1).sum(axis=1), w)

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        K = L.shape[1]
        k = check_int(self.top_k, "top_k", 1)
        if k >= K:
            raise ValueError(f"top_k must be < K = {K} (k = K is trivial), got {k}")
        top = self._top_sets(L, k)
        acc = _weighted_mean(np.any(top == y[:, None], axis=1).astype(np.float64), w)
        is_max = L == L.max(axis=1, keepdims=True)
        sup = _weighted_mean(
            np.take_along_axis(is_max, top, axis=1).sum(axis=1) / is_max.sum(axis=1), w
        )
        what = "accuracy" if k == 1 else f"top-{k} accuracy"
        if acc <= k / K:
            raise ValueError(
                f"ExpectationConsistency: validation {what} = {acc:.6g} <= k/K = {k / K:.6g}; "
                f"the mean top-{k} confidence is > k/K at every finite temperature, so no "
                "T_EC exists (it would be infinite)"
            )
        if acc >= 1.0:
            raise ValueError(
                f"ExpectationConsistency: validation {what} is 1; the mean top-{k} confidence "
                "is < 1 at every T > 0, so no T_EC exists (it would be 0). Use more or "
                "harder validation data."
            )
        if acc >= sup:
            raise ValueError(
                f"ExpectationConsistency: validation {what} = {acc:.6g} is not below the "
                f"largest attainable mean confidence {sup:.6g} (tied top scores), so no "
                "T_EC exists"
            )
        s = _overflow_scale(L)  # T = s * exp(u), |u| <= _LOG_T_MAX
        Ls = L / s

        def f(u: float) -> float:  # decreasing in u = log(T / s)
            c = self._mean_confidence(Ls, top, float(np.exp(u)), w)
            return _finite_or_raise(c - acc, "ExpectationConsistency", "mean confidence")

        # bracket expansion in u from [-1, 1], doubling the step (at most ~10 rounds)
        lo, hi, step = -1.0, 1.0, 1.0
        f_lo, f_hi = f(lo), f(hi)
        while f_lo < 0.0 and lo > -_LOG_T_MAX:
            step *= 2.0
            lo, hi, f_hi = max(lo - step, -_LOG_T_MAX), lo, f_lo
            f_lo = f(lo)
        while f_hi > 0.0 and hi < _LOG_T_MAX:
            step *= 2.0
            lo, hi, f_lo = hi, min(hi + step, _LOG_T_MAX), f_hi
            f_hi = f(hi)
        if f_lo == 0.0:
            u = lo
        elif f_hi == 0.0:
            u = hi
        elif f_lo > 0.0 > f_hi:
            u = optimize.brentq(
                f, lo, hi, xtol=_BRENT_XTOL, rtol=_BRENT_RTOL, maxiter=_BRENT_MAXITER
            )
        else:
            raise ValueError(
                "ExpectationConsistency: could not bracket the temperature in "
                f"s * [exp(-{_LOG_T_MAX:g}), exp({_LOG_T_MAX:g})] with s = {s:g} (the mean "
                f"confidence minus the accuracy is {f_lo:.3g} and {f_hi:.3g} at the ends)"
            )
        self.temperature_ = float(s * np.exp(u))
        self.accuracy_ = acc
        self.confidence_ = self._mean_confidence(Ls, top, float(np.exp(u)), w)
        self.converged_ = True


# ------------------------------------------------------------------- affine families


class _LBFGSMixin:
    """L-BFGS-B fit of ``softmax(A(theta, log q))`` by mean NLL, analytic gradient.

    ``converged_`` is decided at the returned point by :data:`GRAD_TOL` on the gradient
    with respect to the logarithm of each scale parameter and to each bias; while it
    fails, L-BFGS-B is restarted from its result (at most ``_LBFGS_RESTARTS`` times).
    """

    def _warn_absent(self, y: np.ndarray, K: int, what: str, w: np.ndarray | None) -> None:
        weight = np.bincount(y, weights=w, minlength=K)
        absent = np.flatnonzero(weight <= 0)
        if absent.size:
            warn_user(
                f"{type(self).__name__}: class(es) {absent.tolist()} never occur in the fit "
                f"labels; their {what} tends to -infinity at the NLL optimum and the "
                "optimiser stops at a large finite value",
                KdecalWarning,
            )

    def _check_separable(self, U: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        """Warn, and set ``converged_ = False``, if the fitted map separates the fit data.

        ``U`` (n, K): the fitted map's scores. Where every fit label (of weight > 0)
        scores strictly above the other classes, scaling the map's parameters up lowers
        the NLL towards 0: it has no finite minimiser, and the parameters are wherever
        the optimiser stopped (an arbitrary, over-confident scale).
        """
        rows = np.arange(U.shape[0])
        u_y = U[rows, y].copy()
        others = U.copy()
        others[rows, y] = -np.inf
        if not _all_weighted(u_y > others.max(axis=1), w):
            return
        self.converged_ = False
        warn_user(
            f"{type(self).__name__}: every fit label scores strictly highest under the "
            "fitted map (separable data, e.g. 100% validation accuracy): the NLL decreases "
            "towards 0 as the scale grows and has no finite minimiser, so the fitted "
            "parameters are where the optimiser stopped, an arbitrary and over-confident "
            "scale (converged_ = False). Use more or harder validation data, or "
            "TemperatureScaling with bounds.",
            KdecalWarning,
        )

    def _minimise(self, fun: Callable[..., Any], x0: np.ndarray, n_scale: int) -> np.ndarray:
        """Minimise ``fun`` (value, gradient) from ``x0``; return the parameters.

        The first ``n_scale`` entries of ``theta`` are scale parameters, judged on
        ``theta_j * grad_j`` (the gradient with respect to their logarithm).
        """
        who = type(self).__name__

        def checked(theta: np.ndarray) -> tuple[float, np.ndarray]:
            f, g = fun(theta)
            if not (np.isfinite(f) and np.all(np.isfinite(g))):
                raise ValueError(
                    f"{who}: the NLL or its gradient is not finite (NLL {f!r}) at the "
                    f"parameters {theta.tolist()}; the scores are too extreme for this "
                    "calibrator"
                )
            return f, g

        def stationarity(theta: np.ndarray) -> float:
            g = checked(theta)[1].copy()
            g[:n_scale] *= theta[:n_scale]
            return float(np.max(np.abs(g)))

        x, n_iter = x0, 0
        res: Any = None
        # the objectives' dot products are memory-bound: one BLAS thread is faster
        with _runtime.blas_threads(1):
            for _ in range(1 + _LBFGS_RESTARTS):
                res = optimize.minimize(
                    checked, x, jac=True, method="L-BFGS-B", options=_LBFGS_OPTIONS
                )
                n_iter += int(res.nit)
                x = res.x
                gmax = stationarity(x)
                # a run cut off by its iteration limit is still moving, whatever its
                # gradient (a flat valley: vector scaling of pathmnist_resnet50 reported
                # convergence at its limit, 1.5e-4 nats short of where a restart went)
                limited = int(res.status) == 1
                if gmax <= GRAD_TOL and not limited:
                    break
        self.converged_ = bool(gmax <= GRAD_TOL and not limited)
        self.n_iter_ = n_iter
        if not self.converged_:
            why = (
                f"its iteration limit ({n_iter} iterations in {1 + _LBFGS_RESTARTS} runs)"
                if limited
                else f"a non-stationary point (largest gradient entry {gmax:.3g} > "
                f"{GRAD_TOL:g}; {res.message})"
            )
            warn_user(f"{who}: L-BFGS-B stopped at {why}; converged_ = False", KdecalWarning)
        return x


def _nll_and_residual(
    U: np.ndarray, y: np.ndarray, w: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """Mean (weighted) NLL of softmax(U) and ``w_i (softmax(U) - onehot(y)) / sum(w)``.

    ``U`` (float64, C-contiguous, a temporary of the caller) is overwritten: the
    residual is formed in its memory, so that a fit's objective allocates no other
    array of its size (at n = 40,000, K = 1,000 each is 320 MB).
    """
    n = U.shape[0]
    rows = np.arange(n)
    u_y = U[rows, y]  # a copy (fancy indexing)
    m = U.max(axis=1, keepdims=True)
    U -= m
    np.exp(U, out=U)
    S = U.sum(axis=1, keepdims=True)
    lse = (m + np.log(S))[:, 0]
    f = _weighted_mean(lse - u_y, w)
    U /= S
    U[rows, y] -= 1.0
    if w is None:
        U /= n
    else:
        U *= (w / np.sum(w))[:, None]
    return f, U


class AffineCalibration(_LBFGSMixin, _Calibrator):
    r"""Direction-preserving affine calibration ``softmax(alpha * log q + beta)``.

    Ferrer & Ramos 2025, Eq. 23 ("DP" calibration; multi-class Platt scaling,
    bias-corrected temperature scaling): a scalar scale ``alpha`` and a bias vector
    ``beta`` of length K on the log-probabilities ``log q = log_softmax(z)``, fitted by the
    mean NLL with :func:`scipy.optimize.minimize` (L-BFGS-B) from ``alpha = 1, beta = 0``
    (``alpha = 1 / s`` where the typical spread s of ``log q`` within a row lies outside
    [1/16, 16]: the fit is made on ``log q / s``)
    with the analytic gradient

    .. math:: \partial_\alpha = \frac1n \sum_i \sum_k (s_{ik} - y_{ik}) \log q_{ik},
       \qquad \partial_{\beta_k} = \frac1n \sum_i (s_{ik} - y_{ik}).

    The NLL is convex in ``(alpha, beta)``, so the optimum is global. Temperature scaling
    is the special case ``beta = 0`` (``alpha = 1/T``), hence the fitted NLL is never above
    that of :class:`TemperatureScaling`.

    Parameters
    ----------
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).

    Attributes
    ----------
    alpha_ : float
        Scale. Not constrained to be positive (as in the reference code, psrcal); a
        non-positive value triggers a warning, since it discards or reverses the ranking.
    beta_ : ndarray, shape (K,), float64
        Bias, centred to sum 0 (softmax ignores a common shift).
    nll_ : float
        Validation NLL at the optimum.
    converged_ : bool
        Whether the returned point is stationary: every entry of the gradient of the NLL
        with respect to the logarithm of each scale and to each bias is at most
        ``GRAD_TOL`` (1e-6 nats) in absolute value (judged at the point, not from the
        solver's stopping rule; L-BFGS-B is restarted up to 3 times until it holds), and
        the last run ended before its iteration limit (5,000).
    n_iter_ : int
        L-BFGS-B iterations, restarts included.
    n_classes_ : int
        K seen in :meth:`fit`.

    Warns
    -----
    KdecalWarning
        If the fit stops at a non-stationary point (``converged_ = False``), if
        ``alpha_ <= 0``, if a class never occurs in the fit labels (its bias then
        diverges to -infinity at the optimum), or if every fit label scores highest
        under the fitted map (separable data: the NLL has no finite minimiser;
        ``converged_ = False``).

    References
    ----------
    Ferrer & Ramos 2025, Sec. 3.1, Eq. 23; reference implementation psrcal
    ``AffineCalLogLoss``.
    """

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        K = L.shape[1]
        self._warn_absent(y, K, "bias", w)
        s = _problem_scale(L)  # fit alpha * s on L / s
        Ls = L / s

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            U = np.multiply(Ls, theta[0])
            U += theta[1:]
            f, R = _nll_and_residual(U, y, w)
            return f, np.concatenate([[np.vdot(R, Ls)], R.sum(axis=0)])

        # from the unit scale of the scaled problem (alpha = 1 / s): alpha = 1 would be
        # x = s there, 1e14 for logits of that size, where L-BFGS-B does not recover
        x = self._minimise(fun, np.concatenate([[1.0], np.zeros(K)]), 1)
        self.alpha_ = float(x[0] / s)
        self.beta_ = x[1:] - x[1:].mean()
        self.nll_ = _nll(x[0] * Ls + self.beta_, y, w)
        self._check_separable(x[0] * Ls + self.beta_, y, w)
        if self.alpha_ <= 0.0:
            warn_user(
                f"AffineCalibration: fitted alpha_ = {self.alpha_:.4g} <= 0; the calibrated "
                "probabilities ignore or reverse the ranking of the scores",
                KdecalWarning,
            )

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            U = self.alpha_ * L + self.beta_
        return _softmax_rows(U)


class VectorScaling(_LBFGSMixin, _Calibrator):
    r"""Vector scaling ``softmax(w * log q + b)`` with per-class scale w and bias b.

    Guo et al. 2017 (Sec. 4.2) apply a diagonal matrix and a bias to the logits; here, as
    everywhere in this module, the map acts on the log-probabilities
    ``log q = log_softmax(z)``, so that it depends only on the predicted distribution and
    ``input="logits"`` and ``input="probs"`` agree (on raw logits the per-class scales would
    also see the arbitrary per-row offset of the logits). Fitted by the mean NLL with
    L-BFGS-B from ``w = 1, b = 0`` (``w = 1 / s`` for log-probabilities of typical spread
    s outside [1/16, 16], as :class:`AffineCalibration`) with the analytic gradient
    ``dL/dw_k = (1/n) sum_i (s_ik - y_ik) log q_ik``, ``dL/db_k = (1/n) sum_i (s_ik - y_ik)``.

    The NLL is convex in ``(w, b)``, and :class:`AffineCalibration` is the special case
    ``w = alpha * 1``, so the fitted NLL is never above the affine one (which is never above
    temperature scaling's): ``NLL_VS <= NLL_affine <= NLL_TS`` on the fit data.

    Parameters
    ----------
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).

    Attributes
    ----------
    weights_ : ndarray, shape (K,), float64
        Per-class scales w.
    bias_ : ndarray, shape (K,), float64
        Per-class biases b, centred to sum 0.
    nll_ : float
        Validation NLL at the optimum.
    converged_ : bool
        Whether the returned point is stationary: every entry of the gradient of the NLL
        with respect to the logarithm of each scale and to each bias is at most
        ``GRAD_TOL`` (1e-6 nats) in absolute value (judged at the point, not from the
        solver's stopping rule; L-BFGS-B is restarted up to 3 times until it holds, and
        the last run ended before its iteration limit, 5,000), in the coordinates of the
        fit: ``w'_k (log q_k - c_k) + b'_k`` with ``c_k`` the median of ``log q_k`` over
        the fit rows of class k (the lower one; over every row where the class has
        none), which the biases absorb (``b_k = b'_k - w_k c_k``). The test is then
        invariant to rescaling the scores and to shifting ``log q``; in
        ``w_k log q_k + b_k`` itself it would weigh the biases' gradient by ``w_k c_k``,
        beyond float precision for logits of tiny spread (``w ~ 1e9``). The centring
        also makes the fit fast where a class is decided far from the other classes'
        log-probabilities (a scale and its bias otherwise trade off along a curved
        valley).
    n_iter_ : int
        L-BFGS-B iterations, restarts included.
    n_classes_ : int
        K seen in :meth:`fit`.

    Warns
    -----
    KdecalWarning
        If the fit stops at a non-stationary point (``converged_ = False``), if a class
        never occurs in the fit labels (its bias then diverges to -infinity), or if every
        fit label scores highest under the fitted map (separable data: the NLL has no
        finite minimiser; ``converged_ = False``).

    Notes
    -----
    Per-class scales can change the argmax (unlike TS and affine calibration).

    References
    ----------
    Guo et al. 2017, Sec. 4.2 (vector scaling); Ferrer & Ramos 2025, Sec. 3.1
    (the affine family it contains).
    """

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        K = L.shape[1]
        self._warn_absent(y, K, "bias", w)
        s = _problem_scale(L)  # fit w * s on (L - c) / s
        # each class centred where its own labels lie (c_k), which the biases absorb
        # exactly (w_k (L_k - c_k) + b'_k is w_k L_k + b_k with b_k = b'_k - w_k c_k):
        # otherwise a scale moves its class's bias with a lever arm of |L_k - c_k| / s
        # where that class is decided, a curved valley in (w_k, b_k) that L-BFGS-B
        # follows slowly (logits of tiny spread: log q near -log K everywhere;
        # pathmnist_resnet50: log q_1 within 3e-5 of 0 on its class's rows, w_1 ~ 1e4;
        # one constant c for every class stopped 1e-4 nats short after 10,000 iterations)
        c = _class_centres(L, y, w)
        Ls = (L - c) / s

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            U = np.multiply(Ls, theta[:K])
            U += theta[K:]
            f, R = _nll_and_residual(U, y, w)
            return f, np.concatenate([np.einsum("ij,ij->j", R, Ls), R.sum(axis=0)])

        x = self._minimise(fun, np.concatenate([np.ones(K), np.zeros(K)]), K)
        self.weights_ = x[:K] / s
        bias = x[K:] - self.weights_ * c
        self.bias_ = bias - bias.mean()
        U = x[:K] * Ls + x[K:]
        self.nll_ = _nll(U, y, w)
        self._check_separable(U, y, w)

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            U = self.weights_ * L + self.bias_
        return _softmax_rows(U)


# ------------------------------------------------------------- non-parametric methods


def _isotonic_regression() -> Callable[..., Any]:
    try:
        from scipy.optimize import isotonic_regression
    except ImportError as exc:  # pragma: no cover - scipy < 1.12
        import scipy

        raise ImportError(
            "IsotonicCalibration needs scipy >= 1.12 (scipy.optimize.isotonic_regression); "
            f"installed scipy is {scipy.__version__}"
        ) from exc
    return isotonic_regression


def _pav(
    x: np.ndarray, t: np.ndarray, w: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic (non-decreasing) fit of targets ``t`` on scores ``x``; ties pooled first.

    ``w`` are sample weights (samples of weight 0 are dropped). Returns the distinct
    scores (increasing) and the fitted value at each.
    """
    if w is not None:
        keep = w > 0
        x, t, w = x[keep], t[keep], w[keep]
    xs, inverse = np.unique(x, return_inverse=True)
    inverse = inverse.ravel()
    counts = np.bincount(inverse, weights=w, minlength=xs.size).astype(np.float64)
    tw = t if w is None else t * w
    means = np.bincount(inverse, weights=tw, minlength=xs.size) / counts
    fitted = _isotonic_regression()(means, weights=counts).x
    return xs, np.clip(fitted, 0.0, 1.0)


class IsotonicCalibration(_Calibrator):
    r"""Isotonic regression (PAV) calibration, one-vs-rest and renormalised.

    For each class k the targets ``1[y = k]`` are regressed on the class score by the
    pool-adjacent-violators algorithm (:func:`scipy.optimize.isotonic_regression`, tied
    scores pooled first), giving a non-decreasing step map from the fit scores to class
    frequencies. The score is the one-vs-rest log-odds ``log q_k - log(1 - q_k)``, a
    monotone function of ``q_k`` (so the fitted values are those of PAV on ``q_k``) that keeps
    resolution where ``q_k`` rounds to 1; between fitted scores the map is interpolated
    linearly in the log-odds, and beyond them it is constant (like scikit-learn's
    ``IsotonicRegression(out_of_bounds="clip")``).

    - K = 2 (binary ``(n,)`` or two columns): one PAV on class 1;
      ``s_1 = iso(q_1)``, ``s_0 = 1 - s_1`` (Ferrer & Ramos 2025, Sec. 3.3; Brümmer's PAV
      calibration).
    - K > 2: ``s_k = iso_k(q_k)`` for every class, then rows are divided by their sum
      (Chidambaram & Ge 2024, Sec. 3, with netcal's ``IsotonicRegression``). **Guard:** a
      row whose K one-vs-rest values are all 0 (every class maps to a zero-frequency block)
      has no information left; it is replaced by the class frequencies of the fit labels
      (``class_prior_``), the best constant prediction, instead of 0/0.

    Parameters
    ----------
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).

    Attributes
    ----------
    x_thresholds_ : list of K ndarrays, float64
        Distinct one-vs-rest log-odds of each class in the fit data, increasing.
    y_thresholds_ : list of K ndarrays, float64
        Fitted (PAV) frequency at each of them, non-decreasing, in [0, 1].
    class_prior_ : ndarray, shape (K,), float64
        Class frequencies of the fit labels (the all-zero-row fallback).
    n_classes_ : int
        K seen in :meth:`fit`.

    Notes
    -----
    Outputs can be exactly 0 or 1 (so the NLL can be infinite; kdecal's estimators clip at
    ``PROB_EPS``). For K > 2 renormalisation can change the argmax and create ties. On the
    binary fit data the output equals :func:`scipy.optimize.isotonic_regression` of the
    labels ordered by score, and it minimises every proper scoring rule among monotone
    maps of the fit scores (Ferrer & Ramos 2025, Sec. 3.3).

    References
    ----------
    Ferrer & Ramos 2025, Sec. 3.3 (PAV, binary); Chidambaram & Ge 2024, Sec. 3
    (IR one-vs-rest with renormalisation).
    """

    _fits_logs = False

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        K = L.shape[1]
        R = _ovr_log_odds(L)
        fits = [_pav(R[:, k], (y == k).astype(np.float64), w) for k in range(K)]
        self.x_thresholds_ = [f[0] for f in fits]
        self.y_thresholds_ = [f[1] for f in fits]
        self.class_prior_ = _class_frequencies(y, K, w)

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        K = L.shape[1]
        R = _ovr_log_odds(L)
        if K == 2:
            s1 = np.interp(R[:, 1], self.x_thresholds_[1], self.y_thresholds_[1])
            return np.stack([1.0 - s1, s1], axis=1)
        Q = np.stack(
            [np.interp(R[:, k], self.x_thresholds_[k], self.y_thresholds_[k]) for k in range(K)],
            axis=1,
        )
        return _renormalise(Q, self.class_prior_)


class HistogramBinning(_Calibrator):
    r"""Histogram binning, one-vs-rest with equal-width bins, renormalised.

    For each class k, ``[0, 1]`` is cut into ``n_bins`` equal-width right-closed bins
    ``(b/M, (b+1)/M]`` (a probability of exactly 0 goes to the first bin; the convention of
    ``kdecal.binned`` and of Ferrer & Ramos 2025, Sec. 3.2), and a probability ``q_k`` is
    replaced by the frequency of class k among the fit samples whose ``q_k`` fell in the
    same bin (Zadrozny & Elkan 2001; Guo et al. 2017, Sec. 4.1).

    - **Empty bins** (no fit sample) keep the **bin centre** ``(b + 1/2)/M``, as netcal's
      ``HistogramBinning`` used in Chidambaram & Ge 2024's experiments (Ferrer & Ramos'
      reference code uses 0, which makes the log loss infinite).
    - K = 2 (binary or two columns): bins on ``q_1`` only; ``s_0 = 1 - s_1``.
    - K > 2: per-class values, then rows divided by their sum; a row whose K values are all
      0 is replaced by the class frequencies of the fit labels (``class_prior_``), as in
      :class:`IsotonicCalibration`.

    Parameters
    ----------
    n_bins : int, default 15
        Number of equal-width bins M (15 as in Guo et al. 2017 and Chidambaram & Ge 2024).
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).

    Attributes
    ----------
    bin_edges_ : ndarray, shape (n_bins + 1,), float64
        ``linspace(0, 1, n_bins + 1)``.
    bin_values_ : ndarray, shape (K, n_bins), float64
        Calibrated value of each class and bin (the frequency, or the centre if empty).
    bin_counts_ : ndarray, shape (K, n_bins), int64
        Number of fit samples in each class's bins.
    class_prior_ : ndarray, shape (K,), float64
        Class frequencies of the fit labels (the all-zero-row fallback).
    n_classes_ : int
        K seen in :meth:`fit`.

    Raises
    ------
    TypeError, ValueError
        In :meth:`fit`, if ``n_bins`` is not an integer in ``1..max(n, 1000)`` (more
        bins than that would only add empty bins).

    Notes
    -----
    Outputs can be exactly 0 or 1. For K > 2 the map is not monotone after renormalisation
    and can change the argmax (Chidambaram & Ge 2024, Table 1: accuracy drops).

    References
    ----------
    Ferrer & Ramos 2025, Sec. 3.2; Chidambaram & Ge 2024, Sec. 3, Table 1;
    Guo et al. 2017, Sec. 4.1.
    """

    _fits_logs = False

    def __init__(self, n_bins: int = 15, input: Input = "auto") -> None:
        super().__init__(input)
        self.n_bins = n_bins

    def _bin_index(self, P: np.ndarray) -> np.ndarray:
        # kdecal's one bin rule (right-closed bins), applied to every entry
        return bin_index(P.ravel(), self.bin_edges_).reshape(P.shape)

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        M = check_n_bins(self.n_bins, L.shape[0])
        K = L.shape[1]
        self.bin_edges_ = np.linspace(0.0, 1.0, M + 1)
        idx = self._bin_index(P)
        centres = (np.arange(M) + 0.5) / M
        ww = np.ones(L.shape[0]) if w is None else w
        counts = np.zeros((K, M), dtype=np.int64)
        values = np.empty((K, M))
        for k in range(K):
            counts[k] = np.bincount(idx[:, k], weights=ww > 0, minlength=M).astype(np.int64)
            mass = np.bincount(idx[:, k], weights=ww, minlength=M)
            pos = np.bincount(idx[:, k], weights=ww * (y == k), minlength=M)
            with np.errstate(invalid="ignore", divide="ignore"):
                values[k] = np.where(mass > 0, pos / np.where(mass > 0, mass, 1.0), centres)
        self.bin_counts_ = counts
        self.bin_values_ = values
        self.class_prior_ = _class_frequencies(y, K, w)

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        K = L.shape[1]
        idx = self._bin_index(P)
        if K == 2:
            s1 = self.bin_values_[1, idx[:, 1]]
            return np.stack([1.0 - s1, s1], axis=1)
        Q = np.take_along_axis(self.bin_values_.T, idx, axis=0)
        return _renormalise(Q, self.class_prior_)


_MR_CHOICES = ("top_label", "canonical")


class MeanReplacement(_Calibrator):
    r"""Mean replacement recalibration (MRR): a trivially calibrated, useless predictor.

    Chidambaram & Ge 2024, Sec. 3, show that calibration error plus accuracy cannot detect
    this "recalibration", which is perfectly calibrated but has no sharpness; it is here so
    that users can see the pitfall (compare its NLL or Brier score with the others').

    - ``calibration="top_label"`` (default; the paper's MRR): keep the argmax class
      ``c(x)``, replace the confidence by the top-1 accuracy ``a`` of the fit data, and set
      every other class to ``(1 - a)/(K - 1)`` (the paper's choice for a full probability
      vector, Sec. 3). Accuracy is unchanged and the population top-label ECE is 0
      (Eq. 3.1) when ``a > 1/K``; ties in the argmax go to the lower class index. At
      ``a <= 1/K`` the kept class gets no more probability than the others, so the
      argmax moves (a warning says so).
    - ``calibration="canonical"``: replace every prediction by the mean one-hot label
      vector (the class frequencies of the fit data), the constant predictor
      ``g(X) = pi_Y`` that satisfies canonical calibration (Sec. 3, first paragraph; Ferrer
      & Ramos 2025, Eq. 21, "naive prior classifier").

    By Theorem 4.2 of Chidambaram & Ge, the constant (prior) predictor has the worst
    expected Bregman loss of all perfectly calibrated predictors.

    Parameters
    ----------
    calibration : {"top_label", "canonical"}, default "top_label"
        Which trivial recalibration (see above).
    input : {"auto", "logits", "probs"}, default "auto"
        Kind of scores (see the module docstring).

    Attributes
    ----------
    accuracy_ : float
        Top-1 accuracy of the fit scores (``a``).
    class_frequencies_ : ndarray, shape (K,), float64
        Class frequencies of the fit labels (the mean one-hot label vector).
    n_classes_ : int
        K seen in :meth:`fit`.

    Raises
    ------
    ValueError
        In :meth:`fit`, for an unknown ``calibration``.

    Warns
    -----
    KdecalWarning
        In :meth:`fit`, top-label, when the fit accuracy is at most 1/K.

    References
    ----------
    Chidambaram & Ge 2024, Sec. 3 (MRR, Eq. 3.1), Theorem 4.2, Table 1.
    """

    _fits_logs = False

    def __init__(
        self, calibration: Literal["top_label", "canonical"] = "top_label", input: Input = "auto"
    ) -> None:
        super().__init__(input)
        self.calibration = calibration

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> None:
        check_choice(self.calibration, "calibration", _MR_CHOICES)
        K = L.shape[1]
        self.accuracy_ = _weighted_mean((np.argmax(L, axis=1) == y).astype(np.float64), w)
        self.class_frequencies_ = _class_frequencies(y, K, w)
        if self.calibration == "top_label" and self.accuracy_ <= 1.0 / K:
            warn_user(
                f"MeanReplacement: the fit accuracy {self.accuracy_:.4g} is at most 1/K = "
                f"{1.0 / K:.4g}, so the predicted class gets no more probability than the "
                "others: transform moves the argmax and does not keep the accuracy",
                KdecalWarning,
            )

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        n, K = L.shape
        if check_choice(self.calibration, "calibration", _MR_CHOICES) == "canonical":
            return np.tile(self.class_frequencies_, (n, 1))
        a = self.accuracy_
        Q = np.full((n, K), (1.0 - a) / (K - 1))
        Q[np.arange(n), np.argmax(L, axis=1)] = a
        return Q
