"""The engine layer: the leave-one-out kernel sums on every backend.

The lowest layer of kdecal above input validation (``kdecal._validation``) and the
closed-form formulas (``kdecal._formulas``); nothing here imports from the estimator
layer or above.  Its modules, from the bottom up:

- :mod:`.runtime`: the compiled core's handle, the lazy loaders of the optional numba
  and numba-cuda engines, the thread count, the progress bar, and the dense
  ``loo_reduce`` of a resolved backend;
- one module per engine: :mod:`.numba` (the numba twin of the compiled core),
  :mod:`.cuda` (numba-cuda kernels), :mod:`.dask` (the compiled core on the workers of a
  ``dask.distributed`` cluster, by blocks of query rows), :mod:`.binary` (the fast engine
  of binary problems on the compiled core);
- :mod:`.backends`: ``resolve_backend`` and the dispatch of ``loo_reduce``,
  ``loo_reduce_multi``, ``loo_grad`` and ``kernel_weights`` to the engine chosen.

The estimators call :mod:`.backends` (and read :mod:`.runtime`); see
``docs/architecture.md``.
"""
