"""Bandwidth selection.

The papers' leave-one-out likelihood of the density of f, and the leave-one-out risk
of the regression ``E[y | f]`` (Brier or log score), searched coarse to fine.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
from scipy.special import gammaln

from .. import _formulas as _f
from .._engine import backends as _backends
from .._engine import binary as _binary
from ..warnings import KdecalWarning, warn_user
from .problem import (
    Problem,
    content_order,
    engine,
    kernel_bias,
    kernel_points,
    problem_chunks,
    subproblem,
)

#: Default grid of :func:`select_bandwidth`: 50 log-spaced values in [1e-5, 1e-1] and
#: 0.2, 0.4, 0.6, 0.8, 1.0 (the grid of Popordanoska et al. 2024's code).
DEFAULT_BANDWIDTH_GRID = np.concatenate([np.logspace(-5, -1, 50), [0.2, 0.4, 0.6, 0.8, 1.0]])
DEFAULT_BANDWIDTH_GRID.setflags(write=False)


def loo_log_likelihood(
    problem: Problem, hs: np.ndarray, backend: str, progress: bool | None = None
) -> np.ndarray:
    """Mean LOO log density per problem and bandwidth, shape (B, H)."""
    m, S, _, _ = engine(problem, hs, labelled=False, powers=1, backend=backend, progress=progress)
    n, D = problem.n, problem.dim
    log_dens = gammaln(1.0 / hs + D)[None, :, None] + m + np.log(S[..., 0]) - np.log(n - 1)
    return np.asarray(log_dens.mean(axis=-1))


def select_bandwidth(
    problem: Problem, grid: np.ndarray, backend: str, progress: bool | None = None
) -> float:
    """Grid value maximising the LOO likelihood (summed over the problems of a batch)."""
    ll = loo_log_likelihood(problem, grid, backend, progress).sum(axis=0)
    h = float(grid[int(np.argmax(ll))])
    warn_at_grid_end(h, grid, "loo-mle")
    return h


_F = TypeVar("_F", bound=Callable[..., Any])

#: The grid-end warnings raised so far in the current call of a function decorated
#: with :func:`grid_end_warnings_once` (None outside one).
_GRID_END_SHOWN: ContextVar[set[str] | None] = ContextVar("kdecal_grid_end_shown", default=None)


def grid_end_warnings_once(func: _F) -> _F:
    """Decorate ``func``: within a call, each text of :func:`warn_at_grid_end` is raised once.

    ``kdecal.evaluate`` and ``compare`` search one bandwidth per notion (and model):
    the same warning, word for word, came once per search (Python's "default" filter
    does not dedupe it, as the filters change between the searches). Calls nest (the
    outer call's record is kept). A wrapper of kdecal's own, not a context manager of
    ``contextlib``, so that the warnings name the caller's line (:func:`warn_user`).
    """

    @functools.wraps(func)
    def each_text_once(*args: Any, **kwargs: Any) -> Any:
        token = _GRID_END_SHOWN.set(set()) if _GRID_END_SHOWN.get() is None else None
        try:
            return func(*args, **kwargs)
        finally:
            if token is not None:
                _GRID_END_SHOWN.reset(token)

    return cast(_F, each_text_once)


def warn_at_grid_end(
    h: float, grid: np.ndarray, criterion: str, tried: Mapping[float, float] | None = None
) -> None:
    """Warn when a search of more than one bandwidth chose an end of its range.

    ``tried``: the criterion's value at each bandwidth the automatic search evaluated
    (:attr:`Search.tried`). Where it holds both ends of ``grid`` and every value is the
    same (to 1e-12 relative: all prediction vectors identical, or one-hot top-label
    confidences all 1, where the kernel weighs every centre alike at every bandwidth),
    the end was chosen by a tie over the whole range: no warning. Not for a caller's
    grid: a risk flat over a few tiny bandwidths (the kernel then acts as a
    nearest-neighbour rule) can fall beyond them.
    """
    lo, hi = float(np.min(grid)), float(np.max(grid))
    if tried is not None and tried and min(tried) <= lo and max(tried) >= hi:
        r = np.asarray(list(tried.values()), dtype=np.float64)
        scale = max(float(np.max(np.abs(r))), 1e-300)
        if np.all(np.isfinite(r)) and float(np.ptp(r)) <= 1e-12 * scale:
            return
    if len(grid) > 1 and (h <= lo or h >= hi):
        text = (
            f"the bandwidth search ({criterion} criterion) chose h = {h:g}, the "
            f"{'smallest' if h <= lo else 'largest'} value of the search range [{lo:g}, {hi:g}]: "
            "the optimum may lie outside it; pass a fixed bandwidth or inspect "
            "kdecal.select_bandwidth(..., grid=...)"
        )
        shown = _GRID_END_SHOWN.get()
        if shown is not None:
            if text in shown:
                return
            shown.add(text)
        warn_user(text, KdecalWarning)


# ------------------------------------------------------------- regression bandwidth

#: Bandwidth criteria: leave-one-out cross-validation of the regression ``E[y | f]``
#: with the Brier or the log score, or the papers' LOO likelihood of the density of f.
CRITERIA = ("brier", "log", "loo-mle")

#: Grid of the regression bandwidth search: 73 log-spaced values in [1e-5, 10], a ratio
#: of 10^(1/12) ~ 1.21 between neighbours. Bandwidths above 1 matter for near one-hot
#: predictions at large K, where the Dirichlet kernel at h ~ 1-3 weighs a centre by the
#: query's probability of the centre's top class (a confusion-matrix-like regression).
SEARCH_GRID = np.logspace(-5.0, 1.0, 73)
SEARCH_GRID.setflags(write=False)

#: Query rows of the subsampled stages of the search: at least this many, else n / 20
#: (the coarse stage uses half of them).
SEARCH_SUBSET_MIN = 500

#: ... and at most this many (n / 20 would make the subset stages cost 0.6 passes).
SEARCH_SUBSET_MAX = 5000

#: Most query rows the search compares bandwidths on (the rows doubling stops there),
#: or None: all n. None by default: capped at 20,000 rows at n = 100,000, the chosen
#: bandwidth's estimates moved by 0.23-0.25 bootstrap standard errors on resampled
#: CIFAR-10 predictions, more than the 0.1 the search is allowed
#: (``bench/search_rows.py``, ``bench/README.md``, "Search rows").
SEARCH_ROWS_MAX: int | None = None

#: Paired standard errors by which a neighbour of the best bandwidth must be worse on
#: the rows evaluated so far for the search to stop evaluating it on more rows.
SEARCH_SEPARATED_Z = 4.0

#: Paired standard errors by which the local minimum of one mode of the risk curve must
#: be worse than the best mode's for the search to stop following that mode.
SEARCH_MODE_Z = 2.0

#: :func:`_search_bandwidths` evaluates the whole grid on all rows (the exact argmin) for
#: problems of at most this many points, ...
SEARCH_EXHAUSTIVE_MAX_N = 1000

#: ... and for batches of ``B`` problems of ``n`` points with ``B n^2`` at most this many
#: pairs (a single problem of up to 2,000 points: there the search's stages cost about as
#: many passes as the grid, 0.1-0.4 s, and on 366 real subsets of 1,001-2,000 points it
#: missed the argmin in 10, moving the estimates by 0.2-23 bootstrap standard errors;
#: ``bench/README.md``, "The exhaustive grid up to 2,000 points").
SEARCH_EXHAUSTIVE_MAX_PAIRS = 4_000_000

#: Bandwidths per engine call where :func:`_search_bandwidths` evaluates the whole grid
#: (:data:`SEARCH_EXHAUSTIVE_MAX_N`): each call holds the class sums of that many
#: bandwidths on all rows.
SEARCH_EXHAUSTIVE_GROUP = 8

#: Memory (bytes) the search may hold in accumulators of candidate bandwidths so that
#: its last stages double as the estimate's pass. Above it, the accumulators farthest
#: from the current best are dropped (their rows are recomputed if one of them is
#: chosen); when a window of 3 bandwidths alone exceeds it, the estimate runs its own.
SEARCH_FUSE_BYTES = 2 << 30

#: Points of the random sample whose own risk curve (its rows as queries and as centres)
#: places the search's start on problems that the fast binary engine serves: n / 20,
#: clipped to [SEARCH_SAMPLE_MIN, SEARCH_SAMPLE_MAX] (all n points below the minimum), so
#: that its 17 bandwidths cost about one pass over all n points at n >= 20,000.
SEARCH_SAMPLE_MIN = 1000

#: ... and at most this many (fewer points find spurious modes, each followed on all
#: rows: 1,000 points cost a resampled CIFAR-10 class-wise search at n = 100,000 a second
#: mode and 40 % more time than 5,000).
SEARCH_SAMPLE_MAX = 5000

#: How the leave-one-out risk's minimiser moves with the number of points n, as a power
#: of n: ``h ~ n^(-SEARCH_RATE)``.  A kernel regression in one dimension whose width in
#: ``z = arcsin sqrt(x)`` (``sqrt(h) / 2``) falls as ``n^(-1/5)`` gives 0.4; the ratios of
#: the sample's minimiser (5,000 points) to the minimiser on all rows measured 0.45-0.83
#: (top-label and class-wise, synthetic and resampled CIFAR-10, n = 100,000 and 10^6).
#: The start only saves steps of the local search, which ends at a local minimum on all
#: rows wherever it starts (``bench/README.md``, "The search on the fast engine").
SEARCH_RATE = 0.6

#: Paired standard errors within which a bandwidth's leave-one-out risk may lie above
#: its neighbours' for the search on all rows to stop there without checking them (the
#: risk tolerance of issue 27), or None: every local minimum is checked one grid step
#: away. None by default: at 0.1, the search on all rows saved 2 passes on 18 of 24
#: real files, but its bandwidth, one grid step from the exhaustive argmin on 4 of them,
#: moved the top-label L1 estimate by up to 0.27 of its bootstrap standard error (0.1
#: allowed; ``bench/search_tolerance.py``, ``bench/README.md``).
SEARCH_TOLERANCE_SE: float | None = None


#: Transient bytes per (problem, point) of a search pass that keeps no accumulators
#: (up to three bandwidths: the class sums and maxima, the biases, the risks'
#: temporaries, and the compiled core's sorted copy of the problems), by which
#: :func:`kdecal._estimation.problem.problem_chunks` chunks a large batch.
SEARCH_POINT_BYTES = 208.0


def cv_risk_rows(
    problem: Problem,
    S: np.ndarray,
    criterion: str,
    rows: slice,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """Per-row leave-one-out risk of the kernel regression, shape (H, R).

    ``S`` (B, H, R, C) holds the class sums of the query rows ``rows`` of ``problem``.
    "brier": ``||y_j - E_-j(f_j)||^2`` over the coordinates that enter L2 quantities (the
    positive one of binary problems); "log": ``-log E_-j(f_j)[y_j]`` (floored at 1e-300).
    Summed over the problems of a batch. ``into`` (H, R): the problems' risks are added
    to it one problem after the other (as ``np.sum`` over the batch adds them), so that a
    batch summed a chunk of problems at a time gives the same bits; it is returned.
    """
    lab = problem.labels[:, rows]  # (B, R)
    out = np.zeros(S.shape[1:3]) if into is None else into
    positive = lab == 1 if problem.binary else None
    with np.errstate(under="ignore"):  # ratios of tiny class sums: 0 is their value
        for t in range(S.shape[1]):
            St = S[:, t]
            if positive is not None:
                # binary problems: the same numbers, without the (B, R, 2) temporaries
                # (E_1 = S_1 / (S_0 + S_1); the Brier risk on the positive coordinate)
                s0, s1 = St[..., 0], St[..., 1]
                total = s0 + s1
                if criterion == "brier":
                    err = (s1 / total - positive) ** 2
                else:
                    err = -np.log(np.maximum(np.where(positive, s1, s0) / total, 1e-300))
            else:
                E = St / St.sum(axis=-1, keepdims=True)
                if criterion == "brier":
                    c = problem.coords
                    err = _f.squared_rows(E[..., c], _f.one_hot(lab, St.shape[-1])[..., c])
                else:
                    err = _f.log_risk_rows(np.maximum(E, 1e-300), lab)
            if into is None:
                out[t] = np.sum(err, axis=0)
            else:
                for e in err:
                    out[t] += e
    return out


def cv_risk(problem: Problem, S: np.ndarray, criterion: str, rows: slice) -> np.ndarray:
    """Mean leave-one-out risk at each bandwidth, shape (H,); see :func:`cv_risk_rows`."""
    return np.asarray(cv_risk_rows(problem, S, criterion, rows).mean(axis=1))


def cv_risk_grid(
    problem: Problem, grid: np.ndarray, criterion: str, backend: str, progress: bool | None = None
) -> np.ndarray:
    """Exact leave-one-out risk at every bandwidth of ``grid`` (one pass), shape (H,)."""
    _, S, _, _ = engine(problem, grid, labelled=True, powers=1, backend=backend, progress=progress)
    return cv_risk(problem, S, criterion, slice(None))


@dataclass(frozen=True)
class Search:
    """Record of a bandwidth search: the candidates tried and their risks."""

    criterion: str
    bandwidth: float
    tried: dict[float, float]  # bandwidth -> mean risk on the rows it was evaluated on
    subset_rows: int  # query rows of the last stage (all n)
    kernel_work: float  # kernel evaluations, in units of n^2 (one bandwidth, all rows)


def search_bandwidth(
    problem: Problem,
    criterion: str,
    powers: int,
    backend: str,
    progress: bool | None = None,
) -> tuple[Search, tuple[np.ndarray, ...]]:
    """Search one criterion; see :func:`search_bandwidths`."""
    return search_bandwidths(problem, (criterion,), powers, backend, progress)[criterion]


class _Evaluations:
    """Per-row risks of grid bandwidths on the rows ``[0, have)`` of a row-permuted problem.

    Every engine call serves every criterion (the class sums give each one's risk).  With
    ``keep`` the calls also hold the accumulators with the ``powers`` an estimate needs,
    so that the accumulators of the chosen bandwidth need no further pass over the rows
    already evaluated; :meth:`retain` bounds how many bandwidths' accumulators are held.
    """

    def __init__(
        self,
        sub: Problem,
        criteria: tuple[str, ...],
        powers: int,
        backend: str,
        progress: bool | None,
    ) -> None:
        self.sub, self.criteria, self.powers = sub, criteria, powers
        self.backend, self.progress = backend, progress
        self.risks: dict[str, dict[int, list[np.ndarray]]] = {c: {} for c in criteria}
        self.have: dict[int, int] = {}
        self.blocks: dict[int, list[tuple[int, int, tuple[np.ndarray, ...]]]] = {}
        self.work = 0.0
        # the kernel inputs, each bandwidth's bias computed once (n K lgamma calls) and
        # dropped once it has been evaluated on all rows (unless accumulators are kept)
        self.logq, self.pk = kernel_points(sub)
        self.bias: dict[int, np.ndarray] = {}
        # passes that keep no accumulators run a chunk of the batch's problems at a time
        # (class-wise at many classes), their risks summed over the chunks
        self.chunks = problem_chunks(sub, SEARCH_POINT_BYTES)

    def _engine(
        self, idx: list[int], r0: int, r1: int, full: bool, problems: slice | None = None
    ) -> tuple[np.ndarray, ...]:
        for i in idx:
            if i not in self.bias:
                self.bias[i] = kernel_bias(self.sub, float(SEARCH_GRID[i]))
        sel = slice(None) if problems is None else problems
        if len(idx) == 1:  # a view (B, 1, n): no copy
            bias = np.ascontiguousarray(self.bias[idx[0]][sel, None, :])
        else:
            bias = np.ascontiguousarray(np.stack([self.bias[i][sel] for i in idx], axis=1))
        sub = self.sub if problems is None else subproblem(self.sub, problems)
        logq = self.logq if problems is None else self.logq[problems]
        pk = self.pk if problems is None else self.pk[problems]
        sums = engine(
            sub,
            SEARCH_GRID[idx],
            labelled=True,
            powers=self.powers if full else 1,
            backend=self.backend,
            progress=self.progress,
            rows=(r0, r1),
            pairs=full and self.powers >= 2,
            inputs=(logq, pk, bias),
        )
        if problems is None or problems.start == 0:
            self.work += (r1 - r0) / self.sub.n * len(idx)
        return sums

    def ensure(self, idx: list[int], upto: int, keep: bool) -> None:
        """Evaluate the grid indices ``idx`` on rows ``[0, upto)`` (only what is missing)."""
        groups: dict[int, list[int]] = {}
        for i in idx:
            if self.have.get(i, 0) < upto:
                groups.setdefault(self.have.get(i, 0), []).append(i)
        for r0, group in sorted(groups.items()):
            rows = slice(r0, upto)
            if keep or len(self.chunks) == 1:
                sums = self._engine(group, r0, upto, keep)
                risks = {c: cv_risk_rows(self.sub, sums[1], c, rows) for c in self.criteria}
            else:
                risks = {c: np.zeros((len(group), upto - r0)) for c in self.criteria}
                for sl in self.chunks:
                    S = self._engine(group, r0, upto, False, sl)[1]
                    for c in self.criteria:
                        cv_risk_rows(subproblem(self.sub, sl), S, c, rows, into=risks[c])
                    del S
            for c in self.criteria:
                for i, r in zip(group, risks[c]):
                    self.risks[c].setdefault(i, []).append(r)
            for t, i in enumerate(group):
                self.have[i] = upto
                if keep:
                    one = tuple(np.ascontiguousarray(x[:, t]) if x.size else x for x in sums)
                    self.blocks.setdefault(i, []).append((r0, upto, one))
                elif upto == self.sub.n:
                    self.bias.pop(i, None)

    def risk(self, c: str, i: int, rows: int) -> np.ndarray:
        """Per-row risks of grid index ``i`` on the rows ``[0, rows)``."""
        return np.concatenate(self.risks[c][i])[:rows]

    def retain(self, idx: set[int], budget: float = 0.0) -> None:
        """Drop accumulators, farthest from ``idx`` first, until at most ``budget`` bytes.

        The accumulators of ``idx`` are never dropped.
        """

        def size(i: int) -> int:
            return sum(x.nbytes for blk in self.blocks[i] for x in blk[2])

        held = {i: size(i) for i in self.blocks}
        total = sum(held.values())
        far = sorted(
            (i for i in held if i not in idx),
            key=lambda i: min((abs(i - j) for j in idx), default=0),
            reverse=True,
        )
        for i in far:
            if total <= budget:
                break
            total -= held[i]
            del self.blocks[i]

    def sums(self, i: int) -> tuple[np.ndarray, ...]:
        """Accumulators of grid index ``i`` on all rows, in the permuted row order."""
        parts, at = [], 0  # the held blocks in row order, gaps computed
        for r0, r1, one in sorted(self.blocks.get(i, []), key=lambda blk: blk[0]):
            if r0 > at:
                parts.append(self._one(i, at, r0))
            parts.append(one)
            at = r1
        if at < self.sub.n:
            parts.append(self._one(i, at, self.sub.n))
        return tuple(
            np.concatenate([p[k] for p in parts], axis=1) if parts[0][k].size else parts[0][k]
            for k in range(len(parts[0]))
        )

    def _one(self, i: int, r0: int, r1: int) -> tuple[np.ndarray, ...]:
        sums = self._engine([i], r0, r1, True)
        return tuple(np.ascontiguousarray(x[:, 0]) if x.size else x for x in sums)


def search_bandwidths(
    problem: Problem,
    criteria: tuple[str, ...],
    powers: int,
    backend: str,
    progress: bool | None = None,
) -> dict[str, tuple[Search, tuple[np.ndarray, ...]]]:
    """Minimise leave-one-out risks over :data:`SEARCH_GRID`.

    Binary problems that the fast binary engine serves (top-label, class-wise, n >=
    2,048 on the compiled core) are searched by :func:`_search_all_rows`, every other
    problem by :func:`_search_bandwidths`: both return a local minimum of the exact
    leave-one-out risk on all rows.  The search's engine calls on binary problems share
    one sort of the centres and each bandwidth's cells
    (:func:`kdecal._engine.binary.reuse_plans`).
    """
    with _binary.reuse_plans():
        if problem.binary and _backends.binary_engine_serves(
            _backends.resolve_backend(backend), problem.n
        ):
            return _search_all_rows(problem, criteria, powers, backend, progress)
        return _search_bandwidths(problem, criteria, powers, backend, progress)


def _search_all_rows(
    problem: Problem,
    criteria: tuple[str, ...],
    powers: int,
    backend: str,
    progress: bool | None = None,
) -> dict[str, tuple[Search, tuple[np.ndarray, ...]]]:
    """Minimise leave-one-out risks over :data:`SEARCH_GRID`, every risk on all rows.

    The search of the problems that the fast binary engine serves.  There a bandwidth's
    pass costs a fixed part (its kernel biases, cells and local expansions over all n
    centres) plus a small part per query row: a pass over a subset of the rows costs a
    quarter to a half of one over all of them, so :func:`_search_bandwidths`'s subsets
    of rows save little, while the walk of its local search through a flat risk curve
    (one new bandwidth per step, at each doubling of the rows) cost 15-40 passes.  Here,
    for each criterion:

    1. a random sample of ``m = n / 20`` points (:data:`SEARCH_SAMPLE_MIN` to
       :data:`SEARCH_SAMPLE_MAX`), a problem of its own (its rows are the queries and the
       centres), is searched on every 6th grid value; around each local minimum whose
       paired mean risk excess over the best is within 3 standard errors, on the grid
       values 2 and 4 steps away; the best of each such window, moved by
       ``(m / n)^``:data:`SEARCH_RATE` (the minimiser's rate in n), is a start;
    2. from each start, a local search on all rows: the start and the grid values 2
       steps away, stepping while one is better; then 1 step away, stepping while one
       is better, until the best is a local minimum of the exact risk on all rows
       (unless :data:`SEARCH_TOLERANCE_SE`, off by default, settles it first:
       :func:`_settled`).

    The result is the best of these local minima: as with :func:`_search_bandwidths`, a
    local minimum of the exact leave-one-out risk on all n rows; every evaluation on the
    full problem holds the accumulators ``powers`` asks (while they fit in
    :data:`SEARCH_FUSE_BYTES`), so that the chosen bandwidth's need no further pass.
    Returns what :func:`_search_bandwidths` returns; ``tried`` holds the risks on all rows
    of the full problem, ``kernel_work`` counts the sample's passes by their share of the
    points.
    """
    grid = SEARCH_GRID
    G, n = len(grid), problem.n
    m = min(n, max(SEARCH_SAMPLE_MIN, min(SEARCH_SAMPLE_MAX, n // 20)))
    held = 4 * (powers + 1) * problem.p.shape[0] * n * (problem.dim + 1) * 8
    keep = 0 < powers and held <= SEARCH_FUSE_BYTES
    ev = _Evaluations(problem, criteria, max(powers, 1), backend, progress)
    if m < n:
        # a random-looking sample that the caller's row order does not change
        idx = content_order(problem)[:m]
        sample = Problem(
            problem.calibration,
            np.ascontiguousarray(problem.p[:, idx]),
            np.ascontiguousarray(problem.labels[:, idx]),
            problem.dtype,
        )
        es = _Evaluations(sample, criteria, 1, backend, progress)
    else:
        es = ev
    # grid steps by which the minimiser moves from m to n points (<= 0: smaller h)
    shift = round(float(SEARCH_RATE * np.log(m / n) / np.log(grid[1] / grid[0])))

    def sample_risk(c: str, i: int) -> float:
        return float(np.mean(es.risk(c, i, m)))

    def full_risk(c: str, i: int) -> float:
        return float(np.mean(ev.risk(c, i, n)))

    def starts(c: str) -> list[int]:
        out = set()
        for i in _coarse_modes(es, c, m):
            window = [j for j in (i - 4, i - 2, i, i + 2, i + 4) if 0 <= j < G]
            es.ensure(window, m, False)
            best = min(window, key=lambda j: sample_risk(c, j))
            out.add(int(np.clip(best + shift, 0, G - 1)))
        return sorted(out)

    def descend(c: str, b: int) -> int:
        for step in (2, 1):
            if step == 1 and _settled(ev, c, b, n):
                break
            while True:
                need = [b] + [i for i in (b - step, b + step) if 0 <= i < G]
                ev.ensure(need, n, keep)
                nb = min(need, key=lambda i: full_risk(c, i))
                ev.retain({nb - 1, nb, nb + 1} | winners, SEARCH_FUSE_BYTES)
                if nb == b:
                    break
                b = nb
        return b

    chosen: dict[str, int] = {}
    winners: set[int] = set()  # accumulators kept for the criteria already searched
    for c in criteria:
        ends = [descend(c, b) for b in starts(c)]
        chosen[c] = min(ends, key=lambda i: full_risk(c, i))
        winners.add(chosen[c])
    acc: dict[int, tuple[np.ndarray, ...]] = {}
    if powers > 0:
        if not keep:
            ev.retain(set())
        for b in chosen.values():
            if b not in acc:
                acc[b] = ev.sums(b)
    work = ev.work + (es.work * m / n if es is not ev else 0.0)
    out = {}
    for c, b in chosen.items():
        tried = {
            float(grid[i]): float(np.mean(np.concatenate(ev.risks[c][i])))
            for i in sorted(ev.risks[c])
            if ev.have.get(i, 0) >= n
        }
        out[c] = (Search(c, float(grid[b]), tried, n, work), acc.get(b, ()))
    return out


def _settled(ev: _Evaluations, c: str, b: int, rows: int) -> bool:
    """Whether grid index b, a minimum among b - 2, b, b + 2, needs no step of one.

    The parabola through the three mean risks (at -2, 0, +2 grid steps) predicts the
    risks one step away; the larger predicted gain over b, ``max(0, |beta| - gamma)``
    with ``beta = (R(+2) - R(-2)) / 4`` and ``gamma = (R(+2) + R(-2) - 2 R(0)) / 8``,
    is compared with the paired standard error of a one-step risk difference, taken
    as half that of the two-step difference on that side (per-row risks are smooth
    in log h).  Settled when the gain is below :data:`SEARCH_TOLERANCE_SE` of it: b's
    risk is then within that many paired standard errors of its neighbours'.  Never
    settled while that tolerance is None (the default).
    """
    G = len(SEARCH_GRID)
    tol = SEARCH_TOLERANCE_SE
    if (
        tol is None
        or b < 2
        or b > G - 3
        or any(ev.have.get(i, 0) < rows for i in (b - 2, b, b + 2))
    ):
        return False
    r0, rm, rp = (ev.risk(c, i, rows) for i in (b, b - 2, b + 2))
    m0, mm, mp = float(np.mean(r0)), float(np.mean(rm)), float(np.mean(rp))
    beta = (mp - mm) / 4.0
    gamma = (mp + mm - 2.0 * m0) / 8.0
    gain = max(0.0, abs(beta) - gamma)
    d = (rp if beta < 0 else rm) - r0
    se = 0.5 * float(np.std(d, ddof=1)) / np.sqrt(d.size) if d.size > 1 else 0.0
    return gain <= tol * se


def _coarse_modes(ev: _Evaluations, c: str, rows: int, plausible: bool = False) -> list[int]:
    """Evaluate every 6th grid value (and the last) on rows ``[0, rows)``; return the modes.

    The modes: the local minima of that coarse risk curve whose paired mean risk excess
    over its minimum is within 3 standard errors (the minimum's index among them). With
    ``plausible``, every coarse value within 3 standard errors of the minimum, local
    minimum or not: on a few hundred rows a mode of the risk on all rows can sit on the
    slope of another (the two modes of ``_search_bandwidths``'s docstring).
    """
    G = len(SEARCH_GRID)
    coarse = list(range(0, G, 6))
    if coarse[-1] != G - 1:
        coarse.append(G - 1)
    ev.ensure(coarse, rows, False)
    cr = [float(np.mean(ev.risk(c, i, rows))) for i in coarse]
    a = coarse[int(np.argmin(cr))]
    modes = [
        coarse[k]
        for k in range(len(coarse))
        if plausible
        or ((k == 0 or cr[k] <= cr[k - 1]) and (k == len(coarse) - 1 or cr[k] <= cr[k + 1]))
    ]
    return [i for i in modes if i == a or _paired_excess(ev, c, i, a, rows) <= 3.0]


def _paired_excess(ev: _Evaluations, c: str, i: int, b: int, rows: int) -> float:
    """Paired mean risk excess of grid index i over b on rows ``[0, rows)``, in standard errors."""
    d = ev.risk(c, i, rows) - ev.risk(c, b, rows)
    se = float(np.std(d, ddof=1)) / np.sqrt(d.size) if d.size > 1 else np.inf
    mean = float(np.mean(d))
    return mean / se if se > 0 else (np.inf if mean > 0 else -np.inf if mean < 0 else 0.0)


def _search_bandwidths(
    problem: Problem,
    criteria: tuple[str, ...],
    powers: int,
    backend: str,
    progress: bool | None = None,
) -> dict[str, tuple[Search, tuple[np.ndarray, ...]]]:
    """Minimise leave-one-out risks over :data:`SEARCH_GRID`: subsets, then a local search.

    Several criteria (e.g. "brier" for the L1 / L2 quantities and "log" for the KL ones)
    share every engine pass: the class sums of a bandwidth give every criterion's risk.
    The query rows are visited in one random-looking order fixed by their contents
    (:func:`~kdecal._estimation.problem.content_order`; against all n centres, always),
    so that the first ``r`` rows are a random subset, every stage reuses the rows the
    earlier ones evaluated, and the result depends neither on the caller's row order
    nor on the order of the classes. For each criterion:

    0. problems of at most :data:`SEARCH_EXHAUSTIVE_MAX_N` points, and batches of ``B``
       problems with ``B n^2 <=`` :data:`SEARCH_EXHAUSTIVE_MAX_PAIRS` (one problem of up
       to 2,000 points): every grid value on all
       rows (:data:`SEARCH_EXHAUSTIVE_GROUP` per engine call), the exact argmin; else
    1. every 6th grid value (a ratio of 3.16) on the first ``m`` rows, where
       ``m = n // 20`` clipped to [:data:`SEARCH_SUBSET_MIN`, :data:`SEARCH_SUBSET_MAX`];
    2. the 5 grid values around every value of 1 whose paired mean risk excess over the
       best is within 3 standard errors, local minimum of that coarse curve or not, on
       the same rows. (Around its local minima only, on half the rows, the search missed
       the better of two modes on two of 19 real files at n = 10,000, by 11 and 21 grid
       steps: a few hundred rows put one mode on the other's slope, and the coarse grid
       does not resolve modes a factor 8 apart; ``bench/README.md``, "Two modes");
    3. a local search on rows ``m, 2 m, 4 m, ..., n`` from the best of each window of
       stage 2: at each row count, the best bandwidth's two neighbours are evaluated,
       and the search steps to a neighbour while it is better, until the best is a
       local minimum of the risk on those rows. A neighbour whose paired mean risk
       excess over the best is at least :data:`SEARCH_SEPARATED_Z` (4) standard errors
       is not evaluated on more rows while that bandwidth stays the best, and a mode
       whose local minimum is :data:`SEARCH_MODE_Z` (2) standard errors worse than the
       best mode's is no longer followed; the best local minimum on all n rows is the
       result.

    The result is therefore the best of the local minima (over the grid) of the exact
    leave-one-out risk on all n rows that the modes lead to, up to neighbours that a
    random subset of the rows already shows worse by 4 standard errors (the chance that
    all rows reverse such a difference is about 3e-5) and modes shown worse by 2. On the real files of ``tests/estimators/test_trust.py`` and of
    ``bench/search_real.py`` it is the exhaustive search's argmin. The rows doubling means
    that the final local search usually starts one step or less from its end, which
    matters where the risk curve is flat (the top-label and class-wise curves of real
    classifiers, whose argmin moves by several grid steps between random halves of the
    data, so that neighbours are never 4 standard errors apart and the result is exact).

    ``powers`` is what the estimate needs (0: no estimate). Stages 2-3 then run with it
    (while the candidates' accumulators fit in :data:`SEARCH_FUSE_BYTES`), so that the
    chosen bandwidth's accumulators need a pass over the rows of stage 1 at most.
    Returns, per criterion, the search record (``tried``: the mean risk on the rows each
    bandwidth was evaluated on) and the accumulators ``(m, S, Q, T)`` of the chosen
    bandwidth on all rows (shapes (B, n), (B, n, C)), followed by the pair sums ``D``
    when ``powers >= 2``; an empty tuple when ``powers == 0``.
    """
    grid = SEARCH_GRID
    G, n = len(grid), problem.n
    m_sub = (
        n
        if n <= SEARCH_EXHAUSTIVE_MAX_N
        or problem.p.shape[0] * n * n <= SEARCH_EXHAUSTIVE_MAX_PAIRS
        else min(max(SEARCH_SUBSET_MIN, n // 20), SEARCH_SUBSET_MAX)
    )
    # the rows of the final comparison
    last = n if SEARCH_ROWS_MAX is None else min(n, max(int(SEARCH_ROWS_MAX), m_sub))
    perm = None
    sub = problem
    if m_sub < n:
        # random-looking, and the same for every order of the same rows (a fixed
        # random permutation made the chosen bandwidth depend on the caller's order)
        perm = content_order(problem)
        # C-contiguous: every engine call then passes these very arrays (no per-call
        # copy; the binary engine's plan recognises them)
        sub = Problem(
            problem.calibration,
            np.ascontiguousarray(problem.p[:, perm]),
            np.ascontiguousarray(problem.labels[:, perm]),
            problem.dtype,
        )
    # accumulators on all rows (m; S, Q, T, D as powers asks) of a local search's window
    # of 3 bandwidths and of the bandwidth an earlier criterion chose
    held = 4 * (powers + 1) * problem.p.shape[0] * n * (problem.dim + 1) * 8
    keep = 0 < powers and held <= SEARCH_FUSE_BYTES
    ev = _Evaluations(sub, criteria, max(powers, 1), backend, progress)

    def choose(c: str) -> tuple[int, int]:
        done = m_sub  # every comparison uses the query rows [0, done)

        def risk(i: int) -> float:
            return float(np.mean(ev.risk(c, i, done)))

        def excess(i: int, b: int) -> float:
            """Paired mean risk excess of i over b, in standard errors (rows [0, done))."""
            return _paired_excess(ev, c, i, b, done)

        # stage 2 around every coarse value that the subset cannot tell from the best
        # one (risk curves can have two modes, e.g. a small-h and a large-h regression of
        # nearly equal risk, and on a subset one can sit on the other's slope)
        modes = _coarse_modes(ev, c, done, plausible=True)
        cand = sorted({j for i in modes for j in range(max(0, i - 2), min(G, i + 3))})
        ev.ensure(cand, done, keep)
        # the best of each mode's window (two modes' windows may overlap: one start)
        starts = sorted({min((j for j in cand if abs(j - i) <= 2), key=risk) for i in modes})
        # stage 3: a local search from each start on the first `done` rows, `done`
        # doubling up to n. A neighbour shown worse than its best by SEARCH_SEPARATED_Z
        # standard errors is not evaluated on more rows (while that best stays a best),
        # and neither is a mode whose local minimum is that much worse than the best one.
        separated: dict[int, int] = {}  # neighbour -> the best it was shown worse than
        while True:
            ends: list[int] = []
            for b in starts:
                for _ in range(G):
                    need = [b] + [
                        i for i in (b - 1, b + 1) if 0 <= i < G and separated.get(i) != b
                    ]
                    ev.ensure(need, done, keep)
                    nb = min(need, key=risk)
                    window = {j + k for j in [*ends, nb] for k in (-1, 0, 1)}
                    ev.retain(window | winners, SEARCH_FUSE_BYTES)
                    if nb == b:
                        break
                    b = nb
                for i in (b - 1, b + 1):
                    if 0 <= i < G and separated.get(i) != b and excess(i, b) >= SEARCH_SEPARATED_Z:
                        separated[i] = b
                ends.append(b)
            best = min(ends, key=risk)
            if done >= last:
                return best, done
            starts = sorted({b for b in ends if b == best or excess(b, best) < SEARCH_MODE_Z})
            done = min(last, 2 * done)

    chosen: dict[str, tuple[int, int]] = {}
    winners: set[int] = set()  # accumulators kept for the criteria already searched
    if m_sub == n:
        # few rows: every grid value on all of them, SEARCH_EXHAUSTIVE_GROUP bandwidths per
        # engine call (sharing its K-dots): the exact argmin, for about the cost of the
        # stages' single-bandwidth passes (which following every plausible coarse value
        # on all rows made 2-4 times dearer)
        for g0 in range(0, G, SEARCH_EXHAUSTIVE_GROUP):
            ev.ensure(list(range(g0, min(G, g0 + SEARCH_EXHAUSTIVE_GROUP))), n, False)
        for c in criteria:
            chosen[c] = (int(np.argmin([np.mean(ev.risk(c, i, n)) for i in range(G)])), n)
    for c in criteria:
        if c not in chosen:
            chosen[c] = choose(c)
        winners.add(chosen[c][0])
    acc: dict[int, tuple[np.ndarray, ...]] = {}
    if powers > 0:
        if not keep:
            ev.retain(set())
        inv = None if perm is None else np.argsort(perm)
        for b, _ in chosen.values():
            if b not in acc:
                # with keep, only the rows before stage 2 are missing (at most m / 2)
                sums = ev.sums(b)
                acc[b] = sums if inv is None else tuple(x[:, inv] if x.size else x for x in sums)
    out = {}
    for c, (b, done) in chosen.items():
        tried = {
            float(grid[i]): float(np.mean(np.concatenate(ev.risks[c][i])))
            for i in sorted(ev.risks[c])
        }
        out[c] = (Search(c, float(grid[b]), tried, done, ev.work), acc.get(b, ()))
    return out
