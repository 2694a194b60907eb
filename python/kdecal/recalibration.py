"""Post-hoc recalibration maps (calibrators), scikit-learn style.

Every calibrator is fitted on held-out (validation) scores and labels and then maps new
scores of the same classifier to calibrated probabilities::

    cal = TemperatureScaling().fit(val_logits, val_labels)   # input="logits" (default)
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
- ``scores`` is anything :func:`numpy.asarray` accepts. With ``input="logits"`` (the
  default) it holds real logits, shape ``(n, K)``; with ``input="probs"`` it holds
  probabilities (rows on the simplex, checked and clipped to ``kdecal.PROB_EPS`` exactly
  like every other kdecal function), which are turned into log-probabilities. Since
  ``softmax`` is invariant to a constant added to a row, a row of logits and the log of its
  softmax describe the same prediction; every calibrator here works on the
  log-probabilities ``log q = log_softmax(z)``, so the two inputs give the same fitted map
  (up to that clipping).
- Binary problems: a 1-D ``scores`` of shape ``(n,)`` is the logit ``log(p / (1 - p))`` of
  class 1 (``input="logits"``) or ``P(y = 1)`` (``input="probs"``), i.e. the two-class
  problem with logits ``(0, t)``. For a 1-D input :meth:`transform` returns the calibrated
  ``P(y = 1)``, shape ``(n,)``; for a 2-D input it returns ``(n, K)``. A calibrator fitted
  on one form can transform the other.
- ``labels`` are integers in ``0..K-1``. Classes that do not occur in the fit labels are
  allowed (K is the number of score columns).
- Output is always float64; rows of 2-D outputs sum to 1.
- Fitted parameters are attributes with a trailing underscore; :meth:`transform` before
  :meth:`fit` raises :class:`NotFittedError`. Bad input raises ``ValueError`` or
  ``TypeError`` naming the argument and the bad value, as everywhere in kdecal.
- Solvers are those of :mod:`scipy.optimize` (``minimize_scalar``, ``brentq``,
  ``minimize`` with L-BFGS-B and analytic gradients, ``isotonic_regression``).

References
----------
.. [001] L. Clarté, B. Loureiro, F. Krzakala, L. Zdeborová. "Expectation consistency for
   calibration of neural networks". arXiv:2303.02644, 2023.
.. [002] M. Chidambaram, R. Ge. "Reassessing How to Compare and Improve the Calibration
   of Machine Learning Models". 2024.
.. [004] L. Ferrer, D. Ramos. "Evaluating Posterior Probabilities: Decision Theory,
   Proper Scoring Rules, and Calibration". TMLR 2025.
.. [Guo17] C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger. "On Calibration of Modern Neural
   Networks". ICML 2017.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import optimize
from scipy.special import log_softmax, logsumexp

from ._validation import _numeric_array, check_choice, check_int, check_labels, check_probs
from .warnings import KdecalWarning

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
INPUTS = ("logits", "probs")
#: Fewest samples :meth:`fit` accepts.
MIN_FIT_SAMPLES = 2
#: Rows of logits that look like probabilities (``input="logits"`` given probabilities).
_SIMPLEX_ATOL = 1e-6
#: L-BFGS-B options of the affine and vector-scaling fits (max |gradient| ~ 1e-8 at the end
#: on real data; the defaults stop at ~1e-5).
_LBFGS_OPTIONS = {"maxiter": 5000, "maxls": 50, "ftol": 1e-14, "gtol": 1e-9}
#: brentq tolerances on log T (relative precision of T ~ 1e-14).
_BRENT_XTOL = 1e-14
_BRENT_RTOL = 4 * np.finfo(float).eps
#: Bracket expansion of :class:`ExpectationConsistency` stops beyond |log T| = this.
_LOG_T_MAX = 700.0


class NotFittedError(ValueError, AttributeError):
    """A calibrator was used before :meth:`fit` (same bases as scikit-learn's)."""


# ---------------------------------------------------------------------------- helpers


def _log_probs(
    scores: object, input: str, min_n: int, name: str = "scores"
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Validate ``scores``; return ``(log q, q, binary)``, both (n, K) float64.

    For ``input="probs"``, ``q`` is the validated (clipped, renormalised) input itself, not
    ``exp(log q)``, so that bin edges are compared with the values the user passed.
    """
    if input == "probs":
        P = check_probs(scores, name, min_n=min_n)
        return np.log(P.p), P.p, P.binary
    arr = _numeric_array(scores, name)
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if arr.ndim == 2 and arr.shape[1] == 1:
        raise ValueError(
            f"{name} has shape {arr.shape}: K = 1 class is not a classification problem; "
            "pass a 1-D array of class-1 logits for binary problems"
        )
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (n, K) or (n,), got shape {arr.shape}")
    z = arr.astype(np.float64)
    if not np.all(np.isfinite(z)):
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(z))[0])
        raise ValueError(f"{name} contains a non-finite value {float(z[idx])!r} at index {idx}")
    if z.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {z.shape[0]}")
    binary = z.ndim == 1
    if binary:
        z = np.stack([np.zeros_like(z), z], axis=1)
    L = log_softmax(z, axis=1)
    return L, np.exp(L), binary


def _looks_like_probs(scores: object) -> bool:
    arr = np.asarray(scores, dtype=np.float64)  # called after validation
    return bool(
        arr.ndim == 2
        and np.all(arr >= 0)
        and np.all(arr <= 1)
        and np.all(np.abs(arr.sum(axis=1) - 1.0) <= _SIMPLEX_ATOL)
    )


def _softmax_rows(U: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Row-wise ``softmax(scale * U)`` of finite ``U``, ``scale > 0``.

    The row maximum is subtracted before scaling, so the largest exponent is exactly 0 and
    very large scales (tiny temperatures) only underflow the other entries to 0.
    """
    with np.errstate(over="ignore", under="ignore"):
        E = np.exp((U - U.max(axis=1, keepdims=True)) * scale)
    return E / E.sum(axis=1, keepdims=True)


def _nll(U: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood of ``softmax(U)`` at labels ``y``."""
    return float(np.mean(logsumexp(U, axis=1) - U[np.arange(U.shape[0]), y]))


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


def _polish_increasing_root(
    f: Callable[[float], float], u: float, lo: float, hi: float, f_lo: float, f_hi: float
) -> float:
    """Root of a non-decreasing ``f`` near ``u`` with ``f(lo) < 0 < f(hi)`` (brentq)."""
    step = 1e-6
    while True:
        a, b = max(u - step, lo), min(u + step, hi)
        fa = f_lo if a == lo else f(a)
        fb = f_hi if b == hi else f(b)
        if fa <= 0.0 <= fb:
            break
        step *= 10.0
    if fa == 0.0:
        return a
    if fb == 0.0:
        return b
    return float(optimize.brentq(f, a, b, xtol=_BRENT_XTOL, rtol=_BRENT_RTOL, maxiter=500))


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
    """Shared ``fit`` / ``transform`` plumbing (validation, binary form, fitted check)."""

    _param_names: tuple[str, ...] = ("input",)

    def __init__(self, input: str = "logits") -> None:
        self.input = input

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._param_names)
        return f"{type(self).__name__}({args})"

    def get_params(self) -> dict[str, Any]:
        """Return the constructor arguments as a dict (scikit-learn convention)."""
        return {k: getattr(self, k) for k in self._param_names}

    # subclasses implement these two on validated log-probabilities -------------------
    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:  # pragma: no cover
        raise NotImplementedError

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    # public API ------------------------------------------------------------------------
    def fit(self, scores: object, labels: object) -> _Calibrator:
        """Fit the calibrator on held-out scores and labels.

        Parameters
        ----------
        scores : array-like, shape (n, K) or (n,)
            Logits (``input="logits"``) or probabilities (``input="probs"``) of the
            classifier on the calibration (validation) set; see the module docstring for
            the binary ``(n,)`` form. At least 2 samples.
        labels : array-like of int, shape (n,)
            True classes in ``0..K-1``.

        Returns
        -------
        self
            The fitted calibrator.

        Raises
        ------
        TypeError
            Non-numeric ``scores`` or ``labels``.
        ValueError
            Unknown ``input``; wrong shapes; NaN or infinite scores; probabilities off the
            simplex (``input="probs"``); labels out of range or not integers; n < 2; and the
            method-specific cases listed in each class.
        """
        inp = check_choice(self.input, "input", INPUTS)
        L, P, _ = _log_probs(scores, inp, MIN_FIT_SAMPLES)
        y = check_labels(labels, L.shape[0], L.shape[1])
        if inp == "logits" and _looks_like_probs(scores):
            warnings.warn(
                "scores look like probabilities (every row is on the simplex) but "
                "input='logits'; pass input='probs' if they are probabilities",
                KdecalWarning,
                stacklevel=2,
            )
        self._fit(L, P, y)
        self.n_classes_ = int(L.shape[1])
        return self

    def transform(self, scores: object) -> np.ndarray:
        """Calibrated probabilities of new scores.

        Parameters
        ----------
        scores : array-like, shape (n, K) or (n,)
            Scores of the same kind (``input``) and number of classes as in :meth:`fit`.

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
        if not hasattr(self, "n_classes_"):
            raise NotFittedError(
                f"this {type(self).__name__} instance is not fitted yet; call "
                "fit(scores, labels) before transform"
            )
        inp = check_choice(self.input, "input", INPUTS)
        L, P, binary = _log_probs(scores, inp, 1)
        if L.shape[1] != self.n_classes_:
            shape = np.shape(np.asarray(scores))
            raise ValueError(
                f"scores has K = {L.shape[1]} classes (shape {shape}) but "
                f"{type(self).__name__} was fitted with K = {self.n_classes_}"
            )
        Q = np.ascontiguousarray(self._transform(L, P), dtype=np.float64)
        return Q[:, 1].copy() if binary else Q

    def fit_transform(self, scores: object, labels: object) -> np.ndarray:
        """``fit(scores, labels).transform(scores)``; see :meth:`fit` and :meth:`transform`."""
        return self.fit(scores, labels).transform(scores)


# ----------------------------------------------------------------- temperature methods


class _TemperatureMixin:
    temperature_: float

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        return _softmax_rows(L, 1.0 / self.temperature_)


class TemperatureScaling(_TemperatureMixin, _Calibrator):
    r"""Temperature scaling: ``softmax(z / T)`` with T minimising the validation NLL.

    ``T_TS = argmin_T (1/n) sum_i [ log sum_k exp(z_ik / T) - z_{i,y_i} / T ]``
    (Guo et al. 2017; Clarté et al. 2023, Eq. 4, whose extra minus sign is a typo). The NLL
    is convex in ``beta = 1/T`` (a log-sum-exp of a linear map minus a linear term), so it
    is minimised over ``log beta`` in ``[1/T_max, 1/T_min]`` with the bounded Brent search of
    :func:`scipy.optimize.minimize_scalar`, and the result is refined to machine precision
    by :func:`scipy.optimize.brentq` on the (non-decreasing) analytic derivative

    .. math:: \frac{d\,\mathrm{NLL}}{d\beta} = \frac1n \sum_i \Big(\sum_k p_{ik}(\beta)
       z_{ik} - z_{i,y_i}\Big), \qquad p_i(\beta) = \mathrm{softmax}(\beta z_i).

    Parameters
    ----------
    input : {"logits", "probs"}, default "logits"
        Kind of scores (see the module docstring).
    bounds : (float, float), default (1e-3, 1e3)
        Search interval ``(T_min, T_max)`` for the temperature.

    Attributes
    ----------
    temperature_ : float
        The fitted temperature T.
    converged_ : bool
        False when the NLL has no minimum inside ``bounds`` (see Warns); ``temperature_``
        is then the bound that the NLL decreases towards.
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
        (Clarté et al. 2023; see ``docs/notes/clarte_2023.md`` section 1.1).

    Notes
    -----
    ``argmax`` (accuracy) does not depend on T. Scaling the logits by ``c > 0`` scales the
    fitted T by ``c``; adding a constant to a row changes nothing; so ``input="logits"``
    and ``input="probs"`` on ``softmax(z)`` give the same T (up to the ``PROB_EPS``
    clipping of the probabilities).

    References
    ----------
    Guo et al. 2017, Sec. 4.2; Clarté et al. 2023 [001], Sec. 3, Eq. 4; Ferrer & Ramos 2025
    [004], Sec. 3 (temperature scaling as affine calibration with beta = 0).

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

    _param_names = ("input", "bounds")

    def __init__(self, input: str = "logits", bounds: tuple[float, float] = (1e-3, 1e3)) -> None:
        super().__init__(input)
        self.bounds = bounds

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        t_min, t_max = _check_bounds(self.bounds)
        n = L.shape[0]
        ly = L[np.arange(n), y]

        def nll(beta: float) -> float:
            return _nll(beta * L, y)

        def grad(beta: float) -> float:
            S = _softmax_rows(L, beta)
            return float(np.mean(np.sum(S * L, axis=1) - ly))

        u_lo, u_hi = np.log(1.0 / t_max), np.log(1.0 / t_min)  # log beta
        g_lo, g_hi = grad(np.exp(u_lo)), grad(np.exp(u_hi))
        self.converged_ = False
        if g_hi <= 0.0:  # NLL still decreasing at the smallest temperature
            T = t_min
            if np.all(ly == L.max(axis=1)):
                msg = (
                    "TemperatureScaling: every validation label is a top-scoring class "
                    "(100% validation accuracy): the NLL decreases monotonically as T -> 0 "
                    f"and has no finite minimiser; temperature_ is clipped to T_min = {t_min:g} "
                    "(converged_ = False). Use more or harder validation data."
                )
            else:
                msg = (
                    f"TemperatureScaling: the NLL is still decreasing at T_min = {t_min:g}; "
                    "temperature_ is clipped to it (converged_ = False); widen bounds"
                )
            warnings.warn(msg, KdecalWarning, stacklevel=3)
        elif g_lo >= 0.0:  # NLL non-increasing up to the largest temperature
            T = t_max
            warnings.warn(
                f"TemperatureScaling: the NLL does not increase up to T_max = {t_max:g} (the "
                "scores carry little or no information about the labels, or the optimum lies "
                "beyond bounds); temperature_ is clipped to T_max (converged_ = False)",
                KdecalWarning,
                stacklevel=3,
            )
        else:
            res = optimize.minimize_scalar(
                lambda u: nll(np.exp(u)),
                bounds=(u_lo, u_hi),
                method="bounded",
                options={"xatol": 1e-10, "maxiter": 500},
            )
            u = _polish_increasing_root(
                lambda v: grad(np.exp(v)), float(res.x), u_lo, u_hi, g_lo, g_hi
            )
            T = float(np.exp(-u))
            self.converged_ = True
        self.temperature_ = float(T)
        self.nll_ = nll(1.0 / self.temperature_)


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
    input : {"logits", "probs"}, default "logits"
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
    consistent for T0 (``docs/notes/clarte_2023.md`` section 1.3).

    References
    ----------
    Clarté et al. 2023 [001], Algorithm 1, Eq. 5, Sec. 3 (top-N variant).
    """

    _param_names = ("top_k", "input")

    def __init__(self, top_k: int = 1, input: str = "logits") -> None:
        super().__init__(input)
        self.top_k = top_k

    @staticmethod
    def _top_sets(L: np.ndarray, k: int) -> np.ndarray:
        return np.argsort(-L, axis=1, kind="stable")[:, :k]

    @staticmethod
    def _mean_confidence(L: np.ndarray, top: np.ndarray, T: float) -> float:
        S = _softmax_rows(L, 1.0 / T)
        return float(np.mean(np.take_along_axis(S, top, axis=1).sum(axis=1)))

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        K = L.shape[1]
        k = check_int(self.top_k, "top_k", 1)
        if k >= K:
            raise ValueError(f"top_k must be < K = {K} (k = K is trivial), got {k}")
        top = self._top_sets(L, k)
        acc = float(np.mean(np.any(top == y[:, None], axis=1)))
        is_max = L == L.max(axis=1, keepdims=True)
        sup = float(
            np.mean(np.take_along_axis(is_max, top, axis=1).sum(axis=1) / is_max.sum(axis=1))
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

        def f(u: float) -> float:  # decreasing in u = log T
            return self._mean_confidence(L, top, float(np.exp(u))) - acc

        # bracket expansion in log T from [-1, 1], doubling the step
        lo, hi, step = -1.0, 1.0, 1.0
        f_lo, f_hi = f(lo), f(hi)
        while f_lo < 0.0 and lo > -_LOG_T_MAX:
            step *= 2.0
            lo, hi, f_hi = lo - step, lo, f_lo
            f_lo = f(lo)
        while f_hi > 0.0 and hi < _LOG_T_MAX:
            step *= 2.0
            lo, hi, f_lo = hi, hi + step, f_hi
            f_hi = f(hi)
        if f_lo == 0.0:
            u = lo
        elif f_hi == 0.0:
            u = hi
        elif f_lo > 0.0 > f_hi:
            u = optimize.brentq(f, lo, hi, xtol=_BRENT_XTOL, rtol=_BRENT_RTOL, maxiter=500)
        else:  # pragma: no cover - excluded by the existence checks above
            raise ValueError(
                "ExpectationConsistency: could not bracket the temperature in "
                f"[exp(-{_LOG_T_MAX:g}), exp({_LOG_T_MAX:g})]"
            )
        self.temperature_ = float(np.exp(u))
        self.accuracy_ = acc
        self.confidence_ = self._mean_confidence(L, top, self.temperature_)
        self.converged_ = True


# ------------------------------------------------------------------- affine families


class _LBFGSMixin:
    """L-BFGS-B fit of ``softmax(A(theta, log q))`` by mean NLL, analytic gradient."""

    def _warn_absent(self, y: np.ndarray, K: int, what: str) -> None:
        absent = np.flatnonzero(np.bincount(y, minlength=K) == 0)
        if absent.size:
            warnings.warn(
                f"{type(self).__name__}: class(es) {absent.tolist()} never occur in the fit "
                f"labels; their {what} tends to -infinity at the NLL optimum and the "
                "optimiser stops at a large finite value",
                KdecalWarning,
                stacklevel=4,
            )

    def _minimise(self, fun: Callable[..., Any], x0: np.ndarray) -> Any:
        res = optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", options=_LBFGS_OPTIONS)
        self.converged_ = bool(res.success)
        self.n_iter_ = int(res.nit)
        if not res.success:
            warnings.warn(
                f"{type(self).__name__}: L-BFGS-B did not converge ({res.message})",
                KdecalWarning,
                stacklevel=4,
            )
        return res


def _nll_and_residual(U: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean NLL of softmax(U) and ``(softmax(U) - onehot(y)) / n``."""
    n = U.shape[0]
    rows = np.arange(n)
    m = U.max(axis=1, keepdims=True)
    E = np.exp(U - m)
    S = E.sum(axis=1, keepdims=True)
    lse = (m + np.log(S))[:, 0]
    f = float(np.mean(lse - U[rows, y]))
    R = E / S
    R[rows, y] -= 1.0
    return f, R / n


class AffineCalibration(_LBFGSMixin, _Calibrator):
    r"""Direction-preserving affine calibration ``softmax(alpha * log q + beta)``.

    Ferrer & Ramos 2025, Eq. 23 ("DP" calibration; multi-class Platt scaling,
    bias-corrected temperature scaling): a scalar scale ``alpha`` and a bias vector
    ``beta`` of length K on the log-probabilities ``log q = log_softmax(z)``, fitted by the
    mean NLL with :func:`scipy.optimize.minimize` (L-BFGS-B) from ``alpha = 1, beta = 0``
    with the analytic gradient

    .. math:: \partial_\alpha = \frac1n \sum_i \sum_k (s_{ik} - y_{ik}) \log q_{ik},
       \qquad \partial_{\beta_k} = \frac1n \sum_i (s_{ik} - y_{ik}).

    The NLL is convex in ``(alpha, beta)``, so the optimum is global. Temperature scaling
    is the special case ``beta = 0`` (``alpha = 1/T``), hence the fitted NLL is never above
    that of :class:`TemperatureScaling`.

    Parameters
    ----------
    input : {"logits", "probs"}, default "logits"
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
        Whether L-BFGS-B reported success.
    n_iter_ : int
        L-BFGS-B iterations.
    n_classes_ : int
        K seen in :meth:`fit`.

    Warns
    -----
    KdecalWarning
        If L-BFGS-B does not converge, if ``alpha_ <= 0``, or if a class never occurs in
        the fit labels (its bias then diverges to -infinity at the optimum).

    References
    ----------
    Ferrer & Ramos 2025 [004], Sec. 3.1, Eq. 23; reference implementation psrcal
    ``AffineCalLogLoss`` (see ``docs/notes/ferrer_ramos_2025.md`` section 3.1).
    """

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        K = L.shape[1]
        self._warn_absent(y, K, "bias")

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            f, R = _nll_and_residual(theta[0] * L + theta[1:], y)
            return f, np.concatenate([[np.sum(R * L)], R.sum(axis=0)])

        res = self._minimise(fun, np.concatenate([[1.0], np.zeros(K)]))
        self.alpha_ = float(res.x[0])
        self.beta_ = res.x[1:] - res.x[1:].mean()
        self.nll_ = _nll(self.alpha_ * L + self.beta_, y)
        if self.alpha_ <= 0.0:
            warnings.warn(
                f"AffineCalibration: fitted alpha_ = {self.alpha_:.4g} <= 0; the calibrated "
                "probabilities ignore or reverse the ranking of the scores",
                KdecalWarning,
                stacklevel=3,
            )

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        return _softmax_rows(self.alpha_ * L + self.beta_)


class VectorScaling(_LBFGSMixin, _Calibrator):
    r"""Vector scaling ``softmax(w * log q + b)`` with per-class scale w and bias b.

    Guo et al. 2017 (Sec. 4.2) apply a diagonal matrix and a bias to the logits; here, as
    everywhere in this module, the map acts on the log-probabilities
    ``log q = log_softmax(z)``, so that it depends only on the predicted distribution and
    ``input="logits"`` and ``input="probs"`` agree (on raw logits the per-class scales would
    also see the arbitrary per-row offset of the logits). Fitted by the mean NLL with
    L-BFGS-B from ``w = 1, b = 0`` with the analytic gradient
    ``dL/dw_k = (1/n) sum_i (s_ik - y_ik) log q_ik``, ``dL/db_k = (1/n) sum_i (s_ik - y_ik)``.

    The NLL is convex in ``(w, b)``, and :class:`AffineCalibration` is the special case
    ``w = alpha * 1``, so the fitted NLL is never above the affine one (which is never above
    temperature scaling's): ``NLL_VS <= NLL_affine <= NLL_TS`` on the fit data.

    Parameters
    ----------
    input : {"logits", "probs"}, default "logits"
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
        Whether L-BFGS-B reported success.
    n_iter_ : int
        L-BFGS-B iterations.
    n_classes_ : int
        K seen in :meth:`fit`.

    Warns
    -----
    KdecalWarning
        If L-BFGS-B does not converge, or if a class never occurs in the fit labels (its
        bias then diverges to -infinity).

    Notes
    -----
    Per-class scales can change the argmax (unlike TS and affine calibration).

    References
    ----------
    Guo et al. 2017, Sec. 4.2 (vector scaling); Ferrer & Ramos 2025 [004], Sec. 3.1
    (the affine family it contains).
    """

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        K = L.shape[1]
        self._warn_absent(y, K, "bias")

        def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
            f, R = _nll_and_residual(theta[:K] * L + theta[K:], y)
            return f, np.concatenate([np.sum(R * L, axis=0), R.sum(axis=0)])

        res = self._minimise(fun, np.concatenate([np.ones(K), np.zeros(K)]))
        self.weights_ = res.x[:K].copy()
        self.bias_ = res.x[K:] - res.x[K:].mean()
        self.nll_ = _nll(self.weights_ * L + self.bias_, y)

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        return _softmax_rows(self.weights_ * L + self.bias_)


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


def _pav(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isotonic (non-decreasing) fit of targets ``t`` on scores ``x``; ties pooled first.

    Returns the distinct scores (increasing) and the fitted value at each.
    """
    xs, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    means = np.bincount(inverse, weights=t, minlength=xs.size) / counts
    fitted = _isotonic_regression()(means, weights=counts.astype(np.float64)).x
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
    input : {"logits", "probs"}, default "logits"
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
    Ferrer & Ramos 2025 [004], Sec. 3.3 (PAV, binary); Chidambaram & Ge 2024 [002], Sec. 3
    (IR one-vs-rest with renormalisation).
    """

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        K = L.shape[1]
        R = _ovr_log_odds(L)
        fits = [_pav(R[:, k], (y == k).astype(np.float64)) for k in range(K)]
        self.x_thresholds_ = [f[0] for f in fits]
        self.y_thresholds_ = [f[1] for f in fits]
        self.class_prior_ = np.bincount(y, minlength=K) / y.shape[0]

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
    input : {"logits", "probs"}, default "logits"
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
        In :meth:`fit`, if ``n_bins`` is not an integer >= 1.

    Notes
    -----
    Outputs can be exactly 0 or 1. For K > 2 the map is not monotone after renormalisation
    and can change the argmax (Chidambaram & Ge 2024, Table 1: accuracy drops).

    References
    ----------
    Ferrer & Ramos 2025 [004], Sec. 3.2; Chidambaram & Ge 2024 [002], Sec. 3, Table 1;
    Guo et al. 2017, Sec. 4.1.
    """

    _param_names = ("n_bins", "input")

    def __init__(self, n_bins: int = 15, input: str = "logits") -> None:
        super().__init__(input)
        self.n_bins = n_bins

    def _bin_index(self, P: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.bin_edges_, P, side="left") - 1
        return np.clip(idx, 0, self.bin_edges_.size - 2)

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        M = check_int(self.n_bins, "n_bins", 1)
        K = L.shape[1]
        self.bin_edges_ = np.linspace(0.0, 1.0, M + 1)
        idx = self._bin_index(P)
        centres = (np.arange(M) + 0.5) / M
        counts = np.zeros((K, M), dtype=np.int64)
        values = np.empty((K, M))
        for k in range(K):
            counts[k] = np.bincount(idx[:, k], minlength=M)
            pos = np.bincount(idx[:, k], weights=(y == k).astype(np.float64), minlength=M)
            with np.errstate(invalid="ignore", divide="ignore"):
                values[k] = np.where(counts[k] > 0, pos / np.maximum(counts[k], 1), centres)
        self.bin_counts_ = counts
        self.bin_values_ = values
        self.class_prior_ = np.bincount(y, minlength=K) / y.shape[0]

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
      (Eq. 3.1). Ties in the argmax go to the lower class index.
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
    input : {"logits", "probs"}, default "logits"
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

    References
    ----------
    Chidambaram & Ge 2024 [002], Sec. 3 (MRR, Eq. 3.1), Theorem 4.2, Table 1.
    """

    _param_names = ("calibration", "input")

    def __init__(self, calibration: str = "top_label", input: str = "logits") -> None:
        super().__init__(input)
        self.calibration = calibration

    def _fit(self, L: np.ndarray, P: np.ndarray, y: np.ndarray) -> None:
        check_choice(self.calibration, "calibration", _MR_CHOICES)
        K = L.shape[1]
        self.accuracy_ = float(np.mean(np.argmax(L, axis=1) == y))
        self.class_frequencies_ = np.bincount(y, minlength=K) / y.shape[0]

    def _transform(self, L: np.ndarray, P: np.ndarray) -> np.ndarray:
        n, K = L.shape
        if check_choice(self.calibration, "calibration", _MR_CHOICES) == "canonical":
            return np.tile(self.class_frequencies_, (n, 1))
        a = self.accuracy_
        Q = np.full((n, K), (1.0 - a) / (K - 1))
        Q[np.arange(n), np.argmax(L, axis=1)] = a
        return Q
