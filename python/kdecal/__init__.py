"""kdecal: kernel estimators of calibration error with a streaming C++/OpenMP core.

The canonical L_p calibration error ECE^KDE (Popordanoska et al. 2022), proper
calibration errors for Bregman generators (KL, L2), refinement and sharpness
(Popordanoska et al. 2024), leave-one-out bandwidth selection, and a one-pass
:func:`evaluate` report. ``kdecal.torch`` (optional, needs torch) has them as
differentiable training losses.
"""

from __future__ import annotations

import warnings as _warnings

from . import (
    binned,
    curves,
    datasets,
    plot,
    recalibration,
    resampling,
    scores,
    skce,
    smooth,
    tolerances,
)
from ._calibration_estimate import CalibrationEstimate, CalibrationTestResult, ConfidenceInterval
from ._compare import Comparison, compare
from ._engine.backends import available_backends
from ._engine.runtime import get_num_threads, set_num_threads
from ._estimation.generators import Bregman
from ._estimation.quantities import QUANTITIES
from ._estimation.search import DEFAULT_BANDWIDTH_GRID
from ._evaluate import evaluate
from ._report import CalibrationReport
from ._validation import softmax
from .kde import (
    calibration_error,
    calibration_test,
    conditional_expectation,
    ece_kde,
    estimate,
    loo_log_likelihood,
    refinement,
    select_bandwidth,
    sharpness,
)
from .skce import skce_test
from .smooth import smooth_ece
from .warnings import (
    BackendFallbackWarning,
    KdecalWarning,
    RenormalizationWarning,
    UnreliableEstimateWarning,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BANDWIDTH_GRID",
    "QUANTITIES",
    "BackendFallbackWarning",
    "Bregman",
    "CalibrationEstimate",
    "CalibrationReport",
    "CalibrationTestResult",
    "Comparison",
    "ConfidenceInterval",
    "KdecalWarning",
    "RenormalizationWarning",
    "UnreliableEstimateWarning",
    "__version__",
    "available_backends",
    "binned",
    "calibration_error",
    "calibration_test",
    "compare",
    "conditional_expectation",
    "curves",
    "datasets",
    "ece_kde",
    "estimate",
    "evaluate",
    "get_num_threads",
    "loo_log_likelihood",
    "plot",
    "recalibration",
    "refinement",
    "resampling",
    "scores",
    "select_bandwidth",
    "set_num_threads",
    "sharpness",
    "skce",
    "skce_test",
    "smooth",
    "smooth_ece",
    "softmax",
    "tolerances",
]

#: Old top-level names kept for one release (DeprecationWarning): name -> (module, name).
_DEPRECATED = {
    name: ("tolerances", name)
    for name in (
        "INFER_ROW_SUM_ATOL",
        "MIN_BANDWIDTH",
        "PROBS_ROW_SUM_ATOL",
        "PROB_EPS",
        "ROW_SUM_ATOL",
    )
}


def __dir__() -> list[str]:
    return __all__


def __getattr__(name: str) -> object:
    # ``kdecal.torch`` (the PyTorch losses) is imported on first use only, so that
    # ``import kdecal`` never imports torch.
    if name == "torch":
        import importlib

        try:
            return importlib.import_module("kdecal.torch")
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise AttributeError(
                "kdecal.torch needs PyTorch, which is not installed: pip install 'kdecal[torch]'"
            ) from exc
    if name in _DEPRECATED:
        module, attr = _DEPRECATED[name]
        _warnings.warn(
            f"kdecal.{name} is deprecated and will be removed in the next release; "
            f"use kdecal.{module}.{attr}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(globals()[module], attr)
    raise AttributeError(f"module 'kdecal' has no attribute {name!r}")
