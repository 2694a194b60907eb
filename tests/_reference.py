"""Independent float64 brute-force reference for the public kdecal API.

Written directly from the formulas of the papers (Popordanoska et al. 2022, Eq. 3, 7, 9,
10; Popordanoska et al. 2024, Eq. 9-10, 14-15), WITHOUT importing
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
    # "loo-mle": the LOO-likelihood rule (kdecal's bandwidth="loo-mle"; kdecal's "auto"
    # is a different rule that the reference does not implement)
    if isinstance(bandwidth, str):
        assert bandwidth == "loo-mle", f"reference bandwidth rule {bandwidth!r}"
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
def ref_ece_kde(probs, labels, p=1, bandwidth="loo-mle"):
    P = ref_clip(probs)
    E = ref_conditional_expectation(probs, labels, bandwidth)
    return float(np.mean(np.sum(np.abs(E - P) ** p, axis=1)) ** (1.0 / p))


def ref_calibration_error(probs, labels, divergence="kl", bandwidth="loo-mle", estimator="direct"):
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


def ref_refinement(probs, labels, divergence="kl", bandwidth="loo-mle"):
    divergence = _as_divergence(divergence)
    E = ref_conditional_expectation(probs, labels, bandwidth)
    return float(-np.mean(_F(divergence, E)))


def ref_sharpness(probs, labels, divergence="kl", bandwidth="loo-mle"):
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


def ref_evaluate(probs, labels, bandwidth="loo-mle"):
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


# =========================================================================================
# Notions of calibration (canonical / class-wise / top-label) and debiasing (Eq. 7, App. C,
# App. D of Popordanoska et al. 2022).  Still no kdecal import: the tests pass in the App. D
# formula (kdecal._debias.ratio_of_squares) and may pass App. C (ratio_of_means; default:
# the independent transcription ref_eq73_ratio_of_means); both get numpy moments computed
# from the materialised weights.  call_quantity only receives the kdecal module.
# =========================================================================================
NOTIONS = ("canonical", "classwise", "top_label")
DEBIAS_MODES = ("none", "ustat", "ratio")
DEGENERATE_RTOL = 1e-12  # a row is degenerate when S0^2 - Q0 <= 1e-12 S0^2 (one neighbour)


def _bytes_key(*arrays):
    return tuple(
        (a.shape, str(a.dtype), hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest())
        for a in arrays
    )


def ref_notion_problems(probs, labels, calibration):
    """The kernel problems of a notion: list of (points (n, D) float64, labels (n,) int64).

    canonical: [(P~, y)]; top_label: [((1 - c, c)~, 1[argmax P~ = y])] with c = max_k P~;
    classwise: [((1 - P~_c, P~_c)~, 1[y = c]) for each class c]; ~ = EPS clip + renormalise.
    """
    P = ref_clip(probs)
    y = np.asarray(labels).astype(np.int64)
    n, K = P.shape
    if calibration == "canonical":
        return [(P, y)]
    if calibration == "top_label":
        top = np.argmax(P, axis=1)
        return [(ref_clip(P[np.arange(n), top]), (top == y).astype(np.int64))]
    if calibration == "classwise":
        return [(ref_clip(P[:, c].copy()), (y == c).astype(np.int64)) for c in range(K)]
    raise ValueError(calibration)


def ref_notion_bandwidth(probs, labels, calibration, bandwidth="loo-mle"):
    """Bandwidth of a notion: "loo-mle" maximises the SUM over its problems of the mean LOO LL."""
    if not isinstance(bandwidth, str):
        return float(bandwidth)
    assert bandwidth == "loo-mle", f"reference bandwidth rule {bandwidth!r}"
    problems = ref_notion_problems(probs, labels, calibration)
    key = (_bytes_key(np.asarray(probs, dtype=np.float64), np.asarray(labels)), calibration)
    if key not in _NOTION_BW_CACHE:
        ll = sum(ref_loo_log_likelihood_grid(pts, DEFAULT_GRID) for pts, _ in problems)
        _NOTION_BW_CACHE[key] = float(DEFAULT_GRID[int(np.argmax(ll))])
    return _NOTION_BW_CACHE[key]


_NOTION_BW_CACHE: dict = {}


def ref_loo_log_likelihood_grid(points, grid):
    """mean_j log(1/(n-1) sum_{i != j} Dir(f_j; f_i / h + 1)) for every h of a grid at once.

    ``points`` (n, D) already clipped; one (H, n, n) array of log kernels (small n only).
    """
    n, D = points.shape
    hs = np.asarray(grid, dtype=np.float64)[:, None, None]
    G = points @ np.log(points).T  # G[i, j] = sum_k f_ik log f_jk
    bias = -gammaln(points[None] / hs + 1.0).sum(axis=-1)  # (H, n): centre i
    A = gammaln(1.0 / hs + D) + bias[:, :, None] + G[None] / hs  # A[h, i, j]
    A[:, np.arange(n), np.arange(n)] = -np.inf
    log_dens = logsumexp(A, axis=1) - np.log(n - 1)  # (H, n): sum over centres i
    return log_dens.mean(axis=1)


def ref_loo_weights(points, h):
    """W[j, i] = k(f_j; f_i) / max_i' k(f_j; f_i') for i != j, W[j, j] = 0 (query-major).

    ``points`` are already clipped (no re-clipping here).
    """
    A = ref_log_kernel(points, h, include_constant=False).T  # A[j, i]: query j, centre i
    return np.exp(A - A.max(axis=1, keepdims=True))


def ref_loo_sample(points, labels, h):
    """Leave-one-out samples per query: X (n, n-1) = w_i and Y (D, n, n-1) = w_i 1[y_i = c]."""
    n, D = points.shape
    W = ref_loo_weights(points, h)
    off = ~np.eye(n, dtype=bool)
    X = W[off].reshape(n, n - 1)
    lab = np.broadcast_to(labels, (n, n))[off].reshape(n, n - 1)
    Y = X[None] * (lab[None] == np.arange(D)[:, None, None])
    return X, Y


def ref_plain_ratio(points, labels, h):
    """Plain leave-one-out E (n, D): per-class logsumexp of the log kernel, normalised."""
    n, D = points.shape
    A = ref_log_kernel(points, h, include_constant=False)  # A[i, j]: centre i, query j
    log_num = np.full((n, D), -np.inf)
    for c in range(D):
        members = labels == c
        if members.any():
            log_num[:, c] = logsumexp(A[members, :], axis=0)
    W = np.exp(log_num - log_num.max(axis=1, keepdims=True))
    return W / W.sum(axis=1, keepdims=True)


def _cov(a, b):
    """Unbiased sample covariance along the last axis (two-pass, centred, N - 1 divisor)."""
    N = a.shape[-1]
    da = a - a.mean(axis=-1, keepdims=True)
    db = b - b.mean(axis=-1, keepdims=True)
    return np.sum(da * db, axis=-1) / (N - 1)


def ref_sample_moments(X, Y):
    """Sample moments of the (X, Y) pairs along the last axis, computed with numpy.

    Returns the dict used by the App. C / App. D formulas (keys as kdecal._debias.moments):
    N, mx, my, varx, vary (ddof=1), covxy, covx2y = Cov(X^2, Y), covx2x = Cov(X^2, X),
    covy2x = Cov(Y^2, X).  X broadcasts against Y.
    """
    X = np.broadcast_to(X, Y.shape)
    return {
        "N": float(Y.shape[-1]),
        "mx": np.mean(X, axis=-1),
        "my": np.mean(Y, axis=-1),
        "varx": np.var(X, axis=-1, ddof=1),
        "vary": np.var(Y, axis=-1, ddof=1),
        "covxy": _cov(X, Y),
        "covx2y": _cov(X * X, Y),
        "covx2x": _cov(X * X, X),
        "covy2x": _cov(Y * Y, X),
    }


def ref_ustat_ratio(X, Y):
    """Eq. 7 per (class, query): sum_{i != k} Y_i Y_k / sum_{i != k} X_i X_k (closed form)."""
    num = Y.sum(axis=-1) ** 2 - (Y * Y).sum(axis=-1)
    den = X.sum(axis=-1) ** 2 - (X * X).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def ref_ustat_ratio_literal(X, Y):
    """Eq. 7 with the literal double sums over i != k (small n only)."""
    N = X.shape[-1]
    off = ~np.eye(N, dtype=bool)
    num = (Y[..., :, None] * Y[..., None, :])[..., off].sum(axis=-1)
    den = (X[..., :, None] * X[..., None, :])[..., off].sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def ref_eq73_ratio_of_means(m):
    """App. C, Eq. 73-75 transcribed from the paper (n := N, the number of LOO terms).

    r_corr = r (1 - (r_b* - r_a*) / n - bracket / n^2), r = mu_Y / mu_X; 0 where mu_Y = 0.
    """
    N = m["N"]
    mx, my, varx, vary = m["mx"], m["my"], m["varx"], m["vary"]
    covxy, covx2y, covx2x, covy2x = m["covxy"], m["covx2y"], m["covx2x"], m["covy2x"]
    with np.errstate(divide="ignore", invalid="ignore"):
        ra = covxy / (mx * my)
        rb = varx / mx**2
        ra_star = ra * (
            1.0
            + 1.0 / (N - 1) * ((my * covx2y + mx * covy2x) / (covxy * mx * my) - 4.0)
            - 1.0 / (N - 1) * (varx / mx**2 + vary / my**2 + 2.0 * covxy / (mx * my))
        )
        rb_star = rb * (
            1.0 + 4.0 / (N - 1) * (0.5 * covx2x / (mx * varx) - 1.0) - 4.0 / (N - 1) * varx / mx**2
        )
        bracket = (
            (covx2y - 2.0 * mx * covxy) / (mx**2 * my)
            - (covx2x - 2.0 * mx * varx) / mx**3
            - 3.0 * varx * covxy / (mx**3 * my)
            + 3.0 * varx**2 / mx**4
        )
        r = my / mx
        out = r * (1.0 - (rb_star - ra_star) / N - bracket / N**2)
    return np.where(my > 0, out, 0.0)


def ref_debiased_ratio(X, Y, ratio_of_means, ratio_of_squares):
    """App. C ``E`` and App. D ``sq`` per (class, query) from numpy moments of (X, Y).

    App. C is homogeneous of degree 1 in Y and App. D of degree 2 (every moment ratio in
    their brackets is of degree 0), so both are evaluated on Y / max_i Y_i and scaled
    back: mathematically the same, but mu_Y^2 cannot underflow when a class holds a tiny
    share (~1e-170) of a row's kernel mass.  (kdecal instead leaves classes with
    S_c <= 1e-30 S0 uncorrected; both give values below 1e-30 there.)
    """
    s = Y.max(axis=-1)
    s = np.where(s > 0, s, 1.0)
    Ys = Y / s[..., None]
    m = ref_sample_moments(X[None] if X.ndim < Y.ndim else X, Ys)
    E = np.asarray(ratio_of_means(m)) * s
    sq = np.asarray(ratio_of_squares(m, ref_ustat_ratio(X, Ys))) * s * s
    return E, sq


_EST_CACHE: OrderedDict[tuple, tuple] = OrderedDict()


def ref_notion_estimates(
    probs,
    labels,
    calibration,
    bandwidth,
    debias="none",
    *,
    ratio_of_means=None,
    ratio_of_squares=None,
):
    """Per-problem estimates of a notion at one bandwidth; memoised.

    Returns ``(h, problems)``; each problem is a dict with ``points`` (n, D), ``labels``,
    ``E`` (n, D) (plain ratio, or App. C with debias="ratio"), ``sq`` (n, D) or None
    (Eq. 7 for "ustat", App. D on top of Eq. 7 for "ratio") and ``degenerate`` (n,) bool
    (rows with S0^2 - Q0 <= 1e-12 S0^2, or every row when debias="ratio" and n - 1 < 6;
    there E is the plain ratio and sq its square).  The sample moments are computed with
    numpy from the materialised weights (:func:`ref_sample_moments`), not from power sums.  ``ratio_of_means(moments)`` defaults to
    :func:`ref_eq73_ratio_of_means`; ``ratio_of_squares(moments, r_ustat)`` is required
    for debias="ratio".  ``cond`` (n,) is S0^2 / (S0^2 - Q0), the factor by which rounding
    in the power sums is amplified in Eq. 7 (0 on degenerate rows and without debiasing).
    """
    P = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels).astype(np.int64)
    h = ref_notion_bandwidth(P, y, calibration, bandwidth)
    rom = ratio_of_means or ref_eq73_ratio_of_means
    fn_key = tuple(
        f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', '')}"
        for f in (rom, ratio_of_squares)
    )
    key = (_bytes_key(P, y), calibration, h, debias, fn_key)
    if key in _EST_CACHE:
        return _EST_CACHE[key]
    out = []
    for pts, lab in ref_notion_problems(P, y, calibration):
        n = pts.shape[0]
        plain = ref_plain_ratio(pts, lab, h)
        prob = {"points": pts, "labels": lab, "E": plain, "sq": None}
        prob["degenerate"] = np.zeros(n, dtype=bool)
        prob["cond"] = np.zeros(n)
        if debias != "none":
            X, Y = ref_loo_sample(pts, lab, h)
            S0 = X.sum(axis=1)
            den = S0**2 - (X * X).sum(axis=1)
            degenerate = ~(den > DEGENERATE_RTOL * S0**2)
            if debias == "ratio" and n - 1 < 6:
                degenerate[:] = True
            sq = ref_ustat_ratio(X, Y).T  # (n, D)
            E = plain
            if debias == "ratio":
                E, sq = (a.T for a in ref_debiased_ratio(X, Y, rom, ratio_of_squares))
            d = degenerate[:, None]
            prob["E"] = np.where(d, plain, E)
            prob["sq"] = np.where(d, plain * plain, sq)
            prob["degenerate"] = degenerate
            # condition number of the U-statistic ratio: S0^2 / (S0^2 - Q0) (0 if degenerate)
            with np.errstate(divide="ignore"):
                prob["cond"] = np.where(degenerate, 0.0, S0**2 / np.where(degenerate, 1.0, den))
        out.append(prob)
    _EST_CACHE[key] = (h, out)
    if len(_EST_CACHE) > 256:
        _EST_CACHE.popitem(last=False)
    return h, out


def _coords(prob):
    """Coordinates entering L_p / L2 quantities: the positive one for binary problems."""
    return slice(1, 2) if prob["binary"] else slice(None)


def _with_binary_flag(problems, calibration):
    return [dict(p, binary=calibration != "canonical") for p in problems]


def ref_notion_ce_pp(problems, calibration, p):
    """Mean over problems and rows of sum_coords |E - f|^p (debiased squares at p = 2)."""
    vals = []
    for prob in _with_binary_flag(problems, calibration):
        c = _coords(prob)
        f, E = prob["points"][:, c], prob["E"][:, c]
        if p == 2 and prob["sq"] is not None:
            vals.append(np.sum(prob["sq"][:, c] - 2.0 * E * f + f * f, axis=1))
        else:
            vals.append(np.sum(np.abs(E - f) ** p, axis=1))
    return float(np.mean(np.concatenate(vals)))


def _simplex_E(prob, debias):
    E = prob["E"]
    if debias != "ratio":
        return E
    E = np.maximum(E, 0.0)
    return E / E.sum(axis=1, keepdims=True)


def _F_notion(prob, divergence, v, sq=None):
    """F per row for a problem: kl = sum xlogx over all coords; l2 = sum_coords v^2 (or sq)."""
    if divergence == "kl":
        return _xlogx_sum(v)
    c = _coords(prob)
    return np.sum((v * v if sq is None else sq)[:, c], axis=1)


def ref_notion_F_mean(problems, calibration, divergence, debias):
    """mean over problems and rows of F(E_j) (kl on the projected E, l2 on the squares)."""
    vals = []
    for prob in _with_binary_flag(problems, calibration):
        if divergence == "kl":
            vals.append(_F_notion(prob, "kl", _simplex_E(prob, debias)))
        else:
            vals.append(_F_notion(prob, "l2", prob["E"], prob["sq"]))
    return float(np.mean(np.concatenate(vals)))


def ref_notion_calibration_error(problems, calibration, divergence, estimator, debias):
    """CE_F of a notion, direct (mean D_F(E, f)) or via the refinement (risk) estimator."""
    probs_ = _with_binary_flag(problems, calibration)
    if estimator == "direct":
        vals = []
        for prob in probs_:
            f = prob["points"]
            if divergence == "kl":
                E = _simplex_E(prob, debias)
                safe = np.where(E > 0, E, 1.0)
                vals.append(np.sum(np.where(E > 0, E * (np.log(safe) - np.log(f)), 0.0), axis=1))
            else:
                c = _coords(prob)
                E = prob["E"][:, c]
                sq = E * E if prob["sq"] is None else prob["sq"][:, c]
                vals.append(np.sum(sq - 2.0 * E * f[:, c] + f[:, c] ** 2, axis=1))
        return float(np.mean(np.concatenate(vals)))
    risk = []
    for prob in probs_:
        f, lab = prob["points"], prob["labels"]
        Y = ref_one_hot(lab, f.shape[1])
        if divergence == "kl":  # D_F(y, f) - F(y) = -log f_y
            risk.append(-np.log(f[np.arange(f.shape[0]), lab]))
        else:  # sum_coords (Y - f)^2 - Y^2
            c = _coords(prob)
            risk.append(np.sum((Y[:, c] - f[:, c]) ** 2 - Y[:, c] ** 2, axis=1))
    F_mean = ref_notion_F_mean(problems, calibration, divergence, debias)
    return F_mean + float(np.mean(np.concatenate(risk)))


def ref_notion_refinement(problems, calibration, divergence, debias):
    """-mean F(E_j)."""
    return -ref_notion_F_mean(problems, calibration, divergence, debias)


def ref_notion_sharpness(problems, calibration, divergence, debias):
    """mean F(E_j) - mean over problems of F(label frequencies of the problem)."""
    F_freq = []
    for prob in _with_binary_flag(problems, calibration):
        D = prob["points"].shape[1]
        freq = ref_one_hot(prob["labels"], D).mean(axis=0)[None, :]
        F_freq.append(_F_notion(prob, divergence, freq)[0])
    return ref_notion_F_mean(problems, calibration, divergence, debias) - float(np.mean(F_freq))


# Public quantities of a notion, by name (shared by test_notions.py and test_debias.py).
QUANTITIES = (
    "ece_p1",
    "ece_p2",
    "ece_p3",
    "ce_kl_direct",
    "ce_kl_refinement",
    "ce_l2_direct",
    "ce_l2_refinement",
    "refinement_kl",
    "refinement_l2",
    "sharpness_kl",
    "sharpness_l2",
)
#: CalibrationReport field -> quantity name.
REPORT_FIELDS = {
    "ece_kde_l1": "ece_p1",
    "ece_kde_l2": "ece_p2",
    "ce_kl": "ce_kl_direct",
    "ce_l2": "ce_l2_direct",
    "refinement_kl": "refinement_kl",
    "refinement_l2": "refinement_l2",
    "sharpness_kl": "sharpness_kl",
    "sharpness_l2": "sharpness_l2",
}


def ref_notion_quantity(name, problems, calibration, debias):
    """Expected value of a named quantity, and False (no quantity warns any more).

    A negative debiased CE_2^2 (issue 26) gives the signed root ``-sqrt(-CE_2^2)``.
    """
    if name.startswith("ece_p"):
        p = float(name[len("ece_p") :])
        pp = ref_notion_ce_pp(problems, calibration, p)
        if pp < 0.0:
            return -((-pp) ** (1.0 / p)), False
        return pp ** (1.0 / p), False
    kind, *rest = name.split("_")
    if kind == "ce":
        divergence, estimator = rest
        return ref_notion_calibration_error(
            problems, calibration, divergence, estimator, debias
        ), False
    if kind == "refinement":
        return ref_notion_refinement(problems, calibration, rest[0], debias), False
    if kind == "sharpness":
        return ref_notion_sharpness(problems, calibration, rest[0], debias), False
    raise ValueError(name)


def call_quantity(kd, name, probs, labels, **kwargs):
    """Call the public function behind a quantity name; ``kd`` is the kdecal module."""
    if name.startswith("ece_p"):
        return kd.ece_kde(probs, labels, p=int(name[len("ece_p") :]), **kwargs)
    kind, *rest = name.split("_")
    if kind == "ce":
        divergence, estimator = rest
        return kd.calibration_error(
            probs, labels, divergence=divergence, estimator=estimator, **kwargs
        )
    fn = {"refinement": kd.refinement, "sharpness": kd.sharpness}[kind]
    return fn(probs, labels, divergence=rest[0], **kwargs)


def ref_debias_atol(problems, factor=16.0):
    """Absolute rounding allowance of a debiased scalar: factor * eps * mean row condition.

    Two correct float64 implementations of Eq. 7 differ by ~eps * S0^2 / (S0^2 - Q0) per
    entry (cancellation in S^2 - Q); rows close to the single-neighbour threshold (tiny
    bandwidths) make this large.  Measured worst: 0.53 eps * mean condition.
    """
    cond = np.concatenate([p["cond"] for p in problems])
    return factor * np.finfo(np.float64).eps * float(np.mean(cond))


def adversarial_scores():
    """The fast binary engine's adversarial scores in [0, 1], by name (seeded).

    Ties, exact 0 and 1, all scores equal, scores at 1 - 1e-12, n = 3 and 4, a cluster
    within 1e-3 of 1: the inputs of tests/engine/test_binary_engine.py and of its numba
    twin's tests.
    """
    rng = np.random.default_rng(5)
    return {
        "ties": np.round(rng.beta(4, 1, 400), 2),
        "zeros_ones": np.concatenate([np.zeros(20), np.ones(30), rng.random(150)]),
        "all_equal": np.full(200, 0.7),
        "near_one": np.concatenate(
            [np.full(10, 1 - 1e-12), 1 - rng.random(100) * 1e-6, rng.beta(8, 1, 200)]
        ),
        "n3": np.array([0.2, 0.5, 0.9]),
        "n4_extremes": np.array([0.0, 1.0, 0.5, 0.5]),
        "clustered": np.concatenate([1 - rng.random(300) * 1e-3, rng.random(20)]),
    }


# ------------------------------------------------------------- recalibration optimum
def ref_vector_scaling_nll(L, y):
    """Minimum mean NLL of softmax(w * L + b) over (w, b), by Newton's method.

    scipy's trust-exact with the exact Hessian, written apart from kdecal's L-BFGS-B
    fit. Each column of L is shifted by the median over its class's rows (the biases
    absorb it; the optimum is unchanged) and a gauge term (mean b)^2 / 2 removes the
    Hessian's null direction (softmax ignores a common shift) without moving the NLL.
    """
    from scipy import optimize
    from scipy.special import softmax

    n, K = L.shape
    rows = np.arange(n)
    c = np.array([np.median(L[y == k, k]) if np.any(y == k) else 0.0 for k in range(K)])
    Lc = L - c

    def fun(th):
        U = th[:K] * Lc + th[K:]
        R = softmax(U, axis=1)
        R[rows, y] -= 1.0
        mb = th[K:].mean()
        f = float(np.mean(logsumexp(U, axis=1) - U[rows, y])) + 0.5 * mb * mb
        return f, np.concatenate([(R * Lc).sum(0) / n, R.sum(0) / n + mb / K])

    def hess(th):
        P = softmax(th[:K] * Lc + th[K:], axis=1)
        A = P * Lc
        Hwb = np.diag(A.sum(0)) - A.T @ P
        H = np.block(
            [[np.diag((A * Lc).sum(0)) - A.T @ A, Hwb], [Hwb.T, np.diag(P.sum(0)) - P.T @ P]]
        )
        H /= n
        H[K:, K:] += 1.0 / K**2
        return H

    res = optimize.minimize(
        fun,
        np.r_[np.ones(K), np.zeros(K)],
        jac=True,
        hess=hess,
        method="trust-exact",
        options={"gtol": 1e-13, "maxiter": 5000},
    )
    return float(res.fun)
