"""Resampling on top of one estimate: consistency resampling and the bootstrap.

Both reuse the kernel of an existing estimate: the leave-one-out weights
``w_ij = exp(L_ij - m_j)`` depend on the predictions and the bandwidth only, so one
multi-label engine pass (:func:`kdecal._backends.loo_reduce_multi`) accumulates the
class sums of many label vectors (and centre multiplicities) at once.

- Consistency resampling (Bröcker & Smith, "Increasing the reliability of reliability
  diagrams", Weather and Forecasting 2007; Vaicenavicius et al., "Evaluating model
  calibration in classification", AISTATS 2019): labels redrawn from the predicted
  probabilities, ``y*_i ~ Categorical(f_i)``, which makes the model calibrated by
  construction and keeps the estimator's finite-sample bias in the null distribution.
- The bootstrap (rows resampled with replacement): centre multiplicities ``v_i`` enter
  the class sums and the row means; the copies of a query row are left out with it, so
  each replicate is the same leave-one-out estimator on the resampled rows, ties
  removed; the U-statistic of the squares counts the copies of a centre as one point
  (``sum v_i^2 w_ij^2``). The bandwidth is kept fixed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from . import _backends
from . import _estimators as _est

#: Memory budget (bytes) of the class sums of one chunk of label sets.
_CHUNK_BYTES = 64e6

#: Memory budget (bytes) of the resampled labels and row multiplicities drawn at once:
#: resampling holds O(n + chunk x n) memory whatever ``n_resamples`` is (issue 26: the
#: R x n multiplicities used to be built in full about three times).
DRAW_CHUNK_BYTES = 32e6

#: Most resamples accepted by any resampling function.  Each costs at least one kernel
#: pass over n^2 pairs; a count beyond this is a typo (``10**12``), refused before
#: anything is allocated.
MAX_RESAMPLES = 1_000_000


def check_resamples(value: object, name: str, minimum: int) -> int:
    """Check a number of resamples: an integer in ``minimum..MAX_RESAMPLES``.

    Raises
    ------
    TypeError
        If it is not an integer.
    ValueError
        If it is below ``minimum`` or above :data:`MAX_RESAMPLES`.
    """
    from ._validation import check_int

    r = check_int(value, name, minimum)
    if r > MAX_RESAMPLES:
        raise ValueError(
            f"{name} = {r} is more than {MAX_RESAMPLES:,} resamples, each a kernel pass "
            "over all pairs of rows; a few hundred give stable 95 % intervals and p-values"
        )
    return r


def draw_chunk(n: int, per_row: int, total: int) -> int:
    """How many resamples of n rows to draw at once (``per_row`` int64 values per row)."""
    return int(max(1, min(total, DRAW_CHUNK_BYTES // (8.0 * n * max(1, per_row)))))


def draw_consistency_labels(P: np.ndarray, n_sets: int, rng: np.random.Generator) -> np.ndarray:
    """``n_sets`` label vectors ``y*_i ~ Categorical(P_i)``, shape (n_sets, n), int64.

    Drawing in several calls consumes ``rng`` exactly as one call with the total does.
    """
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0
    u = rng.random((n_sets, P.shape[0]))
    out = np.empty((n_sets, P.shape[0]), dtype=np.int64)
    for s in range(n_sets):
        out[s] = (u[s][:, None] > cdf).sum(axis=1)
    return out


def draw_bootstrap_counts(n: int, n_sets: int, rng: np.random.Generator) -> np.ndarray:
    """Row multiplicities of ``n_sets`` bootstrap samples of n rows, (n_sets, n) int64.

    A sample is n rows drawn with replacement, conditioned on holding at least two
    distinct rows (the fewest a leave-one-out estimate is defined on; a sample of one
    row repeated, probability ``n^(1-n)``, is drawn again: at n = 4 one sample in 64).
    Drawing in several calls consumes ``rng`` exactly as one call with the total does.
    """
    out = np.empty((n_sets, n), dtype=np.int64)
    for s in range(n_sets):
        while True:
            c = np.bincount(rng.integers(0, n, n), minlength=n)
            if n < 2 or np.count_nonzero(c) >= 2:
                break
        out[s] = c
    return out


def problem_labels(calibration: str, P: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Labels of the kernel problems of a notion for class labels ``y`` (n,): (B, n)."""
    if calibration == "canonical":
        return y[None]
    if calibration == "top_label":
        return (P.argmax(axis=1) == y).astype(np.int64)[None]
    return (y[None, :] == np.arange(P.shape[1])[:, None]).astype(np.int64)


def replicates(
    est: _est.Estimate,
    labels: np.ndarray,
    weights: np.ndarray | None,
    backend: str,
) -> Iterator[_est.Estimate]:
    """Recompute the estimate for each label set (and centre multiplicities).

    Parameters
    ----------
    est : Estimate
        The base estimate (its ``m`` gives the weights' normalisation).
    labels : ndarray, shape (R, B, n), int64
        Problem labels of each of R replicates (B problems of the notion).
    weights : ndarray, shape (R, n), float64, or None
        Row multiplicities of each replicate (None: all 1).

    Yields
    ------
    Estimate
        One per replicate, with ``row_weights`` set to its multiplicities.
    """
    if est.debias == "ratio":
        raise ValueError(
            "resampling supports debias='none' and 'ustat', not 'ratio' (it needs the "
            "third power sums, which the multi-label pass does not accumulate)"
        )
    problem = est.problem
    if est.m is None:
        raise ValueError("this estimate holds no engine accumulators to resample")
    R, B, n = labels.shape
    C = problem.dim
    powers = 2 if est.debias == "ustat" else 1
    # With multiplicities v the U-statistic needs sum v_i^2 w_ij^2 (the copies of one
    # centre are one point, whose pairs with itself are left out), not the engine's
    # sum v_i w_ij^2: each replicate runs twice in the same pass, with weights v (for S)
    # and v^2 (for Q). Issue 26: with sum v w^2 the pairs of copies of a centre entered
    # the U-statistic, shifting every bootstrap replicate of a squared error upwards.
    twice = weights is not None and powers == 2
    resid = est.estimator == "residual"
    # residual estimates: per replicate and problem, the residual sums as single-class
    # label sets of the same pass: A_k = sum_i v_i w_ij f_ik (bootstrap only; under
    # relabelling A does not change) and U = sum_i v_i^2 w_ij^2 ||y*_i - f_i||^2
    extra = (C if weights is not None else 0) + (1 if powers == 2 else 0) if resid else 0
    h = est.bandwidth
    per = 8.0 * n * B * (C * powers * (2 if twice else 1) + 2 * extra)
    chunk = int(max(1, min(R, _CHUNK_BYTES // per)))
    logq_all, pk_all = _est.kernel_points(problem)
    logq = [np.ascontiguousarray(logq_all[b]) for b in range(B)]
    pk = [np.ascontiguousarray(pk_all[b]) for b in range(B)]
    bias = list(_est.kernel_bias(problem, h))
    for r0 in range(0, R, chunk):
        r1 = min(R, r0 + chunk)
        c = r1 - r0
        w = None if weights is None else np.ascontiguousarray(weights[r0:r1], dtype=np.float64)
        if twice:
            assert w is not None
            w = np.ascontiguousarray(np.concatenate([w, w * w]))
        parts = [
            _backends.loo_reduce_multi(
                logq[b],
                pk[b],
                np.ascontiguousarray(est.m[b], dtype=np.float64),
                np.ascontiguousarray(
                    np.tile(labels[r0:r1, b], (2, 1)) if twice else labels[r0:r1, b]
                ),
                C,
                1.0 / h,
                np.ascontiguousarray(bias[b]),
                w,
                powers=powers,
                backend=backend,
            )
            for b in range(B)
        ]
        res = (
            _residual_sums(est, logq, pk, bias, labels[r0:r1], w, extra, backend)
            if resid and extra
            else None
        )
        for k in range(r1 - r0):
            S = np.stack([parts[b][0][k] for b in range(B)])
            Q = (
                np.stack([parts[b][1][c + k if twice else k] for b in range(B)])
                if powers == 2
                else np.zeros((0, 0, 0))
            )
            rw = None if weights is None else weights[r0 + k]
            # A bootstrap sample can hold no centre with a non-negligible weight for some
            # query row (all its neighbours drawn 0 times): the estimator is undefined
            # there, so the row leaves that replicate's mean.
            empty = np.any(S.sum(axis=-1) <= 0.0, axis=0)
            A = U = None
            if resid:
                A = est.A if weights is None else res[0][k]  # type: ignore[index]
                U = None if powers == 1 else res[1][k]  # type: ignore[index]
            if np.any(empty):
                S[:, empty] = est.S[:, empty]  # type: ignore[index]
                if powers == 2:
                    Q[:, empty] = est.Q[:, empty]  # type: ignore[index]
                if resid and weights is not None:
                    A = np.where(empty[None, :, None], est.A, A)  # type: ignore[arg-type]
                rw = np.where(empty, 0.0, rw if rw is not None else 1.0)
            prob = replace(problem, labels=np.ascontiguousarray(labels[r0 + k]))
            if resid:
                assert A is not None
                rep = _est.residual_estimate(
                    prob,
                    h,
                    est.debias,
                    est.m,
                    S,
                    Q if powers == 2 else None,
                    None,
                    A,
                    U,
                    warn=False,
                )
            else:
                rep = _est.estimate_from(
                    prob, h, est.debias, backend, est.m, S, Q, np.zeros((0, 0, 0)), warn=False
                )
            yield replace(rep, row_weights=rw)


def _residual_sums(
    est: _est.Estimate,
    logq: list[np.ndarray],
    pk: list[np.ndarray],
    bias: list[np.ndarray],
    labels: np.ndarray,
    weights: np.ndarray | None,
    extra: int,
    backend: str,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Return the residual sums of c replicates: A (c, B, n, D) (bootstrap), U (c, B, n).

    Each is a single-class label set of one multi-label pass per problem, whose centre
    weights carry the values: ``v_i f_ik`` for ``A_k`` (S), ``v_i^2 u_i`` for ``U`` (Q),
    with ``u_i = ||y*_i - f_i||^2`` of the replicate's labels (:func:`residual_weights`).
    """
    problem = est.problem
    c, B, n = labels.shape
    D = problem.dim
    with_a = weights is not None
    with_u = extra > (D if with_a else 0)
    A = np.empty((c, B, n, D)) if with_a else None
    U = np.empty((c, B, n)) if with_u else None
    for b in range(B):
        sets: list[np.ndarray] = []
        for k in range(c):
            v = np.ones(n) if weights is None else weights[k]
            if with_a:
                sets.extend(v * problem.p[b, :, d] for d in range(D))
            if with_u:
                rep = replace(problem, p=problem.p[b : b + 1], labels=labels[k, b : b + 1])
                sets.append(v * v * _est.residual_weights(rep)[0])
        W = np.ascontiguousarray(np.stack(sets), dtype=np.float64)
        S, Q = _backends.loo_reduce_multi(
            logq[b],
            pk[b],
            np.ascontiguousarray(est.m[b], dtype=np.float64),  # type: ignore[index]
            np.zeros(W.shape, dtype=np.int64),
            1,
            1.0 / est.bandwidth,
            np.ascontiguousarray(bias[b]),
            W,
            powers=2 if with_u else 1,
            backend=backend,
        )[:2]
        per = extra
        for k in range(c):
            if with_a:
                A[k, b] = S[k * per : k * per + D, :, 0].T  # type: ignore[index]
            if with_u:
                U[k, b] = Q[k * per + per - 1, :, 0]  # type: ignore[index]
    return A, U
