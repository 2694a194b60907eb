"""Resampling on top of one estimate: consistency resampling and the bootstrap.

Both reuse the kernel of an existing estimate: the leave-one-out weights
``w_ij = exp(L_ij - m_j)`` depend on the predictions and the bandwidth only, so one
multi-label engine pass (:func:`kdecal._engine.backends.loo_reduce_multi`) accumulates the
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
  (``sum v_i^2 w_ij^2``). The bandwidth is the estimate's (the selection's own
  variability is added by :class:`kdecal.CalibrationEstimate`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from .._engine import backends as _backends
from .._engine import binary as _binary
from .._engine import dask as _dask
from .._engine import engines as _engines
from .._engine import runtime as _runtime
from .._validation import check_int
from . import problem as _problem
from . import regression as _regression

#: Memory budget (bytes) of the class sums of one chunk of label sets.
_CHUNK_BYTES = 64e6

#: Memory budget (bytes) of one chunk of the dense residual replicates' sums
#: (:func:`_residual_replicates`): each chunk computes the kernel weights anew, so the
#: bootstrap and consistency replicates of ``kdecal.evaluate`` at n = 10,000, K = 10
#: (100 each, 192 MB of sums) fit one chunk (four at 64 MB): 25.2-26.6 s -> 24.0-24.9 s
#: for the report on the 2-core machine, peak RSS 516 -> 556-560 MB (bench/README.md).
_RESIDUAL_CHUNK_BYTES = 200e6

#: Memory budget (bytes) of the resampled labels and row multiplicities drawn at once:
#: resampling holds O(n + chunk x n) memory whatever ``n_resamples`` is (issue 26: the
#: R x n multiplicities used to be built in full about three times).
DRAW_CHUNK_BYTES = 32e6

#: Seconds per resample and unit of ``n^2 (K + 3)`` of a canonical estimate's dense
#: resampling (bootstrap and consistency replicates at the estimate's two bandwidths) on
#: the 2-core machine of bench/README.md at large n (about 2.0e-10 at n = 30,000 and
#: 2.9e-10 at 100,000, K = 10; 7.9e-11 at n = 10,000, where the value columns still fit
#: the caches): the estimate that :func:`dense_resampling_seconds` gives.
DENSE_RESAMPLING_SECONDS = 2.5e-10


def dense_resampling_seconds(n: int, K: int, R: int) -> float:
    """Estimated seconds, on 2 cores, of ``R`` dense resamples of a canonical estimate.

    ``n^2 (K + 3)`` multiply-adds per replicate and bandwidth (bench/README.md, "`kdecal
    evaluate` at large n"): a guide for the notes and warnings that name the cost of
    what is (or is about to be) run, not a promise.
    """
    return float(n) * n * (K + 3) * R * DENSE_RESAMPLING_SECONDS


#: Seconds per (query, centre) pair of one canonical pass with the default accumulators
#: on 2 cores, ``a + b K`` (bench/README.md: 0.67 ns at K = 10, 3.5 ns at K = 100), and
#: the passes of a ``bandwidth="auto"`` estimate (its search and the pass at the two
#: bandwidths of the residual estimator): :func:`canonical_estimate_seconds`.
CANONICAL_PAIR_SECONDS = (0.35e-9, 0.032e-9)
CANONICAL_AUTO_PASSES = 4.0


def canonical_estimate_seconds(n: int, K: int) -> float:
    """Estimated seconds, on 2 cores, of a canonical estimate with the automatic bandwidth."""
    a, b = CANONICAL_PAIR_SECONDS
    return CANONICAL_AUTO_PASSES * float(n) * n * (a + b * K)


#: Seconds and bytes per (point, class) of a class-wise estimate with the automatic
#: bandwidth on 2 cores (K one-vs-rest problems of n points on the fast binary engine:
#: its search, the residual estimator's pass at two bandwidths, and the estimate's
#: arrays, which it keeps), and a fixed part of each: measured 13.4 s and 0.56 GB at
#: n = 3,000, K = 300, 55 s and 1.88 GB at n = 10,000, K = 500, 178 s and 5.18 GB at
#: n = 20,000, K = 1,000 (peak resident memory; ``bench/classwise_cost.py``,
#: bench/README.md, "Class-wise at many classes").
CLASSWISE_POINT_SECONDS = 1e-5
CLASSWISE_POINT_BYTES = 260.0
CLASSWISE_FIXED = (2.0, 0.3e9)
#: ... and, below the fast engine's smallest n (the dense loop), seconds per (query,
#: centre, class): 75 s at n = 1,500, K = 2,000.
CLASSWISE_DENSE_PAIR_SECONDS = 1.67e-8


def classwise_estimate_cost(n: int, K: int) -> tuple[float, float]:
    """Estimated seconds on 2 cores and peak bytes of a class-wise estimate, "auto" bandwidth.

    A guide for the notes and warnings that name the cost of what is (or is about to
    be) run, not a promise.
    """
    points = float(n) * K
    per_point = CLASSWISE_POINT_SECONDS
    if n < _backends.BINARY_MIN_N:
        per_point = max(per_point, n * CLASSWISE_DENSE_PAIR_SECONDS)
    sec, size = CLASSWISE_FIXED
    return sec + points * per_point, size + points * CLASSWISE_POINT_BYTES


def describe_bytes(size: float) -> str:
    """``size`` in bytes as a reader wants it: "600 MB", "14 GB"."""
    return (
        f"{size / 1e9:.0f} GB"
        if size >= 10e9
        else f"{size / 1e9:.1f} GB"
        if size >= 1e9
        else f"{size / 1e6:.0f} MB"
    )


def describe_seconds(sec: float) -> str:
    """``sec`` as a reader wants it: "40 s", "12 minutes", "3.5 hours"."""
    if sec < 90.0:
        return f"{sec:.0f} s"
    if sec < 5400.0:
        return f"{sec / 60.0:.0f} minutes"
    return f"{sec / 3600.0:.1f} hours"


#: Most resamples accepted by any resampling function.  Each costs at least one kernel
#: pass over n^2 pairs; a count beyond this is a typo (``10**12``), refused before
#: anything is allocated.
MAX_RESAMPLES = 1_000_000


def check_resamples(
    value: object, name: str, minimum: int, each: str = "a kernel pass over all pairs of rows"
) -> int:
    """Check a number of resamples: an integer in ``minimum..MAX_RESAMPLES``.

    ``each``: what one resample costs, for the message.

    Raises
    ------
    TypeError
        If it is not an integer.
    ValueError
        If it is below ``minimum`` or above :data:`MAX_RESAMPLES`.
    """
    r = check_int(value, name, minimum)
    if r > MAX_RESAMPLES:
        raise ValueError(
            f"{name} = {r} is more than {MAX_RESAMPLES:,} resamples, each {each}; a few "
            "hundred give stable 95 % intervals and p-values"
        )
    return r


#: Fewest replicates per chunk where the budgets above allow fewer. The dense and
#: multi-label resampling passes compute the kernel weights once per chunk of replicates
#: and problem (about as much work as 60 value columns of the products): with many
#: problems (class-wise at K = 1,000) the budgets above held one replicate per chunk, and
#: the weights were computed anew for each (a class-wise calibration test at n = 3,000,
#: K = 1,000: 20 resamples in over 14 minutes; bench/README.md, "Class-wise at many
#: classes").
MIN_CHUNK_REPLICATES = 16

#: The most memory (bytes) a chunk may take to reach :data:`MIN_CHUNK_REPLICATES`.
MAX_CHUNK_BYTES = 1e9


def chunk_size(total: int, per: float, budget: float) -> int:
    """Replicates per chunk: ``per`` bytes each, ``budget`` bytes (at least 1, at most ``total``).

    Where ``budget`` holds fewer than :data:`MIN_CHUNK_REPLICATES`, as many more as
    :data:`MAX_CHUNK_BYTES` holds, up to that many: memory stays O(n + chunk x n) and
    bounded, and a chunk amortises the kernel weights of its pass.
    """
    c = budget // per
    if c < MIN_CHUNK_REPLICATES:
        c = max(c, min(MIN_CHUNK_REPLICATES, MAX_CHUNK_BYTES // per))
    return int(max(1, min(total, c)))


def draw_chunk(n: int, per_row: int, total: int) -> int:
    """How many resamples of n rows to draw at once (``per_row`` int64 values per row)."""
    return chunk_size(total, 8.0 * n * max(1, per_row), DRAW_CHUNK_BYTES)


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
    est: _regression.Estimate,
    labels: np.ndarray,
    weights: np.ndarray | None,
    backend: str,
    squares: bool = True,
    progress: bool | None = None,
) -> Iterator[_regression.Estimate]:
    """Recompute the estimate for each label set (and centre multiplicities).

    Parameters
    ----------
    est : Estimate
        The base estimate (its ``m`` gives the weights' normalisation).
    labels : ndarray, shape (R, B, n), int64
        Problem labels of each of R replicates (B problems of the notion).
    weights : ndarray, shape (R, n), float64, or None
        Row multiplicities of each replicate (None: all 1).
    squares : bool, default True
        Whether the quantities asked need the residual estimate's U-statistic of the
        squares (``sqerr``); without it, its replicates skip the squared sums and hold
        ``debias="none"`` (their ``E`` is the same).
    progress : bool or None, default None
        Progress bar of the passes (None: one only for long work).

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
    if est.m is None:
        raise ValueError("this estimate holds no engine accumulators to resample")
    if _fast_binary(est, backend):
        resolved = _backends.resolve_backend(backend)
        for reps in _binary_replicates(est, [(labels, weights)], squares, progress, resolved):
            yield reps[0]
        return
    dense = _dense_backend(backend) if est.estimator == "residual" else None
    if dense is not None and not (weights is None and _consistency_on_multi(est, dense)):
        for reps in _residual_replicates(est, [(labels, weights)], squares, progress, dense):
            yield reps[0]
        return
    yield from _multi_label_replicates(est, labels, weights, backend, squares, progress)


def _consistency_on_multi(
    est: _regression.Estimate, dense: str | None, shared: bool = False
) -> bool:
    """Whether consistency replicates of a residual estimate run on the multi-label pass.

    On the compiled core with ``D >= CONSISTENCY_MULTI_MIN_DIM`` classes: a consistency
    replicate's label sums are one add per pair there, against ``D`` multiply-adds per
    pair in the dense products (bench/README.md, "Consistency replicates").  Except
    where bootstrap replicates run in the same pass (``shared``: the intervals and the
    test of ``kdecal.evaluate``) and ``D <=`` :data:`CONSISTENCY_SHARED_MAX_DIM`: the
    dense products then take the bootstrap's kernel weights, which the multi-label pass
    would compute again.
    """
    if dense != "cpp" or est.problem.dim < CONSISTENCY_MULTI_MIN_DIM:
        return False
    return not (shared and est.problem.dim <= CONSISTENCY_SHARED_MAX_DIM)


def _multi_label_replicates(
    est: _regression.Estimate,
    labels: np.ndarray,
    weights: np.ndarray | None,
    backend: str,
    squares: bool = True,
    progress: bool | None = None,
) -> Iterator[_regression.Estimate]:
    """:func:`replicates` as multi-label engine passes (label sets of a chunk at once)."""
    problem = est.problem
    assert est.m is not None
    R, B, n = labels.shape
    C = problem.dim
    resid = est.estimator == "residual"
    # a residual estimate's replicates skip the squared sums where the quantities do
    # not read them (as the dense products do); a plug-in's ustat ratio needs them
    powers = 2 if est.debias == "ustat" and (squares or not resid) else 1
    rep_debias = est.debias if powers == 2 or not resid else "none"
    # With multiplicities v the U-statistic needs sum v_i^2 w_ij^2 (the copies of one
    # centre are one point, whose pairs with itself are left out), not the engine's
    # sum v_i w_ij^2: each replicate runs twice in the same pass, with weights v (for S)
    # and v^2 (for Q). Issue 26: with sum v w^2 the pairs of copies of a centre entered
    # the U-statistic, shifting every bootstrap replicate of a squared error upwards.
    twice = weights is not None and powers == 2
    # residual estimates: per replicate and problem, the residual sums as single-class
    # label sets of the same pass: A_k = sum_i v_i w_ij f_ik (bootstrap only; under
    # relabelling A does not change) and U = sum_i v_i^2 w_ij^2 ||y*_i - f_i||^2
    extra = (C if weights is not None else 0) + (1 if powers == 2 else 0) if resid else 0
    h = est.bandwidth
    per = 8.0 * n * B * (C * powers * (2 if twice else 1) + 2 * extra)
    chunk = chunk_size(R, per, _CHUNK_BYTES)
    logq_all, pk_all = _problem.kernel_points(problem)
    logq = [np.ascontiguousarray(logq_all[b]) for b in range(B)]
    pk = [np.ascontiguousarray(pk_all[b]) for b in range(B)]
    bias = list(_problem.kernel_bias(problem, h))
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
                progress=progress,
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
            empty = np.any(S.sum(axis=-1) <= EMPTY_ROW_FLOOR, axis=0)
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
                rep = _regression.residual_estimate(
                    prob,
                    h,
                    rep_debias,
                    est.m,
                    S,
                    Q if powers == 2 else None,
                    None,
                    A,
                    U,
                    warn=False,
                    row_weights=rw,
                )
            else:
                rep = _regression.estimate_from(
                    prob, h, est.debias, backend, est.m, S, Q, np.zeros((0, 0, 0)), warn=False
                )
            yield replace(rep, row_weights=rw)


def replicates_jobs(
    est: _regression.Estimate,
    jobs: list[tuple[np.ndarray, np.ndarray | None]],
    backend: str,
    squares: bool = True,
    progress: bool | None = None,
) -> Iterator[tuple[_regression.Estimate, ...]]:
    """:func:`replicates` of several resamplings of one estimate, replicate by replicate.

    ``jobs`` holds ``(labels, weights)`` pairs of the same number R of replicates (e.g.
    a bootstrap and a consistency resampling); the k-th tuple yielded holds the k-th
    replicate of every job, each equal to what :func:`replicates` yields for that job
    alone. A residual estimate on the compiled core computes every job's sums from the
    same kernel weights (one pass for all); other estimates run the jobs one after the
    other.  Binary problems of a residual estimate on the fast binary engine run one
    engine call per replicate (:func:`_binary_replicates`).
    """
    if _fast_binary(est, backend):
        if est.m is None:
            raise ValueError("this estimate holds no engine accumulators to resample")
        yield from _binary_replicates(
            est, jobs, squares, progress, _backends.resolve_backend(backend)
        )
        return
    dense = _dense_backend(backend) if est.estimator == "residual" else None
    if dense is not None and est.debias != "ratio":
        if est.m is None:
            raise ValueError("this estimate holds no engine accumulators to resample")
        # the bootstraps as dense products (sharing the weights), and the consistency
        # resamplings there too or on the multi-label pass (_consistency_on_multi)
        apart = [k for k, (_, w) in enumerate(jobs) if w is None]
        here = [k for k in range(len(jobs)) if k not in apart]
        if not apart or not _consistency_on_multi(est, dense, shared=bool(here)):
            yield from _residual_replicates(est, jobs, squares, progress, dense)
            return
        streams: list[Iterator[tuple[_regression.Estimate, ...]]] = []
        if here:
            streams.append(
                _residual_replicates(est, [jobs[k] for k in here], squares, progress, dense)
            )
        streams += [
            (
                (rep,)
                for rep in _multi_label_replicates(
                    est, jobs[k][0], None, backend, squares, progress
                )
            )
            for k in apart
        ]
        order = here + apart
        for parts in zip(*streams):
            flat = [rep for part in parts for rep in part]
            yield tuple(flat[order.index(k)] for k in range(len(jobs)))
        return
    yield from zip(*(replicates(est, lab, w, backend, squares, progress) for lab, w in jobs))


def _residual_sums(
    est: _regression.Estimate,
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
    centres = _problem.centre_values(problem) if with_a else None
    for b in range(B):
        sets: list[np.ndarray] = []
        for k in range(c):
            v = np.ones(n) if weights is None else weights[k]
            if with_a:
                sets.extend(v * centres[b, :, d] for d in range(D))  # type: ignore[index]
            if with_u:
                rep = replace(problem, p=problem.p[b : b + 1], labels=labels[k, b : b + 1])
                sets.append(v * v * _problem.residual_weights(rep)[0])
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


#: A bootstrap replicate's query row whose kernel sum ``S0 = sum_i v_i w_ij`` is at or
#: below this (in units of the row's largest unweighted term, ``w_ij = exp(L_ij - m_j)``)
#: leaves the replicate's mean: every centre near it was drawn 0 times, and what is left
#: lies more than 200 nats below the row's maximum, where the engines' sums stop (the
#: dense products drop terms 64 nats below a running class maximum, the fast binary
#: engine's windows stop at 230 nats) and the residual regression is noise.
EMPTY_ROW_FLOOR = float(np.exp(-200.0))

#: Fewest rows whose binary replicates run on the fast binary engine (one O(n log n)
#: call per replicate) rather than as dense products (O(n^2) per replicate at the GEMM
#: rate): the two cost about the same near n = 4,096 on the 2-core machine (top-label;
#: class-wise gains from about 3,000; bench/README.md, "Resampling binary problems").
BINARY_REPLICATES_MIN_N = 4096


def _fast_binary(est: _regression.Estimate, backend: str) -> bool:
    """Whether the replicates of ``est`` run on the fast binary engine.

    Residual and plug-in estimates (``debias`` "none" or "ustat") of binary problems
    (top-label, class-wise) in float64 where the fast binary engine serves them
    (``backend`` "cpp" in this process, "dask" on the workers, "numba" its twin;
    :func:`kdecal._engine.backends.binary_engine_serves`) and n is at least
    :data:`BINARY_REPLICATES_MIN_N`.
    """
    problem = est.problem
    return (
        est.estimator in ("residual", "plugin")
        and est.debias != "ratio"
        and problem.binary
        and problem.dim == 2
        and problem.dtype == np.float64
        and problem.n >= BINARY_REPLICATES_MIN_N
        and (resolved := _backends.resolve_backend(backend)) in ("cpp", "dask", "numba")
        and _backends.binary_engine_serves(resolved, problem.n)
    )


def _binary_replicates(
    est: _regression.Estimate,
    jobs: list[tuple[np.ndarray, np.ndarray | None]],
    squares: bool = True,
    progress: bool | None = None,
    backend: str = "cpp",
) -> Iterator[tuple[_regression.Estimate, ...]]:
    """:func:`replicates_jobs` of an estimate of binary problems, on the fast engine.

    Each replicate is one call of the fast binary engine
    (:func:`kdecal._engine.binary.replicate_sums`, every accumulator within ``3e-9``
    relative of the exact sums) on the replicate's labels, with its multiplicities ``v``
    as centre weights: ``S_c = sum_{i != j} v_i w_ij [y_i = c]``, ``A = sum v_i w_ij f_i``
    and, for the U-statistic, ``Q_c`` with ``v_i^2 w_ij^2`` and ``U = sum w_ij^2 v_i^2
    ||r_i||^2`` (a plug-in estimate: ``S_c`` and, with ``debias="ustat"``, ``Q_c``).
    The sums of :func:`_residual_replicates` (and of the multi-label pass of
    :func:`replicates` for a plug-in) in ``O(n log n)`` per replicate instead of
    ``O(n^2)``; the bootstrap replicates share one sort of the centres (a
    ``BinaryPlan``: their labels are the estimate's). A consistency replicate of a
    residual estimate needs only its label sums ``S_1`` and ``U``
    (:func:`kdecal._engine.binary.consistency_sums`: all centres one class, the labels
    as centre weights, one sort shared by all replicates); its ``S_0 = S - S_1``,
    ``Q`` and ``A`` are the estimate's.

    On ``backend="cpp"`` the replicates run concurrently in this process, one engine
    thread each (:func:`_runtime.get_num_threads` of them, at most ``2 x`` that many
    replicates ahead of the one yielded; one call's rows in parallel lost about a tenth
    to the threads' waits at n = 10^4); on ``"numba"`` one after the other, each call's
    rows on numba's threads.  On ``"dask"`` they are tasks of a few replicates
    each on the workers (:func:`kdecal._engine.binary.replicate_sums_chunk`, about three
    per worker thread; the points broadcast once, the labels sent as int8), whose sums
    come back.  Each replicate's numbers are the same on both, whatever the threads.
    Memory ``O(threads x B n)`` here.
    """
    problem = est.problem
    R, B, n = jobs[0][0].shape
    if any(lab.shape != (R, B, n) for lab, _ in jobs):
        raise ValueError("the jobs of one resampling pass need the same number of replicates")
    resid = est.estimator == "residual"
    # a plug-in replicate keeps the estimate's debiasing (as replicates() does)
    ustat = est.debias == "ustat" and (squares or not resid)
    powers = 2 if ustat else 1
    h = est.bandwidth
    logq, pk = _problem.kernel_points(problem)
    scale = np.array([1.0 / h])
    bias = np.ascontiguousarray(_problem.kernel_bias(problem, h)[:, None, :])
    method = _binary.choose_method(pk, problem.labels, 2, h, powers)
    shared = (logq, pk, scale, bias, method, powers, resid)

    def weights_of(w: np.ndarray | None, k: int) -> np.ndarray | None:
        return None if w is None else np.ascontiguousarray(w[k], dtype=np.float64)

    def formed(k: int, sums: list[tuple[Any, ...]]) -> tuple[_regression.Estimate, ...]:
        return tuple(
            _binary_estimate(est, lab[k], weights_of(w, k), ustat, s)
            for (lab, w), s in zip(jobs, sums)
        )

    total = R * len(jobs) * B * n
    step = len(jobs) * B * n
    # about 1 us per (query, class) and call (bench/README.md, the fast engine)
    show = _runtime.show_progress(total * 2.0 * 1000.0, progress)
    with _runtime.progress_bar(show, total, "kdecal LOO resampling") as cb:
        done = 0
        for k, sums in enumerate(_binary_sums(jobs, shared, backend, R)):
            yield formed(k, sums)
            done += step
            if cb is not None:
                cb(done)


def _binary_sums(
    jobs: list[tuple[np.ndarray, np.ndarray | None]],
    shared: tuple[Any, ...],
    backend: str,
    R: int,
) -> Iterator[list[tuple[Any, ...]]]:
    """Per replicate, in order, the :func:`_binary.replicate_sums` of every job."""
    logq, pk = shared[0], shared[1]
    if backend == "dask":
        per = max(1, -(-R // (3 * _dask.worker_threads())))
        tasks = []
        for r0 in range(0, R, per):
            items = [
                (np.asarray(lab[k], dtype=np.int8), None if w is None else np.asarray(w[k]))
                for k in range(r0, min(R, r0 + per))
                for lab, w in jobs
            ]
            tasks.append((items,))
        for chunk in _dask.map_ordered(
            _binary.replicate_sums_chunk, shared, tasks, "kdecal-replicates-binary"
        ):
            for i in range(0, len(chunk), len(jobs)):
                yield chunk[i : i + len(jobs)]
        return
    core = _runtime._core
    numba = backend == "numba"
    # one sort of the centres for the replicates of a job whose labels are its first
    # replicate's (the bootstrap: the estimate's labels); the engine ignores the plan for
    # a replicate whose labels differ (the numba twin has no plans)
    _, _, scale, bias, method, powers, resid = shared
    # the consistency replicates of a residual estimate: label sums only, all centres one
    # class (one plan of zero labels for all of them)
    cons = [w is None and resid for _, w in jobs]
    plans = [
        None
        if numba or core is None
        else _binary.zero_label_plan(logq, pk)
        if c
        else core.BinaryPlan(logq, pk, np.ascontiguousarray(lab[0], dtype=np.int64), 2)
        if w is not None
        else None
        for (lab, w), c in zip(jobs, cons)
    ]
    workers = 1 if numba else max(1, min(_runtime.get_num_threads(), R))
    engine = "numba" if numba else "cpp"

    def one(k: int) -> list[tuple[Any, ...]]:
        threads = 1 if workers > 1 else None
        return [
            _binary.consistency_sums(
                logq, pk, scale, bias, method, powers == 2, lab[k], plan, threads, engine
            )
            if c
            else _binary.replicate_sums(
                logq,
                pk,
                scale,
                bias,
                method,
                powers,
                resid,
                lab[k],
                None if w is None else w[k],
                plan,
                threads=threads,
                backend=engine,
            )
            for (lab, w), plan, c in zip(jobs, plans, cons)
        ]

    if workers == 1:
        for k in range(R):
            yield one(k)
        return
    pending: deque[Future[list[tuple[Any, ...]]]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for k in range(R):
                pending.append(pool.submit(one, k))
                if len(pending) > 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # Ctrl-C or a consumer that stops: no replicate left running
            for f in pending:
                f.cancel()


def _class_sum(x: np.ndarray) -> np.ndarray:
    """``x.sum(axis=-1)`` of a binary problem's (..., 2) sums, as one elementwise add.

    The same values (numpy adds two terms in that order) without a reduction over an
    axis of length 2, which took about 3 ms per (10, 10,000, 2) array: a class-wise
    replicate's formation made four.
    """
    if x.shape[-1] == 2:
        return x[..., 0] + x[..., 1]
    return x.sum(axis=-1)


def _binary_estimate(
    est: _regression.Estimate,
    labels: np.ndarray,
    rw: np.ndarray | None,
    ustat: bool,
    sums: tuple[Any, ...],
) -> _regression.Estimate:
    """Form one replicate's estimate from its :func:`_binary.replicate_sums`.

    Rows whose every centre of non-negligible weight was drawn 0 times (the kernel sum
    at or below :data:`EMPTY_ROW_FLOOR`) leave the replicate's mean, as in
    :func:`_residual_replicates` and :func:`replicates`.
    """
    assert est.m is not None and est.S is not None
    prob = replace(est.problem, labels=np.ascontiguousarray(labels, dtype=np.int64))
    if len(sums) == 2:  # a consistency replicate's label sums (_binary.consistency_sums)
        assert est.A is not None and (est.Q is not None or not ustat)
        S1, U1 = sums
        s_all = _class_sum(est.S)
        N = np.stack([s_all - S1, S1], axis=-1) - est.A
        den1 = s_all**2 - _class_sum(est.Q) if ustat and est.Q is not None else None
        return _residual_replicate(
            est, prob, est.debias if ustat else "none", s_all, N, den1, U1, rw
        )
    S, Q, A, U = sums
    s0 = _class_sum(S)
    if est.estimator == "residual":
        den = None if Q is None or not ustat else s0**2 - _class_sum(Q)
        return _residual_replicate(
            est, prob, est.debias if ustat else "none", s0, S - A, den, U if ustat else None, rw
        )
    empty = np.any(s0 <= EMPTY_ROW_FLOOR, axis=0)
    if np.any(empty):  # the estimate's sums there: defined values, weight 0
        rw = np.where(empty, 0.0, rw if rw is not None else 1.0)
        S = np.array(S)
        S[:, empty] = est.S[:, empty]
        if Q is not None:
            Q = np.array(Q)
            Q[:, empty] = est.Q[:, empty]  # type: ignore[index]
    rep = _regression.estimate_from(
        prob,
        est.bandwidth,
        est.debias,
        "cpp",
        est.m,
        S,
        Q if Q is not None else np.zeros((0, 0, 0)),
        np.zeros((0, 0, 0)),
        warn=False,
    )
    return replace(rep, row_weights=rw)


#: Classes from which the compiled core's consistency replicates of a residual estimate
#: run on the multi-label pass rather than as dense products (:func:`_consistency_on_multi`).
CONSISTENCY_MULTI_MIN_DIM = 4

#: Classes up to which consistency replicates stay on the dense products where
#: bootstrap replicates share their pass (:func:`_consistency_on_multi`): ``kdecal
#: evaluate``'s canonical intervals and test of the bundled example (K = 10) 11.8-13.1
#: -> 10.5-10.9 s, synthetic K = 4, n = 10,000 3.1-3.4 -> 2.4 s; at K = 30 the
#: multi-label pass is faster again (2.4 against 2.8 s; bench/README.md).
CONSISTENCY_SHARED_MAX_DIM = 10


def _dense_backend(backend: str) -> str | None:
    """Return the engine of the kernel weights of the dense residual replicates.

    "cpp" (the compiled core) or "numba" (its twin); None elsewhere (CUDA and Dask run
    the multi-label pass on their devices and workers).
    """
    resolved = _backends.resolve_backend(backend)
    if (
        resolved == "cpp"
        and _runtime._core is not None
        and hasattr(_runtime._core, "kernel_weights")
    ):
        return "cpp"
    if resolved == "numba" and _engines.load_numba() is not None:
        return "numba"
    return None


def _residual_replicates(
    est: _regression.Estimate,
    jobs: list[tuple[np.ndarray, np.ndarray | None]],
    squares: bool = True,
    progress: bool | None = None,
    engine: str = "cpp",
) -> Iterator[tuple[_regression.Estimate, ...]]:
    """:func:`replicates_jobs` of a residual estimate, as dense products with the kernel.

    Every replicate ``k`` of the residual estimator needs, per problem and query row
    ``j``, ``S0 = sum_i v_i w_ij``, ``R = sum_i v_i w_ij r_i`` (``r_i = y*_i - f_i``, D
    values), and with ``debias="ustat"`` ``Q0 = sum_i v_i^2 w_ij^2`` and ``U = sum_i
    v_i^2 w_ij^2 ||r_i||^2``: ``D + 1`` products with the kernel weights ``W`` and 2 with
    ``W^2`` per bootstrap replicate (multiplicities ``v``); ``D`` and 1 per consistency
    replicate (``v = 1``: ``S0`` and ``Q0`` are the estimate's).  The weights come a
    block of query rows at a time from the compiled core or its numba twin (``engine``,
    :func:`_backends.kernel_weights`, the terms of the multi-label pass), and the
    products of all the replicates of a chunk of every job (a bootstrap and a
    consistency resampling share the weights) are one
    BLAS GEMM per block: ``n^2 (D + 3)`` multiply-adds per replicate at the machine's
    GEMM rate, where the multi-label pass needs one label set per class and value.
    Memory: ``O(chunk x B n (D + 3))`` within :data:`_RESIDUAL_CHUNK_BYTES` (or
    :data:`MAX_CHUNK_BYTES`, :func:`chunk_size`), plus a block of at least 16 rows of
    weights.
    """
    problem = est.problem
    R = jobs[0][0].shape[0]
    _, B, n = jobs[0][0].shape
    if any(lab.shape != (R, B, n) for lab, _ in jobs):
        raise ValueError("the jobs of one resampling pass need the same number of replicates")
    D = problem.dim
    ustat = est.debias == "ustat" and squares
    debias = est.debias if ustat else "none"
    boots = [w is not None for _, w in jobs]
    h = est.bandwidth
    coords = problem.coords
    m_all = est.m
    assert m_all is not None and est.S is not None
    logq_all, pk_all = _problem.kernel_points(problem)
    bias_all = _problem.kernel_bias(problem, h)
    ncol1 = [D + 1 if boot else D for boot in boots]
    ncol2 = [(2 if boot else 1) if ustat else 0 for boot in boots]
    S0_est = Q0_est = None
    if not all(boots):  # S0 and Q0 of a consistency replicate are the estimate's
        S0_est = est.S.sum(axis=-1)
        Q0_est = est.Q.sum(axis=-1) if ustat and est.Q is not None else None
        if ustat and Q0_est is None:  # pragma: no cover - the estimate holds Q with ustat
            raise ValueError("this estimate holds no squared kernel sums to resample")
    per = 8.0 * n * B * (sum(ncol1) + sum(ncol2))  # the chunk's results
    chunk = chunk_size(R, per, _RESIDUAL_CHUNK_BYTES)
    # query rows per block of weights (squared in place for the second product); at
    # least 16 (O(n) memory), so that the products stay matrix products
    rows = int(min(n, max(16, _CHUNK_BYTES // (2 * 8.0 * n))))
    work = float(R) * B * n * n * (sum(ncol1) + sum(ncol2)) / 4.0
    show = _runtime.show_progress(work, progress)
    total = -(-R // chunk) * B * n
    scale = 1.0 / h
    low, check = _single_products(est, boots)
    with _runtime.progress_bar(show, total, "kdecal LOO resampling") as cb:
        done = 0
        for r0 in range(0, R, chunk):
            r1 = min(R, r0 + chunk)
            c = r1 - r0
            S0 = [np.empty((c, B, n)) if boot else None for boot in boots]
            N = [np.empty((c, B, n, D)) for _ in jobs]
            Q0 = [np.empty((c, B, n)) if boot and ustat else None for boot in boots]
            U = [np.empty((c, B, n)) if ustat else None for _ in jobs]
            v = [None if w is None else np.asarray(w[r0:r1], dtype=np.float64) for _, w in jobs]
            # the products on the engine's threads where set_num_threads set them (no
            # yield inside: the limit is not held while the caller runs)
            with _runtime.blas_threads(_runtime._num_threads or None):
                for b in range(B):
                    logq = np.ascontiguousarray(logq_all[b])
                    pk = np.ascontiguousarray(pk_all[b])
                    m = np.ascontiguousarray(m_all[b], dtype=np.float64)
                    bias = np.ascontiguousarray(bias_all[b])
                    M1 = M2 = None
                    single: tuple[np.ndarray, np.ndarray | None] | None = None
                    low_b = low  # float32 until a block's rows fail the count
                    for j0 in range(0, n, rows):
                        j1 = min(n, j0 + rows)
                        W, order = _backends.kernel_weights(
                            logq, pk, m, scale, bias, j0, j1, backend=engine, single=low_b
                        )
                        if low_b and check[b] and not _single_rows_hold(W):
                            low_b = False  # this block and the problem's next ones in float64
                            W, order = _backends.kernel_weights(
                                logq, pk, m, scale, bias, j0, j1, backend=engine
                            )
                        if M1 is None:  # the chunk's value columns, in the weights' order
                            cols = [
                                _value_columns(
                                    problem.p[b], lab[r0:r1, b], vk, coords, order, ustat
                                )
                                for (lab, _), vk in zip(jobs, v)
                            ]
                            M1 = cols[0][0] if len(jobs) == 1 else np.hstack([x[0] for x in cols])
                            if ustat:
                                M2 = (
                                    cols[0][1]
                                    if len(jobs) == 1
                                    else np.hstack([x[1] for x in cols])  # type: ignore[misc]
                                )
                            if low:
                                single = (
                                    _backends.single_precision(M1),
                                    None if M2 is None else _backends.single_precision(M2),
                                )
                        V1, V2 = (M1, M2) if single is None or W.dtype == np.float64 else single
                        out_all = _products(W, V1)
                        out2_all = None
                        if ustat:
                            assert V2 is not None
                            if W.dtype == np.float32:  # squares below float32's normal range: 0
                                np.copyto(W, 0.0, where=W < _SQUARE_FLOOR)
                            np.multiply(W, W, out=W)
                            out2_all = _products(W, V2)
                        del W
                        o1 = o2 = 0
                        for t in range(len(jobs)):
                            out = out_all[:, o1 : o1 + c * ncol1[t]].reshape(j1 - j0, c, ncol1[t])
                            o1 += c * ncol1[t]
                            S0t = S0[t]
                            if S0t is not None:
                                S0t[:, b, j0:j1] = out[:, :, 0].T
                            N[t][:, b, j0:j1] = out[:, :, ncol1[t] - D :].transpose(1, 0, 2)
                            Ut = U[t]
                            if out2_all is not None and Ut is not None:
                                out2 = out2_all[:, o2 : o2 + c * ncol2[t]].reshape(
                                    j1 - j0, c, ncol2[t]
                                )
                                o2 += c * ncol2[t]
                                Q0t = Q0[t]
                                if Q0t is not None:
                                    Q0t[:, b, j0:j1] = out2[:, :, 0].T
                                Ut[:, b, j0:j1] = out2[:, :, ncol2[t] - 1].T
                        done += j1 - j0
                        if cb is not None:
                            cb(done)
            for k in range(c):
                reps = []
                for t, (lab, weights) in enumerate(jobs):
                    S0t, Q0t, Ut = S0[t], Q0[t], U[t]
                    s0 = S0t[k] if S0t is not None else S0_est
                    assert s0 is not None
                    nk = N[t][k]
                    den = uk = None
                    if ustat:
                        assert Ut is not None
                        q0 = Q0t[k] if Q0t is not None else Q0_est
                        den, uk = s0**2 - q0, Ut[k]
                    rw = None if weights is None else weights[r0 + k]
                    prob = replace(problem, labels=np.ascontiguousarray(lab[r0 + k]))
                    reps.append(_residual_replicate(est, prob, debias, s0, nk, den, uk, rw))
                yield tuple(reps)


#: Centres per float32 product of :func:`_products`, summed in float64 across blocks.
PRODUCT_BLOCK = 2048

#: Float32 products of a bootstrap: every query row needs at least
#: :data:`SINGLE_MIN_CENTRES` centres with kernel weights of at least
#: :data:`SINGLE_MIN_WEIGHT` of the row's largest (:func:`_single_products`).
SINGLE_MIN_CENTRES = 40
SINGLE_MIN_WEIGHT = 2.0**-40

_SQUARE_FLOOR = np.float32(2.0**-63)  # weights whose squares stay normal float32


def _single_products(est: _regression.Estimate, boots: list[bool]) -> tuple[bool, np.ndarray]:
    """Whether the dense replicates of ``est`` form their products in float32.

    Returns ``(low, check)``: ``low`` for a float32 problem (its kernel already runs in
    float32): the weights and value columns rounded to float32 (0 below float32's
    smallest normal number, ``2^-126``: subnormal operands would slow the products
    down), the products summed in float64 across blocks of :data:`PRODUCT_BLOCK`
    centres (:func:`_products`), so that each sum errs by at most ``PRODUCT_BLOCK``
    float32 roundings (``1.2e-4``) of the sum of its terms' magnitudes, and in practice
    by about 1e-7 of the sum (bench/README.md). The squared weights are formed from the
    weights of at least ``2^-63`` (0 below, so that every square is a normal float32).

    A bootstrap replicate whose drawn centres are all that far from a query row must not
    depend on what float32 drops. So with a bootstrap job each query row needs
    :data:`SINGLE_MIN_CENTRES` centres with weights of at least ``t =``
    :data:`SINGLE_MIN_WEIGHT` ``= 2^-40`` of its largest: a replicate draws none of them
    with probability ``e^-40`` (4e-18); otherwise its kernel sum is at least ``t`` and
    its sum of squared weights ``t^2``, and what float32 drops is below ``n 2^-86`` of
    the former and ``n 2^-46`` (``n 1.4e-14``) of the latter. ``check`` (B,) marks the
    problems where :func:`_single_rows_hold` must count those centres in every block of
    weights: where every row's kernel sum ``sum_i w_ij`` (each weight at most 1) is at
    least ``SINGLE_MIN_CENTRES + n t``, it holds without counting. The first block of a
    problem that fails the count is formed anew in float64, and so are the problem's
    later blocks in that chunk of replicates, without counting (narrow bandwidths, where
    most blocks would fail): a block's precision depends only on the counts of its own
    and earlier blocks, the same in every chunk.
    """
    B = est.problem.labels.shape[0]
    none = np.zeros(B, dtype=bool)
    if est.problem.dtype != np.float32:
        return False, none
    if not any(boots):  # consistency replicates: every centre, the estimate's sums
        return True, none
    assert est.S is not None
    n = est.problem.labels.shape[-1]
    S0 = est.S.sum(axis=-1).reshape(B, -1)
    floor = SINGLE_MIN_CENTRES + n * SINGLE_MIN_WEIGHT
    return True, ~(S0.min(axis=-1, initial=np.inf) >= floor)


def _single_rows_hold(W: np.ndarray) -> bool:
    """Whether every row of float32 weights has the centres :func:`_single_products` needs."""
    if W.shape[0] == 0:
        return True
    big = np.count_nonzero(W >= np.float32(SINGLE_MIN_WEIGHT), axis=1)
    return bool(big.min() >= SINGLE_MIN_CENTRES)


def _products(W: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Return ``W @ M`` in float64.

    float64 operands: one GEMM. float32 operands (:func:`_single_products`): a float32
    GEMM per block of :data:`PRODUCT_BLOCK` centres, the blocks summed in float64.
    """
    if W.dtype == np.float64:
        return W @ M
    out = np.zeros((W.shape[0], M.shape[1]))
    for k in range(0, W.shape[1], PRODUCT_BLOCK):
        out += W[:, k : k + PRODUCT_BLOCK] @ M[k : k + PRODUCT_BLOCK]
    return out


def _residual_replicate(
    est: _regression.Estimate,
    prob: _problem.Problem,
    debias: str,
    s0: np.ndarray,
    nk: np.ndarray,
    den: np.ndarray | None,
    uk: np.ndarray | None,
    rw: np.ndarray | None,
) -> _regression.Estimate:
    """Form one residual replicate from its sums (:func:`_regression.residual_from_sums`).

    ``s0`` (B, n), ``nk`` (B, n, D), ``den``, ``uk`` (B, n) or None; ``rw`` (n,) the row
    multiplicities (None: all 1).  A bootstrap sample can hold no centre with a
    non-negligible weight for some query row (all its neighbours drawn 0 times: the
    kernel sum at or below :data:`EMPTY_ROW_FLOOR`): the estimator is undefined there,
    so the row leaves that replicate's mean (weight 0, neutral sums).
    """
    empty = np.any(s0 <= EMPTY_ROW_FLOOR, axis=0)
    if np.any(empty):
        s0 = np.where(empty[None], 1.0, s0)
        nk = np.where(empty[None, :, None], 0.0, nk)
        if den is not None and uk is not None:
            den = np.where(empty[None], 1.0, den)
            uk = np.where(empty[None], 0.0, uk)
        rw = np.where(empty, 0.0, rw if rw is not None else 1.0)
    rep = _regression.residual_from_sums(
        prob, est.bandwidth, debias, est.m, s0, nk, den, uk, warn=False, row_weights=rw
    )
    return replace(rep, row_weights=rw)


def _value_columns(
    p: np.ndarray,
    labels: np.ndarray,
    v: np.ndarray | None,
    coords: slice,
    order: np.ndarray,
    ustat: bool,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Build the value columns of c replicates of one problem, rows in ``order``.

    With multiplicities ``v`` (c, n): ``M1[i, k] = (v_ki, v_ki r_ki)`` (n, c (D + 1))
    and ``M2[i, k] = (v_ki^2, v_ki^2 ||r_ki||^2)`` (n, 2 c); without: ``M1[i, k] =
    r_ki`` (n, c D) and ``M2[i, k] = ||r_ki||^2`` (n, c); ``r_ki = onehot(labels[k, i])
    - p_i``, the norm over ``coords``; ``M2`` only with ``ustat``.
    """
    lab = labels[:, order].T  # (n, c)
    n, c = lab.shape
    D = p.shape[-1]
    off = 0 if v is None else 1  # the column of v
    M1 = np.empty((n, c, D + off))
    r = M1[:, :, off:]  # built in place: r = onehot(label) - p
    r[...] = -np.asarray(p, dtype=np.float64)[order][:, None, :]
    np.add.at(r, (np.arange(n)[:, None], np.arange(c)[None, :], lab), 1.0)
    u = np.sum(r[..., coords] ** 2, axis=-1) if ustat else None  # (n, c)
    M2 = None
    if v is None:
        if u is not None:
            M2 = u
        return M1.reshape(n, c * D), M2
    vo = np.ascontiguousarray(v[:, order].T)  # (n, c)
    r *= vo[:, :, None]
    M1[:, :, 0] = vo
    if u is not None:
        vo *= vo
        M2 = np.empty((n, c, 2))
        M2[:, :, 0] = vo
        np.multiply(vo, u, out=M2[:, :, 1])
        M2 = M2.reshape(n, 2 * c)
    return M1.reshape(n, c * (D + 1)), M2
