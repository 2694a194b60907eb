"""Arrays of the calibration plots, computed without matplotlib.

Every plot of :mod:`kdecal.plot` draws arrays computed here; this module imports no
plotting library, so the curves can be used for one's own figures, tables or tests.
Each diagram is a frozen dataclass of read-only arrays, built with its class methods
(the ``from_predictions`` / ``from_estimate`` pattern of scikit-learn's displays):

- :class:`ReliabilityDiagram`: binned reliability statistics (Guo et al. 2017), or the
  leave-one-out Beta/Dirichlet-kernel estimate of ``E[y | f]`` at the data points
  (Popordanoska, Sayer & Blaschko, NeurIPS 2022, Eq. 3, 10) with the plain Beta-kernel
  Nadaraya-Watson curve and density on a grid;
  :meth:`ReliabilityDiagram.from_estimate` draws the kernel curve of a
  :class:`kdecal.CalibrationEstimate` from the kernel sums it holds (no new pass);
- :class:`CalibrationSharpnessDiagram`: the Gaussian Nadaraya-Watson regressions, the
  sharpness band and the plug-in calibration term of Chidambaram & Ge (arXiv 2406.04068,
  2024, Eq. 5.1-5.2, Lemma 4.1);
- :class:`SimplexDensity`: for K = 3 the simplex-binned histogram and the Dirichlet KDE
  on a barycentric grid (Popordanoska et al. 2022, Sec. 4, Fig. 1, Fig. 7), also from a
  canonical estimate (:meth:`SimplexDensity.from_estimate`);
- :class:`BayesRiskCurve`: Bayes risk of binary posteriors against the decision
  threshold (Ferrer & Ramos, TMLR 2025, Eq. 8-12, 34, Fig. 4).

The ``ax`` fields stay None: :func:`kdecal.plot.draw` draws any of them (and the
drawing functions of :mod:`kdecal.plot`, which compute and draw in one call, fill them).
The kernel estimates at the data points come from one engine pass of
:func:`kdecal.estimate` without debiasing (``bandwidth="auto"`` is the leave-one-out
Brier bandwidth), read from its ``conditional_expectation``: by default the
residual-centred regression ``f + g`` (``estimator="residual"``, whose L1 error is the
ECE^KDE that :func:`kdecal.evaluate` reports), or the papers' plug-in ratio
(``estimator="plugin"``); with ``from_estimate``, the given estimate's own regression
from the kernel sums it holds; the curves at grid points, which are not
data points and leave nothing out, are direct kernel sums over the data, O(n x grid
size), in blocks. The right-closed bins are those of :func:`kdecal.binned.bin_index`.

The functions ``reliability_diagram``, ``calibration_sharpness_diagram``,
``simplex_density`` and ``bayes_risk_curve`` of this module are deprecated aliases of
the ``from_predictions`` class methods (they warn, and go in the next release).

References
----------
- T. Popordanoska, R. Sayer, M. B. Blaschko. "A Consistent and
  Differentiable L_p Canonical Calibration Error Estimator". NeurIPS 2022 (Eq. 3, 9,
  10; Sec. 4; Fig. 1, Fig. 7).
- T. Popordanoska, S. G. Gruber, A. Tiulpin, F. Buettner,
  M. B. Blaschko. "Consistent and Asymptotically Unbiased Estimation of Proper
  Calibration Errors". AISTATS 2024 (Eq. 24-25, Fig. 8).
- M. Chidambaram, R. Ge. "Reassessing How to Compare and Improve the
  Calibration of Machine Learning Models". arXiv 2406.04068, 2024 (Lemma 4.1,
  Eq. 5.1, 5.2, Sec. 5 "Estimation and plotting details", Fig. 1, App. A.2, B).
- L. Ferrer, D. Ramos. "Evaluating Posterior Probabilities: Decision
  Theory, Proper Scoring Rules, and Calibration". TMLR 2025 (Eq. 8-12, 34, Fig. 4).
- C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger. "On Calibration of Modern
  Neural Networks". ICML 2017 (reliability diagrams, Fig. 1).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import gammaln, xlogy

from . import _formulas, _validation
from . import binned as _binned
from ._calibration_estimate import CalibrationEstimate
from ._engine.backends import BACKENDS, Backend, resolve_backend
from ._estimation import regression as _regression
from ._estimation.regression import ESTIMATORS
from ._numerics import ValueEq
from ._validation import (
    Probs,
    as_array,
    check_bandwidth,
    check_choice,
    check_class_index,
    check_int,
    check_labels,
    check_n_bins,
    check_probs,
    check_seed,
)
from .kde import _check_bandwidth_spec, estimate
from .kde import _resolve_bandwidth as resolve
from .tolerances import PROB_EPS

__all__ = [
    "BayesRiskCurve",
    "CalibrationSharpnessDiagram",
    "ReliabilityDiagram",
    "SimplexDensity",
]

#: Largest kernel-curve grid (``n_grid``) and simplex histogram (``n_bins_per_side``):
#: beyond them a figure gains nothing and the arrays would grow without bound.
MAX_GRID = 100_000
MAX_BINS_PER_SIDE = 1_000
#: Largest simplex density grid (``resolution``): about ``r^2 / 2`` points, each a
#: kernel sum over the predictions (2 x 10^6 points at the largest).
MAX_RESOLUTION = 2_000

_KINDS = ("binned", "kernel")
_REL_CALIBRATIONS = ("top_label", "classwise", "canonical")
_DIVERGENCES = ("l2", "kl")
_WEIGHTS = ("uniform", "beta22")
#: Elements per block of the dense kernel evaluations (memory ~ 8 bytes x this).
_BLOCK = 1 << 22
#: Above this many Gaussian evaluations (n x evaluation points) the regressions of the
#: calibration-sharpness diagram use linear binning on _NW_NODES nodes (_gaussian_nw).
_EXACT_MAX = 2e8
_NW_NODES = 8192
#: Fewest binning nodes per kernel standard deviation (the nodes are refined below
#: sigma = range / (8192 / 100), about 0.012 on [0, 1]), and the most nodes: beyond
#: them (sigma below about 1e-4 on [0, 1]) the sums are computed exactly.
_NW_NODES_PER_SIGMA = 100
_NW_MAX_NODES = 1 << 20


def __dir__() -> list[str]:
    return __all__


# ----------------------------------------------------------------------------- helpers


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def _resolve_bandwidth(*args: Any) -> float:
    """Return the bandwidth of a spec: :func:`kdecal.kde._resolve_bandwidth`."""
    return resolve(*args)


def _kernel_estimate(
    probs: object,
    labels: object,
    calibration: str,
    bandwidth: object,
    backend: Backend,
    estimator: str = "residual",
) -> Any:
    """:func:`kdecal.estimate` without debiasing, the bandwidth of the Brier risk.

    ``estimator="residual"`` (the default of :func:`kdecal.estimate`): ``E = f + g``
    with ``g`` the kernel regression of the residuals ``y - f``, whose L1 error is the
    table's ECE^KDE; ``"plugin"``: the papers' kernel ratio ``sum w y / sum w``, which
    lies in [0, 1] and carries the kernel's smoothing bias.
    """
    return estimate(
        probs,
        labels,
        bandwidth=bandwidth,  # type: ignore[arg-type]
        calibration=calibration,
        debias="none",
        criterion="brier",
        estimator=estimator,
        backend=backend,
        progress=False,
    )


def _diagram_view(est: CalibrationEstimate) -> CalibrationEstimate:
    """Return the estimate whose ``conditional_expectation`` a diagram draws.

    A residual-centred estimate is drawn as it is: its ``E = f + g`` does not depend on
    the debiasing, and its L1 error is ``est.ece_kde(1)``. A plug-in estimate is drawn
    as the plug-in ratio ``S_c / sum S`` without debiasing, formed from the class sums
    ``S`` it keeps of its main bandwidth without a new kernel pass.
    """
    e = est._est
    if e.estimator == "residual" or e.debias == "none":
        return est
    if e.S is None or e.m is None:
        raise ValueError("estimate holds no kernel sums to draw the curves from")
    empty = np.zeros((0, 0, 0))
    plug = _regression.estimate_from(
        e.problem, e.bandwidth, "none", est.backend, e.m, e.S, empty, empty
    )
    return CalibrationEstimate(plug, est._probs, est._labels, est.backend, est.search)


def _check_estimate(estimate: object) -> CalibrationEstimate:
    """Refuse anything but a :class:`kdecal.CalibrationEstimate` (a TypeError naming it)."""
    if not isinstance(estimate, CalibrationEstimate):
        hint = (
            " (a CalibrationReport holds one per notion: report.estimates['canonical'])"
            if hasattr(estimate, "estimates")
            else ""
        )
        raise TypeError(
            "estimate must be a kdecal.CalibrationEstimate (made by kdecal.estimate)"
            f"{hint}, got {type(estimate).__name__}"
        )
    return estimate


def _check_resolution(resolution: object) -> int:
    """Check a simplex density's grid resolution: ``2..MAX_RESOLUTION``."""
    r = check_int(resolution, "resolution", 2)
    if r > MAX_RESOLUTION:
        raise ValueError(f"resolution must be at most {MAX_RESOLUTION:,}, got {r:,}")
    return r


def _check_n_grid(n_grid: object, low: int = 2) -> int:
    """Check the number of points of a curve's grid: ``low..MAX_GRID``."""
    g = check_int(n_grid, "n_grid", low)
    if g > MAX_GRID:
        raise ValueError(f"n_grid must be at most {MAX_GRID:,}, got {g:,}")
    return g


def _deprecated(old: str, new: str) -> None:
    """Warn that ``kdecal.curves.<old>`` is deprecated in favour of ``<new>``."""
    warnings.warn(
        f"kdecal.curves.{old} is deprecated; use kdecal.curves.{new}",
        DeprecationWarning,
        stacklevel=3,
    )


def _dirichlet_grid(
    centres: np.ndarray, log_queries: np.ndarray, h: float, values: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Dirichlet KDE and Nadaraya-Watson regression at query points that are not data.

    The kernel is kdecal's: centre i contributes the density of ``Dir(f_i / h + 1)``
    (Popordanoska et al. 2022, Eq. 10; the Beta kernel when D = 2). Nothing is left
    out (a query point is not a sample). The log-kernels of a block of queries are one
    matrix product plus the per-centre normaliser, max-shifted per query, so far from
    the data the regression tends to the value of the nearest kernel instead of 0/0.

    Parameters
    ----------
    centres : ndarray, shape (n, D), float64
        Clipped points on the simplex.
    log_queries : ndarray, shape (G, D), float64
        ``log u`` of the (clipped) query points u.
    h : float
        Bandwidth.
    values : ndarray, shape (V, n), float64, optional
        Values regressed (e.g. 0/1 labels).

    Returns
    -------
    log_density : ndarray, shape (G,), float64
        ``log(1/n sum_i Dir(u; f_i / h + 1))``.
    curves : ndarray, shape (V, G), float64, or None
        ``sum_i k_i(u) v_i / sum_i k_i(u)`` for each row of ``values``.
    """
    n, D = centres.shape
    A = centres / h  # alpha - 1
    log_norm = gammaln(1.0 / h + D) - gammaln(A + 1.0).sum(axis=1)  # (n,)
    G = log_queries.shape[0]
    log_dens = np.empty(G)
    curves = None if values is None else np.empty((values.shape[0], G))
    step = max(1, _BLOCK // max(n, 1))
    for s in range(0, G, step):
        logk = log_queries[s : s + step] @ A.T + log_norm[None, :]
        mx = logk.max(axis=1, keepdims=True)
        w = np.exp(logk - mx)
        sw = w.sum(axis=1)
        log_dens[s : s + step] = np.log(sw) + mx[:, 0] - math.log(n)
        if curves is not None and values is not None:
            curves[:, s : s + step] = (values @ w.T) / sw
    return log_dens, curves


def _beta_nw_grid(
    q: np.ndarray, target: np.ndarray, h: float, grid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Beta-kernel Nadaraya-Watson curve and KDE of one binary problem at grid points.

    :func:`_dirichlet_grid` with D = 2: sample i contributes the density of
    ``Beta(q_i / h + 1, (1 - q_i) / h + 1)`` at t, the regression is the plain estimate
    ``sum_i k_i(t) y_i / sum_i k_i(t)``.

    Parameters
    ----------
    q : ndarray, shape (n,), float64
        Positive coordinate of the (clipped) binary points, in (0, 1).
    target : ndarray, shape (n,), float64
        Values regressed (0/1 labels).
    h : float
        Bandwidth.
    grid : ndarray, shape (G,), float64
        Evaluation points in [0, 1] (clipped to [PROB_EPS, 1 - PROB_EPS]).

    Returns
    -------
    curve, density : ndarray, shape (G,), float64
        The Nadaraya-Watson estimate and the Beta KDE ``mean_i k_i(t)`` at the grid.
    """
    t = np.clip(grid, PROB_EPS, 1.0 - PROB_EPS)
    log_t = np.stack([np.log1p(-t), np.log(t)], axis=1)
    log_dens, curves = _dirichlet_grid(np.stack([1.0 - q, q], axis=1), log_t, h, target[None])
    assert curves is not None
    return curves[0], np.exp(log_dens)


def bin_means(x: np.ndarray, y: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of ``x`` and ``y`` in the non-empty equal-width bins of ``x`` on [0, 1].

    The bins are those of :func:`kdecal.binned.ece` (edges ``b / n_bins``, the rule of
    :func:`kdecal.binned.bin_index`); returns two arrays of the
    same length (the number of non-empty bins), in increasing bin order.
    """
    idx = _binned._uniform_bins(x, n_bins)[1]
    counts = np.bincount(idx, minlength=n_bins)
    ok = counts > 0
    bx = np.bincount(idx, weights=x, minlength=n_bins)[ok] / counts[ok]
    by = np.bincount(idx, weights=y, minlength=n_bins)[ok] / counts[ok]
    return bx, by


def _gaussian_nw(
    t: np.ndarray,
    x: np.ndarray,
    values: np.ndarray,
    sigma: float,
    exact: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian Nadaraya-Watson regression of each row of ``values`` and the Gaussian KDE.

    ``m(t) = sum_i K_s(t - x_i) v_i / sum_i K_s(t - x_i)`` and
    ``p(t) = 1/n sum_i K_s(t - x_i)`` with ``K_s(u) = exp(-u^2 / (2 s^2)) / (s sqrt(2 pi))``
    (Chidambaram & Ge 2024, Eq. 5.2 with the numerator's ``y_i`` restored, and its
    denominator as the KDE). No leave-one-out, no boundary correction (as in the paper).

    Exact (the default while ``n * T <= 2e8``): the weights are max-shifted per
    evaluation point, so ``m`` never is 0/0; where every weight underflows it is the
    value of the nearest data point(s). Otherwise the sums are computed by linear
    binning of the data on 8192 nodes, or more where needed for at least 100 nodes per
    sigma (at most 2^20; beyond, at sigma below about 1e-4 on [0, 1], the sums are
    exact), and a direct (non-FFT) convolution with the Gaussian truncated at 8 sigma,
    then linear interpolation: on [0, 1] with sigma = 0.05 the curves agree with the
    exact ones to about 1e-6, and at sigma from 0.012 down to 1e-4 the curves to about
    1.3e-5 and the density to about 1e-4 relative where it exceeds 1e-3 of its maximum
    (n = 210,000 scores; up to about 1e-3 far in the kernel's tails); points where the
    binned sums vanish are computed exactly.  (8192 nodes at every sigma erred by 1e-2
    in the curves and 6e-2 in the density at sigma = 3e-4.)

    Parameters
    ----------
    t : ndarray, shape (T,), float64
    x : ndarray, shape (n,), float64
    values : ndarray, shape (V, n), float64
    sigma : float
    exact : bool, optional
        Force the exact (True) or the binned (False) computation.

    Returns
    -------
    m : ndarray, shape (V, T), float64
    kde : ndarray, shape (T,), float64
    """
    n = x.shape[0]
    if exact is None:
        exact = n * t.shape[0] <= _EXACT_MAX
    if exact or not np.ptp(np.concatenate([x, t])) > 0:
        return _gaussian_nw_exact(t, x, values, sigma)
    lo, hi = min(x.min(), t.min()), max(x.max(), t.max())
    G = max(_NW_NODES, math.ceil((hi - lo) / sigma * _NW_NODES_PER_SIGMA) + 1)
    if G > _NW_MAX_NODES:  # too narrow a kernel to bin: exact
        return _gaussian_nw_exact(t, x, values, sigma)
    nodes = np.linspace(lo, hi, G)
    d = nodes[1] - nodes[0]
    pos = (x - lo) / d
    i = np.clip(np.floor(pos).astype(np.int64), 0, G - 2)
    w = pos - i
    L = min(G - 1, math.ceil(8.0 * sigma / d))
    k = np.exp(-0.5 * (np.arange(-L, L + 1) * d / sigma) ** 2)

    def smooth(v: np.ndarray) -> np.ndarray:
        b = np.bincount(i, (1.0 - w) * v, G) + np.bincount(i + 1, w * v, G)
        return np.interp(t, nodes, np.convolve(b, k, mode="full")[L : L + G])

    S = smooth(np.ones(n))
    num = np.stack([smooth(v) for v in values])
    ok = S > 1e-200 * n
    m = np.empty_like(num)
    m[:, ok] = num[:, ok] / S[ok]
    kde = S / (n * sigma * math.sqrt(2.0 * math.pi))
    if not np.all(ok):  # far from every data point: exact, nearest-point limit
        m[:, ~ok], kde[~ok] = _gaussian_nw_exact(t[~ok], x, values, sigma)
    return m, kde


def _gaussian_nw_exact(
    t: np.ndarray, x: np.ndarray, values: np.ndarray, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """Exact, blocked computation of :func:`_gaussian_nw`."""
    n = x.shape[0]
    m = np.empty((values.shape[0], t.shape[0]))
    kde = np.empty(t.shape[0])
    step = max(1, _BLOCK // max(n, 1))
    c = 1.0 / (n * sigma * math.sqrt(2.0 * math.pi))
    for s in range(0, t.shape[0], step):
        # weights relative to the nearest point's, -((d^2 - dmin^2) / 2 sigma^2) as
        # (d - dmin)(d + dmin): z^2 overflowed for tiny sigma (1e-160) and the shift
        # became -inf - (-inf) = NaN
        d = np.abs(t[s : s + step, None] - x[None, :])
        dmin = d.min(axis=1, keepdims=True)
        with np.errstate(over="ignore"):
            w = np.exp(-0.5 * ((d - dmin) / sigma) * ((d + dmin) / sigma))
            peak = np.exp(-0.5 * (dmin[:, 0] / sigma) ** 2)
        sw = w.sum(axis=1)
        m[:, s : s + step] = (values @ w.T) / sw
        kde[s : s + step] = sw * peak * c
    return m, kde


# ------------------------------------------------------------------ reliability diagram
@dataclass(frozen=True, eq=False)
class ReliabilityDiagram(ValueEq):
    """Arrays of a reliability diagram and the Axes it is drawn on.

    Made by :meth:`from_predictions` (binned or kernel) or :meth:`from_estimate` (the
    kernel curve of a :class:`kdecal.CalibrationEstimate`); drawn by
    :func:`kdecal.plot.draw` or :func:`kdecal.plot.reliability_diagram`.

    For one binary problem (top-label, canonical, or class-wise with ``class_index``)
    the arrays are 1-D; for class-wise diagrams of all K classes they are stacked into
    ``(K, ...)``, row c being class c. All arrays are read-only float64 unless noted.

    Attributes
    ----------
    kind : str
        ``"binned"`` or ``"kernel"``.
    calibration : str
        ``"top_label"``, ``"classwise"`` or ``"canonical"``.
    class_index : int or None
        The class of a single class-wise diagram.
    x : ndarray, shape (B,) / (K, B) binned, (n,) / (K, n) kernel
        Binned: mean confidence of each bin (NaN for an empty bin). Kernel: the
        confidences (top-label: ``max_k f_k``; class-wise: ``f_c``; canonical:
        ``max_k f_k``), clipped to ``PROB_EPS`` as the kernel sees them, sorted
        ascending (stable sort).
    y : ndarray, same shape as ``x``
        Binned: fraction of positives in the bin (accuracy for top-label). Kernel: the
        leave-one-out kernel estimate at each data point, in the order of ``x``:
        top-label / class-wise ``E[1{y = c} | f_c]`` with the Beta kernel; canonical:
        the component of the predicted class of the Dirichlet-kernel ``E[y | f]``
        (Popordanoska et al. 2022, Eq. 3, 10). With ``estimator="residual"`` it is
        ``f_j + g_j``, ``g_j`` the leave-one-out kernel regression of the residuals
        ``y_i - f_i`` (the ``conditional_expectation`` of the residual-centred
        :func:`kdecal.estimate`), which may leave [0, 1] by the regression's noise;
        with ``"plugin"`` the kernel ratio ``sum_i w_ij y_i / sum_i w_ij`` (the positive
        column of :func:`kdecal.conditional_expectation` applied to the binary problem),
        in [0, 1] and shrunk towards the data's mean by the kernel's smoothing.
    edges : ndarray or None, shape (B + 1,) / (K, B + 1)
        Binned: bin edges (:func:`kdecal.binned.binned_statistics`). Kernel: None.
    counts : ndarray, int64, shape (B,) / (K, B)
        Binned: samples per bin. Kernel: the histogram of the confidences in ``n_bins``
        equal-width bins with the same rule (right-closed, the first bin holding 0),
        drawn beneath a canonical diagram.
    grid : ndarray or None, shape (G,)
        Kernel, top-label / class-wise: grid of ``n_grid`` points in [0, 1]. Else None.
    grid_curve : ndarray or None, shape (G,) / (K, G)
        Beta-kernel estimate at the grid points t: ``t + sum_i k_i(t) (y_i - f_i) /
        sum_i k_i(t)`` (``estimator="residual"``) or the Nadaraya-Watson ratio ``sum_i
        k_i(t) y_i / sum_i k_i(t)`` (``"plugin"``). These are **not** leave-one-out
        estimates (a grid point is not a sample); the curve drawn is ``(x, y)``. None
        for binned and canonical diagrams.
    density : ndarray or None, shape (G,) / (K, G)
        Beta-kernel density estimate of the confidences at the grid (same bandwidth),
        drawn beneath a top-label / class-wise kernel diagram. None otherwise.
    bandwidth : float or None
        Kernel bandwidth used (the selected one for ``"auto"``); None for binned.
    ece : float or ndarray, shape () / (K,)
        Binned: L1 binned ECE ``sum_b n_b / n |freq_b - conf_b|``. Kernel: the L1 kernel
        error ``mean_j |E_j - f_j|`` of the problem (top-label / class-wise: equal to
        :func:`kdecal.ece_kde` with ``p=1`` and the same ``estimator`` on that
        problem); canonical: ``mean_j sum_c |E_jc - f_jc|`` (canonical ECE^KDE, p = 1).
    estimator : str or None
        Kernel: ``"residual"`` or ``"plugin"``, the regression drawn. None for binned.
    ax : matplotlib Axes, ndarray of Axes, or None
        The main Axes (an array of K Axes for all class-wise diagrams); None until
        drawn.
    hist_ax : matplotlib Axes, ndarray of Axes, or None
        The Axes beneath with the distribution of the confidences.
    """

    kind: str
    calibration: str
    class_index: int | None
    x: np.ndarray
    y: np.ndarray
    edges: np.ndarray | None
    counts: np.ndarray
    grid: np.ndarray | None
    grid_curve: np.ndarray | None
    density: np.ndarray | None
    bandwidth: float | None
    ece: Any
    estimator: str | None = None
    ax: Any = None
    hist_ax: Any = None

    @classmethod
    def from_predictions(
        cls,
        probs: object,
        labels: object,
        *,
        kind: str = "binned",
        calibration: str = "top_label",
        class_index: int | None = None,
        n_bins: int = 15,
        bandwidth: float | str = "auto",
        n_grid: int = 200,
        estimator: str = "residual",
        backend: Backend = "auto",
    ) -> ReliabilityDiagram:
        """Compute a reliability diagram, ``E[y | f]`` against the confidence.

        The computation of :func:`kdecal.plot.reliability_diagram` (see there for the
        picture): binned statistics (:func:`kdecal.binned.binned_statistics`, Guo et al.
        2017) or the leave-one-out kernel estimate at the data points (Beta kernel on
        the binary problem for top-label / class-wise, Popordanoska et al. 2024, Eq.
        24-25; Dirichlet kernel for canonical, Popordanoska et al. 2022, Eq. 3, 10), from
        one engine pass of :func:`kdecal.estimate` (no debiasing): by default its
        residual-centred regression ``f + g``, whose L1 error is the ECE^KDE that
        :func:`kdecal.ece_kde` and :func:`kdecal.evaluate` report at this bandwidth.

        Parameters
        ----------
        probs : array-like, shape (n, K) or (n,), float
            Predicted probabilities (rows on the simplex), or P(y = 1) of a binary
            problem.
        labels : array-like, shape (n,), int
            True classes in ``0..K-1``.
        kind : {"binned", "kernel"}, default "binned"
        calibration : {"top_label", "classwise", "canonical"}, default "top_label"
            ``"canonical"`` needs ``kind="kernel"``.
        class_index : int, optional
            Class-wise only: the class; None stacks all K classes into ``(K, ...)``
            arrays.
        n_bins : int, default 15
            Equal-width bins (binned; the histogram of a canonical kernel diagram).
        bandwidth : float, "auto" or "loo-mle", default "auto"
            Kernel bandwidth h > 0 (dimensionless, on the simplex); "auto" minimises the
            leave-one-out Brier risk of the regression, "loo-mle" maximises the
            leave-one-out likelihood (:func:`kdecal.select_bandwidth`).
        n_grid : int, default 200
            Grid points of the Beta-kernel curve and density (top-label / class-wise
            kernel).
        estimator : {"residual", "plugin"}, default "residual"
            Kernel: the regression drawn, as :func:`kdecal.estimate`'s ``estimator``.
            ``"residual"`` draws ``f + g`` (``g`` the kernel regression of ``y - f``):
            a calibrated model's curve lies on the diagonal up to noise, and its gap is
            the reported ECE^KDE. ``"plugin"`` draws the papers' ratio ``sum w y / sum
            w``, which the kernel shrinks towards the data's mean (at a canonical
            bandwidth of 1.78 on the bundled CIFAR-10 example its L1 error is 0.150
            against the residual 0.058).
        backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"

        Returns
        -------
        ReliabilityDiagram
            Read-only arrays; shapes in :class:`ReliabilityDiagram`. ``ax`` is None.

        Raises
        ------
        ValueError
            Invalid ``probs``/``labels`` (the messages of the metrics), unknown ``kind``,
            ``calibration`` or ``estimator``, canonical with ``kind="binned"``, a bad ``class_index``,
            ``n_bins < 1``, ``n_grid`` not in ``2..MAX_GRID`` (100,000), a bad bandwidth or backend.
        TypeError
            Non-numeric input or bandwidth, ``n_bins`` or ``n_grid`` not an integer.

        Examples
        --------
        >>> import kdecal
        >>> from kdecal.curves import ReliabilityDiagram
        >>> s = kdecal.datasets.make_seeds_synthetic(500, 3, seed=0)
        >>> rd = ReliabilityDiagram.from_predictions(
        ...     s.probs, s.labels, kind="kernel", bandwidth=0.05
        ... )
        >>> rd.x.shape, rd.grid_curve.shape
        ((500,), (200,))
        """
        check_choice(kind, "kind", _KINDS)
        check_choice(calibration, "calibration", _REL_CALIBRATIONS)
        check_choice(estimator, "estimator", ESTIMATORS)
        n_bins = check_n_bins(n_bins, len(as_array(probs, "probs")))
        if calibration == "canonical" and kind != "kernel":
            raise ValueError(
                "calibration='canonical' needs kind='kernel' (the binned canonical estimate "
                "is kdecal.binned.simplex_ece; see SimplexDensity for K = 3)"
            )
        if class_index is not None and calibration != "classwise":
            raise ValueError("class_index is only meaningful with calibration='classwise'")
        # the kernel options are checked for either kind (a binned diagram ignores them,
        # and a typo there stays a typo: the docstring's errors hold for both)
        n_grid = _check_n_grid(n_grid)
        _check_bandwidth_spec(bandwidth)
        check_choice(backend, "backend", ("auto", *BACKENDS, "dask"))
        if kind == "binned":
            stats = _binned.binned_statistics(
                probs, labels, n_bins=n_bins, calibration=calibration, class_index=class_index
            )
            nonempty = stats.counts > 0
            gap = np.abs(np.where(nonempty, stats.gap, 0.0))
            ece = np.sum(stats.counts / stats.n_samples * gap, axis=-1)
            return cls(
                kind=kind,
                calibration=calibration,
                class_index=None if class_index is None else int(class_index),
                x=stats.mean_confidence,
                y=stats.frequency,
                edges=stats.edges,
                counts=stats.counts,
                grid=None,
                grid_curve=None,
                density=None,
                bandwidth=None,
                ece=float(ece) if np.ndim(ece) == 0 else _readonly(ece),
            )
        P = check_probs(probs)
        y = check_labels(labels, P.n, P.n_classes)
        if class_index is not None:
            class_index = check_class_index(class_index, P.n_classes)
        # the validated arrays go on (no second validation); "auto" sees the input as given
        be = resolve_backend(backend, probs)
        # class-wise: one bandwidth for the K problems (their risks summed)
        est = _kernel_estimate(P, y, calibration, bandwidth, be, estimator)
        return _kernel_reliability(est, P.p, y, class_index, n_bins, n_grid)

    @classmethod
    def from_estimate(
        cls,
        estimate: CalibrationEstimate,
        *,
        class_index: int | None = None,
        n_bins: int = 15,
        n_grid: int = 200,
    ) -> ReliabilityDiagram:
        """Build the kernel reliability diagram of an estimate from its kernel sums.

        ``kind="kernel"`` at the estimate's notion (``estimate.calibration``), main
        bandwidth (``estimate.bandwidth``) and estimator (``estimate.estimator``), from
        the leave-one-out sums the estimate holds, so no kernel pass runs: a
        residual-centred estimate draws its ``conditional_expectation`` ``f + g``, and
        the diagram's ``ece`` is its ``ece_kde(1)``; a plug-in estimate draws the ratio
        ``S_c / sum S`` without debiasing (formed from its class sums when it is
        debiased). The arrays equal those of :meth:`from_predictions` with
        ``kind="kernel"``, the same ``calibration`` and ``estimator`` and
        ``bandwidth=estimate.bandwidth`` (to about 1e-12 relative). The Beta-kernel grid
        curve and density of a top-label / class-wise diagram are direct sums on the
        grid, as in :meth:`from_predictions`.

        Parameters
        ----------
        estimate : CalibrationEstimate
            Made by :func:`kdecal.estimate` (any notion, estimator and debiasing), or
            one of :attr:`kdecal.CalibrationReport.estimates` (e.g.
            ``report.estimates["canonical"]``).
        class_index : int, optional
            A class-wise estimate only: the class; None stacks all K classes into
            ``(K, ...)`` arrays.
        n_bins : int, default 15
            Equal-width bins of the histogram of the confidences.
        n_grid : int, default 200
            Grid points of the Beta-kernel curve and density (top-label / class-wise).

        Returns
        -------
        ReliabilityDiagram
            Read-only arrays (``kind="kernel"``); shapes in :class:`ReliabilityDiagram`.
            ``ax`` is None.

        Raises
        ------
        TypeError
            ``estimate`` is not a :class:`kdecal.CalibrationEstimate` (a
            ``CalibrationReport``, say), or ``n_bins`` / ``n_grid`` not an integer.
        ValueError
            ``class_index`` given for an estimate that is not class-wise, or out of
            range; ``n_bins < 1``, ``n_grid`` not in ``2..MAX_GRID`` (100,000); an ``estimate`` without kernel sums.

        Examples
        --------
        >>> import kdecal
        >>> from kdecal.curves import ReliabilityDiagram
        >>> s = kdecal.datasets.make_seeds_synthetic(500, 3, seed=0)
        >>> est = kdecal.estimate(s.probs, s.labels, bandwidth=0.05)  # canonical
        >>> rd = ReliabilityDiagram.from_estimate(est)
        >>> rd.calibration, rd.bandwidth, rd.y.shape
        ('canonical', 0.05, (500,))
        """
        est = _check_estimate(estimate)
        calibration = est.calibration
        if class_index is not None and calibration != "classwise":
            raise ValueError(
                "class_index is only meaningful for a class-wise estimate; estimate has "
                f"calibration={calibration!r}"
            )
        n_bins = check_n_bins(n_bins, est.n)
        n_grid = _check_n_grid(n_grid)
        if class_index is not None:
            class_index = check_class_index(class_index, est.n_classes)
        view = _diagram_view(est)
        return _kernel_reliability(view, est._probs, est._labels, class_index, n_bins, n_grid)


def _kernel_reliability(
    est: CalibrationEstimate,
    p: np.ndarray,
    y: np.ndarray,
    class_index: int | None,
    n_bins: int,
    n_grid: int,
) -> ReliabilityDiagram:
    """Build the kernel :class:`ReliabilityDiagram` of an estimate (no engine call).

    ``est``: a residual-centred estimate, or a plug-in one without debiasing
    (:func:`_kernel_estimate` or :func:`_diagram_view`), of the validated rows ``p``
    (n, K) and labels ``y`` (n,); the options are checked already.
    """
    calibration = est.calibration
    residual = est.estimator == "residual"
    h = est.bandwidth
    E_all = est.conditional_expectation  # (n, K), (n,) top-label, (n, K) class-wise
    n = p.shape[0]
    if calibration == "canonical":
        pred = p.argmax(axis=1)
        rows = np.arange(n)
        conf = p[rows, pred]
        E = E_all[rows, pred]
        order = np.argsort(conf, kind="stable")
        counts = np.bincount(_binned._uniform_bins(conf, n_bins)[1], minlength=n_bins)
        return ReliabilityDiagram(
            kind="kernel",
            calibration=calibration,
            class_index=None,
            x=_readonly(conf[order]),
            y=_readonly(E[order]),
            edges=None,
            counts=_readonly(counts.astype(np.int64)),
            grid=None,
            grid_curve=None,
            density=None,
            bandwidth=h,
            ece=est.ece_kde(1),
            estimator=est.estimator,
        )
    points, lab = _formulas.problem_arrays(p, y, calibration)
    E_cols = E_all[:, None] if calibration == "top_label" else E_all
    rows_b = range(points.shape[0]) if class_index is None else [class_index]
    grid = np.linspace(0.0, 1.0, n_grid)
    xs, ys, gcs, dens, cnts, eces = [], [], [], [], [], []
    for b in rows_b:
        q = points[b, :, 1]
        target = lab[b].astype(np.float64)
        E = E_cols[:, b]
        order = np.argsort(q, kind="stable")
        xs.append(q[order])
        ys.append(E[order])
        gc, de = _beta_nw_grid(q, target - q if residual else target, h, grid)
        gcs.append(grid + gc if residual else gc)
        dens.append(de)
        cnts.append(
            np.bincount(_binned._uniform_bins(q, n_bins)[1], minlength=n_bins).astype(np.int64)
        )
        eces.append(float(np.mean(np.abs(E - q))))
    single = calibration == "top_label" or class_index is not None

    def pick(lst: list[np.ndarray]) -> np.ndarray:
        return _readonly(lst[0] if single else np.stack(lst))

    return ReliabilityDiagram(
        kind="kernel",
        calibration=calibration,
        class_index=class_index,
        x=pick(xs),
        y=pick(ys),
        edges=None,
        counts=pick(cnts),
        grid=_readonly(grid),
        grid_curve=pick(gcs),
        density=pick(dens),
        bandwidth=h,
        ece=eces[0] if single else _readonly(np.array(eces)),
        estimator=est.estimator,
    )


# ---------------------------------------------------------- calibration-sharpness diagram
@dataclass(frozen=True, eq=False)
class CalibrationSharpnessDiagram(ValueEq):
    """Arrays of a calibration-sharpness diagram and the Axes it is drawn on.

    Made by :meth:`from_predictions`; drawn by :func:`kdecal.plot.draw` or
    :func:`kdecal.plot.calibration_sharpness_diagram`.

    Attributes
    ----------
    t : ndarray, shape (G,), float64
        Grid of confidences, ``linspace(0, 1, n_grid)``.
    accuracy_curve : ndarray, shape (G,), float64
        ``m_acc(t)``: Gaussian Nadaraya-Watson estimate of ``E[1{Y = c(X)} | h(X) = t]``.
    loss_curve : ndarray, shape (G,), float64
        ``m_loss(t)``: the same regression of the per-sample full divergence
        ``d_phi(e_y, g(x))`` (Brier summed over classes, or ``-log g_y``).
    rho : ndarray, shape (G,), float64
        ``rho(t) = m_loss(t) - d_varphi(m_acc(t), t)`` (Eq. 5.1), not clipped.
    kde : ndarray, shape (G,), float64
        Gaussian KDE of the confidences, ``1/n sum_i N(t; h_i, sigma^2)``, not corrected
        at the boundary: it integrates to 1 over the real line, and over [0, 1] to less
        where the confidences lie within a few sigma of 0 or 1 (0.56 for a CIFAR-10
        network whose confidences crowd 1).
    density : ndarray, shape (G,), float64
        ``kde / max(kde)``, the overlay.
    lower, upper : ndarray, shape (G,), float64
        The band ``m_acc -+ kde * rho / 2``, the lower edge clipped at 0, the upper not
        clipped (so it can exceed 1).
    band_area : float
        ``integral_0^1 kde * rho dt`` (trapezoid rule): approximately ``total -
        calibration`` (Chidambaram & Ge 2024, Lemma 4.1; the difference is the kernel
        mass outside [0, 1] and the smoothing of the plug-in).
    calibration : float
        ``d_varphi,CAL``: the plug-in ``mean_j d_varphi(m_acc(h_j), h_j)`` over the
        evaluation points (all n samples, or the mean over ``n_subsamples``
        subsamples), as printed in the box (times 100).
    calibration_std : float or None
        Standard deviation (ddof = 1) over the subsamples; None without subsampling.
    calibration_a5 : float
        The (A.5) form ``mean_i [varphi(m(h_i)) - varphi(h_i) - varphi'(h_i) (a_i - h_i)]``
        over all samples, the estimator of Theorem A.4 (not drawn).
    total : float
        ``d_phi,TOT = mean_i d_phi(e_{y_i}, g(x_i))`` on all samples: the Brier score
        summed over classes (``kdecal.evaluate(...).brier_score``) or the log loss (nats);
        for binary ``(n,)`` input the one-column Brier ``mean (p - y)^2``.
    divergence : str
        ``"l2"`` or ``"kl"``.
    bandwidth : float
        Standard deviation of the Gaussian kernel.
    ax : matplotlib Axes or None
    """

    t: np.ndarray
    accuracy_curve: np.ndarray
    loss_curve: np.ndarray
    rho: np.ndarray
    kde: np.ndarray
    density: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    band_area: float
    calibration: float
    calibration_std: float | None
    calibration_a5: float
    total: float
    divergence: str
    bandwidth: float
    ax: Any = None

    @classmethod
    def from_predictions(
        cls,
        probs: object,
        labels: object,
        *,
        divergence: str = "l2",
        bandwidth: float = 0.05,
        n_grid: int = 1000,
        n_subsamples: int = 0,
        n_points: int = 5000,
        seed: int | None = 0,
    ) -> CalibrationSharpnessDiagram:
        """Compute the calibration-sharpness diagram of Chidambaram & Ge (2024), Sec. 5.

        The computation of :func:`kdecal.plot.calibration_sharpness_diagram` (see there
        for the definitions): Gaussian Nadaraya-Watson regressions of the accuracy and
        of the loss on the confidence (Eq. 5.2), ``rho`` (Eq. 5.1), the band and the box
        values. The Gaussian kernel is not kdecal's Dirichlet kernel, so there is no
        ``from_estimate``.

        Parameters
        ----------
        probs : array-like, shape (n, K) or (n,), float
            Predicted probabilities (2-D: top-label reduction; 1-D: P(y = 1) as is).
        labels : array-like, shape (n,), int
            True classes in ``0..K-1``.
        divergence : {"l2", "kl"}, default "l2"
            Brier score or log loss.
        bandwidth : float, default 0.05
            Standard deviation of the Gaussian kernel (confidence units).
        n_grid : int, default 1000
            Grid points in [0, 1].
        n_subsamples : int, default 0
            0: the calibration term averages all n points; > 0: mean and standard
            deviation over that many subsamples of ``n_points`` indices.
        n_points : int, default 5000
            Subsample size.
        seed : int or None, default 0
            Seed of the subsampling.

        Returns
        -------
        CalibrationSharpnessDiagram
            Read-only arrays of shape (n_grid,) and the box values; ``ax`` is None.

        Raises
        ------
        ValueError
            Invalid ``probs``/``labels``, unknown ``divergence``, ``bandwidth`` not a
            finite float > 0, ``n_grid`` not in ``2..MAX_GRID`` (100,000), ``n_subsamples < 0`` or ``n_points < 1``.
        TypeError
            Non-numeric input or bandwidth (including "auto").
        """
        return _sharpness_arrays(
            probs, labels, divergence, bandwidth, n_grid, n_subsamples, n_points, seed
        )


def _phi1(q: np.ndarray, divergence: str) -> np.ndarray:
    """1-D generator ``varphi``: ``q^2`` or ``q log q + (1 - q) log(1 - q)``."""
    if divergence == "l2":
        return q * q
    return np.asarray(xlogy(q, q) + xlogy(1.0 - q, 1.0 - q))


def _d1(m: np.ndarray, t: np.ndarray, divergence: str) -> np.ndarray:
    """``d_varphi(m, t)``: ``(m - t)^2`` or the binary KL; t clipped to [eps, 1 - eps]."""
    if divergence == "l2":
        return (m - t) ** 2
    tc = np.clip(t, PROB_EPS, 1.0 - PROB_EPS)
    return np.asarray(
        xlogy(m, m) - xlogy(m, tc) + xlogy(1.0 - m, 1.0 - m) - xlogy(1.0 - m, 1.0 - tc)
    )


def _sharpness_arrays(
    probs: object,
    labels: object,
    divergence: object,
    bandwidth: object,
    n_grid: object,
    n_subsamples: object,
    n_points: object,
    seed: object,
    grid: np.ndarray | None = None,
) -> CalibrationSharpnessDiagram:
    """Compute a :class:`CalibrationSharpnessDiagram` without drawing (no matplotlib)."""
    check_choice(divergence, "divergence", _DIVERGENCES)
    div = str(divergence)
    if isinstance(bandwidth, str):
        raise TypeError(
            f"bandwidth must be a float > 0 (the standard deviation of the Gaussian kernel; "
            f"Chidambaram & Ge use 0.05), got {bandwidth!r}"
        )
    sigma = check_bandwidth(bandwidth)
    n_grid = _check_n_grid(n_grid)
    n_sub = check_int(n_subsamples, "n_subsamples", 0)
    n_pts = check_int(n_points, "n_points", 1)
    P = check_probs(probs)
    y = check_labels(labels, P.n, P.n_classes)
    Pp = P.p
    rows = np.arange(P.n)
    # binary scores are used as is, h = p, a = y (Chidambaram & Ge 2024, Sec. 5, and their
    # code); else the top-label reduction (Sec. 4.2) with the full multi-class divergence
    if P.binary:
        h = Pp[:, 1].copy()
        a = y.astype(np.float64)
        loss = (Pp[:, 1] - a) ** 2 if div == "l2" else -np.log(Pp[rows, y])
    else:
        pred = Pp.argmax(axis=1)
        h = Pp[rows, pred]
        a = (pred == y).astype(np.float64)
        if div == "l2":
            loss = np.sum((Pp - np.eye(P.n_classes)[y]) ** 2, axis=1)
        else:
            loss = -np.log(Pp[rows, y])
    t = np.linspace(0.0, 1.0, n_grid) if grid is None else np.asarray(grid, dtype=np.float64)
    (m_acc, m_loss), kde = _gaussian_nw(t, h, np.stack([a, loss]), sigma)
    rho = m_loss - _d1(m_acc, t, div)
    band = kde * rho
    lower = np.maximum(m_acc - band / 2.0, 0.0)
    upper = m_acc + band / 2.0
    band_area = float(np.sum((band[1:] + band[:-1]) * np.diff(t)) / 2.0)
    # plug-in CAL at the data points (the regression is fitted on all n points)
    m_at = _gaussian_nw(h, h, a[None, :], sigma)[0][0]
    d_at = _d1(m_at, h, div)
    std: float | None
    if n_sub == 0:
        cal, std = float(np.mean(d_at)), None
    elif P.n <= n_pts:  # as the reference code: every point, no spread
        cal, std = float(np.mean(d_at)), 0.0
    else:
        rng = check_seed(seed)
        vals = np.array([np.mean(d_at[rng.choice(P.n, n_pts)]) for _ in range(n_sub)])
        cal = float(np.mean(vals))
        std = float(np.std(vals, ddof=1)) if n_sub > 1 else 0.0
    hc = np.clip(h, PROB_EPS, 1.0 - PROB_EPS)
    dphi = 2.0 * hc if div == "l2" else np.log(hc) - np.log1p(-hc)
    a5 = float(np.mean(_phi1(np.clip(m_at, 0.0, 1.0), div) - _phi1(hc, div) - dphi * (a - hc)))
    dens = kde / np.max(kde) if np.max(kde) > 0 else kde
    return CalibrationSharpnessDiagram(
        t=_readonly(t),
        accuracy_curve=_readonly(m_acc),
        loss_curve=_readonly(m_loss),
        rho=_readonly(rho),
        kde=_readonly(kde),
        density=_readonly(dens),
        lower=_readonly(lower),
        upper=_readonly(upper),
        band_area=band_area,
        calibration=cal,
        calibration_std=std,
        calibration_a5=a5,
        total=float(np.mean(loss)),
        divergence=div,
        bandwidth=sigma,
    )


# --------------------------------------------------------------------- simplex density
_TRI = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3.0) / 2.0]])


@dataclass(frozen=True, eq=False)
class SimplexDensity(ValueEq):
    """Arrays of the simplex density plot (K = 3) and its two Axes.

    Made by :meth:`from_predictions` or :meth:`from_estimate` (a canonical estimate of
    K = 3 classes); drawn by :func:`kdecal.plot.draw` or
    :func:`kdecal.plot.simplex_density`.

    Attributes
    ----------
    grid : ndarray, shape (M, 3), float64
        Barycentric grid ``(i, j, r - i - j) / r`` with ``r = resolution``,
        ``M = (r + 1)(r + 2) / 2``.
    xy : ndarray, shape (M, 2), float64
        The grid in the plane: class 0 at (0, 0), class 1 at (1, 0), class 2 at
        (1/2, sqrt(3)/2).
    kde : ndarray, shape (M,), float64
        Dirichlet KDE ``1/n sum_i Dir(u; f_i / h + 1)`` at the grid (density w.r.t.
        Lebesgue measure on the ``(u_0, u_1)`` chart, where the simplex has area 1/2).
        Grid coordinates are clipped to ``PROB_EPS`` as the data are, so boundary points
        have finite values (the limit from inside for data on a face).
    bandwidth : float
        Dirichlet bandwidth h.
    n_bins_per_side : int
        m: the simplex is cut into m^2 equal triangles (kdecal.binned.simplex_ece).
    cell_vertices : ndarray, shape (m^2, 3, 3), float64
        Barycentric vertices of each cell.
    cell_counts : ndarray, shape (m^2,), int64
        Samples in each cell (sums to n).
    cell_density : ndarray, shape (m^2,), float64
        Histogram density ``count / (n * area)`` with area ``1 / (2 m^2)`` in the same
        chart as ``kde`` (comparable values; integrates to 1).
    cell_frequency : ndarray or None, shape (m^2, 3), float64
        With labels: the histogram estimate H of ``E[y | f]`` in each cell (the mean
        one-hot label; NaN for empty cells). None without labels.
    simplex_ece : float or None
        With labels: :func:`kdecal.binned.simplex_ece` at the same m (p = 1).
    ece_kde : float or None
        With labels: canonical ECE^KDE (p = 1) at the same bandwidth, of the
        residual-centred regression or the plug-in ratio (``estimator``).
    points : ndarray or None, shape (n, 3), float64
        The predictions as the kernel sees them (clipped to ``PROB_EPS``, rows
        renormalised), scattered over the cells when drawn.
    labels : ndarray or None, shape (n,), int64
        Their true classes (the colours of the points); None without labels.
    estimator : str or None
        With labels: ``"residual"`` or ``"plugin"``, the regression of ``ece_kde``.
    ax : ndarray of 2 Axes or None
        Left: the cells and the points; right: the Dirichlet KDE.
    """

    grid: np.ndarray
    xy: np.ndarray
    kde: np.ndarray
    bandwidth: float
    n_bins_per_side: int
    cell_vertices: np.ndarray
    cell_counts: np.ndarray
    cell_density: np.ndarray
    cell_frequency: np.ndarray | None
    simplex_ece: float | None
    ece_kde: float | None
    points: np.ndarray | None = None
    labels: np.ndarray | None = None
    estimator: str | None = None
    ax: Any = None

    @classmethod
    def from_predictions(
        cls,
        probs: object,
        labels: object = None,
        *,
        bandwidth: float | str = "auto",
        n_bins_per_side: int | None = None,
        resolution: int = 150,
        estimator: str = "residual",
        backend: Backend = "auto",
    ) -> SimplexDensity:
        """Compute the simplex-binned histogram and the Dirichlet KDE, for K = 3.

        The computation of :func:`kdecal.plot.simplex_density`: the ``m^2`` cells of
        :func:`kdecal.binned.simplex_ece` with their counts and densities, and the
        Dirichlet KDE ``1/n sum_i Dir(u; f_i / h + 1)`` on a barycentric grid
        (Popordanoska et al. 2022, Sec. 4, Fig. 1, Fig. 7). With labels, the bandwidth
        and ``ece_kde`` come from one engine pass of :func:`kdecal.estimate` (canonical,
        ``estimator``, no debiasing).

        Parameters
        ----------
        probs : array-like, shape (n, 3), float
            Predicted probabilities of a three-class problem.
        labels : array-like, shape (n,), int, optional
            True classes in 0..2 (per-cell frequencies and the two calibration errors).
        bandwidth : float, "auto" or "loo-mle", default "auto"
            Dirichlet bandwidth h > 0; "auto" is the leave-one-out Brier bandwidth of
            the canonical regression with labels, the leave-one-out likelihood
            (:func:`kdecal.select_bandwidth`) without.
        n_bins_per_side : int, optional
            m; default: Doane's rule, as :func:`kdecal.binned.simplex_ece`.
        resolution : int, default 150
            Grid divisions per side (``(r + 1)(r + 2) / 2`` points).
        estimator : {"residual", "plugin"}, default "residual"
            With labels: the regression of ``ece_kde``, as :func:`kdecal.estimate`'s.
        backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"

        Returns
        -------
        SimplexDensity
            Read-only arrays; shapes in :class:`SimplexDensity`. ``ax`` is None.

        Raises
        ------
        ValueError
            Invalid ``probs``/``labels``, K != 3, bad ``bandwidth``, unknown
            ``estimator``, ``n_bins_per_side < 1`` or ``resolution`` not in
            ``2..MAX_RESOLUTION`` (2,000).
        TypeError
            Non-numeric input or bandwidth, or an integer option that is not an integer.
        """
        check_choice(estimator, "estimator", ESTIMATORS)
        P = check_probs(probs)
        if P.n_classes != 3:
            raise ValueError(
                "simplex_density needs K = 3 classes (probs of shape (n, 3)), got "
                f"K = {P.n_classes}"
            )
        y = None if labels is None else check_labels(labels, P.n, 3)
        r = _check_resolution(resolution)
        be = resolve_backend(backend, probs)
        est = None
        if y is not None:  # the bandwidth and estimate of the canonical regression
            est = _kernel_estimate(P, y, "canonical", bandwidth, be, estimator)
            h = est.bandwidth
        else:  # no labels: the leave-one-out likelihood of the density
            h = _resolve_bandwidth(P, None, "canonical", bandwidth, be, False)
        raw = _binned._raw_probs(probs)
        m = _bins_per_side(n_bins_per_side, raw)
        return _simplex(P.p, raw, y, h, est, m, r)

    @classmethod
    def from_estimate(
        cls,
        estimate: CalibrationEstimate,
        *,
        n_bins_per_side: int | None = None,
        resolution: int = 150,
    ) -> SimplexDensity:
        """Build the simplex density of a canonical K = 3 estimate, with no kernel pass.

        The Dirichlet KDE on the grid at ``estimate.bandwidth`` (direct sums on the
        grid), the cells of :func:`kdecal.binned.simplex_ece` with the estimate's rows
        and labels, and ``ece_kde``, the L1 error of the estimate's regression
        (``estimate.ece_kde(1)`` for a residual-centred one; the plug-in ratio of the
        kernel sums without debiasing for a plug-in one). The arrays equal those of
        :meth:`from_predictions` with the labels, the estimate's ``estimator`` and
        ``bandwidth=estimate.bandwidth`` (``ece_kde`` to about 1e-12 relative),
        except that the cells are those of the estimate's validated rows (clipped to
        ``PROB_EPS`` and renormalised) instead of the raw input, which can move a
        prediction lying exactly on a cell edge to the neighbouring cell.

        Parameters
        ----------
        estimate : CalibrationEstimate
            A canonical estimate (``calibration="canonical"``) of K = 3 classes, made by
            :func:`kdecal.estimate` or held by a report
            (``report.estimates["canonical"]``).
        n_bins_per_side : int, optional
            m; default: Doane's rule on the estimate's rows, as
            :func:`kdecal.binned.simplex_ece`.
        resolution : int, default 150
            Grid divisions per side (``(r + 1)(r + 2) / 2`` points).

        Returns
        -------
        SimplexDensity
            Read-only arrays with the labels' fields; shapes in :class:`SimplexDensity`.
            ``ax`` is None.

        Raises
        ------
        TypeError
            ``estimate`` is not a :class:`kdecal.CalibrationEstimate`, or an integer
            option that is not an integer.
        ValueError
            ``estimate`` is not canonical, not of K = 3 classes, or holds no kernel
            sums; ``n_bins_per_side < 1`` or ``resolution`` not in ``2..MAX_RESOLUTION``
            (2,000).
        """
        est = _check_estimate(estimate)
        if est.calibration != "canonical":
            raise ValueError(
                "estimate must be canonical (calibration='canonical') for a simplex "
                f"density, got calibration={est.calibration!r}"
            )
        if est.n_classes != 3:
            raise ValueError(
                f"estimate must be of K = 3 classes for a simplex density, got K = {est.n_classes}"
            )
        r = _check_resolution(resolution)
        view = _diagram_view(est)
        p = est._probs
        m = _bins_per_side(n_bins_per_side, p)
        return _simplex(p, p, est._labels, view.bandwidth, view, m, r)


def _all_cells(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every cell of the K = 3 triangulation: keys (m^2, 4) = (a0, a1, perm0, perm1), vertices."""
    keys, verts = [], []
    for a0 in range(m):
        for a1 in range(a0, m):
            perms = [(1, 0)] if a0 == a1 else [(1, 0), (0, 1)]
            for pm in perms:
                a = np.array([a0, a1])
                v = _binned._kuhn_vertices(a, np.array(pm), m)
                # the cell rule must map the cell's centroid back to this cell
                ka, kp = _binned._simplex_cell_keys(v.mean(axis=0)[None, :], m)
                keys.append(np.concatenate([ka[0], kp[0]]))
                verts.append(v)
    return np.array(keys, dtype=np.int64), np.array(verts)


def _bins_per_side(n_bins_per_side: object, raw: np.ndarray) -> int:
    """Return m of the simplex binning: Doane's rule on ``raw`` when None, else checked."""
    if n_bins_per_side is None:
        return _binned._default_bins_per_side(raw)
    m = check_int(n_bins_per_side, "n_bins_per_side", 1)
    if m > MAX_BINS_PER_SIDE:  # m^2 cells
        raise ValueError(f"n_bins_per_side must be at most {MAX_BINS_PER_SIDE}, got {m}")
    return m


def _simplex(
    p: np.ndarray,
    raw: np.ndarray,
    y: np.ndarray | None,
    h: float,
    est: CalibrationEstimate | None,
    m: int,
    r: int,
) -> SimplexDensity:
    """Build the :class:`SimplexDensity` of validated rows (no engine call).

    ``p``: the clipped rows (n, 3) of the KDE; ``raw``: the rows binned into cells;
    ``y``: labels or None; ``est``: the canonical estimate drawn at ``h`` (with
    labels); ``m``, ``r``: checked options.
    """
    n = p.shape[0]
    # ---- Dirichlet KDE on the barycentric grid
    ii, jj = np.meshgrid(np.arange(r + 1), np.arange(r + 1), indexing="ij")
    keep = ii + jj <= r
    grid = np.stack([ii[keep], jj[keep], r - ii[keep] - jj[keep]], axis=1) / r
    kde = np.exp(_dirichlet_grid(p, np.log(np.maximum(grid, PROB_EPS)), h)[0])
    # ---- simplex binning (the cell rule of kdecal.binned.simplex_ece)
    keys, verts = _all_cells(m)
    lookup = {tuple(k): i for i, k in enumerate(keys.tolist())}
    ka, kp = _binned._simplex_cell_keys(raw, m)
    cell = np.array([lookup[tuple(k)] for k in np.concatenate([ka, kp], axis=1).tolist()])
    counts = np.bincount(cell, minlength=m * m).astype(np.int64)
    density = counts / (n * (0.5 / (m * m)))
    freq = sece = ekde = None
    if y is not None and est is not None:
        lab = np.bincount(cell * 3 + y, minlength=3 * m * m).reshape(m * m, 3).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            freq = _readonly(np.where(counts[:, None] > 0, lab / counts[:, None], np.nan))
        sece = _binned.simplex_ece(raw, y, n_bins_per_side=m)
        ekde = est.ece_kde(1)
    return SimplexDensity(
        grid=_readonly(grid),
        xy=_readonly(grid @ _TRI),
        kde=_readonly(kde),
        bandwidth=h,
        n_bins_per_side=m,
        cell_vertices=_readonly(verts),
        cell_counts=_readonly(counts),
        cell_density=_readonly(density),
        cell_frequency=freq,
        simplex_ece=sece,
        ece_kde=ekde,
        points=_readonly(np.array(p, dtype=np.float64)),
        labels=None if y is None else _readonly(np.array(y, dtype=np.int64)),
        estimator=None if ekde is None or est is None else est.estimator,
    )


# --------------------------------------------------------------------- Bayes risk curve
@dataclass(frozen=True, eq=False)
class BayesRiskCurve(ValueEq):
    """Arrays of the Bayes risk curves of S systems and the Axes they are drawn on.

    Made by :meth:`from_predictions`; drawn by :func:`kdecal.plot.draw` or
    :func:`kdecal.plot.bayes_risk_curve`.

    Attributes
    ----------
    names : tuple of str, length S
    threshold : ndarray, shape (G,), float64
        Thresholds t in [0, 1] on P(y = 1): decide class 1 iff P(y = 1) > t.
    risk : ndarray, shape (S, G), float64
        ``W(t) Risk(t)`` (divided by the naive system's area when ``normalize``). Its
        integral over [0, 1] is ``cross_entropy`` (uniform weight), ``1.5 * brier``
        (beta22), or their normalised values; a quadrature on ``threshold`` approaches
        it as the grid is refined (the curve has steps at every sample and rises like
        1/t or 1/(1 - t) towards the ends when a sample is confidently wrong).
    weight : str
        ``"uniform"`` (area = cross-entropy) or ``"beta22"`` (area = 3 x the Brier score
        with the 1/K convention of Ferrer & Ramos Eq. 9, i.e. 1.5 x kdecal's Brier score).
    normalize : bool
    cross_entropy : ndarray, shape (S,), float64
        ``-mean log q_y`` (nats; probabilities clipped to ``PROB_EPS``).
    normalized_cross_entropy : ndarray, shape (S,), float64
        ``cross_entropy / H(pi)``, pi the class frequencies (Eq. 8).
    brier : ndarray, shape (S,), float64
        Brier score summed over the two classes, ``2 mean (p - y)^2`` (kdecal's).
    normalized_brier : ndarray, shape (S,), float64
        ``brier / (2 pi_0 pi_1)`` (Eq. 9, NBS).
    error_rate : ndarray, shape (S,), float64
        Error rate of the decisions at t = 1/2 (``Risk(1/2) = 2 x error rate``).
    ax : matplotlib Axes or None
    """

    names: tuple[str, ...]
    threshold: np.ndarray
    risk: np.ndarray
    weight: str
    normalize: bool
    cross_entropy: np.ndarray
    normalized_cross_entropy: np.ndarray
    brier: np.ndarray
    normalized_brier: np.ndarray
    error_rate: np.ndarray
    ax: Any = None

    @classmethod
    def from_predictions(
        cls,
        probs: object,
        labels: object,
        *,
        names: Sequence[str] | None = None,
        weight: str = "uniform",
        normalize: bool = False,
        n_grid: int = 2001,
        thresholds: object = None,
    ) -> BayesRiskCurve:
        """Compute the Bayes risk of binary posteriors against the decision threshold.

        The computation of :func:`kdecal.plot.bayes_risk_curve` (Ferrer & Ramos 2025,
        Eq. 10-12, 34, Fig. 4): ``Risk(t)``, whose integral over [0, 1] is the
        cross-entropy (``weight="uniform"``) or 1.5 x the Brier score (``"beta22"``).
        No kernel is involved, so there is no ``from_estimate``.

        Parameters
        ----------
        probs : array-like, sequence of array-likes, or mapping name -> array-like
            One system or several, each of shape (n,) (P(y = 1)) or (n, 2).
        labels : array-like, sequence of array-likes, or mapping name -> array-like
            Labels in {0, 1}: one array for every system, or one per system.
        names : sequence of str, optional
            System names; default the mapping's keys or "system i".
        weight : {"uniform", "beta22"}, default "uniform"
        normalize : bool, default False
            Divide by the area of the naive system (NCE, NBS).
        n_grid : int, default 2001
            Equally spaced thresholds in [0, 1].
        thresholds : array-like, shape (G,), optional
            Strictly increasing thresholds in [0, 1] instead.

        Returns
        -------
        BayesRiskCurve
            Thresholds, curves (S, G), CE/NCE, Brier/NBS and error rates; ``ax`` is
            None.

        Raises
        ------
        ValueError
            Invalid probabilities or labels, K != 2, unknown ``weight``, ``n_grid`` not in
            ``3..MAX_GRID`` (100,000),
            bad ``thresholds``, mismatched numbers of systems, labels and names, or
            ``normalize=True`` with a single class present.
        TypeError
            Non-numeric input or thresholds, ``n_grid`` not an integer, or ``normalize``
            not a bool.
        """
        check_choice(weight, "weight", _WEIGHTS)
        if not isinstance(normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True or False, got {normalize!r}")
        if thresholds is None:
            t = np.linspace(0.0, 1.0, _check_n_grid(n_grid, 3))
        else:
            t = np.asarray(_validation._numeric_array(thresholds, "thresholds"), dtype=np.float64)
            if t.ndim != 1 or t.size < 2 or not np.all(np.isfinite(t)):
                raise ValueError("thresholds must be a 1-D array of >= 2 finite values")
            if np.any(t < 0) or np.any(t > 1) or np.any(np.diff(t) <= 0):
                raise ValueError("thresholds must increase strictly within [0, 1]")
        w = np.ones_like(t) if weight == "uniform" else 6.0 * t * (1.0 - t)
        systems = _as_systems(probs, labels, names)
        out: dict[str, list[float]] = {k: [] for k in ("ce", "nce", "bs", "nbs", "err")}
        curves = []
        for name, p, lab in systems:
            P = check_probs(p, name="probs" if len(systems) == 1 else f"probs[{name!r}]")
            p1 = _binary_column(P, "probs")
            y = check_labels(lab, P.n, 2)
            pi1 = float(np.mean(y))
            ce = float(-np.mean(np.log(P.p[np.arange(P.n), y])))
            ent = float(-xlogy(pi1, pi1) - xlogy(1.0 - pi1, 1.0 - pi1))
            bs = float(2.0 * np.mean((p1 - y) ** 2))
            naive_bs = 2.0 * pi1 * (1.0 - pi1)
            curve = w * _bayes_risk(p1, y, t)
            if normalize:
                naive = ent if weight == "uniform" else 1.5 * naive_bs
                if naive <= 0:
                    raise ValueError(
                        f"normalize=True needs both classes among the labels of {name!r}"
                    )
                curve = curve / naive
            curves.append(curve)
            out["ce"].append(ce)
            out["nce"].append(ce / ent if ent > 0 else math.inf)
            out["bs"].append(bs)
            out["nbs"].append(bs / naive_bs if naive_bs > 0 else math.inf)
            out["err"].append(float(np.mean((p1 > 0.5).astype(np.int64) != y)))
        return cls(
            names=tuple(s[0] for s in systems),
            threshold=_readonly(t),
            risk=_readonly(np.array(curves)),
            weight=str(weight),
            normalize=bool(normalize),
            cross_entropy=_readonly(np.array(out["ce"])),
            normalized_cross_entropy=_readonly(np.array(out["nce"])),
            brier=_readonly(np.array(out["bs"])),
            normalized_brier=_readonly(np.array(out["nbs"])),
            error_rate=_readonly(np.array(out["err"])),
        )


def _binary_column(P: Probs, name: str) -> np.ndarray:
    if P.n_classes != 2:
        raise ValueError(
            f"bayes_risk_curve is for binary problems: {name} must have shape (n,) or "
            f"(n, 2), got K = {P.n_classes} columns"
        )
    return P.p[:, 1]


def _bayes_risk(p1: np.ndarray, y: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Risk(t) with the costs of Ferrer & Ramos Eq. 34, thresholding P(y = 1) at t.

    ``(1/N) [ #{y = 0, p1 > t} / (1 - t) + #{y = 1, p1 <= t} / t ]``: a class-0 sample
    decided 1 costs 1/(1 - t) and a class-1 sample decided 0 costs 1/t (0/0 = 0 at the
    ends, where no sample is misclassified because 0 < p1 < 1 after clipping).
    """
    neg = np.sort(p1[y == 0])
    pos = np.sort(p1[y == 1])
    fp = neg.shape[0] - np.searchsorted(neg, t, side="right")  # p1 > t, y = 0
    fn = np.searchsorted(pos, t, side="right")  # p1 <= t, y = 1
    r = np.zeros(t.shape[0])
    np.divide(fp, 1.0 - t, out=r, where=fp > 0)
    r2 = np.zeros(t.shape[0])
    np.divide(fn, t, out=r2, where=fn > 0)
    return (r + r2) / p1.shape[0]


def _as_systems(probs: object, labels: object, names: object) -> list[tuple[str, Any, Any]]:
    """Normalise the (probs, labels, names) forms into a list of (name, probs, labels)."""
    if isinstance(probs, Mapping):
        items = list(probs.items())
        nm = [str(k) for k, _ in items]
        ps = [v for _, v in items]
    elif isinstance(probs, (list, tuple)) and len(probs) > 0 and np.ndim(probs[0]) >= 1:
        ps = list(probs)
        nm = [f"system {i}" for i in range(len(ps))]
    else:
        ps = [probs]
        nm = ["system"]
    if names is not None:
        nm = [str(s) for s in names]  # type: ignore[attr-defined]
        if len(nm) != len(ps):
            raise ValueError(f"names has {len(nm)} entries for {len(ps)} systems")
    if isinstance(labels, Mapping):
        ls = [labels[k] for k in (probs.keys() if isinstance(probs, Mapping) else nm)]
    elif isinstance(labels, (list, tuple)) and len(labels) > 0 and np.ndim(labels[0]) >= 1:
        ls = list(labels)
        if len(ls) != len(ps):
            raise ValueError(f"labels has {len(ls)} arrays for {len(ps)} systems")
    else:
        ls = [labels] * len(ps)
    return list(zip(nm, ps, ls))


# --------------------------------------------------------- deprecated aliases (one release)
def reliability_diagram(*args: Any, **kwargs: Any) -> ReliabilityDiagram:
    """Compute :meth:`ReliabilityDiagram.from_predictions` (deprecated alias).

    Warns with a :class:`DeprecationWarning` and returns the same object; removed in the
    next release.
    """
    _deprecated("reliability_diagram", "ReliabilityDiagram.from_predictions")
    return ReliabilityDiagram.from_predictions(*args, **kwargs)


def calibration_sharpness_diagram(*args: Any, **kwargs: Any) -> CalibrationSharpnessDiagram:
    """Compute :meth:`CalibrationSharpnessDiagram.from_predictions` (deprecated alias).

    Warns with a :class:`DeprecationWarning` and returns the same object; removed in the
    next release.
    """
    _deprecated("calibration_sharpness_diagram", "CalibrationSharpnessDiagram.from_predictions")
    return CalibrationSharpnessDiagram.from_predictions(*args, **kwargs)


def simplex_density(*args: Any, **kwargs: Any) -> SimplexDensity:
    """Compute :meth:`SimplexDensity.from_predictions` (deprecated alias).

    Warns with a :class:`DeprecationWarning` and returns the same object; removed in the
    next release.
    """
    _deprecated("simplex_density", "SimplexDensity.from_predictions")
    return SimplexDensity.from_predictions(*args, **kwargs)


def bayes_risk_curve(*args: Any, **kwargs: Any) -> BayesRiskCurve:
    """Compute :meth:`BayesRiskCurve.from_predictions` (deprecated alias).

    Warns with a :class:`DeprecationWarning` and returns the same object; removed in the
    next release.
    """
    _deprecated("bayes_risk_curve", "BayesRiskCurve.from_predictions")
    return BayesRiskCurve.from_predictions(*args, **kwargs)
