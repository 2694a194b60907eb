"""Numba fallback backend of the kdecal engine primitives ``loo_reduce`` and ``loo_reduce_multi``.

This module is imported lazily, only when the numba backend is used; it imports
numba at module level.  It computes exactly what the C++ engine
(``kdecal._core.loo_reduce``) computes, see :func:`loo_reduce`:
the per-class leave-one-out sums of Dirichlet-kernel values
(Popordanoska et al. 2022, Eq. 10) on which the KDE estimator of
``E[y | f(x)]`` (Popordanoska et al. 2022, Eq. 3) and the leave-one-out
density used for bandwidth selection are built.  The derived quantities are
computed once for all backends, in Python, by the caller.

Preconditions (the caller validates; nothing is checked here):

* ``logq`` and ``p`` are C-contiguous arrays of one dtype, float32 or float64,
  of shape ``(n, K)``, all entries finite (``p`` is the clipped and
  renormalised ``P~`` and ``logq`` is ``log P~``).
* ``labels`` is an integer array of shape ``(n,)`` with values in
  ``[0, n_classes)``; ``n_classes >= 1``.
* ``scale`` is a finite float64 array of shape ``(H,)`` (``1 / h``) and
  ``bias`` a finite float64 array of shape ``(H, n)``.
* ``powers`` is 1, 2 or 3; ``0 <= row_start <= row_stop <= n``.
* Callers guarantee ``n >= 3``; ``n == 1`` still gives ``m = -inf`` and zero
  sums, without NaN.

Implementation notes.  Centres are permuted once per call so that the centres
of each class are contiguous (no copy when the labels are already sorted) and
kept transposed, ``(K, n)``, so that the dot products ``G_ij`` of one query
row against all centres are computed with vectorised loops, in the input dtype
with the terms added in the order ``k = 0 .. K-1``, into a float64 row of
length ``n`` that is reused for every bandwidth.  For each bandwidth two
passes run over each class segment, block by block through L1-sized buffers:
the first finds ``m_c``, the second recomputes ``L`` (bitwise the same values)
and forms the sums of ``e = exp(max(L - m_c, -230))``, ``e**2`` and ``e**3``
with a vectorisable polynomial ``exp`` (within about 1 ulp on ``[-230, 0]``)
and a pairwise (tree) summation; the i == j term is excluded exactly (it is
set to ``-inf`` for the maximum and to ``0`` before summing).  The class sums
are finally scaled by ``exp(m_c - m)`` (resp. ``exp(2 (m_c - m))``,
``exp(3 (m_c - m))``).  Scratch is ``O(n)`` per chunk of query rows; nothing
of size ``n x n`` is ever formed.  Chunks of query rows run in parallel
(``prange``); each row is computed by one thread in a fixed order, so results
do not depend on the number of threads.  No fast-math is used (the summation
order is fixed in the code); fused multiply-adds are requested explicitly
(``llvm.fma``) only inside the ``exp`` polynomial.  Calling ``loo_reduce``
concurrently from several Python threads requires a thread-safe numba
threading layer (``tbb`` or ``omp``), as for any ``parallel=True`` function.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

from . import runtime as _runtime

__all__ = ["kernel_weights", "loo_grad", "loo_reduce", "loo_reduce_multi", "num_threads"]

_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}

# Terms more than _CLAMP below their class maximum are clamped to exp(-_CLAMP):
# exp(-3 * 230) ~ 1e-300 is still a normal double, so no subnormals appear in
# the sums of squares and cubes either.
_CLAMP = -230.0

# Centres per block in the dot-product and reduction stages (L1-sized buffers).
_BLK = 512

# Query rows per tile: one block of centres and of bias serves the whole tile.
_TQ = 4


# ---------------------------------------------------------------------------
# Low-level intrinsics: bit casts and an explicit fused multiply-add.
# ---------------------------------------------------------------------------
@intrinsic
def _f64_bits(typingctx, x):
    """Reinterpret a float64 as int64 (no conversion)."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return sig, codegen


@intrinsic
def _bits_f64(typingctx, x):
    """Reinterpret an int64 as float64 (no conversion)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return sig, codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """Return a * b + c with a single rounding (llvm.fma.f64)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        return builder.fma(args[0], args[1], args[2])

    return sig, codegen


# exp(x) for x in [-708, 0]:  x = k ln2 + r, |r| <= ln2 / 2 (Cody-Waite), then
# a degree-13 Taylor polynomial (truncation error < 1e-17 relative) and 2^k
# built from its bit pattern.  k is obtained with the 1.5 * 2^52 shifter, so
# every step vectorises (no libm call, no float->int conversion).
_SHIFT = 6755399441055744.0  # 1.5 * 2**52
_SHIFT_BITS = int(np.float64(_SHIFT).view(np.int64))
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # fdlibm split of ln 2
_LN2_LO = 1.90821492927058770002e-10
_C = tuple(1.0 / math.factorial(i) for i in range(14))
(_C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13) = _C[2:14]


@njit(inline="always", **_JIT)
def _exp_nonpos(x):
    t = x * _LOG2E + _SHIFT
    kd = t - _SHIFT
    ki = _f64_bits(t) - _SHIFT_BITS
    r = (x - kd * _LN2_HI) - kd * _LN2_LO
    q = _fma(_C13, r, _C12)
    q = _fma(q, r, _C11)
    q = _fma(q, r, _C10)
    q = _fma(q, r, _C9)
    q = _fma(q, r, _C8)
    q = _fma(q, r, _C7)
    q = _fma(q, r, _C6)
    q = _fma(q, r, _C5)
    q = _fma(q, r, _C4)
    q = _fma(q, r, _C3)
    q = _fma(q, r, _C2)
    q = _fma(q, r, 1.0)
    q = _fma(q, r, 1.0)
    return q * _bits_f64((ki + 1023) << 52)


# ---------------------------------------------------------------------------
# Row-level building blocks.  Every loop below is either element-wise
# (vectorised by LLVM without any fast-math flag) or a short scalar loop.
# ---------------------------------------------------------------------------
@njit(**_JIT)
def _dot_tile(logq, j0, tq, psT, G, acc):
    """Set G[q, i] = float64(sum_k logq[j0 + q, k] * psT[k, i]) for q < tq.

    The sum is accumulated in the input dtype strictly in the order
    k = 0 .. K-1 (four k per sweep, to save loads and stores of the
    accumulator), one L1-sized block of centres at a time, each block of psT
    serving the whole tile.
    """
    K = psT.shape[0]
    n = psT.shape[1]
    nb = acc.shape[0]
    for i0 in range(0, n, nb):
        i1 = min(i0 + nb, n)
        w = i1 - i0
        a = acc[:w]
        for q in range(tq):
            lq = logq[j0 + q]
            r0 = psT[0, i0:i1]
            l0 = lq[0]
            for ii in range(w):
                a[ii] = l0 * r0[ii]
            k = 1
            while k + 4 <= K:
                r0 = psT[k, i0:i1]
                r1 = psT[k + 1, i0:i1]
                r2 = psT[k + 2, i0:i1]
                r3 = psT[k + 3, i0:i1]
                l0 = lq[k]
                l1 = lq[k + 1]
                l2 = lq[k + 2]
                l3 = lq[k + 3]
                for ii in range(w):
                    a[ii] = (((a[ii] + l0 * r0[ii]) + l1 * r1[ii]) + l2 * r2[ii]) + l3 * r3[ii]
                k += 4
            while k < K:
                r0 = psT[k, i0:i1]
                l0 = lq[k]
                for ii in range(w):
                    a[ii] = a[ii] + l0 * r0[ii]
                k += 1
            g = G[q, i0:i1]
            for ii in range(w):
                g[ii] = np.float64(a[ii])


@njit(**_JIT)
def _seg_max(L, lo, hi):
    """max(L[lo:hi]) (-inf if empty), with 4 independent chains."""
    a0 = -np.inf
    a1 = -np.inf
    a2 = -np.inf
    a3 = -np.inf
    i = lo
    while i + 4 <= hi:
        a0 = max(a0, L[i])
        a1 = max(a1, L[i + 1])
        a2 = max(a2, L[i + 2])
        a3 = max(a3, L[i + 3])
        i += 4
    while i < hi:
        a0 = max(a0, L[i])
        i += 1
    return max(max(a0, a1), max(a2, a3))


@njit(**_JIT)
def _tree_sum(E):
    """Return the pairwise (tree) sum of E; destroys E.

    Each halving step is an element-wise loop, so the summation vectorises
    in a fixed order.
    """
    w = E.shape[0]
    while w > 16:
        h = w >> 1
        a = E[:h]
        b = E[h : 2 * h]
        for i in range(h):
            a[i] = a[i] + b[i]
        if w & 1:
            E[0] = E[0] + E[2 * h]
        w = h
    s = 0.0
    for i in range(w):
        s += E[i]
    return s


@njit(**_JIT)
def _tile(
    logq,
    j0,
    tq,
    r0,
    psT,
    bs,
    seg_lo,
    seg_hi,
    pos,
    scale,
    powers,
    pairs,
    G,
    E,
    E2,
    E3,
    EX,
    EX2,
    acc,
    mc,
    acc_s,
    m_out,
    S_out,
    Q_out,
    T_out,
    D_out,
    pf,
    us,
    EA,
    acc_a,
    acc_u,
    A_out,
    U_out,
):
    """All outputs of the tq query rows j0 .. j0+tq-1 (output rows r0 ..).

    For each class segment two passes run block by block (L1-sized blocks of
    centres): the class maxima m_c, then the sums.  Within a block the loops
    run over bandwidths, then query rows, so that each block of G stays in
    cache across bandwidths and each block of bias serves the whole tile.
    L is recomputed in the second pass with the same operations, hence
    bitwise the same values.  The order of operations for one query row does
    not depend on the tile it belongs to.  With ``pairs``, the excess sums over the
    class maximum (whose terms, ``L == m_c`` exactly, are counted instead of summed)
    give ``D = S^2 - Q`` without cancellation, as in the C++ engine.

    The residual sums (``us`` not None: ``pf`` the centres (K, n) in float64, ``us`` the
    residuals, both in class order) ``A_k = sum e p_ik`` and ``U = sum e^2 u_i`` over
    the same terms ``e`` as ``S`` are kept per class relative to the class maximum and
    added to ``A_out``, ``U_out`` scaled by ``exp(m_c - m)`` (``exp(2 (m_c - m))``) at
    the end of each class.  ``us is None`` compiles them out (numba prunes the branches
    on an argument's ``None`` type), so that the plain call is unchanged.
    """
    H = scale.shape[0]
    C = seg_lo.shape[0]
    nb = E.shape[0]
    _dot_tile(logq, j0, tq, psT, G, acc)
    # Pass 1: per-class maxima (the i == j term is set to -inf, so a class
    # whose only centre is the query keeps m_c = -inf).
    for c in range(C):
        lo = seg_lo[c]
        hi = seg_hi[c]
        for t in range(H):
            for q in range(tq):
                mc[t, q, c] = -np.inf
        for i0 in range(lo, hi, nb):
            i1 = min(i0 + nb, hi)
            w = i1 - i0
            e = E[:w]
            for t in range(H):
                st = scale[t]
                bb = bs[t, i0:i1]
                for q in range(tq):
                    gg = G[q, i0:i1]
                    for ii in range(w):
                        e[ii] = bb[ii] + st * gg[ii]
                    pj = pos[j0 + q]
                    if i0 <= pj < i1:
                        e[pj - i0] = -np.inf  # leave-one-out
                    v = _seg_max(e, 0, w)
                    mc[t, q, c] = max(mc[t, q, c], v)
    for t in range(H):
        for q in range(tq):
            mrow = -np.inf
            for c in range(C):
                mrow = max(mrow, mc[t, q, c])
            m_out[t, r0 + q] = mrow
            if us is not None:
                for k in range(A_out.shape[2]):
                    A_out[t, r0 + q, k] = 0.0
                U_out[t, r0 + q] = 0.0
    # Pass 2: sums of exp(max(L - m_c, -230)) and of its square and cube.
    for c in range(C):
        lo = seg_lo[c]
        hi = seg_hi[c]
        for t in range(H):
            for q in range(tq):
                for a in range(6):
                    acc_s[a, t, q] = 0.0
                if us is not None:
                    for k in range(acc_a.shape[2]):
                        acc_a[t, q, k] = 0.0
                    acc_u[t, q] = 0.0
        for i0 in range(lo, hi, nb):
            i1 = min(i0 + nb, hi)
            w = i1 - i0
            e = E[:w]
            e2 = E2[:w]
            e3 = E3[:w]
            ex = EX[:w]
            ex2 = EX2[:w]
            for t in range(H):
                st = scale[t]
                bb = bs[t, i0:i1]
                for q in range(tq):
                    v = mc[t, q, c]
                    if v == -np.inf:  # no centre i != j in this class
                        continue
                    gg = G[q, i0:i1]
                    for ii in range(w):
                        e[ii] = _exp_nonpos(max((bb[ii] + st * gg[ii]) - v, _CLAMP))
                    pj = pos[j0 + q]
                    if i0 <= pj < i1:
                        e[pj - i0] = 0.0  # exact exclusion of i == j
                    if pairs:
                        # terms at the class maximum (exactly 1) are counted, not summed
                        ties = 0.0
                        for ii in range(w):
                            top = (bb[ii] + st * gg[ii]) - v == 0.0
                            ex[ii] = 0.0 if top else e[ii]
                            ties += 1.0 if top else 0.0
                        if i0 <= pj < i1 and (bb[pj - i0] + st * gg[pj - i0]) - v == 0.0:
                            ties -= 1.0  # the query itself is no term
                        for ii in range(w):
                            ex2[ii] = ex[ii] * ex[ii]
                        acc_s[5, t, q] += ties
                        acc_s[4, t, q] += _tree_sum(ex2)
                        acc_s[3, t, q] += _tree_sum(ex)
                    if powers >= 2:
                        for ii in range(w):
                            e2[ii] = e[ii] * e[ii]
                        if powers >= 3:
                            for ii in range(w):
                                e3[ii] = e2[ii] * e[ii]
                            acc_s[2, t, q] += _tree_sum(e3)
                        acc_s[1, t, q] += _tree_sum(e2)
                    if us is not None:  # (before the sum of e, which destroys e)
                        ea = EA[:w]
                        for k in range(pf.shape[0]):
                            pk = pf[k, i0:i1]
                            for ii in range(w):
                                ea[ii] = e[ii] * pk[ii]
                            acc_a[t, q, k] += _tree_sum(ea)
                        uu = us[i0:i1]
                        for ii in range(w):
                            ea[ii] = (e[ii] * e[ii]) * uu[ii]
                        acc_u[t, q] += _tree_sum(ea)
                    acc_s[0, t, q] += _tree_sum(e)
        for t in range(H):
            for q in range(tq):
                v = mc[t, q, c]
                r = r0 + q
                if v == -np.inf:
                    S_out[t, r, c] = 0.0
                    if powers >= 2:
                        Q_out[t, r, c] = 0.0
                    if powers >= 3:
                        T_out[t, r, c] = 0.0
                    if pairs:
                        D_out[t, r, c] = 0.0
                    continue
                d = v - m_out[t, r]
                S_out[t, r, c] = acc_s[0, t, q] * math.exp(d)
                if us is not None:
                    f1 = math.exp(d)
                    for k in range(A_out.shape[2]):
                        A_out[t, r, k] += acc_a[t, q, k] * f1
                    U_out[t, r] += acc_u[t, q] * math.exp(2.0 * d)
                if powers >= 2:
                    Q_out[t, r, c] = acc_s[1, t, q] * math.exp(2.0 * d)
                if powers >= 3:
                    T_out[t, r, c] = acc_s[2, t, q] * math.exp(3.0 * d)
                if pairs:
                    # e1 = S_c - 1, e2 = Q_c - 1 relative to the class maximum; the
                    # maximum's own term is one of the ties
                    extra = acc_s[5, t, q] - 1.0
                    e1 = acc_s[3, t, q] + extra
                    e2 = acc_s[4, t, q] + extra
                    D_out[t, r, c] = ((2.0 * e1 - e2) + e1 * e1) * math.exp(2.0 * d)


# ---------------------------------------------------------------------------
# The parallel kernel.
# ---------------------------------------------------------------------------
@njit(parallel=True, **_JIT)
def _loo_reduce_kernel(
    logq,
    psT,
    bs,
    seg_lo,
    seg_hi,
    pos,
    scale,
    powers,
    pairs,
    row_start,
    row_stop,
    out_off,
    m_out,
    S_out,
    Q_out,
    T_out,
    D_out,
    n_chunks,
    pf,
    us,
    A_out,
    U_out,
):
    # Query rows [row_start, row_stop) go to output rows out_off + (j - row_start).
    # us None (pf, A_out, U_out then empty): no residual sums, compiled out of _tile.
    n = psT.shape[1]
    H = scale.shape[0]
    C = seg_lo.shape[0]
    R = row_stop - row_start
    nb = min(_BLK, max(n, 1))
    n2 = nb if powers >= 2 else 0
    n3 = nb if powers >= 3 else 0
    nx = nb if pairs else 0
    # Scratch is allocated once per chunk of consecutive rows (the caller
    # asks for a few chunks per thread); rows go through in tiles of _TQ.
    nch = max(1, min(R, n_chunks))
    for ch in prange(nch):
        c0 = (R * ch) // nch
        c1 = (R * (ch + 1)) // nch
        G = np.empty((_TQ, n), np.float64)
        E = np.empty(nb, np.float64)
        E2 = np.empty(n2, np.float64)
        E3 = np.empty(n3, np.float64)
        EX = np.empty(nx, np.float64)
        EX2 = np.empty(nx, np.float64)
        acc = np.empty_like(psT[0, :nb])
        mc = np.empty((H, _TQ, C), np.float64)
        acc_s = np.empty((6, H, _TQ), np.float64)
        EA = np.empty(nb if pf.shape[0] > 0 else 0, np.float64)
        acc_a = np.empty((H, _TQ, pf.shape[0]), np.float64)
        acc_u = np.empty((H, _TQ), np.float64)
        for r0 in range(c0, c1, _TQ):
            tq = min(_TQ, c1 - r0)
            _tile(
                logq,
                row_start + r0,
                tq,
                out_off + r0,
                psT,
                bs,
                seg_lo,
                seg_hi,
                pos,
                scale,
                powers,
                pairs,
                G,
                E,
                E2,
                E3,
                EX,
                EX2,
                acc,
                mc,
                acc_s,
                m_out,
                S_out,
                Q_out,
                T_out,
                D_out,
                pf,
                us,
                EA,
                acc_a,
                acc_u,
                A_out,
                U_out,
            )


# ---------------------------------------------------------------------------
# Public entry points.
# ---------------------------------------------------------------------------
#: Target duration of one kernel call, in seconds: about the longest that Ctrl-C waits.
CHUNK_SECONDS = 0.25

#: Work units (see :func:`_chunks`) one thread gets through per second, a low estimate
#: (measured 4e8 to 1e9 for loo_reduce and 3e8 for loo_reduce_multi with K = 10 on
#: an AVX-512 CPU; older CPUs are slower).
_UNITS_PER_SECOND = 3e8


def _chunks(row_start, row_stop, row_cost, n_threads):
    """Split the query rows into ranges of about :data:`CHUNK_SECONDS` each.

    ``row_cost`` is the work of one query row in units of about one kernel evaluation
    (``n`` centres times the per-centre cost).  Ranges hold at least 16 rows per
    thread so that each kernel call still spreads over the threads.
    """
    per_chunk = CHUNK_SECONDS * _UNITS_PER_SECOND * max(1, n_threads)
    step = max(16 * max(1, n_threads), int(per_chunk / max(row_cost, 1.0)))
    return [(a, min(a + step, row_stop)) for a in range(row_start, row_stop, step)]


def _loo_reduce(
    logq,
    p,
    labels,
    n_classes,
    scale,
    bias,
    powers,
    row_start,
    row_stop,
    progress=None,
    pairs=False,
    resid=None,
):
    """Per-class leave-one-out sums of Dirichlet-kernel values (numba backend).

    For each bandwidth index ``t``, each query row ``j`` in
    ``[row_start, row_stop)`` and each centre ``i != j``::

        G_ij   = sum_k logq[j, k] * p[i, k]      (input dtype, then float64)
        L_ij   = bias[t, i] + scale[t] * G_ij    (log kernel, up to lgamma(1/h + K))
        m_c(j) = max_{i != j, labels[i] == c} L_ij   (-inf for an empty class)
        m(j)   = max_c m_c(j)
        S_c(j) = sum_{i != j, labels[i] == c} exp(L_ij - m(j))
        Q_c(j) = sum_{i != j, labels[i] == c} exp(2 (L_ij - m(j)))
        T_c(j) = sum_{i != j, labels[i] == c} exp(3 (L_ij - m(j)))
        A_k(j) = sum_{i != j} exp(L_ij - m(j)) * p[i, k]         (with ``resid``)
        U(j)   = sum_{i != j} exp(2 (L_ij - m(j))) * resid[i]     (with ``resid``)

    ``L_ij`` is the Dirichlet kernel ``log k_h(f_j; f_i)`` of Popordanoska et
    al. (2022), Eq. 10, less the constant ``lgamma(1/h + K)``; ``S_c / sum_c
    S_c`` is their leave-one-out estimator of ``E[y_c | f_j]`` (Eq. 3); see
    the C++ engine.  Terms with ``L_ij - m_c(j) < -230`` are
    clamped to ``exp(-230)`` (relative to their class maximum); there is no
    other approximation.

    Parameters
    ----------
    logq : ndarray, shape (n, K), float32 or float64, C-contiguous
        Log of the query probabilities (``log P~``).
    p : ndarray, shape (n, K), same dtype as `logq`, C-contiguous
        Centre probabilities (``P~``).
    labels : ndarray, shape (n,), int64
        Group (class) of each centre, in ``[0, n_classes)``.
    n_classes : int
        Number of groups ``C >= 1``.
    scale : ndarray, shape (H,), float64
        ``1 / h`` for each bandwidth.
    bias : ndarray, shape (H, n), float64
        Per-centre bias ``b_i(h) = -sum_k lgamma(P~_ik / h + 1)``.
    powers : int
        1: S only; 2: S and Q; 3: S, Q and T.
    row_start, row_stop : int
        Query rows ``[row_start, row_stop)``, ``0 <= row_start <= row_stop <= n``.
    progress : callable or None
        Called after every chunk of rows with the number of rows done so far (the last
        call with ``row_stop - row_start``).
    pairs : bool
        Also return the pair sums ``D`` (needs ``powers >= 2``; not checked here).
    resid : ndarray, shape (n,), float64, or None
        Per-centre residuals ``u``: also return the residual sums ``A`` and ``U``.

    Returns
    -------
    m : ndarray, shape (H, R), float64
        ``m(j)``, with ``R = row_stop - row_start``.
    S : ndarray, shape (H, R, C), float64
    Q : ndarray, shape (H, R, C), float64, or shape (0, 0, 0) if ``powers < 2``
    T : ndarray, shape (H, R, C), float64, or shape (0, 0, 0) if ``powers < 3``
        All C-contiguous.  A class without any centre ``i != j`` has
        ``S_c = Q_c = T_c = 0`` and does not affect ``m``.
    D : ndarray, shape (H, R, C), float64, only with ``pairs``
        ``S_c^2 - Q_c`` (the sum of ``w_ij w_kj`` over ordered pairs ``i != k`` of the
        class), accumulated as sums of the terms in excess of each class's largest one
        (exactly 1 relative to the class maximum, counted rather than added), so that
        it keeps its full relative precision when one neighbour dominates, where
        ``S**2 - Q`` would cancel.  ``S``, ``Q``, ``T`` do not depend on ``pairs``.
    A : ndarray, shape (H, R, K), float64, only with ``resid``
        ``A_k(j)``, over the centres of every class (``p`` taken in float64).
    U : ndarray, shape (H, R), float64, only with ``resid``
        ``U(j)``.  Both are summed over the same terms as ``S`` (the same clamping), per
        class relative to the class maximum, then scaled to the row maximum; ``S``,
        ``Q``, ``T``, ``D`` do not depend on ``resid``.

    Notes
    -----
    Nothing is validated (the caller does).  The rows are reduced in chunks of
    about :data:`CHUNK_SECONDS` each (one kernel call per chunk, after one shared setup:
    the class sort and the transposed centres), so that Python sees Ctrl-C
    (``KeyboardInterrupt``, raised between two chunks) and can show progress.
    Memory: a transposed copy of
    `p` (``n K``) and, unless `labels` is already sorted, a class-sorted copy
    of `bias` (``H n``), plus ``O(n)`` float64 scratch per chunk of query rows
    in flight (a few chunks per numba thread); never an ``n x n`` array.
    Results do not depend on the number of numba threads nor on how the
    query rows are split into ``[row_start, row_stop)`` ranges.
    """
    powers = int(powers)
    row_start = int(row_start)
    row_stop = int(row_stop)
    C = int(n_classes)
    n = p.shape[0]
    H = scale.shape[0]
    R = row_stop - row_start
    labels = np.asarray(labels, dtype=np.int64)
    scale = np.ascontiguousarray(scale, dtype=np.float64)
    bias = np.ascontiguousarray(bias, dtype=np.float64)
    logq = np.ascontiguousarray(logq)
    p = np.ascontiguousarray(p, dtype=logq.dtype)

    counts = np.bincount(labels, minlength=C)[:C].astype(np.int64)
    seg_hi = np.cumsum(counts).astype(np.int64)
    seg_lo = (seg_hi - counts).astype(np.int64)
    if n <= 1 or bool(np.all(labels[1:] >= labels[:-1])):
        order = None
        pos = np.arange(n, dtype=np.int64)
        psT = np.ascontiguousarray(p.T)
        bs = bias
    else:
        order = np.argsort(labels, kind="stable")
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        psT = np.ascontiguousarray(p[order].T)
        bs = np.ascontiguousarray(bias[:, order])
    K = p.shape[1]
    if resid is None:
        us = None
        pf = np.empty((0, 0), dtype=np.float64)
        A = np.empty((0, 0, 0), dtype=np.float64)
        U = np.empty((0, 0), dtype=np.float64)
    else:
        us = np.ascontiguousarray(resid, dtype=np.float64)
        if order is not None:
            us = np.ascontiguousarray(us[order])
        pf = np.ascontiguousarray(psT, dtype=np.float64)
        A = np.empty((H, R, K), dtype=np.float64)
        U = np.empty((H, R), dtype=np.float64)

    m = np.empty((H, R), dtype=np.float64)
    S = np.empty((H, R, C), dtype=np.float64)
    Q = np.empty((H, R, C) if powers >= 2 else (0, 0, 0), dtype=np.float64)
    T = np.empty((H, R, C) if powers >= 3 else (0, 0, 0), dtype=np.float64)
    pairs = bool(pairs)
    D = np.empty((H, R, C) if pairs else (0, 0, 0), dtype=np.float64)
    if R > 0 and H > 0:
        nt = numba.get_num_threads()
        cost = n * (H + K / 4.0) + (0.0 if resid is None else n * H * (K + 1) / 4.0)
        for a, b in _chunks(row_start, row_stop, cost, nt):
            _loo_reduce_kernel(
                logq,
                psT,
                bs,
                seg_lo,
                seg_hi,
                pos,
                scale,
                powers,
                pairs,
                a,
                b,
                a - row_start,
                m,
                S,
                Q,
                T,
                D,
                4 * nt,
                pf,
                us,
                A,
                U,
            )
            if progress is not None:
                progress(b - row_start)
    out = (m, S, Q, T, D) if pairs else (m, S, Q, T)
    return out if resid is None else (*out, A, U)


# ---------------------------------------------------------------------------
# Multi-label pass: the class sums of B label sets (and centre weights) at once.
# ---------------------------------------------------------------------------
_DROP = -64.0  # terms more than 64 below the row max are dropped (kDrop of the engine)
# ... with centre weights, those more than 230 below (kClamp): a bootstrap replicate may
# hold only such terms for a row whose nearest centres it did not draw
_DROP_WEIGHTED = _CLAMP


@njit(parallel=True, **_JIT)
def _multi_kernel(
    logq,
    pT,
    m,
    labels,
    weights,
    scale,
    bias,
    powers,
    row_start,
    row_stop,
    out_off,
    S,
    Q,
    n_chunks,
    resid,
    U,
    floor,
):
    # Query rows [row_start, row_stop) go to output rows out_off + (j - row_start).
    # Terms with L_ij - m_j below `floor` are dropped (_DROP, or _DROP_WEIGHTED).
    # resid None (U then empty): no residual sums, compiled out (a pruned branch).
    K = pT.shape[0]
    n = pT.shape[1]
    B = labels.shape[0]
    R = row_stop - row_start
    nch = max(1, min(R, n_chunks))
    for ch in prange(nch):
        c0 = (R * ch) // nch
        c1 = (R * (ch + 1)) // nch
        acc = np.empty(n, dtype=pT.dtype)
        w = np.empty(n, dtype=np.float64)
        act = np.empty(n, dtype=np.int64)
        for rr in range(c0, c1):
            j = row_start + rr
            r = out_off + rr
            mj = m[j]
            for b in range(B):
                for c in range(S.shape[2]):
                    S[b, r, c] = 0.0
                    if powers >= 2:
                        Q[b, r, c] = 0.0
                if resid is not None:
                    U[b, r] = 0.0
            if mj == -np.inf:  # no centre at all
                continue
            # G_ij in the input dtype, k = 0 .. K-1
            lk = logq[j, 0]
            for i in range(n):
                acc[i] = lk * pT[0, i]
            for k in range(1, K):
                lk = logq[j, k]
                for i in range(n):
                    acc[i] = acc[i] + lk * pT[k, i]
            na = 0
            for i in range(n):
                x = (bias[i] + scale * np.float64(acc[i])) - mj
                if x >= floor and i != j:
                    w[na] = _exp_nonpos(min(x, -_CLAMP))
                    act[na] = i
                    na += 1
            for b in range(B):
                lab = labels[b]
                wb = weights[b]
                for t in range(na):
                    i = act[t]
                    v = wb[i] * w[t]
                    S[b, r, lab[i]] += v
                    if powers >= 2:
                        Q[b, r, lab[i]] += v * w[t]
                if resid is not None:
                    ub = resid[b]
                    su = 0.0
                    for t in range(na):
                        i = act[t]
                        su += ((wb[i] * w[t]) * w[t]) * ub[i]
                    U[b, r] = su


def _loo_reduce_multi(
    logq,
    p,
    m,
    labels,
    n_classes,
    scale,
    bias,
    weights,
    powers,
    row_start,
    row_stop,
    progress=None,
    resid=None,
):
    """Class sums of B label sets at once, for one bandwidth (numba backend).

    The twin of ``kdecal._core.loo_reduce_multi``.  For each query row ``j`` in
    ``[row_start, row_stop)``, each label set ``b`` and class ``c``::

        L_ij      = bias[i] + scale * sum_k logq[j, k] * p[i, k]
        w_ij      = exp(L_ij - m[j])          (m: the row max over i != j of L_ij)
        S[b, j, c] = sum_{i != j, labels[b, i] == c} weights[b, i] * w_ij
        Q[b, j, c] = sum_{i != j, labels[b, i] == c} weights[b, i] * w_ij ** 2
        U[b, j]    = sum_{i != j} weights[b, i] * w_ij ** 2 * resid[b, i]   (with ``resid``)

    Terms with ``L_ij - m[j] < -64`` (with ``weights``: ``< -230``) are dropped, as in
    the C++ engine; a row with ``m[j] = -inf`` gets zeros.

    Parameters
    ----------
    logq, p : ndarray, shape (n, K), float32 or float64 (same dtype), C-contiguous
    m : ndarray, shape (n,), float64
    labels : ndarray, shape (B, n), int64, values in ``[0, n_classes)``
    n_classes : int
    scale : float
        ``1 / h``.
    bias : ndarray, shape (n,), float64
    weights : ndarray, shape (B, n), float64, or None (all 1)
    powers : {1, 2}
    row_start, row_stop : int
        ``0 <= row_start <= row_stop <= n``.
    progress : callable or None
        Called after every chunk of rows with the number of rows done so far.
    resid : ndarray, shape (B, n), float64, or None
        Per-centre residuals of each set: also return ``U``.

    Returns
    -------
    S : ndarray, shape (B, R, n_classes), float64
    Q : ndarray, shape (B, R, n_classes), float64, or shape (0, 0, 0) if ``powers == 1``
    U : ndarray, shape (B, R), float64, only with ``resid``
        Summed over the same (not dropped) terms as ``Q``, in centre order.

    Notes
    -----
    Nothing is validated (the caller does).  Each row is reduced by one thread, in a
    fixed order, so results do not depend on the number of numba threads.  As in
    :func:`loo_reduce`, the rows go through in chunks of one kernel call each (after one
    shared setup), so that Ctrl-C is seen between two chunks.
    """
    powers = int(powers)
    row_start = int(row_start)
    row_stop = int(row_stop)
    C = int(n_classes)
    B = labels.shape[0]
    R = row_stop - row_start
    logq = np.ascontiguousarray(logq)
    pT = np.ascontiguousarray(np.asarray(p, dtype=logq.dtype).T)
    m = np.ascontiguousarray(m, dtype=np.float64)
    bias = np.ascontiguousarray(bias, dtype=np.float64)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    floor = _DROP if weights is None else _DROP_WEIGHTED
    if weights is None:
        weights = np.ones(labels.shape, dtype=np.float64)
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    S = np.zeros((B, R, C), dtype=np.float64)
    Q = np.zeros((B, R, C) if powers >= 2 else (0, 0, 0), dtype=np.float64)
    if resid is not None:
        resid = np.ascontiguousarray(resid, dtype=np.float64)
        U = np.zeros((B, R), dtype=np.float64)
    else:
        U = np.zeros((0, 0), dtype=np.float64)
    if R > 0 and B > 0:
        nt = numba.get_num_threads()
        K, n = pT.shape
        for a, b in _chunks(row_start, row_stop, n * (K / 4.0 + B), nt):
            _multi_kernel(
                logq,
                pT,
                m,
                labels,
                weights,
                float(scale),
                bias,
                powers,
                a,
                b,
                a - row_start,
                S,
                Q,
                4 * nt,
                resid,
                U,
                floor,
            )
            if progress is not None:
                progress(b - row_start)
    elif progress is not None and R > 0:
        progress(R)
    return (S, Q) if resid is None else (S, Q, U)


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block on ``n`` numba threads (0: numba's default), restoring the count after.

    ``n`` is capped at ``NUMBA_NUM_THREADS``, the most numba's thread pool holds.
    """
    old = numba.get_num_threads()
    try:
        if n > 0:
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        yield
    finally:
        numba.set_num_threads(old)


# ---------------------------------------------------------------------------
# The engine protocol (kdecal._engine.cpp): on the engine's thread count.
# ---------------------------------------------------------------------------


def loo_reduce(
    logq,
    p,
    labels,
    n_classes,
    scale,
    bias,
    powers,
    row_start,
    row_stop,
    progress=None,
    pairs=False,
    resid=None,
):
    """Run :func:`_loo_reduce` on one problem (n, K) or a batch (B, n, K) (the protocol).

    One call per problem of a batch, on the engine's thread count; ``progress`` counts
    the query rows over the batch.
    """
    if pairs and int(powers) < 2:
        raise ValueError(f"pairs=True needs powers >= 2, got powers = {powers}")
    with num_threads(_runtime._num_threads):
        if p.ndim == 2:
            kw = {} if resid is None else {"resid": resid}
            args = (logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop)
            return tuple(_loo_reduce(*args, progress=progress, pairs=pairs, **kw))
        rows = int(row_stop) - int(row_start)
        parts = []
        for b in range(p.shape[0]):
            cb = None
            if progress is not None:

                def cb(done, off=b * rows):
                    progress(off + done)

            kw = {} if resid is None else {"resid": resid[b]}
            parts.append(
                _loo_reduce(
                    logq[b],
                    p[b],
                    labels[b],
                    n_classes,
                    scale,
                    bias[b],
                    powers,
                    row_start,
                    row_stop,
                    progress=cb,
                    pairs=pairs,
                    **kw,
                )
            )
        return tuple(
            np.stack([x[k] for x in parts]) if parts[0][k].shape != (0, 0, 0) else parts[0][k]
            for k in range(len(parts[0]))
        )


def loo_reduce_multi(
    logq,
    p,
    m,
    labels,
    n_classes,
    scale,
    bias,
    weights,
    powers,
    row_start,
    row_stop,
    progress=None,
    resid=None,
):
    """Run :func:`_loo_reduce_multi` on the engine's thread count (the protocol)."""
    kw = {} if resid is None else {"resid": resid}
    with num_threads(_runtime._num_threads):
        return tuple(
            _loo_reduce_multi(
                logq,
                p,
                m,
                labels,
                n_classes,
                scale,
                bias,
                weights,
                powers,
                row_start,
                row_stop,
                progress=progress,
                **kw,
            )
        )


@njit(parallel=True, **_JIT)
def _weights_kernel(logq, psT, bias, m, scale, row_start, W):
    """Fill W (rows, n) with the kernel weights of query rows ``row_start ..``.

    Tiles of :data:`_TQ` rows in parallel; the K-dots by :func:`_dot_tile` (the input
    dtype, k = 0 .. K-1, as the reduction), so that a row's weights do not depend on
    the rows asked with it nor on the thread count.
    """
    rows = W.shape[0]
    n = W.shape[1]
    ntile = (rows + _TQ - 1) // _TQ
    for t in prange(ntile):
        q0 = t * _TQ
        tq = min(_TQ, rows - q0)
        G = np.empty((_TQ, n))
        acc = np.empty(_BLK, dtype=logq.dtype)
        _dot_tile(logq, row_start + q0, tq, psT, G, acc)
        for q in range(tq):
            j = row_start + q0 + q
            off = m[j]
            out = W[q0 + q]
            g = G[q]
            for i in range(n):
                x = bias[i] + scale * g[i] - off
                if not x >= _CLAMP:  # below exp(-230) of the row maximum (or NaN)
                    out[i] = 0.0
                else:
                    out[i] = math.exp(min(x, -_CLAMP))
            out[j] = 0.0  # leave-one-out


def kernel_weights(logq, p, m, scale, bias, row_start, row_stop):
    """Return the leave-one-out kernel weights of query rows ``[row_start, row_stop)``.

    The twin of ``kdecal._core.kernel_weights`` (the protocol): ``W`` (rows, n) float64
    with ``W[r, i] = exp(bias_i + scale * <logq_j, p_i> - m_j)`` for ``j = row_start +
    r``, 0 on the diagonal and below ``exp(-230)``, the exponent clamped at 230; the
    centres in their own order (``order = arange(n)``).  The K-dots are those of the
    reduction (the input dtype), so a row's weights are the same bits whatever rows
    and threads compute them.
    """
    n = p.shape[0]
    order = np.arange(n, dtype=np.int64)
    W = np.zeros((max(0, row_stop - row_start), n))
    if row_stop <= row_start:
        return W, order
    with num_threads(_runtime._num_threads):
        _weights_kernel(
            np.ascontiguousarray(logq),
            np.ascontiguousarray(p.T),
            np.ascontiguousarray(bias, dtype=np.float64),
            np.ascontiguousarray(m, dtype=np.float64),
            float(scale),
            int(row_start),
            W,
        )
    return W, order


def loo_grad(*args, **kwargs):
    """Refuse the backward pass, which the numba engine does not have (the protocol).

    Raises
    ------
    RuntimeError
        Always: the backward pass runs on the compiled core or the GPU.
    """
    raise RuntimeError(
        "the numba engine has no backward pass: kdecal.torch needs the compiled core "
        "or the GPU engine"
    )
