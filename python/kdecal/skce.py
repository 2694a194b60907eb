"""Squared kernel calibration error (SKCE) and its calibration tests.

Widmann, Lindsten & Zachariah (NeurIPS 2019) measure the calibration of the whole
probability vector (canonical calibration) with a matrix-valued kernel on the
simplex: for predictions ``g_i`` and one-hot labels ``e_{y_i}``,

    SKCE = E[(e_Y - g(X))^T k(g(X), g(X')) (e_Y' - g(X'))],

which is 0 exactly when the model is calibrated (for a universal kernel).  kdecal
uses ``k(p, q) = kappa(p, q) I_K`` with a scalar kernel ``kappa`` (a parameter), and
offers their unbiased quadratic U-statistic, their linear-time estimator and their two
asymptotic calibration tests.  See :func:`skce` and :func:`skce_test`.

References
----------
- D. Widmann, F. Lindsten, D. Zachariah. "Calibration tests in multi-class
  classification: A unifying framework". NeurIPS 2019 (arXiv:1910.11385).
- M. A. Arcones, E. Giné. "On the bootstrap of U and V statistics". Annals of
  Statistics 20(2):655-674, 1992 (the bootstrap of degenerate U-statistics).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Union

import numpy as np
from scipy.special import ndtr

from ._numerics import ValueEq, resampling_pvalue
from ._validation import check_choice, check_int, check_seed
from .binned import _raw_probs, _validated

__all__ = ["SKCETestResult", "median_distance", "skce", "skce_test"]

#: A scalar kernel on the simplex: ``kappa(A, B) -> (len(A), len(B))`` matrix.
KernelFunction = Callable[[np.ndarray, np.ndarray], np.ndarray]
Kernel = Union[Literal["laplacian", "gaussian"], KernelFunction]
Estimator = Literal["unbiased", "linear"]

_KERNELS = ("laplacian", "gaussian")
_ESTIMATORS = ("unbiased", "linear")
_MEDIAN_ROWS = 2000  # the median heuristic looks at most at this many rows
_BLOCK = 1 << 21  # entries of a kernel block (16 MiB in float64)
#: The least p-value of the linear test: the smallest normal float64 (2.2e-308).
_PVALUE_FLOOR = float(np.finfo(np.float64).tiny)


def _sq_dist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances (len(A), len(B)), exact to rounding (no Gram trick).

    Accumulated one class at a time, so the memory is that of the result.
    """
    out = np.zeros((A.shape[0], B.shape[0]))
    for k in range(A.shape[1]):
        d = A[:, k, None] - B[None, :, k]
        out += d * d
    return out


def median_distance(probs: object) -> float:
    """Median heuristic: the median Euclidean distance between two predictions.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities (a 1-D array is P(y = 1), i.e. ``(1 - p, p)``).

    Returns
    -------
    float
        The median of ``||g_i - g_j||_2`` over the pairs ``i < j`` of the first rows
        (all of them when ``n <= 2000``, else ``2000`` rows evenly spaced in the given
        order); ``1.0`` when that median is 0 (fewer than half the pairs differ).

    Raises
    ------
    ValueError, TypeError
        Invalid ``probs`` (see :func:`kdecal.binned.ece`).
    """
    return _median_distance(_raw_probs(probs))


def _median_distance(P: np.ndarray) -> float:
    n = P.shape[0]
    if n > _MEDIAN_ROWS:
        P = P[np.linspace(0, n - 1, _MEDIAN_ROWS).round().astype(np.int64)]
    m = P.shape[0]
    if m < 2:
        return 1.0
    # the pairs i < j, a block of rows at a time
    d2 = [
        _sq_dist(P[i : i + 256], P)[np.triu_indices(min(256, m - i), k=1 + i, m=m)]
        for i in range(0, m, 256)
    ]
    med = float(np.median(np.sqrt(np.concatenate(d2))))
    return med if med > 0.0 else 1.0


def _kernel(kernel: object, bandwidth: object, P: np.ndarray) -> tuple[KernelFunction, float]:
    """Return the scalar kernel function and its bandwidth (NaN for a callable)."""
    if callable(kernel):
        if bandwidth is not None:
            raise ValueError(
                "bandwidth is for the built-in kernels; a callable kernel has its own"
            )
        fn: KernelFunction = kernel
        return fn, math.nan
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be one of {list(_KERNELS)} or a callable, got {kernel!r}")
    check_choice(kernel, "kernel", _KERNELS)
    if bandwidth is None:
        nu = _median_distance(P)
    else:
        if isinstance(bandwidth, (bool, np.bool_)) or not isinstance(
            bandwidth, (int, float, np.number)
        ):
            raise TypeError(f"bandwidth must be a positive real number, got {bandwidth!r}")
        nu = float(bandwidth)
        if not (math.isfinite(nu) and nu > 0.0):
            raise ValueError(f"bandwidth must be a finite positive number, got {bandwidth!r}")
    if kernel == "laplacian":

        def fn(A: np.ndarray, B: np.ndarray) -> np.ndarray:
            return np.exp(-np.sqrt(_sq_dist(A, B)) / nu)

    else:

        def fn(A: np.ndarray, B: np.ndarray) -> np.ndarray:
            return np.exp(-_sq_dist(A, B) / (2.0 * nu * nu))

    return fn, nu


def _kernel_values(fn: KernelFunction, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    raw = np.asarray(fn(A, B))
    if raw.dtype.kind not in "biuf":  # strings, objects; complex values lost their part
        raise TypeError(f"the kernel must return real numbers, got an array of dtype {raw.dtype}")
    k = raw.astype(np.float64, copy=False)
    if k.shape != (A.shape[0], B.shape[0]):
        raise ValueError(
            f"the kernel must return a ({A.shape[0]}, {B.shape[0]}) matrix, got shape {k.shape}"
        )
    if not np.all(np.isfinite(k)):
        raise ValueError("the kernel returned non-finite values")
    return k


def _prepare(
    probs: object, labels: object, kernel: object, bandwidth: object
) -> tuple[np.ndarray, np.ndarray, KernelFunction, float]:
    P, y = _validated(probs, labels)
    if P.shape[0] < 2:
        raise ValueError(f"the SKCE needs at least 2 samples, got n = {P.shape[0]}")
    R = -P
    R[np.arange(P.shape[0]), y] += 1.0  # residuals e_y - g, shape (n, K)
    fn, nu = _kernel(kernel, bandwidth, P)
    return P, R, fn, nu


def _pair_terms(P: np.ndarray, R: np.ndarray, fn: KernelFunction) -> np.ndarray:
    """``h_{2i-1, 2i}`` of the linear estimator (1-based pairs (1, 2), (3, 4), ...)."""
    m = P.shape[0] // 2
    a, b = np.arange(0, 2 * m, 2), np.arange(1, 2 * m, 2)
    out = np.empty(m)
    step = 256  # the kernel is evaluated on (step, step) blocks, its diagonal kept
    for s in range(0, m, step):
        i, j = a[s : s + step], b[s : s + step]
        k = np.diagonal(_kernel_values(fn, P[i], P[j]))
        out[s : s + i.shape[0]] = k * np.einsum("ij,ij->i", R[i], R[j])
    return out


def _blocks(n: int) -> int:
    return max(1, _BLOCK // max(1, n))


def _row_sums(P: np.ndarray, R: np.ndarray, fn: KernelFunction) -> tuple[np.ndarray, np.ndarray]:
    """Row sums of ``H`` without and the diagonal ``h_ii`` (H_ij = k_ij <r_i, r_j>)."""
    n = P.shape[0]
    rows = np.empty(n)
    diag = np.empty(n)
    step = _blocks(n)
    for s in range(0, n, step):
        H = _kernel_values(fn, P[s : s + step], P) * (R[s : s + step] @ R.T)
        idx = np.arange(H.shape[0])
        diag[s : s + step] = H[idx, s + idx]
        rows[s : s + step] = H.sum(axis=1)
    return rows, diag


def _unbiased(P: np.ndarray, R: np.ndarray, fn: KernelFunction) -> float:
    n = P.shape[0]
    rows, diag = _row_sums(P, R, fn)
    return float((np.sum(rows) - np.sum(diag)) / (n * (n - 1.0)))


def skce(
    probs: object,
    labels: object,
    *,
    kernel: Kernel = "laplacian",
    bandwidth: float | None = None,
    estimator: Estimator = "unbiased",
) -> float:
    r"""Squared kernel calibration error SKCE (Widmann, Lindsten & Zachariah, 2019).

    With residuals ``r_i = e_{y_i} - g_i`` (one-hot label minus predicted probability
    vector) and the matrix-valued kernel ``k(p, q) = kappa(p, q) I_K``,

    .. math:: h_{ij} = r_i^\top k(g_i, g_j)\, r_j = \kappa(g_i, g_j)\,\langle r_i,
              r_j\rangle,

    the unbiased quadratic estimator (their ``SKCE_uq``) is

    .. math:: \widehat{\mathrm{SKCE}}_{uq} = \binom{n}{2}^{-1} \sum_{i < j} h_{ij},

    and the linear-time one (``SKCE_ul``) the mean of ``h`` over the disjoint consecutive
    pairs, ``1/floor(n/2) sum_{i=1}^{floor(n/2)} h_{2i-1, 2i}`` (1-based, in the given
    row order).  Both are unbiased for ``SKCE = E[h(Z, Z')]`` (Z, Z' independent), which
    is 0 for a calibrated model and, for a universal kernel, only then; being unbiased,
    they can be negative near 0 and are reported unclipped.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities, rows on the simplex (see :func:`kdecal.binned.ece`; used
        unclipped, float64).  A 1-D array is P(y = 1), i.e. the rows ``(1 - p, p)``.
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``; ``n >= 2``.
    kernel : {"laplacian", "gaussian"} or callable, default "laplacian"
        The scalar kernel ``kappa`` on the simplex: ``"laplacian"`` (the exponential
        kernel ``exp(-||p - q||_2 / nu)`` of Widmann et al.'s experiments) or
        ``"gaussian"`` (``exp(-||p - q||_2^2 / (2 nu^2))``), both universal; or a callable
        ``kappa(A, B)`` taking two float64 arrays of shapes (a, K) and (b, K) and returning
        the (a, b) matrix of kernel values; it should be a symmetric positive-definite
        kernel (universal, for the SKCE to vanish only under calibration).
    bandwidth : float, optional
        ``nu > 0`` of the built-in kernels, in units of the Euclidean distance on the
        simplex.  Default: the median heuristic (:func:`median_distance`).  Must be
        None with a callable kernel.
    estimator : {"unbiased", "linear"}, default "unbiased"
        ``"unbiased"``: the U-statistic, ``O(n^2 K)`` time, ``O(n)`` memory (the kernel
        matrix is streamed in blocks, never stored whole).  ``"linear"``: ``O(n K)``.

    Returns
    -------
    float
        The estimate of the SKCE (a squared quantity; not a fraction of a probability).

    Raises
    ------
    ValueError
        Invalid ``probs``/``labels`` or ``n < 2``; unknown ``kernel`` or ``estimator``;
        ``bandwidth`` not finite and positive, or given with a callable kernel; a kernel
        callable that returns the wrong shape or non-finite values.
    TypeError
        Non-numeric ``probs``/``labels``/``bandwidth``; ``kernel`` neither a name nor
        callable, or a kernel callable that returns anything but real numbers (strings,
        objects, complex values).

    References
    ----------
    Widmann, Lindsten & Zachariah (NeurIPS 2019): the KCE and SKCE with a
    matrix-valued kernel, and their biased, unbiased quadratic and unbiased linear
    estimators).
    """
    check_choice(estimator, "estimator", _ESTIMATORS)
    P, R, fn, _ = _prepare(probs, labels, kernel, bandwidth)
    if estimator == "linear":
        return float(np.mean(_pair_terms(P, R, fn)))
    return _unbiased(P, R, fn)


@dataclass(frozen=True, eq=False)
class SKCETestResult(ValueEq):
    """Result of :func:`skce_test`.

    Attributes
    ----------
    estimator : str
        ``"unbiased"`` or ``"linear"``: which SKCE estimate is the statistic.
    statistic : float
        That estimate on the data.
    pvalue : float
        The asymptotic p-value of the null hypothesis "the model is calibrated"; never
        0 (at least ``1 / (n_resamples + 1)`` for the bootstrap, ``2.2e-308`` for the
        normal approximation).
    bandwidth : float
        ``nu`` of the built-in kernel (NaN for a callable kernel).
    null_distribution : ndarray, shape (n_resamples,), float64, or None
        ``"unbiased"``: the bootstrap replicates of the SKCE under the null; None for
        ``"linear"`` (normal approximation).
    """

    estimator: str
    statistic: float
    pvalue: float
    bandwidth: float
    null_distribution: np.ndarray | None = field(default=None, repr=False)


def skce_test(
    probs: object,
    labels: object,
    *,
    kernel: Kernel = "laplacian",
    bandwidth: float | None = None,
    estimator: Estimator = "linear",
    n_resamples: int = 1000,
    seed: int | np.random.Generator | None = None,
) -> SKCETestResult:
    r"""Calibration test of Widmann, Lindsten & Zachariah (2019) on the SKCE.

    The null hypothesis is that the model is calibrated (``SKCE = 0``); a small p-value
    is evidence of miscalibration.

    * ``estimator="linear"``: the linear estimator is a mean of ``m = floor(n/2)``
      i.i.d. terms ``h_{2i-1, 2i}`` with mean 0 under the null, so
      ``z = sqrt(m) SKCE_ul / s`` (``s`` the sample standard deviation of the terms,
      ``ddof = 1``) is asymptotically standard normal and ``pvalue = 1 - Phi(z)``
      (Widmann et al. 2019, the test based on the asymptotic normality of
      ``SKCE_ul``), computed as ``Phi(-z)`` and at least ``2.2e-308`` (the smallest
      normal float64: the tail underflows to 0 beyond ``z ~ 38.5``, and terms all
      equal and positive give ``z = inf``).  Deterministic; ``n_resamples`` and
      ``seed`` are not used.
    * ``estimator="unbiased"``: under the null the U-statistic is degenerate and
      ``n SKCE_uq`` converges to a weighted sum of centred chi-squares; its quantiles
      are estimated with the bootstrap of Arcones & Giné (1992), as Widmann et al.
      (2019) propose: with ``H`` the matrix of ``h_ij``, ``bar h_i`` its row
      means and ``bar h`` its mean, each replicate draws n rows ``I`` with replacement
      and computes ``1/(n(n-1)) sum_{a != b} [H_{I_a I_b} - bar h_{I_a} - bar h_{I_b}
      + bar h]``; ``pvalue = (1 + #{T*_b >= SKCE_uq}) / (1 + n_resamples)`` (ties up to
      rounding, within 1e-13 or 1e-12 of the larger magnitude, count as ``>=``).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities (see :func:`skce`).
    labels : array-like of int, shape (n,)
        True classes in ``0..K-1``; ``n >= 2`` (``n >= 4`` for the linear test).
    kernel : {"laplacian", "gaussian"} or callable, default "laplacian"
        The scalar kernel, as for :func:`skce`.
    bandwidth : float, optional
        As for :func:`skce` (default: the median heuristic).
    estimator : {"linear", "unbiased"}, default "linear"
        Which test (see above).  The bootstrap test costs ``O(n^2 (K + n_resamples))``
        time and ``O(n n_resamples)`` memory per block of rows.
    n_resamples : int, default 1000
        Bootstrap replicates of the ``"unbiased"`` test (a positive integer).
    seed : int or numpy Generator, optional
        Seed of the bootstrap draws (``numpy.random.default_rng(seed)``).

    Returns
    -------
    SKCETestResult
        The statistic, the p-value, the bandwidth and (bootstrap) the null replicates.

    Raises
    ------
    ValueError
        As for :func:`skce`; ``n < 4`` with ``estimator="linear"``; ``n_resamples < 1``.
    TypeError
        As for :func:`skce`; ``n_resamples`` not an integer.

    References
    ----------
    Widmann, Lindsten & Zachariah (NeurIPS 2019), calibration tests: the
    asymptotic test of the linear estimator and the bootstrapped test of the
    quadratic one); Arcones & Giné (1992).
    """
    check_choice(estimator, "estimator", _ESTIMATORS)
    B = check_int(n_resamples, "n_resamples", 1)
    P, R, fn, nu = _prepare(probs, labels, kernel, bandwidth)
    n = P.shape[0]
    if estimator == "linear":
        if n < 4:
            raise ValueError(f"the linear SKCE test needs at least 4 samples, got n = {n}")
        h = _pair_terms(P, R, fn)
        stat = float(np.mean(h))
        sd = float(np.std(h, ddof=1))
        if sd == 0.0:  # every term equal: no evidence either way unless they are > 0
            pval = 0.0 if stat > 0.0 else 1.0
        else:
            # the upper tail Phi(-z) directly (never 1 - Phi(z), which cancels)
            pval = float(ndtr(-math.sqrt(h.shape[0]) * stat / sd))
        # Phi(-z) underflows to 0 beyond z ~ 38.5: a tail below float64's range is
        # reported as that range's floor, never as 0
        return SKCETestResult("linear", stat, max(pval, _PVALUE_FLOOR), nu)
    rng = check_seed(seed)
    counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(B)])
    C = counts.T.astype(np.float64)  # (n, B) multiplicities
    rows = np.empty(n)
    diag = np.empty(n)
    HC = np.empty((n, B))
    step = _blocks(n)
    for s in range(0, n, step):
        H = _kernel_values(fn, P[s : s + step], P) * (R[s : s + step] @ R.T)
        idx = np.arange(H.shape[0])
        diag[s : s + step] = H[idx, s + idx]
        rows[s : s + step] = H.sum(axis=1)
        HC[s : s + step] = H @ C
    stat = float((np.sum(rows) - np.sum(diag)) / (n * (n - 1.0)))
    rbar = rows / n  # row means of H (diagonal included: the empirical distribution)
    hbar = float(np.mean(rbar))
    # sum_{a != b} Hc[I_a, I_b] = c^T Hc c - sum_i c_i Hc_ii with Hc the centred matrix
    quad = np.einsum("ib,ib->b", C, HC) - 2.0 * n * (rbar @ C) + n * n * hbar
    dterm = (diag - 2.0 * rbar + hbar) @ C
    null = (quad - dterm) / (n * (n - 1.0))
    pval = resampling_pvalue(null, stat)
    return SKCETestResult("unbiased", stat, pval, nu, null)
