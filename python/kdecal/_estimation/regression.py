"""The leave-one-out estimate of ``E[y | f]`` at one bandwidth.

Residual-centred (the default) or the papers' plug-in ratio with its debiased squares;
the fits that run the bandwidth search first and keep its last accumulators.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .._debias import debias as np_debias
from .._engine import runtime as _runtime
from .._numerics import exact_sum
from ..warnings import KdecalWarning, warn_user
from .problem import _POWERS, Problem, engine, problem_chunks, subproblem
from .search import (
    DEFAULT_BANDWIDTH_GRID,
    Search,
    search_bandwidth,
    search_bandwidths,
    select_bandwidth,
)

#: Regressions of ``E[y | f]``: "residual" (the default) smooths the residuals
#: ``y_i - f_i`` and adds them back, ``E_j = f_j + sum_i w_ij (y_i - f_i) / sum_i w_ij``;
#: "plugin" smooths the labels, ``E_j = sum_i w_ij y_i / sum_i w_ij`` (the papers').
ESTIMATORS = ("residual", "plugin")

#: Transient bytes per (problem, point) of a quantity's per-row terms (the KL
#: divergence of residual estimates moved into the simplex: about 130), by which
#: :meth:`Estimate.rows` chunks a large batch.
ROW_TERM_BYTES = 160.0

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
#: there (and its numerator would lose all digits). Such a row takes the mean squared
#: error of its problem's other rows, so that it leaves the estimate instead of adding
#: the square of one neighbour's residual (up to 2, and +40 ... +970 % on the K = 10
#: protocol at h = 0.01 ... 0.002; see :func:`residual_from_sums`).
RESIDUAL_DEGENERATE = 1e-8


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
        The sums are exactly rounded (:func:`exact_sum`, ``math.fsum``'s value), so the
        mean does not depend on the order of the rows, also when positive and negative
        terms (debiased estimates) nearly cancel.
        """
        x = np.asarray(x, dtype=np.float64)
        w = None if self.row_weights is None else np.asarray(self.row_weights, np.float64)
        if w is not None and not np.sum(w) > 0.0:  # no row left (a bootstrap replicate)
            return math.nan
        if not np.all(np.isfinite(x)):  # inf or nan: as np.mean has it
            return float(np.mean(x) if w is None else np.mean(np.sum(x * w, -1) / np.sum(w)))
        try:
            if w is None:
                return exact_sum(x) / x.size
            xw = np.atleast_2d(x * w)
            total = exact_sum(w)
            rows = [exact_sum(r) / total for r in xw.reshape(-1, xw.shape[-1])]
            return math.fsum(rows) / len(rows)
        except OverflowError:  # a partial sum beyond the float range
            return float(np.mean(x) if w is None else np.mean(np.sum(x * w, -1) / np.sum(w)))

    def rows(self, fn: Callable[[Estimate], np.ndarray]) -> np.ndarray:
        """Per-row terms ``fn(self)``, shape (B, n), a chunk of problems at a time.

        ``fn`` maps an estimate of some of the batch's problems to their (B', n) terms;
        a large batch (class-wise at many classes) is mapped a chunk of problems at a
        time (:func:`~kdecal._estimation.problem.problem_chunks`), so that ``fn``'s
        temporaries are those of one chunk.  The terms of each problem are the same
        either way.
        """
        chunks = problem_chunks(self.problem, ROW_TERM_BYTES)
        if len(chunks) == 1:
            return fn(self)
        out = np.empty(self.E.shape[:2])
        for sl in chunks:
            out[sl] = fn(self.part(sl))
        return out

    def part(self, problems: slice) -> Estimate:
        """Return the estimate of the problems ``problems`` of the batch (views)."""

        def cut(x: np.ndarray | None) -> np.ndarray | None:
            return None if x is None else x[problems]

        return replace(
            self,
            problem=subproblem(self.problem, problems),
            E=self.E[problems],
            sq=cut(self.sq),
            m=cut(self.m),
            S=cut(self.S),
            Q=cut(self.Q),
            sqerr=cut(self.sqerr),
            A=cut(self.A),
        )

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
        warn_user(
            f"debias={debias!r}: {n_deg} of {degenerate.size} query rows have a single "
            f"effective neighbour at bandwidth {bandwidth:g}; their plain (biased) ratio "
            "was used. A larger bandwidth avoids this.",
            KdecalWarning,
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
    row_weights: np.ndarray | None = None,
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
      :data:`RESIDUAL_DEGENERATE` of ``S0^2`` (one effective neighbour) have no pair to
      form it: they take the mean of their problem's other rows (weighted by
      ``row_weights``), which is the estimate without them, and are counted in
      ``n_degenerate``.
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
        problem,
        bandwidth,
        debias,
        m,
        S0,
        S - A,
        den,
        U,
        warn=warn,
        S=S,
        Q=Q,
        A=A,
        row_weights=row_weights,
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
    row_weights: np.ndarray | None = None,
) -> Estimate:
    """Form the residual-centred estimate from its sums (see :func:`residual_estimate`).

    ``S0`` (B, n): ``sum_i w_ij``; ``R`` (B, n, D): ``sum_i w_ij r_i``; ``den`` (B, n):
    the pair sum ``sum_{i != k} w_ij w_kj`` (``debias="ustat"``, else None); ``U`` (B,
    n): ``sum_i w_ij^2 ||r_i||^2`` (``"ustat"``).  ``S``, ``Q``, ``A`` are only stored.
    ``row_weights`` (n,): a bootstrap replicate's multiplicities, which weigh the other
    rows' mean that a degenerate row takes (the returned estimate does not hold them).
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
        if n_deg:
            sqerr = _leave_degenerate_rows(sqerr, ok, row_weights)
        if warn:
            _warn_degenerate(n_deg, ok.size, bandwidth)
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
    chunks = problem_chunks(problem, FIT_POINT_BYTES * len(distinct) + FIT_POINT_BYTES_FIXED)
    if len(chunks) == 1:
        made = _residual_fits(problem, distinct, debias, backend, progress)
    else:
        made = _residual_fits_chunked(problem, distinct, debias, backend, progress, chunks)
    if debias == "ustat":
        for h, est in made.items():
            _warn_degenerate(est.n_degenerate, est.E.shape[0] * est.E.shape[1], h)
    return {k: (made[hs[k]], search) for k in kinds}


#: Transient bytes per (problem, point) of a residual fit: per bandwidth, the engine's
#: outputs (``m``, ``S``, ``Q``, ``D``, ``A``, ``U``: 80 for binary problems), and for all
#: of them its inputs and the formation of the estimates (:func:`problem_chunks`).
FIT_POINT_BYTES = 80.0
FIT_POINT_BYTES_FIXED = 112.0

#: The arrays of a residual :class:`Estimate` with one entry per (problem, point).
_FIELDS = ("E", "m", "S", "Q", "A", "sqerr")


def _residual_fits(
    problem: Problem,
    distinct: list[float],
    debias: str,
    backend: str,
    progress: bool | None,
) -> dict[float, Estimate]:
    """Return the residual estimates of ``problem`` at each bandwidth of ``distinct`` (one pass)."""
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
            warn=False,
        )
    return made


def _residual_fits_chunked(
    problem: Problem,
    distinct: list[float],
    debias: str,
    backend: str,
    progress: bool | None,
    chunks: list[slice],
) -> dict[float, Estimate]:
    """:func:`_residual_fits` a chunk of the batch's problems at a time.

    Each chunk's estimates are written into arrays of the whole batch and dropped, so
    that the engine's outputs and inputs and the formation's temporaries are held for
    one chunk at a time (the problems are independent: each problem's numbers are those
    of a pass over the whole batch, to the fast binary engine's stated bound, whose
    choice of method samples the problems of its call).
    """
    B, n = problem.p.shape[0], problem.n
    out: dict[float, dict[str, np.ndarray | None]] = {h: {} for h in distinct}
    n_deg = dict.fromkeys(distinct, 0)
    work = float(B) * n * len(distinct) * 2000.0  # ~1 us per (query, class) and value
    with _runtime.progress_bar(
        _runtime.show_progress(work, progress), B * n, "kdecal LOO kernel"
    ) as cb:
        for sl in chunks:
            part = _residual_fits(subproblem(problem, sl), distinct, debias, backend, False)
            for h, est in part.items():
                n_deg[h] += est.n_degenerate
                for name in _FIELDS:
                    x = getattr(est, name)
                    if x is None:
                        out[h][name] = None
                        continue
                    if name not in out[h]:
                        out[h][name] = np.empty((B, *x.shape[1:]), dtype=x.dtype)
                    out[h][name][sl] = x  # type: ignore[index]
            del part
            if cb is not None:
                cb(sl.stop * n)
    return {
        h: Estimate(
            problem,
            h,
            debias,
            a["E"],  # type: ignore[arg-type]
            None,
            n_deg[h],
            a["m"],
            a["S"],
            a["Q"],
            estimator="residual",
            sqerr=a["sqerr"],
            A=a["A"],
        )
        for h, a in out.items()
    }


def _leave_degenerate_rows(
    sqerr: np.ndarray, ok: np.ndarray, row_weights: np.ndarray | None
) -> np.ndarray:
    """Give each degenerate row (``~ok``) the mean squared error of its problem's others.

    ``sqerr``, ``ok`` (B, n); ``row_weights`` (n,) or None. The problem's mean is then its
    mean over the rows with a U-statistic: a row with one effective neighbour leaves it.
    A problem without such a row keeps the plain squares.
    """
    w = np.ones(sqerr.shape[-1]) if row_weights is None else np.asarray(row_weights, float)
    wk = np.where(ok, w, 0.0)
    total = wk.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.sum(np.where(ok, sqerr, 0.0) * wk, axis=-1) / total
    fill = np.where(total > 0.0, mean, np.nan)[:, None]
    return np.where(ok | np.isnan(fill), sqerr, fill)


def _warn_degenerate(n_deg: int, size: int, bandwidth: float) -> None:
    """Warn when more than one query row in a thousand has a single effective neighbour."""
    if n_deg and n_deg > 1e-3 * size:
        how = (
            "so the squared L2 estimate is the plain (not debiased) one, as with debias='none'"
            if n_deg >= size
            else "and they leave the squared L2 estimate (each takes the mean of the other rows)"
        )
        warn_user(
            f"{n_deg} of {size} query rows have a single effective neighbour at "
            f"bandwidth {bandwidth:g}: their squared error is undefined, {how}. A larger "
            "bandwidth avoids this.",
            KdecalWarning,
        )


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
