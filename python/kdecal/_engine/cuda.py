"""CUDA backend of the kdecal engine, written with numba-cuda.

The GPU twin of the compiled core's primitives, with the same accumulators, so that
every estimator on top is unchanged:

* :func:`loo_reduce`: per-query maximum ``m`` and per-class power sums ``S``, ``Q``,
  ``T`` and pair sums ``D`` of the leave-one-out Dirichlet-kernel reduction, for one or
  several bandwidths and a batch of problems (``kdecal._core.loo_reduce``);
* :func:`loo_reduce_multi`: the class sums of ``B`` label sets (and centre weights) at
  one bandwidth, for the bootstrap and the consistency resampling
  (``kdecal._core.loo_reduce_multi``);
* :func:`loo_grad`: the streaming backward pass of the leave-one-out conditional
  expectation (``kdecal._core.loo_grad``);
* :func:`kernel_bias`: the per-centre bias ``-sum_k lgamma(p_ik / h + 1)``.

The kernels are compiled by numba-cuda at first use (one specialisation per number of
coordinates ``K``, dtype and options) and run unchanged under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, set before numba is imported), where the tests run them on
the CPU.

Layout.  One thread per query row; the centres of each problem are put in class order
once per call (on the device) and stream through shared memory in tiles of
:data:`TILE` centres, transposed (``K x TILE``), so that every thread of a block reads
the same centre at the same time (a broadcast).  Each thread keeps its query's
``log q`` in registers, computes the K-dot, the log-kernel ``L_ij`` in float64 and,
class by class in one pass, the sums of ``exp(L_ij - M)`` (clamped at ``-230`` as in
the numba engine, so that no subnormal enters the cubes), their squares and cubes,
relative to the running class maximum ``M``: the terms below it are summed, the terms
equal to it counted, so that the pair sums ``D = S^2 - Q`` come without cancellation,
and a new maximum rescales what was summed (see :func:`_forward_kernel_qb`).  A second,
O(nC) kernel puts the class sums relative to the row maximum.  The passes that need
neither powers, pair sums nor residual sums (``powers == 1``: the bandwidth searches, the
plug-in L1 and KL estimates), for ``K <=`` :data:`LEAN_MAX_K`, run a leaner kernel with the
same outputs (:func:`_lean_kernel`: about half the instructions per pair); those with
squared, pair or residual sums (``powers <= 2``: the default residual estimate's own
pass), for ``K <=`` :data:`LEAN_SUMS_MAX_K`, run its twin with those sums
(:func:`_lean_sums_kernel`); ``powers == 3`` and larger K the general kernel.  Nothing of size
``n x n`` is formed: memory is ``O(B n (K + H C))``.

Precision.  The dtype of ``logq`` and ``p`` chooses the mode:

* float64: everything in float64.  Agrees with the CPU engine to about 1e-13 relative
  (the log-kernel's own rounding, ``eps * |L_ij|``, and the order of the sums).
* float32 ("fast"): the K-dot and the exponential in float32, the log-kernel, the
  maxima and every sum in float64.  The K-dot is taken of the differences from the
  query's own point, ``sum_k log q_jk (p_ik - p_jk)``, with the query's part
  ``sum_k log q_jk p_jk`` added in float64, so that its rounding is relative to the
  small differences of the centres near the query, which carry the weight.  A weight
  ``exp(L - M)`` is then off by about ``u32 (scale sum_k |log q_jk| |p_ik - p_jk| +
  |L - M|)`` relative (``u32 = 6e-8``).  Measured against the float64 engine on the same
  float32 inputs (``bench/gpu.py`` on five real files): ``E = S / sum S`` within
  1.0e-5 at ``h >= 0.01`` (8e-7 at 0.1) and within 3e-6 to 7.7e-5 at ``h = 1e-3``
  (2.0e-4 on synthetic points with K = 100).  Therefore float32 inputs run the fast
  mode only where every bandwidth is at least :data:`FAST_MIN_H` (0.01); below it they
  are converted to float64 on the device and run the float64 mode (about twice the time
  of the fast mode).  The rounding of the inputs to float32 adds about as much again at
  ``h = 1e-3``; the compiled core's float32 mode rounds its inputs the same way.

Arrays.  NumPy arrays are copied to the device and the results back.  Objects with
``__cuda_array_interface__`` (torch CUDA tensors, CuPy, numba device arrays) are used
in place; the functions with ``device_out=True`` return numba device arrays, which torch
and CuPy wrap without a copy (``torch.as_tensor(x, device="cuda")``).  Only the labels
(``n`` integers per problem) travel to the host and back, to build the class order.

Interruption.  Query rows go through in launches of about :data:`LAUNCH_PAIRS` kernel
evaluations, synchronised one by one, so that progress is reported and Ctrl-C
(``KeyboardInterrupt``) is seen between two launches.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import config as _numba_config
from numba import cuda, float32, float64

# Small problems launch few blocks on purpose; numba would warn on each such launch.
_numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

__all__ = [
    "is_available",
    "kernel_bias",
    "loo_grad",
    "loo_reduce",
    "loo_reduce_multi",
]

#: Under the simulator every thread of a block is a Python thread: small blocks.
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"

#: Threads per block (query rows per block) and centres per shared-memory tile.
TILE = 8 if SIMULATOR else 128

#: Query rows per thread of the forward kernel. One: at K = 10, two and four rows per
#: thread (fewer shared-memory reads per pair, more registers) were 5-19 % and 8-95 %
#: slower on an H100 and an H200 (``bench/gpu.py``, "variants").
QUERIES_PER_THREAD = 1

#: Layout of a centre tile in shared memory: True, ``(TILE, KP)`` with K padded to whole
#: 16-byte words, so that one centre's coordinates are contiguous and aligned and the
#: compiler reads them with vector loads; False, ``(K, TILE)``. Rows were 4-10 % faster
#: on an H200 at K = 10 (``bench/gpu.py``, "variants").
CENTRE_ROWS = True

#: Threads (query rows) per block of the forward kernel, and the centres of its tiles.
FORWARD_TILE = TILE

#: Compile the fast mode's forward kernel with fast math (the approximate ``exp``).
FAST_MATH = False

#: Blocks that share each query row's centres (None: enough to fill the card's resident
#: threads when the query rows of a launch do not, at most 8): a launch of few rows then
#: keeps every SM busy, and :data:`_merge` combines the partial sums.
CENTRE_SPLITS: int | None = None

#: Most bytes of partial sums a split launch may hold (5 float64 per row, class, split).
SPLIT_MEMORY = 2**28

#: Kernel evaluations (query rows x centres x bandwidths) per launch: a launch of this
#: many takes about 0.1-0.5 s on a current GPU, so that Ctrl-C is seen within a second.
LAUNCH_PAIRS = 2e11

#: Smallest bandwidth at which float32 inputs run the fast mode: below it, where the
#: float32 K-dot's rounding (which grows as 1/h) exceeds 1e-5 of E on real predictions
#: (7.7e-5 on CIFAR-100 at h = 1e-3; 1.0e-5 at h = 0.01, ``bench/README.md``), they are
#: converted to float64 on the device and run the float64 mode.
FAST_MIN_H = 0.01

#: Log-kernel differences below this are clamped (exp(-3 * 230) is still a normal double).
_CLAMP = -230.0

#: Terms below this (relative to the row maximum) are dropped by the multi-label pass,
#: as in the compiled core (each is below 1.6e-28 of the largest term); with centre
#: weights (bootstrap multiplicities) those below ``_CLAMP``: a replicate that draws none
#: of a row's nearest centres holds only terms far below the full sample's maximum.
_DROP = -64.0

#: The float32 exp of the fast mode is used down to this; below it (where float32
#: underflows) the multi-label pass with centre weights takes the float64 exp.
_FAST_EXP_MIN = -80.0

_INF = math.inf


def is_available() -> bool:
    """Whether a CUDA device (or numba's CUDA simulator) is usable."""
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver or toolkit reads as no device
        return False


# ----------------------------------------------------------------------- array helpers


def _on_device(a: object) -> bool:
    """Tell whether ``a`` lives on a CUDA device.

    True for ``__cuda_array_interface__`` objects and numba device arrays (also the
    simulator's).
    """
    return hasattr(a, "__cuda_array_interface__") or hasattr(a, "copy_to_host")


def _dev(a: Any) -> Any:
    """Return a device view of ``a`` (no copy for CUDA arrays), or a device copy."""
    if hasattr(a, "copy_to_host"):  # a numba device array (the simulator's too)
        return a
    if hasattr(a, "__cuda_array_interface__"):
        return cuda.as_cuda_array(a)
    return cuda.to_device(np.ascontiguousarray(a))


def _host(a: Any) -> np.ndarray:
    if _on_device(a):
        return np.asarray(_dev(a).copy_to_host())
    return np.asarray(a)


@cuda.jit
def _to_f64(src, dst):  # pragma: no cover - runs on the device
    i = cuda.grid(1)
    if i < src.shape[0]:
        dst[i] = src[i]


def _precise(max_scale: float, *arrays: Any) -> tuple[Any, ...]:
    """Return the arrays as they run, on the device.

    Float32 ones become float64 where a bandwidth is below :data:`FAST_MIN_H`
    (``max_scale > 1 / FAST_MIN_H``), converted on the device.
    """
    devs = [_dev(a) for a in arrays]
    if not (max_scale > 1.0 / FAST_MIN_H and any(d.dtype == np.float32 for d in devs)):
        return tuple(devs)
    out = []
    for d in devs:
        if d.dtype == np.float64:
            out.append(d)
        elif d.is_c_contiguous() and d.size:
            flat = d.reshape(d.size)
            f64 = cuda.device_array(d.size, dtype=np.float64)
            _to_f64[(d.size + TILE - 1) // TILE, TILE](flat, f64)
            out.append(f64.reshape(d.shape))
        else:
            out.append(cuda.to_device(np.ascontiguousarray(_host(d), dtype=np.float64)))
    return tuple(out)


def _launch_rows(n: int, per_row: float, unit: int = TILE) -> int:
    """Return the query rows per launch.

    About :data:`LAUNCH_PAIRS` kernel evaluations, in whole blocks of ``unit`` rows.
    """
    rows = int(LAUNCH_PAIRS / max(1.0, n * per_row))
    return max(unit, (rows // unit) * unit)


def _class_order(labels: Any, n_classes: int) -> tuple[Any, Any, Any]:
    """Return the class order of each problem, on the device.

    ``order`` (B, n) (sorted position -> row), ``pos`` (B, n) (row -> sorted position)
    and the segment bounds ``seg`` (B, C + 1); stable, so that ties keep the row order.
    """
    lab = _host(labels).astype(np.int64, copy=False)
    order = np.argsort(lab, axis=-1, kind="stable")
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(lab.shape[-1])[None, :], axis=-1)
    counts = np.stack([np.bincount(r, minlength=n_classes)[:n_classes] for r in lab])
    seg = np.zeros((lab.shape[0], n_classes + 1), dtype=np.int64)
    np.cumsum(counts, axis=-1, out=seg[:, 1:])
    return cuda.to_device(order), cuda.to_device(pos), cuda.to_device(seg)


# ---------------------------------------------------------------------------- kernels


@cuda.jit
def _gather_T(src, order, dst):  # pragma: no cover - runs on the device
    # dst[b, k, i] = src[b, order[b, i], k]: the centres in class order, transposed
    i, b = cuda.grid(2)
    if b < src.shape[0] and i < src.shape[1]:
        r = order[b, i]
        for k in range(src.shape[2]):
            dst[b, k, i] = src[b, r, k]


@cuda.jit
def _gather_bias(src, order, dst):  # pragma: no cover - runs on the device
    # dst[b, t, i] = src[b, t, order[b, i]]
    i, b = cuda.grid(2)
    if b < src.shape[0] and i < src.shape[2]:
        r = order[b, i]
        for t in range(src.shape[1]):
            dst[b, t, i] = src[b, t, r]


@cuda.jit
def _gather_rows(src, order, dst):  # pragma: no cover - runs on the device
    # dst[b, i] = src[b, order[b, i]]
    i, b = cuda.grid(2)
    if b < src.shape[0] and i < src.shape[1]:
        dst[b, i] = src[b, order[b, i]]


@cuda.jit
def _query_shift(logq, p, cj):  # pragma: no cover - runs on the device
    # cj[b, j] = sum_k logq[b, j, k] p[b, j, k] in float64 (the fast mode's shift)
    j, b = cuda.grid(2)
    if b < p.shape[0] and j < p.shape[1]:
        acc = 0.0
        for k in range(p.shape[2]):
            acc += float64(logq[b, j, k]) * float64(p[b, j, k])
        cj[b, j] = acc


@cuda.jit
def _bias_kernel(p, scale, out):  # pragma: no cover - runs on the device
    # out[t, r] = -sum_k lgamma(p[r, k] * scale[t] + 1)
    r, t = cuda.grid(2)
    if t < scale.shape[0] and r < p.shape[0]:
        s = scale[t]
        acc = 0.0
        for k in range(p.shape[1]):
            acc -= math.lgamma(float64(p[r, k]) * s + 1.0)
        out[t, r] = acc


def _forward_kernel(
    K: int, fast: bool, powers: int, pairs: bool, split: bool = False, resid: bool = False
) -> tuple[Any, int]:
    """Return the forward kernel for K coordinates, and its query rows per thread."""
    qb = int(QUERIES_PER_THREAD)
    fm = bool(FAST_MATH) and fast
    tb = FORWARD_TILE
    kern = _forward_kernel_qb(
        K, fast, powers, pairs, qb, bool(CENTRE_ROWS), tb, fm, split, bool(resid)
    )
    return kern, qb


def _centre_splits(threads: int, part_bytes: float) -> int:
    """How many blocks share each query row's centres (:data:`CENTRE_SPLITS`)."""
    if CENTRE_SPLITS is not None:
        return int(CENTRE_SPLITS)
    if SIMULATOR:  # no device to fill
        return 1
    sms = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    if threads <= 0:
        return 1
    ns = -(-sms * 2048 // threads)  # fill the card's resident threads
    ns = min(ns, 8, int(SPLIT_MEMORY // max(part_bytes, 1.0)))
    return max(1, ns)


@functools.cache
def _forward_kernel_qb(
    K: int,
    fast: bool,
    powers: int,
    pairs: bool,
    QB: int,
    rows: bool = False,
    TB: int = TILE,
    fastmath: bool = False,
    split: bool = False,
    resid: bool = False,
) -> Any:
    """Compile the forward kernel for K coordinates and QB query rows per thread.

    K is a compile-time constant, so that each thread keeps its queries' ``log q`` in
    registers; each thread holds ``QB`` query rows, so that every centre read from
    shared memory serves QB K-dots (:data:`QUERIES_PER_THREAD`).  One pass over the centres of each class
    with an online maximum: the sums are kept relative to the running class maximum
    ``M`` as the terms below it (``x1 = sum e``, ``x2 = sum e^2``, ``x3 = sum e^3``) and
    the count of terms equal to it (``ties``), so that ``S_c = x1 + ties`` and the pair
    sums ``D = S^2 - Q = (2 e1 - e2) + e1^2`` with ``e1 = x1 + ties - 1``,
    ``e2 = x2 + ties - 1`` come without cancellation; a new maximum rescales them
    (rarely: about log n_c times per class in random order).  The class sums are written
    relative to their class maximum (kept in ``mc``); :data:`_rescale` puts them
    relative to the row maximum afterwards.

    ``split``: block ``z`` of ``gridDim.z`` takes its share of each class's centres and
    writes its partial maximum, sums and ties to ``part`` (NS, 5, B, R, C); :data:`_merge`
    combines them.  This fills the card when there are too few query rows for it.

    ``resid``: also the residual sums ``A_k = sum e p_ik`` and ``U = sum e^2 u_i`` over
    the same terms ``e`` (centres ``pT`` and residuals ``us`` in class order), kept per
    class relative to the running class maximum (a term at the maximum adds ``p_ik``,
    ``u_i``; a new maximum rescales like ``x1``, ``x2``).  At the end of each class they
    are folded into ``A``, ``U`` relative to the running row maximum (rescaled when a
    class has a larger maximum), so that they are written relative to the row maximum
    directly (:data:`_rescale` leaves them); with ``split``, each block writes its
    class partials to ``partA`` (NS, B, R, C, K) and ``partU`` (NS, B, R, C) instead.
    Without ``resid`` the kernel is the plain one (the flag is a compile-time constant).

    Fast mode: the K-dot is taken of the differences from the query's own point,
    ``G'_ij = sum_k log q_jk (p_ik - p_jk)`` in float32, and
    ``L_ij = bias_i + scale * (c_j + G'_ij)`` in float64 with
    ``c_j = sum_k log q_jk p_jk`` computed in float64 beforehand: the terms of ``G'``
    are small for the centres near the query, which carry the weight, so the float32
    rounding of the dot is relative to ``|G'|``, not to ``|G|``.
    """
    dt = float32 if fast else float64
    per_word = 4 if fast else 2  # values per 16 bytes
    KP = -(-K // per_word) * per_word
    KA = K if resid else 1  # residual sums' scratch (a placeholder without resid)

    @cuda.jit(device=True, inline=True)
    def expd(x):  # pragma: no cover - runs on the device
        if fast:
            return float64(math.exp(float32(x)))
        return math.exp(x)

    @cuda.jit(fastmath=fastmath)
    def kern(
        logq,
        pq,
        cj,
        pT,
        bs,
        seg,
        pos,
        scale,
        t,
        row0,
        row1,
        mc,
        m_out,
        S,
        Q,
        T,
        D,
        part,
        us,
        A,
        U,
        partA,
        partU,
    ):
        # logq, pq (B, n, K) and cj (B, n) in query order; pT (B, K, n), bs (B, H, n) and
        # us (B, n) in class order; seg (B, C + 1); pos (B, n); launch row r is query
        # row0 + r: mc (B, R, C) and the outputs (B, H, R[, C or K]) are this launch's rows.
        b = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        first = row0 + cuda.blockIdx.x * (TB * QB)
        C = seg.shape[1] - 1
        psh = cuda.shared.array((TB, KP) if rows else (K, TB), dt)
        bsh = cuda.shared.array(TB, float64)
        lq = cuda.local.array((QB, K), dt)
        pv = cuda.local.array((QB, K), dt)
        pj = cuda.local.array(QB, np.int64)
        sc = cuda.local.array(QB, float64)
        mrow = cuda.local.array(QB, float64)
        Mc = cuda.local.array(QB, float64)
        x1 = cuda.local.array(QB, float64)
        x2 = cuda.local.array(QB, float64)
        x3 = cuda.local.array(QB, float64)
        ties = cuda.local.array(QB, float64)
        ush = cuda.shared.array(TB, float64)
        xa = cuda.local.array((QB, KA), float64)
        xu = cuda.local.array(QB, float64)
        st = scale[t]
        for q in range(QB):
            j = first + q * TB + tid
            mrow[q] = -_INF
            if j < row1:
                pj[q] = pos[b, j]
                sc[q] = st * cj[b, j] if fast else 0.0
                for k in range(K):
                    lq[q, k] = logq[b, j, k]
                    pv[q, k] = pq[b, j, k] if fast else 0
                if resid and not split:
                    for k in range(K):
                        A[b, t, j - row0, k] = 0.0
                    U[b, t, j - row0] = 0.0
            else:  # no query: matches no centre position, its sums are never written
                pj[q] = -1
                sc[q] = 0.0
                for k in range(K):
                    lq[q, k] = 0
                    pv[q, k] = 0
        sp = cuda.blockIdx.z
        nsp = cuda.gridDim.z
        for c in range(C):
            lo = seg[b, c]
            hi = seg[b, c + 1]
            if split:  # this block's share of the class's centres
                span = hi - lo
                hi = lo + (span * (sp + 1)) // nsp
                lo = lo + (span * sp) // nsp
            for q in range(QB):
                Mc[q] = -_INF
                x1[q] = 0.0
                x2[q] = 0.0
                x3[q] = 0.0
                ties[q] = 0.0
                if resid:
                    for k in range(K):
                        xa[q, k] = 0.0
                    xu[q] = 0.0
            for i0 in range(lo, hi, TB):
                w = min(TB, hi - i0)
                if tid < w:
                    for k in range(K):
                        if rows:
                            psh[tid, k] = pT[b, k, i0 + tid]
                        else:
                            psh[k, tid] = pT[b, k, i0 + tid]
                    bsh[tid] = bs[b, t, i0 + tid]
                    if resid:
                        ush[tid] = us[b, i0 + tid]
                cuda.syncthreads()
                for ii in range(w):
                    bi = bsh[ii]
                    for q in range(QB):
                        if rows:
                            if fast:
                                g = lq[q, 0] * (psh[ii, 0] - pv[q, 0])
                                for k in range(1, K):
                                    g = cuda.fma(lq[q, k], psh[ii, k] - pv[q, k], g)
                            else:
                                g = lq[q, 0] * psh[ii, 0]
                                for k in range(1, K):
                                    g += lq[q, k] * psh[ii, k]
                        elif fast:
                            g = lq[q, 0] * (psh[0, ii] - pv[q, 0])
                            for k in range(1, K):
                                g = cuda.fma(lq[q, k], psh[k, ii] - pv[q, k], g)
                        else:
                            g = lq[q, 0] * psh[0, ii]
                            for k in range(1, K):
                                g += lq[q, k] * psh[k, ii]
                        L = cuda.fma(st, float64(g), bi + sc[q])
                        if i0 + ii != pj[q]:
                            d = L - Mc[q]
                            if d > 0.0:  # a new class maximum (the first term too)
                                r = math.exp(-d)
                                x1[q] = (x1[q] + ties[q]) * r
                                if powers >= 2 or pairs:
                                    x2[q] = (x2[q] + ties[q]) * (r * r)
                                if powers >= 3:
                                    x3[q] = (x3[q] + ties[q]) * (r * r * r)
                                if resid:  # the new maximum's own term is 1
                                    for k in range(K):
                                        pik = psh[ii, k] if rows else psh[k, ii]
                                        xa[q, k] = xa[q, k] * r + float64(pik)
                                    xu[q] = xu[q] * (r * r) + ush[ii]
                                ties[q] = 1.0
                                Mc[q] = L
                            elif d == 0.0:
                                ties[q] += 1.0
                                if resid:
                                    for k in range(K):
                                        pik = psh[ii, k] if rows else psh[k, ii]
                                        xa[q, k] += float64(pik)
                                    xu[q] += ush[ii]
                            else:
                                e = expd(max(d, _CLAMP))
                                x1[q] += e
                                if powers >= 2 or pairs:
                                    x2[q] += e * e
                                if powers >= 3:
                                    x3[q] += e * e * e
                                if resid:
                                    for k in range(K):
                                        pik = psh[ii, k] if rows else psh[k, ii]
                                        xa[q, k] += e * float64(pik)
                                    xu[q] += (e * e) * ush[ii]
                cuda.syncthreads()
            for q in range(QB):
                j = first + q * TB + tid
                if split and j < row1:
                    r = j - row0
                    part[sp, 0, b, r, c] = Mc[q]
                    part[sp, 1, b, r, c] = x1[q]
                    part[sp, 2, b, r, c] = x2[q]
                    part[sp, 3, b, r, c] = x3[q]
                    part[sp, 4, b, r, c] = ties[q]
                    if resid:
                        for k in range(K):
                            partA[sp, b, r, c, k] = xa[q, k]
                        partU[sp, b, r, c] = xu[q]
                elif j < row1:
                    r = j - row0
                    mc[b, r, c] = Mc[q]
                    if resid and Mc[q] > -_INF:  # fold the class into the row's sums
                        if Mc[q] > mrow[q]:  # a larger maximum: rescale the row's sums
                            f = math.exp(mrow[q] - Mc[q])
                            for k in range(K):
                                A[b, t, r, k] = A[b, t, r, k] * f + xa[q, k]
                            U[b, t, r] = U[b, t, r] * (f * f) + xu[q]
                        else:
                            f = math.exp(Mc[q] - mrow[q])
                            for k in range(K):
                                A[b, t, r, k] += xa[q, k] * f
                            U[b, t, r] += xu[q] * (f * f)
                    mrow[q] = max(mrow[q], Mc[q])
                    S[b, t, r, c] = x1[q] + ties[q]
                    if powers >= 2:
                        Q[b, t, r, c] = x2[q] + ties[q]
                    if powers >= 3:
                        T[b, t, r, c] = x3[q] + ties[q]
                    if pairs:
                        e1 = x1[q] + (ties[q] - 1.0)
                        e2 = x2[q] + (ties[q] - 1.0)
                        D[b, t, r, c] = (2.0 * e1 - e2) + e1 * e1
        for q in range(QB):
            j = first + q * TB + tid
            if j < row1 and not split:
                m_out[b, t, j - row0] = mrow[q]

    return kern


@cuda.jit
def _merge(
    part, t, mc, m, S, Q, T, D, powers, pairs, partA, partU, A, U, resid
):  # pragma: no cover - on the device
    # combine the partial class maxima, sums and ties of the centre splits; write the class
    # sums relative to their class maximum (mc) and the row maximum m, as the kernel does;
    # with resid, the residual sums of every split and class relative to the row maximum
    r, b = cuda.grid(2)
    if b < mc.shape[0] and r < mc.shape[1]:
        ns = part.shape[0]
        mrow = -_INF
        for c in range(mc.shape[2]):
            M = -_INF
            for s in range(ns):
                M = max(M, part[s, 0, b, r, c])
            x1 = 0.0
            x2 = 0.0
            x3 = 0.0
            ties = 0.0
            if M > -_INF:
                for s in range(ns):
                    ms = part[s, 0, b, r, c]
                    if ms == M:  # its ties are at the class maximum
                        x1 += part[s, 1, b, r, c]
                        x2 += part[s, 2, b, r, c]
                        x3 += part[s, 3, b, r, c]
                        ties += part[s, 4, b, r, c]
                    elif ms > -_INF:  # all its terms are below the maximum
                        f = math.exp(ms - M)
                        tt = part[s, 4, b, r, c]
                        x1 += (part[s, 1, b, r, c] + tt) * f
                        x2 += (part[s, 2, b, r, c] + tt) * (f * f)
                        x3 += (part[s, 3, b, r, c] + tt) * (f * f * f)
            mc[b, r, c] = M
            mrow = max(mrow, M)
            S[b, t, r, c] = x1 + ties
            if powers >= 2:
                Q[b, t, r, c] = x2 + ties
            if powers >= 3:
                T[b, t, r, c] = x3 + ties
            if pairs:
                e1 = x1 + (ties - 1.0)
                e2 = x2 + (ties - 1.0)
                D[b, t, r, c] = (2.0 * e1 - e2) + e1 * e1
        m[b, t, r] = mrow
        if resid:
            for k in range(A.shape[3]):
                A[b, t, r, k] = 0.0
            u = 0.0
            for c in range(mc.shape[2]):
                for s in range(ns):
                    ms = part[s, 0, b, r, c]
                    if ms > -_INF:
                        f = math.exp(ms - mrow)
                        for k in range(A.shape[3]):
                            A[b, t, r, k] += partA[s, b, r, c, k] * f
                        u += partU[s, b, r, c] * (f * f)
            U[b, t, r] = u


@cuda.jit
def _rescale(mc, t, m, S, Q, T, D, powers, pairs):  # pragma: no cover - runs on the device
    # class sums relative to the class maximum -> relative to the row maximum
    r, b = cuda.grid(2)
    if b < mc.shape[0] and r < mc.shape[1]:
        mr = m[b, t, r]
        for c in range(mc.shape[2]):
            v = mc[b, r, c]
            f = v - mr if v > -_INF else 0.0
            e = math.exp(f) if v > -_INF else 0.0
            S[b, t, r, c] *= e
            if powers >= 2:
                Q[b, t, r, c] *= e * e
            if powers >= 3:
                T[b, t, r, c] *= e * e * e
            if pairs:
                D[b, t, r, c] *= e * e


# ------------------------------------------------------- the lean forward kernel (powers 1)

#: Use the lean forward kernel (:func:`_lean_kernel`) where it applies: ``powers == 1``,
#: no pair sums, no residual sums (the searches' passes, the plug-in
#: estimator's L1 and KL estimates). False: always the general kernel (:func:`_forward_kernel_qb`).
LEAN = True

#: Threads (query rows) per block of the lean kernel, and the centres of its tiles.
LEAN_TILE = 8 if SIMULATOR else 128

#: Query rows per thread of the lean kernel (each centre read from shared memory serves
#: this many K-dots) and centres per group (one test for a new maximum per group), per
#: mode. Measured on an H100 at K = 10, n = 10^6 (``bench/gpu.py``, "lean"): fast
#: (1, 8) 1.51 s, (2, 4) 1.59 s, (1, 4) 1.67 s, (2, 8) 1.85 s; float64 (1, 4) 2.88 s,
#: (1, 8) 2.90 s, (2, 4) 3.05 s, (2, 8) 3.66 s (the general kernel: 3.00 s and 4.12 s).
LEAN_SHAPE = {True: (1, 8), False: (1, 4)}

#: Most coordinates K for which the lean kernel is used: each thread keeps its query's
#: ``log q`` (and in the fast mode ``p``) in registers, which spill to local memory for
#: large K. Measured on an H100 at n = 10^5 (``bench/gpu.py``, "leank"; lean vs general,
#: fast / float64): K = 10 25.7 vs 38.6 / 40.2 vs 51.6 ms, K = 40 58.8 vs 79.6 / 77.9 vs
#: 97.4 ms, K = 60 110.7 vs 96.8 / 114.6 vs 118.9 ms, K = 100 159.7 vs 174.7 / 246.5 vs
#: 219.1 ms.
LEAN_MAX_K = 40

#: Partial sums per thread of the lean kernel's tile (interleaved), in the fast mode's
#: float32: they bound the rounding of a tile's sum by ``(LEAN_TILE / LEAN_ACC) u32``.
LEAN_ACC = 4

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453

if SIMULATOR:  # plain Python there (and math.exp2 is Python 3.11's)

    def _exp2(x: float) -> float:
        return float(2.0**x)

    _exp2f = _exp2
else:  # libdevice's exp2 (double) and exp2f (ex2.approx with the subnormal fix-up)
    from numba.cuda import libdevice as _libdevice

    _exp2 = _libdevice.exp2
    _exp2f = _libdevice.exp2f


def _padded_class_order(labels: Any, n_classes: int, tile: int) -> tuple[Any, Any, Any]:
    """Class order with each class padded to whole tiles, on the device.

    ``order`` (B, Np) (padded sorted position -> row, ``-1`` for padding), ``pos``
    (B, n) (row -> padded sorted position) and the padded segment bounds ``seg``
    (B, C + 1), multiples of ``tile``; stable, so that ties keep the row order.
    """
    lab = _host(labels).astype(np.int64, copy=False)
    Bn, n = lab.shape
    counts = np.stack([np.bincount(r, minlength=n_classes)[:n_classes] for r in lab])
    padded = -(-counts // tile) * tile
    seg = np.zeros((Bn, n_classes + 1), dtype=np.int64)
    np.cumsum(padded, axis=-1, out=seg[:, 1:])
    Np = max(1, int(seg[:, -1].max()))
    order = np.full((Bn, Np), -1, dtype=np.int64)
    pos = np.empty((Bn, n), dtype=np.int64)
    for b in range(Bn):
        srt = np.argsort(lab[b], kind="stable")
        start = np.zeros(n_classes, dtype=np.int64)
        start[:] = seg[b, :-1]
        first = np.concatenate([[0], np.cumsum(counts[b])[:-1]])
        # position of the r-th sorted row: its class's padded start + rank in class
        rank = np.arange(n) - first[lab[b, srt]]
        where = start[lab[b, srt]] + rank
        order[b, where] = srt
        pos[b, srt] = where
    return cuda.to_device(order), cuda.to_device(pos), cuda.to_device(seg)


def _lean_inputs(
    dlogq: Any, dp: Any, dbias: Any, labels: Any, C: int, H: int, TB: int
) -> tuple[Any, ...]:
    """Put the lean kernels' inputs on the device, classes padded to whole tiles of ``TB``.

    Returns ``order``, ``pos``, ``seg`` (:func:`_padded_class_order`), the centres ``pT``
    (B, K, Np) and their biases as head and tail ``bh``, ``bl`` (B, H, Np) in padded class
    order (in log2 units in the fast mode), the fast mode's query shifts ``cj`` (B, n),
    and the launch grid of the gathers.
    """
    Bn, n, K = (int(s) for s in dp.shape)
    fast = dp.dtype == np.float32
    order, pos, seg = _padded_class_order(labels, C, TB)
    Np = int(order.shape[1])
    pT = cuda.device_array((Bn, K, Np), dtype=dp.dtype)
    bh = cuda.device_array((Bn, H, Np), dtype=dp.dtype)
    bl = cuda.device_array((Bn, H, Np), dtype=np.float32 if fast else np.float64)
    cj = cuda.device_array((Bn, n), dtype=np.float64)
    grid = ((max(n, Np) + TILE - 1) // TILE, Bn)
    _gather_lean[grid, (TILE, 1)](dp, dbias, order, _LOG2E if fast else 1.0, pT, bh, bl)
    if fast:
        _query_shift[grid, (TILE, 1)](dlogq, dp, cj)
    return order, pos, seg, pT, bh, bl, cj, grid


@cuda.jit
def _gather_lean(p, bias, order, unit, pT, bh, bl):  # pragma: no cover - on the device
    # pT[b, k, i] = p[b, order[b, i], k] (0 for padding); the bias times unit (log2(e) in
    # the fast mode) as bh + bl: float32 head and tail in the fast mode (bl unused in
    # float64), -inf for padding
    i, b = cuda.grid(2)
    if b < pT.shape[0] and i < pT.shape[2]:
        r = order[b, i]
        for k in range(pT.shape[1]):
            pT[b, k, i] = p[b, r, k] if r >= 0 else 0
        for t in range(bias.shape[1]):
            if r < 0:
                bh[b, t, i] = -_INF
                bl[b, t, i] = 0
            else:
                v = bias[b, t, r] * unit
                bh[b, t, i] = v
                bl[b, t, i] = v - float64(bh[b, t, i])


@functools.cache
def _lean_kernel(
    K: int, fast: bool, split: bool = False, QB: int = 1, NG: int = 8, TB: int = LEAN_TILE
) -> Any:
    """Compile the lean forward kernel: ``m`` and ``S`` only (``powers == 1``).

    Each thread holds ``QB`` query rows; the centres of each class stream through
    shared memory in tiles of ``TB`` (each class padded to whole tiles with centres of
    log-kernel ``-inf``, so that every tile is full and the loops over it have constant
    trip counts).  Each query keeps a running row maximum ``M`` and sums
    ``exp(L_ij - M)``; the terms come in groups of ``NG`` centres, and a group with a
    term above ``M`` (rare: about ``log n`` times per row in random order) sets ``M``
    to its largest term and rescales what was summed.  Unlike
    :func:`_forward_kernel_qb`, it neither counts the terms equal to the maximum nor
    forms powers or pair sums: a term at ``M`` adds ``exp(0) = 1``.  The class sums
    are written relative to ``M`` at the end of their class (``mc``), as the general
    kernel writes them relative to its class maximum, so that :data:`_rescale` and
    :data:`_merge` finish both alike.

    Fast mode (float32 ``logq``, ``p``): the K-dot of the differences from the query's
    own point ``G'_ij = sum_k log q_jk (p_ik - p_jk)`` (as the general kernel), the
    log-kernel relative to ``M`` in float32 as ``(s G'_ij + (bh_i + dh_j)) +
    (s_lo G'_ij + (bl_i + dl_j))``, where ``bh + bl`` is the centre's bias and ``dh + dl`` the query's
    ``s c_j - M``, and ``s`` as well (each a float32 head and tail of a float64 value,
    so that the difference of the two large heads is exact (by Sterbenz's lemma:
    they are within a factor 2 of each other for every centre that carries weight),
    and ``s G'`` plus that difference, which cancel to the small log-weight, is
    rounded once, by a fused multiply-add; at small bandwidths both ``s G'`` and the
    difference of the biases reach hundreds for the near centres, and a float32
    rounding of either alone would cost ``u32`` times that), all in log2 units, ``exp2`` as ``ex2.approx`` (relative error below 2^-22),
    and each tile's
    terms summed in :data:`LEAN_ACC` interleaved float32 partial sums, added to a
    float64 sum per tile.  Float64 mode: the log-kernel, ``exp`` and the sums in
    float64, as the general kernel.
    """
    dt = float32 if fast else float64
    per_word = 4 if fast else 2
    KP = -(-K // per_word) * per_word
    NA = LEAN_ACC
    BIG = 1e30  # "s c_j - M" before the first term: every first group sets M

    @cuda.jit
    def kern(logq, pq, cj, pT, bh, bl, seg, pos, scale, t, row0, row1, mc, m_out, S, part):
        # logq, pq (B, n, K), cj (B, n) in query order; pT (B, K, Np), bh, bl (B, H, Np)
        # in padded class order; seg (B, C + 1) padded bounds; launch row r is query
        # row0 + r: mc (B, R, C), m_out (B, H, R), S (B, H, R, C); part (NS, 5, B, R, C)
        b = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        first = row0 + cuda.blockIdx.x * (TB * QB) + tid
        C = seg.shape[1] - 1
        psh = cuda.shared.array((TB, KP), dt)
        bsh = cuda.shared.array((TB, 2) if fast else (TB, 1), dt)
        lq = cuda.local.array((QB, K), dt)
        pv = cuda.local.array((QB, K), dt)
        acc = cuda.local.array((QB, NA), dt)
        xs = cuda.local.array((QB, NG), dt)
        gs = cuda.local.array((QB, NG), dt)
        pj = cuda.local.array(QB, np.int64)
        si = cuda.local.array(QB, np.int32)
        Dq = cuda.local.array(QB, float64)
        M = cuda.local.array(QB, float64)
        Sc = cuda.local.array(QB, float64)
        dh = cuda.local.array(QB, dt)  # fast: s c_j - M as dh + dl; float64: -M
        dl = cuda.local.array(QB, float32)
        st = scale[t]
        unit = _LOG2E if fast else 1.0  # the fast mode works in log2 units
        su = st * unit
        s32 = dt(su)  # the scale as a head and tail: s32 + s32lo = su to float64 precision
        s32lo = dt(su - float64(s32))
        for q in range(QB):
            j = first + q * TB
            live = j < row1
            pj[q] = pos[b, j] if live else -1
            Dq[q] = su * cj[b, j] if (fast and live) else 0.0
            for k in range(K):
                lq[q, k] = logq[b, j, k] if live else 0
                pv[q, k] = pq[b, j, k] if (fast and live) else 0
            M[q] = -_INF
            dh[q] = BIG
            dl[q] = 0
        sp = cuda.blockIdx.z
        nsp = cuda.gridDim.z
        for c in range(C):
            lo = seg[b, c]
            hi = seg[b, c + 1]
            if split:  # this block's share of the class's tiles
                nt = (hi - lo) // TB
                hi = lo + ((nt * (sp + 1)) // nsp) * TB
                lo = lo + ((nt * sp) // nsp) * TB
            for q in range(QB):
                Sc[q] = 0.0
            for i0 in range(lo, hi, TB):
                for k in range(K):
                    psh[tid, k] = pT[b, k, i0 + tid]
                bsh[tid, 0] = bh[b, t, i0 + tid]
                if fast:
                    bsh[tid, 1] = bl[b, t, i0 + tid]
                cuda.syncthreads()
                for q in range(QB):
                    d = pj[q] - i0  # the query's own centre in this tile, if any
                    si[q] = np.int32(d) if (d >= 0 and d < TB) else np.int32(-1)
                    for a in range(NA):
                        acc[q, a] = 0
                for i8 in range(TB // NG):
                    for q in range(QB):
                        xm = dt(-_INF)
                        for a in range(NG):
                            ii = np.int32(i8 * NG + a)
                            if fast:
                                g = lq[q, 0] * (psh[ii, 0] - pv[q, 0])
                                for k in range(1, K):
                                    g = cuda.fma(lq[q, k], psh[ii, k] - pv[q, k], g)
                                x = cuda.fma(s32, g, bsh[ii, 0] + dh[q]) + cuda.fma(
                                    s32lo, g, bsh[ii, 1] + dl[q]
                                )
                            else:
                                g = lq[q, 0] * psh[ii, 0]
                                for k in range(1, K):
                                    g += lq[q, k] * psh[ii, k]
                                x = cuda.fma(st, g, bsh[ii, 0] + dh[q])
                            if ii == si[q]:
                                x = dt(-_INF)
                            xs[q, a] = x
                            gs[q, a] = g
                            xm = max(xm, x)
                        if xm > 0:  # a new row maximum in this group: rescale (rarely)
                            L = M[q]  # the new maximum: the group's largest term
                            for a in range(NG):
                                if xs[q, a] > -_INF:
                                    ii = np.int32(i8 * NG + a)
                                    if fast:
                                        La = (float64(bsh[ii, 0]) + float64(bsh[ii, 1])) + Dq[q]
                                        La += su * float64(gs[q, a])
                                    else:
                                        La = cuda.fma(st, gs[q, a], bsh[ii, 0])
                                    L = max(L, La)
                            if M[q] == -_INF:
                                r = 0.0
                            elif fast:
                                r = _exp2(M[q] - L)
                            else:
                                r = math.exp(M[q] - L)
                            Sc[q] *= r
                            for a in range(NA):
                                acc[q, a] *= dt(r)
                            M[q] = L
                            if fast:
                                dd = Dq[q] - L
                                dh[q] = float32(dd)
                                dl[q] = float32(dd - float64(dh[q]))
                            else:
                                dh[q] = -L
                            for a in range(NG):  # the group's terms relative to the new M
                                if xs[q, a] > -_INF:
                                    ii = np.int32(i8 * NG + a)
                                    if fast:
                                        ga = gs[q, a]
                                        xs[q, a] = cuda.fma(
                                            s32, ga, bsh[ii, 0] + dh[q]
                                        ) + cuda.fma(s32lo, ga, bsh[ii, 1] + dl[q])
                                    else:
                                        xs[q, a] = cuda.fma(st, gs[q, a], bsh[ii, 0] + dh[q])
                        for a in range(NG):
                            if fast:
                                acc[q, a % NA] += _exp2f(xs[q, a])
                            else:
                                acc[q, a % NA] += math.exp(xs[q, a])
                cuda.syncthreads()
                for q in range(QB):
                    tot = acc[q, 0]
                    for a in range(1, NA):
                        tot += acc[q, a]
                    Sc[q] += float64(tot)
            for q in range(QB):
                j = first + q * TB
                if j < row1:
                    r = j - row0
                    if split:
                        part[sp, 0, b, r, c] = M[q] * (_LN2 if fast else 1.0)
                        part[sp, 1, b, r, c] = Sc[q]
                        part[sp, 2, b, r, c] = 0.0
                        part[sp, 3, b, r, c] = 0.0
                        part[sp, 4, b, r, c] = 0.0
                    else:
                        mc[b, r, c] = M[q] * (_LN2 if fast else 1.0)
                        S[b, t, r, c] = Sc[q]
        for q in range(QB):
            j = first + q * TB
            if j < row1 and not split:
                m_out[b, t, j - row0] = M[q] * (_LN2 if fast else 1.0)

    return kern


# ------------------------------------------- the lean kernel with powers, pairs and residuals

#: Use :func:`_lean_sums_kernel` for the passes with squared sums (``powers == 2``), pair
#: sums or residual sums, for ``K <=`` :data:`LEAN_SUMS_MAX_K` (the default residual
#: estimate's own pass, the debiased plug-in's). False: the general kernel
#: (:func:`_forward_kernel_qb`), which also serves ``powers == 3`` and larger K.
LEAN_SUMS = True

#: Most coordinates K for which :func:`_lean_sums_kernel` is used: each thread keeps its
#: query's ``log q`` (and in the fast mode ``p``) and a tile's residual sums ``A`` in
#: registers, and its float64 row sums of ``A``.
LEAN_SUMS_MAX_K = 20


@cuda.jit
def _gather_pad(src, order, dst):  # pragma: no cover - runs on the device
    # dst[b, i] = src[b, order[b, i]] in padded class order, 0 for padding
    i, b = cuda.grid(2)
    if b < dst.shape[0] and i < dst.shape[1]:
        r = order[b, i]
        dst[b, i] = src[b, r] if r >= 0 else 0


@functools.cache
def _lean_sums_kernel(
    K: int, fast: bool, powers: int, pairs: bool, resid: bool, NG: int = 8, TB: int = LEAN_TILE
) -> Any:
    """Compile the lean forward kernel with squared, pair and residual sums.

    The layout and the log-kernel of :func:`_lean_kernel` (classes padded to whole
    tiles, groups of ``NG`` centres with one test for a new row maximum, one query row
    per thread; the fast mode's log-kernel in float32 head-and-tail form in log2 units),
    with every term ``e = exp(L_ij - M)`` (``M`` the running row maximum) also summed as:

    * ``Q_c = sum e^2`` (``powers >= 2`` or ``pairs``);
    * ``D_c = sum_{i != i'} e_i e_i'`` (``pairs``), online and without cancellation:
      a term adds ``2 e`` times the sum of those before it, in each of the
      :data:`LEAN_ACC` interleaved partial sums of a tile, and the partials' products
      with each other and with the class's sum of the earlier tiles when the tile is
      folded in (every product is of non-negative terms, so that ``D`` has the relative
      accuracy of ``S`` even where one term dominates, as the general kernel's count of
      ties gives it);
    * ``A_k = sum e p_ik`` over all centres and ``U = sum e^2 u_i`` (``resid``), relative
      to the row maximum directly.

    A tile's sums are formed in the mode's dtype (float32 in the fast mode, in
    :data:`LEAN_ACC` partials for ``S``, ``Q``, ``D``) and added to float64 sums per tile,
    which a new row maximum rescales with them.  No term is clamped: a term below the
    float32 (fast) or float64 range relative to the row maximum adds 0 where the general
    kernel adds ``exp(-230)`` of its class maximum.
    """
    dt = float32 if fast else float64
    per_word = 4 if fast else 2
    KP = -(-K // per_word) * per_word
    NA = LEAN_ACC
    BIG = 1e30  # "s c_j - M" before the first term: every first group sets M
    sq = powers >= 2 or pairs or resid
    KA = K if resid else 1

    @cuda.jit
    def kern(
        logq, pq, cj, pT, bh, bl, us, seg, pos, scale, t, row0, row1, mc, m_out, S, Q, D, A, U
    ):
        # as _lean_kernel's, one query row per thread; us (B, Np) residual weights in padded
        # class order; Q, D (B, H, R, C) relative to mc (as S); A (B, H, R, K) and U
        # (B, H, R) relative to the row maximum
        b = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        j = row0 + cuda.blockIdx.x * TB + tid
        live = j < row1
        C = seg.shape[1] - 1
        psh = cuda.shared.array((TB, KP), dt)
        bsh = cuda.shared.array((TB, 2) if fast else (TB, 1), dt)
        ush = cuda.shared.array(TB, dt)
        lq = cuda.local.array(K, dt)
        pv = cuda.local.array(K, dt)
        acc = cuda.local.array(NA, dt)
        acq = cuda.local.array(NA, dt)
        acd = cuda.local.array(NA, dt)
        aa = cuda.local.array(KA, dt)
        Ar = cuda.local.array(KA, float64)
        xs = cuda.local.array(NG, dt)
        gs = cuda.local.array(NG, dt)
        st = scale[t]
        unit = _LOG2E if fast else 1.0
        su = st * unit
        s32 = dt(su)
        s32lo = dt(su - float64(s32))
        pj = pos[b, j] if live else -1
        Dq = su * cj[b, j] if (fast and live) else 0.0
        for k in range(K):
            lq[k] = logq[b, j, k] if live else 0
            pv[k] = pq[b, j, k] if (fast and live) else 0
        for k in range(KA):
            Ar[k] = 0.0
        Ur = 0.0
        M = -_INF
        dh = dt(BIG)
        dl = float32(0)
        for c in range(C):
            lo = seg[b, c]
            hi = seg[b, c + 1]
            Sc = 0.0
            Qc = 0.0
            Dc = 0.0
            for i0 in range(lo, hi, TB):
                for k in range(K):
                    psh[tid, k] = pT[b, k, i0 + tid]
                bsh[tid, 0] = bh[b, t, i0 + tid]
                if fast:
                    bsh[tid, 1] = bl[b, t, i0 + tid]
                if resid:
                    ush[tid] = us[b, i0 + tid]
                cuda.syncthreads()
                d = pj - i0  # the query's own centre in this tile, if any
                si = np.int32(d) if (d >= 0 and d < TB) else np.int32(-1)
                for a in range(NA):
                    acc[a] = 0
                    acq[a] = 0
                    acd[a] = 0
                for k in range(KA):
                    aa[k] = 0
                ua = dt(0)
                for i8 in range(TB // NG):
                    xm = dt(-_INF)
                    for a in range(NG):
                        ii = np.int32(i8 * NG + a)
                        if fast:
                            g = lq[0] * (psh[ii, 0] - pv[0])
                            for k in range(1, K):
                                g = cuda.fma(lq[k], psh[ii, k] - pv[k], g)
                            x = cuda.fma(s32, g, bsh[ii, 0] + dh) + cuda.fma(
                                s32lo, g, bsh[ii, 1] + dl
                            )
                        else:
                            g = lq[0] * psh[ii, 0]
                            for k in range(1, K):
                                g += lq[k] * psh[ii, k]
                            x = cuda.fma(st, g, bsh[ii, 0] + dh)
                        if ii == si:
                            x = dt(-_INF)
                        xs[a] = x
                        gs[a] = g
                        xm = max(xm, x)
                    if xm > 0:  # a new row maximum in this group: rescale (rarely)
                        L = M
                        for a in range(NG):
                            if xs[a] > -_INF:
                                ii = np.int32(i8 * NG + a)
                                if fast:
                                    La = (float64(bsh[ii, 0]) + float64(bsh[ii, 1])) + Dq
                                    La += su * float64(gs[a])
                                else:
                                    La = cuda.fma(st, gs[a], bsh[ii, 0])
                                L = max(L, La)
                        if M == -_INF:
                            r = 0.0
                        elif fast:
                            r = _exp2(M - L)
                        else:
                            r = math.exp(M - L)
                        r2 = r * r
                        Sc *= r
                        Qc *= r2
                        Dc *= r2
                        for a in range(NA):
                            acc[a] *= dt(r)
                            acq[a] *= dt(r2)
                            acd[a] *= dt(r2)
                        if resid:
                            for k in range(K):
                                aa[k] *= dt(r)
                                Ar[k] *= r
                            ua *= dt(r2)
                            Ur *= r2
                        M = L
                        if fast:
                            dd = Dq - L
                            dh = float32(dd)
                            dl = float32(dd - float64(dh))
                        else:
                            dh = -L
                        for a in range(NG):  # the group's terms relative to the new M
                            if xs[a] > -_INF:
                                ii = np.int32(i8 * NG + a)
                                if fast:
                                    ga = gs[a]
                                    xs[a] = cuda.fma(s32, ga, bsh[ii, 0] + dh) + cuda.fma(
                                        s32lo, ga, bsh[ii, 1] + dl
                                    )
                                else:
                                    xs[a] = cuda.fma(st, gs[a], bsh[ii, 0] + dh)
                    for a in range(NG):
                        e = _exp2f(xs[a]) if fast else math.exp(xs[a])
                        p_ = a % NA
                        if pairs:  # pairs with the partial's earlier terms
                            acd[p_] = cuda.fma(e, acc[p_], acd[p_])
                        acc[p_] += e
                        e2 = e * e
                        if sq:
                            acq[p_] += e2
                        if resid:
                            ii = np.int32(i8 * NG + a)
                            for k in range(K):
                                aa[k] = cuda.fma(e, psh[ii, k], aa[k])
                            ua = cuda.fma(e2, ush[ii], ua)
                cuda.syncthreads()
                # fold the tile: D gains the pairs within each partial (acd), between
                # the partials, and with the class's earlier tiles (Sc)
                tot = 0.0
                dtile = 0.0
                for a in range(NA):
                    sa = float64(acc[a])
                    if pairs:
                        dtile += float64(acd[a]) + sa * tot
                    tot += sa
                if pairs:
                    Dc += 2.0 * (dtile + tot * Sc)
                Sc += tot
                if sq:
                    tq = 0.0
                    for a in range(NA):
                        tq += float64(acq[a])
                    Qc += tq
                if resid:
                    for k in range(K):
                        Ar[k] += float64(aa[k])
                    Ur += float64(ua)
            if live:
                r = j - row0
                mc[b, r, c] = M * (_LN2 if fast else 1.0)
                S[b, t, r, c] = Sc
                if powers >= 2:
                    Q[b, t, r, c] = Qc
                if pairs:
                    D[b, t, r, c] = Dc
        if live:
            r = j - row0
            m_out[b, t, r] = M * (_LN2 if fast else 1.0)
            if resid:
                for k in range(K):
                    A[b, t, r, k] = Ar[k]
                U[b, t, r] = Ur

    return kern


def _loo_reduce_lean_sums(
    dlogq: Any,
    dp: Any,
    labels: Any,
    C: int,
    scale_h: np.ndarray,
    dbias: Any,
    r0: int,
    r1: int,
    progress: Callable[[int], object] | None,
    powers: int,
    pairs: bool,
    resid: Any,
) -> tuple[Any, ...]:
    """:func:`loo_reduce` with ``powers <= 2``, pairs or residuals: :func:`_lean_sums_kernel`.

    Device arrays in; returns the device arrays ``m`` (B, H, R), ``S``, ``Q``, ``D``
    (B, H, R, C; ``Q``, ``D`` placeholders unless asked), ``A`` (B, H, R, K) and ``U``
    (B, H, R) (placeholders without ``resid``).
    """
    Bn, n, K = (int(s) for s in dp.shape)
    H = scale_h.shape[0]
    R = r1 - r0
    fast = dp.dtype == np.float32
    TB = LEAN_TILE
    NG = LEAN_SHAPE[fast][1]
    has_u = resid is not None
    empty = (1, 1, 1, 1)
    shp = (Bn, H, R, C)
    m = cuda.device_array((Bn, H, R), dtype=np.float64)
    S = cuda.device_array(shp, dtype=np.float64)
    Q = cuda.device_array(shp if powers >= 2 else empty, dtype=np.float64)
    D = cuda.device_array(shp if pairs else empty, dtype=np.float64)
    A = cuda.device_array((Bn, H, R, K) if has_u else empty, dtype=np.float64)
    U = cuda.device_array((Bn, H, R) if has_u else (1, 1, 1), dtype=np.float64)
    if not (R > 0 and H > 0 and Bn > 0 and n > 0):
        return m, S, Q, D, A, U
    order, pos, seg, pT, bh, bl, cj, grid = _lean_inputs(dlogq, dp, dbias, labels, C, H, TB)
    us = cuda.device_array((Bn, int(order.shape[1])) if has_u else (1, 1), dtype=dp.dtype)
    if has_u:
        du = resid if _on_device(resid) else np.ascontiguousarray(resid, dtype=np.float64)
        du, _ = _batched(du, 2)
        _gather_pad[grid, (TILE, 1)](_dev(du), order, us)
    dscale = cuda.to_device(scale_h)
    step = _launch_rows(n, H * Bn, TB)
    rows = min(step, R)
    mc = cuda.device_array((Bn, rows, C), dtype=np.float64)
    kern = _lean_sums_kernel(K, fast, int(powers), bool(pairs), has_u, NG, TB)
    for a in range(r0, r1, step):
        b_ = min(a + step, r1)
        sl = slice(a - r0, b_ - r0)
        mv = m[:, :, sl]
        Sv = S[:, :, sl, :]
        Qv = Q[:, :, sl, :] if powers >= 2 else Q
        Dv = D[:, :, sl, :] if pairs else D
        Av = A[:, :, sl, :] if has_u else A
        Uv = U[:, :, sl] if has_u else U
        blocks = ((b_ - a + TB - 1) // TB, Bn)
        rblocks = ((b_ - a + TILE - 1) // TILE, Bn)
        mcv = mc[:, : b_ - a, :]
        for t in range(H):
            kern[blocks, (TB, 1)](
                dlogq, dp, cj, pT, bh, bl, us, seg, pos, dscale, t, a, b_, mcv, mv, Sv, Qv, Dv,
                Av, Uv,
            )  # fmt: skip
            _rescale[rblocks, (TILE, 1)](mcv, t, mv, Sv, Qv, Q, Dv, int(powers), bool(pairs))
        cuda.synchronize()
        if progress is not None:
            progress((b_ - r0) * Bn)
    return m, S, Q, D, A, U


@functools.cache
def _multi_kernel(
    K: int, C: int, fast: bool, powers: int, resid: bool = False, deep: bool = False
) -> Any:
    """Compile the multi-label kernel.

    One block per query row; thread ``tid`` of block ``(r, y)`` owns label set
    ``y * TILE + tid`` and, in turn, computes the weight of one centre of each tile.
    ``resid`` (a compile-time constant): also ``U[b, r] = sum weights w^2 u``.
    ``deep`` (centre weights given): terms are kept down to ``_CLAMP`` instead of
    ``_DROP`` below the row maximum.
    """
    dt = float32 if fast else float64
    TB = TILE
    floor = _CLAMP if deep else _DROP

    @cuda.jit
    def kern(logq, pq, cj, pT, m, labT, wT, scale, bias, row0, S, Q, uT, U):  # pragma: no cover
        # logq, pq (n, K); cj (n,); pT (K, n); m, bias (n,); labT (n, B) int32;
        # wT, uT (n, B) float64; S, Q (B, R, C); U (B, R).  Fast mode: the centred K-dot of the forward
        # kernel, so that the weights are those the forward pass summed.
        n = pT.shape[1]
        B = labT.shape[1]
        tid = cuda.threadIdx.x
        r = cuda.blockIdx.x
        j = row0 + r
        bset = cuda.blockIdx.y * TB + tid
        lqs = cuda.shared.array(K, dt)
        pqs = cuda.shared.array(K, dt)
        wsh = cuda.shared.array(TB, float64)
        acc = cuda.local.array(C, float64)
        acc2 = cuda.local.array(C, float64)
        for c in range(C):
            acc[c] = 0.0
            acc2[c] = 0.0
        accu = 0.0
        if tid == 0:
            for k in range(K):
                lqs[k] = logq[j, k]
                pqs[k] = pq[j, k]
        cuda.syncthreads()
        mj = m[j]
        sj = scale * cj[j] if fast else 0.0
        if mj > -_INF:
            for i0 in range(0, n, TB):
                i = i0 + tid
                wv = 0.0
                if i < n and i != j:
                    if fast:
                        g = lqs[0] * (pT[0, i] - pqs[0])
                        for k in range(1, K):
                            g = cuda.fma(lqs[k], pT[k, i] - pqs[k], g)
                    else:
                        g = lqs[0] * pT[0, i]
                        for k in range(1, K):
                            g += lqs[k] * pT[k, i]
                    x = cuda.fma(scale, float64(g), bias[i] + sj) - mj
                    if x >= floor:
                        if fast and x >= _FAST_EXP_MIN:
                            wv = float64(math.exp(float32(min(x, 0.0))))
                        else:
                            wv = math.exp(min(x, 0.0))
                wsh[tid] = wv
                cuda.syncthreads()
                if bset < B:
                    for ii in range(min(TB, n - i0)):
                        wv = wsh[ii]
                        if wv != 0.0:
                            lab = labT[i0 + ii, bset]
                            v = wT[i0 + ii, bset] * wv
                            acc[lab] += v
                            if powers >= 2:
                                acc2[lab] += v * wv
                            if resid:
                                accu += (v * wv) * uT[i0 + ii, bset]
                cuda.syncthreads()
        if bset < B:
            for c in range(C):
                S[bset, r, c] = acc[c]
                if powers >= 2:
                    Q[bset, r, c] = acc2[c]
            if resid:
                U[bset, r] = accu

    return kern


@functools.cache
def _grad_kernels(K: int, C: int, fast: bool) -> tuple[Any, Any]:
    """Compile the two passes of the backward pass: query-major, then centre-major."""
    dt = float32 if fast else float64
    TB = TILE

    @cuda.jit
    def by_query(logq, p, cj, labels, scale, bias, lse, coef, g_logq, row_sum):  # pragma: no cover
        # g_logq[b, j, k] = scale sum_{i != j} w_ij coef[b, j, y_i] p[b, i, k]
        # row_sum[b, j]   = sum_{i != j} w_ij coef[b, j, y_i]
        b = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        n = p.shape[1]
        j = cuda.blockIdx.x * TB + tid
        active = j < n
        psh = cuda.shared.array((K, TB), dt)
        bsh = cuda.shared.array(TB, float64)
        lsh = cuda.shared.array(TB, np.int32)
        lq = cuda.local.array(K, dt)
        pv = cuda.local.array(K, dt)
        acc = cuda.local.array(K, float64)
        cf = cuda.local.array(C, float64)
        lj = 0.0
        sj = 0.0
        for k in range(K):
            acc[k] = 0.0
            lq[k] = logq[b, j, k] if active else 0
            pv[k] = p[b, j, k] if (active and fast) else 0
        for c in range(C):
            cf[c] = coef[b, j, c] if active else 0.0
        if active:
            lj = lse[b, j]
            if fast:
                sj = scale * cj[b, j]
        rs = 0.0
        for i0 in range(0, n, TB):
            w = min(TB, n - i0)
            if tid < w:
                for k in range(K):
                    psh[k, tid] = p[b, i0 + tid, k]
                bsh[tid] = bias[b, i0 + tid]
                lsh[tid] = labels[b, i0 + tid]
            cuda.syncthreads()
            if active:
                for ii in range(w):
                    if i0 + ii != j:
                        if fast:
                            g = lq[0] * (psh[0, ii] - pv[0])
                            for k in range(1, K):
                                g = cuda.fma(lq[k], psh[k, ii] - pv[k], g)
                        else:
                            g = lq[0] * psh[0, ii]
                            for k in range(1, K):
                                g += lq[k] * psh[k, ii]
                        x = cuda.fma(scale, float64(g), bsh[ii] + sj) - lj
                        if fast:
                            wv = float64(math.exp(float32(min(x, 0.0))))
                        else:
                            wv = math.exp(min(x, 0.0))
                        v = wv * cf[lsh[ii]]
                        rs += v
                        for k in range(K):
                            acc[k] += v * psh[k, ii]
            cuda.syncthreads()
        if active:
            row_sum[b, j] = rs
            for k in range(K):
                g_logq[b, j, k] = scale * acc[k]

    @cuda.jit
    def by_centre(logq, p, cj, labels, scale, bias, lse, coef, g_p, g_bias):  # pragma: no cover
        # g_p[b, i, k] = scale sum_{j != i} w_ij coef[b, j, y_i] logq[b, j, k]
        # g_bias[b, i] = sum_{j != i} w_ij coef[b, j, y_i]
        b = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        n = p.shape[1]
        i = cuda.blockIdx.x * TB + tid
        active = i < n
        qsh = cuda.shared.array((K, TB), dt)
        qpsh = cuda.shared.array((K, TB), dt)
        lsesh = cuda.shared.array(TB, float64)
        csh = cuda.shared.array((C, TB), float64)
        pi = cuda.local.array(K, dt)
        acc = cuda.local.array(K, float64)
        yi = 0
        bi = 0.0
        for k in range(K):
            acc[k] = 0.0
            pi[k] = p[b, i, k] if active else 0
        if active:
            yi = labels[b, i]
            bi = bias[b, i]
        gb = 0.0
        for j0 in range(0, n, TB):
            w = min(TB, n - j0)
            if tid < w:
                for k in range(K):
                    qsh[k, tid] = logq[b, j0 + tid, k]
                    qpsh[k, tid] = p[b, j0 + tid, k] if fast else 0
                # the query's shift enters through lse: x = bias_i + s (c_j + G') - lse_j
                lsesh[tid] = lse[b, j0 + tid] - (scale * cj[b, j0 + tid] if fast else 0.0)
                for c in range(C):
                    csh[c, tid] = coef[b, j0 + tid, c]
            cuda.syncthreads()
            if active:
                for jj in range(w):
                    if j0 + jj != i:
                        if fast:
                            g = qsh[0, jj] * (pi[0] - qpsh[0, jj])
                            for k in range(1, K):
                                g = cuda.fma(qsh[k, jj], pi[k] - qpsh[k, jj], g)
                        else:
                            g = qsh[0, jj] * pi[0]
                            for k in range(1, K):
                                g += qsh[k, jj] * pi[k]
                        x = cuda.fma(scale, float64(g), bi) - lsesh[jj]
                        if fast:
                            wv = float64(math.exp(float32(min(x, 0.0))))
                        else:
                            wv = math.exp(min(x, 0.0))
                        v = wv * csh[yi, jj]
                        gb += v
                        for k in range(K):
                            acc[k] += v * qsh[k, jj]
            cuda.syncthreads()
        if active:
            g_bias[b, i] = gb
            for k in range(K):
                g_p[b, i, k] = scale * acc[k]

    return by_query, by_centre


# ---------------------------------------------------------------------- entry points


def _batched(a: Any, ndim: int) -> tuple[Any, bool]:
    """Add the problem axis B to an unbatched array (a view, host or device).

    Host arrays of other libraries (CPU tensors) become NumPy arrays.
    """
    if not _on_device(a):
        a = np.asarray(a)
    if len(a.shape) == ndim:
        return a, True
    if _on_device(a):
        d = _dev(a)
        return d.reshape(1, *d.shape), False
    return np.asarray(a)[None, ...], False


def kernel_bias(p: Any, scale: Any, *, device_out: bool = False) -> Any:
    """Per-centre bias ``-sum_k lgamma(p[r, k] * scale[t] + 1)`` on the device.

    Parameters
    ----------
    p : array, shape (R, K), float32 or float64 (host or CUDA array)
        Points on the simplex (every entry in [0, 1]).
    scale : array-like, shape (H,), float64
        ``1 / h`` for each bandwidth.
    device_out : bool
        Return a numba device array instead of a NumPy array.

    Returns
    -------
    array, shape (H, R), float64
    """
    dp = _dev(p)
    ds = cuda.to_device(np.ascontiguousarray(scale, dtype=np.float64))
    R, H = dp.shape[0], ds.shape[0]
    out = cuda.device_array((H, R), dtype=np.float64)
    if R and H:
        _bias_kernel[((R + TILE - 1) // TILE, H), (TILE, 1)](dp, ds, out)
    return out if device_out else out.copy_to_host()


def loo_reduce(
    logq: Any,
    p: Any,
    labels: Any,
    n_classes: int,
    scale: Any,
    bias: Any,
    powers: int = 1,
    row_start: int = 0,
    row_stop: int | None = None,
    progress: Callable[[int], object] | None = None,
    pairs: bool = False,
    *,
    device_out: bool = False,
    resid: Any = None,
) -> tuple[Any, ...]:
    """Leave-one-out Dirichlet-kernel reduction on the GPU (``kdecal._core.loo_reduce``).

    Parameters
    ----------
    logq, p : array, shape (n, K) or (B, n, K), float32 or float64 (the same)
        Log query probabilities and centre probabilities; host or CUDA arrays.
    labels : array, shape (n,) or (B, n), integer
        Group of each centre, in ``0..n_classes-1``.
    n_classes : int
        Number of groups C.
    scale : array-like, shape (H,), float64
        ``1 / h`` for each bandwidth.
    bias : array, shape (H, n) or (B, H, n), float64
        ``-sum_k lgamma(p[i, k] / h + 1)`` for each bandwidth and centre.
    powers : {1, 2, 3}
        Which power sums to return.
    row_start, row_stop : int
        Query rows ``[row_start, row_stop)`` (default all).
    progress : callable or None
        Called with the number of query rows done so far, counted over the batch.
    pairs : bool
        Also return the pair sums ``D`` (needs ``powers >= 2``).
    device_out : bool
        Return numba device arrays (no copy to the host).
    resid : array, shape (n,) or (B, n), float64, or None
        Per-centre residuals ``u`` (host or CUDA array): also return ``A`` and ``U``.

    Returns
    -------
    m : array, shape ([B,] H, R), float64
    S, Q, T : array, shape ([B,] H, R, C), float64 (``Q``, ``T``: shape (0, 0, 0) unless
        requested)
    D : array, shape ([B,] H, R, C), float64, only with ``pairs``
    A : array, shape ([B,] H, R, K), float64, only with ``resid``
    U : array, shape ([B,] H, R), float64, only with ``resid``
        The same accumulators as the compiled core (see :func:`kdecal._engine.backends.loo_reduce`);
        ``A`` and ``U`` over the same (clamped) terms as ``S``, in float64 in both modes
        (the fast mode's terms ``e`` are those of its ``S``).

    Notes
    -----
    Nothing is validated here but the shapes (the caller validates the values).
    """
    logq, batched = _batched(logq, 3)
    p, _ = _batched(p, 3)
    labels, _ = _batched(labels, 2)
    bias, _ = _batched(bias, 3)
    Bn, n, K = (int(s) for s in p.shape)
    C = int(n_classes)
    scale_h = np.ascontiguousarray(scale, dtype=np.float64).reshape(-1)
    H = scale_h.shape[0]
    r0 = int(row_start)
    r1 = n if row_stop is None else int(row_stop)
    R = r1 - r0
    if pairs and powers < 2:
        raise ValueError(f"pairs=True needs powers >= 2, got powers = {powers}")
    dlogq, dp = _precise(float(scale_h.max(initial=0.0)), logq, p)
    dbias = _dev(bias)
    fast = dp.dtype == np.float32
    if LEAN and powers == 1 and not pairs and resid is None and K <= LEAN_MAX_K:
        m, S = _loo_reduce_lean(dlogq, dp, labels, C, scale_h, dbias, r0, r1, progress)
        outs = [m, S, None, None]
        return tuple(_finish(o, batched, device_out) for o in outs)
    sums = powers == 2 or pairs or resid is not None
    if LEAN_SUMS and sums and powers <= 2 and K <= LEAN_SUMS_MAX_K:
        m, S, Q, D, A, U = _loo_reduce_lean_sums(
            dlogq, dp, labels, C, scale_h, dbias, r0, r1, progress, powers, pairs, resid
        )
        outs = [m, S, Q if powers >= 2 else None, None]
        if pairs:
            outs.append(D)
        if resid is not None:
            outs += [A, U]
        return tuple(_finish(o, batched, device_out) for o in outs)
    order, pos, seg = _class_order(labels, C)
    pT = cuda.device_array((Bn, K, n), dtype=dp.dtype)
    bs = cuda.device_array((Bn, H, n), dtype=np.float64)
    cj = cuda.device_array((Bn, n), dtype=np.float64)
    has_u = resid is not None
    us = cuda.device_array((Bn, n) if has_u else (1, 1), dtype=np.float64)
    if n and Bn:
        grid = ((n + TILE - 1) // TILE, Bn)
        _gather_T[grid, (TILE, 1)](dp, order, pT)
        _gather_bias[grid, (TILE, 1)](dbias, order, bs)
        _query_shift[grid, (TILE, 1)](dlogq, dp, cj)
        if has_u:
            du = resid if _on_device(resid) else np.ascontiguousarray(resid, dtype=np.float64)
            du, _ = _batched(du, 2)
            _gather_rows[grid, (TILE, 1)](_dev(du), order, us)
    dscale = cuda.to_device(scale_h)
    m = cuda.device_array((Bn, H, R), dtype=np.float64)
    shp = (Bn, H, R, C)
    S = cuda.device_array(shp, dtype=np.float64)
    empty = (1, 1, 1, 1)  # placeholders of the kernel's signature, never written
    Q = cuda.device_array(shp if powers >= 2 else empty, dtype=np.float64)
    T = cuda.device_array(shp if powers >= 3 else empty, dtype=np.float64)
    D = cuda.device_array(shp if pairs else empty, dtype=np.float64)
    A = cuda.device_array((Bn, H, R, K) if has_u else empty, dtype=np.float64)
    U = cuda.device_array((Bn, H, R) if has_u else (1, 1, 1), dtype=np.float64)
    if R > 0 and H > 0 and Bn > 0:
        kern, QB = _forward_kernel(K, fast, int(powers), bool(pairs), resid=has_u)
        TB = FORWARD_TILE
        step = _launch_rows(n, H * Bn, TB * QB)
        rows = min(step, R)
        mc = cuda.device_array((Bn, rows, C), dtype=np.float64)
        part_bytes = 40.0 * Bn * rows * C + (8.0 * Bn * rows * C * (K + 1) if has_u else 0.0)
        ns = _centre_splits(-(-rows // QB) * Bn, part_bytes)
        if ns > 1:
            kern, QB = _forward_kernel(K, fast, int(powers), bool(pairs), split=True, resid=has_u)
            part = cuda.device_array((ns, 5, Bn, rows, C), dtype=np.float64)
        else:
            part = cuda.device_array((1, 1, 1, 1, 1), dtype=np.float64)
        if ns > 1 and has_u:
            partA = cuda.device_array((ns, Bn, rows, C, K), dtype=np.float64)
            partU = cuda.device_array((ns, Bn, rows, C), dtype=np.float64)
        else:
            partA = cuda.device_array((1, 1, 1, 1, 1), dtype=np.float64)
            partU = cuda.device_array((1, 1, 1, 1), dtype=np.float64)
        for a in range(r0, r1, step):
            b_ = min(a + step, r1)
            # each launch writes its rows' slice of the outputs (offset a - r0)
            sl = slice(a - r0, b_ - r0)
            mv = m[:, :, sl]
            Sv = S[:, :, sl, :]
            Qv = Q[:, :, sl, :] if powers >= 2 else Q
            Tv = T[:, :, sl, :] if powers >= 3 else T
            Dv = D[:, :, sl, :] if pairs else D
            Av = A[:, :, sl, :] if has_u else A
            Uv = U[:, :, sl] if has_u else U
            blocks = ((b_ - a + TB * QB - 1) // (TB * QB), Bn)
            rblocks = ((b_ - a + TILE - 1) // TILE, Bn)
            mcv = mc[:, : b_ - a, :]  # this launch's rows only (the last may be short)
            for t in range(H):
                kern[(*blocks, ns), (TB, 1, 1)](
                    dlogq,
                    dp,
                    cj,
                    pT,
                    bs,
                    seg,
                    pos,
                    dscale,
                    t,
                    a,
                    b_,
                    mcv,
                    mv,
                    Sv,
                    Qv,
                    Tv,
                    Dv,
                    part,
                    us,
                    Av,
                    Uv,
                    partA,
                    partU,
                )
                if ns > 1:
                    pv = part[:, :, :, : b_ - a, :]
                    pAv = partA[:, :, : b_ - a] if has_u else partA
                    pUv = partU[:, :, : b_ - a] if has_u else partU
                    _merge[rblocks, (TILE, 1)](
                        pv,
                        t,
                        mcv,
                        mv,
                        Sv,
                        Qv,
                        Tv,
                        Dv,
                        int(powers),
                        bool(pairs),
                        pAv,
                        pUv,
                        Av,
                        Uv,
                        has_u,
                    )
                _rescale[rblocks, (TILE, 1)](mcv, t, mv, Sv, Qv, Tv, Dv, int(powers), bool(pairs))
            cuda.synchronize()
            if progress is not None:
                progress((b_ - r0) * Bn)
    outs = [m, S, Q if powers >= 2 else None, T if powers >= 3 else None]
    if pairs:
        outs.append(D)
    if has_u:
        outs += [A, U]
    return tuple(_finish(o, batched, device_out) for o in outs)


def _loo_reduce_lean(
    dlogq: Any,
    dp: Any,
    labels: Any,
    C: int,
    scale_h: np.ndarray,
    dbias: Any,
    r0: int,
    r1: int,
    progress: Callable[[int], object] | None,
) -> tuple[Any, Any]:
    """:func:`loo_reduce` with ``powers == 1``, no pairs, no residuals: the lean kernel.

    Device arrays in (``(B, n, K)``, ``(B, H, n)``); returns the device arrays ``m``
    (B, H, R) and ``S`` (B, H, R, C).
    """
    Bn, n, K = (int(s) for s in dp.shape)
    H = scale_h.shape[0]
    R = r1 - r0
    fast = dp.dtype == np.float32
    TB = LEAN_TILE
    QB, NG = LEAN_SHAPE[fast]
    m = cuda.device_array((Bn, H, R), dtype=np.float64)
    S = cuda.device_array((Bn, H, R, C), dtype=np.float64)
    if not (R > 0 and H > 0 and Bn > 0 and n > 0):
        return m, S
    _, pos, seg, pT, bh, bl, cj, _ = _lean_inputs(dlogq, dp, dbias, labels, C, H, TB)
    dscale = cuda.to_device(scale_h)
    step = _launch_rows(n, H * Bn, TB * QB)
    rows = min(step, R)
    mc = cuda.device_array((Bn, rows, C), dtype=np.float64)
    ns = _centre_splits(-(-rows // QB) * Bn, 40.0 * Bn * rows * C)
    kern = _lean_kernel(K, fast, ns > 1, QB, NG, TB)
    part = cuda.device_array((ns, 5, Bn, rows, C) if ns > 1 else (1, 1, 1, 1, 1), np.float64)
    empty = cuda.device_array((1, 1, 1, 1), dtype=np.float64)
    for a in range(r0, r1, step):
        b_ = min(a + step, r1)
        sl = slice(a - r0, b_ - r0)
        mv = m[:, :, sl]
        Sv = S[:, :, sl, :]
        blocks = ((b_ - a + TB * QB - 1) // (TB * QB), Bn, ns)
        rblocks = ((b_ - a + TILE - 1) // TILE, Bn)
        mcv = mc[:, : b_ - a, :]
        for t in range(H):
            kern[blocks, (TB, 1, 1)](
                dlogq, dp, cj, pT, bh, bl, seg, pos, dscale, t, a, b_, mcv, mv, Sv, part
            )
            if ns > 1:
                pv = part[:, :, :, : b_ - a, :]
                _merge[rblocks, (TILE, 1)](
                    pv,
                    t,
                    mcv,
                    mv,
                    Sv,
                    empty,
                    empty,
                    empty,
                    1,
                    False,
                    part,
                    empty,
                    empty,
                    m,
                    False,
                )
            _rescale[rblocks, (TILE, 1)](mcv, t, mv, Sv, empty, empty, empty, 1, False)
        cuda.synchronize()
        if progress is not None:
            progress((b_ - r0) * Bn)
    return m, S


def _finish(o: Any, batched: bool, device_out: bool) -> Any:
    """Host copy (unless ``device_out``), missing outputs as (0, 0, 0), batch axis dropped."""
    if o is None:
        return cuda.device_array((0, 0, 0)) if device_out else np.zeros((0, 0, 0))
    if not device_out:
        o = o.copy_to_host()
    return o if batched else o[0]


def loo_reduce_multi(
    logq: Any,
    p: Any,
    m: Any,
    labels: Any,
    n_classes: int,
    scale: float,
    bias: Any,
    weights: Any = None,
    powers: int = 1,
    row_start: int = 0,
    row_stop: int | None = None,
    progress: Callable[[int], object] | None = None,
    resid: Any = None,
) -> tuple[np.ndarray, ...]:
    """Class sums of B label sets at one bandwidth on the GPU (``kdecal._core.loo_reduce_multi``).

    Parameters
    ----------
    logq, p : array, shape (n, K), float32 or float64 (the same); host or CUDA arrays
    m : array, shape (n,), float64
        Row maxima of the log-kernel over ``i != j`` (from :func:`loo_reduce`).
    labels : array, shape (B, n), integer, values in ``0..n_classes-1``
    n_classes : int
    scale : float
        ``1 / h``.
    bias : array, shape (n,), float64
    weights : array, shape (B, n), float64, or None (all 1)
    powers : {1, 2}
    row_start, row_stop : int
        Query rows ``[row_start, row_stop)``.
    progress : callable or None
        Called with the number of query rows done so far.
    resid : array, shape (B, n), float64, or None
        Per-centre residuals of each set: also return ``U``.

    Returns
    -------
    S : ndarray, shape (B, R, n_classes), float64
    Q : ndarray, shape (B, R, n_classes), float64, or shape (0, 0, 0) if ``powers == 1``
    U : ndarray, shape (B, R), float64, only with ``resid``
        ``U[b, j] = sum_{i != j} weights[b, i] * w_ij ** 2 * resid[b, i]`` over the same
        (not dropped) terms as ``S``.

    Notes
    -----
    Terms with ``L_ij - m[j] < -64`` (with ``weights``: ``< -230``) are dropped, as in
    the compiled core. Nothing is validated here (the caller validates).
    """
    lab_h = _host(labels).astype(np.int32)
    B, n = lab_h.shape
    C = int(n_classes)
    r0 = int(row_start)
    r1 = n if row_stop is None else int(row_stop)
    R = r1 - r0
    w_h = np.ones((B, n)) if weights is None else _host(weights).astype(np.float64)
    logq, p = _precise(float(scale), logq, p)
    dp = p
    K = int(dp.shape[1])
    fast = dp.dtype == np.float32
    pT = cuda.to_device(np.ascontiguousarray(_host(p).T))
    labT = cuda.to_device(np.ascontiguousarray(lab_h.T))
    wT = cuda.to_device(np.ascontiguousarray(w_h.T))
    has_u = resid is not None
    uT = cuda.to_device(
        np.ascontiguousarray(_host(resid).astype(np.float64).T) if has_u else np.zeros((1, 1))
    )
    dlogq, dm, dbias = _dev(logq), _dev(m), _dev(bias)
    cj = cuda.device_array((1, n), dtype=np.float64)
    if n:
        _query_shift[((n + TILE - 1) // TILE, 1), (TILE, 1)](
            dlogq.reshape(1, n, K), dp.reshape(1, n, K), cj
        )
    S = cuda.device_array((B, R, C), dtype=np.float64)
    Q = cuda.device_array((B, R, C) if powers >= 2 else (0, 0, 0), dtype=np.float64)
    U = cuda.device_array((B, R) if has_u else (1, 1), dtype=np.float64)
    if R > 0 and B > 0:
        kern = _multi_kernel(K, C, fast, int(powers), has_u, weights is not None)
        step = _launch_rows(n, 1.0 + B / 32.0)
        nby = (B + TILE - 1) // TILE
        for a in range(r0, r1, step):
            b_ = min(a + step, r1)
            sl = slice(a - r0, b_ - r0)
            Sv = S[:, sl, :]
            Qv = Q[:, sl, :] if powers >= 2 else cuda.device_array((1, 1, 1))
            Uv = U[:, sl] if has_u else U
            kern[(b_ - a, nby), (TILE, 1)](
                dlogq, dp, cj[0], pT, dm, labT, wT, float(scale), dbias, a, Sv, Qv, uT, Uv
            )
            cuda.synchronize()
            if progress is not None:
                progress(b_ - r0)
    out = (S.copy_to_host(), (Q.copy_to_host() if powers >= 2 else np.zeros((0, 0, 0))))
    return out if not has_u else (*out, U.copy_to_host())


def loo_grad(
    logq: Any,
    p: Any,
    labels: Any,
    n_classes: int,
    scale: float,
    bias: Any,
    lse: Any,
    coef: Any,
    progress: Callable[[int], object] | None = None,
    *,
    device_out: bool = False,
) -> tuple[Any, Any, Any, Any]:
    """Streaming backward pass on the GPU (``kdecal._core.loo_grad``).

    With ``L_ij = bias[i] + scale * <logq_j, p_i>``, ``w_ij = exp(L_ij - lse[j])`` for
    ``i != j`` and ``coef[j, c] = dloss/dE[j, c] - <E_j, dloss/dE_j>``, returns::

        grad_logq[j, k] = scale * sum_{i != j} w_ij coef[j, labels_i] p[i, k]
        grad_p[i, k]    = scale * sum_{j != i} w_ij coef[j, labels_i] logq[j, k]
        grad_bias[i]    = sum_{j != i} w_ij coef[j, labels_i]
        row_sum[j]      = sum_{i != j} w_ij coef[j, labels_i]

    Parameters
    ----------
    logq, p : array, shape (n, K) or (B, n, K), float32 or float64 (the same)
    labels : array, shape (n,) or (B, n), integer, values in ``0..n_classes-1``
    n_classes : int
    scale : float
        ``1 / h``.
    bias, lse : array, shape (n,) or (B, n), float64
    coef : array, shape (n, C) or (B, n, C), float64
    progress : callable or None
        Called with the rows done so far, counted over both passes and the batch.
    device_out : bool
        Return numba device arrays (no copy to the host).

    Returns
    -------
    grad_logq, grad_p : array, shape ([B,] n, K), float64
    grad_bias, row_sum : array, shape ([B,] n), float64
    """
    logq, batched = _batched(logq, 3)
    p, _ = _batched(p, 3)
    labels, _ = _batched(labels, 2)
    bias, _ = _batched(bias, 2)
    lse, _ = _batched(lse, 2)
    coef, _ = _batched(coef, 3)
    Bn, n, K = (int(s) for s in p.shape)
    C = int(n_classes)
    dlogq, dp = _precise(float(scale), logq, p)
    dbias, dlse, dcoef = _dev(bias), _dev(lse), _dev(coef)
    dlab = cuda.to_device(_host(labels).astype(np.int32))
    fast = dp.dtype == np.float32
    cj = cuda.device_array((Bn, n), dtype=np.float64)
    g_logq = cuda.device_array((Bn, n, K), dtype=np.float64)
    g_p = cuda.device_array((Bn, n, K), dtype=np.float64)
    g_bias = cuda.device_array((Bn, n), dtype=np.float64)
    row_sum = cuda.device_array((Bn, n), dtype=np.float64)
    if n and Bn:
        by_query, by_centre = _grad_kernels(K, C, fast)
        grid = ((n + TILE - 1) // TILE, Bn)
        _query_shift[grid, (TILE, 1)](dlogq, dp, cj)
        args = (dlogq, dp, cj, dlab, float(scale), dbias, dlse, dcoef)
        by_query[grid, (TILE, 1)](*args, g_logq, row_sum)
        cuda.synchronize()
        if progress is not None:
            progress(Bn * n)
        by_centre[grid, (TILE, 1)](*args, g_p, g_bias)
        cuda.synchronize()
        if progress is not None:
            progress(2 * Bn * n)
    g = [_finish(o, batched, device_out) for o in (g_logq, g_p, g_bias, row_sum)]
    return g[0], g[1], g[2], g[3]
