"""Input normalisation shared by every public function.

Everything is checked here, once, in Python; the compiled core then receives arrays of
the exact dtype and layout it expects (no hidden copies, no surprises inside OpenMP).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

#: Probabilities below this are clipped to it and each row renormalised, so that the
#: Dirichlet kernel (which needs ``log f``) and the KL estimators never see ``log 0``.
PROB_EPS = 1e-12
#: Tolerance on ``|sum_k probs[i, k] - 1|``.
ROW_SUM_ATOL = 1e-3


def _numeric_array(x: object, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic array-likes
        raise TypeError(f"{name} must be array-like, got {type(x).__name__}") from exc
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
    ):
        raise TypeError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise TypeError(f"{name} must be real, got dtype {arr.dtype}")
    return arr


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


@dataclass(frozen=True)
class Probs:
    """Validated probabilities.

    Attributes
    ----------
    p : ndarray, shape (n, K), float64
        Probabilities clipped to ``PROB_EPS`` and renormalised; every estimator uses them.
    dtype : numpy dtype
        float32 when the input was float32 (the kernel then runs in float32), else float64.
    binary : bool
        Whether the input was a 1-D array of P(y = 1).
    """

    p: np.ndarray
    dtype: np.dtype
    binary: bool

    @property
    def n(self) -> int:
        return int(self.p.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.p.shape[1])

    def engine_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(log p, p)`` in the kernel dtype, C-contiguous."""
        p = np.ascontiguousarray(self.p, dtype=self.dtype)
        logp = np.ascontiguousarray(np.log(self.p), dtype=self.dtype)
        return logp, p


def check_probs(probs: object, name: str = "probs", min_n: int = 3) -> Probs:
    """Validate and normalise probabilities; see :class:`Probs`."""
    from . import _dask

    if _dask.is_dask_array(probs):  # row checks block by block where the blocks live
        return _dask.check_probs(probs, name, min_n)  # type: ignore[no-any-return]
    arr = _numeric_array(probs, name)
    dtype = np.dtype(np.float32) if arr.dtype == np.float32 else np.dtype(np.float64)
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    binary = arr.ndim == 1
    if arr.ndim == 2 and arr.shape[1] == 1:
        raise ValueError(
            f"{name} has shape {arr.shape}: K = 1 class is not a classification problem; "
            "pass a 1-D array of P(y = 1) for binary problems"
        )
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (n, K) or (n,), got shape {arr.shape}")
    a = arr.astype(np.float64)
    if not np.all(np.isfinite(a)):
        idx = _first_bad(~np.isfinite(a))
        raise ValueError(f"{name} contains a non-finite value {a[idx]!r} at index {idx}")
    if np.any(a < 0):
        idx = _first_bad(a < 0)
        raise ValueError(f"{name} contains a negative probability {a[idx]!r} at index {idx}")
    if binary:
        if np.any(a > 1):
            idx = _first_bad(a > 1)
            raise ValueError(f"binary {name} must lie in [0, 1], got {a[idx]!r} at index {idx}")
        a = np.stack([1.0 - a, a], axis=1)
    else:
        sums = a.sum(axis=1)
        bad = np.abs(sums - 1.0) > ROW_SUM_ATOL
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(
                f"rows of {name} must sum to 1 (tolerance {ROW_SUM_ATOL}); row {i} sums to "
                f"{sums[i]!r}. Pass logits through kdecal.softmax first."
            )
    if a.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {a.shape[0]}")
    a = np.maximum(a, PROB_EPS)
    a /= a.sum(axis=1, keepdims=True)
    return Probs(p=np.ascontiguousarray(a), dtype=dtype, binary=binary)


def check_labels(labels: object, n: int, n_classes: int, name: str = "labels") -> np.ndarray:
    """Validate labels; returns an int64 array of shape (n,)."""
    arr = _numeric_array(labels, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D with shape ({n},), got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(
            f"{name} has {arr.shape[0]} entries but probs has {n} rows (shape mismatch)"
        )
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            idx = _first_bad(~np.isfinite(arr))
            raise ValueError(f"{name} contains a non-finite value {arr[idx]!r} at index {idx}")
        frac = arr != np.round(arr)
        if np.any(frac):
            idx = _first_bad(frac)
            raise ValueError(
                f"{name} must be integers in 0..{n_classes - 1}, got {arr[idx]!r} at index {idx}"
            )
    out = arr.astype(np.int64)
    bad = (out < 0) | (out >= n_classes)
    if np.any(bad):
        idx = _first_bad(bad)
        raise ValueError(
            f"{name} must lie in 0..{n_classes - 1} (K = {n_classes} columns in probs), "
            f"got {out[idx]!r} at index {idx}"
        )
    return np.ascontiguousarray(out)


def check_bandwidth(bandwidth: object, name: str = "bandwidth") -> float:
    """Validate one bandwidth: a finite float > 0."""
    if isinstance(bandwidth, (bool, np.bool_)) or not isinstance(bandwidth, numbers.Real):
        raise TypeError(f"{name} must be a positive float or 'auto', got {bandwidth!r}")
    h = float(bandwidth)
    if not np.isfinite(h) or h <= 0:
        raise ValueError(f"{name} must be a finite float > 0, got {bandwidth!r}")
    return h


def check_bandwidths(bandwidths: object, name: str = "bandwidths") -> np.ndarray:
    """Validate a 1-D array of bandwidths (each finite and > 0)."""
    arr = _numeric_array(bandwidths, name).astype(np.float64)
    arr = np.atleast_1d(arr)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if np.any(bad):
        raise ValueError(f"{name} must be finite and > 0, got {arr[np.argmax(bad)]!r}")
    return np.ascontiguousarray(arr)


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """Check that a string option is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_int(value: object, name: str, minimum: int) -> int:
    """Check an integer option ``>= minimum`` (bool and floats are refused).

    Raises
    ------
    TypeError
        If ``value`` is not an integer.
    ValueError
        If ``value < minimum``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_p(p: object, name: str = "p") -> float:
    """Check the order of an L_p error: a finite real ``>= 1``; returned as float.

    Raises
    ------
    TypeError
        If ``p`` is not a real number.
    ValueError
        If ``p`` is not finite or below 1.
    """
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a real number >= 1, got {p!r}")
    q = float(p)
    if not np.isfinite(q) or q < 1.0:
        raise ValueError(f"{name} must be a finite real number >= 1, got {p!r}")
    return q


def check_class_index(class_index: object, n_classes: int) -> int:
    """Check a class index in ``0..n_classes-1``.

    Raises
    ------
    ValueError
        If it is not an integer in range.
    """
    if (
        isinstance(class_index, (bool, np.bool_))
        or not isinstance(class_index, numbers.Integral)
        or not 0 <= int(class_index) < n_classes
    ):
        raise ValueError(
            f"class_index must be an integer in 0..{n_classes - 1}, got {class_index!r}"
        )
    return int(class_index)
