"""Backend dispatch for the leave-one-out reduction.

Backends return the same per-query accumulators (running max ``m`` and power sums
``S``, ``Q``, ``T``; see :func:`loo_reduce`), so every estimator is written once on top;
:func:`loo_reduce_multi` gives the class sums of many label sets at one bandwidth.
``"auto"`` picks ``"cuda"`` for arrays on a CUDA device (when the GPU engine is usable),
else ``"cpp"`` (the compiled core) when it imports, else ``"numba"``; ``"cuda"`` runs
the numba-cuda kernels of :mod:`kdecal._engine.cuda` (``pip install "kdecal[cuda]"``, an NVIDIA
GPU, or numba's CUDA simulator); ``"dask"`` runs the compiled core on the workers of the
current ``dask.distributed`` client, one task per block of query rows
(:mod:`kdecal._engine.dask`), with the same results.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Literal, cast

import numpy as np

from ..warnings import BackendFallbackWarning, warn_user
from . import binary as _binary
from . import cpp as _cpp
from . import dask as _dask
from . import engines as _engines
from . import runtime as _runtime

BACKENDS = ("cpp", "numba", "cuda")

#: The ``backend`` argument of the public functions: "auto" (the GPU engine for CUDA
#: arrays, else the compiled core, else numba), an engine, or "dask" (row blocks of the
#: compiled core on a Dask cluster).
Backend = Literal["auto", "cpp", "numba", "cuda", "dask"]

_warned = False


def available_backends() -> list[str]:
    """Names of the backends that work in this installation.

    Returns
    -------
    list of str
        A subset of ``["cpp", "numba", "cuda"]``: ``"cuda"`` only where a CUDA device
        (or numba's CUDA simulator) is usable.
    """
    out = []
    if _runtime._core is not None:
        out.append("cpp")
    if _engines.load_numba() is not None:
        out.append("numba")
    if _engines.load_cuda() is not None:
        out.append("cuda")
    return out


def resolve_backend(backend: object, *data: object) -> Backend:
    """Turn ``"auto"`` into a concrete backend and check that it is available.

    ``"auto"`` picks ``"cuda"`` when one of ``data`` (the caller's arrays, as given) is
    a CUDA array and the GPU engine is usable; otherwise the compiled core, else numba.
    ``"dask"`` is never chosen by ``"auto"``; asked for, it needs dask.distributed, a
    current client and the compiled core.

    Raises
    ------
    ValueError
        If ``backend`` is unknown or not available here; the message lists the
        available backends (for ``"numba"``, it names ``pip install "kdecal[numba]"``).
        For ``"dask"``: no current client, or no compiled core.
    ImportError
        For ``"auto"`` when there is no engine at all (neither the compiled core nor
        numba imports; the message says what to install), and for ``"dask"`` when dask
        or dask.distributed is not installed (the message names
        ``pip install "kdecal[dask]"``).
    """
    global _warned
    if backend == "dask":
        _dask.check_available()
        return "dask"
    on_device = backend == "auto" and any(_runtime.is_device_array(x) for x in data)
    if on_device and _engines.load_cuda() is not None:
        return "cuda"
    if backend == "cuda":
        if _engines.load_cuda() is None:
            raise ValueError(f"backend 'cuda' is not available here: {_engines._cuda_error}")
        return "cuda"
    # the CPU engines only: probing for a GPU costs an import of numba's CUDA target;
    # numba itself is imported only where the compiled core is missing or it is asked for
    if backend == "auto":
        if _runtime._core is not None:
            return "cpp"
        if _engines.load_numba() is not None:
            if not _warned:
                warn_user(
                    f"kdecal's compiled core could not be imported ({_runtime._core_error}); "
                    "using the slower numba backend. Reinstall kdecal with a C++ compiler "
                    "to build kdecal._core.",
                    BackendFallbackWarning,
                )
                _warned = True
            return "numba"
        raise ImportError(
            "kdecal has no engine here: its compiled core kdecal._core could not be "
            f"imported ({_runtime._core_error}) and {_engines.numba_missing()}. Install numba "
            f"({_engines.NUMBA_INSTALL}), or kdecal from a wheel with the compiled core for this "
            "platform (or from source, with a C++17 compiler)"
        )
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown backend {backend!r}; choose 'auto', one of the available backends "
            f"{available_backends()}, or 'dask' (a dask.distributed cluster)"
        )
    if backend == "cpp" and _runtime._core is None:
        why = str(_runtime._core_error)
    elif backend == "numba" and _engines.load_numba() is None:
        why = f"{_engines.numba_missing()}: {_engines.NUMBA_INSTALL}"
    else:
        return cast(Backend, str(backend))
    avail = [
        b
        for b, ok in (("cpp", _runtime._core is not None), ("numba", _engines.load_numba()))
        if ok
    ]
    raise ValueError(
        f"backend {backend!r} is not available here ({why}); available backends: {avail}"
    )


def loo_reduce(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: np.ndarray,
    bias: np.ndarray,
    *,
    powers: int = 1,
    backend: str = "cpp",
    progress: bool | None = None,
    rows: tuple[int, int] | None = None,
    pairs: bool = False,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Leave-one-out Dirichlet-kernel reduction over query rows (all centres).

    Parameters
    ----------
    logq, p : ndarray, shape (n, K) or (B, n, K), float32 or float64, C-contiguous
        Log query probabilities and centre probabilities (same dtype); a leading axis B
        holds independent problems (e.g. the one-vs-rest problems of class-wise
        calibration), computed in one engine call.
    labels : ndarray, shape (n,) or (B, n), int64
        Group label of each centre, in ``0..n_classes-1``.
    n_classes : int
        Number of label groups C.
    scale : ndarray, shape (H,), float64
        ``1 / h`` for each bandwidth.
    bias : ndarray, shape (H, n) or (B, H, n), float64
        ``-sum_k lgamma(p[i, k] / h + 1)`` for each bandwidth and centre.
    powers : {1, 2, 3}
        Which power sums to return.
    backend : {"cpp", "numba", "cuda", "dask"}
        A resolved backend name.
    progress : bool or None
        Show a progress bar; ``None`` shows one for long work only.
    rows : (int, int), optional
        Query rows ``[start, stop)`` to reduce (against all n centres); default all.
    pairs : bool
        Also return the pair sums ``D`` (needs ``powers >= 2``).
    resid : ndarray, shape (n,) or (B, n) (the shape of ``p`` less its last axis), float64
        Per-centre residuals ``u`` (finite; any sign): also return the residual sums
        ``A`` and ``U``, computed in the same pass.

    Returns
    -------
    m : ndarray, shape ([B,] H, R), float64 (R = number of query rows)
        ``max_{i != j} L_ij`` with ``L_ij = bias[t, i] + scale[t] * <logq_j, p_i>``.
    S, Q, T : ndarray, shape ([B,] H, n, C), float64
        ``sum_{i != j, labels_i = c} exp(q (L_ij - m_j))`` for q = 1, 2, 3 (Q and T have
        shape (0, 0, 0) unless requested).
    D : ndarray, shape ([B,] H, n, C), float64, only with ``pairs``
        ``S**2 - Q``, the sum of ``w_ij w_kj`` over ordered pairs of distinct centres of
        class c, accumulated without cancellation: full relative precision, independent
        of the order of the centres and of the backend, also when one neighbour carries
        almost all the weight (there ``S**2 - Q`` loses ``log10(S**2 / D)`` digits).
    A : ndarray, shape ([B,] H, R, K), float64, only with ``resid``
        ``A[t, j, k] = sum_{i != j} exp(L_ij - m_j) * p[i, k]``, over the centres of every
        label group (``p`` converted to float64), relative to the same ``m`` as ``S``.
    U : ndarray, shape ([B,] H, R), float64, only with ``resid``
        ``U[t, j] = sum_{i != j} exp(2 (L_ij - m_j)) * resid[i]``.  ``A`` and ``U`` are
        summed over the same terms as ``S`` (each backend's dropping or clamping of the
        negligible ones); ``m``, ``S``, ``Q``, ``T``, ``D`` do not depend on ``resid``.

    Raises
    ------
    ValueError
        If ``pairs`` is set with ``powers < 2``; if ``resid`` has the wrong shape or a
        non-finite value.

    Notes
    -----
    The bar follows one engine call (the compiled core reports its rows as it goes);
    with or without it, Ctrl-C stops the call within about a second and raises
    ``KeyboardInterrupt``.
    """
    n = p.shape[-2]
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    n_problems = p.shape[0] if p.ndim == 3 else 1
    if resid is not None:
        resid = _check_resid(resid, tuple(p.shape[:-1]), on_device=backend == "cuda")
    work = float(r1 - r0) * n * len(scale) * n_problems
    if backend == "dask":  # row blocks on the workers; dask's own progress report
        # a task runs the engine on one thread of its worker: the in-pass residual sums'
        # scratch is that thread's (see RESIDUAL_SCRATCH_BYTES)
        binary = _use_binary_engine("cpp", p, powers)
        blocked = (
            resid is not None
            and not binary
            and _residual_scratch_bytes(p, n_classes, len(scale), threads=1)
            > RESIDUAL_SCRATCH_BYTES
        )
        out = _dask.loo_reduce(
            logq,
            p,
            labels,
            n_classes,
            scale,
            bias,
            powers,
            r0,
            r1,
            show=_runtime.show_progress(work, progress),
            pairs=pairs,
            resid=None if blocked else resid,
            binary=functools.partial(_binary.reduce_block, BINARY_METHOD) if binary else None,
        )
        if blocked:  # formed here, from the same row maxima
            assert resid is not None
            local = "cpp" if _runtime._core is not None else "numba"
            sums = _residual_sums_by_blocks(logq, p, scale, bias, out[0], r0, r1, resid, local)
            out = (*out, *sums)
        return out
    if _use_binary_engine(backend, p, powers):
        return _binary.loo_reduce_rows(
            logq,
            p,
            labels,
            n_classes,
            scale,
            bias,
            powers,
            r0,
            r1,
            pairs=pairs,
            resid=resid,
            method=BINARY_METHOD,
            progress=progress,
            backend=backend,
        )
    blocked = (
        resid is not None
        and backend in ("cpp", "numba")  # the host engines' per-thread scratch
        and _residual_scratch_bytes(p, n_classes, len(scale)) > RESIDUAL_SCRATCH_BYTES
    )
    out = _engines.dense_loo_reduce(
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
        resid=None if blocked else resid,
    )
    if blocked:
        assert resid is not None
        out = (
            *out,
            *_residual_sums_by_blocks(logq, p, scale, bias, out[0], r0, r1, resid, backend),
        )
    return out


#: Bytes of the engine's per-thread scratch for the residual sums beyond which
#: :func:`loo_reduce` forms them apart from its pass (:func:`_residual_sums_by_blocks`):
#: the pass keeps each label group's partial sums of every coordinate, ``(K + 1) C H``
#: doubles per query row of a task of at least 16 rows, in every thread: 3.2 GB per
#: thread for a canonical problem of K = 5,000 classes (C = K), whatever n.
RESIDUAL_SCRATCH_BYTES = 256e6


def _residual_scratch_bytes(p: Any, n_classes: int, H: int, threads: int | None = None) -> float:
    """Return the residual sums' share of the dense engine's scratch, all threads (bytes).

    ``threads``: the engine's threads (default: :func:`runtime.get_num_threads`).
    """
    K = p.shape[-1]
    nt = max(1, _runtime.get_num_threads() if threads is None else threads)
    return 8.0 * (K + 1) * n_classes * H * 16 * nt


def _residual_sums_by_blocks(
    logq: np.ndarray,
    p: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    m: np.ndarray,
    r0: int,
    r1: int,
    resid: np.ndarray,
    backend: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the residual sums ``A``, ``U`` of :func:`loo_reduce` from kernel weight blocks.

    For problems whose in-pass residual sums would need a large scratch (many label
    groups and coordinates; :data:`RESIDUAL_SCRATCH_BYTES`): the pass runs without them,
    and each bandwidth's leave-one-out weights ``w_ij = exp(L_ij - m_j)`` of a block of
    query rows (:func:`kernel_weights`, relative to the pass's own row maximum ``m``)
    give ``A = W p`` and ``U = W^2 u`` as matrix products. Memory O(n K + rows x n);
    the same terms as the pass's to ``exp(-64)`` of the row maximum (kept here, dropped
    there), so the sums agree to rounding.
    """
    batched = p.ndim == 3
    P3 = p if batched else p[None]
    L3 = logq if batched else logq[None]
    B3 = bias if batched else bias[None]
    U3 = resid if batched else resid[None]
    M3 = m if batched else m[None]
    nb, n, K = P3.shape
    H = len(scale)
    R = r1 - r0
    A = np.zeros((nb, H, R, K))
    U = np.zeros((nb, H, R))
    engine = "numba" if backend == "numba" else "cpp"
    if n < 2 or R <= 0:  # no centre besides the query itself: no terms
        return (A, U) if batched else (A[0], U[0])
    rows = int(min(R, max(16, 64e6 // (8.0 * n))))
    for b in range(nb):
        pk = np.ascontiguousarray(P3[b])
        lq = np.ascontiguousarray(L3[b])
        for t in range(H):
            m_full = np.zeros(n)
            m_full[r0:r1] = M3[b, t]
            bias_t = np.ascontiguousarray(B3[b, t], dtype=np.float64)
            for j0 in range(r0, r1, rows):
                j1 = min(r1, j0 + rows)
                W, order = kernel_weights(lq, pk, m_full, float(scale[t]), bias_t, j0, j1, engine)
                A[b, t, j0 - r0 : j1 - r0] = W @ pk[order].astype(np.float64)
                np.multiply(W, W, out=W)
                U[b, t, j0 - r0 : j1 - r0] = W @ U3[b][order]
    return (A, U) if batched else (A[0], U[0])


#: Binary problems (K = 2: top-label, class-wise, binary inputs) with at least this many
#: points run on the fast engine of :mod:`kdecal._engine.binary` (the compiled core, float64):
#: every accumulator within 3e-9 relative of the exact sums (``m`` exactly), in
#: O(n log n + n W) instead of O(n^2). Below it the exact loop is as fast.
BINARY_MIN_N = 2048

#: Method of the fast binary engine: "auto" (exact windows or bounded local expansions,
#: whichever is estimated faster), "local", "window", "binned"; "exact" keeps the dense
#: O(n^2) loop for every n (validation, reproductions). The environment variable ``KDECAL_BINARY_METHOD`` sets it.
BINARY_METHOD = os.environ.get("KDECAL_BINARY_METHOD", "auto")


def single_precision(a: np.ndarray) -> np.ndarray:
    """Return ``a`` in float32, 0 where ``|a|`` is below float32's smallest normal number.

    The operands of the resampling's float32 products (:func:`kernel_weights` with
    ``single``): subnormal operands would slow the products down, and each such entry
    moves a sum by at most ``1.2e-38``.
    """
    out = a.astype(np.float32)
    np.copyto(out, 0.0, where=np.abs(a) < np.finfo(np.float32).tiny)
    return out


def kernel_weights(
    logq: np.ndarray,
    p: np.ndarray,
    m: np.ndarray,
    scale: float,
    bias: np.ndarray,
    row_start: int,
    row_stop: int,
    backend: str = "cpp",
    single: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the leave-one-out kernel weights of query rows ``[row_start, row_stop)``.

    Returns ``W`` of shape ``(row_stop - row_start, n)`` float64 (float32 with ``single``:
    the same weights rounded, and 0 below float32's smallest normal number, whose
    subnormal operands would slow the products down) and ``order`` (n,)
    int64 with ``W[r, s] = w_{j, order[s]}`` for ``j = row_start + r``: the weights
    that :func:`loo_reduce_multi` sums (0 on the diagonal), kept down to ``exp(-230)``
    of the row's maximum where that pass drops those below ``exp(-64)`` (a bootstrap
    sample that draws none of a row's near centres leaves it only far terms), the
    centres in the engine's order, so that products with many value vectors are dense
    GEMMs (``W @ M[order]``).  The arguments are those of
    :func:`loo_reduce_multi` (checked by the compiled core). ``backend``: "cpp" (the
    compiled core) or "numba" (its twin, :func:`kdecal._engine.numba.kernel_weights`:
    the centres in their own order, unchecked arguments).

    Raises
    ------
    RuntimeError
        "cpp" without the compiled core.
    ImportError
        "numba" without numba.
    ValueError, TypeError
        As :func:`loo_reduce_multi` ("cpp").
    """
    if backend == "numba":
        W, order = _engines.require_numba().kernel_weights(
            logq, p, m, scale, bias, row_start, row_stop
        )
        return (single_precision(W) if single else W), order
    return _cpp.kernel_weights(logq, p, m, scale, bias, row_start, row_stop, single)


def binary_engine_serves(backend: str, n: int) -> bool:
    """Whether float64 binary (K = 2) problems of n points run on the fast binary engine.

    On the ``cpp`` backend in process and on ``dask`` in row blocks on the workers (the
    compiled core), and on ``numba`` (its twin, :mod:`kdecal._engine.numba_binary`).
    """
    if BINARY_METHOD == "exact" or n < BINARY_MIN_N:
        return False
    if backend == "numba":
        return _engines.load_numba() is not None
    return (
        backend in ("cpp", "dask")
        and _runtime._core is not None
        and hasattr(_runtime._core, "binary_reduce")
    )


def _use_binary_engine(backend: str, p: Any, powers: int) -> bool:
    """Whether :func:`loo_reduce` runs a problem on the fast binary engine."""
    return (
        p.shape[-1] == 2 and p.dtype == np.float64 and binary_engine_serves(backend, p.shape[-2])
    )


def _use_binary_grad(p: Any, scale: float) -> bool:
    """Whether :func:`loo_grad` runs on the fast binary engine (K = 2, float64, h >= 1e-5)."""
    return (
        isinstance(p, np.ndarray)
        and p.shape[-1] == 2
        and p.dtype == np.float64
        and binary_engine_serves("cpp", p.shape[-2])
        and hasattr(_runtime._core, "binary_grad_centres")
        and 1.0 / float(scale) >= _binary.GRAD_MIN_H
    )


def _check_resid(resid: Any, shape: tuple[int, ...], *, on_device: bool = False) -> Any:
    """Check the residuals ``u`` of :func:`loo_reduce` (shape, finite): a float64 array.

    Host arrays come back as C-contiguous float64 (a copy only when needed); a CUDA array
    (``on_device``) is checked for its shape only and passed on as it is.
    """
    if on_device and _runtime.is_device_array(resid):
        if tuple(resid.shape) != shape:
            raise ValueError(f"resid must have shape {shape}, got {tuple(resid.shape)}")
        return resid
    u = np.asarray(resid)
    if u.dtype == object or not (
        np.issubdtype(u.dtype, np.floating) or np.issubdtype(u.dtype, np.integer)
    ):
        raise ValueError(f"resid must be a real numeric array, got dtype {u.dtype}")
    if u.shape != shape:
        raise ValueError(f"resid must have shape {shape}, got {u.shape}")
    u = np.ascontiguousarray(u, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(u.ravel()))
    if bad.size:
        idx = np.unravel_index(int(bad[0]), u.shape)
        raise ValueError(f"resid must be finite, got resid[{', '.join(map(str, idx))}] = {u[idx]}")
    return u


def loo_grad(
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
    backend: str = "cpp",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Streaming backward pass of the leave-one-out conditional expectation (C++ or CUDA).

    ``kdecal._core.loo_grad`` (see its docstring for the arguments and the returned
    ``(grad_logq, grad_p, grad_bias, row_sum)``) with the engine's thread count, a
    progress bar (``progress``: bool, or ``None`` for long work only) over its two
    passes, and Ctrl-C stopping it within about a second.  ``backend="cuda"`` runs
    :func:`kdecal._engine.cuda.loo_grad` instead (CUDA arrays in and out).  Binary
    (K = 2) float64 problems of n >= 2,048 points at h >= 1e-5 run on the fast binary
    engine (:func:`kdecal._engine.binary.loo_grad_k2`, each sum within 3e-9 of the sum
    of its terms' magnitudes; ``KDECAL_BINARY_METHOD=exact`` keeps this dense pass).

    Raises
    ------
    RuntimeError
        If the compiled core is not available (the numba backend has no backward pass).
    """
    n = p.shape[-2]
    n_problems = p.shape[0] if len(p.shape) == 3 else 1
    if backend != "cuda" and _use_binary_grad(p, scale):
        return _binary.loo_grad_k2(
            logq, p, labels, n_classes, scale, bias, lse, coef, progress=progress
        )
    work = 2.0 * n * n * n_problems  # two passes over the pairs
    # the GPU engine keeps its gradients on the device; every other backend runs the
    # compiled core's (the numba engine has no backward pass)
    kw = {"device_out": True} if backend == "cuda" else {}
    grad = _engines.engine("cuda" if backend == "cuda" else "cpp").loo_grad
    show = _runtime.show_progress(work, progress)
    with _runtime.progress_bar(show, 2 * n * n_problems, "kdecal LOO backward") as cb:
        g = grad(logq, p, labels, n_classes, scale, bias, lse, coef, progress=cb, **kw)
    return g[0], g[1], g[2], g[3]


def _check_multi_array(
    x: object, name: str, dtypes: tuple[type, ...], shape: tuple[int | None, ...]
) -> None:
    """Exact dtype (TypeError), C-contiguity (TypeError) and shape (ValueError) of one array."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in [np.dtype(d) for d in dtypes]:
        want = " or ".join(np.dtype(d).name for d in dtypes)
        raise TypeError(f"{name} must have dtype {want}, got {x.dtype}")
    if not x.flags.c_contiguous:
        raise TypeError(f"{name} must be C-contiguous")
    if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
        want = "(" + ", ".join("?" if s is None else str(s) for s in shape)
        want += ",)" if len(shape) == 1 else ")"
        raise ValueError(f"{name} must have shape {want}, got {x.shape}")


def _check_multi_values(
    m: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    weights: np.ndarray | None,
    row_start: int,
    row_stop: int,
) -> None:
    """Make the value checks of the C++ engine (the numba backend checks nothing)."""
    where = "kdecal.loo_reduce_multi"
    bad = np.flatnonzero(np.isnan(m[row_start:row_stop]) | (m[row_start:row_stop] == np.inf))
    if bad.size:
        j = row_start + int(bad[0])
        raise ValueError(
            f"{where}: m[{j}] = {m[j]} must be finite (or -inf for a row without centres)"
        )
    if labels.size:
        out = (labels < 0) | (labels >= n_classes)
        if out.any():
            b, i = np.unravel_index(int(np.argmax(out)), labels.shape)
            raise ValueError(
                f"{where}: labels[{b}, {i}] = {labels[b, i]} is outside "
                f"[0, n_classes = {n_classes})"
            )
    if weights is not None and weights.size:
        wbad = ~(np.isfinite(weights) & (weights >= 0))
        if wbad.any():
            b, i = np.unravel_index(int(np.argmax(wbad)), weights.shape)
            raise ValueError(
                f"{where}: weights[{b}, {i}] = {weights[b, i]} must be finite and >= 0"
            )


def loo_reduce_multi(
    logq: np.ndarray,
    p: np.ndarray,
    m: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: float,
    bias: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    powers: int = 1,
    backend: str = "cpp",
    row_start: int = 0,
    row_stop: int | None = None,
    progress: bool | None = False,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Leave-one-out class sums of B label sets at once, for one bandwidth.

    The kernel weights of the leave-one-out reduction do not depend on the labels, so
    the class sums of many label vectors (consistency resampling: labels redrawn from
    the predicted probabilities) or centre weightings (the bootstrap: multinomial
    resampling counts) share one pass over the ``n x n`` kernel.  For query rows ``j``
    in ``[row_start, row_stop)``, centres ``i != j``, label sets ``b`` and classes
    ``c``::

        L_ij       = bias[i] + scale * sum_k logq[j, k] * p[i, k]
        w_ij       = exp(L_ij - m[j])
        S[b, j, c] = sum_{i != j, labels[b, i] = c} weights[b, i] * w_ij
        Q[b, j, c] = sum_{i != j, labels[b, i] = c} weights[b, i] * w_ij ** 2
        U[b, j]    = sum_{i != j} weights[b, i] * w_ij ** 2 * resid[b, i]   (with resid)

    with ``m[j] = max_{i != j} L_ij`` given (the ``m`` that :func:`loo_reduce` returns
    for the same bandwidth), so every ``w_ij <= 1`` and, for a label set equal to the
    labels of a :func:`loo_reduce` call, ``S`` equals that call's ``S``.

    Parameters
    ----------
    logq, p : ndarray, shape (n, K), float32 or float64 (the same), C-contiguous
        Log query probabilities and centre probabilities.  The K-dot is computed in
        this dtype, everything after it in float64.
    m : ndarray, shape (n,), float64
        Row maxima of ``L_ij`` over ``i != j``; ``-inf`` marks a row without centres
        (it gets zeros).
    labels : ndarray, shape (B, n), int64
        B label sets, values in ``0..n_classes-1``.
    n_classes : int
        Number of classes C.
    scale : float
        ``1 / h`` (finite, > 0).
    bias : ndarray, shape (n,), float64
        ``-sum_k lgamma(p[i, k] / h + 1)``.
    weights : ndarray, shape (B, n), float64, or None
        Centre weights of each set (finite, >= 0); ``None`` means all 1.
    powers : {1, 2}
        Whether to return ``Q`` too.
    backend : {"cpp", "numba", "cuda", "dask", "auto"}
        Engine to use.
    row_start, row_stop : int
        Query rows ``[row_start, row_stop)``; ``row_stop=None`` means ``n``.
    progress : bool or None, default False
        Show a progress bar over the query rows; ``None`` shows one for long work only.
        Ctrl-C stops the call within about a second either way.
    resid : ndarray, shape (B, n), float64, or None
        Per-centre residuals of each set (finite; any sign): also return ``U``.

    Returns
    -------
    S : ndarray, shape (B, R, C), float64
        ``R = row_stop - row_start``; row ``r`` is query ``row_start + r``.
    Q : ndarray, shape (B, R, C), float64, or shape (0, 0, 0) if ``powers == 1``
    U : ndarray, shape (B, R), float64, only with ``resid``
        Summed over the same (not dropped) terms as ``S`` and ``Q``.

    Raises
    ------
    TypeError
        If an array is not a C-contiguous ndarray of the exact dtype (no hidden copies).
    ValueError
        On inconsistent shapes, labels outside ``[0, n_classes)``, negative or
        non-finite weights, non-finite ``resid``, NaN or ``+inf`` in ``m``, a bad ``scale``, ``powers`` or
        row range; the message names the argument.

    Notes
    -----
    Terms with ``L_ij - m[j] < -64`` are dropped (each is below ``1.6e-28`` of the
    row's largest term), as in the main engine.  With centre weights this means that a
    ``(b, j)`` whose every non-negligible centre has weight 0 gets ``S[b, j, :] = 0``
    (only at extreme bandwidths): treat a zero row total as undefined.  Cost: about
    ``n^2 B / 8`` vector additions (minus the dropped and zero-weight terms) on top of
    one ordinary pass; memory ``O(n B)`` for the re-laid label sets plus
    ``B C 8`` doubles per thread, besides the outputs.  Results do not depend on the
    number of threads nor on the row range.
    """
    be = resolve_backend(backend)
    _check_multi_array(p, "p", (np.float64, np.float32), (None, None))
    n, K = p.shape
    _check_multi_array(logq, "logq", (p.dtype.type,), (n, K))
    _check_multi_array(m, "m", (np.float64,), (n,))
    _check_multi_array(labels, "labels", (np.int64,), (None, n))
    B = labels.shape[0]
    _check_multi_array(bias, "bias", (np.float64,), (n,))
    if weights is not None:
        _check_multi_array(weights, "weights", (np.float64,), (B, n))
    if resid is not None:
        _check_multi_array(resid, "resid", (np.float64,), (B, n))
        rbad = ~np.isfinite(resid)
        if rbad.any():
            b, i = np.unravel_index(int(np.argmax(rbad)), resid.shape)
            raise ValueError(
                f"kdecal.loo_reduce_multi: resid[{b}, {i}] = {resid[b, i]} must be finite"
            )
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)):
        raise TypeError(f"n_classes must be an int, got {n_classes!r}")
    if n_classes < 1:
        raise ValueError(f"n_classes must be >= 1, got {n_classes}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number, got {scale!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale (1 / bandwidth) must be finite and > 0, got {scale}")
    if powers not in (1, 2) or isinstance(powers, bool):
        raise ValueError(f"powers must be 1 or 2, got {powers!r}")
    if row_stop is None:
        row_stop = n
    for name, v in (("row_start", row_start), ("row_stop", row_stop)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if not 0 <= row_start <= row_stop <= n:
        raise ValueError(
            f"need 0 <= row_start <= row_stop <= n, got row_start = {row_start}, "
            f"row_stop = {row_stop}, n = {n}"
        )
    n_classes, row_start, row_stop = int(n_classes), int(row_start), int(row_stop)
    if row_stop == row_start:  # (the core reads row_stop = 0 as n)
        if be in ("cpp", "dask"):  # still validate the values
            _check_multi_values(m, labels, n_classes, weights, row_start, row_stop)
        shape = (B, 0, n_classes)
        empty = (np.zeros(shape), np.zeros(shape if powers == 2 else (0, 0, 0)))
        return empty if resid is None else (*empty, np.zeros((B, 0)))
    args = (logq, p, m, labels, n_classes, float(scale), bias, weights, powers)
    kw = {} if resid is None else {"resid": resid}
    R = row_stop - row_start
    show = _runtime.show_progress(float(R) * n * max(1.0, B / 8.0), progress)
    if be == "dask":  # row blocks on the workers
        _check_multi_values(m, labels, n_classes, weights, row_start, row_stop)
        return _dask.loo_reduce_multi(*args, row_start, row_stop, show=show, resid=resid)
    if be != "cpp":  # (the compiled core checks them itself)
        _check_multi_values(m, labels, n_classes, weights, row_start, row_stop)
    run = _engines.engine(be).loo_reduce_multi
    with _runtime.progress_bar(show, R, "kdecal LOO resampling") as cb:
        return tuple(run(*args, row_start, row_stop, progress=cb, **kw))
