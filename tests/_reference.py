"""Independent float64 brute-force reference for the public kdecal API.

Written directly from the formulas of the kdecal spec (issue 2), WITHOUT importing
kdecal.  Everything is computed in float64 from an explicit n x n matrix of log
kernel values (small n only: n <= ~500), using scipy.special.gammaln and
scipy.special.logsumexp.  Leave-one-out is done by putting -inf on the diagonal.

Conventions (spec):
  * probs (n, K) on the simplex, or (n,) = P(y=1) meaning (1-p, p);
  * P~ = max(P, EPS) / rowsum(max(P, EPS)), EPS = 1e-12, used everywhere;
  * Dirichlet kernel centred at f_i evaluated at f_j:
      log k_ij = lgamma(1/h + K) - sum_k lgamma(P~_ik/h + 1) + (1/h) sum_k P~_ik log P~_jk
  * E_hat[y | f_j]_c = sum_{i != j, y_i = c} k_ij / sum_{i != j} k_ij
  * log p_hat(f_j) = log( sum_{i != j} k_ij / (n - 1) )
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
from scipy.special import gammaln, logsumexp

EPS = 1e-12
ROW_SUM_ATOL = 1e-3
DEFAULT_GRID = np.concatenate([np.logspace(-5, -1, 50), [0.2, 0.4, 0.6, 0.8, 1.0]])
N_BINS = 15


# --------------------------------------------------------------------------- basics
def ref_softmax(logits, axis=-1):
    x = np.asarray(logits, dtype=np.float64)
    return np.exp(x - logsumexp(x, axis=axis, keepdims=True))


def ref_clip(probs):
    """EPS clip + row renormalisation, float64; binary (n,) -> (n, 2)."""
    P = np.asarray(probs, dtype=np.float64)
    if P.ndim == 1:
        P = np.stack([1.0 - P, P], axis=1)
    P = np.maximum(P, EPS)
    return P / P.sum(axis=1, keepdims=True)


def ref_one_hot(labels, K):
    labels = np.asarray(labels).astype(np.int64)
    Y = np.zeros((labels.shape[0], K))
    Y[np.arange(labels.shape[0]), labels] = 1.0
    return Y


def ref_log_kernel(P, h, *, include_constant=True):
    """Full n x n matrix A[i, j] = log k_h(centre f_i, query f_j), diagonal = -inf.

    P must already be clipped (P~).  The constant lgamma(1/h + K) cancels in every
    ratio (conditional expectation); it is only needed for the density itself, so
    it can be left out to avoid adding rounding noise of size ~ eps * lgamma(1/h+K).
    """
    K = P.shape[1]
    h = float(h)
    bias = -gammaln(P / h + 1.0).sum(axis=1)  # (n,), per centre i
    G = P @ np.log(P).T  # G[i, j] = sum_k P~_ik log P~_jk
    A = bias[:, None] + G / h
    if include_constant:
        A = A + gammaln(1.0 / h + K)
    np.fill_diagonal(A, -np.inf)  # leave-one-out
    return A


# ------------------------------------------------------------------- bandwidth selection
_LL_CACHE: OrderedDict[tuple, np.ndarray] = OrderedDict()


def ref_loo_log_likelihood(probs, bandwidths):
    """mean_j log p_hat(f_j) for each bandwidth (no -log h term).  Memoised."""
    P = np.asarray(probs, dtype=np.float64)
    hs = np.atleast_1d(np.asarray(bandwidths, dtype=np.float64))
    key = (P.shape, hashlib.sha1(P.tobytes()).hexdigest(), hs.tobytes())
    if key not in _LL_CACHE:
        _LL_CACHE[key] = _loo_log_likelihood_uncached(P, hs)
        if len(_LL_CACHE) > 128:
            _LL_CACHE.popitem(last=False)
    return _LL_CACHE[key].copy()


def _loo_log_likelihood_uncached(probs, bandwidths):
    P = ref_clip(probs)
    n = P.shape[0]
    out = []
    for h in bandwidths:
        A = ref_log_kernel(P, h, include_constant=True)
        log_p_hat = logsumexp(A, axis=0) - np.log(n - 1)  # sum over centres i (axis 0)
        out.append(log_p_hat.mean())
    return np.array(out)


_BW_CACHE: dict = {}


def ref_select_bandwidth(probs, grid=None):
    """grid[argmax loo_log_likelihood] (first maximum); default grid memoised."""
    if grid is None:
        P = np.asarray(probs, dtype=np.float64)
        key = (P.shape, hashlib.sha1(P.tobytes()).hexdigest())
        if key not in _BW_CACHE:
            _BW_CACHE[key] = ref_select_bandwidth(P, DEFAULT_GRID)
        return _BW_CACHE[key]
    grid = np.asarray(grid, dtype=np.float64)
    ll = ref_loo_log_likelihood(probs, grid)
    return float(grid[int(np.argmax(ll))])


def _resolve_bandwidth(probs, bandwidth):
    if isinstance(bandwidth, str):
        assert bandwidth == "auto"
        return ref_select_bandwidth(probs)
    return float(bandwidth)


# --------------------------------------------------------------- conditional expectation
_E_CACHE: OrderedDict[tuple, np.ndarray] = OrderedDict()
_E_CACHE_MAX = 64


def ref_conditional_expectation(probs, labels, bandwidth):
    """E_hat[y | f_j]_c, (n, K) float64, leave-one-out, per-class logsumexp.

    Memoised on the exact input bytes (only to keep the test suite fast: many
    tests ask for several estimators on the same data and bandwidth).
    """
    h = _resolve_bandwidth(probs, bandwidth)
    P = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels).astype(np.int64)
    key = (
        P.shape,
        hashlib.sha1(P.tobytes()).hexdigest(),
        hashlib.sha1(y.tobytes()).hexdigest(),
        h,
    )
    if key not in _E_CACHE:
        _E_CACHE[key] = _conditional_expectation_uncached(P, y, h)
        if len(_E_CACHE) > _E_CACHE_MAX:
            _E_CACHE.popitem(last=False)
    return _E_CACHE[key].copy()


def _conditional_expectation_uncached(probs, labels, h):
    P = ref_clip(probs)
    n, K = P.shape
    A = ref_log_kernel(P, h, include_constant=False)
    log_num = np.full((n, K), -np.inf)
    for c in range(K):
        members = labels == c
        if members.any():
            log_num[:, c] = logsumexp(A[members, :], axis=0)  # over centres of class c
    # normalise after subtracting the row max (exact row sums up to rounding)
    W = np.exp(log_num - log_num.max(axis=1, keepdims=True))
    return W / W.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------- divergences
def _xlogx_sum(X):
    X = np.asarray(X, dtype=np.float64)
    safe = np.where(X > 0, X, 1.0)
    return np.where(X > 0, X * np.log(safe), 0.0).sum(axis=-1)  # 0 log 0 = 0


def _F(divergence, X):
    """Convex generator F applied row-wise, (m, K) -> (m,)."""
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    if isinstance(divergence, str):
        if divergence == "kl":
            return _xlogx_sum(X)
        if divergence == "l2":
            return (X * X).sum(axis=1)
        raise ValueError(divergence)
    F, _ = divergence
    return np.asarray(F(X), dtype=np.float64)


def _bregman(divergence, A, B):
    """Row-wise D_F(a, b) = F(a) - F(b) - <gradF(b), a - b>."""
    if isinstance(divergence, str):
        if divergence == "kl":
            # sum_c a log(a / b), 0 log 0 = 0 (b > 0 always: P~ >= EPS)
            safe = np.where(A > 0, A, 1.0)
            return np.where(A > 0, A * (np.log(safe) - np.log(B)), 0.0).sum(axis=1)
        if divergence == "l2":
            return ((A - B) ** 2).sum(axis=1)
        raise ValueError(divergence)
    F, gradF = divergence
    return (
        np.asarray(F(A), dtype=np.float64)
        - np.asarray(F(B), dtype=np.float64)
        - (np.asarray(gradF(B), dtype=np.float64) * (A - B)).sum(axis=1)
    )


def _as_divergence(divergence):
    """Str stays a str; a Bregman-like object becomes an (F, gradF) tuple."""
    if isinstance(divergence, (str, tuple)):
        return divergence
    return (divergence.F, divergence.grad_F)


# ------------------------------------------------------------------------ estimators
def ref_ece_kde(probs, labels, p=1, bandwidth="auto"):
    P = ref_clip(probs)
    E = ref_conditional_expectation(probs, labels, bandwidth)
    return float(np.mean(np.sum(np.abs(E - P) ** p, axis=1)) ** (1.0 / p))


def ref_calibration_error(probs, labels, divergence="kl", bandwidth="auto", estimator="direct"):
    divergence = _as_divergence(divergence)
    P = ref_clip(probs)
    K = P.shape[1]
    E = ref_conditional_expectation(probs, labels, bandwidth)
    if estimator == "direct":
        return float(np.mean(_bregman(divergence, E, P)))
    if estimator == "refinement":
        Y = ref_one_hot(labels, K)
        if divergence == "kl":
            # D_F(y, f) = -log f_y, F(y) = 0
            term = -np.log(P[np.arange(P.shape[0]), np.asarray(labels).astype(np.int64)])
        elif divergence == "l2":
            # D_F(y, f) = ||y - f||^2, F(y) = 1
            term = ((Y - P) ** 2).sum(axis=1) - 1.0
        else:
            term = _bregman(divergence, Y, P) - _F(divergence, Y)
        return float(np.mean(_F(divergence, E)) + np.mean(term))
    raise ValueError(estimator)


def ref_refinement(probs, labels, divergence="kl", bandwidth="auto"):
    divergence = _as_divergence(divergence)
    E = ref_conditional_expectation(probs, labels, bandwidth)
    return float(-np.mean(_F(divergence, E)))


def ref_sharpness(probs, labels, divergence="kl", bandwidth="auto"):
    divergence = _as_divergence(divergence)
    P = ref_clip(probs)
    n, K = P.shape
    E = ref_conditional_expectation(probs, labels, bandwidth)
    freq = np.bincount(np.asarray(labels).astype(np.int64), minlength=K) / n
    return float(np.mean(_F(divergence, E)) - _F(divergence, freq[None, :])[0])


# ---------------------------------------------------------------- report metrics
def ref_accuracy(probs, labels):
    P = ref_clip(probs)
    return float(np.mean(np.argmax(P, axis=1) == np.asarray(labels)))


def ref_log_loss(probs, labels):
    P = ref_clip(probs)
    return float(-np.mean(np.log(P[np.arange(P.shape[0]), np.asarray(labels).astype(np.int64)])))


def ref_brier(probs, labels):
    P = ref_clip(probs)
    Y = ref_one_hot(labels, P.shape[1])
    return float(np.mean(((P - Y) ** 2).sum(axis=1)))


def ref_ece_binned(probs, labels, n_bins=N_BINS):
    """Top-label L1 binned ECE (fraction, not %); bin = clip(ceil(conf*B) - 1, 0, B-1)."""
    P = ref_clip(probs)
    labels = np.asarray(labels).astype(np.int64)
    conf = P.max(axis=1)
    correct = (np.argmax(P, axis=1) == labels).astype(np.float64)
    bins = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    n = P.shape[0]
    ece = 0.0
    for b in range(n_bins):
        in_bin = bins == b
        if in_bin.any():
            ece += in_bin.sum() / n * abs(correct[in_bin].mean() - conf[in_bin].mean())
    return float(ece)


def ref_evaluate(probs, labels, bandwidth="auto"):
    """Return the expected CalibrationReport numeric fields (ce_* use the direct estimator)."""
    P = ref_clip(probs)
    h = _resolve_bandwidth(probs, bandwidth)
    return {
        "n": P.shape[0],
        "n_classes": P.shape[1],
        "bandwidth": h,
        "ece_kde_l1": ref_ece_kde(probs, labels, p=1, bandwidth=h),
        "ece_kde_l2": ref_ece_kde(probs, labels, p=2, bandwidth=h),
        "ce_kl": ref_calibration_error(probs, labels, "kl", h, "direct"),
        "ce_l2": ref_calibration_error(probs, labels, "l2", h, "direct"),
        "refinement_kl": ref_refinement(probs, labels, "kl", h),
        "refinement_l2": ref_refinement(probs, labels, "l2", h),
        "sharpness_kl": ref_sharpness(probs, labels, "kl", h),
        "sharpness_l2": ref_sharpness(probs, labels, "l2", h),
        "accuracy": ref_accuracy(probs, labels),
        "log_loss": ref_log_loss(probs, labels),
        "brier_score": ref_brier(probs, labels),
        "ece_binned": ref_ece_binned(probs, labels),
    }
