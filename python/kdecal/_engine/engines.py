"""The engine module of a resolved backend, and the dense reduce under a progress bar.

:func:`engine` picks the module that implements the engine protocol (documented in
:mod:`kdecal._engine.cpp`) for a resolved backend name: the compiled core, the numba
twin (loaded on first use) or the GPU engine (loaded on first use). The dispatch
(:mod:`kdecal._engine.backends`) and the fast binary engine's exact branch
(:mod:`kdecal._engine.binary`) call the engines through it, never by name.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from . import cpp as _cpp
from . import runtime as _runtime

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
        return _runtime.require_numba()
    if backend == "cuda":
        mod = _runtime.load_cuda()
        if mod is None:
            raise RuntimeError(f"the GPU engine is not usable here: {_runtime._cuda_error}")
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
