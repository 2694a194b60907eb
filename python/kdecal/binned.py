"""Binned (histogram) estimators of calibration error.

These are the classical reference estimators that ECE^KDE is compared with:

* :func:`ece` -- the binned expected calibration error ECE^bin of Guo et al. (2017),
  top-label or class-wise (Kull et al. 2019), with equal-width or equal-mass bins, a
  fixed number of bins or the monotone sweep of Roelofs et al. (2022), an L_p norm
  (``p = np.inf``: the maximum calibration error, MCE, of Naeini et al. 2015) and the
  debiased squared error of Kumar, Liang & Ma (2019);
* :func:`binned_statistics` -- the per-bin statistics behind it (reliability diagram);
* :func:`simplex_ece` -- the canonical binned estimator of Popordanoska et al. (2022),
  Sec. 4 / Fig. 1: the simplex is cut into equal-volume simplices and E[y | f(x)] is
  replaced by the histogram estimate of the cell of f(x).  For K = 3 the cells are the
  triangles of the standard triangular grid (Popordanoska et al. 2022, Fig. 1); for
  general K the Freudenthal (Kuhn) triangulation, the K-class extension of their Fig. 2a.

All results are fractions (a calibration error of 0.0398 is 3.98 %), not percent.

Unlike the kernel estimators, these functions use the probabilities exactly as given
(validated, converted to float64, *not* clipped to ``PROB_EPS`` nor renormalised), so
that a confidence of exactly 0.0 or 1.0 stays 0.0 or 1.0 and lands in the first or last
bin.

References
----------
- C. Guo, G. Pleiss, Y. Sun, K. Q. Weinberger. "On Calibration of Modern
  Neural Networks". ICML 2017 (the binned ECE, Sec. 2).
- M. P. Naeini, G. F. Cooper, M. Hauskrecht. "Obtaining Well Calibrated
  Probabilities Using Bayesian Binning". AAAI 2015.
- M. Kull, M. Perello-Nieto, M. Kaengsepp, T. Silva Filho, H. Song,
  P. Flach. "Beyond temperature scaling: Obtaining well-calibrated multi-class
  probabilities with Dirichlet calibration". NeurIPS 2019 (class-wise ECE).
- T. Popordanoska, R. Sayer, M. B. Blaschko. "A Consistent and Differentiable
  L_p Canonical Calibration Error Estimator". NeurIPS 2022 (Eq. 1, Sec. 4, Fig. 1,
  Fig. 2a, App. F).
- D. P. Doane. "Aesthetic frequency classifications". The American
  Statistician 30(4):181-183, 1976.
- A. Kumar, P. Liang, T. Ma. "Verified Uncertainty Calibration". NeurIPS 2019
  (the debiased estimator of the squared L2 calibration error).
- R. Roelofs, N. Cain, J. Shlens, M. C. Mozer. "Mitigating Bias in Calibration Error
  Estimation". AISTATS 2022 (the monotonic sweep estimator ECE_sweep).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal, Union

import numpy as np

from ._estimation.quantities import power_scale
from ._numerics import ValueEq
from ._validation import (
    MAX_BINS_FLOOR,
    as_array,
    check_choice,
    check_class_index,
    check_labels,
    check_n_bins,
    check_p,
    check_probs,
)
from .tolerances import ROW_SUM_ATOL

__all__ = ["BinStats", "bin_index", "binned_statistics", "ece", "simplex_ece"]

_BINNINGS = ("uniform", "quantile")
_CALIBRATIONS = ("top_label", "classwise")

#: The binning options (equal-width, equal-mass).
Binning = Literal["uniform", "quantile"]
#: The 1-D notions of calibration the binned ECE measures.
Calibration = Literal["top_label", "classwise"]
#: A number of bins, or ``"sweep"`` (Roelofs et al. 2022).
NBins = Union[int, Literal["sweep"]]


def _check_p_inf(p: object) -> float:
    """:func:`check_p`, but ``p = inf`` (the maximum error) is accepted."""
    if (
        isinstance(p, numbers.Real)
        and not isinstance(p, (bool, np.bool_))
        and math.isinf(float(p))
        and float(p) > 0
    ):
        return math.inf
    try:
        return check_p(p)
    except ValueError:
        raise ValueError(f"p must be a real number >= 1 or np.inf, got {p!r}") from None


# ------------------------------------------------------------------------------ checks


def _raw_probs(probs: object) -> np.ndarray:
    """Validate like :func:`check_probs` but return the values without the kernel's floor.

    Returns a C-contiguous float64 array of shape (n, K); a 1-D input of P(y = 1) becomes
    the two columns ``(1 - p, p)``. Entries are not raised to ``PROB_EPS``; entries
    outside [0, 1] by at most ``PROBS_RANGE_ATOL`` (accepted with a warning) are clipped
    to [0, 1], as the warning says, and rows further than ``ROW_SUM_ATOL`` from summing
    to 1 (accepted with a warning) are renormalised.
    """
    check_probs(probs, min_n=1)  # raises on every invalid input, warns on clipping
    a = np.clip(as_array(probs, "probs").astype(np.float64), 0.0, 1.0)
    if a.ndim == 1:
        a = np.stack([1.0 - a, a], axis=1)
    sums = a.sum(axis=1, keepdims=True)
    if np.any(np.abs(sums - 1.0) > ROW_SUM_ATOL):
        a = a / sums
    return np.ascontiguousarray(a)


def _validated(probs: object, labels: object) -> tuple[np.ndarray, np.ndarray]:
    P = _raw_probs(probs)
    y = check_labels(labels, P.shape[0], P.shape[1])
    return P, y


# ------------------------------------------------------------------------- 1-D binning
def bin_index(x: object, edges: object) -> np.ndarray:
    """Bin of each value under kdecal's rule: right-closed bins, the first one closed.

    Bin ``b`` is ``(edges[b], edges[b + 1]]``, except the first, ``[edges[0], edges[1]]``;
    values below ``edges[0]`` go to the first bin and values above ``edges[-1]`` to the
    last. Every binned estimator of kdecal (:func:`binned_statistics`, :func:`ece`, the
    binned ECE of :func:`kdecal.evaluate`, the histograms of :mod:`kdecal.curves`) uses
    this rule, so a confidence of 0.0 is in the first bin and 1.0 in the last.

    Parameters
    ----------
    x : array-like, shape (n,), float
        Values to bin.
    edges : array-like, shape (B + 1,), float
        Increasing bin edges, ``B >= 1``.

    Returns
    -------
    ndarray, shape (n,), int64
        Bin index in ``0..B-1`` of each value.

    Raises
    ------
    ValueError
        ``edges`` not 1-D with at least two entries, not finite or decreasing; a NaN
        in ``x`` (it has no bin).
    """
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or e.shape[0] < 2:
        raise ValueError(f"edges must be 1-D with at least 2 entries, got shape {e.shape}")
    if not np.all(np.isfinite(e)) or np.any(np.diff(e) < 0.0):
        raise ValueError(f"edges must be finite and increasing, got {e.tolist()}")
    v = np.asarray(x)
    if v.dtype.kind in "fc" and np.isnan(v).any():
        at = tuple(int(i) for i in np.argwhere(np.isnan(v))[0])
        raise ValueError(f"x contains NaN at index {at}: it has no bin")
    # number of edges strictly below x, minus one: the right-closed bin (a, b]
    idx = np.searchsorted(e, v, side="left") - 1
    return np.clip(idx, 0, e.shape[0] - 2).astype(np.int64, copy=False)


def _uniform_bins(conf: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Equal-width bins ``[0, 1/B], (1/B, 2/B], ..., ((B-1)/B, 1]``."""
    edges = np.arange(n_bins + 1, dtype=np.float64) / n_bins
    return edges, bin_index(conf, edges)


def _quantile_bins(conf: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Equal-mass bins whose edges are order statistics; tied edges are merged."""
    n = conf.shape[0]
    xs = np.sort(conf)
    j = np.arange(1, n_bins + 1, dtype=np.int64)
    ranks = -((-j * n) // n_bins)  # ceil(j n / B), 1-based, in 1..n
    if ranks[0] == 1:
        # B >= n: the first quantile is x_(1) itself, the bin [x_(1), x_(1)] of the
        # smallest confidence (merged with the left end, the two smallest shared a bin)
        edges = np.concatenate([xs[:1], np.unique(xs[ranks - 1])])
    else:
        edges = np.unique(np.concatenate([xs[:1], xs[ranks - 1]]))
    if edges.shape[0] == 1:  # every confidence is the same value c: one bin [c, c]
        edges = np.array([edges[0], edges[0]])
    return edges, bin_index(conf, edges)


def _bin_one(
    conf: np.ndarray, outcome: np.ndarray, n_bins: int, binning: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Edges, counts, mean confidence, frequency of one binary problem."""
    if binning == "uniform":
        edges, idx = _uniform_bins(conf, n_bins)
    else:
        edges, idx = _quantile_bins(conf, n_bins)
    nb = edges.shape[0] - 1
    counts = np.bincount(idx, minlength=nb).astype(np.int64)
    sum_conf = np.bincount(idx, weights=conf, minlength=nb)
    sum_out = np.bincount(idx, weights=outcome, minlength=nb)
    nonempty = counts > 0
    mean_conf = np.full(nb, np.nan)
    freq = np.full(nb, np.nan)
    np.divide(sum_conf, counts, out=mean_conf, where=nonempty)
    np.divide(sum_out, counts, out=freq, where=nonempty)
    return edges, counts, mean_conf, freq


def _problems(
    P: np.ndarray, y: np.ndarray, calibration: str, class_index: int | None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """List the binary problems ``(confidence, outcome)`` that the binned ECE averages."""
    if calibration == "top_label":
        pred = np.argmax(P, axis=1)  # ties: the lowest class index
        conf = P[np.arange(P.shape[0]), pred]
        return [(conf, (pred == y).astype(np.float64))]
    classes = range(P.shape[1]) if class_index is None else [class_index]
    return [(np.ascontiguousarray(P[:, c]), (y == c).astype(np.float64)) for c in classes]


# --------------------------------------------------------------------------- BinStats
def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class BinStats(ValueEq):
    """Per-bin statistics of a binned calibration estimate (a reliability diagram).

    For one binary problem (top-label, or class-wise with a ``class_index``) every array
    is 1-D with ``B`` bins; for class-wise statistics of all ``K`` classes the arrays are
    stacked into ``(K, ...)``, row ``c`` being class ``c``.  ``B = n_bins`` for uniform
    bins; for quantile bins ``B <= n_bins`` (bins whose edges coincide because of ties are
    merged), and in the stacked form each row is padded at its end to ``n_bins`` bins
    with ``count = 0`` and NaN edges/means.  All arrays are read-only.

    Attributes
    ----------
    edges : ndarray, float64, shape (B + 1,) or (K, n_bins + 1)
        Bin edges, increasing.  Bin ``b`` is ``(edges[b], edges[b + 1]]``, except the first
        bin, which also holds ``edges[0]`` (so a confidence of 0.0 is in the first bin and
        of 1.0 in the last one for uniform bins).
    counts : ndarray, int64, shape (B,) or (K, n_bins)
        Number of samples in each bin; sums to n (per row).
    mean_confidence : ndarray, float64, shape (B,) or (K, n_bins)
        Mean confidence of the bin's samples; NaN for an empty bin.
    frequency : ndarray, float64, shape (B,) or (K, n_bins)
        Fraction of the bin's samples that are positive (top-label: correctly classified;
        class-wise: of class c); NaN for an empty bin.
    gap : ndarray, float64, shape (B,) or (K, n_bins)
        ``mean_confidence - frequency`` (> 0 where over-confident); NaN for an empty bin.
    """

    edges: np.ndarray
    counts: np.ndarray
    mean_confidence: np.ndarray
    frequency: np.ndarray
    gap: np.ndarray

    @property
    def n_samples(self) -> int:
        """Number of samples n (the same for every row of stacked statistics)."""
        c = self.counts if self.counts.ndim == 1 else self.counts[0]
        return int(c.sum())

    @property
    def weights(self) -> np.ndarray:
        """``counts / n``: the fraction of samples in each bin."""
        return self.counts / self.n_samples


def _ce_pp(stats: BinStats, p: float, scale: float = 1.0) -> np.ndarray:
    """``sum_b (n_b / n) |gap_b / scale|^p`` over non-empty bins: a float, or (K,)."""
    return np.sum(stats.weights * (_abs_gaps(stats) / scale) ** p, axis=-1)


def _abs_gaps(stats: BinStats) -> np.ndarray:
    return np.abs(np.where(stats.counts > 0, stats.gap, 0.0))


def _statistics(
    P: np.ndarray,
    y: np.ndarray,
    n_bins: int,
    binning: str,
    calibration: str,
    class_index: int | None,
) -> BinStats:
    per = [_bin_one(c, o, n_bins, binning) for c, o in _problems(P, y, calibration, class_index)]
    if calibration == "top_label" or class_index is not None:
        edges, counts, mconf, freq = per[0]
    else:
        K = len(per)
        edges = np.full((K, n_bins + 1), np.nan)
        counts = np.zeros((K, n_bins), dtype=np.int64)
        mconf = np.full((K, n_bins), np.nan)
        freq = np.full((K, n_bins), np.nan)
        for c, (e, cnt, mc, fr) in enumerate(per):
            nb = cnt.shape[0]
            edges[c, : nb + 1] = e
            counts[c, :nb] = cnt
            mconf[c, :nb] = mc
            freq[c, :nb] = fr
    return BinStats(
        edges=_readonly(edges),
        counts=_readonly(counts),
        mean_confidence=_readonly(mconf),
        frequency=_readonly(freq),
        gap=_readonly(mconf - freq),
    )


# ------------------------------------------------------------------------ public: ECE
def binned_statistics(
    probs: object,
    labels: object,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
    calibration: str = "top_label",
    class_index: int | None = None,
) -> BinStats:
    """Per-bin counts, mean confidence and frequency of the binned ECE.

    This is the computation behind :func:`ece` (which calls it), i.e. the data of a
    reliability diagram.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,)
        Predicted probabilities; rows must sum to 1 (rows off by more than
        ``ROW_SUM_ATOL`` and at most ``PROBS_ROW_SUM_ATOL`` are renormalised with a
        ``RenormalizationWarning``).  A 1-D array is P(y = 1) of a binary problem and
        means the two columns ``(1 - p, p)``, so the default top-label binning bins the
        confidence ``max(p, 1 - p)`` (a convention: torchmetrics' and netcal's binary ECE
        bin P(y = 1) itself; pass ``calibration="classwise", class_index=1`` for that).
        Otherwise used as given (float64, not clipped).
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``.
    n_bins : int, default 15
        Number of bins, an integer in ``1..max(n, 1000)`` (more bins than that would only
        add empty bins and unbounded memory).
    binning : {"uniform", "quantile"}, default "uniform"
        ``"uniform"``: equal-width bins with edges ``b / n_bins``, ``b = 0..n_bins``;
        bin ``b`` is the right-closed interval ``(b / n_bins, (b + 1) / n_bins]`` and the
        first bin also holds 0.0, i.e. the index is ``clip(ceil(conf * n_bins) - 1, 0,
        n_bins - 1)`` (decided by comparison with the returned edges when ``conf *
        n_bins`` rounds across an integer).  Confidence 1.0 is in the last bin, 0.0 in
        the first.  ``"quantile"``: equal-mass bins, see Notes.
    calibration : {"top_label", "classwise"}, default "top_label"
        ``"top_label"``: the confidence is ``max_k p_k`` and the outcome is whether
        ``argmax_k p_k`` (lowest index on ties) equals the label.  ``"classwise"``: for
        each class c the binary problem ``(p_c, 1[y = c])``.
    class_index : int, optional
        Class-wise only: return the statistics of class ``class_index`` alone (1-D
        arrays).  When None (default) the statistics of all K classes are stacked.

    Returns
    -------
    BinStats
        Edges, counts, mean confidence, frequency and gap; see :class:`BinStats` for
        shapes.

    Raises
    ------
    ValueError
        Invalid ``probs`` or ``labels`` (shapes, non-finite values, rows not summing to
        1, labels out of range); ``n_bins`` not a positive integer; unknown ``binning``
        or ``calibration``; ``class_index`` out of range or given with top-label.
    TypeError
        Non-numeric ``probs`` or ``labels``.

    Notes
    -----
    Quantile bins (ties rule).  With ``x_(1) <= ... <= x_(n)`` the sorted confidences and
    ``B = n_bins``, the candidate edges are ``x_(1)`` and ``x_(r_j)`` with
    ``r_j = ceil(j n / B)``, ``j = 1..B`` (the ``j / B`` quantiles of the empirical
    distribution, inverse-CDF definition, so every edge is an observed confidence).
    Equal edges are merged, so there are ``B' <= min(B, #distinct confidences)`` bins
    (when ``B >= n``, ``r_1 = 1`` and the first bin is ``[x_(1), x_(1)]``: each distinct
    confidence its own bin);
    bins are right-closed ``(e_b, e_{b+1}]`` with the first one closed, so every sample is
    in exactly one bin, samples with equal confidence are always in the same bin, and no
    bin is empty (bin b contains the sample equal to ``e_{b+1}``).  Without ties the bin
    sizes are ``floor(n / B)`` or ``ceil(n / B)``.  Edges run from ``min conf`` to
    ``max conf``, not from 0 to 1.

    References
    ----------
    Guo et al. (2017), Sec. 2 (binned ECE); Naeini et al. (2015); Kull et al. (2019)
    (class-wise ECE).
    """
    P, y = _validated(probs, labels)
    n_bins = check_n_bins(n_bins, P.shape[0])
    check_choice(binning, "binning", _BINNINGS)
    check_choice(calibration, "calibration", _CALIBRATIONS)
    if class_index is not None:
        if calibration != "classwise":
            raise ValueError("class_index is only meaningful with calibration='classwise'")
        class_index = check_class_index(class_index, P.shape[1])
    return _statistics(P, y, n_bins, binning, calibration, class_index)


def _sweep_bins(conf: np.ndarray, outcome: np.ndarray, binning: str, limit: int) -> int:
    """Roelofs et al.'s (2022) number of bins: the largest b with monotone frequencies.

    ``b`` runs from 1 up; the first ``b`` whose non-empty bins' frequencies are not
    non-decreasing (in increasing confidence) stops the sweep, and the previous ``b`` is
    returned (so every ``b' <= b`` is monotone); ``limit`` if none stops it.

    Both binnings put equal confidences in one bin and map increasing confidences to
    non-decreasing bins, so a bin is a run of the D distinct confidences and the sweep
    works on their counts and label sums: ``O(D)`` per candidate, vectorised over
    blocks of candidates.  The bins' frequencies are ratios of integers, rounded once as
    :func:`_bin_one` rounds them, so the choice is the same, bit for bit.  If the
    distinct confidences' own frequencies are non-decreasing, every binning's are (a
    bin's frequency is a count-weighted mean of a run of them) and the sweep never
    stops: ``limit`` at once (a model with a constant confidence, or a few distinct ones
    with monotone frequencies, would otherwise bin the data ``limit`` times).
    """
    u, inv, cnt = np.unique(conf, return_inverse=True, return_counts=True)
    pos = np.bincount(inv.reshape(-1), weights=outcome, minlength=u.shape[0])
    D = u.shape[0]
    if D == 1 or bool(np.all(np.diff(pos / cnt) >= 0.0)):
        return limit
    cum = np.cumsum(cnt)  # samples at or below each distinct confidence
    PC = np.concatenate([[0.0], cum.astype(np.float64)])
    PS = np.concatenate([[0.0], np.cumsum(pos)])
    n = int(cum[-1])
    cols = np.arange(D, dtype=np.int64)
    b0, block = 2, 8  # blocks grow: the sweep usually stops within tens of bins
    while b0 <= limit:
        bs = np.arange(b0, min(b0 + block, limit + 1), dtype=np.int64)
        b0 += bs.shape[0]
        block = max(1, min(2 * block, _SWEEP_BLOCK_ENTRIES // D))
        cut = _sweep_cuts(u, cum, n, bs, binning)  # (R, D - 1): a new bin after value p
        # each distinct value's run [start, end) and the run's frequency
        starts = np.zeros((bs.shape[0], D), dtype=np.int64)
        starts[:, 1:] = np.where(cut, cols[1:], 0)
        np.maximum.accumulate(starts, axis=1, out=starts)
        ends = np.full((bs.shape[0], D), D, dtype=np.int64)
        ends[:, :-1] = np.where(cut, cols[1:], D)
        ends = np.minimum.accumulate(ends[:, ::-1], axis=1)[:, ::-1]
        freq = (PS[ends] - PS[starts]) / (PC[ends] - PC[starts])
        falls = np.any(cut & (freq[:, 1:] < freq[:, :-1]), axis=1)
        if falls.any():
            return int(bs[int(np.argmax(falls))]) - 1
    return limit


#: Entries (candidates x distinct confidences) of one block of the sweep's candidates.
_SWEEP_BLOCK_ENTRIES = 1 << 18


def _sweep_cuts(
    u: np.ndarray, cum: np.ndarray, n: int, bs: np.ndarray, binning: str
) -> np.ndarray:
    """Where the bins of ``b`` in ``bs`` split the sorted distinct confidences ``u``.

    Returns a boolean (len(bs), D - 1) array, True at ``[r, p]`` where ``u[p]`` and
    ``u[p + 1]`` fall in different bins of ``bs[r]`` bins, by the rules of
    :func:`_uniform_bins` and :func:`_quantile_bins` (``cum``: the number of samples at
    or below each distinct value, ``n`` the total).
    """
    b = bs[:, None]
    if binning == "uniform":
        # the bin of x: the largest t in 0..b with t / b < x (edges t / b as in
        # _uniform_bins), clipped to 0..b-1; ceil(x b) - 1 is off by at most one
        bf = b.astype(np.float64)
        t = np.ceil(u[None, :] * bf).astype(np.int64) - 1
        t += (t + 1) / bf < u[None, :]
        t -= t / bf >= u[None, :]
        np.clip(t, 0, b - 1, out=t)
        return t[:, 1:] != t[:, :-1]
    # quantile: u[p] (p >= 1) ends a bin iff it is an edge, the order statistic of some
    # rank ceil(j n / b) in (cum[p - 1], cum[p]], i.e. iff floor(cum[p] b / n) >
    # floor(cum[p - 1] b / n); u[0] is the first edge, and ends the bin [u[0], u[0]]
    # when b >= n (rank ceil(n / b) = 1)
    q = (cum[None, :] * b) // n
    cut = np.zeros((bs.shape[0], u.shape[0] - 1), dtype=bool)
    cut[:, 1:] = q[:, 1:-1] > q[:, :-2]
    if cut.shape[1]:
        cut[:, 0] = bs >= n
    return cut


def _problem_terms(
    conf: np.ndarray, outcome: np.ndarray, n_bins: int, binning: str, debias: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights ``n_b / n``, ``|gap_b|`` and the debiased squares of one binary problem.

    The debiased square of bin b is ``gap_b^2 - freq_b (1 - freq_b) / (n_b - 1)`` for
    ``n_b >= 2`` and 0 for ``n_b < 2`` (Kumar et al. 2019); empty bins have weight 0.
    """
    _, counts, mconf, freq = _bin_one(conf, outcome, n_bins, binning)
    nonempty = counts > 0
    w = counts / conf.shape[0]
    gap = np.abs(np.where(nonempty, mconf - freq, 0.0))
    sq = np.zeros_like(gap)
    if debias:
        big = counts >= 2
        fr = freq[big]
        sq[big] = gap[big] ** 2 - fr * (1.0 - fr) / (counts[big] - 1.0)
    return w, gap, sq


def ece(
    probs: object,
    labels: object,
    *,
    n_bins: NBins = 15,
    binning: Binning = "uniform",
    calibration: Calibration = "top_label",
    p: float = 1,
    debias: bool = False,
) -> float:
    r"""Binned expected calibration error ECE^bin (top-label or class-wise), L_p.

    Top-label (Guo et al. 2017 for p = 1):

    .. math:: \mathrm{ECE} = \Big(\sum_b \frac{n_b}{n}\,|\mathrm{acc}_b -
              \mathrm{conf}_b|^p\Big)^{1/p},

    with ``acc_b`` the accuracy and ``conf_b`` the mean top-label confidence of bin b.
    Class-wise (Kull et al. 2019 for p = 1): the same binned ``CE_p^p`` of each one-vs-
    rest problem ``(p_c, 1[y = c])``, averaged over the K classes, then the p-th root:
    ``(1/K sum_c sum_b n_cb/n |freq_cb - conf_cb|^p)^(1/p)``.  Empty bins contribute 0.
    A binary (n,) input has K = 2 classes, so class-wise averages the two columns.

    ``p = np.inf`` is the maximum calibration error (MCE; Naeini et al. 2015):
    ``max_b |acc_b - conf_b|`` over the non-empty bins, and class-wise the maximum over
    the classes too (the limit of the class-wise formula as p grows).

    ``debias=True`` (p = 2 only) is the debiased estimator of Kumar, Liang & Ma (2019;
    ``unbiased_square_ce`` of their package ``uncertainty-calibration``): the
    square of each bin's gap is corrected by the variance of its frequency,

    .. math:: \widehat{\mathrm{ECE}^2} = \sum_{b:\,n_b \ge 2} \frac{n_b}{n}\Big(
              (\mathrm{acc}_b - \mathrm{conf}_b)^2
              - \frac{\mathrm{acc}_b(1 - \mathrm{acc}_b)}{n_b - 1}\Big),

    (bins with fewer than two samples contribute 0), class-wise averaged over the
    classes.  This is unbiased for the squared binned L2 error of the bins' population
    (given the bin sizes); following kdecal's rule for squared errors
    (``kdecal._estimation.quantities.SQUARED_RULE``) it is not clipped: the result is the signed
    root ``sign(v) sqrt(|v|)``, negative when the error is indistinguishable from 0 at
    this n.  uncertainty-calibration returns ``sqrt(max(v, 0))`` instead (per class for
    class-wise), which is the same number whenever it is positive.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,)
        Predicted probabilities (see :func:`binned_statistics`); used unclipped.
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``.
    n_bins : int or "sweep", default 15
        Number of bins, an integer in ``1..max(n, 1000)``; or ``"sweep"``: the number of
        bins of Roelofs et al. (2022, ECE_sweep), the largest ``b`` such that
        the frequencies of the non-empty bins are non-decreasing in the confidence for
        every number of bins ``1..b`` (found by increasing ``b`` from 1 until the first
        violation, at most ``max(n, 1000)``), chosen separately for each class
        (class-wise).  Their recommended ``ECE_sweep`` is ``binning="quantile"`` (equal
        mass) with ``p = 2``; any ``binning`` and ``p`` may be combined with it.
    binning : {"uniform", "quantile"}, default "uniform"
        Equal-width right-closed bins or equal-mass bins; the rules are those of
        :func:`binned_statistics`.
    calibration : {"top_label", "classwise"}, default "top_label"
        Which binary problem(s) to bin.
    p : float, default 1
        Order of the error, a real ``>= 1`` or ``np.inf`` (the maximum error).
    debias : bool, default False
        Return the debiased estimate of Kumar et al. (2019); needs ``p = 2``.

    Returns
    -------
    float
        The estimate, a fraction in [0, 1] (not percent); with ``debias=True`` in
        [-1, 1] (see above).

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels``; ``n_bins`` neither ``"sweep"`` nor in
        ``1..max(n, 1000)``; unknown ``binning`` or ``calibration``; ``p < 1`` or NaN
        (any finite ``p >= 1`` works: the p-th root is taken in a scaled form, so
        ``|gap|^p`` never underflows); ``debias=True`` with ``p != 2``.
    TypeError
        Non-numeric ``probs``/``labels``/``p``; ``n_bins`` not an integer or
        ``"sweep"``; ``debias`` not a bool.

    Notes
    -----
    Cost: ``O(n)`` after an ``O(n log n)`` sort for quantile bins.  The sweep sorts the
    ``D`` distinct confidences once (``O(n log n)``) and bins them once per candidate
    number of bins, ``O(D b*)`` in all for the chosen ``b*``; where the distinct
    confidences' own frequencies are already non-decreasing (a constant confidence, for
    one) no number of bins stops it, and it returns ``max(n, 1000)`` bins after the sort.

    References
    ----------
    Guo et al. (2017), Sec. 2; Naeini et al. (2015) (MCE); Kull et al. (2019);
    Kumar, Liang & Ma (2019) (debiased estimator); Roelofs et al. (2022)
    (ECE_sweep).
    """
    P, y = _validated(probs, labels)
    sweep = isinstance(n_bins, str) and n_bins == "sweep"
    if isinstance(n_bins, str) and not sweep:
        raise TypeError(f"n_bins must be a positive integer or 'sweep', got {n_bins!r}")
    limit = check_n_bins(n_bins if not sweep else 1, P.shape[0])
    if sweep:
        limit = max(P.shape[0], MAX_BINS_FLOOR)
    check_choice(binning, "binning", _BINNINGS)
    check_choice(calibration, "calibration", _CALIBRATIONS)
    q = _check_p_inf(p)
    if not isinstance(debias, (bool, np.bool_)):
        raise TypeError(f"debias must be a bool, got {debias!r}")
    if debias and q != 2.0:
        raise ValueError(f"debias=True is the debiased squared (p = 2) error; got p = {p!r}")
    return _ece(P, y, limit, sweep, binning, calibration, q, bool(debias))


def _ece(
    P: np.ndarray,
    y: np.ndarray,
    n_bins: int,
    sweep: bool = False,
    binning: str = "uniform",
    calibration: str = "top_label",
    q: float = 1.0,
    debias: bool = False,
) -> float:
    """:func:`ece` of validated, unclipped probabilities (n, K) and labels, options checked.

    ``n_bins`` is the number of bins, or with ``sweep`` the most bins the sweep tries;
    ``q`` the checked order ``p``.
    """
    return _problems_ece(_problems(P, y, calibration, None), n_bins, sweep, binning, q, debias)


def _problems_ece(
    problems: list[tuple[np.ndarray, np.ndarray]],
    n_bins: int,
    sweep: bool = False,
    binning: str = "uniform",
    q: float = 1.0,
    debias: bool = False,
) -> float:
    """:func:`_ece` of its binary problems ``(confidence, outcome)`` (:func:`_problems`)."""
    terms = []
    for conf, out in problems:
        b = _sweep_bins(conf, out, binning, n_bins) if sweep else n_bins
        terms.append(_problem_terms(conf, out, b, binning, debias))
    if math.isinf(q):
        return float(max(np.max(gap, initial=0.0) for _, gap, _ in terms))
    if debias:
        v = float(np.mean([np.sum(w * sq) for w, _, sq in terms]))
        return math.copysign(math.sqrt(abs(v)), v)
    scale = power_scale(np.concatenate([gap for _, gap, _ in terms]), q)
    pp = [np.sum(w * (gap / scale) ** q) for w, gap, _ in terms]
    return float(scale * float(np.mean(pp)) ** (1.0 / q))


# ---------------------------------------------------------------- simplex binning
def _simplex_cell_keys(P: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Freudenthal cell of each row: ``(a, perm)``, both int64 of shape (n, K - 1).

    ``z = m * (p_1, p_1 + p_2, ..., p_1 + ... + p_{K-1})`` (clipped to [0, m]),
    ``a = min(floor(z), m - 1)``, and ``perm`` lists the coordinates by decreasing
    fractional part ``z - a`` (ties: larger coordinate index first).  The cell is the
    simplex with vertices ``a, a + e_perm[0], a + e_perm[0] + e_perm[1], ..., a + 1`` in
    z-coordinates; see :func:`simplex_ece`.
    """
    K = P.shape[1]
    z = np.clip(m * np.cumsum(P[:, : K - 1], axis=1), 0.0, float(m))
    a = np.minimum(np.floor(z), m - 1).astype(np.int64)
    frac = z - a
    order_rev = np.argsort(-frac[:, ::-1], axis=1, kind="stable")
    perm = (K - 2) - order_rev
    return a, perm.astype(np.int64)


def _kuhn_vertices(a: np.ndarray, perm: np.ndarray, m: int) -> np.ndarray:
    """Vertices (K, K) in probability coordinates of the cell ``(a, perm)`` (one row)."""
    d = a.shape[0]
    Z = np.empty((d + 1, d), dtype=np.float64)
    v = a.astype(np.float64)
    Z[0] = v
    for k in range(d):
        v = v.copy()
        v[perm[k]] += 1.0
        Z[k + 1] = v
    S = Z / m
    ones = np.ones((d + 1, 1))
    return np.diff(np.concatenate([0.0 * ones, S, ones], axis=1), axis=1)


def _group_rows(key: np.ndarray) -> np.ndarray:
    """Dense group id (0..G-1) of each row of an integer matrix (equal rows, equal id)."""
    n = key.shape[0]
    order = np.lexsort(key.T[::-1])
    sk = key[order]
    new = np.ones(n, dtype=bool)
    if n > 1:
        new[1:] = np.any(sk[1:] != sk[:-1], axis=1)
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _simplex_cells(P: np.ndarray, m: int) -> np.ndarray:
    """Dense cell id (n,) of each row in the m-per-side simplex triangulation."""
    a, perm = _simplex_cell_keys(P, m)
    return _group_rows(np.concatenate([a, perm], axis=1))


def _doane_bins(x: np.ndarray) -> float:
    """Doane's (1976) number of bins ``1 + log2 n + log2(1 + |g1| / sigma_g1)``."""
    n = x.shape[0]
    k = 1.0 + math.log2(n)
    if n > 2:
        sigma = float(np.std(x))
        g1 = float(np.mean(((x - np.mean(x)) / sigma) ** 3)) if sigma > 0 else 0.0
        sg1 = math.sqrt(6.0 * (n - 2) / ((n + 1.0) * (n + 3.0)))
        k += math.log2(1.0 + abs(g1) / sg1)
    return k


def _default_bins_per_side(P: np.ndarray) -> int:
    """``ceil`` of the mean over classes of Doane's number of bins of ``p_c``."""
    k = float(np.mean([_doane_bins(P[:, c]) for c in range(P.shape[1])]))
    return max(1, math.ceil(k - 1e-9))


def simplex_ece(
    probs: object,
    labels: object,
    *,
    n_bins_per_side: int | None = None,
    p: float = 1,
) -> float:
    r"""Canonical binned calibration error on the simplex (Popordanoska et al. 2022).

    The probability simplex is partitioned into ``m^(K-1)`` simplices of equal volume
    (``m = n_bins_per_side``); each prediction's conditional expectation
    ``E[y | f(x_i)]`` is replaced by the histogram estimate ``H(f(x_i))``, the mean
    one-hot label of the samples in its cell (itself included), and

    .. math:: \mathrm{CE}_p \approx \Big(\frac1n \sum_i
              \|H(f(x_i)) - f(x_i)\|_p^p\Big)^{1/p}

    (Popordanoska et al. 2022, Sec. 4, plug-in of Eq. 1).  The norm is over the whole
    probability vector, so for K = 2 this is ``2^(1/p)`` times a one-column binned error.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,)
        Predicted probabilities; rows must sum to 1 (tolerance ``ROW_SUM_ATOL``); a 1-D
        array is P(y = 1) of a binary problem.  Used unclipped, in float64.
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``.
    n_bins_per_side : int, optional
        Number ``m`` of divisions of each edge of the simplex (positive integer).  Default:
        Doane's (1976) number of bins ``1 + log2 n + log2(1 + |g1| / sigma_g1)`` (``g1``
        the sample skewness, ``sigma_g1 = sqrt(6 (n - 2) / ((n + 1)(n + 3)))``; the
        skewness term is dropped for n <= 2) computed for each class's column ``p_c``,
        averaged over the K classes and rounded up -- the rule of Popordanoska et al.
        (2022, App. F), which chooses the number of bins per class with Doane's formula.
    p : float, default 1
        Order of the error, a real >= 1, or ``np.inf``: the maximum error
        ``max_i ||H(f(x_i)) - f(x_i)||_inf`` (the limit of the formula as p grows).

    Returns
    -------
    float
        The estimate, a fraction (0 = perfectly calibrated on the sample); not percent.

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels``; ``n_bins_per_side`` outside ``1..max(n, 1000)``;
        ``p < 1`` or NaN.
    TypeError
        Non-numeric ``probs``/``labels``/``p``; ``n_bins_per_side`` not an integer.

    Notes
    -----
    Triangulation.  With cumulative coordinates ``s_j = p_1 + ... + p_j``
    (``j = 1..K-1``) the simplex is the order simplex ``0 <= s_1 <= ... <= s_{K-1} <= 1``;
    the map ``p -> s`` is linear with determinant 1.  The cells are the simplices of the
    Freudenthal (Kuhn) triangulation of the grid of cubes of side ``1/m`` in s-space:
    with ``z = m s``, ``a = min(floor(z), m - 1)`` (componentwise) and ``t = z - a``, the
    cell of ``(a, pi)`` is ``{a + t : 1 >= t_pi(1) >= ... >= t_pi(K-1) >= 0}``, i.e. a
    point's cell is given by the integer parts of ``z`` and the permutation that sorts its
    fractional parts in decreasing order (ties: larger coordinate index first, which
    always picks a cell inside the simplex).  The cutting hyperplanes are
    ``p_i + ... + p_j = k / m`` for consecutive classes ``i <= j``; the order simplex is
    a union of exactly ``m^(K-1)`` such cells, each of volume ``1 / (m^(K-1) (K-1)!)``
    in the ``(p_1..p_{K-1})`` chart, i.e. all cells have equal volume
    ``vol(simplex) / m^(K-1)``.  For K = 3 these are the ``m^2`` congruent triangles of
    the standard triangular grid (lines ``p_1``, ``p_2``, ``p_3 = k / m``; Popordanoska et
    al. 2022, Fig. 1):
    with ``i = floor(m p_1)``, ``j = floor(m p_2)`` and fractional parts ``u, v``, the
    point is in the upward triangle ``(i, j)`` (vertices ``(i, j), (i+1, j), (i, j+1)``
    / m in ``(p_1, p_2)``) when ``u + v < 1`` and in the downward one (vertices
    ``(i+1, j), (i, j+1), (i+1, j+1)`` / m) otherwise.  For K = 2 the cells are the
    intervals of width ``1/m``.  For K >= 4 the triangulation depends on the order of
    the classes (no tiling of a tetrahedron by congruent regular simplices exists).

    The estimator is not consistent for fixed ``m`` and suffers from the curse of
    dimensionality (``m^(K-1)`` cells; Popordanoska et al. 2022, Fig. 2a); it is provided
    as the reference binned estimator of canonical calibration.

    References
    ----------
    Popordanoska et al. (2022), Eq. 1, Sec. 4, Fig. 1, Fig. 2a, App. F; Doane (1976).
    """
    P, y = _validated(probs, labels)
    p = _check_p_inf(p)
    if n_bins_per_side is None:
        m = _default_bins_per_side(P)
    else:
        # at most max(n, 1000) (more divisions than predictions only add empty cells;
        # 1e19 overflowed the cells' int64 keys and merged cells: a wrong number)
        m = check_n_bins(n_bins_per_side, P.shape[0], "n_bins_per_side")
    K = P.shape[1]
    cell = _simplex_cells(P, m)
    n_cells = int(cell.max()) + 1
    counts = np.bincount(cell, minlength=n_cells).astype(np.float64)
    label_counts = np.bincount(cell * K + y, minlength=n_cells * K).reshape(n_cells, K)
    H = label_counts[cell] / counts[cell, None]
    d = np.abs(H - P)
    if math.isinf(p):
        return float(np.max(d))
    scale = power_scale(d, p)
    err = np.sum((d / scale) ** p, axis=1)
    return float(scale * np.mean(err) ** (1.0 / p))
