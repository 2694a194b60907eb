"""Kernel (Dirichlet-KDE) estimators of calibration error.

Every estimator here is a cheap O(nK) plug-in on top of one leave-one-out pass of the
compiled engine (:func:`kdecal._backends.loo_reduce`), which returns, per query row,
the running max and class-wise sums of the Dirichlet kernel (DESIGN.md section 2).

References
----------
.. [003] T. Popordanoska, R. Sayer, M. B. Blaschko. "A Consistent and Differentiable
   L_p Canonical Calibration Error Estimator". NeurIPS 2022.
.. [000] T. Popordanoska, S. G. Gruber, A. Tiulpin, F. Buettner, M. B. Blaschko.
   "Consistent and Asymptotically Unbiased Estimation of Proper Calibration Errors".
   AISTATS 2024.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import softmax as _sp_softmax
from scipy.special import xlogy

from . import _backends
from . import _estimators as _est
from ._report import CalibrationReport
from ._validation import (
    Probs,
    _numeric_array,
    check_bandwidth,
    check_bandwidths,
    check_choice,
    check_labels,
    check_p,
    check_probs,
)

__all__ = [
    "DEFAULT_BANDWIDTH_GRID",
    "Bregman",
    "calibration_error",
    "conditional_expectation",
    "ece_kde",
    "evaluate",
    "loo_log_likelihood",
    "refinement",
    "select_bandwidth",
    "sharpness",
    "softmax",
]

#: Default grid of :func:`select_bandwidth`: 50 log-spaced values in [1e-5, 1e-1] and
#: 0.2, 0.4, 0.6, 0.8, 1.0 (the grid of Popordanoska et al. 2024's code).
DEFAULT_BANDWIDTH_GRID = np.concatenate([np.logspace(-5, -1, 50), [0.2, 0.4, 0.6, 0.8, 1.0]])
DEFAULT_BANDWIDTH_GRID.setflags(write=False)


# Parameters shared by every estimator that takes a notion of calibration and a
# debiasing mode; substituted into their docstrings by ``_doc``.
_NOTION_PARAMS = """calibration : {"canonical", "classwise", "top_label"}, default "canonical"
        Notion of calibration (Popordanoska et al. 2024, Eq. 24-25, App. D):
        "canonical" uses the whole vector (Dirichlet kernel); "top_label" the binary
        problem ``(max_k f_jk, 1[argmax_k f_jk = y_j])`` (Beta kernel); "classwise" the
        K one-vs-rest problems ``(f_jc, 1[y_j = c])``, averaged over classes, all in one
        engine call. For binary problems the L_p errors and "l2" use the positive
        coordinate only (so the class-wise "l2" error is the square of the class-wise
        ECE^KDE at p = 2); a binary ``(n,)`` input is the canonical K = 2 problem, whose
        L_p^p error is twice the class-wise one.
    debias : {"none", "ustat", "ratio"}, default "none"
        "ustat": squared conditional expectations from the ratio of U-statistics of
        Popordanoska et al. 2022, Eq. 7 (affects the L2 / p = 2 quantities); "ratio":
        the geometric-series debiasing of App. C (conditional expectation) and App. D
        (its square), bias O(n^-2). Debiasing needs 2 (ustat) or 3 (ratio) power sums
        from the engine; rows with a single effective neighbour keep the plain ratio
        and are reported with a KdecalWarning."""


def _doc(func: Callable[..., object]) -> Callable[..., object]:
    func.__doc__ = (func.__doc__ or "").replace("{notion_params}", _NOTION_PARAMS)
    return func


# ----------------------------------------------------------------------------- Bregman


@dataclass(frozen=True)
class Bregman:
    """A Bregman divergence given by its strictly convex generator F.

    ``D_F(a, b) = F(a) - F(b) - <grad_F(b), a - b>``; the proper calibration error is
    ``E[D_F(E[y | f(x)], f(x))]`` (Popordanoska et al. 2024, Eq. 9).

    Parameters
    ----------
    F : callable
        ``F(P) -> ndarray (n,)`` for ``P`` of shape (n, K): the generator, vectorised
        over rows.
    grad_F : callable
        ``grad_F(P) -> ndarray (n, K)``: its gradient, vectorised over rows.
    name : str, optional
        Label used in reports.
    """

    F: Callable[[np.ndarray], np.ndarray]
    grad_F: Callable[[np.ndarray], np.ndarray]
    name: str = "custom"

    def divergence(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Row-wise ``D_F(a_j, b_j)``, shape (n,)."""
        return np.asarray(self.F(a) - self.F(b) - np.sum(self.grad_F(b) * (a - b), axis=1))

    def _F(self, P: np.ndarray) -> np.ndarray:
        out = np.asarray(self.F(P), dtype=np.float64)
        if out.shape != (P.shape[0],):
            raise ValueError(
                f"Bregman F must return shape ({P.shape[0]},) for input {P.shape}, got {out.shape}"
            )
        return out


def _neg_entropy(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(xlogy(P, P), axis=1))


def _neg_entropy_grad(P: np.ndarray) -> np.ndarray:
    return np.log(P) + 1.0


def _sq_norm(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(P * P, axis=1))


def _sq_norm_grad(P: np.ndarray) -> np.ndarray:
    return 2.0 * P


#: The built-in generators as Bregman objects (the estimators use closed forms for them).
KL = Bregman(_neg_entropy, _neg_entropy_grad, "kl")
L2 = Bregman(_sq_norm, _sq_norm_grad, "l2")


def _generator(divergence: object) -> _est.Generator:
    if divergence == "kl" or divergence is KL:
        return _est.KLGenerator()
    if divergence == "l2" or divergence is L2:
        return _est.L2Generator()
    if isinstance(divergence, Bregman):
        return _est.CustomGenerator(divergence)
    raise ValueError(
        f"divergence must be 'kl', 'l2' or a kdecal.Bregman(F, grad_F), got {divergence!r}"
    )


# ------------------------------------------------------------------------ engine glue


def _resolve_bandwidth(
    probs: Probs,
    labels: np.ndarray | None,
    calibration: str,
    bandwidth: object,
    backend: str,
    progress: bool | None,
) -> float:
    if isinstance(bandwidth, str):
        if bandwidth != "auto":
            raise ValueError(f"bandwidth must be a float > 0 or 'auto', got {bandwidth!r}")
        problem = _est.make_problem(probs, labels, calibration)
        return _est.select_bandwidth(problem, DEFAULT_BANDWIDTH_GRID, backend, progress)
    return check_bandwidth(bandwidth)


def _run(
    probs: object,
    labels: object,
    bandwidth: object,
    calibration: object,
    debias: object,
    backend: object,
    progress: bool | None = None,
) -> tuple[_est.Estimate, Probs, np.ndarray, str]:
    """Validate, resolve the bandwidth, and run the engine once for one notion."""
    check_choice(calibration, "calibration", _est.CALIBRATIONS)
    check_choice(debias, "debias", _est.DEBIAS_MODES)
    P = check_probs(probs)
    y = check_labels(labels, P.n, P.n_classes)
    be = _backends.resolve_backend(backend)
    h = _resolve_bandwidth(P, y, str(calibration), bandwidth, be, progress)
    problem = _est.make_problem(P, y, str(calibration))
    return _est.estimate(problem, h, str(debias), be, progress), P, y, be


# ------------------------------------------------------------------------- public API


def softmax(logits: object, axis: int = -1) -> np.ndarray:
    """Turn logits into probabilities, ``exp(z) / sum exp(z)`` along ``axis``.

    Parameters
    ----------
    logits : array-like, shape (n, K), float
        Unnormalised log-probabilities (any real values).
    axis : int, default -1
        Axis over classes.

    Returns
    -------
    ndarray, shape (n, K), float64
        Probabilities; rows sum to 1. Computed stably by :func:`scipy.special.softmax`.

    Raises
    ------
    TypeError
        If ``logits`` is not numeric.
    ValueError
        If ``logits`` is empty or contains NaN or infinite values.
    """
    z = _numeric_array(logits, "logits").astype(np.float64)
    if z.size == 0:
        raise ValueError(f"logits is empty (shape {z.shape})")
    if not np.all(np.isfinite(z)):
        raise ValueError("logits contains NaN or infinite values")
    return np.asarray(_sp_softmax(z, axis=axis))


def conditional_expectation(
    probs: object, labels: object, *, bandwidth: float | str, backend: str = "auto"
) -> np.ndarray:
    """Leave-one-out Nadaraya-Watson estimate of ``E[y | f(x_j)]`` (Dirichlet kernel).

    ``E_hat[y | f_j]_c = sum_{i != j} k(f_j; f_i) 1[y_i = c] / sum_{i != j} k(f_j; f_i)``
    with the Dirichlet kernel ``k(.; f_i) = Dir(.; f_i / h + 1)``
    (Popordanoska et al. 2022, Eq. 3 and 10), computed in log space so that it stays
    exact when every kernel value underflows.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities (rows on the simplex), or P(y = 1) for binary problems
        (then K = 2 with columns (1 - p, p)). Values below 1e-12 are clipped to 1e-12
        and rows renormalised. float32 input runs the kernel in float32.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    bandwidth : float or "auto"
        Kernel bandwidth h > 0 (dimensionless, on the simplex); "auto" uses
        :func:`select_bandwidth`.
    backend : {"auto", "cpp", "numba"}, default "auto"
        Engine backend.

    Returns
    -------
    ndarray, shape (n, K), float64
        Row j is the estimate at ``f_j``; rows lie on the simplex.

    Raises
    ------
    TypeError
        Non-numeric input or a non-numeric bandwidth.
    ValueError
        Invalid probabilities, labels, bandwidth or backend (message names the argument).
    """
    est = _run(probs, labels, bandwidth, "canonical", "none", backend)[0]
    return np.asarray(est.E[0])


@_doc
def ece_kde(
    probs: object,
    labels: object,
    *,
    p: float = 1,
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "none",
    backend: str = "auto",
) -> float:
    """L_p calibration error ECE^KDE (Popordanoska et al. 2022).

    Canonical: ``CE_p = ( mean_j sum_c |E_hat[y | f_j]_c - f_jc|^p )^(1/p)``, the p-th
    root of the estimator of Eq. 9 (the authors' code returns the p-th power,
    ``CE_p ** p``). Class-wise: ``( mean_c mean_j |E_hat[y_c | f_jc] - f_jc|^p )^(1/p)``
    (Popordanoska et al. 2024, Eq. 24); top-label: the binary error of the confidence.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1); see :func:`conditional_expectation`.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    p : float, default 1
        Order of the L_p norm, ``p >= 1``.
    bandwidth : float or "auto", default "auto"
        Kernel bandwidth h > 0, or "auto" (:func:`select_bandwidth`, LOO likelihood).
    {notion_params}
    backend : {"auto", "cpp", "numba"}, default "auto"

    Returns
    -------
    float
        CE_p, in probability units (a fraction in [0, 2^(1/p)], not a percentage).

    Raises
    ------
    TypeError, ValueError
        Invalid input (see :func:`conditional_expectation`), ``p < 1``, or an unknown
        ``calibration`` or ``debias``.
    """
    p = check_p(p)
    est = _run(probs, labels, bandwidth, calibration, debias, backend)[0]
    return _est.ce_p(est, p)


@_doc
def calibration_error(
    probs: object,
    labels: object,
    *,
    divergence: str | Bregman = "kl",
    bandwidth: float | str = "auto",
    estimator: str = "direct",
    calibration: str = "canonical",
    debias: str = "none",
    backend: str = "auto",
) -> float:
    """Proper calibration error CE_F for a Bregman generator F (Popordanoska et al. 2024).

    ``CE_F = E[ D_F(E[y | f(x)], f(x)) ]`` estimated with the leave-one-out Dirichlet
    kernel estimate ``E_j`` of ``E[y | f_j]``:

    - ``estimator="direct"``: ``mean_j D_F(E_j, f_j)`` (Eq. 9 / 26);
    - ``estimator="refinement"``: ``mean_j F(E_j) + mean_i [D_F(y_i, f_i) - F(y_i)]``,
      i.e. the risk minus the refinement (Eq. 14-15).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1); see :func:`conditional_expectation`.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    divergence : "kl", "l2" or Bregman, default "kl"
        "kl": F(p) = sum p log p, the KL calibration error
        ``mean_j sum_c E_jc log(E_jc / f_jc)`` (Eq. 10); "l2": F(p) = ||p||^2, the
        *squared* L2 calibration error ``mean_j ||E_j - f_j||^2`` (Eq. 7); or a
        :class:`Bregman` with user callables.
    bandwidth : float or "auto", default "auto"
        Kernel bandwidth h > 0, or "auto" (:func:`select_bandwidth`).
    estimator : {"direct", "refinement"}, default "direct"
    {notion_params}
    backend : {"auto", "cpp", "numba"}, default "auto"

    Returns
    -------
    float
        CE_F in nats for "kl", squared probability units for "l2".

    Raises
    ------
    TypeError, ValueError
        Invalid input, divergence, estimator, calibration or debias.
    """
    gen = _generator(divergence)
    check_choice(estimator, "estimator", ("direct", "refinement"))
    est = _run(probs, labels, bandwidth, calibration, debias, backend)[0]
    return _est.calibration_error(est, gen, estimator)


def refinement(
    probs: object,
    labels: object,
    *,
    divergence: str | Bregman = "kl",
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "none",
    backend: str = "auto",
) -> float:
    """Refinement ``REF_F = -mean_j F(E_j)`` (Popordanoska et al. 2024, Eq. 15).

    Parameters are those of :func:`calibration_error` (without ``estimator``).

    Returns
    -------
    float
        For "kl" the mean entropy of the estimated conditional expectation (nats);
        for "l2" minus its mean squared norm.

    Raises
    ------
    TypeError, ValueError
        As :func:`calibration_error`.
    """
    gen = _generator(divergence)
    est = _run(probs, labels, bandwidth, calibration, debias, backend)[0]
    return _est.refinement(est, gen)


def sharpness(
    probs: object,
    labels: object,
    *,
    divergence: str | Bregman = "kl",
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "none",
    backend: str = "auto",
) -> float:
    """Sharpness ``SHARP_F = mean_j F(E_j) - F(pi)`` (Popordanoska et al. 2024, Eq. 4-5).

    ``pi`` is the vector of class frequencies of ``labels``. Parameters are those of
    :func:`calibration_error` (without ``estimator``).

    Returns
    -------
    float
        Non-negative up to estimation error (F is convex).

    Raises
    ------
    TypeError, ValueError
        As :func:`calibration_error`.
    """
    gen = _generator(divergence)
    est = _run(probs, labels, bandwidth, calibration, debias, backend)[0]
    return _est.sharpness(est, gen)


def loo_log_likelihood(probs: object, bandwidths: object, *, backend: str = "auto") -> np.ndarray:
    """Mean leave-one-out log density of the Dirichlet KDE at each bandwidth.

    ``mean_j log( 1/(n-1) sum_{i != j} Dir(f_j; f_i / h + 1) )``; the Dirichlet density
    is normalised on the simplex, so there is no extra ``-log h`` term (unlike the
    ECE^KDE reference code). All bandwidths share one engine pass.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    bandwidths : array-like, shape (H,), float
        Bandwidths h > 0.
    backend : {"auto", "cpp", "numba"}, default "auto"

    Returns
    -------
    ndarray, shape (H,), float64
        Mean LOO log density (nats) at each bandwidth.

    Raises
    ------
    TypeError, ValueError
        Invalid probabilities or bandwidths.
    """
    P = check_probs(probs)
    hs = check_bandwidths(bandwidths)
    be = _backends.resolve_backend(backend)
    problem = _est.make_problem(P, None, "canonical")
    return np.asarray(_est.loo_log_likelihood(problem, hs, be)[0])


def select_bandwidth(probs: object, *, grid: object = None, backend: str = "auto") -> float:
    """Bandwidth that maximises the leave-one-out likelihood (LOO-MLE).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    grid : array-like, shape (H,), optional
        Candidate bandwidths; default :data:`DEFAULT_BANDWIDTH_GRID` (55 values: 50
        log-spaced in [1e-5, 1e-1] plus 0.2, 0.4, 0.6, 0.8, 1.0), evaluated in one pass.

    Returns
    -------
    float
        ``grid[argmax loo_log_likelihood(probs, grid)]`` (the first on ties).

    Raises
    ------
    TypeError, ValueError
        Invalid probabilities or grid.
    """
    P = check_probs(probs)
    hs = DEFAULT_BANDWIDTH_GRID if grid is None else check_bandwidths(grid, "grid")
    be = _backends.resolve_backend(backend)
    problem = _est.make_problem(P, None, "canonical")
    return _est.select_bandwidth(problem, np.asarray(hs, dtype=np.float64), be)


def _binned_ece_top_label(P: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    conf = P.max(axis=1)
    correct = (P.argmax(axis=1) == y).astype(np.float64)
    idx = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    gap = np.abs(np.bincount(idx, weights=conf - correct, minlength=n_bins))
    return float(gap.sum() / y.shape[0])


@_doc
def evaluate(
    probs: object,
    labels: object,
    *,
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "none",
    backend: str = "auto",
    progress: bool | None = None,
    source: str | None = None,
) -> CalibrationReport:
    """Every kernel estimator of kdecal for one notion from one engine pass, plus context.

    Computes ECE^KDE (L1 and L2; Popordanoska et al. 2022, Eq. 9), the KL and squared
    L2 calibration errors, refinement and sharpness (Popordanoska et al. 2024, Eq. 4-5,
    9-10, 15) from one leave-one-out pass at one bandwidth (after one more pass over the
    bandwidth grid when ``bandwidth="auto"``), together with accuracy, log loss, Brier
    score and the 15-bin top-label binned ECE.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    bandwidth : float or "auto", default "auto"
    {notion_params}
    backend : {"auto", "cpp", "numba"}, default "auto"
    progress : bool or None, default None
        Progress bar with ETA; None shows one only for long work.
    source : str, optional
        Description stored in the report (e.g. a file name).

    Returns
    -------
    CalibrationReport
        ``str(report)`` is a table; ``report.to_dict()`` is JSON-ready.

    Raises
    ------
    TypeError, ValueError
        Invalid input (see :func:`conditional_expectation`).
    """
    t0 = time.perf_counter()
    est, P, y, be = _run(probs, labels, bandwidth, calibration, debias, backend, progress)
    Pp, K, n = P.p, P.n_classes, P.n
    rows = np.arange(n)
    kl, l2 = _est.KLGenerator(), _est.L2Generator()
    report = CalibrationReport(
        n=n,
        n_classes=K,
        bandwidth=est.bandwidth,
        ece_kde_l1=_est.ce_p(est, 1.0),
        ece_kde_l2=_est.ce_p(est, 2.0),
        ce_kl=_est.calibration_error(est, kl, "direct"),
        ce_l2=_est.calibration_error(est, l2, "direct"),
        refinement_kl=_est.refinement(est, kl),
        refinement_l2=_est.refinement(est, l2),
        sharpness_kl=_est.sharpness(est, kl),
        sharpness_l2=_est.sharpness(est, l2),
        accuracy=float(np.mean(Pp.argmax(axis=1) == y)),
        log_loss=float(-np.mean(np.log(Pp[rows, y]))),
        brier_score=float(np.mean(np.sum((Pp - np.eye(K)[y]) ** 2, axis=1))),
        ece_binned=_binned_ece_top_label(Pp, y),
        backend=be,
        wall_time_s=time.perf_counter() - t0,
        source=source,
        calibration=str(calibration),
        debias=str(debias),
    )
    return report
