"""Warning classes of kdecal."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = [
    "BackendFallbackWarning",
    "KdecalWarning",
    "RenormalizationWarning",
    "UnreliableEstimateWarning",
]


class KdecalWarning(UserWarning):
    """Base class of every warning kdecal emits."""


class BackendFallbackWarning(KdecalWarning):
    """The compiled core ``kdecal._core`` could not be imported; numba is used instead."""


class RenormalizationWarning(KdecalWarning):
    """Rows of probabilities that did not sum to 1 were renormalised.

    Raised when a row is off by more than :data:`kdecal.tolerances.ROW_SUM_ATOL` (rounded or
    truncated probabilities); the message gives how many rows and the largest deviation.
    """


class UnreliableEstimateWarning(KdecalWarning):
    """An estimate that the accuracy study of ``bench/README.md`` found not to be trusted.

    Given by the residual-centred (default) estimators of the canonical notion beyond
    ``K = 10`` classes (:data:`kdecal.kde.CANONICAL_RELIABLE_MAX_K`), where a calibrated
    model scores a canonical L1 ECE^KDE of 0.27-0.37, and by the canonical KL calibration
    error beyond ``K = 4`` (:data:`kdecal.kde.KL_RELIABLE_MAX_K`). The message gives the
    measured figures and the notion that is reliable there. The papers' plug-in
    (``estimator="plugin"``), kept for reproductions, gives no such warning.
    """


_QUIET = threading.local()


@contextlib.contextmanager
def quiet(*categories: type[Warning]) -> Iterator[None]:
    """Drop the :func:`warn_user` warnings of ``categories`` raised by this thread.

    The library's own way to silence its warnings inside a call (e.g. once per bootstrap
    replicate): ``warnings.catch_warnings`` swaps the process-wide filter list and is
    not thread-safe before Python 3.14, so concurrent calls left an "ignore
    KdecalWarning" filter installed for the whole process. This changes no filter and
    no other thread's warnings.
    """
    stack: list[tuple[type[Warning], ...]] = getattr(_QUIET, "stack", [])
    _QUIET.stack = stack
    stack.append(categories or (KdecalWarning,))
    try:
        yield
    finally:
        stack.pop()


def warn_user(message: str, category: type[Warning] = KdecalWarning) -> None:
    """Warn with the stack level of the first frame outside the kdecal package.

    Nothing inside a :func:`quiet` block of this thread that covers ``category``.
    """
    import os
    import sys
    import warnings

    for cats in getattr(_QUIET, "stack", ()):
        if issubclass(category, cats):
            return
    here = os.path.dirname(os.path.abspath(__file__))
    level = 2
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)
