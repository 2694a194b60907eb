"""Smooth ECE (smECE) of Błasiok & Nakkiran (ICLR 2024).

The smooth calibration error smooths the residuals ``y_i - f_i`` of a binary problem
with the reflected Gaussian kernel on [0, 1] and integrates the absolute value of the
result; its bandwidth is the fixed point ``smECE_sigma = sigma``.  See
:func:`smooth_ece` for the definition, the quadrature and the difference from relplot.

References
----------
- J. Błasiok, P. Nakkiran. "Smooth ECE: Principled Reliability Diagrams via Kernel
  Smoothing". ICLR 2024 (arXiv:2309.12236).  Reference code: the ``relplot`` package
  (apple/ml-calibration).
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import numpy as np
from scipy.optimize import brentq

from ._numerics import exact_sum
from ._validation import check_choice
from .binned import _problems, _validated

__all__ = ["smooth_ece", "smooth_ece_bandwidth"]

_CALIBRATIONS = ("top_label", "classwise")

# the kernel mass beyond 9 sigma, 2 Phi(-9) = 2.3e-19, is below float64 resolution
_REACH = 9.0
# Gauss-Legendre nodes per panel; panels are at most sigma wide
_GL_NODES = 20
_GL_X, _GL_W = np.polynomial.legendre.leggauss(_GL_NODES)
# the fixed-point search does not go below this bandwidth (see smooth_ece, Notes)
SIGMA_MIN = 1e-4
# the smallest bandwidth smooth_ece accepts: the quadrature has up to ~22 / sigma nodes
# (1e10 at sigma = 1e-10, a 75 GiB grid); at 1e-6 at most 2.2e7 (~180 MB per array)
SIGMA_FLOOR = 1e-6
_BLOCK = 1 << 20  # kernel evaluations per block (memory ~ 8 MiB per temporary)


def _check_sigma(sigma: object) -> float:
    if isinstance(sigma, (bool, np.bool_)) or not isinstance(sigma, (int, float, np.number)):
        raise TypeError(f"sigma must be a real number in (0, 1] or None, got {sigma!r}")
    s = float(sigma)
    if not (math.isfinite(s) and 0.0 < s <= 1.0):
        raise ValueError(f"sigma must be a finite real number in (0, 1], got {sigma!r}")
    if s < SIGMA_FLOOR:
        raise ValueError(
            f"sigma must be at least SIGMA_FLOOR = {SIGMA_FLOOR:g} (the quadrature grid has"
            f" ~22 / sigma nodes), got {sigma!r}"
        )
    return s


# smECE_sigma uses the cosine series of the kernel from this bandwidth up (see Notes)
_FOURIER_SIGMA = 0.01
# exp(-(pi m sigma)^2 / 2) < exp(-45) = 2.9e-20 beyond m = sqrt(90) / (pi sigma)
_FOURIER_CUT = math.sqrt(90.0) / math.pi


#: harmonics per block of :func:`_cosine_sums` (a power of 2)
_HARMONICS = 32


def _cosine_sums(f: np.ndarray, w: np.ndarray, m0: int, m1: int) -> np.ndarray:
    """Return ``sum_i w_i cos(pi m f_i)`` for ``m = m0..m1`` (float64, ``m1 - m0 + 1``).

    By powers of ``z_i = exp(i pi f_i)`` rather than one ``cos`` per (point, harmonic):
    per block of rows a table of ``z_i^k``, ``k < 32``, by doubling (``z^(2^l)``
    evaluated directly, five levels of complex products), then each run of 32 harmonics
    as the real part of one product of that table with ``w_i z_i^start``. Every term is
    a few roundings from the direct ``cos(pi m f_i)`` (about 10 ulp of 1 at most).
    """
    B = _HARMONICS
    out = np.zeros(max(m1 - m0 + 1, 0))
    rows = max(1, _BLOCK // (2 * B))
    for i in range(0, f.shape[0] if out.size else 0, rows):
        theta = math.pi * f[i : i + rows]
        wi = w[i : i + rows]
        Z = np.empty((B, theta.shape[0]), dtype=np.complex128)  # Z[k] = z^k
        Z[0] = 1.0
        k = 1
        while k < B:  # [k, 2k) from [0, k) times z^k
            Z[k : 2 * k] = Z[:k] * np.exp(1j * (k * theta))
            k *= 2
        for start in range(m0, m1 + 1, B):
            n_m = min(B, m1 + 1 - start)
            out[start - m0 : start - m0 + n_m] += (
                Z[:n_m] @ (wi * np.exp(1j * (start * theta)))
            ).real
    return out


class _Residuals:
    """One binary problem's residuals ``r_i = y_i - f_i`` over ``n``, by distinct ``f``.

    ``f``: the distinct predictions, sorted; ``w``: the sum of ``r_i / n`` over the rows
    of each (rows with equal predictions have equal kernels, so every kernel sum over
    rows is the same sum over the distinct values: fewer terms where predictions tie, as
    float32 confidences near 1 and the copies of a bootstrap sample do; at most a few
    roundings apart from the sum over rows); ``mass``: ``sum_i |r_i| / n`` over the rows.
    """

    def __init__(self, f: np.ndarray, r: np.ndarray) -> None:
        order = np.argsort(f, kind="stable")
        fs = f[order]
        ws = r[order] / f.shape[0]
        self.mass = exact_sum(np.abs(ws))
        self.mean = exact_sum(ws)
        first = np.flatnonzero(np.concatenate([[True], fs[1:] != fs[:-1]]))
        if first.shape[0] < fs.shape[0]:
            fs = fs[first]
            ws = np.add.reduceat(ws, first)
        self.f = np.ascontiguousarray(fs)
        self.w = np.ascontiguousarray(ws)
        self._images: tuple[float, np.ndarray, np.ndarray] | None = None
        self._coefs: tuple[float, np.ndarray] | None = None
        self._sums = np.zeros(0)

    def images(self, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """Centres ``+-f + 2k`` within ``_REACH sigma`` of [0, 1], with their weights."""
        if self._images is not None and self._images[0] == sigma:
            return self._images[1], self._images[2]
        reach = _REACH * sigma
        kmax = math.ceil((reach + 2.0) / 2.0)
        cs, ws = [], []
        for k in range(-kmax, kmax + 1):
            for c in (self.f + 2.0 * k, -self.f + 2.0 * k):
                keep = (c >= -reach) & (c <= 1.0 + reach)
                if np.any(keep):
                    cs.append(c[keep])
                    ws.append(self.w[keep])
        c = np.concatenate(cs)
        w = np.concatenate(ws)
        order = np.argsort(c, kind="stable")
        self._images = (sigma, c[order], w[order])
        return self._images[1], self._images[2]

    def coefficients(self, sigma: float) -> np.ndarray:
        """Cosine coefficients ``a_m``, ``m = 0..M``, of ``g`` (see :func:`smooth_ece`).

        The last bandwidth's are kept: one ``smECE_sigma`` evaluates ``g`` many times at
        one ``sigma`` (the quadrature, then each root's bracketing search).
        """
        if self._coefs is not None and self._coefs[0] == sigma:
            return self._coefs[1]
        M = math.ceil(_FOURIER_CUT / sigma)
        have = self._sums.shape[0]
        if M > have:  # sum_i w_i cos(pi m f_i) does not depend on sigma: extend the cache
            s = _cosine_sums(self.f, self.w, have + 1, max(M, 2 * have))
            self._sums = np.concatenate([self._sums, s])
        m = np.arange(1, M + 1, dtype=np.float64)
        a = np.empty(M + 1)
        a[0] = self.mean
        a[1:] = 2.0 * np.exp(-0.5 * (math.pi * sigma * m) ** 2) * self._sums[:M]
        self._coefs = (sigma, a)
        return a

    def smoothed(self, t: np.ndarray, sigma: float) -> np.ndarray:
        """``g(t) = (1/n) sum_i r_i K^R_sigma(t, f_i)`` at sorted points ``t``."""
        if sigma >= _FOURIER_SIGMA:
            a = self.coefficients(sigma)
            m = np.arange(1, a.shape[0], dtype=np.float64)
            out = np.empty(t.shape[0])
            rows = max(1, _BLOCK // m.shape[0])
            for i in range(0, t.shape[0], rows):
                out[i : i + rows] = a[0] + np.cos(math.pi * t[i : i + rows, None] * m) @ a[1:]
            return out
        c, w = self.images(sigma)
        reach = _REACH * sigma
        # per point the images within reach: [lo, hi); the pairs (point, image) are
        # gathered in blocks of at most _BLOCK, so that scattered points (the roots'
        # brackets) cost their windows only, not the images between them
        lo = np.searchsorted(c, t - reach, side="left")
        cnt = np.searchsorted(c, t + reach, side="right") - lo
        ends = np.concatenate([[0], np.cumsum(cnt)])
        out = np.zeros(t.shape[0])
        start = 0
        while start < t.shape[0]:
            stop = int(np.searchsorted(ends, ends[start] + _BLOCK, side="right")) - 1
            stop = min(max(stop, start + 1), t.shape[0])
            k = cnt[start:stop]
            owner = np.repeat(np.arange(stop - start), k)
            j = np.arange(ends[start], ends[stop]) + np.repeat(
                lo[start:stop] - ends[start:stop], k
            )
            z = (t[start:stop][owner] - c[j]) / sigma
            out[start:stop] = np.bincount(
                owner, weights=np.exp(-0.5 * z * z) * w[j], minlength=stop - start
            )
            start = stop
        return out / (math.sqrt(2.0 * math.pi) * sigma)


def _panels(f: np.ndarray, sigma: float) -> np.ndarray:
    """Edges (m, 2) of the panels of [0, 1] (width <= sigma) near some prediction."""
    m = max(math.ceil(1.0 / sigma), 4)
    edges = np.linspace(0.0, 1.0, m + 1)
    reach = _REACH * sigma
    # a panel [a, b] is needed when some f_i is in [a - reach, b + reach]; the images of
    # f_i are never closer to [0, 1] than f_i itself
    lo = np.searchsorted(f, edges[:-1] - reach, side="left")
    hi = np.searchsorted(f, edges[1:] + reach, side="right")
    keep = hi > lo
    return np.stack([edges[:-1][keep], edges[1:][keep]], axis=1)


def _gl_points(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    half = 0.5 * (b - a)
    t = (0.5 * (a + b))[:, None] + half[:, None] * _GL_X[None, :]
    wt = half[:, None] * _GL_W[None, :]
    return t, wt


def _bracketed_roots(
    func: Callable[[np.ndarray], np.ndarray],
    a: np.ndarray,
    b: np.ndarray,
    fa: np.ndarray,
    fb: np.ndarray,
    xtol: float = 1e-15,
    rtol: float = 1e-15,
    maxiter: int = 200,
) -> np.ndarray:
    """Return a root of ``func`` in each bracket ``[a_k, b_k]`` (``fa_k fb_k < 0``).

    The brackets are disjoint and increasing, so every step evaluates ``func`` once, at
    an increasing array of points (one per unconverged bracket), whatever their number.
    Each bracket takes the Illinois step (regula falsi, the value at an end kept twice in
    a row halved), clipped to ``tol / 2`` inside, or a bisection where its width has not
    halved over the last three steps; it is done at width ``xtol + rtol |a|`` or an exact zero (as ``brentq``).
    """
    a, b, fa, fb = (np.array(v, dtype=np.float64) for v in (a, b, fa, fb))
    out = np.empty(a.shape[0])
    idx: np.ndarray = np.arange(a.shape[0])
    side: np.ndarray = np.zeros(a.shape[0], dtype=np.int8)  # -1/+1: a/b moved last
    w1: np.ndarray = np.full(a.shape[0], np.inf)  # the widths 1, 2 and 3 steps ago
    w2: np.ndarray = w1
    w3: np.ndarray = w1
    for _ in range(maxiter):
        w = b - a
        tol = xtol + rtol * np.maximum(np.abs(a), np.abs(b))
        done = w <= tol
        if np.any(done):
            out[idx[done]] = 0.5 * (a[done] + b[done])
            keep = ~done
            idx, a, b, fa, fb, side, w, tol, w1, w2 = (
                v[keep] for v in (idx, a, b, fa, fb, side, w, tol, w1, w2)
            )
            w3 = w3[keep]
        if idx.shape[0] == 0:
            return out
        with np.errstate(over="ignore", invalid="ignore"):
            x = b - fb * (w / (fb - fa))
        mid = 0.5 * (a + b)
        x = np.where((x >= a) & (x <= b) & (w <= 0.5 * w3), x, mid)
        # at least tol/2 from either end: from one side the steps can shrink to nothing,
        # a step of tol/2 past the root then closes the bracket (as Brent's method)
        x = np.clip(x, a + 0.5 * tol, b - 0.5 * tol)
        fx = func(x)
        zero = fx == 0.0
        if np.any(zero):
            out[idx[zero]] = x[zero]
            keep = ~zero
            idx, a, b, fa, fb, side, w, w1, w2, x, fx = (
                v[keep] for v in (idx, a, b, fa, fb, side, w, w1, w2, x, fx)
            )
        w1, w2, w3 = w, w1, w2
        left = np.signbit(fx) == np.signbit(fa)  # the root is in [x, b]: x replaces a
        fb = np.where(left & (side == -1), 0.5 * fb, fb)
        fa = np.where(~left & (side == 1), 0.5 * fa, fa)
        a, fa = np.where(left, x, a), np.where(left, fx, fa)
        b, fb = np.where(left, b, x), np.where(left, fb, fx)
        side = np.where(left, -1, 1).astype(np.int8)
    out[idx] = 0.5 * (a + b)
    return out


def _smece_sigma(res: _Residuals, sigma: float) -> float:
    """``smECE_sigma = int_0^1 |g(t)| dt`` by Gauss-Legendre panels split at the roots."""
    pan = _panels(res.f, sigma)
    if pan.shape[0] == 0:
        return 0.0
    a, b = pan[:, 0], pan[:, 1]
    t, wt = _gl_points(a, b)
    ends = np.unique(np.concatenate([a, b]))
    g = res.smoothed(t.ravel(), sigma).reshape(t.shape)
    g_ends = res.smoothed(ends, sigma)
    ga = g_ends[np.searchsorted(ends, a)]
    gb = g_ends[np.searchsorted(ends, b)]
    vals = np.concatenate([ga[:, None], g, gb[:, None]], axis=1)
    # values within rounding of 0 have no sign: a "root" there is noise (|g| below it
    # adds at most that much to the integral), and exactly cancelling data would
    # otherwise send Brent's method after every rounding error
    noise = 1e-14 * res.mass * (1.0 + 1.0 / (math.sqrt(2 * math.pi) * sigma))
    s = np.sign(np.where(np.abs(vals) <= noise, 0.0, vals))
    changes = np.any(s[:, 1:] * s[:, :-1] < 0, axis=1)
    total = float(np.sum(np.abs(g[~changes]) * wt[~changes]))
    if not np.any(changes):
        return total

    # every sign change between neighbouring nodes brackets a root of g: solve them all
    # at once, each step one vectorised evaluation of g at all unconverged brackets
    tt = np.concatenate([a[:, None], t, b[:, None]], axis=1)
    ip, jp = np.nonzero(s[:, 1:] * s[:, :-1] < 0)  # row-major: brackets in increasing t
    roots = _bracketed_roots(
        lambda x: res.smoothed(x, sigma),
        tt[ip, jp],
        tt[ip, jp + 1],
        vals[ip, jp],
        vals[ip, jp + 1],
    )
    rows = np.flatnonzero(changes)
    # the pieces: per changing panel its left end, its roots, its right end
    cuts = np.concatenate([a[rows], roots, b[rows]])
    key = np.concatenate([rows, ip, rows]).astype(np.float64)
    rank = np.concatenate(
        [np.zeros(rows.shape[0]), np.ones(roots.shape[0]), np.full(rows.shape[0], 2.0)]
    )
    order = np.lexsort((cuts, rank, key))  # by panel, then left end < roots < right end
    cuts, key = cuts[order], key[order]
    inner = key[1:] == key[:-1]
    pieces_a, pieces_b = cuts[:-1][inner], cuts[1:][inner]
    t2, wt2 = _gl_points(pieces_a, pieces_b)
    order = np.argsort(t2.ravel(), kind="stable")
    g2 = np.empty(t2.size)
    g2[order] = res.smoothed(t2.ravel()[order], sigma)
    return total + float(np.sum(np.abs(g2) * wt2.ravel()))


def _fixed_point(res: _Residuals) -> float:
    """Solve ``smECE_sigma = sigma`` for the bandwidth ``sigma*`` (SIGMA_MIN at least)."""

    def h(s: float) -> float:
        return _smece_sigma(res, s) - s

    # |mean r| <= smECE_sigma <= mean |r| <= 1 for every sigma (the kernel integrates to
    # 1 in t), so the fixed point is in [|mean r|, mean |r|]
    lo = abs(res.mean)
    hi = min(res.mass, 1.0)
    if hi <= SIGMA_MIN:
        return SIGMA_MIN
    if hi - lo <= 1e-15 * hi:
        return hi
    if lo < SIGMA_MIN or h(lo) < 0.0:  # only where mean r is (nearly) 0
        lo = hi / 2.0
        while h(lo) < 0.0:
            hi = lo
            if lo <= SIGMA_MIN:
                return SIGMA_MIN
            lo = max(lo / 4.0, SIGMA_MIN)
    if h(hi) >= 0.0:
        return hi
    return float(brentq(h, lo, hi, xtol=1e-15, rtol=1e-13))


def _binary_problems(
    probs: object, labels: object, calibration: str
) -> list[tuple[np.ndarray, np.ndarray]]:
    check_choice(calibration, "calibration", _CALIBRATIONS)
    P, y = _validated(probs, labels)
    return _problems(P, y, calibration, None)


def smooth_ece_bandwidth(
    probs: object,
    labels: object,
    *,
    calibration: Literal["top_label", "classwise"] = "top_label",
) -> float | np.ndarray:
    """Bandwidth ``sigma*`` of the smooth ECE: the fixed point ``smECE_sigma = sigma``.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities, as for :func:`smooth_ece`.
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``.
    calibration : {"top_label", "classwise"}, default "top_label"
        Which binary problem(s), as for :func:`smooth_ece`.

    Returns
    -------
    float or ndarray, shape (K,), float64
        ``sigma*`` in ``[SIGMA_MIN, 1]`` of the top-label problem (a float), or of each
        class's one-vs-rest problem (class-wise, shape (K,)).

    Raises
    ------
    ValueError, TypeError
        As for :func:`smooth_ece`.

    References
    ----------
    Błasiok & Nakkiran (ICLR 2024): the bandwidth as the fixed point
    ``sigma* = smECE_sigma*``.
    """
    probs_ = _binary_problems(probs, labels, calibration)
    sig = [_fixed_point(_Residuals(c, o - c)) for c, o in probs_]
    return sig[0] if calibration == "top_label" else np.array(sig)


def smooth_ece(
    probs: object,
    labels: object,
    *,
    sigma: float | None = None,
    calibration: Literal["top_label", "classwise"] = "top_label",
) -> float:
    r"""Smooth expected calibration error smECE (Błasiok & Nakkiran, ICLR 2024).

    For a binary problem with predictions ``f_i`` in [0, 1] and outcomes ``y_i`` in
    {0, 1} (top-label: the confidence and whether the prediction is right), the
    residuals ``r_i = y_i - f_i`` are smoothed with the reflected Gaussian kernel

    .. math:: K^R_\sigma(t, f) = \sum_{k \in \mathbb Z} \big[\varphi_\sigma(t - f - 2k)
              + \varphi_\sigma(t + f - 2k)\big],

    (the Gaussian of standard deviation ``sigma`` folded onto [0, 1] by reflection at 0
    and 1, so that ``int_0^1 K^R_sigma(t, f) dt = 1``), and

    .. math:: \mathrm{smECE}_\sigma = \int_0^1 \Big|\frac1n \sum_i r_i\,
              K^R_\sigma(t, f_i)\Big|\,dt
              = \int_0^1 |\hat r_\sigma(t)|\,\hat\delta_\sigma(t)\,dt,

    with ``hat r`` the Nadaraya-Watson smoothed residual and ``hat delta`` the kernel
    density of the predictions (Błasiok & Nakkiran 2024: their definition of the
    SmoothECE at bandwidth sigma, with their reflected Gaussian kernel).  smECE_sigma is
    non-increasing in
    sigma, and the reported smECE is ``smECE_sigma*`` at the unique fixed point
    ``smECE_sigma* = sigma*`` (their hyperparameter-free choice of bandwidth), i.e. the value
    returned equals the bandwidth.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities; rows must sum to 1 (see
        :func:`kdecal.binned.binned_statistics`; used unclipped, in float64).  A 1-D array
        is P(y = 1) of a binary problem, i.e. the columns ``(1 - p, p)``: top-label then
        smooths the confidence ``max(p, 1 - p)``, class-wise both columns (which give the
        same value, the smECE of ``(p, y)`` that relplot's ``smECE(p, y)`` computes).
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``.
    sigma : float, optional
        A fixed bandwidth in [``SIGMA_FLOOR``, 1] (``SIGMA_FLOOR = 1e-6``): return
        ``smECE_sigma`` (relplot's ``smECE_sigma``).
        Default: the fixed point ``sigma*`` of each binary problem.
    calibration : {"top_label", "classwise"}, default "top_label"
        ``"top_label"``: the binary problem (max probability, prediction correct) of
        Błasiok & Nakkiran's experiments.  ``"classwise"``: the mean over the K classes of
        the smECE of ``(p_c, 1[y = c])``, each with its own fixed point.

    Returns
    -------
    float
        The smooth ECE, a fraction in [0, 1] (not percent).

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels`` (shapes, non-finite values, rows not summing to 1,
        labels out of range); ``sigma`` not in (0, 1] or below ``SIGMA_FLOOR = 1e-6``
        (the quadrature has up to ``22 / sigma`` nodes: 1e10, 75 GiB, at 1e-10).  As
        sigma -> 0 smECE_sigma tends to ``(1/n) sum |sum r_i|`` over the groups of equal
        predictions, reached once sigma is well below the gaps between them (on 200
        Dirichlet predictions: 2e-11 between sigma = 1e-6 and 1e-7, 2.3e-4 between
        1e-5 and 1e-6); the fixed point never goes below ``SIGMA_MIN = 1e-4``.  Unknown
        ``calibration``.
    TypeError
        Non-numeric ``probs``/``labels``/``sigma``.

    Notes
    -----
    **Which smECE.**  kdecal computes the published definition exactly, up to
    floating-point rounding (checked against a materialised float64 evaluation of the
    definition with adaptive quadrature to 1e-9 in ``tests/notions/test_smooth.py``; measured
    agreement ~1e-16).  The smoothed residual ``g(t)`` is evaluated exactly: for
    ``sigma >= 0.01`` through the cosine series of the reflected kernel (Poisson
    summation of the images),

    .. math:: K^R_\sigma(t, f) = 1 + 2 \sum_{m \ge 1} e^{-\pi^2 m^2 \sigma^2 / 2}
              \cos(\pi m t) \cos(\pi m f),

    truncated where the factor is below ``e^-45``; for smaller sigma as the sum over the
    reflected images ``+-f_i + 2k`` within ``9 sigma`` of ``t`` (the kernel mass beyond is
    below ``2.3e-19``).  The integral uses 20-point Gauss-Legendre panels at most
    ``sigma`` wide, split at the roots of ``g`` so that ``|g|`` is smooth on every piece,
    over the panels within ``9 sigma`` of a prediction.  The roots are found all at once,
    one per sign change of ``g`` between neighbouring nodes, to ``1e-15``: Illinois
    (regula falsi) steps safeguarded by bisection, each step one vectorised evaluation
    of ``g`` at every unconverged bracket, so that the number of passes does not grow
    with the number of roots (a well-calibrated model's ``g`` crosses 0 hundreds to
    thousands of times at small sigma); the fixed point
    is solved by Brent's method on ``[|mean r|, mean |r|]`` (which brackets it) to
    ``1e-13`` relative.  The reference code, relplot's ``smECE``, instead rounds the
    data linearly onto a grid of ``max(2000, 20 / sigma) / 2 + 1`` points, convolves
    with the discretised kernel, integrates with a ``max(200, 10 / sigma)``-point
    Riemann sum, and finds ``sigma*`` by 10 bisection steps from 1 (to within
    ``2^-10``, the upper end of its last interval).  The two agree to the size of that
    discretisation: on the tests' data (n = 2000) relplot's ``smECE_sigma`` is 1.3e-4 to
    1.2e-3 relative below kdecal's at sigma = 0.02, 0.05, 0.1, and 8.7e-6 with relplot's
    grids refined to 10001 and 20000 points; its ``smECE`` (fixed point) is 2.1e-3
    relative below.

    A sample whose residuals cancel exactly at tied predictions can have a fixed point
    below ``SIGMA_MIN = 1e-4``; the search stops there and returns
    ``smECE_SIGMA_MIN``, itself below ``1e-4``.

    Cost: per bandwidth ``O(n M)`` for the cosine sums (``M ~ 3 / sigma``, shared by
    all bandwidths once computed) or ``O(n m sigma)`` for the image sums, with
    ``m ~ 20 / sigma`` quadrature points; about 10 to 15 bandwidths for the fixed point;
    memory ``O(n + m)`` plus blocks of at most 2^20 kernel values; the roots of ``g``
    add about 6 to 16 vectorised evaluations of ``g`` per bandwidth.  Measured (2-core
    machine with other work running beside it, top-label, fixed point,
    ``datasets.make_seeds_synthetic(n, 3, t1=0.6, t2=...)``): miscalibrated
    (``t2=0.7``, ``sigma* ~ 0.067``, cosine series) 0.07 s for n = 10^4 and 3 x 10^4,
    0.1 s for 10^5; well calibrated (``t2=1.0``, ``sigma* ~ 0.006`` to 0.012, image
    sums) 0.9 s, 5 s and 18 s: there the ~13 bandwidths of the fixed-point search each
    cost ``O(n)`` image sums of about 400 kernel values per prediction.

    References
    ----------
    J. Błasiok, P. Nakkiran. "Smooth ECE: Principled Reliability Diagrams via Kernel
    Smoothing". ICLR 2024 (arXiv:2309.12236): smECE_sigma, the reflected Gaussian kernel,
    monotonicity in sigma and the fixed-point bandwidth.
    """
    s = None if sigma is None else _check_sigma(sigma)
    return _smooth_ece(_binary_problems(probs, labels, calibration), s)


def _smooth_ece(problems: list[tuple[np.ndarray, np.ndarray]], sigma: float | None) -> float:
    """:func:`smooth_ece` of validated binary problems ``(confidences, outcomes)``."""
    vals = []
    for c, o in problems:
        res = _Residuals(c, o - c)
        vals.append(_smece_sigma(res, sigma if sigma is not None else _fixed_point(res)))
    return float(np.mean(vals))
