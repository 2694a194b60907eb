"""The compiled core ``kdecal._core`` as an engine module.

Every engine module (this one, :mod:`kdecal._engine.numba`, :mod:`kdecal._engine.cuda`)
implements the same small protocol, which the dispatch (:mod:`kdecal._engine.backends`)
calls through :func:`kdecal._engine.engines.engine`:

- ``loo_reduce(logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop,
  progress=None, pairs=False, resid=None)``: the leave-one-out reduction of query rows
  ``[row_start, row_stop)`` of one problem (n, K) or a batch (B, n, K), returning ``m,
  S, Q, T`` (then ``D`` with ``pairs``, ``A, U`` with ``resid``);
- ``loo_reduce_multi(logq, p, m, labels, n_classes, scale, bias, weights, powers,
  row_start, row_stop, progress=None, resid=None)``: the class sums of B label sets at
  one bandwidth, returning ``S, Q`` (then ``U`` with ``resid``);
- ``loo_grad(logq, p, labels, n_classes, scale, bias, lse, coef, progress=None)``: the
  streaming backward pass, returning ``grad_logq, grad_p, grad_bias, row_sum``.

``progress`` is a callback called with the query rows done so far; every engine stops
on Ctrl-C within about a second. This module runs them on the compiled core with the
engine's thread count; it also gives the core's kernel weights (:func:`kernel_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import runtime as _runtime

Progress = Callable[[int], object] | None


def _core(what: str = "this backend") -> Any:
    if _runtime._core is None:
        raise RuntimeError(
            f"{what} needs kdecal's compiled core, which could not be imported "
            f"({_runtime._core_error})"
        )
    return _runtime._core


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
    progress: Progress = None,
    pairs: bool = False,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Run ``kdecal._core.loo_reduce`` with the engine's threads.

    One call: the core polls for Ctrl-C and reports its rows itself.
    """
    core = _core()
    args = (logq, p, labels, n_classes, scale, bias, powers, row_start, row_stop)
    kw: dict[str, Any] = {} if resid is None else {"resid": resid}
    return tuple(
        core.loo_reduce(*args, _runtime._num_threads, progress=progress, pairs=pairs, **kw)
    )


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
    progress: Progress = None,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """Run ``kdecal._core.loo_reduce_multi`` with the engine's threads."""
    core = _core()
    args = (logq, p, m, labels, n_classes, scale, bias, weights, powers, row_start, row_stop)
    kw: dict[str, Any] = {} if resid is None else {"resid": resid}
    return tuple(core.loo_reduce_multi(*args, _runtime._num_threads, progress=progress, **kw))


def loo_grad(
    logq: np.ndarray,
    p: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    scale: float,
    bias: np.ndarray,
    lse: np.ndarray,
    coef: np.ndarray,
    progress: Progress = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run ``kdecal._core.loo_grad`` with the engine's threads."""
    core = _core("the backward pass")
    g = core.loo_grad(
        logq,
        p,
        labels,
        n_classes,
        scale,
        bias,
        lse,
        coef,
        _runtime._num_threads,
        progress=progress,
    )
    return g[0], g[1], g[2], g[3]


def kernel_weights(
    logq: np.ndarray,
    p: np.ndarray,
    m: np.ndarray,
    scale: float,
    bias: np.ndarray,
    row_start: int,
    row_stop: int,
    single: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``kdecal._core.kernel_weights`` of query rows ``[row_start, row_stop)``.

    ``single``: W in float32 (the same weights rounded), else float64.
    """
    core = _core("kernel_weights")
    if not hasattr(core, "kernel_weights"):
        raise RuntimeError("kernel_weights needs kdecal's compiled core")
    if row_stop <= row_start:  # (the core reads row_stop = 0 as n)
        dt = np.float32 if single else np.float64
        return np.zeros((0, p.shape[0]), dtype=dt), np.arange(p.shape[0], dtype=np.int64)
    W, order = core.kernel_weights(
        logq,
        p,
        m,
        float(scale),
        bias,
        int(row_start),
        int(row_stop),
        _runtime._num_threads,
        None,
        bool(single),
    )
    return W, order
