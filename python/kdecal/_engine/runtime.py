"""The engine's runtime: the compiled core, the optional engines, threads, progress.

The lowest module of :mod:`kdecal._engine`: the handle of the compiled core
(``kdecal._core``, or None where it failed to import), the engine's thread count,
the thread pool of :func:`map_row_blocks` and the progress bar of long calls (the
engine modules themselves are picked by :func:`kdecal._engine.engines.engine`).
Mutable state (``_core``, ``_num_threads``) is read here, as ``runtime._core``, so that
one assignment changes it for every caller.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..warnings import KdecalWarning

_core_error: BaseException | None = None
try:
    # typed by _core.pyi; the alias re-exports it (kdecal.torch, _estimation use it)
    from .. import _core as _core  # noqa: PLC0414
except ImportError as exc:  # pragma: no cover - exercised by the fallback test
    _core = None  # type: ignore[assignment]
    _core_error = exc

_num_threads: int = 0  # 0: library default (all cores)
#: True in a process forked from one that imported kdecal: OpenMP (libgomp) cannot run a
#: team of threads in a child forked from a process whose team it started (the child
#: hangs), so the engine runs on one thread there (:func:`set_num_threads`).
_forked_child = False

#: True in a child forked after its parent started numba's GNU OpenMP threading layer,
#: which terminates the child on its first parallel launch (fork-unsafe).
_numba_gnu_omp_at_fork = False


def _numba_gnu_omp_started() -> bool:
    """Whether numba (if imported) has started its threading layer on GNU OpenMP."""
    numba = sys.modules.get("numba")
    if numba is None:
        return False
    try:
        if numba.threading_layer() != "omp":
            return False
        from numba.np.ufunc import omppool

        return str(getattr(omppool, "openmp_vendor", "GNU")) == "GNU"
    except Exception:  # noqa: BLE001 - not started (ValueError), or another numba layout
        return False


def _after_fork_in_child() -> None:
    global _num_threads, _forked_child, _numba_gnu_omp_at_fork
    _numba_gnu_omp_at_fork = _numba_gnu_omp_started()  # the parent's, at the fork
    _forked_child = True
    _num_threads = 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def is_device_array(x: object) -> bool:
    """Whether ``x`` is an array on a CUDA device (``__cuda_array_interface__``)."""
    return hasattr(x, "__cuda_array_interface__") or (
        type(x).__module__.startswith("numba.cuda") and hasattr(x, "copy_to_host")
    )


#: Most engine threads :func:`set_num_threads` accepts (each thread holds O(K) scratch
#: per tile; more threads than this is a typo, not a machine).
MAX_THREADS = 4096


def set_num_threads(n: int | None) -> None:
    """Set the number of threads the engine uses (``None`` or 0: all cores).

    Threads beyond the number of cores are allowed (up to :data:`MAX_THREADS`) but only
    add scheduling overhead. In a process forked from one that imported kdecal (the
    ``"fork"`` start method of :mod:`multiprocessing`, the default on Linux before
    Python 3.14, gunicorn and Celery workers, torch DataLoader workers) the engine runs
    on one thread: OpenMP cannot start a team of threads in a child forked after it ran
    one (the child hangs), so there a value other than 1 warns and is not taken. Use the
    ``"spawn"`` or ``"forkserver"`` start method for workers with threads of their own.

    Parameters
    ----------
    n : int or None
        Number of threads in ``0..MAX_THREADS``; ``None`` or 0 uses every core.

    Raises
    ------
    ValueError
        If ``n`` is not an integer in ``0..MAX_THREADS``.
    """
    global _num_threads
    if n is None:
        n = 0
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_THREADS:
        raise ValueError(
            f"n must be an integer in 0..{MAX_THREADS} (0 or None: all cores), got {n!r}"
        )
    if _forked_child and n != 1:
        warnings.warn(
            f"kdecal.set_num_threads({n}) in a forked process: the engine stays on one "
            "thread (OpenMP cannot run a team of threads in a child forked after it ran "
            "one: it hangs). Start workers with the 'spawn' or 'forkserver' method of "
            "multiprocessing for threads of their own.",
            KdecalWarning,
            stacklevel=2,
        )
        return
    _num_threads = int(n)


def get_num_threads() -> int:
    """Return the number of threads the engine will use.

    Returns
    -------
    int
        The value of :func:`set_num_threads`; when unset, the compiled core's OpenMP
        default (all cores unless ``OMP_NUM_THREADS`` is set), or, without the compiled
        core, the number of cores.
    """
    if _num_threads > 0:
        return _num_threads
    if _core is not None:
        return int(_core.max_threads())
    return os.cpu_count() or 1


_blas_lock = threading.Lock()
_blas_active: list[list[int]] = []  # the blas_threads blocks in flight ([limit]), by entry
_blas_first: Any = None  # the first block's limiter: its restore is the original state


@contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Limit the BLAS library's threads to ``n`` while the block runs (threadpoolctl).

    For loops of many small or memory-bound BLAS calls (the dot products of the
    recalibration objectives): OpenBLAS wakes its threads for each call, and on few
    cores they cost more than they save (bench/README.md, "Float32 products in the
    resampling; the calibration loss on one BLAS thread"); and for the engine's own GEMMs, at the thread count of
    :func:`set_num_threads`. ``None``: no limit (and no cost: threadpoolctl inspects the
    process's libraries on each entry, about 1 ms).

    The limit is process-wide. Blocks in flight on several threads (concurrent calls)
    share it: each entry applies its own limit, an exit re-applies the limit of the
    latest block still in flight, and the last exit restores what the first entry found
    (threadpoolctl's own nesting restores the value its entry saw, so concurrent calls
    exiting out of order left the host's BLAS on one thread for good).
    """
    global _blas_first
    if n is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    token = [n]  # this block's entry (removed by identity: blocks may share a limit)
    with _blas_lock:
        limiter = threadpool_limits(limits=n, user_api="blas")
        if not _blas_active:
            _blas_first = limiter
        _blas_active.append(token)
    try:
        yield
    finally:
        with _blas_lock:
            del _blas_active[next(i for i, t in enumerate(_blas_active) if t is token)]
            if _blas_active:  # the latest block still in flight
                threadpool_limits(limits=_blas_active[-1][0], user_api="blas")
            elif _blas_first is not None:
                _blas_first.restore_original_limits()
                _blas_first = None


#: Elements below which :func:`map_row_blocks` runs on the calling thread alone.
ROW_BLOCKS_MIN_ELEMENTS = 1 << 15

_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] = (0, 0)  # (threads, process id) the pool was made for
_pool_lock = threading.Lock()


def _thread_pool(n: int) -> ThreadPoolExecutor:
    """Return a pool of ``n`` threads, kept between calls (made again after a fork)."""
    global _pool, _pool_key
    key = (n, os.getpid())
    with _pool_lock:
        if _pool is None or _pool_key != key:
            if _pool is not None and _pool_key[1] == key[1]:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="kdecal")
            _pool_key = key
        return _pool


def map_row_blocks(f: Callable[[np.ndarray], np.ndarray], a: np.ndarray) -> np.ndarray:
    """``f(a)`` for a row-wise ``f``, computed on blocks of rows in the engine's threads.

    ``a`` is (..., n, D) and ``f`` maps (..., r, D) to (..., r), each row on its own
    (elementwise NumPy or SciPy ufuncs, then a reduction over the last axis: they release
    the GIL), so the result is bitwise ``f(a)`` for any blocking. With one thread, or
    under :data:`ROW_BLOCKS_MIN_ELEMENTS` elements, it is ``f(a)``. Used for the
    per-centre kernel biases (n K lgamma per bandwidth) when the compiled core, which
    computes them itself, is not built: otherwise they would be the serial part of a
    bandwidth search on many cores. At most one thread per core.
    """
    nt = min(get_num_threads(), os.cpu_count() or 1, a.shape[-2])
    if nt <= 1 or a.size < ROW_BLOCKS_MIN_ELEMENTS:
        return f(a)
    edges = np.linspace(0, a.shape[-2], nt + 1).astype(int)
    blocks = [a[..., i:j, :] for i, j in zip(edges[:-1], edges[1:])]
    return np.concatenate(list(_thread_pool(nt).map(f, blocks)), axis=-1)


# Work above this many kernel evaluations (pairs x bandwidths) gets a progress bar.
PROGRESS_MIN_WORK = 2e9


def show_progress(work: float, progress: bool | None) -> bool | None:
    """Decide whether to show a bar.

    ``progress`` as given (True: a bar, False: none); for ``None`` none for short work,
    and for long work ``None``: a bar where the output is a terminal or a notebook, none
    where it goes to a file or a pipe (logs get no carriage-return lines; tqdm's
    ``disable=None``). Never a bar when the environment variable ``KDECAL_PROGRESS`` is
    ``0``, nor where there is no standard error to draw it on (``sys.stderr`` is None:
    pythonw, some services).
    """
    if os.environ.get("KDECAL_PROGRESS", "1") == "0" or sys.stderr is None:
        return False
    if progress is None:
        return None if work >= PROGRESS_MIN_WORK else False
    return bool(progress)


def interactive_stdout() -> bool:
    """Whether standard output is a terminal (the automatic bars of Dask's progress)."""
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


@contextmanager
def progress_bar(
    show: bool | None, total: int, desc: str
) -> Iterator[Callable[[int], None] | None]:
    """Show a tqdm bar of ``total`` rows while the block runs.

    ``show`` from :func:`show_progress`: False no bar, True a bar, None a bar where the
    output is a terminal or a notebook (tqdm decides). Yields the callback that the
    engine calls with the rows done so far (``None`` when no bar is shown).
    """
    if show is False:
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(
        total=total, unit="row", desc=desc, leave=False, disable=None if show is None else False
    ) as bar:
        if bar.disable:  # automatic, and the output is not a terminal
            yield None
            return

        def update(done: int) -> None:
            bar.update(int(done) - bar.n)

        yield update
