"""Dask backend: the leave-one-out reduction mapped over blocks of query rows.

The accumulators of a query row (running max ``m`` and power sums ``S``, ``Q``, ``T``)
depend on that row and on all n centres only, in the same order over the centres
whatever the row range, so splitting the query rows into blocks, reducing each block
with the compiled engine on a ``dask.distributed`` worker and concatenating the blocks
gives the accumulators of the in-process ``"cpp"`` backend bit for bit.

Per call, on the current ``dask.distributed`` client (:func:`get_client`):

- the centre arrays (``logq``, ``p``, labels) are broadcast to every worker once and
  kept there for later calls on the same arrays (a bandwidth search makes several
  passes over the same centres); a small cache of the last few distinct arrays,
  recognised by their content (:func:`dask.base.tokenize`), releases the oldest;
- the query rows are cut into blocks (:func:`plan_blocks`, from n, K, the number of
  bandwidths and problems, and the number of worker threads); each block is one task,
  which runs the engine on one thread, so that a worker runs as many blocks at once as
  it has threads (its ``nthreads``) and Dask's scheduler balances the blocks across the
  workers (queued blocks move to idle workers; an engine call with all the worker's
  threads per task would either oversubscribe the cores ``nthreads``-fold or, serialised
  within the worker, hide the waiting blocks from that balancing);
- only the per-row accumulators come back, O(n K) in all.

A worker lost during a call is handled by the scheduler: its tasks run again on
another worker (the broadcast centres have a replica on every worker), and since every
block is a pure function of its inputs the result does not change.

``dask`` and ``distributed`` are imported on first use only; without them a clear
ImportError names ``pip install "kdecal[dask]"``.
"""

from __future__ import annotations

import math
import threading
import uuid
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np

INSTALL_HINT = 'pip install "kdecal[dask]"'

#: Smallest task, in kernel-term evaluations (query rows x centres x bandwidths x
#: problems x K): about 15 ms of one core, so the per-task overhead of the scheduler
#: (about 1 ms) stays small.
MIN_BLOCK_WORK = 1e8

#: Largest task, in the same units: about a minute of one core, so that a lost worker
#: costs little recomputation and the progress report moves.
MAX_BLOCK_WORK = 5e11

#: Tasks per worker thread (at least), so that a slow or lost worker does not hold the
#: rest up.
BLOCKS_PER_THREAD = 3

#: Distinct centre arrays kept on the workers between calls.
CACHE_SIZE = 6

_cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
_cache_lock = threading.Lock()


def _distributed() -> Any:
    try:
        import dask  # noqa: F401
        import distributed
    except ImportError as exc:
        raise ImportError(
            f'backend="dask" needs dask and dask.distributed, which could not be imported '
            f"({exc}); install them with: {INSTALL_HINT}"
        ) from exc
    return distributed


def get_client() -> Any:
    """Return the current ``dask.distributed`` client (the one ``backend="dask"`` uses).

    The current client is the most recently created one, or the one made current with
    ``with client.as_current():``.

    Returns
    -------
    distributed.Client

    Raises
    ------
    ImportError
        If dask or dask.distributed is not installed (``pip install "kdecal[dask]"``).
    ValueError
        If there is no client: create one first, for a local cluster
        ``Client(LocalCluster())`` or for an existing one ``Client("tcp://host:8786")``.
    """
    distributed = _distributed()
    try:
        return distributed.default_client()
    except ValueError as exc:
        raise ValueError(
            "backend='dask' runs on the current dask.distributed client and there is none; "
            "create one first, e.g. `from dask.distributed import Client; client = Client()` "
            "(a local cluster) or `client = Client('tcp://scheduler-address:8786')` (an "
            "existing cluster)"
        ) from exc


def check_available() -> None:
    """Check that ``backend="dask"`` can run here: dask installed, a client, the core.

    Raises
    ------
    ImportError
        If dask or dask.distributed is not installed.
    ValueError
        If there is no current client, or kdecal's compiled core (which the workers run,
        and whose debiasing the client uses) is not importable.
    """
    from . import _backends

    get_client()
    if _backends._core is None:
        raise ValueError(
            f"backend 'dask' runs kdecal's compiled core, which could not be imported here "
            f"({_backends._core_error})"
        )


def clear_cache() -> None:
    """Release the centre arrays kept on the workers (they are dropped there)."""
    with _cache_lock:
        _cache.clear()


def _broadcast(client: Any, x: Any, *, cache: bool) -> Any:
    """Return a future of ``x`` with a replica on every worker (cached by content)."""
    if not cache:
        return client.scatter(x, broadcast=True, hash=False)
    from dask.base import tokenize

    key = (str(client.id), tokenize(x))
    with _cache_lock:
        fut = _cache.get(key)
        if fut is not None and fut.status == "finished":
            _cache.move_to_end(key)
            return fut
    fut = client.scatter(x, broadcast=True, hash=False)
    with _cache_lock:
        for k in [k for k, f in _cache.items() if f.status != "finished"]:
            del _cache[k]  # lost, or from a closed client
        _cache[key] = fut
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return fut


def plan_blocks(start: int, stop: int, row_work: float, n_threads: int) -> list[tuple[int, int]]:
    """Cut the query rows ``[start, stop)`` into contiguous blocks, one task each.

    Parameters
    ----------
    start, stop : int
        Query rows to reduce.
    row_work : float
        Work of one query row, in kernel-term evaluations (centres x bandwidths x
        problems x K).
    n_threads : int
        Worker threads of the cluster (the sum of the workers' ``nthreads``).

    Returns
    -------
    list of (int, int)
        Row ranges covering ``[start, stop)`` in order, of near-equal sizes: at least
        :data:`BLOCKS_PER_THREAD` per thread and at most :data:`MAX_BLOCK_WORK` of work
        each, but none below :data:`MIN_BLOCK_WORK` (one block for small work).
    """
    rows = stop - start
    if rows <= 0:
        return []
    total = rows * max(row_work, 1.0)
    want = max(BLOCKS_PER_THREAD * max(n_threads, 1), math.ceil(total / MAX_BLOCK_WORK))
    most = max(1, int(total // MIN_BLOCK_WORK))
    nb = max(1, min(rows, want, most))
    edges = [start + (rows * i) // nb for i in range(nb + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _core_on_worker() -> Any:
    from . import _backends

    if _backends._core is None:
        raise RuntimeError(
            "kdecal's compiled core could not be imported on this dask worker "
            f"({_backends._core_error}); install kdecal with its core on every worker"
        )
    return _backends._core


def _reduce_block(*args: Any) -> tuple[np.ndarray, ...]:
    """Worker side of :func:`loo_reduce`: one single-threaded engine call on one block."""
    return tuple(_core_on_worker().loo_reduce(*args, 1))


def _reduce_block_pairs(*args: Any) -> tuple[np.ndarray, ...]:
    """:func:`_reduce_block` that also returns the pair sums D."""
    return tuple(_core_on_worker().loo_reduce(*args, 1, pairs=True))


def _reduce_block_resid(resid: np.ndarray, pairs: bool, *args: Any) -> tuple[np.ndarray, ...]:
    """:func:`_reduce_block` with the residual sums A and U (and D with ``pairs``)."""
    return tuple(_core_on_worker().loo_reduce(*args, 1, pairs=pairs, resid=resid))


def _reduce_multi_block(*args: Any) -> tuple[np.ndarray, ...]:
    """Worker side of :func:`loo_reduce_multi`: one single-threaded engine call."""
    return tuple(_core_on_worker().loo_reduce_multi(*args, 1))


def _reduce_multi_block_resid(resid: np.ndarray, *args: Any) -> tuple[np.ndarray, ...]:
    """:func:`_reduce_multi_block` that also returns the residual sums U."""
    return tuple(_core_on_worker().loo_reduce_multi(*args, 1, resid=resid))


def _n_threads(client: Any) -> int:
    return max(1, sum(client.nthreads().values()))


def _run_blocks(
    client: Any,
    func: Any,
    args: tuple[Any, ...],
    blocks: list[tuple[int, int]],
    name: str,
    show: bool,
) -> list[tuple[np.ndarray, ...]]:
    """Submit one task per row block, report progress, gather the results in order."""
    tag = uuid.uuid4().hex
    futures = [
        client.submit(func, *args, a, b, key=f"{name}-{tag}-{i}", pure=False)
        for i, (a, b) in enumerate(blocks)
    ]
    done = False
    try:
        if show:
            from distributed import progress

            progress(futures)
        parts = client.gather(futures)
        done = True
    finally:
        if not done:  # Ctrl-C or a failed block: stop the rest
            client.cancel(futures)
    return list(parts)


def _concat(parts: list[tuple[np.ndarray, ...]], k: int, axis: int) -> np.ndarray:
    first = parts[0][k]
    if first.shape == (0, 0, 0):  # a power sum that was not requested
        return first
    return np.concatenate([x[k] for x in parts], axis=axis)


def loo_reduce(
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
    show: bool = False,
    pairs: bool = False,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """``kdecal._backends.loo_reduce`` on the current client; same arguments and results.

    The query rows ``[row_start, row_stop)`` are cut by :func:`plan_blocks`; ``show``
    displays ``distributed.progress`` over the tasks.

    Returns
    -------
    m : ndarray, shape ([B,] H, R), float64
    S, Q, T : ndarray, shape ([B,] H, R, C), float64, or (0, 0, 0) when not requested
        Equal, bit for bit, to the in-process engine's.
    D : ndarray, shape ([B,] H, R, C), float64, only with ``pairs``
        The pair sums ``S**2 - Q`` (see ``kdecal._backends.loo_reduce``), bit for bit too.
    A : ndarray, shape ([B,] H, R, K), float64, only with ``resid``
    U : ndarray, shape ([B,] H, R), float64, only with ``resid``
        The residual sums (see ``kdecal._backends.loo_reduce``), bit for bit too: the
        row blocks' A concatenate along the row axis like S, their U like m.
    """
    from . import _backends

    if row_stop <= row_start:  # nothing to distribute; same (degenerate) call in-process
        if resid is not None:
            core_reduce: Any = _backends._core.loo_reduce
            args0 = (logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop, 1)
            return tuple(core_reduce(*args0, pairs=pairs, resid=resid))
        return _backends._core.loo_reduce(
            logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop, 1, pairs=pairs
        )
    client = get_client()
    n, K = p.shape[-2], p.shape[-1]
    n_problems = p.shape[0] if p.ndim == 3 else 1
    blocks = plan_blocks(
        row_start, row_stop, float(n) * K * len(scale) * n_problems, _n_threads(client)
    )
    args: tuple[Any, ...] = (
        _broadcast(client, logq, cache=True),
        _broadcast(client, p, cache=True),
        _broadcast(client, labels, cache=True),
        int(n_classes),
        scale,
        _broadcast(client, bias, cache=False),
        int(powers),
    )
    if resid is None:
        func: Any = _reduce_block_pairs if pairs else _reduce_block
    else:  # the residuals go first (the row range comes last)
        func = _reduce_block_resid
        args = (_broadcast(client, resid, cache=False), bool(pairs), *args)
    parts = _run_blocks(client, func, args, blocks, "kdecal-loo-reduce", show)
    m = np.concatenate([x[0] for x in parts], axis=-1)
    n_out = len(parts[0])
    # U (the last output with resid) has the shape of m: its rows on the last axis
    last = n_out - 1 if resid is not None else n_out
    out = [m, *(_concat(parts, k, -2) for k in range(1, last))]
    if resid is not None:
        out.append(np.concatenate([x[-1] for x in parts], axis=-1))
    return tuple(out)


def loo_reduce_multi(
    logq: np.ndarray,
    p: np.ndarray,
    m: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: float,
    bias: np.ndarray,
    weights: np.ndarray | None,
    powers: int,
    row_start: int,
    row_stop: int,
    *,
    show: bool = False,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """``kdecal._backends.loo_reduce_multi`` on the current client (validated arguments).

    Returns
    -------
    S : ndarray, shape (B, R, C), float64
    Q : ndarray, shape (B, R, C), float64, or (0, 0, 0) if ``powers == 1``
        Equal, bit for bit, to the in-process engine's.
    U : ndarray, shape (B, R), float64, only with ``resid``
        The residual sums, bit for bit too.
    """
    client = get_client()
    n, K = p.shape
    B = labels.shape[0]
    blocks = plan_blocks(row_start, row_stop, float(n) * K * max(1.0, B / 8.0), _n_threads(client))
    args: tuple[Any, ...] = (
        _broadcast(client, logq, cache=True),
        _broadcast(client, p, cache=True),
        _broadcast(client, m, cache=True),
        _broadcast(client, labels, cache=False),
        int(n_classes),
        float(scale),
        _broadcast(client, bias, cache=True),
        None if weights is None else _broadcast(client, weights, cache=False),
        int(powers),
    )
    if resid is None:
        parts = _run_blocks(client, _reduce_multi_block, args, blocks, "kdecal-loo-multi", show)
        return _concat(parts, 0, 1), _concat(parts, 1, 1)
    args = (_broadcast(client, resid, cache=False), *args)
    parts = _run_blocks(client, _reduce_multi_block_resid, args, blocks, "kdecal-loo-multi", show)
    U = np.concatenate([x[2] for x in parts], axis=1)
    return _concat(parts, 0, 1), _concat(parts, 1, 1), U


# ------------------------------------------------------------------ dask-array input


def is_dask_array(x: object) -> bool:
    """Whether ``x`` is a ``dask.array.Array`` (checked without importing dask)."""
    mod = type(x).__module__ or ""
    return (mod == "dask" or mod.startswith("dask.")) and hasattr(x, "map_blocks")


def _check_block(
    block: np.ndarray, name: str, a: int, b: int
) -> tuple[np.ndarray, list[tuple[type[Warning], str]]]:
    """Validate rows ``[a, b)`` with the in-memory checks, where the block lives.

    Returns the validated rows and the warnings the checks gave (to re-issue on the
    client); a failed check raises with the block's rows in the message.
    """
    from ._validation import check_probs

    if block.shape[0] == 0:
        return np.zeros((0, 2 if block.ndim == 1 else block.shape[1])), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            p = check_probs(block, name, min_n=1).p
        except ValueError as exc:
            raise ValueError(
                f"{name} (a dask array), in its rows {a}..{b - 1} (indices below count from "
                f"row {a}): {exc}"
            ) from None
    return p, [(w.category, str(w.message)) for w in caught]


def check_probs(x: Any, name: str = "probs", min_n: int = 3) -> Any:
    """Validate probabilities given as a dask array, block by block on the cluster.

    Every row check of :func:`kdecal._validation.check_probs` (finite, non-negative,
    rows summing to 1, binary values in [0, 1]) and its clipping and renormalisation
    run on each block of rows where the block lives (the current dask scheduler:
    the workers of a ``dask.distributed`` client); the client receives the validated
    rows once, as the in-memory path would return them, and re-issues the checks'
    warnings (e.g. rows renormalised), naming the blocks.

    Parameters
    ----------
    x : dask.array.Array, shape (n, K) or (n,), numeric
        Chunked by rows (chunks along K are merged first).
    name : str
        Argument name used in error messages.
    min_n : int
        Fewest rows accepted.

    Returns
    -------
    kdecal._validation.Probs
        The same object as for ``x.compute()``.

    Raises
    ------
    TypeError
        If the dtype is not real numeric.
    ValueError
        On a bad shape, unknown chunk sizes, too few rows, or a row that fails a check
        (the message names the block's rows and the index within the block).
    """
    from ._validation import Probs

    dt = np.dtype(x.dtype)
    if dt == object or not (np.issubdtype(dt, np.number) or np.issubdtype(dt, np.bool_)):
        raise TypeError(f"{name} must be a numeric array, got dtype {dt}")
    if np.issubdtype(dt, np.complexfloating):
        raise TypeError(f"{name} must be real, got dtype {dt}")
    if x.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (n, K) or (n,), got shape {x.shape}")
    if any(isinstance(s, float) and math.isnan(s) for s in x.shape):
        raise ValueError(
            f"{name} is a dask array of unknown shape {x.shape}; call "
            f"{name}.compute_chunk_sizes() first"
        )
    if x.ndim == 2 and x.shape[1] == 1:
        raise ValueError(
            f"{name} has shape {x.shape}: K = 1 class is not a classification problem; "
            "pass a 1-D array of P(y = 1) for binary problems"
        )
    if x.size == 0:
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if x.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {x.shape[0]}")
    import dask

    from .warnings import warn_user

    binary = x.ndim == 1
    if not binary and x.numblocks[1] != 1:
        x = x.rechunk({1: -1})
    edges = np.concatenate([[0], np.cumsum(x.chunks[0])]).astype(int)
    blocks = x.to_delayed().ravel()
    check = dask.delayed(_check_block, pure=True)
    parts = dask.compute(
        *[check(blk, name, int(a), int(b)) for blk, a, b in zip(blocks, edges, edges[1:])]
    )
    seen: dict[tuple[type[Warning], str], list[int]] = {}
    for (_, caught), a in zip(parts, edges):
        for category, message in caught:
            seen.setdefault((category, message), []).append(int(a))
    for (category, message), starts in seen.items():
        where = ", ".join(str(a) for a in starts[:5]) + (", ..." if len(starts) > 5 else "")
        warn_user(
            f"{name} (a dask array), in its block(s) starting at row {where} (row "
            f"numbers below count from the block's first row): {message}",
            category,
        )
    p = np.ascontiguousarray(np.concatenate([q for q, _ in parts]), dtype=np.float64)
    dtype = np.dtype(np.float32) if dt == np.float32 else np.dtype(np.float64)
    return Probs(p=p, dtype=dtype, binary=binary)
