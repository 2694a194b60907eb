"""The engine modules: their loaders, the module of a resolved backend, the dense reduce.

The numba and numba-cuda engines are optional and imported on first use only
(:func:`load_numba`, :func:`load_cuda`). :func:`engine` picks the module that
implements the engine protocol (documented in :mod:`kdecal._engine.cpp`) for a
resolved backend name: the compiled core, the numba twin or the GPU engine. The dispatch
(:mod:`kdecal._engine.backends`) and the fast binary engine's exact branch
(:mod:`kdecal._engine.binary`) call the engines through it, never by name.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

import numpy as np

from . import cpp as _cpp
from . import runtime as _runtime

#: How to install the numba backend (an optional extra).
NUMBA_INSTALL = 'pip install "kdecal[numba]"'
_numba_mod: Any = None
_numba_error: BaseException | None = None
_cuda_mod: Any = None
_cuda_error: BaseException | str | None = None


def load_numba() -> Any:
    """Return :mod:`kdecal._engine.numba` where numba imports, else None (tried once).

    numba is optional (``pip install "kdecal[numba]"``): it is imported here, on the
    first use of the numba backend, and nowhere else (the GPU engine aside).
    """
    global _numba_mod, _numba_error
    if _numba_mod is None and _numba_error is None:
        try:
            _numba_mod = importlib.import_module("kdecal._engine.numba")
        except ImportError as exc:
            _numba_error = exc
    return _numba_mod


def numba_missing() -> str:
    """Why the numba backend cannot run here (see :data:`NUMBA_INSTALL`)."""
    if isinstance(_numba_error, ModuleNotFoundError) and _numba_error.name == "numba":
        return "numba is not installed"
    return f"numba failed to import ({_numba_error})"


def require_numba_binary() -> Any:
    """Return :mod:`kdecal._engine.numba_binary` (the fast binary engine's numba twin).

    Raises ``ImportError`` naming the extra without numba (:func:`require_numba`).
    """
    require_numba()
    return importlib.import_module("kdecal._engine.numba_binary")


def require_numba() -> Any:
    """Return :mod:`kdecal._engine.numba`; raise ``ImportError`` naming the extra without numba.

    Raises ``RuntimeError`` in a process forked after numba started its OpenMP threading
    layer (:func:`numba_fork_unsafe`), where numba would terminate the process.
    """
    mod = load_numba()
    if mod is None:
        raise ImportError(
            f"the numba backend is not available: {numba_missing()}: {NUMBA_INSTALL}"
        )
    if numba_fork_unsafe():
        raise RuntimeError(
            "backend='numba' cannot run in this process: it was forked from one where "
            "numba had started its OpenMP threading layer, which is not fork-safe (numba "
            "terminates the child on its first parallel call). Start workers with the "
            "'spawn' or 'forkserver' method of multiprocessing, use backend='cpp' (which "
            "runs on one thread in a forked child), or set NUMBA_THREADING_LAYER=tbb "
            "(pip install tbb) or workqueue before numba first runs"
        )
    return mod


def numba_fork_unsafe() -> bool:
    """Whether this is a forked child whose parent had started numba's GNU OpenMP layer.

    numba's ``omp`` threading layer on GNU OpenMP terminates a forked child on its first
    parallel launch when the parent launched it before the fork ("fork() called from a
    process already using GNU OpenMP"); a layer first started in the child, Intel's
    OpenMP, and the ``tbb`` and ``workqueue`` layers are fork-safe. Recorded at the fork
    (:func:`kdecal._engine.runtime._after_fork_in_child`).
    """
    return bool(_runtime._forked_child and _runtime._numba_gnu_omp_at_fork)


def load_cuda() -> Any:
    """Return :mod:`kdecal._engine.cuda` when a CUDA device (or the simulator) is usable, else None.

    Probed once: importing numba's CUDA target and asking the driver for a device.
    """
    global _cuda_mod, _cuda_error
    if _cuda_mod is None and _cuda_error is None:
        if importlib.util.find_spec("numba") is None:
            _cuda_error = 'numba is not installed (pip install "kdecal[cuda]")'
            return None
        try:
            mod = importlib.import_module("kdecal._engine.cuda")
        except Exception as exc:  # noqa: BLE001 - a missing or broken numba-cuda
            _cuda_error = exc
            return None
        if mod.is_available():
            _cuda_mod = mod
        else:
            _cuda_error = (
                "no CUDA device is usable (an NVIDIA GPU with its driver, and numba-cuda: "
                'pip install "kdecal[cuda]"; or numba\'s simulator, NUMBA_ENABLE_CUDASIM=1)'
            )
    return _cuda_mod


#: The resolved backends that have an engine module (Dask distributes their row blocks).
ENGINES = ("cpp", "numba", "cuda")


def engine(backend: str) -> ModuleType:
    """Return the engine module of a resolved backend: "cpp", "numba" or "cuda".

    Raises
    ------
    ValueError
        An unresolved or unknown name (``"auto"`` must be resolved first, so that it
        never runs on numba unnoticed).
    RuntimeError
        numba or the GPU engine is not usable here (the message says what to install).
    """
    if backend == "cpp":
        return _cpp
    if backend == "numba":
        return require_numba()
    if backend == "cuda":
        mod = load_cuda()
        if mod is None:
            raise RuntimeError(f"the GPU engine is not usable here: {_cuda_error}")
        return mod
    raise ValueError(f"engine needs a resolved backend {ENGINES}, got {backend!r}")


def dense_loo_reduce(
    backend: str,
    logq: Any,
    p: Any,
    labels: Any,
    n_classes: int,
    scale: np.ndarray,
    bias: Any,
    powers: int,
    row_start: int,
    row_stop: int,
    *,
    progress: bool | None,
    pairs: bool = False,
    resid: Any = None,
) -> tuple[np.ndarray, ...]:
    """Run the engine's ``loo_reduce`` of a resolved backend under the bar of long calls.

    The dense O(n^2) leave-one-out reduction of query rows ``[row_start, row_stop)`` of
    one problem (``p`` of shape (n, K)) or a batch (B, n, K); the bar counts query rows
    over the batch and is shown for long work only when ``progress`` is None.
    """
    n = p.shape[-2]
    n_problems = p.shape[0] if p.ndim == 3 else 1
    rows = row_stop - row_start
    work = float(rows) * n * len(scale) * n_problems
    kw = {} if resid is None else {"resid": resid}
    run = engine(backend).loo_reduce
    show = _runtime.show_progress(work, progress)
    with _runtime.progress_bar(show, rows * n_problems, "kdecal LOO kernel") as cb:
        return tuple(
            run(
                logq,
                p,
                labels,
                n_classes,
                scale,
                bias,
                powers,
                row_start,
                row_stop,
                progress=cb,
                pairs=pairs,
                **kw,
            )
        )
