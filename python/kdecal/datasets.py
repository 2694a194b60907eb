"""Synthetic classifiers with a known calibration error (the "seeds" protocol).

The protocol of Popordanoska et al. (2022), Sec. 4 "Synthetic experiments" (Fig. 2a),
reused by Popordanoska et al. (2024), Sec. 7.1:

1. ``q ~ Uniform(simplex)``: a uniform sample from the probability simplex with K
   vertices (the Dirichlet(1, ..., 1) distribution);
2. ``c = T_{t1}(q)``: temperature scaling with ``t1`` concentrates the scores near the
   faces of the simplex ("to simulate realistic scenarios where the probability scores
   are concentrated along lower dimensional faces of the simplex", 2022 Sec. 4);
3. ``y ~ Categorical(c)``: "We generate ground truth labels according to the sampled
   probabilities and therefore obtain a perfectly calibrated classifier" (ibid.);
4. ``f = T_{t2}(c)``: "the classifier is miscalibrated by additional temperature
   scaling with t2" (ibid.). ``f`` is what the estimators see.

Temperature convention
----------------------
``T_t(q) = softmax(log(q) / t)``, i.e. ``T_t(q)_k = q_k^(1/t) / sum_j q_j^(1/t)``: the
probabilities are read as logits ``log q`` (defined up to an additive constant, which
softmax ignores) and the logits are divided by ``t`` as in temperature scaling (Guo et
al. 2017; 2022 Sec. 5: "scaling the logits with a scalar T > 0"). This is the
authors' code (``github.com/tpopordanoska/proper-calibration-error``,
``src/synthetic_experiment.py``: ``temp_scale(scores, t) = inv_softmax(scores) / t``
with ``inv_softmax(x) = log(x) + log(10)``, then ``softmax``). ``t < 1`` sharpens
(moves mass towards the vertices), which is what both papers describe: t1 = 0.6 puts
the scores "along lower dimensional faces of the simplex" (2022 Sec. 4) and t1 = 0.9
makes them "closer to the boundaries of the simplex" (2024 Sec. 7.1). For K = 2,
``T_t(q)_1 = q^(1/t) / (q^(1/t) + (1 - q)^(1/t))``, the logistic form
``sigmoid(logit(q) / t)``. Temperatures compose: ``T_{t2}(T_{t1}(q)) = T_{t1 t2}(q)``.

Ground truth
------------
``q -> c -> f`` is a bijection of the open simplex (``c = T_{1/t2}(f)``), so
conditioning on ``f`` is conditioning on ``c``, and ``E[y | f] = c`` exactly: the
canonical calibration errors are plain expectations over ``c``, computed here by
Monte Carlo over fresh draws (no labels needed):

- ``CE_p = (E ||c - f||_p^p)^(1/p)`` (2022 Eq. 1; what :func:`kdecal.ece_kde` estimates);
- ``CE_KL = E sum_k c_k log(c_k / f_k)`` (2024 Eq. 10; :func:`kdecal.calibration_error`
  with ``divergence="kl"``);
- ``CE_2^2 = E ||c - f||_2^2`` (2024 Eq. 7; ``divergence="l2"``).

Class-wise (2024 App. D, Eq. 24 and 37) and top-label (2024 Eq. 25) calibration
condition on a *one-dimensional* statistic (``f_k``, or ``max_k f_k``), which for
K > 2 does not determine ``c``: ``E[1(y = k) | f_k] = E[c_k | f_k]`` is not ``c_k``.
These ground truths therefore need a regression on a large Monte Carlo sample; see
:func:`true_calibration_error` (they are approximate, with a small, documented bias).

References
----------
- T. Popordanoska, R. Sayer, M. B. Blaschko. "A Consistent and Differentiable
  L_p Canonical Calibration Error Estimator". NeurIPS 2022, Sec. 4 and Fig. 2a.
- T. Popordanoska, S. G. Gruber, A. Tiulpin, F. Buettner, M. B. Blaschko.
  "Consistent and Asymptotically Unbiased Estimation of Proper Calibration Errors".
  AISTATS 2024, Sec. 7.1, App. D and F.
- N. A. Smith, R. W. Tromble. "Sampling Uniformly from the Unit Simplex".
  Technical report, Johns Hopkins University, 2004.
- L. Ferrer, D. Ramos. "Evaluating Posterior Probabilities: Decision Theory,
  Proper Scoring Rules, and Calibration". TMLR 2025, Sec. 3 and App. C (the
  class-conditional Gaussian posteriors of :func:`make_gaussian_posteriors`).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from scipy.special import logsumexp

from ._numerics import ValueEq
from ._validation import check_int, check_p, check_seed

__all__ = [
    "GaussianPosteriors",
    "SyntheticSample",
    "calibration_error_of_sample",
    "make_gaussian_posteriors",
    "make_seeds_synthetic",
    "temperature_scale",
    "true_calibration_error",
]

_CALIBRATIONS = ("canonical", "classwise", "top_label")
_DIVERGENCES = ("kl", "l2")
#: Rows generated per Monte Carlo chunk (bounds the memory of the canonical ground truth).
_CHUNK = 1 << 16


# ----------------------------------------------------------------------------- checks


def _check_temperature(value: object, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite float > 0, got {value!r}")
    t = float(value)
    if not np.isfinite(t) or t <= 0:
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    return t


def _check_divergence(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in _DIVERGENCES:
        raise ValueError(f"divergence must be None, 'kl' or 'l2', got {value!r}")
    return value


def _check_calibration(value: object) -> str:
    if not isinstance(value, str) or value not in _CALIBRATIONS:
        raise ValueError(f"calibration must be one of {list(_CALIBRATIONS)}, got {value!r}")
    return value


def _check_n_bins(value: object) -> int | None:
    if value is None:
        return None
    return check_int(value, "n_bins", 1)


# ------------------------------------------------------------------------ primitives


def _temper_log(logq: np.ndarray, t: float) -> np.ndarray:
    """``log T_t(q)`` from ``log q``, rows of shape (n, K); ``-inf`` entries stay ``-inf``.

    Each row's largest ``log q`` is subtracted before the division: at small ``t`` the
    quotients are huge and tied maxima cancelled catastrophically in the log-sum-exp
    (rows summing to 2 at ``t = 1e-17``, NaN at ``t = 1e-310``); shifted, the maxima are
    exactly 0 and the limit is the uniform distribution over them.
    """
    m = np.max(logq, axis=1, keepdims=True)
    with np.errstate(over="ignore"):  # (log q - m) / t may be -inf: a 0 after exp
        z = (logq - m) / t
    return z - logsumexp(z, axis=1, keepdims=True)


def temperature_scale(probs: object, t: float) -> np.ndarray:
    """Temperature scaling of probability vectors, ``softmax(log(probs) / t)``.

    ``T_t(q)_k = q_k^(1/t) / sum_j q_j^(1/t)``: the convention of the seeds' synthetic
    protocol (module docstring). ``t < 1`` sharpens, ``t > 1`` flattens, ``t = 1`` is
    the identity; zero entries stay zero.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (K,), float
        Rows on the probability simplex (non-negative; each row is renormalised by the
        softmax, so only ratios matter).
    t : float
        Temperature, ``t > 0``.

    Returns
    -------
    ndarray, same shape as ``probs``, float64
        Tempered rows, each summing to 1 up to rounding.

    Raises
    ------
    TypeError
        ``t`` not a real number, or ``probs`` not numeric.
    ValueError
        ``t <= 0`` or not finite; ``probs`` negative, non-finite, a row of all zeros,
        or of a shape other than (n, K) / (K,).
    """
    t = _check_temperature(t, "t")
    arr = np.asarray(probs)
    if not (np.issubdtype(arr.dtype, np.number) and np.isrealobj(arr)):
        raise TypeError(f"probs must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim not in (1, 2) or arr.size == 0:
        raise ValueError(f"probs must have shape (n, K) or (K,), got shape {arr.shape}")
    a = np.atleast_2d(arr.astype(np.float64))
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError("probs must be finite and non-negative")
    if np.any(a.max(axis=1) <= 0):
        raise ValueError("probs has a row of all zeros")
    with np.errstate(divide="ignore"):
        out = np.exp(_temper_log(np.log(a), t))
    return out.reshape(arr.shape)


def _uniform_simplex_log(rng: np.random.Generator, n: int, K: int) -> np.ndarray:
    """``log q`` for ``n`` draws ``q ~ Uniform(simplex_K)``, shape (n, K).

    Normalised i.i.d. standard exponentials ``E_k / sum_j E_j``: the Dirichlet(1, ..., 1)
    law, i.e. the uniform distribution on the simplex -- the same distribution as the
    Kraemer algorithm (sorted uniform spacings) that the papers cite (Smith & Tromble 2004), whose
    spacings are exactly normalised exponentials. Working with ``log E`` keeps small
    coordinates at full relative precision (the spacings of sorted uniforms are
    quantised at 2^-53), which matters once ``1/t`` powers amplify them.
    """
    with np.errstate(divide="ignore"):  # E == 0 has probability ~2^-53 per entry
        logE = np.log(rng.standard_exponential((n, K)))
    return logE - logsumexp(logE, axis=1, keepdims=True)


def _categorical(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One label per row, ``P(label = k) = probs[i, k]`` (inverse CDF), int64 (n,)."""
    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]  # last entry exactly 1 > u: the label is always in 0..K-1
    u = rng.random((probs.shape[0],))
    return np.ascontiguousarray((cdf < u[:, None]).sum(axis=1), dtype=np.int64)


# --------------------------------------------------------------------------- sample


@dataclass(frozen=True, eq=False)
class SyntheticSample(ValueEq):
    """A sample of the seeds' synthetic protocol with its exact conditional expectation.

    Attributes
    ----------
    probs : ndarray, shape (n, K), float64, read-only
        The miscalibrated predictions ``f = T_{t2}(c)``; what estimators are given.
    labels : ndarray, shape (n,), int64, read-only
        Labels in ``0..K-1``, ``labels[i] ~ Categorical(calibrated[i])``.
    calibrated : ndarray, shape (n, K), float64, read-only
        ``c = T_{t1}(q)`` with ``q`` uniform on the simplex; equals ``E[y | f]`` (one-hot
        ``y``) exactly, because ``f -> c`` is invertible.
    t1 : float
        Temperature that made the calibrated scores (``c = T_{t1}(q)``).
    t2 : float
        Temperature of the miscalibration (``f = T_{t2}(c)``); ``t2 = 1`` is calibrated,
        ``t2 < 1`` over-confident, ``t2 > 1`` under-confident.

    Notes
    -----
    The arrays are made read-only so that ``calibrated`` stays the conditional
    expectation of ``probs``; copy them to modify.
    """

    probs: np.ndarray
    labels: np.ndarray
    calibrated: np.ndarray
    t1: float
    t2: float

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.labels.shape[0])

    @property
    def n_classes(self) -> int:
        """Number of classes K."""
        return int(self.probs.shape[1])


def make_seeds_synthetic(
    n: int,
    n_classes: int,
    *,
    t1: float = 0.6,
    t2: float = 0.6,
    seed: int | np.random.Generator | np.random.SeedSequence | None = None,
) -> SyntheticSample:
    """Draw a miscalibrated classifier with known ``E[y | f]`` (the seeds' protocol).

    ``q ~ Uniform(simplex)``, calibrated scores ``c = T_{t1}(q)``, labels
    ``y ~ Categorical(c)``, predictions ``f = T_{t2}(c)``, with
    ``T_t(q) = softmax(log(q) / t)`` (Popordanoska et al. 2022, Sec. 4, Fig. 2a: K = 4
    and 8, t1 = t2 = 0.6; Popordanoska et al. 2024, Sec. 7.1: t1 = 0.9, t2 = 0.6). See
    the module docstring for the temperature convention.

    Parameters
    ----------
    n : int
        Number of samples, ``n >= 1``.
    n_classes : int
        Number of classes K, ``K >= 2``.
    t1 : float, default 0.6
        Temperature applied to the uniform simplex sample, ``t1 > 0``; ``t1 < 1`` pushes
        the scores towards the faces of the simplex.
    t2 : float, default 0.6
        Temperature of the miscalibration, ``t2 > 0``; ``t2 = 1`` gives a calibrated
        classifier (``probs == calibrated`` up to rounding).
    seed : int, numpy Generator, SeedSequence or None, default None
        Passed to :func:`numpy.random.default_rng`; the same integer gives the same
        sample. Draw order: the n x K simplex sample, then n uniforms for the labels.

    Returns
    -------
    SyntheticSample
        ``probs`` (n, K) float64, ``labels`` (n,) int64, ``calibrated`` (n, K) float64,
        ``t1``, ``t2``.

    Raises
    ------
    TypeError
        ``n`` or ``n_classes`` not an integer, ``t1`` or ``t2`` not a real number.
    ValueError
        ``n < 1``, ``n_classes < 2``, ``t1 <= 0`` or ``t2 <= 0`` (message names the
        argument).

    Examples
    --------
    >>> from kdecal.datasets import make_seeds_synthetic, true_calibration_error
    >>> s = make_seeds_synthetic(3000, 4, seed=0)
    >>> s.probs.shape, s.labels.dtype
    ((3000, 4), dtype('int64'))
    """
    n = check_int(n, "n", 1)
    K = check_int(n_classes, "n_classes", 2)
    t1 = _check_temperature(t1, "t1")
    t2 = _check_temperature(t2, "t2")
    rng = check_seed(seed)
    logc = _temper_log(_uniform_simplex_log(rng, n, K), t1)
    c = np.exp(logc)
    labels = _categorical(rng, c)
    f = np.exp(_temper_log(logc, t2))
    for a in (c, f, labels):
        a.setflags(write=False)
    return SyntheticSample(probs=f, labels=labels, calibrated=c, t1=t1, t2=t2)


# ------------------------------------------------------------------ ground truths


def _canonical_terms(
    c: np.ndarray, f: np.ndarray, logc: np.ndarray, logf: np.ndarray, p: float, div: str | None
) -> np.ndarray:
    """Per-row terms whose mean is ``CE_p^p``, ``CE_KL`` or ``CE_2^2``: shape (n,)."""
    if div is None:
        return np.sum(np.abs(c - f) ** p, axis=1)
    if div == "l2":
        return np.sum((c - f) ** 2, axis=1)
    with np.errstate(invalid="ignore"):  # (-inf) - (-inf) where c == 0: masked below
        kl = np.where(c > 0, c * (logc - logf), 0.0)
    return np.sum(kl, axis=1)


def _binary_terms(
    m: np.ndarray, s: np.ndarray, log_s: np.ndarray, log_1ms: np.ndarray, p: float, div: str | None
) -> np.ndarray:
    """``|m - s|^p``, ``(m - s)^2`` or binary ``KL(m || s)``, elementwise."""
    if div is None:
        return np.abs(m - s) ** p
    if div == "l2":
        return (m - s) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(m > 0, m * (np.log(m) - log_s), 0.0)
        b = np.where(m < 1, (1.0 - m) * (np.log1p(-m) - log_1ms), 0.0)
    return a + b


def _one_dim_pairs(
    c: np.ndarray, f: np.ndarray, logc: np.ndarray, logf: np.ndarray, calibration: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(s, log s, log(1 - s), z)`` for the 1-D conditioning, shapes (n, K) or (n, 1).

    classwise: ``s = f_k``, ``z = c_k`` for every k; top_label: ``s = max_k f_k``,
    ``z = c_{argmax f}``. ``log(1 - s)`` is computed without cancellation (as the
    log-sum of the other coordinates where ``s`` is the row maximum).
    """
    n = f.shape[0]
    rows = np.arange(n)
    amax = np.argmax(logf, axis=1)
    masked = logf.copy()
    masked[rows, amax] = -np.inf
    log_rest = logsumexp(masked, axis=1)  # log(1 - max_k f_k)
    if calibration == "top_label":
        s = f[rows, amax][:, None]
        log_s = logf[rows, amax][:, None]
        log_1ms = log_rest[:, None]
        z = c[rows, amax][:, None]
        return s, log_s, log_1ms, z
    # non-maximal coordinates: 1 - f_k >= max_j f_j >= 1/K, no cancellation
    with np.errstate(divide="ignore"):  # f == 1 only at the maximum, overwritten next
        log_1ms = np.log1p(-f)
    log_1ms[rows, amax] = log_rest
    return f, logf, log_1ms, c


def _binned_regression(s: np.ndarray, z: np.ndarray, n_bins: int) -> np.ndarray:
    """Estimate ``E[z | s]`` at every ``s``: local-linear fits in equal-count bins of ``s``.

    1-D arrays of equal length N; returns an array of length N in the input order,
    clipped to [0, 1].
    """
    N = s.shape[0]
    B = max(1, min(n_bins, N // 2 if N >= 2 else 1))
    order = np.argsort(s, kind="stable")
    ss, zs = s[order], z[order]
    starts = np.linspace(0, N, B + 1).astype(np.int64)[:-1]
    counts = np.diff(np.append(starts, N))
    bin_id = np.repeat(np.arange(B), counts)
    s_bar = np.add.reduceat(ss, starts) / counts
    z_bar = np.add.reduceat(zs, starts) / counts
    ds = ss - s_bar[bin_id]
    sxx = np.add.reduceat(ds * ds, starts)
    sxz = np.add.reduceat(ds * (zs - z_bar[bin_id]), starts)
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.where(sxx > 0, sxz / sxx, 0.0)
    m_sorted = np.clip(z_bar[bin_id] + beta[bin_id] * ds, 0.0, 1.0)
    m = np.empty_like(m_sorted)
    m[order] = m_sorted
    return m


def _default_bins(N: int) -> int:
    """``round(2 N^(1/3))``: balances the O(B^-2) binning bias and the O(B / N) noise."""
    return max(1, round(2.0 * N ** (1.0 / 3.0)))


def _estimate(
    c: np.ndarray,
    f: np.ndarray,
    logc: np.ndarray,
    logf: np.ndarray,
    *,
    p: float,
    div: str | None,
    calibration: str,
    n_bins: int | None,
) -> tuple[float, float]:
    """Plug-in calibration error and its standard error from rows (c, f)."""
    if calibration == "canonical":
        X = _canonical_terms(c, f, logc, logf, p, div)
    else:
        s, log_s, log_1ms, z = _one_dim_pairs(c, f, logc, logf, calibration)
        N = s.size
        B = n_bins if n_bins is not None else _default_bins(N)
        m = _binned_regression(s.ravel(), z.ravel(), B).reshape(s.shape)
        # per-row mean over the classes (classwise) keeps rows independent for the SE
        X = _binary_terms(m, s, log_s, log_1ms, p, div).mean(axis=1)
    return _finish(float(np.mean(X)), float(np.var(X)), X.shape[0], p, div)


def _finish(mean: float, var: float, n: int, p: float, div: str | None) -> tuple[float, float]:
    """Value and delta-method standard error of ``mean`` (or of ``mean^(1/p)``)."""
    se = float(np.sqrt(max(var, 0.0) / n))
    if div is None and p != 1.0:
        value = mean ** (1.0 / p)
        se = se * value / (p * mean) if mean > 0 else 0.0
        return value, se
    return mean, se


def true_calibration_error(
    n_classes: int,
    *,
    t1: float = 0.6,
    t2: float = 0.6,
    p: float = 1,
    divergence: str | None = None,
    calibration: str = "canonical",
    n_mc: int = 10**6,
    seed: int | np.random.Generator | np.random.SeedSequence | None = 0,
    n_bins: int | None = None,
    return_se: bool = False,
) -> float | tuple[float, float]:
    """Ground-truth calibration error of the seeds' synthetic protocol, by Monte Carlo.

    Draws ``n_mc`` fresh calibrated vectors ``c = T_{t1}(q)``, ``q`` uniform on the
    simplex, sets ``f = T_{t2}(c)`` (exactly as :func:`make_seeds_synthetic`; no labels
    are needed because ``E[y | f] = c``) and averages, in log space (no underflow):

    - ``divergence=None``: ``CE_p = (E ||c - f||_p^p)^(1/p)``, the quantity
      :func:`kdecal.ece_kde` estimates (Popordanoska et al. 2022, Eq. 1 and 9);
    - ``"kl"``: ``CE_KL = E sum_k c_k log(c_k / f_k)`` (nats; 2024 Eq. 10);
    - ``"l2"``: ``CE_2^2 = E ||c - f||_2^2`` (squared probability units; 2024 Eq. 7);
      both as :func:`kdecal.calibration_error` estimates them.

    ``calibration="canonical"`` is exact up to Monte Carlo error. For
    ``"classwise"`` (2024 Eq. 24, and App. D Eq. 37 with the binary generators
    ``F(q) = q^2`` for "l2" and ``q log q + (1 - q) log(1 - q)`` for "kl") and
    ``"top_label"`` (2024 Eq. 25, same binary generators) the conditional expectation
    is given the one-dimensional ``s = f_k`` (resp. ``s = max_k f_k``), which for K > 2
    does **not** determine ``c``: ``E[1(y = k) | f_k] = E[c_k | f_k] != c_k``. It is
    estimated by local-linear regression of ``z = c_k`` (resp. ``c_{argmax f}``) on
    ``s`` in ``n_bins`` equal-count bins of the Monte Carlo sample (all K classes
    pooled for classwise, which is valid because the protocol is exchangeable in the
    classes), and the per-class binary terms ``|m - s|^p``, ``(m - s)^2`` or
    ``KL(m || s)`` are averaged (over classes, then samples). These two are
    **approximate**: binning bias O(n_bins^-2) plus a noise bias of order
    ``Var(z | s) * n_bins / N`` (N pairs; upward for "l2"/"kl"). At the defaults
    (n_mc = 10**6, t1 = t2 = 0.6) the values move by less than 2e-4 relative between
    the default n_bins and n_bins = 1000 for K = 4 and 8, and for K = 2 (where ``f_1``
    determines ``c``, so the exact value is a 1-D integral) they match quadrature
    within the Monte Carlo error. Special case: for ``p = 1`` top-label with
    ``t2 < 1`` (resp. ``> 1``), ``f_max >= c_max`` (resp. ``<=``) on every row, so
    ``TCE_1 = |E[f_max - c_max]|`` exactly and the regression reproduces it.

    Parameters
    ----------
    n_classes : int
        Number of classes K, ``K >= 2``.
    t1, t2 : float, default 0.6
        Temperatures of the protocol (see :func:`make_seeds_synthetic`), ``> 0``.
    p : float, default 1
        Order of the L_p calibration error, ``p >= 1``; used only when
        ``divergence`` is None.
    divergence : {None, "kl", "l2"}, default None
        None: the L_p error ``CE_p``; "kl" or "l2": the proper calibration error of that
        Bregman divergence (``p`` is then ignored).
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"
        Notion of calibration (see above).
    n_mc : int, default 10**6
        Monte Carlo sample size, ``n_mc >= 1``. Canonical memory is O(min(n_mc, 65536)
        K); classwise holds about 5 float64 arrays of n_mc x K (200 MB at
        n_mc = 10**6, K = 5).
    seed : int, numpy Generator, SeedSequence or None, default 0
        Passed to :func:`numpy.random.default_rng`. The draws are those of
        ``make_seeds_synthetic(n_mc, n_classes, seed=seed).calibrated`` (without the
        labels), generated in chunks of 65536 rows.
    n_bins : int, optional
        Bins of the classwise / top-label regression; default ``round(2 N^(1/3))`` with
        N the number of (s, z) pairs (``n_mc * K`` classwise, ``n_mc`` top-label).
        Ignored for "canonical".
    return_se : bool, default False
        Also return the Monte Carlo standard error.

    Returns
    -------
    float or (float, float)
        The calibration error -- ``CE_p`` in probability units (a fraction in
        ``[0, 2^(1/p)]``), ``CE_KL`` in nats, ``CE_2^2`` in squared probability units --
        and, with ``return_se=True``, its Monte Carlo standard error
        (``sd / sqrt(n_mc)``, delta method for the p-th root; for classwise /
        top-label it treats the fitted regression as fixed and excludes the binning
        bias).

    Raises
    ------
    TypeError
        Non-integer ``n_classes``, ``n_mc`` or ``n_bins``; non-real ``t1``, ``t2``, ``p``.
    ValueError
        ``n_classes < 2``, ``t1 <= 0``, ``t2 <= 0``, ``p < 1``, unknown ``divergence``
        or ``calibration``, ``n_mc < 1``, ``n_bins < 1`` (message names the argument).

    Notes
    -----
    The authors' code (``proper-calibration-error/src/synthetic_experiment.py``,
    ``get_*_gt_integral(..., 'classwise')``) computes the class-wise ground truth with
    ``c_k`` in place of ``E[c_k | f_k]``, i.e. conditioning on the whole vector ``f``;
    by Jensen's inequality that is an upper bound of the class-wise error for K > 2
    (equal for K = 2), and its "l2" uses the two-vector ``(1 - q, q)``, which doubles
    it relative to ``F(q) = q^2``.

    Examples
    --------
    >>> from kdecal.datasets import true_calibration_error
    >>> ce, se = true_calibration_error(4, n_mc=10**5, return_se=True)
    >>> 0 < ce < 1 and se < 0.01 * ce
    True
    """
    K = check_int(n_classes, "n_classes", 2)
    t1 = _check_temperature(t1, "t1")
    t2 = _check_temperature(t2, "t2")
    p = check_p(p)
    div = _check_divergence(divergence)
    calibration = _check_calibration(calibration)
    n_mc = check_int(n_mc, "n_mc", 1)
    n_bins = _check_n_bins(n_bins)
    rng = check_seed(seed)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        left = n_mc
        while left > 0:
            m = min(_CHUNK, left)
            left -= m
            logc = _temper_log(_uniform_simplex_log(rng, m, K), t1)
            logf = _temper_log(logc, t2)
            yield np.exp(logc), np.exp(logf), logc, logf

    if calibration == "canonical":
        count, mean, m2 = 0, 0.0, 0.0  # running mean and sum of squared deviations
        for c, f, logc, logf in chunks():
            X = _canonical_terms(c, f, logc, logf, p, div)
            k, mk = X.shape[0], float(np.mean(X))
            m2k = float(np.sum((X - mk) ** 2))
            delta = mk - mean
            m2 += m2k + delta * delta * count * k / (count + k)
            mean += delta * k / (count + k)
            count += k
        value, se = _finish(mean, m2 / count, count, p, div)
    else:
        parts = [_one_dim_pairs(*ch, calibration) for ch in chunks()]
        s, log_s, log_1ms, z = (np.concatenate(a, axis=0) for a in zip(*parts))
        del parts
        B = n_bins if n_bins is not None else _default_bins(s.size)
        m = _binned_regression(s.ravel(), z.ravel(), B).reshape(s.shape)
        X = _binary_terms(m, s, log_s, log_1ms, p, div).mean(axis=1)
        value, se = _finish(float(np.mean(X)), float(np.var(X)), n_mc, p, div)
    return (value, se) if return_se else value


def calibration_error_of_sample(
    sample: SyntheticSample,
    *,
    p: float = 1,
    divergence: str | None = None,
    calibration: str = "canonical",
    n_bins: int | None = None,
    return_se: bool = False,
) -> float | tuple[float, float]:
    """Calibration error of a given sample, with its exact ``E[y | f]`` (oracle plug-in).

    The same plug-in as :func:`true_calibration_error`, averaged over the rows of
    ``sample`` with ``E[y | f_i] = sample.calibrated[i]`` instead of over fresh draws:
    the value a kernel estimator would reach on this sample if it knew ``E[y | f]``
    exactly (the labels are not used). For "classwise" and "top_label" the 1-D
    conditional expectation is re-estimated by binned regression on this sample, which
    is only as good as the sample is large (see :func:`true_calibration_error`).

    Parameters
    ----------
    sample : SyntheticSample
        From :func:`make_seeds_synthetic`.
    p, divergence, calibration, n_bins, return_se
        As in :func:`true_calibration_error`.

    Returns
    -------
    float or (float, float)
        The calibration error (units as in :func:`true_calibration_error`) and, with
        ``return_se=True``, the standard error of the sample mean.

    Raises
    ------
    TypeError
        ``sample`` is not a :class:`SyntheticSample`; non-real ``p``.
    ValueError
        ``p < 1``, unknown ``divergence`` or ``calibration``, ``n_bins < 1``.

    Notes
    -----
    Works on the stored float64 arrays (``log`` of them for "kl"): an entry of
    ``probs`` that underflowed to 0 where ``calibrated`` is positive -- possible only
    for extreme temperatures -- gives ``inf`` for "kl", whereas
    :func:`true_calibration_error` works in log space throughout.
    """
    if not isinstance(sample, SyntheticSample):
        raise TypeError(f"sample must be a SyntheticSample, got {type(sample).__name__}")
    p = check_p(p)
    div = _check_divergence(divergence)
    calibration = _check_calibration(calibration)
    n_bins = _check_n_bins(n_bins)
    c = np.asarray(sample.calibrated, dtype=np.float64)
    f = np.asarray(sample.probs, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logc, logf = np.log(c), np.log(f)
    value, se = _estimate(c, f, logc, logf, p=p, div=div, calibration=calibration, n_bins=n_bins)
    return (value, se) if return_se else value


# ------------------------------------------------- Ferrer & Ramos Gaussian posteriors

#: Names of the four systems of :func:`make_gaussian_posteriors` (Ferrer & Ramos 2025,
#: Sec. 3, App. C).
GAUSSIAN_SYSTEMS = ("cal", "mcp", "mcs", "mcps")


def _check_open_unit(value: object, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float in (0, 1), got {value!r}")
    v = float(value)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")
    return v


@dataclass(frozen=True, eq=False)
class GaussianPosteriors(ValueEq):
    """Posteriors of the class-conditional Gaussian model of Ferrer & Ramos (2025, App. C).

    Attributes
    ----------
    labels : ndarray, shape (n,), int64, read-only
        True classes in ``0..K-1``, sorted (all class-0 samples first, then class 1, ...).
    features : ndarray, shape (n, K), float64, read-only
        The Gaussian inputs ``x ~ N(mu_i, var I)``, ``mu_i = sqrt(1/2) e_i``.
    log_posteriors : mapping str -> ndarray (n, K) float64, read-only
        Natural-log posteriors (rows log-sum-exp to 0) of the four systems ``"cal"``,
        ``"mcp"``, ``"mcs"`` and ``"mcps"`` (see :func:`make_gaussian_posteriors`).
        Prefer these to ``probs`` for log losses: the overconfident systems have
        posteriors that underflow in linear space.
    priors : ndarray, shape (K,), float64, read-only
        The data priors ``(P_1, (1 - P_1)/(K - 1), ...)`` used by ``"cal"`` and ``"mcs"``.
    mismatched_priors : ndarray, shape (K,), float64, read-only
        ``((1 - P_m)/(K - 1), ..., P_m)`` used by ``"mcp"`` and ``"mcps"``.
    counts : ndarray, shape (K,), int64, read-only
        Samples per class, ``counts.sum() == n``.
    var : float
        Variance of every feature (the paper's sigma; covariance ``var * I``).
    scale : float
        The factor of the log-posteriors of ``"mcs"`` and ``"mcps"``.
    """

    labels: np.ndarray
    features: np.ndarray
    log_posteriors: Mapping[str, np.ndarray]
    priors: np.ndarray
    mismatched_priors: np.ndarray
    counts: np.ndarray
    var: float
    scale: float

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.labels.shape[0])

    @property
    def n_classes(self) -> int:
        """Number of classes K."""
        return int(self.priors.shape[0])

    def probs(self, system: str) -> np.ndarray:
        """Posterior probabilities of one system, ``exp(log_posteriors[system])``.

        Parameters
        ----------
        system : {"cal", "mcp", "mcs", "mcps"}
            Which system.

        Returns
        -------
        ndarray, shape (n, K), float64
            Rows on the simplex (entries may underflow to 0 for the scaled systems).

        Raises
        ------
        ValueError
            Unknown ``system``.
        """
        if not isinstance(system, str) or system not in GAUSSIAN_SYSTEMS:
            raise ValueError(f"system must be one of {list(GAUSSIAN_SYSTEMS)}, got {system!r}")
        return np.exp(self.log_posteriors[system])


#: Largest feature variance of :func:`make_gaussian_posteriors` (squared distances of
#: features that large overflow float64).
_MAX_VAR = 1e100


def make_gaussian_posteriors(
    n: int,
    n_classes: int = 2,
    *,
    prior1: float = 0.8,
    var: float = 0.15,
    mismatch_prior: float = 0.9,
    scale: float = 5.0,
    seed: int | np.random.Generator | np.random.SeedSequence | None = 0,
    rng: str | np.random.RandomState = "generator",
) -> GaussianPosteriors:
    """Calibrated and miscalibrated posteriors of a Gaussian model (Ferrer & Ramos, App. C).

    The synthetic data of Ferrer & Ramos 2025 (Sec. 3 and App. C; Fig. 4-8 and Table 1):

    1. class priors ``P = (P_1, (1 - P_1)/(K - 1), ..., (1 - P_1)/(K - 1))``;
    2. ``N_i`` samples of class i, ``x ~ N(mu_i, var I)`` in K dimensions, with
       ``mu_i = sqrt(1/2) e_i`` so that the class means are equidistant at L2 distance 1
       (Ferrer & Ramos 2025, Sec. 3; App. C writes one-hot means, distance sqrt(2), but
       the authors' code, which produced the figures and tables, uses ``sqrt(1/2) e_i``);
    3. the exact log-likelihoods ``log N(x; mu_i, var I)`` and Bayes' rule (Ferrer &
       Ramos 2025, Eq. 38) with the data priors give ``"cal"``, the optimal and perfectly calibrated
       classifier; with the mismatched priors ``((1 - P_m)/(K - 1), ..., P_m)`` (the
       large prior moved to the *last* class) they give ``"mcp"``;
    4. ``"mcs"`` and ``"mcps"`` scale the log-posteriors of ``"cal"`` and ``"mcp"`` by
       ``scale`` and renormalise, ``softmax(scale * log q)`` (``scale > 1``:
       overconfident).

    Affine (DP) calibration, ``softmax(alpha log q + beta)``, undoes every one of the
    three miscalibrations exactly (``alpha = 1/scale``, ``beta = log P - log P_m``);
    temperature scaling only undoes the scaling.

    Parameters
    ----------
    n : int
        Requested number of samples, ``n >= 1``. The class counts are the closest
        integers to ``P_i n`` (``rng="generator"``) or ``int(P_i n)`` (``"legacy"``, as in
        the authors' code), so the total may differ slightly from ``n``: see ``counts``.
    n_classes : int, default 2
        Number of classes K, ``K >= 2`` (also the feature dimension).
    prior1 : float, default 0.8
        Prior of the first class, in (0, 1); the others share ``1 - prior1`` equally.
    var : float, default 0.15
        Variance of each feature (the paper's sigma; 0.15 for the binary experiments and
        Table 1, 0.08 for the 10-class Fig. 6). Larger is harder.
    mismatch_prior : float, default 0.9
        Prior of the last class in the mismatched prior vector of ``"mcp"``/``"mcps"``,
        in (0, 1).
    scale : float, default 5.0
        Factor of the log-posteriors for ``"mcs"``/``"mcps"``, finite and ``> 0``.
    seed : int, Generator, SeedSequence or None, default 0
        With ``rng="generator"``: passed to :func:`numpy.random.default_rng`. With
        ``rng="legacy"``: an int (or None) for :class:`numpy.random.RandomState`.
        Ignored when ``rng`` is a ``RandomState``.
    rng : {"generator", "legacy"} or numpy.random.RandomState, default "generator"
        ``"generator"``: numpy's ``Generator``, ``x = mu_i + sqrt(var) z``, rounded
        counts. ``"legacy"``: the exact draws of the authors' code
        (``expected_cost/data.py``, ``np.random.seed(seed)`` then, class by class in
        order, ``scipy.stats.multivariate_normal.rvs(mu_i, var I, N_i)``) with
        ``np.random.RandomState(seed)`` instead of the global state, and truncated
        counts ``int(P_i n)`` (so 0.8/0.2 with n = 2000 gives 1600/399). A
        ``RandomState`` instance runs the legacy path on that state and leaves it
        advanced, so that later consumers (e.g. the cross-validation folds of
        :func:`kdecal.scores.calibration_loss` with ``seed=`` that state) continue the
        stream as the authors' global RNG did.

    Returns
    -------
    GaussianPosteriors
        Labels, features, the log-posteriors of ``"cal"``, ``"mcp"``, ``"mcs"``,
        ``"mcps"``, the two prior vectors, the class counts, ``var`` and ``scale``.

    Raises
    ------
    TypeError
        Non-integer ``n`` or ``n_classes``; non-real ``prior1``, ``var``,
        ``mismatch_prior`` or ``scale``; ``rng`` of another type.
    ValueError
        ``n < 1``, ``n_classes < 2``, ``prior1`` or ``mismatch_prior`` outside (0, 1),
        ``var <= 0`` or above 1e100, ``scale <= 0``, non-finite values, unknown ``rng`` string, or an
        ``n`` so small that some class gets no sample.

    Notes
    -----
    The log-likelihoods are computed in closed form, ``-||x - mu_i||^2 / (2 var)``
    (the normalising constant is common to all classes and cancels in Bayes' rule);
    the authors' code takes ``log(pdf)``, which agrees to rounding. Samples are
    ordered by class, as in the authors' code.

    Examples
    --------
    >>> from kdecal.datasets import make_gaussian_posteriors
    >>> g = make_gaussian_posteriors(2000, rng="legacy")   # Ferrer & Ramos 2025 Table 1, N = 2000
    >>> g.counts.tolist(), g.log_posteriors["cal"].shape
    ([1600, 399], (1999, 2))
    """
    n = check_int(n, "n", 1)
    K = check_int(n_classes, "n_classes", 2)
    prior1 = _check_open_unit(prior1, "prior1")
    mismatch_prior = _check_open_unit(mismatch_prior, "mismatch_prior")
    var = _check_temperature(var, "var")
    if var > _MAX_VAR:  # squared distances overflowed: NaN log-posteriors (var = 1e308)
        raise ValueError(
            f"var must be at most {_MAX_VAR:g} (the posteriors are the priors long before), "
            f"got {var!r}"
        )
    scale = _check_temperature(scale, "scale")
    legacy_state: np.random.RandomState | None
    if isinstance(rng, np.random.RandomState):
        legacy_state = rng
    elif rng == "legacy":
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None with rng='legacy', got {seed!r}")
        legacy_state = np.random.RandomState(None if seed is None else int(seed))
    elif rng == "generator":
        legacy_state = None
    elif isinstance(rng, str):
        raise ValueError(f"rng must be 'generator', 'legacy' or a RandomState, got {rng!r}")
    else:
        raise TypeError(
            f"rng must be 'generator', 'legacy' or a numpy RandomState, got {type(rng).__name__}"
        )

    priors = np.array([prior1] + [(1.0 - prior1) / (K - 1)] * (K - 1))
    mism = np.array([(1.0 - mismatch_prior) / (K - 1)] * (K - 1) + [mismatch_prior])
    if legacy_state is not None:
        # truncation, as the authors' code does
        counts = np.array(priors * n, dtype=int).astype(np.int64)
    else:
        counts = np.rint(priors * n).astype(np.int64)
    if np.any(counts < 1):
        i = int(np.argmin(counts))
        raise ValueError(
            f"n = {n} is too small: class {i} (prior {priors[i]:.4g}) gets {counts[i]} samples"
        )
    means = np.sqrt(0.5) * np.eye(K)
    if legacy_state is not None:
        from scipy.stats import multivariate_normal

        cov = var * np.eye(K)
        blocks = [
            np.asarray(
                multivariate_normal.rvs(means[i], cov, int(counts[i]), random_state=legacy_state),
                dtype=np.float64,
            ).reshape(int(counts[i]), K)
            for i in range(K)
        ]
    else:
        gen = check_seed(seed)
        blocks = [
            means[i] + np.sqrt(var) * gen.standard_normal((int(counts[i]), K)) for i in range(K)
        ]
    X = np.ascontiguousarray(np.concatenate(blocks, axis=0))
    labels = np.repeat(np.arange(K, dtype=np.int64), counts)
    # log N(x; mu_i, var I) up to the class-independent constant
    sq = (
        np.sum(X * X, axis=1, keepdims=True)
        - 2.0 * (X @ means.T)
        + np.sum(means * means, axis=1)[None, :]
    )
    llk = -0.5 * sq / var

    def _logsoftmax(z: np.ndarray) -> np.ndarray:
        return z - logsumexp(z, axis=1, keepdims=True)

    cal = _logsoftmax(llk + np.log(priors))
    mcp = _logsoftmax(llk + np.log(mism))
    logpost = {"cal": cal, "mcp": mcp, "mcs": _logsoftmax(scale * cal)}
    logpost["mcps"] = _logsoftmax(scale * mcp)
    for a in (X, labels, priors, mism, counts, *logpost.values()):
        a.setflags(write=False)
    return GaussianPosteriors(
        labels=labels,
        features=X,
        log_posteriors=MappingProxyType(logpost),
        priors=priors,
        mismatched_priors=mism,
        counts=counts,
        var=var,
        scale=scale,
    )
