"""Backend dispatch for the leave-one-out reduction.

Backends return the same per-query accumulators (running max ``m`` and power sums
``S``, ``Q``, ``T``; see :func:`loo_reduce`), so every estimator is written once on top.
``"auto"`` picks ``"cpp"`` (the compiled core) when it imports, else ``"numba"``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import warnings
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .warnings import BackendFallbackWarning

Backend = Literal["auto", "cpp", "numba"]
BACKENDS = ("cpp", "numba")

_core: Any = None
_core_error: BaseException | None = None
try:
    _core = importlib.import_module("kdecal._core")
except ImportError as exc:  # pragma: no cover - exercised by the fallback test
    _core_error = exc

_numba_mod: Any = None
_numba_error: BaseException | None = None
_warned = False
_num_threads: int = 0  # 0: library default (all cores)


def _load_numba() -> Any:
    global _numba_mod, _numba_error
    if _numba_mod is None and _numba_error is None:
        try:
            _numba_mod = importlib.import_module("kdecal._numba")
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            _numba_error = exc
    return _numba_mod


def available_backends() -> list[str]:
    """Names of the backends that work in this installation.

    Returns
    -------
    list of str
        A subset of ``["cpp", "numba"]``, fastest first.
    """
    out = []
    if _core is not None:
        out.append("cpp")
    if importlib.util.find_spec("numba") is not None:
        out.append("numba")
    return out


def resolve_backend(backend: object) -> str:
    """Turn ``"auto"`` into a concrete backend and check that it is available.

    Raises
    ------
    ValueError
        If ``backend`` is unknown or not available here; the message lists the
        available backends.
    """
    global _warned
    avail = available_backends()
    if backend == "auto":
        if "cpp" in avail:
            return "cpp"
        if "numba" in avail:
            if not _warned:
                warnings.warn(
                    f"kdecal's compiled core could not be imported ({_core_error}); "
                    "using the slower numba backend. Reinstall kdecal with a C++ compiler "
                    "to build kdecal._core.",
                    BackendFallbackWarning,
                    stacklevel=3,
                )
                _warned = True
            return "numba"
        raise ValueError(
            "no kdecal backend is available: the compiled core failed to import "
            f"({_core_error}) and numba is not installed"
        )
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown backend {backend!r}; choose 'auto' or one of the available backends {avail}"
        )
    if backend not in avail:
        why = _core_error if backend == "cpp" else "numba is not installed"
        raise ValueError(
            f"backend {backend!r} is not available here ({why}); available backends: {avail}"
        )
    return str(backend)


def set_num_threads(n: int | None) -> None:
    """Set the number of threads the engine uses (``None`` or 0: all cores).

    Raises
    ------
    ValueError
        If ``n`` is negative.
    """
    global _num_threads
    if n is None:
        n = 0
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int or None, got {n!r}")
    _num_threads = int(n)


def get_num_threads() -> int:
    """Return the number of threads the engine will use."""
    if _num_threads > 0:
        return _num_threads
    if _core is not None:
        return int(_core.max_threads())
    return os.cpu_count() or 1


def _call(backend: str) -> Callable[..., tuple[np.ndarray, ...]]:
    if backend == "cpp":
        nt = _num_threads

        def run(*args: Any) -> tuple[np.ndarray, ...]:
            return _core.loo_reduce(*args, nt)  # type: ignore[no-any-return]

        return run
    mod = _load_numba()
    if mod is None:  # pragma: no cover
        raise ValueError(f"the numba backend failed to import: {_numba_error}")

    def run_numba(*args: Any) -> tuple[np.ndarray, ...]:
        import numba

        old = numba.get_num_threads()
        try:
            if _num_threads > 0:
                numba.set_num_threads(min(_num_threads, numba.config.NUMBA_NUM_THREADS))
            logq, p, labels, n_classes, scale, bias = args[:6]
            if p.ndim == 2:
                return mod.loo_reduce(*args)  # type: ignore[no-any-return]
            # a batch of independent problems: one numba call per problem
            parts = [
                mod.loo_reduce(logq[b], p[b], labels[b], n_classes, scale, bias[b], *args[6:])
                for b in range(p.shape[0])
            ]
            return tuple(
                np.stack([x[k] for x in parts]) if parts[0][k].size else parts[0][k]
                for k in range(4)
            )
        finally:
            numba.set_num_threads(old)

    return run_numba


# Work above this many kernel evaluations (pairs x bandwidths) gets a progress bar.
PROGRESS_MIN_WORK = 2e9


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
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    backend : {"cpp", "numba"}
        A resolved backend name.
    progress : bool or None
        Show a progress bar; ``None`` shows one for long work only.
    rows : (int, int), optional
        Query rows ``[start, stop)`` to reduce (against all n centres); default all.

    Returns
    -------
    m : ndarray, shape ([B,] H, R), float64 (R = number of query rows)
        ``max_{i != j} L_ij`` with ``L_ij = bias[t, i] + scale[t] * <logq_j, p_i>``.
    S, Q, T : ndarray, shape ([B,] H, n, C), float64
        ``sum_{i != j, labels_i = c} exp(q (L_ij - m_j))`` for q = 1, 2, 3 (Q and T have
        shape (0, 0, 0) unless requested).
    """
    n = p.shape[-2]
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    run = _call(backend)
    work = float(r1 - r0) * n * len(scale) * (p.shape[0] if p.ndim == 3 else 1)
    show = (work >= PROGRESS_MIN_WORK) if progress is None else bool(progress)
    if os.environ.get("KDECAL_PROGRESS", "1") == "0":
        show = False
    if not show:
        return run(logq, p, labels, n_classes, scale, bias, powers, r0, r1)  # type: ignore[return-value]

    from tqdm.auto import tqdm

    n_chunks = int(min(r1 - r0, max(20, math.ceil(work / 2e8))))
    edges = np.linspace(r0, r1, n_chunks + 1).astype(np.int64)
    parts: list[tuple[np.ndarray, ...]] = []
    with tqdm(total=r1 - r0, unit="row", desc="kdecal LOO kernel", leave=False) as bar:
        for a, b in zip(edges[:-1], edges[1:]):
            parts.append(run(logq, p, labels, n_classes, scale, bias, powers, int(a), int(b)))
            bar.update(int(b - a))
    m = np.concatenate([x[0] for x in parts], axis=-1)
    S = np.concatenate([x[1] for x in parts], axis=-2)
    Q = np.concatenate([x[2] for x in parts], axis=-2) if powers >= 2 else parts[0][2]
    T = np.concatenate([x[3] for x in parts], axis=-2) if powers >= 3 else parts[0][3]
    return m, S, Q, T
