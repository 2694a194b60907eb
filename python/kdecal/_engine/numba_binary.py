"""Numba twin of the compiled fast engine of binary problems (``kdecal._core.binary_reduce``).

Imported lazily, like :mod:`kdecal._engine.numba` (whose helpers it uses): it imports
numba at module level.  :func:`binary_reduce` has the contract of the compiled
``binary_reduce`` as :func:`kdecal._engine.binary.loo_reduce_k2` calls it (the same
arguments, checks, returned tuple and empty-array conventions) and computes the same
leave-one-out sums of the ``K = 2`` (Beta-kernel) problems in ``O(n log n + n W)``
(``docs/guide/binary_engine.md``; the C++ is ``cpp/src/binary.cpp``, whose names this
module follows):

- ``method="window"``: per (query, class) the class maximum of the log-kernel ``L`` found
  by the concavity of ``L`` in the centre's coordinate (binary search over the digamma
  differences of the sorted class, a scan of 8 centres either side, the same hill-climb
  and the same final walk over rounding-level ties as the C++), then the exact terms
  outward from it in chunks of 64 centres until a whole chunk lies ``T = max(64, ln n +
  36)`` nats below (deeper for the pair sums when ``e1`` is small, and for centre weights
  when the weighted sum is small next to the maximum's term, as the C++ does);
- ``method="binned"``: the Taylor sums over cells in ``z = arcsin sqrt(x)`` with the
  error bound of section 3 per (query, class), and the window method where it is not
  met (every accumulator within ``3e-9`` relative of the exact sums): the same cells,
  moments, orders, bounds and checks as the C++, so the same (query, class) pairs fall
  back to windows;
- ``method="local"``: the binned method's cells, their Taylor sums translated once per
  group of neighbouring queries (at most ``0.3 sqrt(h)/2`` in ``z`` and 256 points,
  over all n sorted positions) into one series of order 12 in the query's coordinate,
  with its bound per (query, class) (section 4); where it is not met, the binned method,
  then the window method: the same groups, expansions, bounds and fallbacks as the
  C++ ``build_local`` and ``local_eval`` (and, as there, no moments for the fine cells
  without the pair or residual sums), so the same (query, class) pairs are served by
  each (the counters ``rows_local``, ``groups_local``, ``fallbacks`` equal the compiled
  core's on the tests' inputs).

``L`` is evaluated as the compiled core evaluates it: with fused multiply-adds where the
core's SIMD path has them (``avx2``, ``avx512``, AArch64), unfused otherwise, and unfused
without the compiled core, as the numba dense engine (:mod:`kdecal._engine.numba`) computes
it (:func:`fused_kernel`); so the class maxima ``m`` are those of the dense engine of the
same machine, bit for bit.  The sums are formed in another order (each window's terms
added element-wise into 64 lanes, the lanes summed as a tree at the end) and with the
numba engine's ``exp``: they agree with the compiled core's to rounding (1e-15 relative
at n = 1e3, 1e-14 at n = 1e5).  Each query row is computed by one thread in a fixed
order, so the results depend neither on the number of threads nor on the row range asked
for.  The rows run in chunks of about :data:`kdecal._engine.numba.CHUNK_SECONDS` (one
kernel call each, timed from the previous one), so that ``progress`` is called and
Ctrl-C is seen between two chunks (the local method: chunks of groups, each group and its
rows computed by one thread).  ``plan`` (the compiled core's sorted centres, cell cache
and groups' expansions) is ignored: each call sorts the centres and builds its cells
and expansions again.

Speed (2 threads of a shared 2-core AVX-512 machine, n = 1e5 top-label-like scores,
h = 1e-3, powers = 2 with the pair and residual sums): window 11.4 s (compiled 7.2 s; its
windows hold 58 % of the centres there), binned 1.0 s (compiled 0.42 s), local 0.20 s
(compiled 0.10 s); the numba dense engine 32 s.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import njit, prange

from . import runtime as _runtime
from .numba import CHUNK_SECONDS, _exp_nonpos, _fma, _seg_max, _tree_sum, num_threads

__all__ = ["binary_reduce", "fused_kernel"]

_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}

_EPS = float(np.finfo(np.float64).eps)
#: exp arguments are clamped here (kdecal::kClamp): the deepest window
_KCLAMP = 230.0
#: the window method's least depth (kdecal::kDrop)
_KDROP = 64.0
#: centres per chunk of the window walk (and of the exact sums of a cell)
_KCHUNK = 64
#: highest Taylor order of the binned method (kdecal::kMaxOrder); moments per array
_KMAXORDER = 24
_KNP = _KMAXORDER + 1
#: relative truncation tolerance per cell (kdecal::kTolCell)
_KTOLCELL = 1e-10
#: the binned method's check (kdecal::kTolCheck)
_KTOLCHECK = 3e-9
#: fine cells per coarse cell
_KSUB = 4
#: consecutive sorted queries per block of a task (neighbours share cache lines)
_QBLOCK = 16
#: 1 / (p + 1) for p = 0 .. kMaxOrder + 2, and 1 / p! for p = 0 .. kMaxOrder
_INV_V = np.array([1.0 / (p + 1) for p in range(_KMAXORDER + 3)])
_INV_F = np.ones(_KNP)
for _p in range(1, _KNP):
    _INV_F[_p] = _INV_F[_p - 1] / _p  # as the C++ builds it
del _p

# Rows of the centre data ``cen`` (8, n), in sorted order: the bias (of the bandwidth at
# hand), p0, p1, logq0, logq1, u, |u| and the centre weights v (1 without weights).
_CB, _CP0, _CP1, _CLQ0, _CLQ1, _CU, _CUA, _CV = range(8)
# Rows of the integer data ``ix`` (4, n): the original row of each sorted position, the
# run of identical points (and label) it belongs to, [run_lo, run_hi), and (binned) its
# coarse cell.
_IPERM, _IRLO, _IRHI, _ICELL = range(4)
# Scalars of a call ``cfg``: 1 / h, the largest centre weight, the largest |u|, n, the
# binned method's depth ln n + 36 and the window method's max(64, ln n + 36).
_FS, _FVMAX, _FUMAX, _FN, _FTB, _FTW, _FFLOOR = range(7)
# Flags of a call ``fl``: powers, pairs, A, U, centre weights, fused L, binned, the
# highest power of the binned sums, then the accumulators wanted (e1, e2, e3, A0, A1, U).
# The number of coarse cells closes it (the fine ones follow them in the cell arrays).
_GPOW, _GPAIRS, _GA, _GU, _GW, _GFUSED, _GBINNED, _GQMAX = range(8)
_GWANT = 8
_GNC = 14
_NFL = 15
# Moment arrays of a cell: e^phi, e^phi p0, e^phi p1, e^2phi, e^2phi u, e^3phi
_M1, _A0, _A1, _M2, _U2, _M3 = range(6)
_NMOM = 6
# accumulator (e1, e2, e3, A0, A1, U) -> its power q and its moment array
_QOF = np.array([1, 2, 3, 1, 1, 2], np.int64)
_MOF = np.array([_M1, _M2, _M3, _A0, _A1, _U2], np.int64)
# Integer columns of a cell: start, end, ref (sorted positions), fb, fe (a coarse cell's
# fine cells), off (offset of its moments; -1: none, a single centre, summed directly).
# The coarse cells come first in the arrays of cells, then the fine ones.
_CI_START, _CI_END, _CI_REF, _CI_FB, _CI_FE, _CI_OFF = range(6)
# Float columns: L of the reference at itself, Phi, dmax, esum, sum e^{2 phi} |u|, then
# 1 / M_0 of each moment array (0 where M_0 = 0).
_CF_LRR, _CF_PHI, _CF_DMAX, _CF_ESUM, _CF_ABSU, _CF_INV0 = range(6)
_NCF = _CF_INV0 + _NMOM
# State of one binned (query, class): the sums (e1, e2, e3, A0, A1, U without the
# maximum's term), their error bounds, the bounds of the cells left out (w, w^2, w^3),
# the running scale of U (sum w^2 |u|) and the maximum's own terms (vb, vb^2, vb^3,
# vb p0, vb p1, |u|).
_SA, _SE, _SD, _SU, _SB = 0, 6, 12, 15, 16
_NSTATE = 22
# Rows of a task's scratch ``scr`` (_NSCR, 64): the logs and terms of a chunk, a few
# scalars, then the lanes of the six sums (added element-wise, summed once per window).
_RX, _RW, _RTMP, _RLN = 0, 1, 2, 3
_NSCR = _RLN + 6
# Counters of a task (the compiled core's BinaryStats)
_ST_DIRECT, _ST_CELLS, _ST_TERMS, _ST_FALLBACKS, _ST_LONG, _ST_PFALL = range(6)
_ST_ROWS, _ST_GROUPS = 6, 7
_NST = 8
# The local method (kdecal's kPt, kGroupWidth, kGroupMax, kGroupMin): the order of the
# series in t, a group's z-span in units of sqrt(h)/2, its most and least points
_KPT = 12
_KGROUPWIDTH = 0.3
_KGROUPMAX = 256
_KGROUPMIN = 4
# the power q of each moment array (M1, A0, A1, M2, U2, M3)
_QARR = np.array([1, 1, 1, 2, 2, 3], np.int64)
# C(p + l, p) for p + l <= kMaxOrder (0 beyond), as the C++ BinomTable builds it
_BINOM_C = np.zeros((_KNP, _KNP))
for _a in range(_KNP):
    for _b in range(_KNP):
        _BINOM_C[_a, _b] = (
            1.0
            if _b == 0
            else (0.0 if _a == 0 else _BINOM_C[_a - 1, _b - 1] + _BINOM_C[_a - 1, _b])
        )
_BINOM_T = np.zeros((_KNP, _KNP))
for _a in range(_KNP):
    for _b in range(_KNP):
        _BINOM_T[_a, _b] = _BINOM_C[_a + _b, _a] if _a + _b < _KNP else 0.0
del _a, _b, _BINOM_C
# Scalars of a (group, class) expansion ``le``: Q's class maximum M, xbar = x_Q, Q's
# logs, the systematic log error of the cells' part, the largest esum of the cells used,
# and a flag: a term too far above M (the expansion may not serve).
_LM, _LXBAR, _LQ0, _LQ1, _LDELTA, _LESUM, _LBAD = range(7)
_NLE = 7
_STAT_KEYS = (
    "pairs_direct",
    "cells_taylor",
    "terms_taylor",
    "fallbacks",
    "pairs_long",
    "pairs_fallback",
    "rows_local",
    "groups_local",
)


def fused_kernel() -> bool:
    """Whether the log-kernel is evaluated with fused multiply-adds (as the compiled core's).

    The compiled core's dense and binary engines contract ``logq0 p0 + logq1 p1`` and
    ``bias + s G`` to FMA on their ``avx2`` and ``avx512`` paths and on AArch64; the numba
    dense engine never does.  With the compiled core this follows its path (so that ``m``
    is the compiled engines' bit for bit), without it the numba dense engine's.
    """
    core = _runtime._core
    if core is None or not hasattr(core, "simd_path"):
        return False
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    return str(core.simd_path()) != "baseline"


# ---------------------------------------------------------------------------
# The log-kernel, the digamma differences and the class maximum (section 1).
# ---------------------------------------------------------------------------
@njit(inline="always", **_JIT)
def _lk(b, s, q0, q1, c0, c1, fused):
    """L = b + s (q0 c0 + q1 c1), as the compiled core's path computes it."""
    if fused:
        return _fma(s, _fma(q1, c1, q0 * c0), b)
    return b + s * (q0 * c0 + q1 * c1)


@njit(**_JIT)
def _digamma(x):
    """digamma(x) for x >= 1 (the C++ engine's: recurrence to 8, asymptotic series)."""
    acc = 0.0
    while x < 8.0:
        acc -= 1.0 / x
        x += 1.0
    r = 1.0 / x
    r2 = r * r
    series = r2 * (1.0 / 12 - r2 * (1.0 / 120 - r2 * (1.0 / 252 - r2 * (1.0 / 240 - r2 / 132))))
    return acc + math.log(x) - 0.5 * r - series


@njit(parallel=True, **_JIT)
def _context(cen, perm, bias_row, s, g):
    """Set the centres' bias (cen[_CB]) and digamma differences g, in sorted order."""
    n = cen.shape[1]
    for k in prange(n):
        cen[_CB, k] = bias_row[perm[k]]
        g[k] = _digamma(cen[_CP0, k] * s + 1.0) - _digamma(cen[_CP1, k] * s + 1.0)


@njit(**_JIT)
def _class_argmax(cen, g, ix, s, lo, hi, me, q0, q1, fused):
    """Return (best, mc): the class maximum of L for the query and its value.

    best is its sorted position (never the query's own position me); (-1, -inf) when the
    class has no other centre.
    The C++ class_argmax, step for step: binary search of the root of the derivative
    over g (decreasing along the class), a scan of 8 centres either side, the
    hill-climb while the best sits next to an edge of the scanned window, and the walk
    outward over runs of identical points while L stays within rounding of the best.
    """
    if hi - lo <= 0 or (hi - lo == 1 and me == lo):
        return -1, -np.inf
    # (2-D indexing, no views: no reference counts per (query, class))
    thr = q0 - q1
    a = lo
    b = hi
    while a < b:  # the first position with g <= thr
        mid = a + (b - a) // 2
        if g[mid] > thr:
            a = mid + 1
        else:
            b = mid
    best = -1
    bv = -np.inf
    wl = max(lo, a - 8)
    wr = min(hi, a + 8)
    for k in range(wl, wr):
        if k != me:
            val = _lk(cen[_CB, k], s, q0, q1, cen[_CP0, k], cen[_CP1, k], fused)
            if best < 0 or val > bv:  # first of equal values: lowest position
                bv = val
                best = k
    while True:  # the hill-climb past the window's edges
        ext = False
        if best >= 0 and wl > lo and (best - wl) - (1 if wl <= me < best else 0) < 2:
            nl = max(lo, wl - 16)
            for k in range(nl, wl):
                if k != me:
                    val = _lk(cen[_CB, k], s, q0, q1, cen[_CP0, k], cen[_CP1, k], fused)
                    if best < 0 or val > bv:
                        bv = val
                        best = k
            wl = nl
            ext = True
        if best >= 0 and wr < hi and (wr - best - 1) - (1 if best < me < wr else 0) < 2:
            nr = min(hi, wr + 16)
            for k in range(wr, nr):
                if k != me:
                    val = _lk(cen[_CB, k], s, q0, q1, cen[_CP0, k], cen[_CP1, k], fused)
                    if best < 0 or val > bv:
                        bv = val
                        best = k
            wr = nr
            ext = True
        if not ext:
            break
    if best < 0:  # the window held only the query itself
        for k in range(lo, hi):
            if k != me:
                val = _lk(cen[_CB, k], s, q0, q1, cen[_CP0, k], cen[_CP1, k], fused)
                if best < 0 or val > bv:
                    bv = val
                    best = k
    # centres beyond the window within rounding of the best (runs of identical points)
    pb0 = cen[_CP0, best]
    pb1 = cen[_CP1, best]
    delta = 8.0 * _EPS * (abs(bv) + abs(cen[_CB, best]) + s * (abs(q0) * pb0 + abs(q1) * pb1))
    t = wl - 1
    while t >= lo:  # t: the last position of a run
        r0 = ix[_IRLO, t]
        if not (t == r0 and t == me):
            val = _lk(cen[_CB, t], s, q0, q1, cen[_CP0, t], cen[_CP1, t], fused)
            if val < bv - delta:
                break
            if val > bv:
                bv = val
                best = t - 1 if t == me else t
        t = r0 - 1
    t = wr
    while t < hi:  # t: the first position of a run
        r1 = ix[_IRHI, t]
        if not (t + 1 == r1 and t == me):
            val = _lk(cen[_CB, t], s, q0, q1, cen[_CP0, t], cen[_CP1, t], fused)
            if val < bv - delta:
                break
            if val > bv:
                bv = val
                best = t + 1 if t == me else t
        t = r1
    return best, bv


# ---------------------------------------------------------------------------
# Exact terms of a range of sorted centres and the window method (section 2).
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _range_lanes(cen, urow, weighted, fused, a, b, skip1, skip2, s, q0, q1, mc, T, scr, ln):
    """Add the exact terms of the centres [a, b) (at most 64) to the lanes ln (6, 64).

    ln[k, i - a] += the k-th term of centre i, over the sorted centres [a, b) other than
    skip1, skip2 whose w = exp(L - mc) has L - mc >= -T: w, w^2, w^3, w p0, w p1, w^2 u (u:
    the row urow of cen; with centre weights, v w for w, except in w^2 u).  Returns the
    largest L - mc of those centres (-inf if none), whatever their weights.  Element-wise
    (vectorised; all six, as the C++ kernel: branches between the loops cost more than
    the sums), the lanes summed once per window (:func:`_flush`), in a fixed order.
    """
    w = b - a
    # slices from 0 (no index wrap-around to check: the loops vectorise)
    bias = cen[_CB, a:b]
    p0 = cen[_CP0, a:b]
    p1 = cen[_CP1, a:b]
    X = scr[_RX, :w]
    W = scr[_RW, :w]
    for ii in range(w):
        X[ii] = _lk(bias[ii], s, q0, q1, p0[ii], p1[ii], fused) - mc
    if a <= skip1 < b:
        X[skip1 - a] = -np.inf
    if a <= skip2 < b:
        X[skip2 - a] = -np.inf
    mx = _seg_max(X, 0, w)
    if not (mx >= -T):  # every term below e^-T (or none): nothing to add
        return mx
    floor = -T
    for ii in range(w):
        x = X[ii]
        e = _exp_nonpos(max(x, -_KCLAMP))
        W[ii] = e if x >= floor else 0.0
    u = cen[urow, a:b]
    lk = ln[5, :w]
    for ii in range(w):  # w^2 u: no centre weights
        lk[ii] += (W[ii] * W[ii]) * u[ii]
    if weighted:
        v = cen[_CV, a:b]
        for ii in range(w):
            W[ii] = W[ii] * v[ii]
    lk = ln[0, :w]
    for ii in range(w):
        lk[ii] += W[ii]
    lk = ln[1, :w]
    for ii in range(w):
        lk[ii] += W[ii] * W[ii]
    lk = ln[2, :w]
    for ii in range(w):
        lk[ii] += (W[ii] * W[ii]) * W[ii]
    lk = ln[3, :w]
    for ii in range(w):
        lk[ii] += W[ii] * p0[ii]
    lk = ln[4, :w]
    for ii in range(w):
        lk[ii] += W[ii] * p1[ii]
    return mx


@njit(**_JIT)
def _flush(ln, acc):
    """Add the sums of the lanes ln[k] to acc[k] (trees, a fixed order); zero the lanes."""
    for k in range(6):
        acc[k] += _tree_sum(ln[k])
        ln[k, :] = 0.0


@njit(**_JIT)
def _window_pass(cen, weighted, fused, lo, hi, me, best, s, q0, q1, mc, T, scr, acc):
    """Sum one class outward from its maximum into acc (reset); return the terms visited.

    Chunks of 64 centres either side of best, until a whole chunk lies below e^-T.
    """
    for k in range(6):
        acc[k] = 0.0
    ln = scr[_RLN : _RLN + 6]
    cnt = 0
    e = best
    while e > lo:
        a = max(lo, e - _KCHUNK)
        mx = _range_lanes(cen, _CU, weighted, fused, a, e, me, best, s, q0, q1, mc, T, scr, ln)
        cnt += e - a
        e = a
        if mx < -T:
            break
    a = best + 1
    while a < hi:
        e = min(hi, a + _KCHUNK)
        mx = _range_lanes(cen, _CU, weighted, fused, a, e, me, best, s, q0, q1, mc, T, scr, ln)
        cnt += e - a
        a = e
        if mx < -T:
            break
    _flush(ln, acc)
    return cnt


@njit(**_JIT)
def _floored(ref, f):
    """Return a check's reference with the centre weights' floor (the C++ floored)."""
    return max(ref, f) if f > 0.0 else ref


@njit(**_JIT)
def _window_sums(cen, cfg, fl, lo, hi, me, best, vb, q0, q1, mc, scr, acc):
    """Run the window method of one (query, class); return the terms visited.

    acc[0..2] = e1, e2, e3 (without the maximum's term), acc[3], acc[4] = A0, A1 and
    acc[5] = U (with it), in units of the class maximum's term.

    Depth max(64, ln n + 36) nats; the pair sums D ~ 2 e1 need e1 to its own precision,
    so with pairs the window goes to ln n + 36 nats below e1 (at most 230) when the
    terms left out are not negligible next to it; with centre weights, as deep as the
    weighted sum vb + e1 needs next to the heaviest centre (section "Centre weights").
    """
    s = cfg[_FS]
    weighted = fl[_GW] != 0
    fused = fl[_GFUSED] != 0
    Tn = cfg[_FTB]
    T = cfg[_FTW]
    cnt = _window_pass(cen, weighted, fused, lo, hi, me, best, s, q0, q1, mc, T, scr, acc)
    e1 = acc[0]
    if fl[_GPAIRS] != 0 and T < _KCLAMP and not (e1 > 0 and math.log(e1) > Tn - T):
        T = min(_KCLAMP, Tn - math.log(e1)) if e1 > 0 else _KCLAMP
        cnt += _window_pass(cen, weighted, fused, lo, hi, me, best, s, q0, q1, mc, T, scr, acc)
    elif weighted and T < _KCLAMP:
        vmax = cfg[_FVMAX]
        lv = math.log(vmax) if vmax > 0 else -np.inf
        sv = _floored(vb + e1, cfg[_FFLOOR])
        if not (sv > 0 and math.log(sv) > Tn - T + lv):
            T = min(_KCLAMP, Tn + lv - math.log(sv)) if sv > 0 else _KCLAMP
            cnt += _window_pass(cen, weighted, fused, lo, hi, me, best, s, q0, q1, mc, T, scr, acc)
    acc[3] += vb * cen[_CP0, best]
    acc[4] += vb * cen[_CP1, best]
    acc[5] += cen[_CU, best]
    return cnt


@njit(**_JIT)
def _emit(row, mcs, vbs, sums, fl, outs):
    """Write the outputs of one query row from its classes' sums (the C++ emit)."""
    m_out, S_out, Q_out, T_out, D_out, A_out, U_out = outs
    C = mcs.shape[0]
    powers = fl[_GPOW]
    mx = -np.inf
    for c in range(C):
        mx = max(mx, mcs[c])
    m_out[row] = mx
    a0 = 0.0
    a1 = 0.0
    uu = 0.0
    for c in range(C):
        empty = not (mcs[c] > -np.inf)
        f = 0.0 if empty else math.exp(mcs[c] - mx)
        vb = vbs[c]
        e = sums[c, 0]
        S_out[row, c] = 0.0 if empty else (vb + e) * f
        if powers >= 2:
            Q_out[row, c] = 0.0 if empty else (vb * vb + sums[c, 1]) * (f * f)
        if powers >= 3:
            T_out[row, c] = 0.0 if empty else (vb * vb * vb + sums[c, 2]) * (f * f * f)
        if fl[_GPAIRS] != 0:
            D_out[row, c] = 0.0 if empty else ((2.0 * e - sums[c, 1]) + e * e) * (f * f)
        if not empty:
            a0 += sums[c, 3] * f
            a1 += sums[c, 4] * f
            uu += sums[c, 5] * (f * f)
    if fl[_GA] != 0:
        A_out[row, 0] = a0
        A_out[row, 1] = a1
    if fl[_GU] != 0:
        U_out[row] = uu


# ---------------------------------------------------------------------------
# The binned method (section 3): cells in z, their moments, the Taylor sums.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _cell_bounds(z, seg, wf):
    """Coarse and fine cells of every class: z-cells of width 4 wf and wf.

    Returns (ci, fi, cell_of): the integer columns of the coarse and fine cells (start,
    end, ref = start, fb, fe; off = -1) and the coarse cell of every sorted position.
    """
    n = z.shape[0]
    ci = np.empty((max(n, 1), 6), np.int64)
    fi = np.empty((max(n, 1), 6), np.int64)
    cell_of = np.zeros(n, np.int64)
    nc = 0
    nf = 0
    for c in range(seg.shape[0] - 1):
        prev_f = -1
        prev_c = -1
        fresh = True  # a class starts new cells
        for t in range(seg[c], seg[c + 1]):
            fid = np.int64(math.floor(z[t] / wf))
            cid = fid // _KSUB  # z >= 0
            if fresh or cid != prev_c:
                ci[nc, _CI_START] = t
                ci[nc, _CI_END] = t + 1
                ci[nc, _CI_REF] = t
                ci[nc, _CI_FB] = nf
                ci[nc, _CI_FE] = nf
                ci[nc, _CI_OFF] = -1
                nc += 1
                prev_c = cid
            else:
                ci[nc - 1, _CI_END] = t + 1
            if fresh or fid != prev_f:
                fi[nf, _CI_START] = t
                fi[nf, _CI_END] = t + 1
                fi[nf, _CI_REF] = t
                fi[nf, _CI_FB] = 0
                fi[nf, _CI_FE] = 0
                fi[nf, _CI_OFF] = -1
                nf += 1
                prev_f = fid
            else:
                fi[nf - 1, _CI_END] = t + 1
            ci[nc - 1, _CI_FE] = nf
            fresh = False
            cell_of[t] = nc - 1
    return ci[:nc].copy(), fi[:nf].copy(), cell_of


@njit(parallel=True, **_JIT)
def _cell_moments(ci, cf, mom, cen, s, weighted, fused, need):
    """Set the reference, Phi, dmax, esum and moments of the cells with moments (off >= 0).

    mom[off + a 25 + p] = sum_i g_a,i e^{q phi_i} d_i^p / p! (the C++ cell_moments).
    """
    bias = cen[_CB]
    p0 = cen[_CP0]
    p1 = cen[_CP1]
    u = cen[_CU]
    v = cen[_CV]
    for k in prange(ci.shape[0]):
        off = ci[k, _CI_OFF]
        if off < 0:
            continue
        start = ci[k, _CI_START]
        end = ci[k, _CI_END]
        rs = (start + end) // 2
        ci[k, _CI_REF] = rs
        q0 = cen[_CLQ0, rs]
        q1 = cen[_CLQ1, rs]
        cf[k, _CF_LRR] = _lk(bias[rs], s, q0, q1, p0[rs], p1[rs], fused)
        phimax = -np.inf
        dmax = 0.0
        emax = 0.0
        for t in range(start, end):
            phimax = max(phimax, _lk(bias[t], s, q0, q1, p0[t], p1[t], fused))
            dmax = max(dmax, abs(p1[t] - p1[rs]))
            emax = max(emax, abs((p0[t] + p1[t]) - 1.0))
        cf[k, _CF_PHI] = phimax
        cf[k, _CF_DMAX] = dmax
        cf[k, _CF_ESUM] = 2.0 * emax + 4 * _EPS  # |(p0 + p1) - 1| itself is rounded
        absu = 0.0
        for t in range(start, end):
            phi = _lk(bias[t], s, q0, q1, p0[t], p1[t], fused) - phimax
            # a centre more than 200 nats below the cell's largest is left out (docs)
            w1 = 0.0 if phi < -200.0 else math.exp(phi)
            w2 = w1 * w1
            w3 = w2 * w1
            d = p1[t] - p1[rs]
            absu += w2 * abs(u[t])
            vt = v[t] if weighted else 1.0
            for a in range(_NMOM):
                if not need[a]:
                    continue  # arrays no accumulator of this call uses stay 0
                if a == _M1:
                    wa = w1 * vt if weighted else w1
                elif a == _A0:
                    wa = (w1 * p0[t]) * vt if weighted else w1 * p0[t]
                elif a == _A1:
                    wa = (w1 * p1[t]) * vt if weighted else w1 * p1[t]
                elif a == _M2:
                    wa = w2 * (vt * vt) if weighted else w2
                elif a == _U2:
                    wa = w2 * u[t]
                else:
                    wa = w3 * (vt * vt * vt) if weighted else w3
                base = off + a * _KNP
                dp = 1.0
                for p in range(_KNP):
                    mom[base + p] += wa * dp
                    dp = dp * d
        for j in range(_NMOM * _KNP):
            mom[off + j] *= _INV_F[j % _KNP]
        for a in range(_NMOM):
            m0 = absu if a == _U2 else mom[off + a * _KNP]
            cf[k, _CF_INV0 + a] = 1.0 / m0 if m0 > 0 else 0.0
        cf[k, _CF_ABSU] = absu


@njit(inline="always", **_JIT)
def _series(mom, base, P, k):
    """sum_{p <= P} mom[base + p] k^p in blocks of four terms (the C++ series)."""
    k2 = k * k
    k4 = k2 * k2
    r = (P + 1) & 3
    b0 = P + 1 - r  # terms [b0, P] lead, then blocks of four below
    acc = 0.0
    for i in range(r - 1, -1, -1):
        acc = acc * k + mom[base + b0 + i]
    b = base + b0 - 4
    while b >= base:
        acc = acc * k4 + ((mom[b] + mom[b + 1] * k) + (mom[b + 2] + mom[b + 3] * k) * k2)
        b -= 4
    return acc


@njit(inline="always", **_JIT)
def _order_for(xi, tgt):
    """(P, rem): the smallest order P with rem = xi^(P+1)/(P+1)! <= tgt, or kMaxOrder + 1."""
    if xi == 0.0:
        return 0, 0.0
    term = xi  # xi^(P+1)/(P+1)! for P = 0
    for P in range(_KMAXORDER + 1):
        if term <= tgt:
            return P, term
        term *= xi * _INV_V[P + 1]
    return _KMAXORDER + 1, term


@njit(**_JIT)
def _do_cell(
    k, coarse, first, stop, remaining, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr
):
    """Add the cell k to the binned sums of a (query, class) (the C++ do_cell).

    qv = (q0, q1, mc).  Returns 0: every term of the cell (and beyond) is negligible (its
    bound added to the drop), 1: added, 2: a coarse cell whose series would be too long,
    to be taken as its fine cells.  (2-D indexing, no array views: no reference counts
    per cell.)
    """
    s = cfg[_FS]
    Tb = cfg[_FTB]
    fused = fl[_GFUSED] != 0
    weighted = fl[_GW] != 0
    q0 = qv[0]
    q1 = qv[1]
    mc = qv[2]
    rs = ci[k, _CI_REF]
    Lrr = cf[k, _CF_LRR]
    phim = cf[k, _CF_PHI]
    dmax = cf[k, _CF_DMAX]
    pr0 = cen[_CP0, rs]
    pr1 = cen[_CP1, rs]
    Lrj = _lk(cen[_CB, rs], s, q0, q1, pr0, pr1, fused)
    E = (Lrj - Lrr) + phim - mc
    lq0r = cen[_CLQ0, rs]
    lq1r = cen[_CLQ1, rs]
    d0q = q0 - lq0r
    d1q = q1 - lq1r
    kappa = s * (d1q - d0q)
    xi1 = abs(kappa) * dmax
    F1 = math.exp(E)
    ex1 = math.exp(xi1)
    w = F1 * ex1  # bounds every term of the cell
    if not first and (E + xi1 < -Tb or remaining * w < stop):  # this cell and beyond
        wv = w * cfg[_FVMAX]  # the heaviest centre's term
        state[_SD] += remaining * wv
        state[_SD + 1] += remaining * wv * wv
        state[_SD + 2] += remaining * wv * wv * wv
        return 0
    # systematic error of a term's log (docs, "rounding"), with a margin of about 2
    mag = (
        abs(Lrj)
        + abs(Lrr)
        + 2.0 * abs(phim)
        + 2.0 * abs(mc)
        + s * (abs(q0) * pr0 + abs(q1) * pr1 + abs(lq0r) * pr0 + abs(lq1r) * pr1)
        + s * (abs(d0q) + abs(d1q)) * dmax
    )
    dsys = 4.0 * _EPS * mag + s * abs(d0q) * cf[k, _CF_ESUM]
    start = ci[k, _CI_START]
    end = ci[k, _CI_END]
    count = end - start - (1 if start <= me < end else 0) - (1 if start <= best < end else 0)
    if count <= 0:
        return 1
    # orders per power q = 1, 2, 3 (tuples indexed by q; no allocation per cell)
    Fq = (0.0, F1, F1 * F1, F1 * F1 * F1)
    exq = (1.0, ex1, ex1 * ex1, ex1 * ex1 * ex1)
    P1, P2, P3 = 0, 0, 0
    rem1, rem2, rem3 = 0.0, 0.0, 0.0
    off = ci[k, _CI_OFF]
    exact_only = off < 0
    direct = exact_only
    cost_t = 0.0
    for q in range(1, fl[_GQMAX] + 1):
        if direct:
            break
        xi = q * xi1
        # ub = Fq M0 e^xi bounds the cell's sum: tgt = tau (e^-2xi + R / (10 ub)), the
        # smallest over this power's accumulators
        rmin = np.inf
        anyq = False
        for a in range(6):
            if fl[_GWANT + a] == 0 or _QOF[a] != q:
                continue
            inv0 = cf[k, _CF_INV0 + _MOF[a]]
            if inv0 == 0.0:
                continue
            rmin = min(rmin, (state[_SB + a] + state[_SA + a]) * inv0)
            anyq = True
        if not anyq:
            continue
        inv_ex = 1.0 / exq[q]
        tgt = _KTOLCELL * (inv_ex * inv_ex + rmin * inv_ex / (10.0 * Fq[q]))
        Pq, rq = _order_for(xi, tgt)
        if q == 1:
            P1, rem1 = Pq, rq
        elif q == 2:
            P2, rem2 = Pq, rq
        else:
            P3, rem3 = Pq, rq
        if Pq > _KMAXORDER:
            direct = True
        cost_t += (Pq + 1) * 3.0
    too_long = direct and not exact_only
    if not direct and float(count) * 4.0 <= cost_t:
        direct = True
    if direct and coarse and count > 64 and ci[k, _CI_FE] - ci[k, _CI_FB] > 1:
        return 2
    if direct:
        if too_long:
            st[_ST_LONG] += count
        ln = scr[_RLN : _RLN + 6]
        for c0 in range(start, end, _KCHUNK):
            c1 = min(end, c0 + _KCHUNK)
            _range_lanes(cen, _CU, weighted, fused, c0, c1, me, best, s, q0, q1, mc, Tb, scr, ln)
        _flush(ln, state)  # (the sums are state[_SA:_SA + 6] = state[:6])
        if fl[_GWANT + 5] != 0:  # the same sum over |u|: the scale of U
            tmp = scr[_RTMP, :6]
            tmp[:] = 0.0
            for c0 in range(start, end, _KCHUNK):
                c1 = min(end, c0 + _KCHUNK)
                _range_lanes(cen, _CUA, False, fused, c0, c1, me, best, s, q0, q1, mc, Tb, scr, ln)
            _flush(ln, tmp)
            state[_SU] += tmp[5]
        st[_ST_DIRECT] += count
        return 1
    st[_ST_CELLS] += 1
    Ps = (0, P1, P2, P3)
    rems = (0.0, rem1, rem2, rem3)
    # phi and d of the excluded centres (the query, the maximum), as the moments were built
    nex = 0
    t_0, t_1 = -1, -1
    ephi_0, ephi_1, dex_0, dex_1 = 0.0, 0.0, 0.0, 0.0
    for tt in range(2):
        t = me if tt == 0 else best
        if t < start or t >= end:
            continue
        ephi_t = _lk(cen[_CB, t], s, lq0r, lq1r, cen[_CP0, t], cen[_CP1, t], fused) - phim
        if nex == 0:
            t_0, ephi_0, dex_0 = t, ephi_t, cen[_CP1, t] - pr1
        else:
            t_1, ephi_1, dex_1 = t, ephi_t, cen[_CP1, t] - pr1
        nex += 1
    cnt = float(end - start)
    for a in range(6):
        if fl[_GWANT + a] == 0:
            continue
        q = _QOF[a]
        ma = _MOF[a]
        Pq = Ps[q]
        kq = q * kappa
        mbase = off + ma * _KNP
        acc = _series(mom, mbase, Pq, kq)
        for e in range(nex):  # the excluded centres' own series
            t = t_0 if e == 0 else t_1
            wgt = math.exp(q * (ephi_0 if e == 0 else ephi_1))
            if ma == _A0:
                wgt *= cen[_CP0, t]
            elif ma == _A1:
                wgt *= cen[_CP1, t]
            elif ma == _U2:
                wgt *= cen[_CU, t]
            if ma != _U2 and weighted:  # the moments' weight v^q
                vt = cen[_CV, t]
                wgt *= vt if q == 1 else (vt * vt if q == 2 else vt * vt * vt)
            y = kq * (dex_0 if e == 0 else dex_1)
            hs = _INV_F[Pq]
            for p in range(Pq - 1, -1, -1):
                hs = hs * y + _INV_F[p]
            acc -= wgt * hs
        m0 = cf[k, _CF_ABSU] if a == 5 else mom[mbase]
        bound = Fq[q] * m0 * exq[q]
        # truncation and rounding of the series against the bound of the cell's sum; the
        # systematic error is relative to each term: against the sum itself
        trunc = bound * (rems[q] + _EPS * (cnt + 2 * Pq + 8))
        val = Fq[q] * acc
        mass = bound if a == 5 else abs(val)
        state[_SE + a] += trunc + q * dsys * (mass + trunc)
        state[_SA + a] += val
        if a == 5:
            state[_SU] += bound
    st[_ST_TERMS] += P1 + 1
    return 1


@njit(**_JIT)
def _stop_level(fl, state):
    """1e-12 of the smallest running total (the walk's stop for far cells)."""
    rmin = np.inf
    pairs = fl[_GPAIRS] != 0
    for a in range(6):
        if fl[_GWANT + a] == 0:
            continue
        if a == 5:
            val = state[_SU]
        elif pairs and a < 2:
            val = state[_SA + a]
        else:
            val = state[_SB + a] + state[_SA + a]
        rmin = min(rmin, val)
    return 1e-12 * rmin


@njit(inline="always", **_JIT)
def _visit(k, k0, remaining, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr):
    """Visit the coarse cell k of the walk (its fine cells where its series is too long).

    Returns False where the walk stops in this direction.
    """
    stop = _stop_level(fl, state)
    first = k == k0
    res = _do_cell(
        k, True, first, stop, remaining, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr
    )
    if res == 0:
        return False
    if res == 2:
        for f in range(ci[k, _CI_FB], ci[k, _CI_FE]):
            _do_cell(
                f, False, False, 0.0, 0.0, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr
            )
    return True


@njit(**_JIT)
def _binned_sums(ci, cf, mom, ix, cen, cfg, fl, lo, hi, me, best, vb, qv, state, st, scr, out):
    """Compute the binned sums of one (query, class) (the C++ binned_sums) into out.

    out[0..5] = e1, e2, e3 without the maximum's term, A0, A1, U with it.  Returns False
    where an error bound exceeds kTolCheck of its value (the caller then uses the window
    method).
    """
    for j in range(_NSTATE):
        state[j] = 0.0
    state[_SU] = abs(cen[_CU, best])  # the scale of U: sum of w^2 |u|, bounded above
    state[_SB + 0] = vb
    state[_SB + 1] = vb * vb
    state[_SB + 2] = vb * vb * vb
    state[_SB + 3] = vb * cen[_CP0, best]
    state[_SB + 4] = vb * cen[_CP1, best]
    state[_SB + 5] = state[_SU]
    k0 = ix[_ICELL, best]
    _visit(k0, k0, 0.0, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr)
    k = k0 - 1  # the class's cells are contiguous: outward while in [lo, hi)
    while k >= 0 and ci[k, _CI_START] >= lo:
        rem = float(ci[k, _CI_END] - lo)
        if not _visit(k, k0, rem, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr):
            break
        k -= 1
    k = k0 + 1
    while k < fl[_GNC] and ci[k, _CI_END] <= hi:
        rem = float(hi - ci[k, _CI_START])
        if not _visit(k, k0, rem, ci, cf, mom, cen, cfg, fl, me, best, qv, state, st, scr):
            break
        k += 1
    # truncation: the cells left out (concavity: every term below its cell's bound), and
    # the terms below e^-T that the exact sums skip
    tr = cfg[_FN] * math.exp(-cfg[_FTB]) * cfg[_FVMAX]
    d0 = state[_SD]
    d1 = state[_SD + 1]
    state[_SE + 0] += d0 + tr
    state[_SE + 1] += d1 + tr * tr
    state[_SE + 2] += state[_SD + 2] + tr * tr * tr
    state[_SE + 3] += d0 + tr
    state[_SE + 4] += d0 + tr
    state[_SE + 5] += (d1 + tr * tr) * cfg[_FUMAX]
    # the check: e1 relative to itself when D is wanted (D >= e1), else to S = vb + e1
    pairs = fl[_GPAIRS] != 0
    f1 = cfg[_FFLOOR]
    for a in range(6):
        if fl[_GWANT + a] == 0:
            continue
        if a == 5:
            ref = _floored(state[_SU], f1 * f1 * cfg[_FUMAX])
        elif pairs and a < 2:
            ref = state[_SA + a]
        else:
            # the floor's power: S, A 1; Q 2; T 3 (as the C++ forms them)
            fq = f1 * f1 if a == 1 else (f1 * f1) * f1 if a == 2 else f1
            ref = _floored(state[_SB + a] + state[_SA + a], fq)
        if not (state[_SE + a] <= _KTOLCHECK * ref):
            return False
    out[0] = state[_SA + 0]
    out[1] = state[_SA + 1]
    out[2] = state[_SA + 2]
    out[3] = state[_SB + 3] + state[_SA + 3]
    out[4] = state[_SB + 4] + state[_SA + 4]
    out[5] = cen[_CU, best] + state[_SA + 5]
    return True


# ---------------------------------------------------------------------------
# The local method (section 4): one series per group of queries.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _per_query(ci, cf, mom, ix, cen, cfg, fl, lo, hi, me, best, vb, qv, state, st, scr, acc):
    """One (query, class) by the binned method, else the window method (the C++ per_query)."""
    binned = fl[_GBINNED] != 0
    ok = False
    if binned:
        ok = _binned_sums(
            ci, cf, mom, ix, cen, cfg, fl, lo, hi, me, best, vb, qv, state, st, scr, acc
        )
    if not ok:
        cnt = _window_sums(cen, cfg, fl, lo, hi, me, best, vb, qv[0], qv[1], qv[2], scr, acc)
        if binned:
            st[_ST_FALLBACKS] += 1
            st[_ST_PFALL] += cnt
        else:
            st[_ST_DIRECT] += cnt


@njit(**_JIT)
def _make_groups(z, s):
    """Group starts over all n sorted positions (the C++ make_groups), n appended."""
    n = z.shape[0]
    wz = _KGROUPWIDTH * math.sqrt(1.0 / s) * 0.5
    gs = np.empty(n + 1, np.int64)
    ng = 0
    sp = 0
    while sp < n:
        gs[ng] = sp
        ng += 1
        g0 = sp
        sp += 1
        while sp < n and sp - g0 < _KGROUPMAX and abs(z[sp] - z[g0]) <= wz:
            sp += 1
    gs[ng] = n
    return gs[: ng + 1].copy()


@njit(**_JIT)
def _local_direct(a, b, cen, s, fused, need, qmax, tmax, le, lam, lerr, lmag, yk):
    """Add the exact terms of the sorted positions [a, b) to the expansion (the C++ direct).

    Returns True where a term lies more than 600 nats above the group's maximum (bad).
    """
    q0 = le[_LQ0]
    q1 = le[_LQ1]
    M = le[_LM]
    xbar = le[_LXBAR]
    rem_t_unit = _INV_F[_KPT] / (_KPT + 1)  # 1 / (kPt + 1)!
    for i in range(a, b):
        p0 = cen[_CP0, i]
        p1 = cen[_CP1, i]
        Li = _lk(cen[_CB, i], s, q0, q1, p0, p1, fused)
        lw = Li - M
        y = p1 - xbar
        le[_LDELTA] = max(
            le[_LDELTA], 4.0 * _EPS * (abs(Li) + 2.0 * abs(M) + s * (abs(q0) * p0 + abs(q1) * p1))
        )
        le[_LESUM] = max(le[_LESUM], 2.0 * abs((p0 + p1) - 1.0) + 4 * _EPS)
        if lw > 600.0:
            return True
        if lw < -700.0:
            continue  # below e^-700 of the maximum: counted in the drop
        w1 = math.exp(lw)
        w2 = w1 * w1
        w3 = w1 * w1 * w1
        vi = cen[_CV, i]  # 1 without centre weights
        ui = cen[_CU, i]
        # per power: e^eta and the remainder factor eta^(kPt+1) / (kPt+1)!
        ee1, ee2, ee3 = 0.0, 0.0, 0.0
        tr1, tr2, tr3 = 0.0, 0.0, 0.0
        for q in range(1, qmax + 1):
            eta = q * tmax * abs(y)
            ee = math.exp(eta)
            tr = rem_t_unit
            for _ in range(_KPT + 1):
                tr *= eta
            if q == 1:
                ee1, tr1 = ee, tr
            elif q == 2:
                ee2, tr2 = ee, tr
            else:
                ee3, tr3 = ee, tr
        yk[0] = 1.0
        for k in range(1, _KPT + 1):
            yk[k] = yk[k - 1] * y * _INV_V[k - 1]
        for ar in range(_NMOM):
            if not need[ar]:
                continue
            q = _QARR[ar]
            if q == 1:
                wq, eeq, trq = w1, ee1, tr1
            elif q == 2:
                wq, eeq, trq = w2, ee2, tr2
            else:
                wq, eeq, trq = w3, ee3, tr3
            if ar == _M1:
                gv = vi
            elif ar == _A0:
                gv = vi * p0
            elif ar == _A1:
                gv = vi * p1
            elif ar == _M2:
                gv = vi * vi
            elif ar == _U2:
                gv = ui
            else:
                gv = vi * vi * vi
            w = wq * gv
            for k in range(_KPT + 1):
                lam[ar, k] += w * yk[k]
            wa = wq * abs(ui) if ar == _U2 else w
            lerr[ar] += wa * eeq * (trq + _EPS * (_KPT + 8))
            lmag[ar] += wa * eeq
    return False


@njit(**_JIT)
def _use_cell(
    k,
    coarse,
    first,
    remaining,
    ci,
    cf,
    mom,
    cen,
    cfg,
    fused,
    need,
    qmax,
    tmax,
    dmax_q,
    le,
    lam,
    lerr,
    lmag,
    drop,
    work,
):
    """Use the cell k for the group's expansion (the C++ use_cell).

    Returns 0: stop this direction (the cell's bound added to drop), 1: used, 2: a coarse
    cell whose series would be too long, to be taken as its fine cells.  le[_LBAD] is set
    where a term lies too far above the maximum.  work: scratch (5, 26).
    """
    s = cfg[_FS]
    q0 = le[_LQ0]
    q1 = le[_LQ1]
    M = le[_LM]
    xbar = le[_LXBAR]
    rs = ci[k, _CI_REF]
    dmax = cf[k, _CF_DMAX]
    Lrq = _lk(cen[_CB, rs], s, q0, q1, cen[_CP0, rs], cen[_CP1, rs], fused)
    E = (Lrq - cf[k, _CF_LRR]) + cf[k, _CF_PHI] - M
    dq0 = q0 - cen[_CLQ0, rs]
    dq1 = q1 - cen[_CLQ1, rs]
    kappa = s * (dq1 - dq0)
    xi1 = abs(kappa) * dmax
    dC = cen[_CP1, rs] - xbar
    rho = abs(dC) + dmax
    eta1 = tmax * rho
    top = E + xi1 + eta1  # every term of the cell, every query: <= e^{top + D_j}
    if not first and (
        top + dmax_q < -cfg[_FTB] or top + dmax_q + math.log(max(remaining, 1.0)) < -36.0
    ):
        for q in range(1, 4):
            drop[q] += remaining * math.exp(q * top)
        return 0
    if E > 600.0:
        le[_LBAD] = 1.0
        return 1
    start = ci[k, _CI_START]
    end = ci[k, _CI_END]
    count = end - start
    off = ci[k, _CI_OFF]
    if off < 0:
        if _local_direct(
            start, end, cen, s, fused, need, qmax, tmax, le, lam, lerr, lmag, work[4]
        ):
            le[_LBAD] = 1.0
        return 1
    # kappa orders per power (the target as binned_sums': relative to the cell and, for
    # far cells, to the smallest total a query of the group can have)
    P1, P2, P3 = 0, 0, 0
    too_long = False
    cost_t = 0.0
    for q in range(1, qmax + 1):
        xi = q * xi1
        m0 = 0.0  # the largest cell mass of this power's arrays
        for ar in range(_NMOM):
            if need[ar] and _QARR[ar] == q:
                m0 = max(m0, cf[k, _CF_ABSU] if ar == _U2 else mom[off + ar * _KNP])
        ub = math.exp(q * E + xi + q * eta1) * max(m0, 1e-300)
        rmin = math.exp(-q * dmax_q)
        tgt = _KTOLCELL * (math.exp(-2.0 * xi) + rmin / (10.0 * ub))
        Pq = _order_for(xi, tgt)[0]
        if q == 1:
            P1 = Pq
        elif q == 2:
            P2 = Pq
        else:
            P3 = Pq
        if Pq > _KMAXORDER:
            too_long = True
        cost_t += (_KPT + 1.0) * (min(Pq, _KMAXORDER - _KPT // 2) + 1.0) + 0.5 * (_KPT + 1.0) * (
            _KPT + 2.0
        )
    cost_d = float(count) * (_KPT + 12.0) * qmax
    if too_long and coarse and count > 64 and ci[k, _CI_FE] - ci[k, _CI_FB] > 1:
        return 2
    if too_long or cost_d <= cost_t:
        if _local_direct(
            start, end, cen, s, fused, need, qmax, tmax, le, lam, lerr, lmag, work[4]
        ):
            le[_LBAD] = 1.0
        return 1
    le[_LESUM] = max(le[_LESUM], cf[k, _CF_ESUM])
    pr0 = cen[_CP0, rs]
    pr1 = cen[_CP1, rs]
    mag = (
        abs(Lrq)
        + abs(cf[k, _CF_LRR])
        + 2.0 * abs(cf[k, _CF_PHI])
        + 2.0 * abs(M)
        + s
        * (abs(q0) * pr0 + abs(q1) * pr1 + abs(cen[_CLQ0, rs]) * pr0 + abs(cen[_CLQ1, rs]) * pr1)
        + s * (abs(dq0) + abs(dq1)) * dmax
    )
    le[_LDELTA] = max(le[_LDELTA], 4.0 * _EPS * mag + s * abs(dq0) * cf[k, _CF_ESUM])
    dpow = work[0]  # (Delta_C)^j / j!
    kp = work[1]
    N = work[2]
    rx = work[3]
    dpow[0] = 1.0
    for j in range(1, _KPT + 1):
        dpow[j] = dpow[j - 1] * dC * _INV_V[j - 1]
    cnt = float(count)
    rem_t_unit = _INV_F[_KPT] / (_KPT + 1)
    for ar in range(_NMOM):
        if not need[ar]:
            continue
        q = _QARR[ar]
        if q == 1:
            Pk = P1
        elif q == 2:
            Pk = P2
        else:
            Pk = P3
        kq = q * kappa
        mb = off + ar * _KNP
        kp[0] = 1.0
        for p in range(1, Pk + 1):
            kp[p] = kp[p - 1] * kq
        # N_l / l! = sum_p (q kappa)^p C(p + l, p) m_{p + l}, p <= P_l = min(P, 24 - l)
        xi = q * xi1
        etad = q * tmax * dmax
        for l in range(_KPT + 1):
            N[l] = 0.0
        for p in range(Pk + 1):  # p <= P_l  <=>  l <= 24 - p
            lmax = min(_KPT, _KMAXORDER - p)
            kpp = kp[p]
            for l in range(lmax + 1):
                N[l] += kpp * _BINOM_T[p, l] * mom[mb + p + l]
        rx[0] = 1.0  # xi^j / j!, j <= P + 1 (the remainders' orders)
        for j in range(1, Pk + 2):
            rx[j] = rx[j - 1] * xi * _INV_V[j - 1]
        trunc_k = 0.0
        etal = 1.0
        for l in range(_KPT + 1):
            trunc_k += rx[min(Pk, _KMAXORDER - l) + 1] * etal
            etal *= etad * _INV_V[l]
        fac = math.exp(q * E)
        for kk in range(_KPT + 1):
            acc = 0.0
            for l in range(kk + 1):
                acc += dpow[kk - l] * N[l]
            lam[ar, kk] += fac * acc
        m0 = cf[k, _CF_ABSU] if ar == _U2 else mom[mb]
        eta = q * eta1
        trunc_t = rem_t_unit
        for _ in range(_KPT + 1):
            trunc_t *= eta
        b1 = fac * m0 * math.exp(xi)
        b0 = b1 * math.exp(eta)
        lerr[ar] += b1 * math.exp(q * tmax * abs(dC)) * trunc_k + b0 * (
            trunc_t + _EPS * (cnt + 2 * Pk + 2 * _KPT + 16)
        )
        lmag[ar] += b0
    return 1


@njit(**_JIT)
def _lvisit(
    k,
    k0,
    remaining,
    ci,
    cf,
    mom,
    cen,
    cfg,
    fused,
    need,
    qmax,
    tmax,
    dmax_q,
    le,
    lam,
    lerr,
    lmag,
    drop,
    work,
):
    """Visit the coarse cell k of the group's walk (its fine cells where too long)."""
    res = _use_cell(
        k,
        True,
        k == k0,
        remaining,
        ci,
        cf,
        mom,
        cen,
        cfg,
        fused,
        need,
        qmax,
        tmax,
        dmax_q,
        le,
        lam,
        lerr,
        lmag,
        drop,
        work,
    )
    if res == 0:
        return False
    if res == 2:
        for f in range(ci[k, _CI_FB], ci[k, _CI_FE]):
            _use_cell(
                f,
                False,
                True,
                0.0,
                ci,
                cf,
                mom,
                cen,
                cfg,
                fused,
                need,
                qmax,
                tmax,
                dmax_q,
                le,
                lam,
                lerr,
                lmag,
                drop,
                work,
            )
    return True


@njit(**_JIT)
def _build_local(
    ci,
    cf,
    mom,
    ix,
    cen,
    cfg,
    fl,
    need,
    lo,
    hi,
    Q,
    bestQ,
    mQ,
    tmax,
    dmax_q,
    le,
    lam,
    lerr,
    lmag,
    drop,
    work,
):
    """Build the local expansion of the class [lo, hi) for the group of reference Q.

    The C++ build_local, into le (scalars), lam (6, kPt + 1), lerr, lmag (6,).

    Returns (ok, kl, kr): whether it may serve, and the walk's stopping cells (every cell
    used lies strictly between them).
    """
    le[_LM] = mQ
    le[_LXBAR] = cen[_CP1, Q]
    le[_LQ0] = cen[_CLQ0, Q]
    le[_LQ1] = cen[_CLQ1, Q]
    le[_LDELTA] = 0.0
    le[_LESUM] = 4 * _EPS
    le[_LBAD] = 0.0
    lam[:, :] = 0.0
    lerr[:] = 0.0
    lmag[:] = 0.0
    drop[:] = 0.0
    qmax = fl[_GQMAX]
    nc = fl[_GNC]
    fused = fl[_GFUSED] != 0
    k0 = ix[_ICELL, bestQ]
    _lvisit(
        k0,
        k0,
        0.0,
        ci,
        cf,
        mom,
        cen,
        cfg,
        fused,
        need,
        qmax,
        tmax,
        dmax_q,
        le,
        lam,
        lerr,
        lmag,
        drop,
        work,
    )
    kl = -1
    kr = nc
    k = k0 - 1
    while k >= 0 and ci[k, _CI_START] >= lo:
        rem = float(ci[k, _CI_END] - lo)
        if not _lvisit(
            k,
            k0,
            rem,
            ci,
            cf,
            mom,
            cen,
            cfg,
            fused,
            need,
            qmax,
            tmax,
            dmax_q,
            le,
            lam,
            lerr,
            lmag,
            drop,
            work,
        ):
            kl = k
            break
        k -= 1
    k = k0 + 1
    while k < nc and ci[k, _CI_END] <= hi:
        rem = float(hi - ci[k, _CI_START])
        if not _lvisit(
            k,
            k0,
            rem,
            ci,
            cf,
            mom,
            cen,
            cfg,
            fused,
            need,
            qmax,
            tmax,
            dmax_q,
            le,
            lam,
            lerr,
            lmag,
            drop,
            work,
        ):
            kr = k
            break
        k += 1
    if le[_LBAD] != 0.0:
        return False, kl, kr
    # the cells left out, and the terms below e^-700 of M that direct sums skipped
    tiny = cfg[_FN] * math.exp(-700.0)
    vm = cfg[_FVMAX]
    for ar in range(_NMOM):
        q = _QARR[ar]
        if ar == _M2:
            gm = vm * vm
        elif ar == _U2:
            gm = cfg[_FUMAX]
        elif ar == _M3:
            gm = vm * vm * vm
        else:
            gm = vm
        lerr[ar] += (drop[q] + tiny) * gm
    return True, kl, kr


@njit(**_JIT)
def _local_eval(ix, cen, cfg, fl, le, lam, lerr, lmag, kl, kr, me, self_in, best, mc, vb, ev, acc):
    """Evaluate the group's expansion for one (query, class) into acc (the C++ local_eval).

    acc as _binned_sums' out.  Returns False where a bound fails the check (the caller
    then uses the binned method, then the window method).
    """
    s = cfg[_FS]
    fused = fl[_GFUSED] != 0
    kb = ix[_ICELL, best]
    if not (kb > kl and kb < kr):
        return False
    if self_in:
        ks = ix[_ICELL, me]
        if not (ks > kl and ks < kr):
            return False
    powers = fl[_GPOW]
    pairs = fl[_GPAIRS] != 0
    want_a = fl[_GA] != 0
    want_u = fl[_GU] != 0
    q0 = cen[_CLQ0, me]
    q1 = cen[_CLQ1, me]
    sd0 = s * (q0 - le[_LQ0])
    t = s * ((q1 - le[_LQ1]) - (q0 - le[_LQ0]))
    D = ((le[_LM] - mc) + sd0) + t * le[_LXBAR]
    if not (D < 600.0):
        return False
    # systematic log error: the cells' part, D's own rounding, the dense engine's error
    # in L_ij, and the neglected s (q0_j - q0_Q)(p0 + p1 - 1)
    delta = (
        le[_LDELTA]
        + 4.0 * _EPS * (abs(le[_LM]) + abs(sd0) + abs(t) + 2.0 * abs(mc) + s * (abs(q0) + abs(q1)))
        + abs(sd0) * le[_LESUM]
    )
    F1 = math.exp(D)
    # the query's own term (excluded) and the class maximum's (exactly 1, added apart)
    wself = 0.0
    if self_in:
        wself = math.exp(_lk(cen[_CB, me], s, q0, q1, cen[_CP0, me], cen[_CP1, me], fused) - mc)
    val = ev[0]
    err = ev[1]
    magv = ev[2]
    val[:] = 0.0
    err[:] = 0.0
    magv[:] = 0.0
    for ar in range(_NMOM):
        if not (
            ar == _M1
            or (want_a and (ar == _A0 or ar == _A1))
            or (ar == _M2 and powers >= 2)
            or (ar == _U2 and want_u)
            or (ar == _M3 and powers >= 3)
        ):
            continue
        q = _QARR[ar]
        Fq = F1 if q == 1 else (F1 * F1 if q == 2 else F1 * F1 * F1)
        y = q * t
        a = lam[ar, _KPT]
        for k in range(_KPT - 1, -1, -1):
            a = a * y + lam[ar, k]
        val[ar] = Fq * a
        magv[ar] = Fq * lmag[ar]
        err[ar] = Fq * (lerr[ar] + (q * delta + _EPS * (_KPT + 4)) * (lmag[ar] + lerr[ar]))
    # the excluded terms with their centre weights (the query's own: v_self w_self), the
    # maximum's v_best^q
    wsv = wself * cen[_CV, me]
    ws1 = wsv
    ws2 = wsv * wsv
    ws3 = wsv * wsv * wsv
    vq1 = vb
    vq2 = vb * vb
    vq3 = vb * vb * vb
    # subtract the excluded terms (their exact values)
    e1 = val[_M1] - vq1 - ws1
    e2 = val[_M2] - vq2 - ws2 if powers >= 2 else 0.0
    e3 = val[_M3] - vq3 - ws3 if powers >= 3 else 0.0
    # rounding of the subtractions (and of the excluded terms' own values)
    err[_M1] += 8.0 * _EPS * (abs(val[_M1]) + abs(vq1 + ws1))
    if powers >= 2:
        err[_M2] += 8.0 * _EPS * (abs(val[_M2]) + abs(vq2 + ws2))
    if powers >= 3:
        err[_M3] += 8.0 * _EPS * (abs(val[_M3]) + abs(vq3 + ws3))
    f1 = cfg[_FFLOOR]
    f2 = f1 * f1
    ref1 = e1 if pairs else _floored(vq1 + e1, f1)
    if not (e1 >= 0.0) or not (err[_M1] <= _KTOLCHECK * ref1):
        return False
    if powers >= 2:
        ref2 = e2 if pairs else _floored(vq2 + e2, f2)
        if not (e2 >= 0.0) or not (err[_M2] <= _KTOLCHECK * ref2):
            return False
    if powers >= 3 and (
        not (e3 >= 0.0) or not (err[_M3] <= _KTOLCHECK * _floored(vq3 + e3, f2 * f1))
    ):
        return False
    a0 = 0.0
    a1 = 0.0
    uu = 0.0
    if want_a:
        s0 = ws1 * cen[_CP0, me] if self_in else 0.0
        s1 = ws1 * cen[_CP1, me] if self_in else 0.0
        a0 = val[_A0] - s0
        a1 = val[_A1] - s1
        if not (
            err[_A0] + 8.0 * _EPS * (abs(val[_A0]) + abs(s0)) <= _KTOLCHECK * _floored(a0, f1)
        ) or not (
            err[_A1] + 8.0 * _EPS * (abs(val[_A1]) + abs(s1)) <= _KTOLCHECK * _floored(a1, f1)
        ):
            return False
    if want_u:
        su = (wself * wself) * cen[_CU, me] if self_in else 0.0
        uu = val[_U2] - su
        uref = _floored(abs(cen[_CU, best]) + magv[_U2], f2 * cfg[_FUMAX])
        if not (err[_U2] + 8.0 * _EPS * (abs(magv[_U2]) + abs(su)) <= _KTOLCHECK * uref):
            return False
    acc[0] = e1
    acc[1] = e2
    acc[2] = e3
    acc[3] = a0
    acc[4] = a1
    acc[5] = uu
    return True


@njit(parallel=True, **_JIT)
def _local_kernel(
    tasks,
    k0,
    k1,
    gstart,
    in_range,
    ix,
    seg,
    cen,
    g,
    ci,
    cf,
    mom,
    cfg,
    fl,
    need,
    row_start,
    n_tasks,
    outs,
    stats,
):
    """Compute the groups tasks[k0:k1] of one (problem, bandwidth) into outs (local method).

    The groups go round-robin to n_tasks tasks; per group and class the expansion is
    built once (groups of kGroupMin points or more), then each query row of the group is
    evaluated by it, else by the binned method, else by the window method.  Each group is
    computed by one task in a fixed order: its bits depend neither on the threads nor on
    the rows asked for (the groups and their tmax span all n sorted positions).
    """
    C = seg.shape[0] - 1
    ng = k1 - k0
    nt = max(1, min(n_tasks, ng))
    s = cfg[_FS]
    fused = fl[_GFUSED] != 0
    weighted = fl[_GW] != 0
    perm = ix[_IPERM]
    for task in prange(nt):
        scr = np.zeros((_NSCR, _KCHUNK))
        acc = np.empty(6)
        state = np.empty(_NSTATE)
        qv = np.empty(3)
        le = np.zeros(_NLE)
        lam = np.zeros((_NMOM, _KPT + 1))
        lerr = np.zeros(_NMOM)
        lmag = np.zeros(_NMOM)
        drop = np.zeros(4)
        work = np.zeros((5, _KNP + 1))
        ev = np.zeros((3, _NMOM))
        mcs = np.empty((_KGROUPMAX, C))
        vbs = np.empty((_KGROUPMAX, C))
        sums = np.zeros((_KGROUPMAX, C, 6))
        st = stats[task]
        for gi in range(task, ng, nt):
            grp = tasks[k0 + gi]
            g0 = gstart[grp]
            g1 = gstart[grp + 1]
            Q = g0 + (g1 - g0) // 2
            # |t_j| over the whole group (row-range independent)
            tmax = 0.0
            for sp in range(g0, g1):
                tmax = max(
                    tmax,
                    abs(s * ((cen[_CLQ1, sp] - cen[_CLQ1, Q]) - (cen[_CLQ0, sp] - cen[_CLQ0, Q]))),
                )
            for c in range(C):
                lo = seg[c]
                hi = seg[c + 1]
                ok_le = False
                kl = -1
                kr = -1
                # (a group of a few points, where the kernel is narrow against the points'
                # spacing, costs more to expand than to sum per query)
                if g1 - g0 >= _KGROUPMIN:
                    bQ, mQ = _class_argmax(
                        cen, g, ix, s, lo, hi, Q, cen[_CLQ0, Q], cen[_CLQ1, Q], fused
                    )
                    if bQ >= 0 and math.isfinite(mQ) and math.isfinite(tmax):
                        # D_j <= t_j (xbar - x_bQ): L at bQ bounds m_j from below
                        dq = tmax * abs(cen[_CP1, Q] - cen[_CP1, bQ]) + 1.0
                        ok_le, kl, kr = _build_local(
                            ci,
                            cf,
                            mom,
                            ix,
                            cen,
                            cfg,
                            fl,
                            need,
                            lo,
                            hi,
                            Q,
                            bQ,
                            mQ,
                            tmax,
                            dq,
                            le,
                            lam,
                            lerr,
                            lmag,
                            drop,
                            work,
                        )
                        st[_ST_GROUPS] += 1
                for me in range(g0, g1):
                    if not in_range[me]:
                        continue
                    kq = me - g0
                    for j in range(6):
                        sums[kq, c, j] = 0.0
                    vbs[kq, c] = 1.0
                    q0 = cen[_CLQ0, me]
                    q1 = cen[_CLQ1, me]
                    best, mc = _class_argmax(cen, g, ix, s, lo, hi, me, q0, q1, fused)
                    mcs[kq, c] = mc
                    if best < 0:
                        mcs[kq, c] = -np.inf
                        continue
                    vb = cen[_CV, best] if weighted else 1.0
                    vbs[kq, c] = vb
                    self_in = lo <= me < hi
                    if ok_le and _local_eval(
                        ix,
                        cen,
                        cfg,
                        fl,
                        le,
                        lam,
                        lerr,
                        lmag,
                        kl,
                        kr,
                        me,
                        self_in,
                        best,
                        mc,
                        vb,
                        ev,
                        acc,
                    ):
                        st[_ST_ROWS] += 1
                    else:
                        qv[0] = q0
                        qv[1] = q1
                        qv[2] = mc
                        _per_query(
                            ci,
                            cf,
                            mom,
                            ix,
                            cen,
                            cfg,
                            fl,
                            lo,
                            hi,
                            me,
                            best,
                            vb,
                            qv,
                            state,
                            st,
                            scr,
                            acc,
                        )
                    for j in range(6):
                        sums[kq, c, j] = acc[j]
            for me in range(g0, g1):
                if in_range[me]:
                    kq = me - g0
                    _emit(perm[me] - row_start, mcs[kq], vbs[kq], sums[kq], fl, outs)


# ---------------------------------------------------------------------------
# The parallel kernel: one chunk of query rows of one (problem, bandwidth).
# ---------------------------------------------------------------------------
@njit(parallel=True, **_JIT)
def _kernel(
    qorder, k0, k1, ix, seg, cen, g, ci, cf, mom, cfg, fl, row_start, n_tasks, outs, stats
):
    """Rows qorder[k0:k1] (sorted positions) of one (problem, bandwidth) into outs.

    Blocks of _QBLOCK consecutive sorted queries go round-robin to n_tasks tasks (the
    windows' lengths vary along the sorted scores: the blocks spread them over the
    threads); each (query, class) is computed by one task, in a fixed order, so that its
    bits depend neither on the threads nor on the rows asked for.  stats (n_tasks, _NST)
    receives each task's counters.
    """
    C = seg.shape[0] - 1
    nblocks = (k1 - k0 + _QBLOCK - 1) // _QBLOCK
    nt = max(1, min(n_tasks, nblocks))
    s = cfg[_FS]
    fused = fl[_GFUSED] != 0
    binned = fl[_GBINNED] != 0
    weighted = fl[_GW] != 0
    perm = ix[_IPERM]
    for task in prange(nt):
        scr = np.zeros((_NSCR, _KCHUNK))
        acc = np.empty(6)
        state = np.empty(_NSTATE)
        qv = np.empty(3)
        mcs = np.empty(C)
        vbs = np.empty(C)
        sums = np.zeros((C, 6))
        st = stats[task]
        for blk in range(task, nblocks, nt):
            b0 = k0 + blk * _QBLOCK
            for kq in range(b0, min(k1, b0 + _QBLOCK)):
                me = qorder[kq]
                q0 = cen[_CLQ0, me]
                q1 = cen[_CLQ1, me]
                for c in range(C):
                    lo = seg[c]
                    hi = seg[c + 1]
                    sums[c, :] = 0.0
                    vbs[c] = 1.0
                    best, mc = _class_argmax(cen, g, ix, s, lo, hi, me, q0, q1, fused)
                    mcs[c] = mc
                    if best < 0:
                        mcs[c] = -np.inf
                        continue
                    vb = cen[_CV, best] if weighted else 1.0
                    vbs[c] = vb
                    ok = False
                    if binned:
                        qv[0] = q0
                        qv[1] = q1
                        qv[2] = mc
                        ok = _binned_sums(
                            ci,
                            cf,
                            mom,
                            ix,
                            cen,
                            cfg,
                            fl,
                            lo,
                            hi,
                            me,
                            best,
                            vb,
                            qv,
                            state,
                            st,
                            scr,
                            acc,
                        )
                    if not ok:
                        cnt = _window_sums(
                            cen, cfg, fl, lo, hi, me, best, vb, q0, q1, mc, scr, acc
                        )
                        if binned:
                            st[_ST_FALLBACKS] += 1
                            st[_ST_PFALL] += cnt
                        else:
                            st[_ST_DIRECT] += cnt
                    for j in range(6):
                        sums[c, j] = acc[j]
                _emit(perm[me] - row_start, mcs, vbs, sums, fl, outs)


# ---------------------------------------------------------------------------
# The sorted problem and the cells of a bandwidth.
# ---------------------------------------------------------------------------
def _sort_problem(
    p: np.ndarray, logq: np.ndarray, labels: np.ndarray, C: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sort one problem by label, then x = p1 up, then p0 down, then row (the C++ order).

    Returns ``cen`` (8, n) (the bias row left to fill per bandwidth, u, |u| zero and v one),
    ``ix`` (4, n) (the permutation, the runs of identical points of the same label, and
    a row for the coarse cells),
    ``seg`` (C + 1,) (the classes' sorted positions) and ``z = arcsin sqrt(x)`` (from the
    nearer end).
    """
    n = p.shape[0]
    perm = np.lexsort((np.arange(n), -p[:, 0], p[:, 1], labels)).astype(np.int64)
    lab = labels[perm]
    cen = np.zeros((8, n))
    cen[_CP0] = p[perm, 0]
    cen[_CP1] = p[perm, 1]
    cen[_CLQ0] = logq[perm, 0]
    cen[_CLQ1] = logq[perm, 1]
    cen[_CV] = 1.0
    p0, p1 = cen[_CP0], cen[_CP1]
    seg = np.zeros(C + 1, dtype=np.int64)
    np.cumsum(np.bincount(labels, minlength=C)[:C], out=seg[1:])
    same = np.zeros(n, dtype=bool)
    same[1:] = (lab[1:] == lab[:-1]) & (p0[1:] == p0[:-1]) & (p1[1:] == p1[:-1])
    starts = np.flatnonzero(~same)
    run = np.cumsum(~same) - 1
    ix = np.stack([perm, starts[run], np.append(starts[1:], n)[run], np.zeros(n, np.int64)])
    z = np.where(p1 < 0.5, np.arcsin(np.sqrt(p1)), math.acos(0.0) - np.arcsin(np.sqrt(p0)))
    return cen, np.ascontiguousarray(ix), seg, np.ascontiguousarray(z)


def _cells(
    cen: np.ndarray,
    ix: np.ndarray,
    seg: np.ndarray,
    z: np.ndarray,
    s: float,
    cell_width: float,
    weighted: bool,
    fused: bool,
    need: np.ndarray,
    fine_moments: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Build the coarse and fine cells of one bandwidth and their moments (build_cells).

    Returns (ci, cf, mom, nc): the cells' integer and float columns, the coarse cells
    first (nc of them, their fine cells' indices [fb, fe) into the same arrays), then the
    fine ones, and their moments; ix[_ICELL] receives the coarse cell of every sorted
    position.  Moments only for cells of two or more centres (a single centre is summed
    directly): memory O(n) even when every centre has its own cell; without ``fine_moments``
    (the local method without pair or residual sums, as the C++), none for the fine
    cells, which are then summed directly.
    """
    wf = cell_width * math.sqrt(1.0 / s) * 0.5 / _KSUB  # the fine cells' width in z
    coarse, fine, ix[_ICELL] = _cell_bounds(z, seg, wf)
    nc = coarse.shape[0]
    coarse[:, _CI_FB] += nc
    coarse[:, _CI_FE] += nc
    ci = np.ascontiguousarray(np.concatenate([coarse, fine]))
    multi = (ci[:, _CI_END] - ci[:, _CI_START]) > 1
    if not fine_moments:
        multi[nc:] = False
    k = int(multi.sum())
    ci[multi, _CI_OFF] = np.arange(k, dtype=np.int64) * (_NMOM * _KNP)
    mom = np.zeros(k * _NMOM * _KNP)
    cf = np.zeros((ci.shape[0], _NCF))
    _cell_moments(ci, cf, mom, cen, s, weighted, fused, need)
    return ci, cf, mom, nc


# ---------------------------------------------------------------------------
# Checks (those of the binding and of kdecal::binary_reduce).
# ---------------------------------------------------------------------------
def _carray(x: Any, name: str, dtype: type) -> np.ndarray:
    """Return x itself if it is a C-contiguous array of dtype, else raise TypeError.

    No hidden copies, as the binding's noconvert().
    """
    if not (isinstance(x, np.ndarray) and x.dtype == np.dtype(dtype) and x.flags.c_contiguous):
        raise TypeError(
            f"kdecal.binary_reduce: {name} must be a C-contiguous {np.dtype(dtype).name} "
            f"array, got {type(x).__name__} {getattr(x, 'dtype', '')}"
        )
    return x


def _fail(what: str) -> None:
    raise ValueError("kdecal.binary_reduce: " + what)


def binary_reduce(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: np.ndarray,
    bias: np.ndarray,
    powers: int = 1,
    row_start: int = 0,
    row_stop: int = 0,
    n_threads: int = 0,
    progress: Callable[[int], object] | None = None,
    pairs: bool = False,
    method: str = "binned",
    residuals: bool = False,
    u: Any = None,
    cell_width: float = 0.8,
    plan: Any = None,
    v: Any = None,
    ref_floor: float = 0.0,
    weighted_rows: bool = False,
) -> tuple[Any, ...]:
    """Fast leave-one-out sums of binary (K = 2) problems: the twin of ``core.binary_reduce``.

    Parameters
    ----------
    logq, p : ndarray, shape (n, 2) or (B, n, 2), float64, C-contiguous
        The dense engine's inputs (``p`` in [0, 1], ``logq`` finite and <= 0).
    labels : ndarray, shape (n,) or (B, n), int64, C-contiguous
        Labels in ``[0, n_classes)``.
    n_classes : int
        Number of label groups C >= 1.
    scale : ndarray, shape (H,), float64
        ``1 / h`` (finite, > 0).
    bias : ndarray, shape (H, n) or (B, H, n), float64
        The kernel's bias (the cell methods' callers may shift it by a constant).
    powers : {1, 2, 3}
    row_start, row_stop : int
        Query rows ``[row_start, row_stop)`` (against all n centres).
    n_threads : int
        numba threads (0: numba's current count).
    progress : callable or None
        Called from the calling thread with the number of (row, problem, bandwidth)
        units done so far (strictly increasing, the last ``B H R``).
    pairs : bool
        Also return the pair sums D (needs ``powers >= 2``).
    method : {"window", "binned", "local"}
    residuals : bool
        Also return ``A`` (and ``U`` with ``u``).
    u : array_like, shape (n,) or (B, n), or None
        Residual weights of U (finite).
    cell_width : float
        The binned method's coarse cell width in units of ``sqrt(h)/2`` (in (0, 4]).
    plan : ignored
        (A ``core.BinaryPlan`` serves the compiled core only; results never depend on it.)
    v : array_like, shape (n,) or (B, n), or None
        Centre weights (finite, >= 0; ``powers <= 2``, no pairs).
    ref_floor : float, default 0
        With ``v``: each weighted sum of power q accurate relative to at least
        ``ref_floor^q`` (units of the class maximum's unweighted term), not only to
        itself (the compiled core's ``ref_floor``).
    weighted_rows : bool, default False
        With ``v``: only the rows with ``v_j > 0`` are queries; the others get the
        outputs of a row without centres (``m = -inf``, every sum 0).

    Returns
    -------
    m, S, Q, T, D, A, U, stats
        As the compiled core's: ``m`` ``([B,] H, R)``, ``S, Q, T, D`` ``([B,] H, R, C)``,
        ``A`` ``([B,] H, R, 2)``, ``U`` ``([B,] H, R)``; arrays not requested have shape
        ``(0, 0, 0)``; ``stats`` a dict of the counters of ``BinaryStats``.

    Raises
    ------
    ValueError
        On bad shapes, labels, powers, rows, method, non-finite inputs, ``p`` outside
        [0, 1], negative centre weights (the compiled core's checks).
    TypeError
        ``logq``, ``p``, ``labels``, ``scale`` or ``bias`` not C-contiguous arrays of
        their dtype (the binding converts none of them either).
    """
    del plan  # the compiled core's sort and cell cache; results are the same without
    logq = _carray(logq, "logq", np.float64)
    p = _carray(p, "p", np.float64)
    labels = _carray(labels, "labels", np.int64)
    scale = _carray(scale, "scale", np.float64)
    bias = _carray(bias, "bias", np.float64)
    batched = p.ndim == 3
    if not (p.ndim == 2 or batched) or logq.ndim != p.ndim:
        raise ValueError("logq and p must both be (n, 2) or both (B, n, 2) arrays")
    B = p.shape[0] if batched else 1
    n = p.shape[-2]
    K = p.shape[-1]
    if K != 2:
        raise ValueError(f"binary problems need K = 2, got {K}")
    if logq.shape != p.shape:
        raise ValueError("logq and p must have the same shape")
    if (
        labels.ndim != (2 if batched else 1)
        or (batched and labels.shape[0] != B)
        or (labels.shape[-1] != n)
    ):
        raise ValueError(
            "labels must have shape (B, n)" if batched else "labels must have shape (n,)"
        )
    if scale.ndim != 1:
        raise ValueError("scale must be 1-D")
    H = scale.shape[0]
    if (
        bias.ndim != (3 if batched else 2)
        or (batched and bias.shape[0] != B)
        or bias.shape[-2] != H
        or bias.shape[-1] != n
    ):
        raise ValueError(
            "bias must have shape (B, H, n)" if batched else "bias must have shape (H, n)"
        )
    row_start = int(row_start)
    row_stop = int(row_stop)
    if row_start < 0 or row_stop < row_start or row_stop > n:
        raise ValueError("need 0 <= row_start <= row_stop <= n")
    powers = int(powers)
    if powers < 1 or powers > 3:
        raise ValueError("powers must be 1, 2 or 3")
    pairs = bool(pairs)
    if pairs and powers < 2:
        raise ValueError(f"pairs=True needs powers >= 2, got powers = {powers}")
    C = int(n_classes)
    if C < 1:
        raise ValueError("n_classes must be >= 1")
    if method not in ("window", "binned", "local"):
        raise ValueError(f"method must be 'window', 'binned' or 'local', got '{method}'")

    def per_centre(obj: Any, name: str) -> np.ndarray | None:
        if obj is None:
            return None
        a = np.ascontiguousarray(obj, dtype=np.float64)
        if a.ndim != (2 if batched else 1) or (batched and a.shape[0] != B) or a.shape[-1] != n:
            raise ValueError(
                f"{name} must have shape (B, n)" if batched else f"{name} must have shape (n,)"
            )
        return a.reshape(B, n)

    ua = per_centre(u, "u")
    va = per_centre(v, "v")
    if va is not None and (powers > 2 or pairs):
        raise ValueError("centre weights v support powers <= 2 without the pair sums")
    weighted_rows = bool(weighted_rows)
    if weighted_rows and va is None:
        raise ValueError("weighted_rows=True needs v")
    residuals = bool(residuals)
    # the compiled core's own checks
    if n < 1:
        _fail(f"n must be >= 1, got {n}")
    cell_width = float(cell_width)
    if not (math.isfinite(cell_width) and 0 < cell_width <= 4):
        _fail("cell_width must be in (0, 4]")
    for t in range(H):
        if not (math.isfinite(scale[t]) and scale[t] > 0):
            _fail(f"scale must be finite and > 0, got {scale[t]}")
    lab2 = labels.reshape(B, n)
    bad = (lab2 < 0) | (lab2 >= C)
    if bad.any():
        b, i = np.argwhere(bad)[0]
        raise ValueError(
            f"kdecal.binary_reduce: label {lab2[b, i]} at index {i} is outside [0, {C})"
        )
    p3 = p.reshape(B, n, 2)
    q3 = logq.reshape(B, n, 2)
    ok = (p3 >= 0.0) & (p3 <= 1.0)
    if not ok.all():
        b, i, k = np.argwhere(~ok)[0]
        _fail(f"p must lie in [0, 1]; p[{i}, {k}] = {p3[b, i, k]}")
    ok = np.isfinite(q3) & (q3 <= 0.0)
    if not ok.all():
        b, i, k = np.argwhere(~ok)[0]
        _fail(f"logq must be finite and <= 0; logq[{i}, {k}] = {q3[b, i, k]}")
    if ua is not None and not np.isfinite(ua).all():
        _fail("u must be finite")
    if va is not None:
        ok = np.isfinite(va) & (va >= 0.0)
        if not ok.all():
            b, i = np.argwhere(~ok)[0]
            _fail(f"centre weights v must be finite and >= 0; v[{i}] = {va[b, i]}")
    if not np.isfinite(bias).all():
        _fail("bias must be finite")
    if not (math.isfinite(float(ref_floor)) and float(ref_floor) >= 0.0):
        _fail(f"ref_floor must be finite and >= 0, got {ref_floor!r}")

    R = row_stop - row_start

    def shape(*dims: int) -> tuple[int, ...]:
        return (B, *dims) if batched else dims

    none = (0, 0, 0)
    m = np.empty(shape(H, R))
    S = np.empty(shape(H, R, C))
    Q = np.empty(shape(H, R, C) if powers >= 2 else none)
    T = np.empty(shape(H, R, C) if powers >= 3 else none)
    D = np.empty(shape(H, R, C) if pairs else none)
    want_a = residuals
    want_u = residuals and ua is not None
    A = np.empty(shape(H, R, 2) if want_a else none)
    U = np.empty(shape(H, R) if want_u else none)
    stats = dict.fromkeys(_STAT_KEYS, 0)
    if R > 0:
        flags = {
            "powers": powers,
            "pairs": pairs,
            "want_a": want_a,
            "want_u": want_u,
            "binned": method in ("binned", "local"),
            "local": method == "local",
            "ref_floor": float(ref_floor),
            "weighted_rows": weighted_rows,
        }
        views: list[np.ndarray | None] = [
            m.reshape(B, H, R),
            S.reshape(B, H, R, C),
            Q.reshape(B, H, R, C) if powers >= 2 else None,
            T.reshape(B, H, R, C) if powers >= 3 else None,
            D.reshape(B, H, R, C) if pairs else None,
            A.reshape(B, H, R, 2) if want_a else None,
            U.reshape(B, H, R) if want_u else None,
        ]
        _run(
            logq.reshape(B, n, 2),
            p3,
            lab2,
            C,
            scale,
            bias.reshape(B, H, n),
            (row_start, row_stop),
            int(n_threads),
            progress,
            flags,
            ua,
            va,
            cell_width,
            views,
            stats,
        )
    return m, S, Q, T, D, A, U, stats


def _run(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    C: int,
    scale: np.ndarray,
    bias: np.ndarray,
    rows: tuple[int, int],
    n_threads: int,
    progress: Callable[[int], object] | None,
    flags: dict[str, Any],
    u: np.ndarray | None,
    v: np.ndarray | None,
    cell_width: float,
    outs: list[np.ndarray | None],
    stats: dict[str, int],
) -> None:
    """Run the batch's problems and bandwidths, their rows in chunks (progress, Ctrl-C).

    ``outs``: m (B, H, R), S, Q, T, D (B, H, R, C), A (B, H, R, 2), U (B, H, R), None for
    those not wanted.  Each chunk is one kernel call of about CHUNK_SECONDS (timed from
    the previous one), so that Ctrl-C and the progress callback come between two chunks.
    """
    B, n = p.shape[0], p.shape[1]
    H = scale.shape[0]
    row_start, row_stop = rows
    powers, pairs, want_a, want_u = (flags[k] for k in ("powers", "pairs", "want_a", "want_u"))
    binned = flags["binned"]
    local = flags["local"]
    # the fine cells' moments serve the binned method and the local method's fallbacks,
    # frequent only with the pair sums (e1 to its own precision) (as the C++)
    fine = not local or pairs or want_u
    weighted = v is not None
    fused = fused_kernel()
    fl = np.zeros(_NFL, np.int64)
    for slot, flag in ((_GPOW, powers), (_GPAIRS, pairs), (_GA, want_a), (_GU, want_u)):
        fl[slot] = flag
    for slot, flag in ((_GW, weighted), (_GFUSED, fused), (_GBINNED, binned)):
        fl[slot] = flag
    fl[_GQMAX] = max(powers, 2 if want_u else 1)
    fl[_GWANT : _GWANT + 6] = [1, powers >= 2, powers >= 3, want_a, want_a, want_u]
    # the moment arrays (M1, A0, A1, M2, U2, M3) the call uses
    need = np.array([True, want_a, want_a, powers >= 2, want_u, powers >= 3], dtype=np.bool_)
    no_cells = (np.empty((0, 6), np.int64), np.empty((0, _NCF)), np.empty(0), 0)
    absent = (
        np.empty(0),
        np.empty((0, 0)),
        np.empty((0, 0)),
        np.empty((0, 0)),
        np.empty((0, 0)),
        np.empty((0, 0)),
        np.empty(0),
    )
    Tb = math.log(float(n)) + 36.0
    floor = float(flags["ref_floor"]) if v is not None else 0.0
    cfg = np.array([0.0, 1.0, 0.0, float(n), Tb, max(_KDROP, Tb), floor])
    done = 0
    with num_threads(n_threads):
        n_tasks = 4 * numba.get_num_threads()
        step = max(_QBLOCK * n_tasks, 256)  # the first chunk's rows (then timed)
        for b in range(B):
            cen, ix, seg, z = _sort_problem(p[b], logq[b], labels[b], C)
            perm = ix[_IPERM]
            qorder = np.flatnonzero((perm >= row_start) & (perm < row_stop)).astype(np.int64)
            if flags["weighted_rows"]:
                # a row of weight 0 is no query: the outputs of a row without centres
                assert v is not None
                skip = perm[qorder] - row_start
                skip = skip[~(v[b][perm[qorder]] > 0.0)]
                qorder = qorder[v[b][perm[qorder]] > 0.0]
                for k, a in enumerate(outs):
                    if a is not None:
                        a[b][:, skip] = -np.inf if k == 0 else 0.0
            if u is not None:
                cen[_CU] = u[b][perm]
                cen[_CUA] = np.abs(cen[_CU])
            if v is not None:
                cen[_CV] = v[b][perm]
            cfg[_FUMAX] = cen[_CUA].max()
            cfg[_FVMAX] = cen[_CV].max() if v is not None else 1.0
            g = np.empty(n)
            for t in range(H):
                cfg[_FS] = s = float(scale[t])
                _context(cen, perm, bias[b, t], s, g)
                ci, cf, mom, fl[_GNC] = (
                    _cells(cen, ix, seg, z, s, cell_width, weighted, fused, need, fine)
                    if binned
                    else no_cells
                )
                out = tuple(absent[i] if a is None else a[b, t] for i, a in enumerate(outs))
                if local:
                    # groups over all n sorted positions (independent of the rows asked
                    # for); the tasks are the groups holding at least one query row
                    gstart = _make_groups(z, s)
                    in_range = np.zeros(n, np.bool_)
                    in_range[qorder] = True
                    nq = np.add.reduceat(in_range.astype(np.int64), gstart[:-1])
                    tasks = np.flatnonzero(nq > 0).astype(np.int64)
                    rows_done = np.concatenate([[0], np.cumsum(nq[tasks])])
                    total = tasks.shape[0]
                    gstep = max(n_tasks, 4)  # the first chunk's groups (then timed)
                else:
                    total = qorder.shape[0]
                k = 0
                while k < total:
                    st = np.zeros((n_tasks, _NST), np.int64)
                    t0 = time.perf_counter()
                    if local:
                        k1 = min(total, k + gstep)
                        _local_kernel(
                            tasks,
                            k,
                            k1,
                            gstart,
                            in_range,
                            ix,
                            seg,
                            cen,
                            g,
                            ci,
                            cf,
                            mom,
                            cfg,
                            fl,
                            need,
                            row_start,
                            n_tasks,
                            out,
                            st,
                        )
                        nrows = int(rows_done[k1] - rows_done[k])
                    else:
                        k1 = min(total, k + step)
                        _kernel(
                            qorder,
                            k,
                            k1,
                            ix,
                            seg,
                            cen,
                            g,
                            ci,
                            cf,
                            mom,
                            cfg,
                            fl,
                            row_start,
                            n_tasks,
                            out,
                            st,
                        )
                        nrows = k1 - k
                    dt = time.perf_counter() - t0
                    tot = st.sum(axis=0)
                    for key, slot in (
                        ("pairs_direct", _ST_DIRECT),
                        ("cells_taylor", _ST_CELLS),
                        ("terms_taylor", _ST_TERMS),
                        ("fallbacks", _ST_FALLBACKS),
                        ("pairs_long", _ST_LONG),
                        ("pairs_fallback", _ST_PFALL),
                        ("rows_local", _ST_ROWS),
                        ("groups_local", _ST_GROUPS),
                    ):
                        stats[key] += int(tot[slot])
                    # the next chunk: about CHUNK_SECONDS at this chunk's pace
                    if local:
                        rate = (k1 - k) / max(dt, 1e-6)
                        gstep = int(min(max(rate * CHUNK_SECONDS, n_tasks), 4 * gstep + 1))
                    else:
                        rate = (k1 - k) / max(dt, 1e-6)
                        step = int(min(max(rate * CHUNK_SECONDS, _QBLOCK * n_tasks), 4 * step + 1))
                    done += nrows
                    k = k1
                    if progress is not None:
                        progress(done)
