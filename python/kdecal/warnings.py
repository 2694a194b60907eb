"""Warning classes of kdecal."""

from __future__ import annotations

__all__ = ["BackendFallbackWarning", "KdecalWarning"]


class KdecalWarning(UserWarning):
    """Base class of every warning kdecal emits."""


class BackendFallbackWarning(KdecalWarning):
    """The compiled core ``kdecal._core`` could not be imported; numba is used instead."""
