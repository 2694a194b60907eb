"""Calibration plots: reliability, calibration-sharpness, simplex-density and Bayes-risk.

Drawing only: every function takes its arrays from :mod:`kdecal.curves` (which imports
no plotting library) and draws them with matplotlib, an optional dependency
(``pip install 'kdecal[plot]'``). The functions named after a diagram compute its arrays
(the ``from_predictions`` class method of the :mod:`kdecal.curves` class, called once)
and draw them; ``draw=False`` returns the arrays without importing matplotlib.
:func:`draw` draws arrays computed already, e.g. from an estimate with no new kernel
pass (``kdecal.curves.ReliabilityDiagram.from_estimate(est)``). The results are the
frozen dataclasses of :mod:`kdecal.curves`, holding the arrays and the matplotlib Axes
drawn on (``.ax``, None when ``draw=False``).

- :func:`reliability_diagram`: binned bars (Guo et al. 2017; class-wise as in
  Popordanoska et al. 2024, Fig. 8) or the leave-one-out Beta/Dirichlet-kernel estimate
  of ``E[y | f]`` against the confidence, the diagonal, the gap shaded, and the
  distribution of the confidences beneath.
- :func:`calibration_sharpness_diagram`: the calibration-sharpness diagram of
  Chidambaram & Ge (2024), Sec. 5 and Fig. 1.
- :func:`simplex_density`: for K = 3, the simplex-binned histogram beside the Dirichlet
  KDE over the simplex (Popordanoska et al. 2022, Fig. 1 and Fig. 7).
- :func:`bayes_risk_curve`: Bayes risk of binary posteriors against the decision
  threshold, whose area is the cross-entropy (Ferrer & Ramos 2025, Eq. 10-12, 34,
  Fig. 4).
- :func:`draw`: any of the four, computed already (by their class methods).
- :func:`evaluation_page`: the one-page summary written by ``kdecal evaluate --plot``.

The dataclasses were importable from this module too (``kdecal.plot.ReliabilityDiagram``
etc.); those names are deprecated (they warn) and go in the next release: import them
from :mod:`kdecal.curves`.

References
----------
The papers behind every diagram are listed in :mod:`kdecal.curves`, which computes them.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import warnings
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from . import curves as _curves
from ._engine.backends import Backend
from ._evaluate import evaluate
from ._validation import as_array, check_int
from .kde import CANONICAL_RELIABLE_MAX_K

__all__ = [
    "bayes_risk_curve",
    "calibration_sharpness_diagram",
    "draw",
    "evaluation_page",
    "reliability_diagram",
    "require_matplotlib",
    "simplex_density",
]

#: The dataclasses this module re-exported until 0.1 (deprecated: kdecal.curves has them).
_MOVED = ("BayesRiskCurve", "CalibrationSharpnessDiagram", "ReliabilityDiagram", "SimplexDensity")

_INSTALL_HINT = "pip install 'kdecal[plot]'"
#: Beta-kernel bandwidth of the top-label kernel curve of :func:`evaluation_page`: the
#: value Popordanoska et al. (2024, appendix "Assessing calibration error", Table 5 and
#: Fig. 8) use for their class-wise KDE estimators. The leave-one-out likelihood on the
#: confidences alone is unusable for a picture when many confidences tie near 1 (float32
#: outputs): it then selects bandwidths of order 1e-5 and the curve is noise.
_PAGE_TOP_LABEL_H = 0.02


def __getattr__(name: str) -> type:
    """Return a dataclass of :mod:`kdecal.curves` by its deprecated name here (warns)."""
    if name in _MOVED:
        warnings.warn(
            f"kdecal.plot.{name} is deprecated; use kdecal.curves.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        cls: type = getattr(_curves, name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- helpers
def _pyplot() -> Any:
    """Import matplotlib.pyplot, or raise an ImportError that says how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "kdecal.plot needs matplotlib to draw; install it with "
            f"{_INSTALL_HINT} (or pass draw=False to get the arrays only)"
        ) from exc
    return plt


def _figure_class() -> Any:
    """``matplotlib.figure.Figure`` (no pyplot state), with the same ImportError."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"kdecal.plot needs matplotlib to draw; install it with {_INSTALL_HINT}"
        ) from exc
    return Figure


def require_matplotlib() -> None:
    """Raise the ImportError of :mod:`kdecal.plot` now if matplotlib is missing.

    Raises
    ------
    ImportError
        matplotlib cannot be imported; the message says ``pip install 'kdecal[plot]'``.
    """
    _figure_class()


def _fraction_bars(hax: Any, edges: np.ndarray, counts: np.ndarray) -> None:
    """Histogram of the confidences (fraction per bin) beneath a reliability diagram."""
    hax.bar(
        edges[:-1],
        counts / counts.sum(),
        width=np.diff(edges),
        align="edge",
        color="0.55",
        edgecolor="0.3",
        lw=0.5,
    )
    hax.set_ylabel("fraction", fontsize="small")


def _check_draw(draw: object) -> bool:
    if not isinstance(draw, (bool, np.bool_)):
        raise TypeError(f"draw must be True or False, got {draw!r}")
    return bool(draw)


def _with_hist_axis(ax: Any) -> Any:
    """Split ``ax`` into the diagram (top) and a short panel beneath; return the latter."""
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    divider = make_axes_locatable(ax)
    hax = divider.append_axes("bottom", size="28%", pad=0.08, sharex=ax)
    ax.tick_params(labelbottom=False)
    return hax


def _kernel_ece_name(rd: _curves.ReliabilityDiagram) -> str:
    """Name a kernel diagram's L1 error: ECE^KDE, "plug-in" for the papers' ratio."""
    return ("plug-in " if rd.estimator == "plugin" else "") + "ECE$^{KDE}$"


def _draw_reliability_one(
    ax: Any,
    hax: Any,
    rd: _curves.ReliabilityDiagram,
    row: int | None,
    title: str | None,
    legend: bool,
) -> None:
    """Draw one (binary-problem) reliability diagram on ``ax`` and its distribution."""

    def sel(a: np.ndarray | None) -> np.ndarray | None:
        return a if a is None or row is None else a[row]

    x, y, counts = sel(rd.x), sel(rd.y), sel(rd.counts)
    ax.plot([0, 1], [0, 1], ls="--", color="0.4", lw=1, label="perfect calibration", zorder=3)
    if rd.kind == "binned":
        edges = sel(rd.edges)
        assert edges is not None and x is not None and y is not None and counts is not None
        ok = counts > 0
        left, width = edges[:-1][ok], np.diff(edges)[ok]
        freq, conf = y[ok], x[ok]
        what = "accuracy" if rd.calibration == "top_label" else "frequency"
        ax.bar(
            left,
            freq,
            width=width,
            align="edge",
            color="C0",
            edgecolor="navy",
            lw=0.6,
            alpha=0.85,
            label=what,
            zorder=2,
        )
        ax.bar(
            left,
            conf - freq,
            bottom=freq,
            width=width,
            align="edge",
            color="C3",
            alpha=0.35,
            edgecolor="C3",
            hatch="//",
            lw=0.6,
            label="gap",
            zorder=2,
        )
        ax.plot(conf, conf, ls="none", marker="_", color="C3", ms=6, zorder=4)
        _fraction_bars(hax, edges, counts)
        ece = float(np.asarray(rd.ece)[() if row is None else row])
        default_title = f"{len(edges) - 1} bins, ECE = {ece:.4f}"
    elif rd.calibration == "canonical":
        assert x is not None and y is not None and counts is not None
        edges = np.linspace(0.0, 1.0, counts.shape[0] + 1)
        ax.plot(
            x,
            y,
            ls="none",
            marker="o",
            ms=2.5,
            color="C0",
            alpha=0.35,
            mec="none",
            label=r"LOO $\hat E[y_{pred}\mid f]$, samples",
            zorder=2,
        )
        bx, by = _curves.bin_means(x, y, counts.shape[0])
        ax.fill_between(
            bx, bx, by, color="C3", alpha=0.3, lw=0, label="gap of bin means", zorder=1
        )
        ax.plot(bx, by, marker="o", ms=4, color="C3", lw=1.4, label="bin means", zorder=4)
        _fraction_bars(hax, edges, counts)
        default_title = (
            f"canonical Dirichlet KDE, h = {rd.bandwidth:.3g}\n"
            f"{_kernel_ece_name(rd)} (L1, canonical) = {float(rd.ece):.4f}"
        )
    else:
        grid, dens = rd.grid, sel(rd.density)
        assert x is not None and y is not None and dens is not None and grid is not None
        ax.fill_between(x, x, y, color="C3", alpha=0.3, lw=0, label="gap", zorder=1)
        ax.plot(x, y, color="C0", lw=1.6, label=r"LOO kernel $\hat E[y\mid f]$", zorder=2)
        hax.fill_between(grid, 0, dens, color="0.6", lw=0)
        hax.plot(grid, dens, color="0.3", lw=0.8)
        hax.set_ylabel("density", fontsize="small")
        hax.set_ylim(bottom=0)
        ece = float(np.asarray(rd.ece)[() if row is None else row])
        default_title = f"Beta kernel, h = {rd.bandwidth:.3g}, {_kernel_ece_name(rd)} = {ece:.4f}"
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("auto")
    ax.grid(True, alpha=0.3)
    if rd.calibration == "top_label":
        ylabel = "accuracy"
    elif rd.calibration == "canonical":
        ylabel = "E[y = predicted class | f]"
    else:
        c = rd.class_index if row is None else row
        ylabel = f"frequency of class {c}"
    ax.set_ylabel(ylabel)
    hax.set_xlabel(
        "confidence max$_k$ f$_k$" if rd.calibration != "classwise" else "predicted f$_c$"
    )
    hax.tick_params(axis="y", labelsize="x-small")
    hax.grid(True, alpha=0.3)
    ax.set_title(default_title if title is None else title, fontsize="medium")
    if legend:
        ax.legend(loc="upper left", fontsize="small", framealpha=0.8)


def reliability_diagram(
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
    title: str | None = None,
    ax: Any = None,
    draw: bool = True,
) -> _curves.ReliabilityDiagram:
    """Reliability diagram: E[y | f] against the confidence, binned or kernel.

    Draws the estimate of ``E[1{y = c} | confidence]`` against the confidence, the
    diagonal (perfect calibration), the gap between them shaded, and always the
    distribution of the confidences in a short panel beneath (a histogram, or the
    Beta-kernel density for kernel curves), the element whose omission Chidambaram & Ge
    (2024, Sec. 5) call a common pitfall.

    - ``kind="binned"``: bars of the per-bin frequency (accuracy for top-label) from
      :func:`kdecal.binned.binned_statistics` (equal-width, right-closed bins; Guo et
      al. 2017, Sec. 2 and Fig. 1), with the gap to each bin's mean confidence shaded
      in red (Popordanoska et al. 2024, Fig. 8).
    - ``kind="kernel"``: the leave-one-out kernel estimate of kdecal at the data points,
      sorted by confidence: for top-label / class-wise the Beta kernel on the binary
      problem ``(f_c, 1{y = c})`` (Popordanoska et al. 2024, Eq. 24-25); the gap
      between it and the diagonal is shaded. By default (``estimator="residual"``) the
      residual-centred regression ``f + g``, ``g`` the kernel regression of ``y - f``,
      whose mean gap is the ECE^KDE of :func:`kdecal.ece_kde` and
      :func:`kdecal.evaluate`; ``estimator="plugin"`` draws the papers' ratio
      ``sum w y / sum w`` (the positive column of :func:`kdecal.conditional_expectation`
      on that problem), which the kernel shrinks towards the data's mean.
    - ``kind="kernel", calibration="canonical"``: the canonical view: for every sample
      the component of the predicted class of the Dirichlet-kernel LOO estimate of
      ``E[y | f]`` (Popordanoska et al. 2022, Eq. 3, 10), as points against the
      confidence, with the points' means in confidence bins and the gap of those means
      to the diagonal shaded. Unlike the top-label curve this is not a function of the
      confidence alone: the spread shows what canonical calibration sees beyond
      top-label calibration.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities (rows on the simplex), or P(y = 1) of a binary problem
        (the two columns ``(1 - p, p)``).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    kind : {"binned", "kernel"}, default "binned"
    calibration : {"top_label", "classwise", "canonical"}, default "top_label"
        ``"top_label"``: confidence ``max_k f_k``, outcome ``argmax_k f_k == y``.
        ``"classwise"``: the problem ``(f_c, 1{y = c})`` of class ``class_index``, or of
        every class (one panel per class, as Popordanoska et al. 2024, Fig. 8) when
        ``class_index`` is None. ``"canonical"``: kernel only, see above.
    class_index : int, optional
        Class-wise only: the class to draw.
    n_bins : int, default 15
        Number of equal-width bins (binned diagrams, and the histogram beneath a
        canonical diagram).
    bandwidth : float, "auto" or "loo-mle", default "auto"
        Kernel bandwidth h > 0 (kernel diagrams); "auto" minimises the leave-one-out
        Brier risk of the regression for the problem drawn (class-wise: summed over the
        K problems, as ``kdecal.ece_kde(calibration="classwise")``), "loo-mle"
        maximises the leave-one-out likelihood (both searches of
        :func:`kdecal.select_bandwidth`).
    n_grid : int, default 200
        Grid points for the Beta-kernel density beneath a kernel diagram (and
        ``grid_curve``).
    estimator : {"residual", "plugin"}, default "residual"
        Kernel diagrams: the regression drawn (see above and
        :meth:`kdecal.curves.ReliabilityDiagram.from_predictions`).
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
        Engine of the leave-one-out estimates.
    title : str, optional
        Axes title; default: the estimator, bandwidth and its L1 error.
    ax : matplotlib Axes or sequence of Axes, optional
        Axes to draw on (it is split into the diagram and the panel beneath); for
        class-wise diagrams of all K classes a sequence of K Axes. Default: a new figure.
    draw : bool, default True
        False: compute and return the arrays only (matplotlib is not imported;
        :func:`draw` draws them later).

    Returns
    -------
    ReliabilityDiagram
        The arrays (see :class:`ReliabilityDiagram` for shapes and dtypes) and the Axes.

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels`` (the messages of the metrics: NaN/inf, negative
        values, rows not summing to 1, labels out of range, shape mismatch, n < 3 for
        kernel diagrams), unknown ``kind``, ``calibration`` or ``estimator``,
        ``calibration="canonical"`` with ``kind="binned"``, ``class_index`` out of range
        or without ``calibration="classwise"``, ``n_bins < 1`` or ``n_grid < 2``, a bad
        bandwidth or backend, or an ``ax`` sequence of the wrong length.
    TypeError
        Non-numeric input or bandwidth, ``n_bins`` or ``n_grid`` not an integer.
    ImportError
        ``draw=True`` without matplotlib (``pip install 'kdecal[plot]'``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import kdecal.plot
    >>> s = kdecal.datasets.make_seeds_synthetic(500, 3, seed=0)
    >>> rd = kdecal.plot.reliability_diagram(s.probs, s.labels, kind="kernel", bandwidth=0.05)
    >>> rd.x.shape, rd.y.shape
    ((500,), (500,))
    >>> rd.ax.figure.savefig("reliability.png")  # doctest: +SKIP
    """
    drawn = _check_draw(draw)
    rd = _curves.ReliabilityDiagram.from_predictions(
        probs,
        labels,
        kind=kind,
        calibration=calibration,
        class_index=class_index,
        n_bins=n_bins,
        bandwidth=bandwidth,
        n_grid=n_grid,
        estimator=estimator,
        backend=backend,
    )
    return _draw_reliability(rd, ax, title) if drawn else rd


def _draw_reliability(
    rd: _curves.ReliabilityDiagram, ax: Any, title: str | None
) -> _curves.ReliabilityDiagram:
    """Draw a reliability diagram (one, or K class-wise panels); return it with its Axes."""
    plt = _pyplot()
    many = rd.x.ndim == 2
    if not many:
        if ax is None:
            _, ax = plt.subplots(figsize=(5.0, 5.6))
        elif isinstance(ax, (Sequence, np.ndarray)):
            raise ValueError("ax must be a single matplotlib Axes for a single diagram")
        hax = _with_hist_axis(ax)
        _draw_reliability_one(ax, hax, rd, None, title, legend=True)
        return _replace(rd, ax=ax, hist_ax=hax)
    K = rd.x.shape[0]
    if ax is None:
        ncols = min(K, 5)
        nrows = -(-K // ncols)
        fig, axs = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 3.8 * nrows), squeeze=False)
        fig.subplots_adjust(left=0.06, right=0.98, top=0.94, bottom=0.07, hspace=0.45, wspace=0.4)
        for extra in axs.ravel()[K:]:
            extra.set_visible(False)
        axes = list(axs.ravel()[:K])
    else:
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        if len(axes) != K:
            raise ValueError(
                f"ax must be a sequence of K = {K} Axes (one per class), got {len(axes)}"
            )
    haxes = []
    for c, a in enumerate(axes):
        hax = _with_hist_axis(a)
        t = f"class {c}: " + (
            f"ECE = {float(rd.ece[c]):.4f}"
            if rd.kind == "binned"
            else f"{_kernel_ece_name(rd)} = {float(rd.ece[c]):.4f}"
        )
        _draw_reliability_one(
            a, hax, rd, c, t if title is None else f"{title} (class {c})", legend=c == 0
        )
        haxes.append(hax)
    return _replace(rd, ax=np.array(axes, dtype=object), hist_ax=np.array(haxes, dtype=object))


def _replace(obj: Any, **changes: Any) -> Any:
    return dataclasses.replace(obj, **changes)


def calibration_sharpness_diagram(
    probs: object,
    labels: object,
    *,
    divergence: str = "l2",
    bandwidth: float = 0.05,
    n_grid: int = 1000,
    n_subsamples: int = 0,
    n_points: int = 5000,
    seed: int | None = 0,
    title: str | None = None,
    ax: Any = None,
    draw: bool = True,
) -> _curves.CalibrationSharpnessDiagram:
    r"""Calibration-sharpness diagram of Chidambaram & Ge (2024), Sec. 5, Fig. 1.

    A reliability curve augmented by a band whose height shows, at each confidence,
    how much of the expected loss is sharpness gap rather than calibration error
    (Lemma 4.1). With ``h`` the confidence ``max_k g_k``, ``a = 1{argmax_k g_k = y}``,
    ``d_phi`` the full divergence and ``d_varphi`` its one-dimensional counterpart
    (Brier: ``||x - y||^2`` and ``(a - b)^2``; KL: ``sum x log(x/y)`` and the binary KL):

    - ``m_acc(t)``, ``m_loss(t)``: Gaussian Nadaraya-Watson regressions (Eq. 5.2) of
      ``a_i`` and of ``d_phi(e_{y_i}, g(x_i))`` on ``h_i``, and ``p(t)`` the Gaussian KDE
      of the ``h_i`` (the denominator of Eq. 5.2 over n), all at ``t = linspace(0, 1,
      n_grid)``, fitted on all n points, no leave-one-out, no boundary correction;
    - ``rho(t) = m_loss(t) - d_varphi(m_acc(t), t)`` (Eq. 5.1);
    - drawn, in this order: the dashed diagonal; ``m_acc`` in red (``C3``); the band
      ``max(m_acc - p rho / 2, 0) .. m_acc + p rho / 2`` (``C3``, alpha 0.5; only the
      bottom clipped at 0, so it may rise above 1); the density ``p / max p`` (``C0``,
      hatched ``/``, alpha 0.3, labelled :math:`\hat p(h(x))`); a box with
      ``d_varphi,CAL`` (the plug-in ``mean_j d_varphi(m_acc(h_j), h_j)``) and
      ``d_phi,TOT = mean_i d_phi(e_{y_i}, g(x_i))``, both times 100 as in the paper.

    This follows the paper and its reference code (``sharpcal``), with two documented
    choices: the box values are computed at every
    data point by default (the paper subsampled 10 x 5000 points only to fit in GPU
    memory and reports that subsampling "loses virtually nothing"; set
    ``n_subsamples=10`` to reproduce its mean +- std), and the Nadaraya-Watson weights
    are max-shifted per point so the curve never is 0/0 far from the data (the
    reference code fills NaN curves with their mean). The font sizes are matplotlib's
    defaults (the reference code uses 16-18 pt for a single large panel).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities. A 2-D array is reduced to the top-label problem; a
        1-D array of P(y = 1) is used as in the paper's binary case: ``h = p``,
        ``a = y`` and the one-column Brier ``(p - y)^2`` (half of kdecal's two-column
        Brier score; pass the ``(n, 2)`` array for the top-label reduction instead).
        Probabilities are clipped to ``PROB_EPS`` and renormalised, as everywhere in
        kdecal.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    divergence : {"l2", "kl"}, default "l2"
        "l2": the Brier score (squared L2, summed over classes, as elsewhere in kdecal;
        the paper's Fig. 1); "kl": the log loss and the binary KL.
    bandwidth : float, default 0.05
        Standard deviation of the Gaussian kernel (the paper's Fig. 1 and its
        recommended range 0.01-0.05, App. B.1). Not kdecal's Dirichlet bandwidth, and
        there is no "auto": the paper has no data-driven rule.
    n_grid : int, default 1000
        Number of grid points in [0, 1].
    n_subsamples : int, default 0
        0: the box value ``d_varphi,CAL`` is averaged over all n points (no spread).
        > 0: as the reference code, when n > ``n_points`` the mean over
        ``n_subsamples`` sets of ``n_points`` indices drawn with replacement (the
        regression still fitted on all n), with their standard deviation (ddof = 1).
    n_points : int, default 5000
        Subsample size (only with ``n_subsamples > 0``).
    seed : int or None, default 0
        Seed of the subsampling.
    title : str, optional
        Axes title.
    ax : matplotlib Axes, optional
        Axes to draw on; default: a new figure.
    draw : bool, default True
        False: compute the arrays only (matplotlib is not imported; :func:`draw`
        draws them later).

    Returns
    -------
    CalibrationSharpnessDiagram
        Grid, curves, band, density, the box values and the Axes.

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels`` (the messages of the metrics), an unknown
        ``divergence``, ``bandwidth`` not a finite float > 0, ``n_grid < 2``,
        ``n_subsamples < 0`` or ``n_points < 1``.
    TypeError
        Non-numeric input, or a non-numeric bandwidth (including "auto").
    ImportError
        ``draw=True`` without matplotlib (``pip install 'kdecal[plot]'``).

    Notes
    -----
    The cost is O(n (n + n_grid)) Gaussian evaluations (in blocks of 4M), about a second
    for n = 10,000; beyond 2e8 evaluations the sums are computed by linear binning on
    8192 nodes and a convolution (agreeing with the exact sums to about 1e-6 at sigma =
    0.05), which takes well under a second for n = 100,000.
    """
    drawn = _check_draw(draw)
    cs = _curves.CalibrationSharpnessDiagram.from_predictions(
        probs,
        labels,
        divergence=divergence,
        bandwidth=bandwidth,
        n_grid=n_grid,
        n_subsamples=n_subsamples,
        n_points=n_points,
        seed=seed,
    )
    return _draw_sharpness_diagram(cs, ax, title) if drawn else cs


def _draw_sharpness_diagram(
    cs: _curves.CalibrationSharpnessDiagram, ax: Any, title: str | None
) -> _curves.CalibrationSharpnessDiagram:
    """Draw a calibration-sharpness diagram on ``ax`` (a new figure if None)."""
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 5.0))
    _draw_sharpness(ax, cs, title)
    return _replace(cs, ax=ax)


def _draw_sharpness(ax: Any, cs: _curves.CalibrationSharpnessDiagram, title: str | None) -> None:
    t = cs.t
    ax.plot([0, 1], [0, 1], ls="--", color="k", lw=1)
    ax.plot(t, cs.accuracy_curve, color="C3", lw=1.8, label="E[Y = c(X) | h(X)]")
    ax.fill_between(
        t,
        cs.lower,
        cs.upper,
        color="C3",
        alpha=0.5,
        lw=0,
        label=r"sharpness band $\hat p\,\hat\rho$",
    )
    ax.fill_between(t, 0, cs.density, color="C0", alpha=0.3, hatch="/", lw=0)
    ax.text(0.8, 0.02, r"$\hat p(h(x))$", transform=ax.transAxes, fontsize="large", color="C0")
    cal = f"{100 * cs.calibration:.2f}"
    if cs.calibration_std is not None:
        cal += rf" \pm {100 * cs.calibration_std:.2f}"
    text = (
        rf"$d_{{\varphi,\mathrm{{CAL}}}} = {cal}$" + "\n"
        rf"$d_{{\phi,\mathrm{{TOT}}}} = {100 * cs.total:.2f}$" + "\n(x100)"
    )
    ax.text(
        0.05,
        0.95,
        text,
        transform=ax.transAxes,
        va="top",
        fontsize="medium",
        bbox={"boxstyle": "round", "facecolor": "gray", "alpha": 0.2},
    )
    ax.set_xlim(0, 1)
    top = max(1.0, float(np.max(cs.upper)))
    ax.set_ylim(0, top * 1.02)
    ax.set_xlabel("Confidence $h(x)$")
    ax.set_ylabel("Conditional expectation of $Y = c(X)$")
    ax.grid(True, alpha=0.3)
    name = "Brier" if cs.divergence == "l2" else "KL / log loss"
    ax.set_title(
        f"calibration-sharpness ({name}, Gaussian $\\sigma$ = {cs.bandwidth:g})"
        if title is None
        else title,
        fontsize="medium",
    )


# --------------------------------------------------------------------- simplex density
def simplex_density(
    probs: object,
    labels: object = None,
    *,
    bandwidth: float | str = "auto",
    n_bins_per_side: int | None = None,
    resolution: int = 150,
    class_names: Sequence[str] | None = None,
    estimator: str = "residual",
    backend: Backend = "auto",
    max_points: int = 3000,
    ax: Any = None,
    draw: bool = True,
) -> _curves.SimplexDensity:
    """Simplex-binned histogram beside the Dirichlet KDE over the simplex, for K = 3.

    Left: the ``m^2`` equal-area triangular cells of :func:`kdecal.binned.simplex_ece`
    (Popordanoska et al. 2022, Sec. 4, Fig. 1a) coloured by the histogram density, with
    the predictions on top (coloured by their true class when labels are given). Right:
    the Dirichlet kernel density estimate ``1/n sum_i Dir(u; f_i / h + 1)`` over the
    simplex (Fig. 1c and Fig. 7c), on the same logarithmic colour scale, so the two
    density estimates can be compared directly. With labels, the titles give the
    simplex-binned ECE and the canonical ECE^KDE (both L1).

    Parameters
    ----------
    probs : array-like, shape (n, 3), float
        Predicted probabilities of a three-class problem.
    labels : array-like, shape (n,), int, optional
        True classes in 0..2 (colours and the two calibration errors).
    bandwidth : float, "auto" or "loo-mle", default "auto"
        Dirichlet bandwidth h > 0; "auto": with labels the leave-one-out Brier
        bandwidth of the canonical regression, without them the leave-one-out
        likelihood of the density (:func:`kdecal.select_bandwidth`).
    n_bins_per_side : int, optional
        m; default: Doane's rule, as :func:`kdecal.binned.simplex_ece`.
    resolution : int, default 150
        Grid divisions per side for the KDE (``(r + 1)(r + 2) / 2`` points).
    class_names : sequence of 3 str, optional
        Vertex labels; default "class 0", "class 1", "class 2".
    estimator : {"residual", "plugin"}, default "residual"
        With labels: the regression of the canonical ECE^KDE in the title, as
        :func:`kdecal.estimate`'s.
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
    max_points : int, default 3000
        At most this many predictions are scattered (a fixed subsample; all are used for
        the estimates).
    ax : sequence of 2 Axes, optional
        Default: a new figure with two panels.
    draw : bool, default True
        False: compute the arrays only (matplotlib is not imported; :func:`draw`
        draws them later).

    Returns
    -------
    SimplexDensity
        Grid, KDE, cells, counts, densities, (with labels) the per-cell label
        frequencies and the two errors, and the Axes.

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels`` (the messages of the metrics), K != 3, bad
        ``bandwidth``, unknown ``estimator``, ``n_bins_per_side < 1``, ``resolution < 2``, ``max_points < 0``,
        ``class_names`` not of length 3, or ``ax`` not two Axes.
    TypeError
        Non-numeric input or bandwidth, or an integer option that is not an integer.
    ImportError
        ``draw=True`` without matplotlib (``pip install 'kdecal[plot]'``).

    Notes
    -----
    The KDE costs ``O(n r^2 / 2)`` kernel evaluations, done as one matrix product per
    block: well under a second for n = 10,000 and r = 150. A very small bandwidth (as
    the leave-one-out likelihood often selects when predictions crowd the vertices)
    gives a spiky surface that a finite grid can only sample.
    """
    drawn = _check_draw(draw)
    sd = _curves.SimplexDensity.from_predictions(
        probs,
        labels,
        bandwidth=bandwidth,
        n_bins_per_side=n_bins_per_side,
        resolution=resolution,
        estimator=estimator,
        backend=backend,
    )
    return _draw_simplex(sd, ax, class_names, max_points) if drawn else sd


def _draw_simplex(
    sd: _curves.SimplexDensity, ax: Any, class_names: Sequence[str] | None, max_points: object
) -> _curves.SimplexDensity:
    """Draw the simplex cells with the points beside the Dirichlet KDE (2 Axes)."""
    n_max = check_int(max_points, "max_points", 0)
    names = ["class 0", "class 1", "class 2"] if class_names is None else list(class_names)
    if len(names) != 3:
        raise ValueError(f"class_names must have 3 entries, got {len(names)}")
    plt = _pyplot()
    import matplotlib
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import LogNorm
    from matplotlib.tri import Triangulation

    cax = None
    if ax is None:
        fig, axs = plt.subplots(1, 2, figsize=(11.0, 5.0))
        fig.subplots_adjust(left=0.01, right=0.88, wspace=0.06, top=0.88, bottom=0.02)
        cax = fig.add_axes((0.9, 0.12, 0.016, 0.68))
    else:
        axs = np.ravel(np.asarray(ax, dtype=object))
        if axs.shape[0] != 2:
            raise ValueError(f"ax must be a sequence of 2 Axes, got {axs.shape[0]}")
        fig = axs[0].figure
    positive = np.concatenate([sd.kde[sd.kde > 0], sd.cell_density[sd.cell_density > 0]])
    vmax = float(positive.max())
    # down to a tenth of the density of one sample in one cell (2 m^2 / n)
    one = 2.0 * sd.n_bins_per_side**2 / max(int(sd.cell_counts.sum()), 1)
    vmin = min(0.1 * one, vmax * 1e-3)
    norm = LogNorm(vmin=vmin, vmax=vmax)
    # empty cells white; densities below the colour range light grey
    cmap = matplotlib.colormaps["viridis"].with_extremes(under="0.9", bad="white")
    # left: cells
    a0 = axs[0]
    polys = sd.cell_vertices @ _curves._TRI
    shown = np.where(sd.cell_counts > 0, sd.cell_density, np.nan)
    pc = PolyCollection(
        list(polys),
        array=np.ma.masked_invalid(shown),
        cmap=cmap,
        norm=norm,
        edgecolors="0.75",
        linewidths=0.4,
    )
    a0.add_collection(pc)
    if sd.points is not None:
        n = sd.points.shape[0]
        rng = np.random.default_rng(0)
        idx = rng.permutation(n)[:n_max] if n > n_max else slice(None)
        pts = sd.points[idx] @ _curves._TRI
        if sd.labels is None:
            a0.scatter(pts[:, 0], pts[:, 1], s=2, c="k", alpha=0.4, lw=0)
        else:
            yl = sd.labels[idx]
            for c, col in enumerate(("C3", "C1", "C6")):
                sel = yl == c
                a0.scatter(
                    pts[sel, 0],
                    pts[sel, 1],
                    s=3,
                    color=col,
                    alpha=0.6,
                    lw=0,
                    label=f"y = {names[c]}",
                )
            a0.legend(loc="upper right", fontsize="small", markerscale=4, framealpha=0.8)
    t0 = f"simplex binning, m = {sd.n_bins_per_side} ({sd.n_bins_per_side**2} cells)"
    if sd.simplex_ece is not None:
        t0 += f"\nsimplex-binned ECE (L1) = {sd.simplex_ece:.4f}"
    a0.set_title(t0, fontsize="medium")
    # right: Dirichlet KDE
    a1 = axs[1]
    tri = Triangulation(sd.xy[:, 0], sd.xy[:, 1])
    z = np.maximum(sd.kde, vmin * 0.5)  # zeros (the boundary) drawn as 'under'
    tp = a1.tripcolor(tri, z, shading="gouraud", cmap=cmap, norm=norm)
    t1 = f"Dirichlet KDE, h = {sd.bandwidth:.3g}"
    if sd.ece_kde is not None:
        plug = "plug-in " if sd.estimator == "plugin" else ""
        t1 += f"\n{plug}ECE$^{{KDE}}$ (L1, canonical) = {sd.ece_kde:.4f}"
    a1.set_title(t1, fontsize="medium")
    for a in (a0, a1):
        a.plot(*np.vstack([_curves._TRI, _curves._TRI[:1]]).T, color="k", lw=1)
        a.set_aspect("equal")
        a.set_xlim(-0.12, 1.12)
        a.set_ylim(-0.1, math.sqrt(3.0) / 2 + 0.07)
        a.axis("off")
        for (vx, vy), name, dy in zip(_curves._TRI, names, (-0.05, -0.05, 0.035)):
            a.text(vx, vy + dy, name, ha="center", va="center", fontsize="small")
    label = "density on the simplex (log scale)"
    if cax is not None:
        fig.colorbar(tp, cax=cax, label=label, extend="min")
    else:
        fig.colorbar(tp, ax=list(axs), shrink=0.8, pad=0.02, label=label, extend="min")
    return _replace(sd, ax=np.array(list(axs), dtype=object))


# --------------------------------------------------------------------- Bayes risk curve
def bayes_risk_curve(
    probs: object,
    labels: object,
    *,
    names: Sequence[str] | None = None,
    weight: str = "uniform",
    normalize: bool = False,
    n_grid: int = 2001,
    thresholds: object = None,
    ylim: float | None = None,
    title: str | None = None,
    ax: Any = None,
    draw: bool = True,
) -> _curves.BayesRiskCurve:
    r"""Bayes risk of binary posteriors against the decision threshold (Ferrer & Ramos Fig. 4).

    For a threshold t, every sample is decided class 1 iff ``P(y = 1) > t``, with the
    cost matrix of Ferrer & Ramos (2025) Eq. 34 written for this threshold: deciding 1
    for a class-0 sample costs ``1 / (1 - t)``, deciding 0 for a class-1 sample costs
    ``1 / t`` (these make the threshold t the Bayes decision). The empirical risk

    .. math:: \mathrm{Risk}(t) = \frac1N\Big[\frac{\#\{y = 0, p > t\}}{1 - t}
              + \frac{\#\{y = 1, p \le t\}}{t}\Big]

    integrates over t in [0, 1] to the cross-entropy ``-mean log q_y`` (Eq. 10-12 with a
    uniform weight: a class-1 sample contributes ``int_p^1 dt / t = -log p``), so the
    area under each curve is that system's cross-entropy. With ``weight="beta22"``
    the curve is ``6 t (1 - t) Risk(t)`` and the area is the Brier score up to a
    constant (3 x the 1/K-convention Brier of Eq. 9 = 1.5 x kdecal's Brier score summed
    over classes), the right panel of Fig. 4. ``Risk(1/2)`` is twice the error rate.

    The paper's abscissa is the threshold ``a_1`` on the posterior of the first class;
    here it is the threshold ``t = 1 - a_1`` on ``P(y = 1)`` (kdecal's binary
    convention), i.e. the paper's curves mirrored.

    Parameters
    ----------
    probs : array-like, sequence of array-likes, or mapping name -> array-like
        One system or several: each of shape (n,) (P(y = 1)) or (n, 2).
    labels : array-like, sequence of array-likes, or mapping name -> array-like
        Labels in {0, 1}: one array shared by every system, or one per system (systems
        on different data), in the order (or with the keys) of ``probs``.
    names : sequence of str, optional
        Legend names; default the mapping's keys or "system i".
    weight : {"uniform", "beta22"}, default "uniform"
        "uniform": area = cross-entropy; "beta22": ``W(t) = t (1 - t) / B(2, 2)``.
    normalize : bool, default False
        Divide each curve by the area of the naive system that always outputs the class
        frequencies (its entropy, resp. 3 ``pi_0 pi_1``), so the area is the normalised
        cross-entropy NCE (resp. NBS) of Eq. 8-9.
    n_grid : int, default 2001
        Number of equally spaced thresholds in [0, 1].
    thresholds : array-like, shape (G,), optional
        Strictly increasing thresholds in [0, 1] instead of the equal spacing (e.g.
        denser towards the ends).
    ylim : float, optional
        Upper y limit; default: fit the curves on t in [0.02, 0.98] (they can rise
        steeply at the ends for over-confident systems).
    title : str, optional
    ax : matplotlib Axes, optional
    draw : bool, default True
        False: compute the arrays only (matplotlib is not imported; :func:`draw`
        draws them later).

    Returns
    -------
    BayesRiskCurve
        Thresholds, curves, CE/NCE, Brier/NBS, error rates and the Axes.

    Raises
    ------
    ValueError
        Invalid probabilities or labels (the messages of the metrics), K != 2,
        unknown ``weight``, ``n_grid < 3``, bad ``thresholds``, mismatched numbers of
        systems, labels and names, or ``normalize=True`` with a single class present.
    TypeError
        Non-numeric input or thresholds, ``n_grid`` not an integer, or ``normalize``
        not a bool.
    ImportError
        ``draw=True`` without matplotlib (``pip install 'kdecal[plot]'``).
    """
    drawn = _check_draw(draw)
    br = _curves.BayesRiskCurve.from_predictions(
        probs,
        labels,
        names=names,
        weight=weight,
        normalize=normalize,
        n_grid=n_grid,
        thresholds=thresholds,
    )
    return _draw_bayes(br, ax, ylim, title) if drawn else br


def _draw_bayes(
    br: _curves.BayesRiskCurve, ax: Any, ylim: float | None, title: str | None
) -> _curves.BayesRiskCurve:
    """Draw the Bayes risk curves of every system on ``ax`` (a new figure if None)."""
    plt = _pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 4.5))
    styles = ["-", "--", ":", "-."]
    for i, name in enumerate(br.names):
        if br.weight == "uniform":
            key = "NCE" if br.normalize else "CE"
            val = br.normalized_cross_entropy[i] if br.normalize else br.cross_entropy[i]
            lab = f"{name}: {key} = {val:.3f}"
            if not br.normalize:
                lab += f", NCE = {br.normalized_cross_entropy[i]:.2f}"
        else:
            lab = f"{name}: NBS = {br.normalized_brier[i]:.2f}"
        ax.plot(
            br.threshold,
            br.risk[i],
            ls=styles[(i // 10) % 4],
            lw=1.6,
            color=f"C{i % 10}",
            label=lab,
        )
    if ylim is None:
        inner = (br.threshold >= 0.02) & (br.threshold <= 0.98)
        ylim = 1.08 * float(np.max(br.risk[:, inner])) if np.any(inner) else None
    ax.set_xlim(0, 1)
    ax.set_ylim(0, ylim)
    ax.set_xlabel("threshold t on P(y = 1)  (decide 1 if P(y = 1) > t)")
    what = "Risk(t)" if br.weight == "uniform" else r"$6t(1-t)\,$Risk(t)"
    ax.set_ylabel(("normalised " if br.normalize else "") + what)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small", framealpha=0.85)
    if title is None:
        title = (
            "Bayes risk, area = cross-entropy"
            if br.weight == "uniform"
            else "Brier-weighted Bayes risk, area = 1.5 x Brier"
        )
        if br.normalize:
            title = title.replace("cross-entropy", "NCE").replace("1.5 x Brier", "NBS")
    ax.set_title(title, fontsize="medium")
    return _replace(br, ax=ax)


# ------------------------------------------------------------------- computed diagrams
#: A diagram of kdecal.curves; draw() returns the class it is given.
_Diagram = TypeVar(
    "_Diagram",
    _curves.ReliabilityDiagram,
    _curves.CalibrationSharpnessDiagram,
    _curves.SimplexDensity,
    _curves.BayesRiskCurve,
)


def _style(style: dict[str, Any], kind: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """Merge the style options of :func:`draw` into ``defaults``; refuse unknown ones."""
    unknown = sorted(set(style) - set(defaults))
    if unknown:
        raise TypeError(
            f"draw() got style option(s) {', '.join(map(repr, unknown))} that a {kind} "
            f"does not take; its options: {', '.join(defaults)}"
        )
    return {**defaults, **style}


def draw(data: _Diagram, ax: Any = None, **style: Any) -> _Diagram:
    """Draw a diagram computed already by :mod:`kdecal.curves`.

    The picture of the drawing function of the same diagram (:func:`reliability_diagram`,
    :func:`calibration_sharpness_diagram`, :func:`simplex_density`,
    :func:`bayes_risk_curve`), from arrays made by the class methods of
    :mod:`kdecal.curves`: ``from_predictions``, or ``from_estimate``, which reuses the
    kernel sums of a :class:`kdecal.CalibrationEstimate` (e.g. one of
    ``report.estimates``) so that drawing costs no kernel pass. Nothing is recomputed.

    Parameters
    ----------
    data : ReliabilityDiagram, CalibrationSharpnessDiagram, SimplexDensity or BayesRiskCurve
        The arrays (:mod:`kdecal.curves`); not modified.
    ax : matplotlib Axes or sequence of Axes, optional
        Axes to draw on; default: a new figure. A reliability diagram splits its Axes
        into the diagram and the distribution beneath, and takes a sequence of K Axes
        for class-wise diagrams of all K classes; a simplex density takes 2 Axes.
    **style
        Options of the picture, by diagram: ``title`` (str) for a reliability or
        calibration-sharpness diagram; ``class_names`` (3 str) and ``max_points`` (int,
        default 3000, predictions scattered) for a simplex density; ``ylim`` (float) and
        ``title`` for Bayes risk curves; as in the drawing functions.

    Returns
    -------
    ReliabilityDiagram, CalibrationSharpnessDiagram, SimplexDensity or BayesRiskCurve
        A copy of ``data`` (same arrays) with its ``ax`` (and ``hist_ax``) fields set to
        the Axes drawn on.

    Raises
    ------
    TypeError
        ``data`` is not one of the four classes, or a style option that its class does
        not take (or ``max_points`` not an integer).
    ValueError
        ``ax`` of the wrong kind or length (see the drawing functions), ``class_names``
        not of length 3, ``max_points < 0``.
    ImportError
        matplotlib is missing (``pip install 'kdecal[plot]'``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import kdecal, kdecal.plot
    >>> from kdecal.curves import ReliabilityDiagram
    >>> s = kdecal.datasets.make_seeds_synthetic(500, 3, seed=0)
    >>> est = kdecal.estimate(s.probs, s.labels, bandwidth=0.05)
    >>> rd = kdecal.plot.draw(ReliabilityDiagram.from_estimate(est), title="canonical")
    >>> rd.ax.get_title()
    'canonical'
    """
    if isinstance(data, _curves.ReliabilityDiagram):
        o = _style(style, "ReliabilityDiagram", {"title": None})
        return _draw_reliability(data, ax, o["title"])
    if isinstance(data, _curves.CalibrationSharpnessDiagram):
        o = _style(style, "CalibrationSharpnessDiagram", {"title": None})
        return _draw_sharpness_diagram(data, ax, o["title"])
    if isinstance(data, _curves.SimplexDensity):
        o = _style(style, "SimplexDensity", {"class_names": None, "max_points": 3000})
        return _draw_simplex(data, ax, o["class_names"], o["max_points"])
    if isinstance(data, _curves.BayesRiskCurve):
        o = _style(style, "BayesRiskCurve", {"ylim": None, "title": None})
        return _draw_bayes(data, ax, o["ylim"], o["title"])
    raise TypeError(
        "data must be a ReliabilityDiagram, CalibrationSharpnessDiagram, SimplexDensity or "
        f"BayesRiskCurve of kdecal.curves, got {type(data).__name__}"
    )


# ----------------------------------------------------------------------- evaluation page
def _canonical_panel_title(rd: _curves.ReliabilityDiagram, report: Any) -> str:
    """Return the canonical panel's title: the curve's ECE^KDE, and the table's if it differs.

    The panel draws the report's own regression at the table's bandwidth, so the two
    figures agree; a plug-in curve beside a residual-centred table (or another
    bandwidth) differs from it (0.134 against 0.059 on a CIFAR-10 ResNet at h = 1.78:
    the plug-in's smoothing bias), and the title then names both rather than one
    unlabelled ECE^KDE beside a different one in the table.
    """
    head = (
        f"canonical Dirichlet KDE, h = {rd.bandwidth:.3g}\n"
        f"{_kernel_ece_name(rd)} (L1) = {float(rd.ece):.4f}"
    )
    notions = getattr(report, "notions", {}) or {}
    row = notions.get("canonical")
    table = None
    if row is not None and float(row["bandwidth"]) == rd.bandwidth:
        table = row.get("ece_kde_l1")
    elif report.calibration == "canonical" and report.bandwidth == rd.bandwidth:
        table = report.ece_kde_l1
    estimator = getattr(report, "estimator", "plugin")
    if table is None or f"{float(table):.4f}" == f"{float(rd.ece):.4f}":
        return head
    return f"{head}; table ({estimator}): {float(table):.4f}"


def evaluation_page(
    probs: object,
    labels: object,
    *,
    report: Any = None,
    bandwidth: float | str = "auto",
    backend: Backend = "auto",
    title: str | None = None,
) -> Any:
    """One-page summary: reliability diagrams, calibration-sharpness diagram, metrics.

    The page written by ``kdecal evaluate FILE --plot out.png`` (1800 x 1200 pixels at
    100 dpi): top row, the top-label reliability diagram with 15 bins, the top-label
    leave-one-out Beta-kernel curve (bandwidth 0.02, the value of Popordanoska et al.
    2024, Table 5), and the canonical Dirichlet-KDE view at the report's bandwidth (see
    :func:`reliability_diagram`; beyond K = 10 classes, where the report leaves the
    canonical notion out, the top-label kernel diagram at the report's top-label
    bandwidth instead); bottom row, the Brier calibration-sharpness diagram
    (Chidambaram & Ge 2024, Gaussian sigma = 0.05) and the table of
    :class:`kdecal.CalibrationReport`.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities.
    labels : array-like, shape (n,), int
        True classes.
    report : CalibrationReport, optional
        The report of these predictions (computed with :func:`kdecal.evaluate` when
        None). Its bandwidth is reused for the canonical view when it is canonical.
    bandwidth : float or "auto", default "auto"
        Bandwidth of :func:`kdecal.evaluate` when ``report`` is None.
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
    title : str, optional
        Page title; default: the report's source, n and K.

    Returns
    -------
    matplotlib.figure.Figure
        A figure not registered with pyplot; save it with ``fig.savefig(path)``.

    Raises
    ------
    ValueError, TypeError
        Invalid input (the messages of the metrics); a ``report`` of another n or K than
        ``probs``.
    ImportError
        matplotlib is missing (``pip install 'kdecal[plot]'``).
    """
    Figure = _figure_class()
    if report is None:
        report = evaluate(probs, labels, bandwidth=bandwidth, backend=backend, progress=False)
    else:
        # a report of other predictions drew its table and canonical view beside panels
        # of these (a helper's probe: a 300-row report on a 500-row page, no error)
        shape = np.shape(as_array(probs, "probs"))
        k = 2 if len(shape) == 1 else shape[-1]
        if (report.n, report.n_classes) != (shape[0], k):
            raise ValueError(
                f"report is of n = {report.n}, K = {report.n_classes} predictions, but "
                f"probs has n = {shape[0]}, K = {k}: pass the report of these predictions "
                "(or report=None to compute it)"
            )
    # the canonical panel at the table's canonical bandwidth (issue 26: they disagreed)
    notions = getattr(report, "notions", {}) or {}
    if "canonical" in notions:
        canon_h: float | str = float(notions["canonical"]["bandwidth"])
    else:
        canon_h = report.bandwidth if report.calibration == "canonical" else "auto"
    table_top_h = notions.get("top_label", {}).get("bandwidth")
    Rel = _curves.ReliabilityDiagram
    rb = Rel.from_predictions(probs, labels, n_bins=15)
    # the kernel panels draw the report's regression (residual-centred by default)
    estimator = getattr(report, "estimator", "residual")
    rk = Rel.from_predictions(
        probs,
        labels,
        kind="kernel",
        n_bins=15,
        bandwidth=_PAGE_TOP_LABEL_H,
        estimator=estimator,
        backend=backend,
    )
    # the report's canonical estimate holds the sums of this bandwidth: no new pass
    ests = getattr(report, "estimates", {}) or {}
    canon = ests.get("canonical")
    # beyond K = 10 a report without canonical figures (evaluate's "auto"): no canonical
    # view either (unreliable there, and an O(n^2 K) search); the top-label diagram at
    # the table's bandwidth instead, from the report's sums
    top_only = (
        canon is None
        and report.calibration != "canonical"
        and report.n_classes > CANONICAL_RELIABLE_MAX_K
        and "top_label" in ests
    )
    if top_only:
        rc = Rel.from_estimate(ests["top_label"], n_bins=15)
    elif canon is not None and canon.bandwidth == canon_h:
        rc = Rel.from_estimate(canon, n_bins=15)
    else:
        rc = Rel.from_predictions(
            probs,
            labels,
            kind="kernel",
            calibration="canonical",
            n_bins=15,
            bandwidth=canon_h,
            estimator=estimator,
            backend=backend,
        )
    cs = _curves.CalibrationSharpnessDiagram.from_predictions(probs, labels, divergence="l2")

    fig = Figure(figsize=(18, 12), dpi=100)
    gs = fig.add_gridspec(
        2, 3, left=0.05, right=0.98, top=0.91, bottom=0.05, hspace=0.3, wspace=0.25
    )
    axes = [fig.add_subplot(gs[0, i]) for i in range(3)]
    for a, rd, t in zip(
        axes,
        (rb, rk, rc),
        (
            f"top-label, 15 bins: ECE = {float(rb.ece):.4f}",
            (
                f"top-label, LOO Beta kernel (h = {rk.bandwidth:.3g})\n"
                f"{_kernel_ece_name(rk)} (L1, top-label) = {float(rk.ece):.4f}"
                + (
                    ""
                    if table_top_h is None or float(table_top_h) == rk.bandwidth
                    else f" at this h (table: h = {float(table_top_h):.3g})"
                )
            ),
            (
                f"top-label, LOO Beta kernel at the table's h = {rc.bandwidth:.3g}\n"
                f"no canonical view at K = {report.n_classes} (see the note)"
                if top_only
                else _canonical_panel_title(rc, report)
            ),
        ),
    ):
        _draw_reliability_one(a, _with_hist_axis(a), rd, None, t, legend=True)
    a_cs = fig.add_subplot(gs[1, 0])
    _draw_sharpness(a_cs, cs, None)
    a_tab = fig.add_subplot(gs[1, 1:])
    a_tab.axis("off")
    lines = []
    for line in str(report).splitlines():  # long reference lines: wrapped, indented
        width = 130 if len(line) <= 130 else 112  # table rows whole, references wrapped
        lines.extend(textwrap.wrap(line, width, subsequent_indent="      ") or [""])
    # a font size at which every line fits the panel (it was clipped at the bottom):
    # monospace glyphs are about 0.6 em wide, lines 1.2 em apart
    box = a_tab.get_position()
    w_pt, h_pt = box.width * 18 * 72, box.height * 12 * 72
    size = min(9.5, h_pt / (1.2 * len(lines)), w_pt / (0.6 * max(map(len, lines))))
    a_tab.text(
        0.0,
        1.0,
        "\n".join(lines),
        family="monospace",
        fontsize=size,
        va="top",
        ha="left",
        transform=a_tab.transAxes,
    )
    if title is None:
        src = report.source if report.source is not None else "in-memory predictions"
        title = f"kdecal: {src}  (n = {report.n}, K = {report.n_classes})"
    fig.suptitle(title, fontsize="x-large")
    return fig
