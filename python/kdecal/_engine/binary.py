"""Fast leave-one-out sums of binary problems (top-label, class-wise, binary inputs).

Every binary problem of kdecal is the ``K = 2`` kernel problem on the points
``p_i = (1 - x_i, x_i)`` (clipped at ``PROB_EPS`` and renormalised), whose log-kernel
``L_ij = bias_i + (1/h) (log(1 - x_j) p_i0 + log(x_j) p_i1)`` is concave in the centre's
coordinate.  :func:`loo_reduce_binary` returns the accumulators of
:func:`kdecal._engine.backends.loo_reduce` for such problems in ``O(n log n + n W)`` instead of
``O(n^2)``:

- ``method="window"``: the exact terms within ``max(64, ln n + 36)`` nats of each class
  maximum (one contiguous run of the sorted centres), the log-kernel computed as the
  dense engine computes it;
- ``method="binned"``: Taylor sums over cells of the variance-stabilised coordinate
  ``arcsin sqrt(x)`` with an error bound per query and class, and the window method
  where the bound is not met (``docs/guide/binary_engine.md`` derives it: every
  accumulator within ``3e-9`` relative of the exact sums);
- ``method="local"``: the same cells, their Taylor sums translated once per group of
  neighbouring queries into one series in the query's coordinate (a local expansion,
  with an error bound per query and class as above; ``"binned"``, then the window
  method, where the bound is not met): the per-query work of ``"binned"`` without its
  loop over cells;
- ``method="exact"``: the dense engine itself (``_backends.loo_reduce``);
- ``method="auto"``: window or local per bandwidth, whichever is estimated faster.

The compiled core (``kdecal._core.binary_reduce``) computes them on ``backend="cpp"``
(and on the Dask workers); :mod:`kdecal._engine.numba_binary`, its numba twin, on
``backend="numba"``: the window, binned and local methods, the same decisions and the
same sums to rounding (no plans there: each call sorts the centres and builds its cells
and groups' expansions again).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from scipy.special import gammaln

from .. import _formulas as _f
from . import engines as _engines
from . import runtime as _runtime

METHODS = ("auto", "local", "binned", "window", "exact")
#: Cell width of the binned method, in units of the kernel's width sqrt(h)/2 in z.
CELL_WIDTH = 0.8
#: Below this bandwidth the binned method's rounding bound fails for most rows: window.
BINNED_MIN_H = 1e-6
#: Smallest bandwidth whose biases the cell methods take shifted by a constant
#: (:func:`shifted_bias`): just below 1e-5, so that the bandwidth search grid's end,
#: 1e-5 (``1 / h`` of which may round above 1e5), is included.
SHIFT_MIN_H = 9.99e-6
#: Estimated cost of the local method per (query, class), in exact window terms (the
#: window method sums about 0.7 terms per ns and thread; a local (query, class) costs
#: about 0.3 us: the maximum's search and one series per accumulator (the binned
#: method's loop over ~12-25 cells cost about 1 us); measured on the 2-core AVX-512
#: machine at n = 1e5), times 1.5 for powers = 3 with the pair sums.
_LOCAL_COST = 200.0
#: The compiled engine's check: an accumulator whose bound exceeds this fraction of its
#: value is recomputed by the next method (``kdecal::kTolCheck``).
_TOL_CHECK = 3e-9
#: Centres sampled by :func:`choose_method` (it ran once per call and bandwidth, and
#: sorting all n coordinates was a visible part of a short call's overhead).
_CHOOSE_CENTRES = 8192


#: Plans (sorted centres and cached cells) of the arrays seen in a :func:`reuse_plans`
#: scope, most recent last; None outside one.
_PLANS: contextvars.ContextVar[
    list[tuple[np.ndarray, np.ndarray, np.ndarray, int, Any]] | None
] = contextvars.ContextVar("kdecal_binary_plans", default=None)
#: Plans a scope keeps (each holds the sorted copies of its problems, 11 n B doubles,
#: and at most 256 MB of cells).
_PLANS_KEPT = 2


@contextlib.contextmanager
def reuse_plans() -> Iterator[None]:
    """Within this scope, calls on the same arrays share one sort and their cells.

    A bandwidth search makes tens of engine calls on the same points (subsets of query
    rows, one or a few bandwidths each); outside a scope each call sorts the centres and
    builds each bandwidth's cells again (about 30 ms at n = 1e5).  Inside, the compiled
    core's ``BinaryPlan`` of the call's ``logq`` and ``p`` (the same array objects, whose
    contents must not change within the scope) and labels (equal ones) is made once and
    its cells are cached per bandwidth.  Results are bit-identical with and without the scope.
    """
    token = _PLANS.set([])
    try:
        yield
    finally:
        _PLANS.reset(token)


def _plan(core: Any, logq: np.ndarray, p: np.ndarray, labels: np.ndarray, C: int) -> Any:
    """Return the scope's plan of these arrays (made on first use), or None outside one."""
    plans = _PLANS.get()
    if plans is None:
        return None
    for k, entry in enumerate(plans):
        same_labels = entry[2] is labels or (
            entry[2].shape == labels.shape and np.array_equal(entry[2], labels)
        )
        if entry[0] is logq and entry[1] is p and same_labels and entry[3] == C:
            plans.append(plans.pop(k))
            return entry[4]
    plan = core.BinaryPlan(logq, p, labels, C)
    plans.append((logq, p, labels, C, plan))
    del plans[:-_PLANS_KEPT]
    return plan


def binary_inputs(x: np.ndarray, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Build the engine's inputs of the binary problems ``(1 - x, x)``.

    Parameters
    ----------
    x : ndarray, shape (n,) or (B, n)
        Scores in [0, 1].
    hs : ndarray, shape (H,)
        Bandwidths.

    Returns
    -------
    logq, p : ndarray, shape (B, n, 2), float64, C-contiguous
        ``log p`` and the clipped, renormalised points (:func:`kdecal._formulas.binary_points`).
    bias : ndarray, shape (B, H, n), float64
        ``-sum_k lgamma(p_ik / h + 1)``, from the compiled core's ``kernel_bias`` (as the
        estimators compute it; without the core, :func:`scipy.special.gammaln`).
    """
    xb = np.atleast_2d(np.asarray(x, dtype=np.float64))
    p = np.ascontiguousarray(_f.binary_points(xb), dtype=np.float64)
    logq = np.ascontiguousarray(np.log(p))
    core = _runtime._core
    flat = p.reshape(-1, 2)
    nt = _runtime.get_num_threads()
    if core is None:  # the numba twin without the compiled core: scipy's lgamma
        bias = np.stack([-gammaln(p / float(h) + 1.0).sum(axis=-1) for h in hs], axis=1)
    else:
        bias = np.stack(
            [
                np.asarray(core.kernel_bias(flat, 1.0 / float(h), nt)).reshape(p.shape[:-1])
                for h in hs
            ],
            axis=1,
        )
    return logq, p, np.ascontiguousarray(bias)


def loo_reduce_binary(
    x: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    hs: np.ndarray,
    *,
    powers: int = 1,
    pairs: bool = False,
    resid: np.ndarray | None = None,
    rows: tuple[int, int] | None = None,
    method: str = "auto",
    progress: bool | None = None,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Leave-one-out kernel sums of the binary problems ``(1 - x, x)``.

    Parameters
    ----------
    x : ndarray, shape (n,) or (B, n)
        Scores in [0, 1] (a leading axis B holds independent problems, e.g. the
        one-vs-rest problems of class-wise calibration).
    labels : ndarray, shape (n,) or (B, n), int
        Labels in ``0..n_classes-1`` (``n_classes = 1`` and zeros: unlabelled).
    n_classes : int
        Number of label groups C.
    hs : array_like, shape (H,)
        Bandwidths (> 0).
    powers : {1, 2, 3}
        Which power sums to return.
    pairs : bool
        Also return the pair sums ``D`` (needs ``powers >= 2``).
    resid : ndarray, shape (n,) or (B, n), float64, optional
        Per-centre values ``u``: also return the residual sums ``A`` and ``U`` (not with
        ``method="exact"``).
    rows : (int, int), optional
        Query rows ``[start, stop)`` (against all n centres); default all.
    method : {"auto", "local", "binned", "window", "exact"}
        See the module docstring.
    progress : bool or None
        Progress bar; ``None`` shows one for long work only.  Ctrl-C stops the call.
    weights : ndarray, shape (n,) or (B, n), float64, optional
        Centre weights ``v_i >= 0`` (a bootstrap sample's multiplicities; ``powers <= 2``,
        no ``pairs``, not ``method="exact"``): ``S`` and ``A`` sum ``v_i w_ij``, ``Q``
        ``v_i^2 w_ij^2``; ``U`` and ``m`` are unweighted.

    Returns
    -------
    m, S, Q, T[, D][, A, U]
        As :func:`kdecal._engine.backends.loo_reduce` (shapes ``([B,] H, R)`` and
        ``([B,] H, R, C)``, the leading B only for 2-D ``x``), then, with ``resid``,
        ``A`` of shape ``([B,] H, R, 2)``: ``sum_{i != j} w_ij p_ik`` and ``U`` of shape
        ``([B,] H, R)``: ``sum_{i != j} w_ij^2 u_i``, with ``w_ij = exp(L_ij - m_j)``.

    Raises
    ------
    ValueError
        On a bad method, powers, bandwidth or row range, or inputs of the wrong shape.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    hs = np.atleast_1d(np.asarray(hs, dtype=np.float64))
    if hs.ndim != 1 or hs.size == 0 or not np.all(np.isfinite(hs) & (hs > 0)):
        raise ValueError("hs must be a non-empty 1-D array of finite bandwidths > 0")
    xa = np.asarray(x, dtype=np.float64)
    if xa.ndim not in (1, 2) or xa.shape[-1] < 1:
        raise ValueError(f"x must have shape (n,) or (B, n), got {xa.shape}")
    if not np.all((xa >= 0.0) & (xa <= 1.0)):
        raise ValueError("x must lie in [0, 1] (and not be NaN)")
    batched = xa.ndim == 2
    lab_in = np.asarray(labels)
    if lab_in.shape != xa.shape or not np.issubdtype(lab_in.dtype, np.integer):
        raise ValueError(
            f"labels must be integers of the shape of x {xa.shape}, got {lab_in.shape}"
        )
    lab = np.ascontiguousarray(lab_in, dtype=np.int64)
    logq, p, bias = binary_inputs(xa, hs)
    u = None
    if resid is not None:
        u = np.ascontiguousarray(
            np.broadcast_to(np.asarray(resid, dtype=np.float64), xa.shape)
        ).reshape(p.shape[:-1])
    v = None
    if weights is not None:
        v = np.ascontiguousarray(
            np.broadcast_to(np.asarray(weights, dtype=np.float64), xa.shape)
        ).reshape(p.shape[:-1])
    out = loo_reduce_k2(
        logq,
        p,
        lab.reshape(p.shape[:-1]),
        n_classes,
        np.ascontiguousarray(1.0 / hs),
        bias,
        powers=powers,
        pairs=pairs,
        rows=rows,
        method=method,
        progress=progress,
        u=u,
        v=v,
    )
    if batched:
        return out
    return tuple(a if a.shape == (0, 0, 0) else a[0] for a in out)


def loo_reduce_k2(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: np.ndarray,
    bias: np.ndarray,
    *,
    powers: int = 1,
    pairs: bool = False,
    rows: tuple[int, int] | None = None,
    method: str = "auto",
    progress: bool | None = None,
    u: np.ndarray | None = None,
    stats: dict[str, int] | None = None,
    threads: int | None = None,
    v: np.ndarray | None = None,
    residuals: bool = False,
    plan: Any = None,
    backend: str = "cpp",
    ref_floor: float = 0.0,
    weighted_rows: bool = False,
) -> tuple[np.ndarray, ...]:
    """:func:`kdecal._engine.backends.loo_reduce` for ``K = 2`` inputs, on the fast engine.

    The arguments are those of ``loo_reduce`` (logq, p of shape (B, n, 2), float64;
    labels (B, n); scale (H,); bias (B, H, n)), plus ``method`` (see the module
    docstring), ``u`` ((B, n) float64, optional: also return ``A`` and ``U``),
    ``stats`` (a dict that receives the engine's counters), ``threads`` (default:
    :func:`kdecal._engine.runtime.get_num_threads`) and ``v`` ((B, n) float64 >= 0,
    optional; ``powers <= 2``, no pairs): centre weights, the multiplicities of a
    bootstrap sample, ``S_c = sum_{i != j} v_i w_ij [y_i = c]``, ``Q_c`` with ``v_i^2
    w_ij^2``, ``A`` with ``v_i w_ij`` (``U``'s ``u`` carries its own; ``m`` and the
    leave-one-out of row j's own centre, all its copies, as without); ``residuals``:
    return ``A`` (and an empty ``U``) without ``u``; ``plan``: a ``core.BinaryPlan`` of
    these ``logq``, ``p`` (the same arrays) and labels to use instead of the
    :func:`reuse_plans` scope's (the engine ignores a plan of other arrays or labels);
    ``backend``: "cpp" (the compiled core) or "numba" (:mod:`.numba_binary`, where
    plans are not used); ``ref_floor`` (with ``v``): each weighted sum of power q
    accurate relative to at least ``ref_floor^q`` times the class maximum's unweighted
    term, not only to itself (:func:`consistency_sums`); ``weighted_rows`` (with ``v``):
    only the rows with ``v_j > 0`` are queries (a bootstrap sample's rows, the others
    weigh 0 in its mean), the others get the outputs of a row without centres (``m =
    -inf``, every sum 0) and the queries' are bit-identical.  Returns ``(m, S, Q, T[, D][, A,
    U])`` with the leading B axis.  Each query row's sums depend on that row alone (the
    plan, the methods and the cells on all centres), so that the rows of a call over a
    range equal, bit for bit, those rows of a call over all of them.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    n = p.shape[-2]
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    if backend not in ("cpp", "numba"):
        raise ValueError(f"backend must be 'cpp' or 'numba', got {backend!r}")
    if method == "exact":  # the dense loop itself (not loo_reduce, which comes back here)
        if v is not None:
            raise ValueError("centre weights v need a fast method, not method='exact'")
        return _engines.dense_loo_reduce(
            backend,
            logq,
            p,
            labels,
            n_classes,
            scale,
            bias,
            powers,
            r0,
            r1,
            progress=progress,
            pairs=pairs,
            resid=u,
        )
    if backend == "numba":
        reduce = _engines.require_numba_binary().binary_reduce
        plan = None
    else:
        core = _require_core()
        reduce = core.binary_reduce
        if plan is None:
            plan = _plan(core, logq, p, labels, n_classes)
    B, H = p.shape[0], scale.shape[0]
    if method == "auto":
        methods = [choose_method(p, labels, n_classes, 1.0 / float(s), powers) for s in scale]
    else:
        methods = [method] * H
    parts: list[tuple[np.ndarray, ...]] = []
    groups = [
        (mth, [t for t in range(H) if methods[t] == mth]) for mth in ("local", "binned", "window")
    ]
    groups = [g for g in groups if g[1]]
    total = (r1 - r0) * B * H
    work = float(r1 - r0) * B * H * max(1, n_classes) * 1000.0  # ~1 us per (query, class)
    order: list[int] = []
    with _runtime.progress_bar(
        _runtime.show_progress(work, progress), total, "kdecal binary kernel"
    ) as cb:
        done = 0
        for mth, ts in groups:
            idx = np.asarray(ts)
            base = done

            def report(k: int, base: int = base) -> None:
                if cb is not None:
                    cb(base + k)

            whole = len(ts) == H  # every bandwidth, in order: no copy of the bias
            bias_g = np.ascontiguousarray(bias if whole else bias[:, idx])
            shift = None
            if mth != "window":
                bias_g, shift = shifted_bias(bias_g, scale if whole else scale[idx])
            res = reduce(
                logq,
                p,
                labels,
                n_classes,
                np.ascontiguousarray(scale if whole else scale[idx]),
                bias_g,
                powers,
                r0,
                r1,
                _runtime.get_num_threads() if threads is None else int(threads),
                report if cb is not None else None,
                pairs,
                mth,
                u is not None or residuals,
                u,
                CELL_WIDTH,
                plan,
                v,
                ref_floor,
                weighted_rows,
            )
            done += (r1 - r0) * B * len(ts)
            if shift is not None:  # the class maxima back on the dense engine's scale
                res = (np.asarray(res[0]) + shift[:, :, None], *res[1:])
            parts.append(res)
            order.extend(ts)
            if stats is not None:
                for k, cnt in res[7].items():
                    stats[k] = stats.get(k, 0) + int(cnt)
    inv = np.argsort(np.asarray(order))

    def cat(i: int, axis: int = 1) -> np.ndarray:
        arrs = [np.asarray(r[i]) for r in parts]
        if arrs[0].size == 0 and arrs[0].ndim == 3 and arrs[0].shape[0] == 0:
            return arrs[0]
        if len(arrs) == 1:  # one method for every bandwidth: already in order, no copy
            return arrs[0]
        return np.ascontiguousarray(np.concatenate(arrs, axis=axis)[:, inv])

    out = [cat(0), cat(1), cat(2), cat(3)]
    if pairs:
        out.append(cat(4))
    if u is not None or residuals:
        out += [cat(5), cat(6)]
    return tuple(out)


def replicate_sums(
    logq: np.ndarray,
    p: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    method: str,
    powers: int,
    resid: bool,
    labels: np.ndarray,
    v: np.ndarray | None = None,
    plan: Any = None,
    threads: int | None = None,
    backend: str = "cpp",
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Return the sums of one resampling replicate of B binary problems (one engine call).

    ``logq``, ``p`` (B, n, 2), ``scale`` (1,), ``bias`` (B, 1, n) as for
    :func:`loo_reduce_k2`; ``labels`` (B, n), any integer dtype, the replicate's
    labels; ``v`` (n,) or (B, n), float64, or None: its centre weights (a bootstrap
    sample's multiplicities).  Returns ``S`` (B, n, 2), ``Q`` (B, n, 2) with ``powers
    = 2`` (weighted ``v^2``), and with ``resid`` the residual sums ``A`` (B, n, 2) and,
    with ``powers = 2``, ``U = sum_i w_ij^2 v_i^2 (y_i - p_i1)^2`` (B, n), the
    U-statistic's diagonal (the positive coordinate's residual,
    :func:`kdecal._estimation.problem.residual_weights`); None for the others.  With
    ``v``, only the rows drawn (``v_j > 0``) are queries: a row drawn 0 times weighs 0 in
    the replicate's mean, and its sums are those of a row without centres (0), which
    the replicate's formation treats as such (about a third of the rows, whose engine
    work is saved; the drawn rows' sums are bit-identical).  A pure function of its
    inputs (the replicates of ``backend="dask"`` run it on the workers).
    """
    B, n = p.shape[0], p.shape[1]
    lab = np.ascontiguousarray(labels, dtype=np.int64)
    vv = None
    if v is not None:
        vv = np.ascontiguousarray(np.broadcast_to(np.asarray(v, dtype=np.float64), (B, n)))
    u = None
    if resid and powers == 2:
        r = (lab == 1) - p[..., 1]
        u = r * r
        if vv is not None:
            u = u * (vv * vv)
        u = np.ascontiguousarray(u)
    out = loo_reduce_k2(
        logq,
        p,
        lab,
        2,
        scale,
        bias,
        powers=powers,
        method=method,
        progress=False,
        u=u,
        v=vv,
        residuals=resid,
        plan=plan,
        threads=threads,
        backend=backend,
        weighted_rows=vv is not None,
    )
    S = out[1][:, 0]
    Q = out[2][:, 0] if powers == 2 else None
    A = out[4][:, 0] if resid else None
    U = out[5][:, 0] if u is not None else None
    return S, Q, A, U


def consistency_sums(
    logq: np.ndarray,
    p: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    method: str,
    ustat: bool,
    labels: np.ndarray,
    plan: Any = None,
    threads: int | None = None,
    backend: str = "cpp",
) -> tuple[np.ndarray, np.ndarray | None]:
    """Return the label sums of one consistency replicate of B binary problems.

    A consistency replicate changes only the labels, and of a residual estimate's sums
    only two depend on them: ``S_1 = sum_{i != j} w_ij [y_i = 1]`` and, for the
    U-statistic (``ustat``), ``U = sum_{i != j} w_ij^2 (y_i - p_i1)^2``. Both are one
    engine call on the problems as a single class (labels all 0, so one sort of the
    centres, ``plan``: a ``core.BinaryPlan`` of ``logq``, ``p`` and zero labels with
    ``n_classes = 1``, serves every replicate) with the labels as centre weights
    ``v_i = [y_i = 1]`` and ``u_i = (y_i - p_i1)^2``: the sums in the units of the row
    maximum ``m`` over all centres, those of the estimate's own pass, each within the
    engine's bound of that row's whole kernel sum (``ref_floor=1``: a row whose near
    centres all drew label 0 has an ``S_1`` far below its maximum's term, which the
    estimator divides by that sum; its own relative precision would cost deep exact
    windows). ``S_0``, ``Q`` and ``A`` are the estimate's. Arguments as :func:`replicate_sums`; returns ``S_1``
    and ``U`` (B, n) (``U`` None without ``ustat``). Half the work of a replicate on its
    own labels (one class maximum per query instead of two, no sort): 20 → 9 ms at
    n = 20,000 (bench/README.md).
    """
    B, n = p.shape[0], p.shape[1]
    y = np.asarray(labels).reshape(B, n) == 1
    v = np.ascontiguousarray(y, dtype=np.float64)
    u = None
    if ustat:
        r = v - p[..., 1]
        u = np.ascontiguousarray(r * r)
    out = loo_reduce_k2(
        logq,
        p,
        np.zeros((B, n), dtype=np.int64),
        1,
        scale,
        bias,
        powers=1,
        method=method,
        progress=False,
        u=u,
        v=v,
        plan=plan,
        threads=threads,
        backend=backend,
        ref_floor=1.0,
    )
    return out[1][:, 0, :, 0], (out[5][:, 0] if u is not None else None)


def zero_label_plan(logq: np.ndarray, p: np.ndarray) -> Any:
    """Return the ``core.BinaryPlan`` of :func:`consistency_sums` (one class of all centres)."""
    B, n = p.shape[0], p.shape[1]
    return _require_core().BinaryPlan(logq, p, np.zeros((B, n), dtype=np.int64), 1)


def replicate_sums_chunk(
    logq: np.ndarray,
    p: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    method: str,
    powers: int,
    resid: bool,
    items: list[tuple[np.ndarray, np.ndarray | None]],
) -> list[tuple[np.ndarray | None, ...]]:
    """:func:`replicate_sums` of several ``(labels, v)`` on one thread: a dask task.

    The items with weights (bootstrap samples, whose labels are usually the same) share
    one sort of the centres (a ``BinaryPlan`` of the first one's labels; the engine
    ignores it for other labels). Items without weights of a residual estimate
    (``resid``: consistency replicates) are :func:`consistency_sums` instead, on one
    :func:`zero_label_plan`. Results are those of single calls, bit for bit.
    """
    plan = zplan = None
    first = next((lab for lab, v in items if v is not None), None)
    if first is not None:
        plan = _require_core().BinaryPlan(logq, p, np.ascontiguousarray(first, dtype=np.int64), 2)
    if resid and any(v is None for _, v in items):
        zplan = zero_label_plan(logq, p)
    return [
        consistency_sums(logq, p, scale, bias, method, powers == 2, lab, zplan, threads=1)
        if resid and v is None
        else replicate_sums(logq, p, scale, bias, method, powers, resid, lab, v, plan, threads=1)
        for lab, v in items
    ]


def loo_reduce_rows(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: np.ndarray,
    bias: np.ndarray,
    powers: int,
    row_start: int,
    row_stop: int,
    *,
    pairs: bool = False,
    resid: np.ndarray | None = None,
    method: str = "auto",
    progress: bool | None = None,
    threads: int | None = None,
    backend: str = "cpp",
) -> tuple[np.ndarray, ...]:
    """:func:`loo_reduce_k2` with the arguments and results of ``backends.loo_reduce``.

    One problem (``p`` of shape (n, 2), ``bias`` (H, n), ``resid`` (n,)) or a batch
    (a leading B axis on each), the query rows ``[row_start, row_stop)``: the results
    have the batch axis where the inputs have it.  ``backend``: "cpp" or "numba".
    """
    batched = p.ndim == 3

    def b(a: np.ndarray) -> np.ndarray:
        return a if batched else a[None]

    out = loo_reduce_k2(
        b(logq),
        b(p),
        b(labels),
        n_classes,
        scale,
        b(bias),
        powers=powers,
        pairs=pairs,
        rows=(row_start, row_stop),
        method=method,
        progress=progress,
        u=None if resid is None else b(resid),
        threads=threads,
        backend=backend,
    )
    return out if batched else tuple(x[0] if x.size else x for x in out)


def reduce_block(
    method: str, resid: np.ndarray | None, pairs: bool, *args: Any
) -> tuple[np.ndarray, ...]:
    """One row block of :func:`loo_reduce_rows` on one thread: the task of a dask worker.

    ``args``: ``logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop``
    (see :func:`kdecal._engine.dask.loo_reduce`, which submits it with ``method`` bound).
    """
    return loo_reduce_rows(
        *args, pairs=pairs, resid=resid, method=method, progress=False, threads=1
    )


def shifted_bias(bias: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``bias - c`` and ``c`` (B, H): per problem and bandwidth, ``c`` its median.

    The log-kernel ``L_ij = bias_i + s g_ij`` of a small bandwidth is the sum of two large
    terms (``|bias_i| ~ lgamma(1/h)``: 3.4e5 at h = 2.8e-5) whose difference between
    centres is much smaller, and the cell methods' rounding bound counts the magnitudes of
    the logs they combine (``docs/guide/binary_engine.md``, "Rounding"): at such h it
    failed for nearly every query, which then summed exact windows (on top-label scores
    crowded near 1: most of the n centres per query).  A constant ``c`` added to every
    centre's bias changes no weight ``exp(L_ij - m_j)`` (``m_j`` moves by ``c``), so the
    cell methods run on ``bias - c`` and ``c`` is added back to the class maxima ``m``;
    ``m`` is then within a few units in the last place of the dense engine's (the window
    method keeps the dense engine's bias and its ``m`` bit for bit).  The bound then
    holds against the exact sums; against the dense engine add that engine's own
    rounding of its large logs, about ``2 q eps |L|`` relative, which the unshifted
    magnitudes had counted.  Bandwidths below :data:`SHIFT_MIN_H` (``1 / scale``) keep
    their bias (``c = 0``), since there that term exceeds the ``1e-8`` the tests allow
    against the dense engine: on the adversarial inputs of
    ``tests/engine/test_binary_engine.py`` the largest difference was 6.3e-10 at
    h = 1e-5, 5.2e-9 at 1e-6 and 3.7e-8 at 1e-8 (``docs/guide/binary_engine.md``,
    "Shifted biases").
    """
    c = np.median(bias, axis=-1)
    c[:, np.asarray(scale) > 1.0 / SHIFT_MIN_H] = 0.0
    return np.ascontiguousarray(bias - c[..., None]), c


def choose_method(
    p: np.ndarray, labels: np.ndarray, n_classes: int, h: float, powers: int = 1
) -> str:
    """``"window"`` or ``"local"``: the one estimated faster for bandwidth ``h``.

    The window method costs the number of centres within its depth of every query
    (estimated on up to 4 of the B problems from a sample of 512 queries each and of
    :data:`_CHOOSE_CENTRES` centres, by binary search in the kernel's coordinate
    ``z = arcsin sqrt(x)``, where the kernel's width is about ``sqrt(h)/2``); the binned
    method about :data:`_LOCAL_COST` such terms per query and class.  Below
    :data:`BINNED_MIN_H`, and where the cell methods' rounding bound is predicted to fail
    for most of 512 sampled queries, the window method (they would fall back to it).
    """
    if h < BINNED_MIN_H:
        return "window"
    n = p.shape[-2]
    # the cell methods' rounding bound: with the biases shifted (shifted_bias), what is
    # left of the logs' systematic error is about 8 eps (|log x| + |log(1 - x)|) / h
    # (docs, "rounding": the query's and the cells' s (|a| + |b|) terms), which fails
    # their check (3e-9) where |log x| + |log(1 - x)| exceeds about 1.7e6 h; where that
    # holds for most queries, those methods would fall back to windows after their own
    # work.  (Unshifted, the factor is 24: top-label scores within 1e-8 of 1 failed it
    # below h = 3.3e-5, and with the shift no (query, class) fell back there down to
    # h = 1e-5, on CIFAR-10 predictions resampled to 10^6 and on the synthetic
    # class-wise problems.)
    rng_r = np.random.default_rng(1)
    xs = p[0, rng_r.integers(0, n, size=min(n, 512)), 1]
    with np.errstate(divide="ignore"):
        logs = -np.log(np.clip(xs, 1e-300, 1.0)) - np.log1p(-np.clip(xs, 0.0, 1.0 - 1e-16))
    factor = 8.0 if h >= SHIFT_MIN_H else 24.0  # unshifted below SHIFT_MIN_H
    if np.mean(factor * np.finfo(np.float64).eps * logs / h > _TOL_CHECK) > 0.5:
        return "window"
    depth = max(64.0, math.log(n) + 36.0)
    half = math.sqrt(2.0 * depth) * math.sqrt(h) / 2.0  # window half-width in z
    rng = np.random.default_rng(0)
    costs = []
    for b in np.linspace(0, p.shape[0] - 1, min(p.shape[0], 4)).astype(int):
        x = p[b, :, 1]
        sample = np.arcsin(np.sqrt(np.clip(x[rng.integers(0, n, size=min(n, 512))], 0.0, 1.0)))
        # the centres' coordinates: a random sample of _CHOOSE_CENTRES of them, the
        # counts scaled by n / sample size (an estimate for a choice of method)
        cs = x if n <= _CHOOSE_CENTRES else x[rng.integers(0, n, size=_CHOOSE_CENTRES)]
        zs = np.sort(np.arcsin(np.sqrt(np.clip(cs, 0.0, 1.0))))
        per_query = np.searchsorted(zs, sample + half) - np.searchsorted(zs, sample - half)
        costs.append(float(per_query.mean()) * n / zs.size)
    window_cost = float(np.mean(costs))
    local_cost = _LOCAL_COST * max(1, n_classes) * (1.0 + 0.25 * (powers - 1))
    return "window" if window_cost <= local_cost else "local"


def _require_core() -> Any:
    core = _runtime._core
    if core is None or not hasattr(core, "binary_reduce"):
        raise RuntimeError("the fast binary engine needs kdecal's compiled core")
    return core


#: Smallest bandwidth of the fast backward pass: the forward passes of its query role
#: take shifted biases from there (:data:`SHIFT_MIN_H`); below it the dense backward
#: pass runs.
GRAD_MIN_H = SHIFT_MIN_H
#: Cell width of the backward pass's cells of queries, in units of sqrt(h)/2 in z.
GRAD_CELL_WIDTH = 0.5


def loo_grad_k2(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: float,
    bias: np.ndarray,
    lse: np.ndarray,
    coef: np.ndarray,
    *,
    progress: bool | None = None,
    stats: dict[str, int] | None = None,
    threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`kdecal._engine.backends.loo_grad` for ``K = 2`` float64 inputs, without O(n^2).

    The arguments and the returned ``(grad_logq, grad_p, grad_bias, row_sum)`` are those
    of ``kdecal._core.loo_grad`` (one problem ``(n, 2)`` or a batch ``(B, n, 2)``).

    - The query role, ``grad_logq[j, k] = s sum_{i != j} w_ij coef[j, c_i] p[i, k]``, is
      two forward passes of :func:`loo_reduce_k2` with the centre weights ``v = p[:, k]``:
      ``sum_c coef[j, c] S_c(j) e^(m_j - lse_j)``; ``row_sum`` from the same sums
      (``p_i0 + p_i1 = 1``).
    - The centre role, ``grad_p`` and ``grad_bias`` (sums over the queries of each
      centre), is ``kdecal._core.binary_grad_centres``: Taylor series in the centre's
      coordinate over cells of queries.

    Every sum is within ``3e-9`` of the sum of its terms' magnitudes
    (``docs/guide/binary_engine.md``, "The backward pass"); ``stats`` receives the
    centre pass's counters.
    """
    core = _require_core()
    if not hasattr(core, "binary_grad_centres"):  # pragma: no cover - a stale build
        raise RuntimeError("this build of kdecal's core has no binary_grad_centres")
    batched = p.ndim == 3

    def lead(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x if batched else x[None])

    L, P, Y = lead(logq), lead(p), lead(labels)
    Bias, Lse, Coef = lead(bias), lead(lse), lead(coef)
    s = float(scale)
    bias3 = np.ascontiguousarray(Bias[:, None, :])
    # the query role: sum_{i != j, c_i = c} w_ij p[i, k] for k = 0, 1
    Sk = []
    m = None
    for k in range(2):
        out = loo_reduce_k2(
            L,
            P,
            Y,
            n_classes,
            np.array([s]),
            bias3,
            v=np.ascontiguousarray(P[..., k]),
            progress=False,
            threads=threads,
        )
        m = out[0][:, 0]
        Sk.append(out[1][:, 0])  # (B, n, C)
    assert m is not None
    factor = np.exp(m - Lse)  # w_ij = e^(L_ij - m_j) e^(m_j - lse_j)
    grad_logq = np.stack([s * np.sum(Coef * S, axis=-1) * factor for S in Sk], axis=-1)
    row_sum = np.sum(Coef * (Sk[0] + Sk[1]), axis=-1) * factor
    B, n = P.shape[:2]
    # every term is e^(bias_i + s g_ij - lse_j): a constant taken from both (the median
    # bias of each problem) changes no term and keeps the exponents' parts small at
    # small h, where |bias| ~ lgamma(1 / h) (the rounding the bound counts)
    c = np.median(Bias, axis=-1, keepdims=True)
    work = float(B) * n * 1000.0
    with _runtime.progress_bar(
        _runtime.show_progress(work, progress), B * n, "kdecal binary backward"
    ) as cb:
        grad_p, grad_bias, st = core.binary_grad_centres(
            L,
            P,
            Y,
            n_classes,
            s,
            np.ascontiguousarray(Bias - c),
            np.ascontiguousarray(Lse - c),
            Coef,
            _runtime.get_num_threads() if threads is None else int(threads),
            cb,
            GRAD_CELL_WIDTH,
        )
    if stats is not None:
        for key, cnt in st.items():
            stats[key] = stats.get(key, 0) + int(cnt)
    out4 = (grad_logq, grad_p, grad_bias, row_sum)
    return out4 if batched else (grad_logq[0], grad_p[0], grad_bias[0], row_sum[0])
