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
another worker, and since every block is a pure function of its inputs the result does
not change. The broadcast inputs have a replica on every worker when they are sent, but
the scheduler's active memory manager (on by default) reduces the replicas that no
waiting task needs, so a cached input can end up on one worker; where a lost worker took
the only replica, the call broadcasts its inputs again and runs its blocks again
(:data:`LOST_INPUT_RETRIES`).

``dask`` and ``distributed`` are imported on first use only; without them a clear
ImportError names ``pip install "kdecal[dask]"``.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import runtime as _runtime

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

#: Fewest query rows of a block of a binary problem on the fast binary engine (each
#: block repeats the engine's O(n log n) plan of all n centres): one block per worker
#: thread, fewer where the rows are few.
BINARY_BLOCK_ROWS = 2048

#: Distinct centre arrays kept on the workers between calls.
CACHE_SIZE = 6

#: Times a call broadcasts its inputs again and reruns its blocks after a lost worker
#: took the only replica of one of them (the call's futures then end as cancelled).
LOST_INPUT_RETRIES = 2

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
    get_client()
    if _runtime._core is None:
        raise ValueError(
            f"backend 'dask' runs kdecal's compiled core, which could not be imported here "
            f"({_runtime._core_error})"
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
    return _even_blocks(start, stop, max(1, min(rows, want, most)))


def _even_blocks(start: int, stop: int, nb: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into ``nb`` contiguous ranges of near-equal sizes, in order."""
    edges = [start + ((stop - start) * i) // nb for i in range(nb + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _core_on_worker() -> Any:

    if _runtime._core is None:
        raise RuntimeError(
            "kdecal's compiled core could not be imported on this dask worker "
            f"({_runtime._core_error}); install kdecal with its core on every worker"
        )
    return _runtime._core


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
    show: bool | None,
) -> list[tuple[np.ndarray, ...]]:
    """Submit one task per row block, report progress, gather the results in order."""
    tag = uuid.uuid4().hex
    futures = [
        client.submit(func, *args, a, b, key=f"{name}-{tag}-{i}", pure=False)
        for i, (a, b) in enumerate(blocks)
    ]
    done = False
    try:
        if show or (show is None and _runtime.interactive_stdout()):
            from distributed import progress

            progress(futures)
        parts = client.gather(futures)
        done = True
    finally:
        if not done:  # Ctrl-C or a failed block: stop the rest
            client.cancel(futures)
    return list(parts)


def _run_with_inputs(
    client: Any,
    make: Any,
    blocks: list[tuple[int, int]],
    name: str,
    show: bool | None,
) -> list[tuple[np.ndarray, ...]]:
    """Run :func:`_run_blocks` on ``(func, args) = make()``, which broadcasts the inputs.

    Again, with freshly broadcast inputs, where a lost worker took one of them (up to
    :data:`LOST_INPUT_RETRIES` times).
    """
    from distributed.client import FutureCancelledError

    for attempt in range(LOST_INPUT_RETRIES + 1):
        func, args = make()
        try:
            return _run_blocks(client, func, args, blocks, name, show)
        except FutureCancelledError:
            if attempt == LOST_INPUT_RETRIES:
                raise
            clear_cache()  # the cached replicas may be the lost ones
    raise AssertionError("unreachable")  # pragma: no cover


def worker_threads() -> int:
    """Threads of the current client's workers, in all."""
    return _n_threads(get_client())


def map_ordered(
    func: Any, shared: tuple[Any, ...], tasks: list[tuple[Any, ...]], name: str
) -> Iterator[Any]:
    """Run ``func(*shared, *task)`` for each task on the current client, in task order.

    The arrays of ``shared`` are broadcast to every worker once (cached like the
    centres of :func:`loo_reduce`); at most two tasks per worker thread run or wait
    ahead of the result yielded, so results the caller has not taken yet do not pile
    up on the workers.  Leaving the iteration early (Ctrl-C, an error, a caller that
    stops) cancels the tasks not yet taken.
    """
    from distributed.client import FutureCancelledError

    client = get_client()

    def broadcast() -> tuple[Any, ...]:
        return tuple(
            _broadcast(client, x, cache=True) if isinstance(x, np.ndarray) else x for x in shared
        )

    args = broadcast()
    window = 2 * _n_threads(client)
    tag = uuid.uuid4().hex
    pending: deque[tuple[int, Any]] = deque()
    nxt = retries = 0  # the next task to submit; inputs broadcast again so far
    try:
        while pending or nxt < len(tasks):
            while nxt < len(tasks) and len(pending) < window:
                key = f"{name}-{tag}-{retries}-{nxt}"
                pending.append((nxt, client.submit(func, *args, *tasks[nxt], key=key, pure=False)))
                nxt += 1
            i, fut = pending[0]
            try:
                result = fut.result()
            except FutureCancelledError:  # a lost worker took an input: again from i
                if retries == LOST_INPUT_RETRIES:
                    raise
                retries += 1
                client.cancel([f for _, f in pending])
                pending.clear()
                clear_cache()
                args = broadcast()
                nxt = i
                continue
            pending.popleft()
            yield result
    finally:
        if pending:
            client.cancel([f for _, f in pending])


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
    show: bool | None = False,
    pairs: bool = False,
    resid: np.ndarray | None = None,
    binary: Any = None,
) -> tuple[np.ndarray, ...]:
    """``kdecal._engine.backends.loo_reduce`` on the current client; same arguments and results.

    The query rows ``[row_start, row_stop)`` are cut by :func:`plan_blocks`; ``show``
    displays ``distributed.progress`` over the tasks.  ``binary``: the task of one row
    block of a binary problem on the fast binary engine (a picklable callable taking
    ``resid, pairs``, the engine's arguments and the row range, one thread; the caller's,
    ``kdecal._engine.binary.reduce_block``, since this layer sits below that engine):
    one block per worker thread then (each block plans and sorts all n centres,
    O(n log n), so that more blocks would repeat that part).

    Returns
    -------
    m : ndarray, shape ([B,] H, R), float64
    S, Q, T : ndarray, shape ([B,] H, R, C), float64, or (0, 0, 0) when not requested
        Equal, bit for bit, to the in-process engine's.
    D : ndarray, shape ([B,] H, R, C), float64, only with ``pairs``
        The pair sums ``S**2 - Q`` (see ``kdecal._engine.backends.loo_reduce``), bit for bit too.
    A : ndarray, shape ([B,] H, R, K), float64, only with ``resid``
    U : ndarray, shape ([B,] H, R), float64, only with ``resid``
        The residual sums (see ``kdecal._engine.backends.loo_reduce``), bit for bit too: the
        row blocks' A concatenate along the row axis like S, their U like m.
    """
    if row_stop <= row_start:  # nothing to distribute; same (degenerate) call in-process
        if resid is not None:
            core_reduce: Any = _runtime._core.loo_reduce
            args0 = (logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop, 1)
            return tuple(core_reduce(*args0, pairs=pairs, resid=resid))
        return _runtime._core.loo_reduce(
            logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop, 1, pairs=pairs
        )
    client = get_client()
    n, K = p.shape[-2], p.shape[-1]
    n_problems = p.shape[0] if p.ndim == 3 else 1
    if binary is not None:
        nb = max(1, min(_n_threads(client), (row_stop - row_start) // BINARY_BLOCK_ROWS))
        blocks = _even_blocks(row_start, row_stop, nb)
    else:
        blocks = plan_blocks(
            row_start, row_stop, float(n) * K * len(scale) * n_problems, _n_threads(client)
        )

    def make() -> tuple[Any, tuple[Any, ...]]:
        args: tuple[Any, ...] = (
            _broadcast(client, logq, cache=True),
            _broadcast(client, p, cache=True),
            _broadcast(client, labels, cache=True),
            int(n_classes),
            scale,
            _broadcast(client, bias, cache=False),
            int(powers),
        )
        if binary is not None:  # the options go first (the row range comes last)
            rs = None if resid is None else _broadcast(client, resid, cache=False)
            return binary, (rs, bool(pairs), *args)
        if resid is None:
            return (_reduce_block_pairs if pairs else _reduce_block), args
        # the residuals go first (the row range comes last)
        return _reduce_block_resid, (_broadcast(client, resid, cache=False), bool(pairs), *args)

    name = "kdecal-loo-binary" if binary is not None else "kdecal-loo-reduce"
    parts = _run_with_inputs(client, make, blocks, name, show)
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
    show: bool | None = False,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """``kdecal._engine.backends.loo_reduce_multi`` on the current client (validated arguments).

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

    def make() -> tuple[Any, tuple[Any, ...]]:
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
            return _reduce_multi_block, args
        return _reduce_multi_block_resid, (_broadcast(client, resid, cache=False), *args)

    parts = _run_with_inputs(client, make, blocks, "kdecal-loo-multi", show)
    if resid is None:
        return _concat(parts, 0, 1), _concat(parts, 1, 1)
    U = np.concatenate([x[2] for x in parts], axis=1)
    return _concat(parts, 0, 1), _concat(parts, 1, 1), U
