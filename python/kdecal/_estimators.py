"""Estimators on top of the engine, written once for every notion of calibration.

A notion of calibration turns ``(probs, labels)`` into a batch of B kernel problems on
the simplex of dimension D (Popordanoska et al. 2024, Eq. 24-25 and App. D):

- ``"canonical"``: one problem, the full vectors ``f_j`` (D = K) and the labels;
- ``"top_label"``: one binary problem, ``(1 - max_k f_jk, max_k f_jk)`` with the label
  ``1[argmax_k f_jk = y_j]`` (the Beta kernel, i.e. the K = 2 Dirichlet kernel);
- ``"classwise"``: K binary problems ``(1 - f_jc, f_jc)`` with labels ``1[y_j = c]``,
  all in one batched engine call.

The per-row formulas are those of :mod:`kdecal._formulas`, shared with
:mod:`kdecal.torch`. Every estimator is a plug-in of the leave-one-out conditional
expectation ``E`` (and,
with debiasing, of the estimate ``sq`` of its square) into a Bregman generator F.  For
binary problems built from a multiclass output (top-label and class-wise) the "l2"
generator is the scalar ``F(q) = q^2`` of App. D (so that the class-wise L2 calibration
error is the square of the class-wise ECE^KDE with p = 2; the one-vs-rest Brier
generator ``q^2 + (1 - q)^2`` would give exactly twice that), and the L_p errors use the
positive coordinate only.  "kl" is ``q log q + (1 - q) log(1 - q)`` there, the same
formula as the canonical negative entropy.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, xlogy

from . import _formulas as _f
from ._debias import debias as np_debias
from ._engine import backends as _backends
from ._engine import runtime as _runtime
from ._validation import Probs
from .warnings import KdecalWarning, warn_user

CALIBRATIONS = ("canonical", "classwise", "top_label")
DEBIAS_MODES = ("none", "ustat", "ratio")
_POWERS = {"none": 1, "ustat": 2, "ratio": 3}

#: Regressions of ``E[y | f]``: "residual" (the default) smooths the residuals
#: ``y_i - f_i`` and adds them back, ``E_j = f_j + sum_i w_ij (y_i - f_i) / sum_i w_ij``;
#: "plugin" smooths the labels, ``E_j = sum_i w_ij y_i / sum_i w_ij`` (the papers').
ESTIMATORS = ("residual", "plugin")

#: Bandwidth of the residual-centred squared-L2 and KL quantities with
#: ``bandwidth="auto"``, as a multiple of the leave-one-out Brier bandwidth (which the
#: L_p quantities use): the squared quantities are dominated by the kernel's smoothing
#: bias at the Brier bandwidth, which their U-statistic (L2) or the residual centring
#: (KL) does not remove; half of it removes most of that bias (bench/README.md,
#: "Residual-centred estimators").
RESIDUAL_SQ_FACTOR = 0.5

#: Each coordinate of a residual-centred estimate used by the KL quantities is kept at
#: or above this fraction of the prediction's coordinate (see :meth:`Estimate.simplex_E`).
RESIDUAL_KL_FLOOR = 1e-3

#: Coordinates with a prediction at least this large limit how far the residual
#: correction of a row is shrunk to keep it in the simplex; smaller ones are clipped
#: (see :meth:`Estimate.simplex_E`).
RESIDUAL_KL_SHRINK_MIN = 1e-3

#: Rows whose residual U-statistic denominator ``sum_{i != k} w_i w_k`` is below this
#: fraction of ``(sum_i w_i)^2`` have one effective neighbour: the statistic is undefined
#: there (and its numerator would lose all digits), so the plain square is used.
RESIDUAL_DEGENERATE = 1e-8


#: Default grid of :func:`select_bandwidth`: 50 log-spaced values in [1e-5, 1e-1] and
#: 0.2, 0.4, 0.6, 0.8, 1.0 (the grid of Popordanoska et al. 2024's code).
DEFAULT_BANDWIDTH_GRID = np.concatenate([np.logspace(-5, -1, 50), [0.2, 0.4, 0.6, 0.8, 1.0]])
DEFAULT_BANDWIDTH_GRID.setflags(write=False)


@dataclass(frozen=True)
class Problem:
    """A batch of leave-one-out kernel problems.

    Attributes
    ----------
    calibration : str
        The notion it was built for.
    p : ndarray, shape (B, n, D), float64
        Clipped, renormalised points on the simplex.
    labels : ndarray, shape (B, n), int64
        Labels in ``0..D-1``.
    dtype : numpy dtype
        Kernel dtype (float32 or float64).
    """

    calibration: str
    p: np.ndarray
    labels: np.ndarray
    dtype: np.dtype

    @property
    def binary(self) -> bool:
        return self.calibration != "canonical"

    @property
    def n(self) -> int:
        return int(self.p.shape[1])

    @property
    def dim(self) -> int:
        return int(self.p.shape[2])

    @property
    def coords(self) -> slice:
        """Coordinates that enter L_p and L2 quantities (the positive one when binary)."""
        return _f.coords(self.binary)

    def one_hot(self) -> np.ndarray:
        """Labels as one-hot vectors, shape (B, n, D)."""
        return np.asarray(_f.one_hot(self.labels, self.dim))

    def frequencies(self) -> np.ndarray:
        """Label frequencies per problem, shape (B, 1, D)."""
        return self.one_hot().mean(axis=1, keepdims=True)


def make_problem(probs: Probs, labels: np.ndarray | None, calibration: str) -> Problem:
    """Build the kernel problems of one notion of calibration (labels None: unlabelled)."""
    y = np.zeros(probs.n, dtype=np.int64) if labels is None else labels
    points, lab = _f.problem_arrays(probs.p, y, calibration)
    return Problem(calibration, points, lab, probs.dtype)


def kernel_inputs(problem: Problem, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the engine's inputs: ``log p``, ``p`` in the kernel dtype, and the bias.

    Returns ``logq``, ``pk`` (B, n, D), C-contiguous in ``problem.dtype``, and the
    per-centre bias ``-sum_k lgamma(p_ik / h + 1)`` (B, H, n), float64.
    """
    logq, pk = kernel_points(problem)
    bias = np.stack([kernel_bias(problem, h) for h in hs], axis=1)
    return logq, pk, np.ascontiguousarray(bias)


def kernel_points(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """``log p`` and ``p`` (B, n, D), C-contiguous in ``problem.dtype``."""
    p = problem.p
    return (
        np.ascontiguousarray(np.log(p), dtype=problem.dtype),
        np.ascontiguousarray(p, dtype=problem.dtype),
    )


def kernel_bias(problem: Problem, h: float) -> np.ndarray:
    """Per-centre bias ``-sum_k lgamma(p_ik / h + 1)`` of one bandwidth, (B, n) float64.

    With the compiled core, its vectorised lgamma (``kdecal._core.kernel_bias``, about 6x
    ``scipy.special.gammaln`` per value: a bandwidth search needs n K values per bandwidth
    tried); without it, ``gammaln`` on row blocks. Either way in the engine's threads,
    bitwise the same for any number of them.
    """
    core = _runtime._core
    if core is not None:
        p = np.ascontiguousarray(problem.p, dtype=np.float64)
        flat = p.reshape(-1, p.shape[-1])
        bias = core.kernel_bias(flat, 1.0 / h, _runtime.get_num_threads())
        return np.asarray(bias).reshape(p.shape[:-1])
    return _runtime.map_row_blocks(lambda p: -gammaln(p / h + 1.0).sum(axis=-1), problem.p)


def engine(
    problem: Problem,
    hs: np.ndarray,
    *,
    labelled: bool,
    powers: int,
    backend: str,
    progress: bool | None = None,
    rows: tuple[int, int] | None = None,
    pairs: bool = False,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    resid: bool = False,
) -> tuple[np.ndarray, ...]:
    """One batched leave-one-out pass: m (B, H, R) and S, Q, T (B, H, R, C).

    ``rows`` restricts the query rows to ``[start, stop)`` (R of them; default all n),
    always against all n centres; ``pairs`` appends the pair sums D (B, H, R, C);
    ``resid`` appends the residual sums A (B, H, R, D) and U (B, H, R) of
    :func:`residual_weights`.
    ``inputs``: :func:`kernel_inputs` of ``problem`` and ``hs``, when the caller has them.
    """
    logq, pk, bias = kernel_inputs(problem, hs) if inputs is None else inputs
    if labelled:
        lab, n_groups = problem.labels, problem.dim
    else:
        lab, n_groups = np.zeros_like(problem.labels), 1
    return _backends.loo_reduce(
        logq,
        pk,
        np.ascontiguousarray(lab),
        n_groups,
        np.ascontiguousarray(1.0 / hs),
        bias,
        powers=powers,
        backend=backend,
        progress=progress,
        rows=rows,
        pairs=pairs,
        resid=residual_weights(problem) if resid else None,
    )


def residual_weights(problem: Problem) -> np.ndarray:
    """``||y_i - f_i||^2`` over the coordinates of the squared quantities, (B, n) float64.

    The per-centre weights of the engine's residual sum ``U = sum_i w_ij^2 u_i`` (the
    diagonal of the residual U-statistic); binary problems use the positive coordinate.
    """
    c = problem.coords
    r = (problem.one_hot() - problem.p)[..., c]
    return np.ascontiguousarray(np.sum(r * r, axis=-1), dtype=np.float64)


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


def warn_at_grid_end(h: float, grid: np.ndarray, criterion: str) -> None:
    """Warn when a search of more than one bandwidth chose an end of its range."""
    lo, hi = float(np.min(grid)), float(np.max(grid))
    if len(grid) > 1 and (h <= lo or h >= hi):
        warn_user(
            f"the bandwidth search ({criterion} criterion) chose h = {h:g}, the "
            f"{'smallest' if h <= lo else 'largest'} value of the search range [{lo:g}, {hi:g}]: "
            "the optimum may lie outside it; pass a fixed bandwidth or inspect "
            "kdecal.select_bandwidth(..., grid=...)",
            KdecalWarning,
        )


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

#: Paired standard errors by which a neighbour of the best bandwidth must be worse on
#: the rows evaluated so far for the search to stop evaluating it on more rows.
SEARCH_SEPARATED_Z = 4.0

#: Paired standard errors by which the local minimum of one mode of the risk curve must
#: be worse than the best mode's for the search to stop following that mode.
SEARCH_MODE_Z = 2.0

#: Memory (bytes) the search may hold in accumulators of candidate bandwidths so that
#: its last stages double as the estimate's pass. Above it, the accumulators farthest
#: from the current best are dropped (their rows are recomputed if one of them is
#: chosen); when a window of 3 bandwidths alone exceeds it, the estimate runs its own.
SEARCH_FUSE_BYTES = 2 << 30


def cv_risk_rows(problem: Problem, S: np.ndarray, criterion: str, rows: slice) -> np.ndarray:
    """Per-row leave-one-out risk of the kernel regression, shape (H, R).

    ``S`` (B, H, R, C) holds the class sums of the query rows ``rows`` of ``problem``.
    "brier": ``||y_j - E_-j(f_j)||^2`` over the coordinates that enter L2 quantities (the
    positive one of binary problems); "log": ``-log E_-j(f_j)[y_j]`` (floored at 1e-300).
    Summed over the problems of a batch.
    """
    lab = problem.labels[:, rows]  # (B, R)
    out = np.zeros(S.shape[1:3])
    for t in range(S.shape[1]):
        St = S[:, t]
        E = St / St.sum(axis=-1, keepdims=True)
        if criterion == "brier":
            c = problem.coords
            err = _f.squared_rows(E[..., c], _f.one_hot(lab, St.shape[-1])[..., c])
        else:
            err = _f.log_risk_rows(np.maximum(E, 1e-300), lab)
        out[t] = np.sum(err, axis=0)
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
        # the kernel inputs, each bandwidth's bias computed once (n K lgamma calls)
        self.logq, self.pk = kernel_points(sub)
        self.bias: dict[int, np.ndarray] = {}

    def _engine(self, idx: list[int], r0: int, r1: int, full: bool) -> tuple[np.ndarray, ...]:
        for i in idx:
            if i not in self.bias:
                self.bias[i] = kernel_bias(self.sub, float(SEARCH_GRID[i]))
        bias = np.ascontiguousarray(np.stack([self.bias[i] for i in idx], axis=1))
        sums = engine(
            self.sub,
            SEARCH_GRID[idx],
            labelled=True,
            powers=self.powers if full else 1,
            backend=self.backend,
            progress=self.progress,
            rows=(r0, r1),
            pairs=full and self.powers >= 2,
            inputs=(self.logq, self.pk, bias),
        )
        self.work += (r1 - r0) / self.sub.n * len(idx)
        return sums

    def ensure(self, idx: list[int], upto: int, keep: bool) -> None:
        """Evaluate the grid indices ``idx`` on rows ``[0, upto)`` (only what is missing)."""
        groups: dict[int, list[int]] = {}
        for i in idx:
            if self.have.get(i, 0) < upto:
                groups.setdefault(self.have.get(i, 0), []).append(i)
        for r0, group in sorted(groups.items()):
            sums = self._engine(group, r0, upto, keep)
            for c in self.criteria:
                for i, r in zip(group, cv_risk_rows(self.sub, sums[1], c, slice(r0, upto))):
                    self.risks[c].setdefault(i, []).append(r)
            for t, i in enumerate(group):
                self.have[i] = upto
                if keep:
                    one = tuple(np.ascontiguousarray(x[:, t]) if x.size else x for x in sums)
                    self.blocks.setdefault(i, []).append((r0, upto, one))

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
    """Minimise leave-one-out risks over :data:`SEARCH_GRID`: subsets, then a local search.

    Several criteria (e.g. "brier" for the L1 / L2 quantities and "log" for the KL ones)
    share every engine pass: the class sums of a bandwidth give every criterion's risk.
    The query rows are visited in one random order (against all n centres, always), so
    that the first ``r`` rows are a random subset and every stage reuses the rows the
    earlier ones evaluated. For each criterion:

    1. every 6th grid value (a ratio of 3.16) on the first ``m / 2`` rows, where
       ``m = n // 20`` clipped to [:data:`SEARCH_SUBSET_MIN`, :data:`SEARCH_SUBSET_MAX`]
       (``m = n`` when ``n <= 2 * SEARCH_SUBSET_MIN``);
    2. the 5 grid values around the best of 1, and around every other local minimum of
       1 whose paired mean risk excess over the best is within 3 standard errors, on
       the first ``m`` rows;
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
    all rows reverse such a difference is about 3e-5) and modes shown worse by 2. On the real files of ``tests/test_trust.py`` and of
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
        if n <= 2 * SEARCH_SUBSET_MIN
        else min(max(SEARCH_SUBSET_MIN, n // 20), SEARCH_SUBSET_MAX)
    )
    m_coarse = m_sub if m_sub == n else m_sub // 2
    perm = None
    sub = problem
    if m_sub < n:
        perm = np.random.default_rng(0).permutation(n)
        sub = Problem(
            problem.calibration, problem.p[:, perm], problem.labels[:, perm], problem.dtype
        )
    # accumulators on all rows (m; S, Q, T, D as powers asks) of a local search's window
    # of 3 bandwidths and of the bandwidth an earlier criterion chose
    held = 4 * (powers + 1) * problem.p.shape[0] * n * (problem.dim + 1) * 8
    keep = 0 < powers and held <= SEARCH_FUSE_BYTES
    ev = _Evaluations(sub, criteria, max(powers, 1), backend, progress)

    def choose(c: str) -> tuple[int, int]:
        done = m_coarse  # every comparison uses the query rows [0, done)

        def risk(i: int) -> float:
            return float(np.mean(ev.risk(c, i, done)))

        def excess(i: int, b: int) -> float:
            """Paired mean risk excess of i over b, in standard errors (rows [0, done))."""
            d = ev.risk(c, i, done) - ev.risk(c, b, done)
            se = float(np.std(d, ddof=1)) / np.sqrt(d.size) if d.size > 1 else np.inf
            mean = float(np.mean(d))
            return mean / se if se > 0 else (np.inf if mean > 0 else -np.inf if mean < 0 else 0.0)

        def close(i: int, b: int, z: float) -> bool:
            """Whether i's paired mean risk excess over b is within z standard errors."""
            return excess(i, b) <= z

        coarse = list(range(0, G, 6))
        if coarse[-1] != G - 1:
            coarse.append(G - 1)
        ev.ensure(coarse, done, False)
        # stage 2 around every local minimum of the coarse curve that the subset cannot
        # tell from the best one (risk curves can have two modes, e.g. a small-h and a
        # large-h regression of nearly equal risk)
        cr = [risk(i) for i in coarse]
        a = coarse[int(np.argmin(cr))]
        modes = [
            coarse[k]
            for k in range(len(coarse))
            if (k == 0 or cr[k] <= cr[k - 1]) and (k == len(coarse) - 1 or cr[k] <= cr[k + 1])
        ]
        modes = [i for i in modes if i == a or close(i, a, 3.0)]
        cand = sorted({j for i in modes for j in range(max(0, i - 2), min(G, i + 3))})
        done = m_sub
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
            if done >= n:
                return best, done
            starts = sorted({b for b in ends if b == best or excess(b, best) < SEARCH_MODE_Z})
            done = min(n, 2 * done)

    chosen: dict[str, tuple[int, int]] = {}
    winners: set[int] = set()  # accumulators kept for the criteria already searched
    for c in criteria:
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


@dataclass(frozen=True)
class Estimate:
    """Leave-one-out conditional expectations of a problem batch at one bandwidth.

    Attributes
    ----------
    E : ndarray, shape (B, n, D)
        Estimates of ``E[y | f_j]`` (debiased with App. C when ``debias="ratio"``).
    sq : ndarray or None, shape (B, n, D)
        Estimates of ``E[y_c | f_j]^2`` (Eq. 7 or App. D) when debiasing, else None.
    n_degenerate : int
        Rows with a single effective neighbour, where the plain ratio was used.
    m : ndarray, shape (B, n)
        Per-query maximum log-kernel (the engine's running max).
    S : ndarray, shape (B, n, D)
        Class sums of ``exp(L_ij - m_j)``.
    Q : ndarray or None, shape (B, n, D)
        Class sums of ``exp(2 (L_ij - m_j))`` when the debiasing mode needed them.
    row_weights : ndarray or None, shape (n,)
        Row multiplicities of a bootstrap replicate.
    estimator : {"plugin", "residual"}
        How ``E`` was formed: the ratio ``S / sum S`` ("plugin") or ``f + (S - A) /
        sum S`` ("residual", see :data:`ESTIMATORS`).
    sqerr : ndarray or None, shape (B, n)
        Residual estimates only, with ``debias="ustat"``: per row, the normalised
        U-statistic of ``||E[y | f_j] - f_j||^2`` (see :func:`residual_estimate`).
    A : ndarray or None, shape (B, n, D)
        Residual estimates only: ``sum_i w_ij f_i`` in the units of ``S``.
    """

    problem: Problem
    bandwidth: float
    debias: str
    E: np.ndarray
    sq: np.ndarray | None
    n_degenerate: int
    m: np.ndarray | None = None
    S: np.ndarray | None = None
    Q: np.ndarray | None = None
    row_weights: np.ndarray | None = None
    estimator: str = "plugin"
    sqerr: np.ndarray | None = None
    A: np.ndarray | None = None

    def mean(self, x: np.ndarray) -> float:
        """Mean of per-row terms ``x`` (B, n) over rows and over the batch's problems.

        Rows are weighted by ``row_weights`` (the bootstrap multiplicities) when set.
        The sums are exactly rounded (``math.fsum``), so the mean does not depend on the
        order of the rows, also when positive and negative terms (debiased estimates)
        nearly cancel.
        """
        x = np.asarray(x, dtype=np.float64)
        w = None if self.row_weights is None else np.asarray(self.row_weights, np.float64)
        if w is not None and not np.sum(w) > 0.0:  # no row left (a bootstrap replicate)
            return math.nan
        if not np.all(np.isfinite(x)):  # inf or nan: as np.mean has it
            return float(np.mean(x) if w is None else np.mean(np.sum(x * w, -1) / np.sum(w)))
        try:
            if w is None:
                return math.fsum(x.ravel().tolist()) / x.size
            xw = np.atleast_2d(x * w)
            total = math.fsum(w.ravel().tolist())
            rows = [math.fsum(r.tolist()) / total for r in xw.reshape(-1, xw.shape[-1])]
            return math.fsum(rows) / len(rows)
        except OverflowError:  # a partial sum beyond the float range
            return float(np.mean(x) if w is None else np.mean(np.sum(x * w, -1) / np.sum(w)))

    def frequencies(self) -> np.ndarray:
        """Label frequencies per problem (weighted like :meth:`mean`), shape (B, 1, D)."""
        Y = self.problem.one_hot()
        if self.row_weights is None:
            return np.asarray(Y.mean(axis=1, keepdims=True))
        w = self.row_weights[None, :, None]
        total = np.sum(self.row_weights)
        if total == 0.0:  # no row left (a bootstrap replicate): undefined
            return np.full((Y.shape[0], 1, Y.shape[2]), np.nan)
        return np.asarray(np.sum(Y * w, axis=1, keepdims=True) / total)

    def simplex_E(self) -> np.ndarray:
        """E inside the simplex, for the generators that need it (KL, custom).

        The plug-in's ratio lies on the simplex, its App. C debiased form is clipped at 0
        and renormalised. A residual-centred ``E = f + g`` sums to 1 but may leave the
        simplex where ``g_c < -f_c``. It is moved back along its own correction,
        ``f + t g`` with the largest ``t <= 1`` that keeps every coordinate with
        ``f_c >=`` :data:`RESIDUAL_KL_SHRINK_MIN` at least :data:`RESIDUAL_KL_FLOOR`
        times ``f_c``; the coordinates below that are clipped at ``RESIDUAL_KL_FLOOR *
        f_c``, and the row is renormalised. Shrinking keeps the correction's direction
        and does not inflate KL with the positive noise of small coordinates whose
        negative noise clipping would discard (+113...+232 % instead of +1...+114 % on
        the K = 10 protocol); letting a probability of 1e-8 limit it would shrink
        almost every row of a real network's softmax to ``t ~ 0`` and report KL ~ 0 for a
        badly over-confident model (bench/README.md, "Residual-centred estimators").
        Rows inside the simplex are unchanged.
        """
        if self.estimator == "residual":
            f = self.problem.p
            g = self.E - f
            with np.errstate(divide="ignore", invalid="ignore"):
                lim = np.where(
                    (g < 0.0) & (f >= RESIDUAL_KL_SHRINK_MIN),
                    (1.0 - RESIDUAL_KL_FLOOR) * f / -g,
                    np.inf,
                )
            t = np.minimum(1.0, np.min(lim, axis=-1, keepdims=True))
            E = np.maximum(f + t * g, RESIDUAL_KL_FLOOR * f)
            E = E / np.sum(E, axis=-1, keepdims=True)
            inside = np.all(self.E >= RESIDUAL_KL_FLOOR * f, axis=-1, keepdims=True)
            return np.asarray(np.where(inside, self.E, E))
        if self.debias != "ratio":
            return self.E
        E = np.clip(self.E, 0.0, None)
        return E / E.sum(axis=-1, keepdims=True)

    def squares(self) -> np.ndarray:
        """Estimates of ``E_c^2`` (the debiased ones when available)."""
        return self.E * self.E if self.sq is None else self.sq


def estimate(
    problem: Problem,
    bandwidth: float,
    debias: str,
    backend: str,
    progress: bool | None = None,
) -> Estimate:
    """Run the engine at one bandwidth and form (debiased) conditional expectations."""
    debiased = debias != "none"
    sums = engine(
        problem,
        np.array([bandwidth]),
        labelled=True,
        powers=_POWERS[debias],
        backend=backend,
        progress=progress,
        pairs=debiased,
    )
    m, S, Q, T = sums[:4]
    return estimate_from(
        problem,
        bandwidth,
        debias,
        backend,
        m[:, 0],
        S[:, 0],
        Q[:, 0] if debiased else Q,
        T[:, 0] if debias == "ratio" else T,
        D=sums[4][:, 0] if debiased else None,
    )


def estimate_from(
    problem: Problem,
    bandwidth: float,
    debias: str,
    backend: str,
    m: np.ndarray,
    S: np.ndarray,
    Q: np.ndarray,
    T: np.ndarray,
    warn: bool = True,
    D: np.ndarray | None = None,
) -> Estimate:
    """Form the (debiased) conditional expectations from one bandwidth's accumulators.

    ``m`` (B, n) and ``S``, ``Q``, ``T``, ``D`` (B, n, C) as returned by :func:`engine`
    for one bandwidth (``Q``, ``T`` only when the debiasing mode needs them).  ``D``, the
    engine's pair sums ``S**2 - Q``, makes the U-statistic free of cancellation (and so
    independent of the row order and of the backend to a few ulps); without it, it is
    formed from ``S`` and ``Q``.
    """
    if debias == "none":
        E = S / S.sum(axis=-1, keepdims=True)
        return Estimate(problem, bandwidth, debias, E, None, 0, m, S, None)
    mode = 1 if debias == "ustat" else 2
    Qh = np.ascontiguousarray(Q)
    Th = np.ascontiguousarray(T) if mode == 2 else None
    if backend in ("cpp", "dask"):  # the compiled debiasing (dask runs the core too)
        Dh = None if D is None else np.ascontiguousarray(D)
        E, sq, degenerate = _runtime._core.debias(
            np.ascontiguousarray(S), Qh, Th, float(problem.n - 1), mode, Dh
        )
    else:
        E, sq, degenerate = np_debias(S, Qh, Th, float(problem.n - 1), mode, D)
    n_deg = int(np.count_nonzero(degenerate))
    # one such row in a thousand moves no estimate visibly; more is worth a warning
    if n_deg and warn and n_deg > 1e-3 * degenerate.size:
        warnings.warn(
            f"debias={debias!r}: {n_deg} of {degenerate.size} query rows have a single "
            f"effective neighbour at bandwidth {bandwidth:g}; their plain (biased) ratio "
            "was used. A larger bandwidth avoids this.",
            KdecalWarning,
            stacklevel=4,
        )
    return Estimate(problem, bandwidth, debias, E, sq, n_deg, m, S, Qh)


def residual_estimate(
    problem: Problem,
    bandwidth: float,
    debias: str,
    m: np.ndarray,
    S: np.ndarray,
    Q: np.ndarray | None,
    D: np.ndarray | None,
    A: np.ndarray,
    U: np.ndarray | None,
    warn: bool = True,
) -> Estimate:
    """Form the residual-centred estimate from one bandwidth's accumulators.

    With ``r_i = y_i - f_i``, class sums ``S`` (B, n, D), ``S0 = sum_c S_c`` and the
    engine's residual sums ``A = sum_i w_ij f_i`` (B, n, D), ``U = sum_i w_ij^2
    ||r_i||^2`` (B, n) (:func:`residual_weights`):

    - ``g_j = (S_j - A_j) / S0_j = sum_{i != j} w_ij r_i / sum_{i != j} w_ij``, the
      leave-one-out kernel regression of the residuals, and ``E_j = f_j + g_j``. Under
      calibration ``E[r | f] = 0``, so the kernel's smoothing of ``f`` itself (the
      shrinkage of the plug-in ratio towards the centre of the data, which it reports
      as miscalibration) does not enter ``g``;
    - with ``debias="ustat"``, the squared error of row j as the normalised
      U-statistic ``(||S_j - A_j||^2 - U_j) / (S0_j^2 - Q0_j) = sum_{i != k} w_ij w_kj
      <r_i, r_k> / sum_{i != k} w_ij w_kj`` (pairs of distinct centres, both != j), which
      is exactly unbiased for the smoothed squared error under calibration: the
      normalised form of the SKCE statistic (Widmann, Lindsten & Zachariah, NeurIPS
      2019) with the Dirichlet kernel. The denominator comes from the engine's pair
      sums ``D`` without cancellation; rows where it is below
      :data:`RESIDUAL_DEGENERATE` of ``S0^2`` (one effective neighbour) use ``||g_j||^2``
      and are counted in ``n_degenerate``.
    """
    S0 = S.sum(axis=-1)
    den = None
    if debias == "ustat":
        assert Q is not None
        # sum over ordered pairs of distinct centres: within a class (D), across classes;
        # without D (the resampling passes), S0^2 - Q0, which cancels only in rows that
        # the threshold of residual_from_sums treats as degenerate anyway
        if D is None:
            den = S0**2 - np.sum(Q, axis=-1)
        else:
            den = np.sum(D, axis=-1) + np.sum(S * (S0[..., None] - S), axis=-1)
    return residual_from_sums(
        problem, bandwidth, debias, m, S0, S - A, den, U, warn=warn, S=S, Q=Q, A=A, stacklevel=5
    )


def residual_from_sums(
    problem: Problem,
    bandwidth: float,
    debias: str,
    m: np.ndarray | None,
    S0: np.ndarray,
    R: np.ndarray,
    den: np.ndarray | None,
    U: np.ndarray | None,
    *,
    warn: bool = True,
    S: np.ndarray | None = None,
    Q: np.ndarray | None = None,
    A: np.ndarray | None = None,
    stacklevel: int = 4,
) -> Estimate:
    """Form the residual-centred estimate from its sums (see :func:`residual_estimate`).

    ``S0`` (B, n): ``sum_i w_ij``; ``R`` (B, n, D): ``sum_i w_ij r_i``; ``den`` (B, n):
    the pair sum ``sum_{i != k} w_ij w_kj`` (``debias="ustat"``, else None); ``U`` (B,
    n): ``sum_i w_ij^2 ||r_i||^2`` (``"ustat"``).  ``S``, ``Q``, ``A`` are only stored.
    """
    g = R / S0[..., None]
    E = problem.p + g
    sqerr = None
    n_deg = 0
    if debias == "ustat":
        assert den is not None and U is not None
        c = problem.coords
        num = np.sum(R[..., c] ** 2, axis=-1) - U
        ok = den > RESIDUAL_DEGENERATE * S0**2
        plain = np.sum(g[..., c] ** 2, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            sqerr = np.where(ok, num / np.where(ok, den, 1.0), plain)
        n_deg = int(np.count_nonzero(~ok))
        if n_deg and warn and n_deg > 1e-3 * ok.size:
            warnings.warn(
                f"{n_deg} of {ok.size} query rows have a single effective neighbour at "
                f"bandwidth {bandwidth:g}; their plain squared residual was used. A "
                "larger bandwidth avoids this.",
                KdecalWarning,
                stacklevel=stacklevel,
            )
    elif debias == "ratio":
        raise ValueError("debias='ratio' applies to estimator='plugin' only")
    return Estimate(
        problem,
        bandwidth,
        debias,
        E,
        None,
        n_deg,
        m,
        S,
        Q,
        estimator="residual",
        sqerr=sqerr,
        A=A,
    )


def fit_residual(
    problem: Problem,
    bandwidth: float | str | dict[str, float],
    debias: str,
    backend: str,
    progress: bool | None,
    kinds: tuple[str, ...] = ("lp", "sq"),
    criterion: str = "brier",
) -> dict[str, tuple[Estimate, Search | None]]:
    """Residual-centred estimates for the quantity kinds asked, sharing one engine pass.

    Kinds: "lp" (the L_p ECE^KDE with p != 2 and custom Bregman generators) and "sq"
    (squared L2, L2 ECE^KDE and KL). ``bandwidth="auto"`` searches the leave-one-out
    risk of ``criterion`` ("brier" by default, or "log") once
    (:func:`search_bandwidths`); "lp" uses its minimiser ``h_B`` and "sq"
    ``RESIDUAL_SQ_FACTOR * h_B``. "loo-mle" (as ``bandwidth`` or ``criterion``) and a
    float give every kind the same bandwidth. All distinct bandwidths are one engine
    call (the GEMM is shared). A dict gives each kind its bandwidth (the rule applied
    to a common bandwidth by :func:`kdecal.compare`).
    """
    if debias == "ratio":
        raise ValueError("debias='ratio' applies to estimator='plugin' only")
    search: Search | None = None
    if isinstance(bandwidth, str):
        if bandwidth == "loo-mle" or criterion == "loo-mle":
            h = select_bandwidth(problem, np.asarray(DEFAULT_BANDWIDTH_GRID), backend, progress)
            hs = dict.fromkeys(kinds, h)
        else:
            search, _ = search_bandwidth(problem, criterion, 0, backend, progress)
            hs = {"lp": search.bandwidth, "sq": RESIDUAL_SQ_FACTOR * search.bandwidth}
    elif isinstance(bandwidth, dict):
        hs = {k: float(bandwidth[k]) for k in kinds}
    else:
        hs = dict.fromkeys(kinds, float(bandwidth))
    distinct = sorted({hs[k] for k in kinds})
    debiased = debias != "none"
    sums = engine(
        problem,
        np.asarray(distinct),
        labelled=True,
        powers=2 if debiased else 1,
        backend=backend,
        progress=progress,
        pairs=debiased,
        resid=True,
    )
    m, S, Q = sums[0], sums[1], sums[2]
    D = sums[4] if debiased else None
    A, U = sums[-2], sums[-1]
    made = {}
    for t, h in enumerate(distinct):
        made[h] = residual_estimate(
            problem,
            h,
            debias,
            m[:, t],
            S[:, t],
            Q[:, t] if debiased else None,
            None if D is None else D[:, t],
            A[:, t],
            U[:, t],
        )
    return {k: (made[hs[k]], search) for k in kinds}


def fit_criteria(
    problem: Problem,
    bandwidth: float | str,
    debias: str,
    backend: str,
    progress: bool | None,
    criteria: tuple[str, ...],
) -> dict[str, tuple[Estimate, Search | None]]:
    """Estimate one notion at the bandwidth of each criterion, sharing every pass.

    ``bandwidth="auto"`` minimises each leave-one-out risk of ``criteria`` ("brier",
    "log") with :func:`search_bandwidths`, whose last stage already holds the
    estimates' accumulators (one pass per distinct bandwidth); ``"loo-mle"`` (or the
    criterion "loo-mle") maximises the LOO likelihood over
    :data:`kdecal.DEFAULT_BANDWIDTH_GRID` and runs one more pass; a float runs one pass.
    Every criterion maps to its estimate and search record (None when not searched).
    """
    if isinstance(bandwidth, str) and bandwidth != "loo-mle" and "loo-mle" not in criteria:
        found = search_bandwidths(problem, criteria, _POWERS[debias], backend, progress)
        out: dict[str, tuple[Estimate, Search | None]] = {}
        made: dict[float, Estimate] = {}
        for c, (record, sums) in found.items():
            if record.bandwidth not in made:
                m, S, Q, T = sums[0], sums[1], sums[2], sums[3]
                made[record.bandwidth] = estimate_from(
                    problem,
                    record.bandwidth,
                    debias,
                    backend,
                    m,
                    S,
                    Q,
                    T,
                    D=sums[4] if len(sums) > 4 else None,
                )
            out[c] = (made[record.bandwidth], record)
        return out
    if isinstance(bandwidth, str):
        h = select_bandwidth(problem, np.asarray(DEFAULT_BANDWIDTH_GRID), backend, progress)
    else:
        h = float(bandwidth)
    est = estimate(problem, h, debias, backend, progress)
    return {c: (est, None) for c in criteria}


# ----------------------------------------------------------------------------- generators


class Generator:
    """A Bregman generator applied to estimates: ``F``, ``D_F`` and the risk term."""

    name = "custom"

    def F(self, est: Estimate) -> np.ndarray:
        """``F(E_j)`` per problem and row, shape (B, n)."""
        raise NotImplementedError

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        """``F(v)`` for points v of shape (B, m, D), shape (B, m)."""
        raise NotImplementedError

    def divergence(self, est: Estimate) -> np.ndarray:
        """``D_F(E_j, f_j)``, shape (B, n)."""
        raise NotImplementedError

    def risk(self, problem: Problem) -> np.ndarray:
        """``D_F(y_j, f_j) - F(y_j)`` with one-hot ``y_j``, shape (B, n)."""
        raise NotImplementedError


class KLGenerator(Generator):
    """``F(p) = sum_c p_c log p_c`` (binary problems: ``q log q + (1-q) log(1-q)``)."""

    name = "kl"

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        return np.asarray(_f.generator_rows("kl", v, problem.binary))

    def F(self, est: Estimate) -> np.ndarray:
        return self.F_points(est.problem, est.simplex_E())

    def divergence(self, est: Estimate) -> np.ndarray:
        pr = est.problem
        return np.asarray(_f.divergence_rows("kl", est.simplex_E(), pr.p, pr.binary))

    def risk(self, problem: Problem) -> np.ndarray:
        return np.asarray(_f.risk_rows("kl", problem.p, problem.labels, problem.binary))


class L2Generator(Generator):
    """``F(p) = ||p||^2`` (binary problems: ``F(q) = q^2``); uses debiased squares."""

    name = "l2"

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        return np.asarray(_f.generator_rows("l2", v, problem.binary))

    def F(self, est: Estimate) -> np.ndarray:
        if est.sqerr is not None:  # ||E||^2 = ||f||^2 + 2 <f, g> + ||g||^2 (U-statistic)
            c = est.problem.coords
            f = est.problem.p[..., c]
            g = est.E[..., c] - f
            return np.asarray(np.sum(f * f + 2.0 * f * g, axis=-1) + est.sqerr)
        return np.asarray(_f.generator_rows("l2", est.E, est.problem.binary, est.squares()))

    def divergence(self, est: Estimate) -> np.ndarray:
        if est.sqerr is not None:
            return est.sqerr
        pr = est.problem
        return np.asarray(_f.divergence_rows("l2", est.E, pr.p, pr.binary, est.squares()))

    def risk(self, problem: Problem) -> np.ndarray:
        return np.asarray(_f.risk_rows("l2", problem.p, problem.labels, problem.binary))


class CustomGenerator(Generator):
    """A user's ``kdecal.Bregman``; binary problems pass the 2-vectors ``(1 - q, q)``."""

    def __init__(self, bregman: object) -> None:
        self.bregman = bregman
        self.name = getattr(bregman, "name", "custom")

    def _rows(self, fn: object, v: np.ndarray, what: str) -> np.ndarray:
        B, m, D = v.shape
        out = np.asarray(fn(v.reshape(B * m, D)), dtype=np.float64)  # type: ignore[operator]
        if out.shape != (B * m,):
            raise ValueError(f"Bregman {what} must return shape ({B * m},), got {out.shape}")
        return out.reshape(B, m)

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        return self._rows(self.bregman.F, v, "F")  # type: ignore[attr-defined]

    def F(self, est: Estimate) -> np.ndarray:
        return self.F_points(est.problem, est.simplex_E())

    def _div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        B, m, D = a.shape
        g = np.asarray(self.bregman.grad_F(b.reshape(B * m, D)), dtype=np.float64)  # type: ignore[attr-defined]
        if g.shape != (B * m, D):
            raise ValueError(f"Bregman grad_F must return shape ({B * m}, {D}), got {g.shape}")
        lin = np.sum(g.reshape(B, m, D) * (a - b), axis=-1)
        return self._rows(self.bregman.F, a, "F") - self._rows(self.bregman.F, b, "F") - lin  # type: ignore[attr-defined]

    def divergence(self, est: Estimate) -> np.ndarray:
        return self._div(est.simplex_E(), est.problem.p)

    def risk(self, problem: Problem) -> np.ndarray:
        Y = problem.one_hot()
        return self._div(Y, problem.p) - self.F_points(problem, Y)


# ------------------------------------------------------- Bregman (the public generators)


@dataclass(frozen=True)
class Bregman:
    """A Bregman divergence given by its strictly convex generator F.

    ``D_F(a, b) = F(a) - F(b) - <grad_F(b), a - b>``; the proper calibration error is
    ``E[D_F(E[y | f(x)], f(x))]`` (Popordanoska et al. 2024, Eq. 9).

    Parameters
    ----------
    F : callable
        ``F(P) -> ndarray (n,)`` for ``P`` of shape (n, K): the generator, vectorised
        over rows.
    grad_F : callable
        ``grad_F(P) -> ndarray (n, K)``: its gradient, vectorised over rows.
    name : str, optional
        Label used in reports.
    """

    F: Callable[[np.ndarray], np.ndarray]
    grad_F: Callable[[np.ndarray], np.ndarray]
    name: str = "custom"

    def divergence(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Row-wise ``D_F(a_j, b_j)``, shape (n,)."""
        return np.asarray(self.F(a) - self.F(b) - np.sum(self.grad_F(b) * (a - b), axis=1))

    def _F(self, P: np.ndarray) -> np.ndarray:
        out = np.asarray(self.F(P), dtype=np.float64)
        if out.shape != (P.shape[0],):
            raise ValueError(
                f"Bregman F must return shape ({P.shape[0]},) for input {P.shape}, got {out.shape}"
            )
        return out


def _neg_entropy(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(xlogy(P, P), axis=1))


def _neg_entropy_grad(P: np.ndarray) -> np.ndarray:
    return np.log(P) + 1.0


def _sq_norm(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(P * P, axis=1))


def _sq_norm_grad(P: np.ndarray) -> np.ndarray:
    return 2.0 * P


#: The built-in generators as Bregman objects (the estimators use closed forms for them).
KL = Bregman(_neg_entropy, _neg_entropy_grad, "kl")
L2 = Bregman(_sq_norm, _sq_norm_grad, "l2")


def generator_for(divergence: object) -> Generator:
    """Return the estimators' generator of a divergence: "kl", "l2", KL, L2 or a Bregman."""
    if divergence == "kl" or divergence is KL:
        return KLGenerator()
    if divergence == "l2" or divergence is L2:
        return L2Generator()
    if isinstance(divergence, Bregman):
        return CustomGenerator(divergence)
    raise ValueError(
        f"divergence must be 'kl', 'l2' or a kdecal.Bregman(F, grad_F), got {divergence!r}"
    )


# ----------------------------------------------------------------------------- estimators


def ce_p(est: Estimate, p: float) -> float:
    """``(mean_b mean_j sum_coords |E - f|^p)^(1/p)``; p = 2 uses the debiased squares.

    With the debiased squares, the mean estimates ``CE_2^2`` without bias and may be
    negative when the error is close to 0, meaning "indistinguishable from 0 at this n"
    (the one rule for squared errors of issue 26, README "Debiasing"): it is reported
    unclipped, and the root keeps its sign, ``-sqrt(-mean)``, so that ``sign(v) v^2`` is
    the squared L2 calibration error of the same estimate (to rounding) in the API, the
    report, its JSON and the bootstrap replicates alike.
    """
    c = est.problem.coords
    f = est.problem.p[..., c]
    E = est.E[..., c]
    scale = 1.0
    if p == 2.0 and est.sqerr is not None:
        inner = est.sqerr
    elif p == 2.0 and est.sq is not None:
        inner = _f.squared_rows(E, f, est.sq[..., c])
    else:
        d = np.abs(E - f)
        scale = power_scale(d, p)
        inner = np.sum((d / scale) ** p, axis=-1)
    value = est.mean(inner)
    if value < 0.0:  # only the debiased squares can be negative
        return -math.sqrt(-value)
    return scale * value ** (1.0 / p)


#: The one rule of kdecal for debiased squared errors (issue 26), stated in the README
#: ("Debiasing"), the docstrings and every report: the U-statistic (and App. D)
#: estimates of a squared L2 calibration error are unbiased and are reported unclipped,
#: so they can be negative when the error is close to 0; a negative value means
#: "indistinguishable from 0 at this n". The L2 ECE^KDE (p = 2) is the signed root
#: ``sign(v) sqrt(|v|)`` of the same value v, so that ``ece_kde(p=2) ** 2 ==
#: abs(calibration_error(divergence="l2"))`` (to rounding), both with the sign of v, in
#: the API, the report, its JSON and the bootstrap replicates alike.
SQUARED_RULE = (
    "squared L2 errors are unbiased estimates reported unclipped: a negative value "
    "means the error is indistinguishable from 0 at this n; the L2 ECE^KDE is its "
    "signed square root"
)


def power_scale(d: np.ndarray, p: float) -> float:
    """Return s with ``mean(|d|^p)^(1/p) = s mean(|d / s|^p)^(1/p)`` in float range.

    The scale keeps ``|d / s|^p`` representable for any finite p >= 1: it is 1.0 (so
    the plain formula, bit for bit) unless ``max|d|^p`` would leave [1e-250, 1e250];
    then ``max|d|``, so the largest term is exactly 1 and the terms that underflow are
    below ``1e-308`` of it.
    """
    top = float(np.max(d, initial=0.0))
    if top == 0.0 or not np.isfinite(top):
        return 1.0
    log_top = p * np.log(top)
    return 1.0 if -575.0 < log_top < 575.0 else top


def calibration_error(est: Estimate, gen: Generator, estimator: str) -> float:
    """Proper calibration error, direct (Eq. 9/26) or via refinement (Eq. 14-15)."""
    if estimator == "direct":
        return est.mean(gen.divergence(est))
    return est.mean(gen.F(est)) + est.mean(gen.risk(est.problem))


def refinement(est: Estimate, gen: Generator) -> float:
    """``REF_F = -mean F(E_j)`` (Eq. 15), averaged over the problems of the batch."""
    return -est.mean(gen.F(est))


def sharpness(est: Estimate, gen: Generator) -> float:
    """``mean F(E_j) - F(class frequencies)`` (Eq. 4-5), averaged over the batch."""
    freq = est.frequencies()
    return est.mean(gen.F(est)) - float(np.mean(gen.F_points(est.problem, freq)))
