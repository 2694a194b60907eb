"""Input normalisation shared by every public function.

Everything is checked here, once, in Python; the compiled core then receives arrays of
the exact dtype and layout it expects (no hidden copies, no surprises inside OpenMP).

Two rules live here and nowhere else:

- :func:`as_array`, how any array object a user holds (NumPy, pandas, polars, torch on
  any device or with ``requires_grad``, JAX, CuPy, anything with ``__dlpack__`` or
  ``__array__``) becomes a NumPy array;
- :func:`resolve_input`, how scores are recognised as probabilities or logits.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import numbers
import threading
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np
from scipy.special import softmax as _sp_softmax

from .tolerances import (
    INFER_RANGE_ATOL,
    INFER_ROW_SUM_ATOL,
    MIN_BANDWIDTH,
    PROB_EPS,
    PROBS_RANGE_ATOL,
    PROBS_ROW_SUM_ATOL,
    ROW_SUM_ATOL,
)
from .warnings import RenormalizationWarning, warn_user


def _type_name(x: object) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


#: The torch floating dtypes that ``Tensor.numpy()`` converts; :func:`as_array` reads
#: any other (bfloat16, the float8 types) through float32.
_TORCH_NUMPY_FLOATS = ("torch.float16", "torch.float32", "torch.float64")


def as_array(x: object, name: str) -> np.ndarray:
    """Convert any array object to a NumPy array, the one conversion rule of kdecal.

    Parameters
    ----------
    x : array-like
        A NumPy array, a nested sequence, a pandas or polars object, a torch tensor (any
        device, ``requires_grad`` allowed: its values are read, detached; bfloat16 and
        the float8 types, which NumPy lacks, are read as float32), a JAX or CuPy
        array, or any object offering ``__array__`` or ``__dlpack__``.  Arrays on an
        accelerator are copied to the host (kdecal has no GPU backend).
    name : str
        Argument name, used in error messages.

    Returns
    -------
    numpy.ndarray
        The values, on the host; a view of ``x`` where NumPy allows it (callers copy
        before modifying).

    Raises
    ------
    TypeError
        If ``x`` cannot be read as an array; the message names the argument and the type.
    """
    if isinstance(x, np.ma.MaskedArray):
        if np.ma.getmaskarray(x).any():
            idx = tuple(int(i) for i in np.argwhere(np.ma.getmaskarray(x))[0])
            raise ValueError(f"{name} is a masked array with a masked entry at index {idx}")
        return np.asarray(x.data)
    if isinstance(x, np.ndarray):
        # a subclass (np.matrix) keeps its own semantics (2-D rows, matrix sums): drop it
        return x if type(x) is np.ndarray else np.asarray(x)
    module = type(x).__module__.split(".")[0]
    if module == "scipy" and hasattr(x, "toarray"):  # np.asarray makes a 0-d object array
        raise TypeError(
            f"{name} is a SciPy sparse {type(x).__name__}; pass a dense array (.toarray())"
        )
    try:
        if module == "torch" and hasattr(x, "detach"):
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.is_conj():
                t = t.resolve_conj()
            if t.is_floating_point() and str(t.dtype) not in _TORCH_NUMPY_FLOATS:
                # bfloat16 and the float8 types have no NumPy dtype: float32 holds them exactly
                t = t.float()
            return np.asarray(t.numpy())
        if module == "cupy" and hasattr(x, "get"):
            return np.asarray(x.get())
        if not hasattr(x, "__array__") and hasattr(x, "__dlpack__"):
            return np.from_dlpack(x)
        arr = np.asarray(x)
    except Exception as exc:
        raise TypeError(
            f"{name} must be array-like (NumPy, pandas, polars, torch, JAX, CuPy or any "
            f"object with __array__ or __dlpack__); could not read {_type_name(x)}: "
            f"{' '.join(str(exc).split())}"
        ) from exc
    if arr.dtype == object and hasattr(x, "__dlpack__"):
        # e.g. a container that exposes DLPack and an __array__ that yields objects
        with contextlib.suppress(Exception):  # else the caller's dtype error
            return np.from_dlpack(x)
    if (
        arr.dtype == object
        and hasattr(x, "to_numpy")
        and not any(isinstance(v, (str, bytes)) for v in arr.ravel())
    ):
        # pandas nullable dtypes (Float64, Int64) give objects; missing values become NaN,
        # which the caller reports with their index. Text ("3", "10") is not read as a
        # number, as a NumPy string array is not: class names in text are usually in
        # another order than the probability columns ("10" before "2")
        with contextlib.suppress(Exception):  # else the caller's dtype error
            return np.asarray(x.to_numpy(dtype=np.float64, na_value=np.nan))
    if type(arr) is not np.ndarray:  # np.asarray keeps no subclass; a custom __array__ may
        arr = np.asarray(arr).view(np.ndarray)
    return arr


#: Scalars of dates and durations, refused in an object array as their dtypes are.
_TEMPORAL = (datetime.date, datetime.timedelta, np.datetime64, np.timedelta64)


def _dtype_problem(dt: np.dtype, name: str, first: object = None) -> str | None:
    """Why an array of dtype ``dt`` is not numeric, or None (``first``: an entry)."""
    if dt.kind in "mM" or (dt == object and isinstance(first, _TEMPORAL)):
        held = "" if dt != object else f" holding {_type_name(first)} values"
        return (
            f"{name} must be a numeric array, got dtype {dt}{held}: datetimes and "
            "timedeltas are not read as numbers (convert them explicitly if they encode "
            "numbers)"
        )
    if dt.kind in "US" or (dt == object and isinstance(first, (str, bytes))):
        return (
            f"{name} must be a numeric array, got text (dtype {dt}, e.g. {first!r}): text is "
            "not read as numbers; class names must be mapped to the indices 0..K-1 of the "
            "probability columns (text sorts '10' before '2')"
        )
    if dt == object or not (np.issubdtype(dt, np.number) or np.issubdtype(dt, np.bool_)):
        return f"{name} must be a numeric array, got dtype {dt}"
    return None


def _numeric_array(x: object, name: str) -> np.ndarray:
    arr = as_array(x, name)
    problem = _dtype_problem(arr.dtype, name, arr.flat[0] if arr.size else None)
    if problem is not None:
        raise TypeError(problem)
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
    log_p : ndarray, shape (n, K), float64, read-only
        ``np.log(p)``, computed on first use and kept: every log loss, Brier score and
        scoring rule of the same validated probabilities shares it.
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

    @cached_property
    def log_p(self) -> np.ndarray:
        L = np.log(self.p)
        L.setflags(write=False)
        return L


def _row_sum_deviation(a: np.ndarray) -> np.ndarray:
    return np.abs(a.sum(axis=1, dtype=np.float64) - 1.0)


def _check_row_sums(
    a: np.ndarray, name: str, atol: float, high: float, quiet: float = ROW_SUM_ATOL
) -> None:
    """Refuse rows far from summing to 1, then entries above ``high``; then warn.

    Rows further than ``atol`` from 1 are refused, then entries above ``high``; rows off
    by more than ``quiet`` (``ROW_SUM_ATOL``, or the input's rounding) get a warning only
    after both checks. The caller renormalises every row afterwards. The order: a file times 1.05 warned
    that its rows "were renormalised", then refused an entry of 1.034 (issue 26's
    probes); rows far from summing to 1 keep their own message.
    """
    dev = _row_sum_deviation(a)
    worst = int(np.argmax(dev))
    if not dev[worst] <= atol:
        raise ValueError(
            f"rows of {name} must sum to 1 (tolerance {atol}); row {worst} sums to "
            f"{float(a[worst].sum())!r}. {SOFTMAX_ADVICE}"
        )
    if np.any(a > high):
        idx = _first_bad(a > high)
        raise ValueError(
            f"{name} contains a probability above 1, {float(a[idx])!r} at index {idx}"
        )
    off = dev > quiet
    if off.any():
        warn_user(
            f"{name}: {int(off.sum())} of {a.shape[0]} rows do not sum to 1 (largest "
            f"deviation {dev[worst]:.3g}, row {worst}); they were renormalised",
            RenormalizationWarning,
        )


#: The advice that ends :func:`check_probs`' message on rows far from summing to 1 (the
#: command line puts its own option in its place).
SOFTMAX_ADVICE = "Pass logits through kdecal.softmax first."

#: Relative tolerance of the common row sum of unnormalised probabilities (``P * c``,
#: counts of votes) that ``input="auto"`` refuses: tight, as such rows sum to ``c`` up to
#: rounding, while logits with a large common offset (sklearn's checks draw N(100, 1)
#: entries) have row sums within 2 % of each other but not within 1e-6.
SCALED_ROW_SUM_RTOL = 1e-6

#: How :func:`resolve_input` names the choices in its messages, by default.
INPUT_FLAGS = {"probs": "input='probs'", "logits": "input='logits'"}


def _on_simplex(a: np.ndarray) -> tuple[bool, float, int]:
    """Whether a 2-D array has entries in [0, 1]; with the worst row-sum deviation."""
    if a.ndim != 2 or a.shape[0] == 0 or not np.all((a >= 0) & (a <= 1)):
        return False, np.inf, -1
    dev = _row_sum_deviation(a)
    worst = int(np.argmax(dev))
    return True, float(dev[worst]), worst


def _entry(a: np.ndarray, idx: tuple[int, ...], columns: list[str] | None) -> str:
    """Name one entry of the scores for a message: row, column (by name) and value."""
    value = float(a[idx])
    if a.ndim == 1:
        return f"row {idx[0]} holds {value!r}"
    col = f"column {idx[1]}" + (f" ({columns[idx[1]]!r})" if columns else "")
    return f"row {idx[0]}, {col} holds {value!r}"


def _column_list(cols: list[int], columns: list[str] | None) -> str:
    names = [f"{c} ({columns[c]!r})" if columns else str(c) for c in cols]
    return ("column " if len(names) == 1 else "columns ") + ", ".join(names)


def _not_logits(
    a: np.ndarray, name: str, flags: dict[str, str], columns: list[str] | None
) -> str | None:
    """Why scores with an entry outside [0, 1] must not be read as logits, or None.

    Shapes of data that look like logits to a range test but are not (issue 26):
    probabilities with entries just outside [0, 1] (:data:`INFER_RANGE_ATOL`; 2-D: the
    median row summing to 1 within :data:`PROBS_ROW_SUM_ATOL`), percentages,
    unnormalised probabilities (two distinct rows or more, non-negative, every row summing to one
    common ``c`` within a relative :data:`SCALED_ROW_SUM_RTOL`: ``P * c``, votes),
    probability columns beside an extra fractional column (a weight), and rows that sum
    to 1 exactly as only probabilities do; an extra column of integers is refused before
    (:func:`_integer_column`).
    """
    choose = f"Pass {flags['logits']} if they are logits"
    outside = (a < 0) | (a > 1)
    first = _first_bad(outside)
    tol = INFER_RANGE_ATOL
    # rows like probabilities: the typical row sums to 1 within what --probs accepts
    # (logits of a small scale, all within tol of 0, sum to about 0; a few broken rows
    # of a probability file do not make it logits)
    rows_like = a.ndim == 1 or float(np.median(_row_sum_deviation(a))) <= PROBS_ROW_SUM_ATOL
    if rows_like and np.all((a >= -tol) & (a <= 1 + tol)):
        return (
            f"cannot tell whether {name} are probabilities or logits: every entry lies "
            f"within {tol:g} of [0, 1] but {_entry(a, first, columns)}, outside [0, 1] (a "
            f"rounding error in probabilities?). Pass {flags['probs']} if they are "
            f"probabilities (entries within {PROBS_RANGE_ATOL:g} of [0, 1] are clipped, "
            f"with a warning), or {flags['logits']} if they are logits."
        )
    in_pct = bool(np.all((a >= 0) & (a <= 100)))
    if in_pct and a.ndim == 1:
        return (
            f"{name} look like percentages (every value in [0, 100], {_entry(a, first, None)})"
            f": divide them by 100 for probabilities of class 1. {choose} (log-odds)."
        )
    if a.ndim != 2:
        return None
    sums = a.sum(axis=1, dtype=np.float64)
    if in_pct and np.all(np.abs(sums - 100.0) <= 100.0 * INFER_ROW_SUM_ATOL):
        return (
            f"{name} look like percentages (entries in [0, 100], rows summing to 100; "
            f"{_entry(a, first, columns)}): divide them by 100 and pass {flags['probs']}. "
            f"{choose}."
        )
    c = float(np.median(sums))
    if (
        np.all(a >= 0)
        and np.any(a != a[0])
        and np.all(np.abs(sums - c) <= c * SCALED_ROW_SUM_RTOL)
    ):
        # unnormalised probabilities (P * c, counts of c votes): logits are never all
        # non-negative with one common row sum; one row repeated could be either (the
        # same logits for every sample)
        return (
            f"{name} look like unnormalised probabilities (entries >= 0, every row summing "
            f"to {c:.6g}; {_entry(a, first, columns)}): divide each row by its sum and "
            f"pass {flags['probs']}. {choose}."
        )
    col_out = outside.any(axis=0)
    # (a column of integers beside fractional scores: _integer_column, before this)
    inside = [int(c) for c in np.flatnonzero(~col_out)]
    if len(inside) >= 2:
        dev = np.abs(a[:, inside].sum(axis=1, dtype=np.float64) - 1.0)
        if np.all(dev <= INFER_ROW_SUM_ATOL):
            others = [int(c) for c in np.flatnonzero(col_out)]
            return (
                f"{name}: {_column_list(inside, columns)} are probabilities (rows summing "
                f"to 1) but {_column_list(others, columns)} "
                f"{'lies' if len(others) == 1 else 'lie'} outside [0, 1] "
                f"({_entry(a, first, columns)}): extra columns read as more classes? "
                f"Remove them, or pass {flags['logits']} if every column is a logit."
            )
    if np.all(np.abs(sums - 1.0) <= ROW_SUM_ATOL):
        return (
            f"{name}: every row sums to 1, as probabilities do, but "
            f"{_entry(a, first, columns)}, outside [0, 1]. Pass {flags['logits']} if "
            f"they are logits; probabilities ({flags['probs']}) must lie in [0, 1]."
        )
    return None


def _integer_column(
    a: np.ndarray, name: str, flags: dict[str, str], columns: list[str] | None
) -> str | None:
    """Why a column of integers beside fractional scores must not be read as a class.

    A fold, a count, or a 0/1 flag (``correct``, a predicted class of a binary task)
    beside probabilities or logits lies in [0, 1] or looks like one more logit, and was
    read as one more class (a CIFAR-10 logits table with a ``correct`` column became
    K = 11). Scores of a class are fractional in some row; a class whose every score is
    a whole number, not all 0, is said with ``--probs`` / ``--logits``. An all-zero
    column passes: a logit reference column or a class never predicted (an all-zero
    ``fold`` column looks the same).
    """
    # an all-zero column is a logit reference (binary logits (0, t)) or a class never
    # predicted, which an all-zero fold column cannot be told from
    integral = np.all(a == np.round(a), axis=0)
    whole = integral & np.any(a != 0, axis=0)
    if not whole.any() or integral.all():
        return None  # no integer column, or hard (one-hot) predictions
    extra = [int(c) for c in np.flatnonzero(whole)]
    vals = np.unique(a[:, extra[0]])
    shown = ", ".join(f"{v:g}" for v in vals[:5]) + (", ..." if vals.size > 5 else "")
    return (
        f"{name}: {_column_list(extra, columns)} holds only integers ({shown}) beside "
        "fractional scores: an extra column (a fold, a count, a 0/1 flag such as "
        f"'correct') read as one more class? Remove it, or pass {flags['probs']} or "
        f"{flags['logits']} if it is a class's scores."
    )


def resolve_input(
    scores: np.ndarray,
    input: str,
    name: str = "scores",
    flags: dict[str, str] | None = None,
    columns: list[str] | None = None,
) -> tuple[str, str]:
    """Decide whether ``scores`` hold probabilities or logits: the one rule of kdecal.

    Parameters
    ----------
    scores : ndarray, shape (n, K) or (n,)
        Real scores (already checked to be numeric).
    input : {"auto", "probs", "logits"}
        What the caller said.  ``"auto"``: scores whose entries all lie in [0, 1] are
        probabilities when every row sums to 1 within :data:`INFER_ROW_SUM_ATOL` (a
        1-D array in [0, 1] is ``P(y = 1)``); scores with an entry outside [0, 1] are
        logits, unless they look like something else, which is refused: every entry
        within :data:`INFER_RANGE_ATOL` of [0, 1] and (2-D) the median row summing to 1
        within :data:`PROBS_ROW_SUM_ATOL` (a rounding error in probabilities), percentages (entries in [0, 100] with rows summing to 100; a
        1-D array in [0, 100]), unnormalised probabilities (two distinct rows or more,
        entries non-negative, every row summing to one common ``c`` within a relative
        :data:`SCALED_ROW_SUM_RTOL`), a column of integers beside fractional scores (a fold,
        a count, a 0/1 flag; also in [0, 1]), columns in [0, 1] summing to 1 beside columns outside
        it, or rows that all sum to 1 (within :data:`ROW_SUM_ATOL`).  Logits are never
        inferred from a near miss of the simplex.
    name : str
        Argument name for messages.
    flags : dict, optional
        How to name the two choices in messages (``{"probs": "--probs", ...}`` for the
        command line); default ``input='probs'`` / ``input='logits'``.
    columns : list of str, optional
        Column names (a table's header), to name an offending column in messages.

    Returns
    -------
    kind : {"probs", "logits"}
    how : str
        ``"as specified"`` or ``"inferred: <reason>"``, for reports.

    Raises
    ------
    ValueError
        ``input="auto"`` and the scores are ambiguous (see above; the message names
        both choices and the offending row and column); or ``input="logits"`` and
        every row of a 2-D ``scores`` of two rows or more lies on the simplex
        (probabilities passed as logits would be softmaxed into wrong numbers; a single
        row of logits may lie there).
    """
    flags = INPUT_FLAGS if flags is None else flags
    check_choice(input, "input", ("auto", "probs", "logits"))
    if input == "probs":
        return "probs", "as specified"
    a = np.asarray(scores)
    in_range, dev, worst = _on_simplex(a)
    if input == "logits":
        # one row is no evidence (a row of logits may lie on the simplex: (0.3, 0.7));
        # a batch whose every row does is probabilities passed as logits
        if in_range and dev <= INFER_ROW_SUM_ATOL and a.shape[0] >= 2:
            raise ValueError(
                f"{name} were given as logits ({flags['logits']}) but every row is a "
                "probability vector (entries in [0, 1], rows summing to 1); softmax would "
                f"turn them into different numbers. Pass {flags['probs']} if they are "
                "probabilities."
            )
        return "logits", "as specified"
    if a.size and not np.all(np.isfinite(a)):
        return "logits", "inferred: values outside [0, 1]"  # the caller refuses them
    if a.ndim == 2 and a.shape[0] >= 2:
        problem = _integer_column(a, name, flags, columns)
        if problem is not None:
            raise ValueError(problem)
    if a.ndim == 1:
        if a.size and np.all((a >= 0) & (a <= 1)):
            return "probs", "inferred: values in [0, 1]"
    elif in_range:
        if dev <= INFER_ROW_SUM_ATOL:
            return "probs", "inferred: rows on the probability simplex"
        raise ValueError(
            f"cannot tell whether {name} are probabilities or logits: every entry lies in "
            f"[0, 1] but row {worst} sums to {float(a[worst].sum(dtype=np.float64))!r} "
            f"(more than {INFER_ROW_SUM_ATOL} from 1). Pass {flags['probs']} if they are "
            f"probabilities (rows within {PROBS_ROW_SUM_ATOL} of 1 are renormalised) or "
            f"{flags['logits']} if they are logits."
        )
    if a.size:
        problem = _not_logits(a.astype(np.float64, copy=False), name, flags, columns)
        if problem is not None:
            raise ValueError(problem)
    return "logits", "inferred: values outside [0, 1]"


def check_probs(
    probs: object, name: str = "probs", min_n: int = 3, *, input_eps: float = 0.0
) -> Probs:
    """Validate and normalise probabilities; see :class:`Probs`.

    A :class:`Probs` is validated already and comes back as it is (validating its
    clipped, renormalised rows again would move their last bits), so that the layers
    below a public function take the validated object.  Rows are renormalised without a
    warning within ``max(ROW_SUM_ATOL, eps)`` of 1, ``eps`` the machine epsilon of the
    array's floating dtype or ``input_eps`` (that of the dtype the caller converted
    from): a bfloat16 softmax's rows miss 1 by up to its rounding, about 4e-3.
    """
    if isinstance(probs, Probs):
        if probs.n < min_n:
            raise ValueError(f"{name} needs at least {min_n} samples, got n = {probs.n}")
        return probs
    if is_dask_array(probs):  # row checks block by block where the blocks live
        return check_probs_dask(probs, name, min_n)
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
        raise ValueError(f"{name} contains a non-finite value {float(a[idx])!r} at index {idx}")
    low, high = -PROBS_RANGE_ATOL, 1.0 + PROBS_RANGE_ATOL
    if np.any(a < low):
        idx = _first_bad(a < low)
        raise ValueError(
            f"{name} contains a negative probability {float(a[idx])!r} at index {idx}"
        )
    if binary and np.any(a > high):
        idx = _first_bad(a > high)
        raise ValueError(f"binary {name} must lie in [0, 1], got {float(a[idx])!r} at index {idx}")
    if not binary:
        eps = float(np.finfo(arr.dtype).eps) if arr.dtype.kind == "f" else 0.0
        quiet = max(ROW_SUM_ATOL, eps, float(input_eps))
        _check_row_sums(a, name, PROBS_ROW_SUM_ATOL, high, quiet)
    stray = (a < 0) | (a > 1)
    if np.any(stray):
        idx = _first_bad(stray)
        by = float(max(-a.min(), a.max() - 1.0))
        warn_user(
            f"{name}: {int(stray.sum())} of {a.size} entries lie outside [0, 1], by at "
            f"most {by:.3g} (first {float(a[idx])!r} at index {idx}; up to "
            f"{PROBS_RANGE_ATOL:g} is clipped); they were clipped to [0, 1]",
            RenormalizationWarning,
        )
        a = np.clip(a, 0.0, 1.0)
    if binary:
        a = np.stack([1.0 - a, a], axis=1)
    if a.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {a.shape[0]}")
    return Probs(p=clip_renormalise(a), dtype=dtype, binary=binary)


def clip_renormalise(a: np.ndarray) -> np.ndarray:
    """Clip probabilities (n, K) to ``PROB_EPS`` and divide each row by its sum.

    The last step of :func:`check_probs`, and all of it that applies to probabilities
    kdecal computed itself (a calibrator's output, ``exp`` of validated
    log-probabilities: finite, in [0, 1], rows summing to 1 up to rounding), which need
    no checks.  Returns a new C-contiguous float64 array; ``a`` is not modified.
    """
    # C order first: the row sums' rounding (and every estimate after it) must not depend
    # on the caller's memory layout (a Fortran-ordered copy of the same values summed
    # its rows in another order, and 1 - p of confidences within 1e-11 of 1 moved by 1e-5)
    a = np.ascontiguousarray(np.maximum(a, PROB_EPS))
    a /= a.sum(axis=1, keepdims=True)
    return a


def check_labels(
    labels: object, n: int, n_classes: int, name: str = "labels", scores: str = "probs"
) -> np.ndarray:
    """Validate labels; returns an int64 array of shape (n,).

    ``scores`` names the array whose rows and columns the labels must match.
    """
    arr = _numeric_array(labels, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D with shape ({n},), got shape {arr.shape}")
    if arr.dtype == np.bool_ and n_classes > 2:
        # a correctness mask (pred == y) read as the classes 0 and 1 of K > 2
        raise ValueError(
            f"{name} are booleans, but {scores} has K = {n_classes} columns: pass the "
            "true class indices in 0..K-1 (a mask such as argmax == y is not a label)"
        )
    if arr.shape[0] != n:
        raise ValueError(
            f"{name} has {arr.shape[0]} entries but {scores} has {n} rows (shape mismatch)"
        )
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            idx = _first_bad(~np.isfinite(arr))
            raise ValueError(
                f"{name} contains a non-finite value {arr[idx].item()!r} at index {idx}"
            )
        frac = arr != np.round(arr)
        if np.any(frac):
            idx = _first_bad(frac)
            raise ValueError(
                f"{name} must be integers in 0..{n_classes - 1}, got {arr[idx].item()!r} at "
                f"index {idx}"
            )
    # compare in the input's own type before casting: 1e20 or 2**64 - 1 must be
    # reported as themselves, not as what int64 wraps them to
    bad = (arr < 0) | (arr >= n_classes)
    if np.any(bad):
        idx = _first_bad(bad)
        value = arr[idx].item()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        raise ValueError(
            f"{name} must lie in 0..{n_classes - 1} (K = {n_classes} columns in {scores}), "
            f"got {value!r} at index {idx}"
        )
    return np.ascontiguousarray(arr.astype(np.int64))


def check_bandwidth(bandwidth: object, name: str = "bandwidth") -> float:
    """Validate one bandwidth: a finite float in ``[MIN_BANDWIDTH, inf)``.

    Raises
    ------
    TypeError
        If ``bandwidth`` is not a real number (booleans are refused).
    ValueError
        If it is not finite or below :data:`MIN_BANDWIDTH`.
    """
    if isinstance(bandwidth, (bool, np.bool_)) or not isinstance(bandwidth, numbers.Real):
        specs = ", 'auto' or 'loo-mle'" if name == "bandwidth" else ""
        raise TypeError(f"{name} must be a positive float{specs}, got {bandwidth!r}")
    h = float(bandwidth)
    if not np.isfinite(h) or h <= 0:
        raise ValueError(f"{name} must be a finite float > 0, got {bandwidth!r}")
    if h < MIN_BANDWIDTH:
        raise ValueError(
            f"{name} = {bandwidth!r} is below the smallest supported bandwidth "
            f"{MIN_BANDWIDTH:g} (the kernel constants overflow; every estimate has reached "
            "its h -> 0 limit long before)"
        )
    return h


def check_bandwidths(bandwidths: object, name: str = "bandwidths") -> np.ndarray:
    """Validate a 1-D array of bandwidths (each finite and ``>= MIN_BANDWIDTH``).

    Raises
    ------
    TypeError
        If ``bandwidths`` is not numeric (booleans are refused).
    ValueError
        If it is empty, not 1-D, or holds a value that :func:`check_bandwidth` refuses.
    """
    arr = _numeric_array(bandwidths, name)
    if arr.dtype == np.bool_:
        raise TypeError(f"{name} must be real numbers, got booleans {arr.tolist()!r}")
    arr = np.atleast_1d(arr.astype(np.float64))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if np.any(bad):
        raise ValueError(f"{name} must be finite and > 0, got {float(arr[np.argmax(bad)])!r}")
    if np.any(arr < MIN_BANDWIDTH):
        raise ValueError(
            f"{name} holds {arr[np.argmax(arr < MIN_BANDWIDTH)]!r}, below the smallest "
            f"supported bandwidth {MIN_BANDWIDTH:g}"
        )
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


def check_seed(seed: object, name: str = "seed") -> np.random.Generator:
    """Return ``numpy.random.default_rng(seed)``, or raise naming ``name`` and the value.

    ``seed``: None, a non-negative integer (or a sequence of them), a
    ``numpy.random.SeedSequence``, ``BitGenerator`` or ``Generator`` (returned as it is).

    Raises
    ------
    TypeError, ValueError
        Anything ``numpy.random.default_rng`` refuses (a string, a float, a negative
        integer), with the argument's name.
    """
    if isinstance(seed, (bool, np.bool_)):  # numpy reads True as 1: a flag, not a seed
        raise TypeError(
            f"{name} must be None, a non-negative integer, a numpy.random.SeedSequence or "
            f"a numpy.random.Generator, got {seed!r}"
        )
    try:
        return np.random.default_rng(seed)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise type(exc)(
            f"{name} must be None, a non-negative integer, a sequence of them, a "
            f"numpy.random.SeedSequence or a numpy.random.Generator, got {seed!r}"
        ) from None


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


#: ``n_bins`` may exceed the number of samples (empty bins are allowed) up to this.
MAX_BINS_FLOOR = 1000


def check_n_bins(n_bins: object, n: int, name: str = "n_bins") -> int:
    """Check a number of bins: an integer in ``1..max(n, MAX_BINS_FLOOR)``.

    The bound keeps the memory of every binned statistic O(n): more bins than samples
    only adds empty bins.

    Raises
    ------
    TypeError
        If ``n_bins`` is not an integer.
    ValueError
        If it is below 1 or above the bound.
    """
    b = check_int(n_bins, name, 1)
    limit = max(int(n), MAX_BINS_FLOOR)
    if b > limit:
        raise ValueError(
            f"{name} = {b} is more than max(n, {MAX_BINS_FLOOR}) = {limit} bins for n = {n} "
            "samples; use at most one bin per sample"
        )
    return b


class LogProbs(NamedTuple):
    """Scores read as log-probabilities by :func:`log_probs`.

    Attributes
    ----------
    L : ndarray, shape (n, K), float64
        Natural-log probabilities, finite, each row log-sum-exp 0 (up to rounding);
        for ``kind="probs"`` the read-only :attr:`Probs.log_p` of the validated input.
    q : ndarray, shape (n, K), float64
        Probabilities: the validated (clipped, renormalised) input for ``kind="probs"``,
        ``exp(L)`` for ``kind="logits"``.
    binary : bool
        Whether the input was 1-D (``P(y = 1)`` or the log-odds of class 1).
    kind : {"probs", "logits"}
        How the scores were read (``input`` resolved by :func:`resolve_input`).
    """

    L: np.ndarray
    q: np.ndarray
    binary: bool
    kind: str


def log_softmax_rows(z: np.ndarray) -> np.ndarray:
    """Row-wise ``log_softmax`` of finite float64 ``z`` (n, K) that never returns ``-inf``.

    Differences ``z_ik - max_k z_ik`` beyond the float64 range (logits near +-1e308) are
    clipped to ``-finfo(float64).max``: the probability they stand for is 0 to any
    precision, and keeping it finite keeps every later product and sum finite.
    """
    m = z.max(axis=1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        D = z - m
    if np.all(np.isfinite(D)):  # the usual case: z - logsumexp(z), as scipy computes it
        return z - (m + np.log(np.exp(D).sum(axis=1, keepdims=True)))
    D = np.maximum(D, -np.finfo(np.float64).max)
    return D - np.log(np.exp(D).sum(axis=1, keepdims=True))


def log_probs(
    scores: object,
    input: str = "auto",
    name: str = "scores",
    min_n: int = 1,
    flags: dict[str, str] | None = None,
) -> LogProbs:
    """Validate probabilities or logits and return them as log-probabilities.

    The one reader of "probabilities or logits" for the calibrators and the scoring
    rules: the kind is decided by :func:`resolve_input` (``input="auto"`` infers it and
    refuses ambiguous scores; ``input="logits"`` refuses rows on the simplex),
    probabilities are checked by :func:`check_probs`, and logits are normalised by a
    row-wise log-softmax that stays finite for logits up to the float64 range.

    Parameters
    ----------
    scores : array-like, shape (n, K) or (n,)
        Probabilities (rows on the simplex; ``(n,)`` is ``P(y = 1)``) or logits
        (``(n,)`` is the log-odds of class 1, i.e. the logits ``(0, t)``).
    input : {"auto", "probs", "logits"}, default "auto"
        What ``scores`` hold; see :func:`resolve_input`.
    name : str
        Argument name for messages.
    min_n : int
        Fewest rows accepted.
    flags : dict, optional
        How messages name the choices (see :func:`resolve_input`).

    Returns
    -------
    LogProbs
        ``(L, q, binary, kind)``.

    Raises
    ------
    TypeError
        Non-numeric or complex ``scores``.
    ValueError
        Unknown ``input``; empty scores, a shape other than (n, K >= 2) or (n,); fewer
        than ``min_n`` rows; a non-finite entry; ambiguous or contradictory scores (see
        :func:`resolve_input`); probabilities off the simplex (see :func:`check_probs`).
    """
    arr = _numeric_array(scores, name)
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape})")
    if arr.ndim == 2 and arr.shape[1] == 1:
        raise ValueError(
            f"{name} has shape {arr.shape}: K = 1 class is not a classification problem; "
            "pass a 1-D array (P(y = 1) or the log-odds of class 1) for binary problems"
        )
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (n, K) or (n,), got shape {arr.shape}")
    kind, _ = resolve_input(arr, input, name, flags)
    if kind == "probs":
        P = check_probs(arr, name, min_n=min_n)
        return LogProbs(P.log_p, P.p, P.binary, kind)
    z = arr.astype(np.float64)
    if not np.all(np.isfinite(z)):
        idx = _first_bad(~np.isfinite(z))
        raise ValueError(f"{name} contains a non-finite value {float(z[idx])!r} at index {idx}")
    if z.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {z.shape[0]}")
    binary = z.ndim == 1
    if binary:
        z = np.stack([np.zeros_like(z), z], axis=1)
    L = log_softmax_rows(z)
    return LogProbs(L, np.exp(L), binary, kind)


# ------------------------------------------------------------------ dask-array input


def is_dask_array(x: object) -> bool:
    """Whether ``x`` is a ``dask.array.Array`` (checked without importing dask)."""
    mod = type(x).__module__ or ""
    return (mod == "dask" or mod.startswith("dask.")) and hasattr(x, "map_blocks")


#: Serialises the blocks' warning capture: ``warnings.catch_warnings`` swaps the
#: process's filters and ``showwarning``, so two blocks validated at once on threads (the
#: threaded dask scheduler) interleaved their captures: a block's warnings escaped to the
#: caller uncollected, or the "always" filter of one stayed installed after both.
_BLOCK_WARNINGS = threading.Lock()


def _check_block(
    block: np.ndarray, name: str, a: int, b: int
) -> tuple[np.ndarray, list[tuple[type[Warning], str]]]:
    """Validate rows ``[a, b)`` with the in-memory checks, where the block lives.

    Returns the validated rows and the warnings the checks gave (to re-issue on the
    client); a failed check raises with the block's rows in the message.
    """
    if block.shape[0] == 0:
        return np.zeros((0, 2 if block.ndim == 1 else block.shape[1])), []
    with _BLOCK_WARNINGS, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            p = check_probs(block, name, min_n=1).p
        except ValueError as exc:
            raise ValueError(
                f"{name} (a dask array), in its rows {a}..{b - 1} (indices below count from "
                f"row {a}): {exc}"
            ) from None
    return p, [(w.category, str(w.message)) for w in caught]


def check_probs_dask(x: Any, name: str = "probs", min_n: int = 3) -> Probs:
    """Validate probabilities given as a dask array, block by block on the cluster.

    Every row check of :func:`kdecal._validation.check_probs` (finite, non-negative,
    rows summing to 1, binary values in [0, 1]) and its clipping and renormalisation
    run on each block of rows where the block lives (the current dask scheduler:
    the workers of a ``dask.distributed`` client); the client receives the validated
    rows once, as the in-memory path would return them, and re-issues the checks'
    warnings (e.g. rows renormalised), naming the blocks.

    Parameters
    ----------
    x : dask.array.Array, shape (n, K) or (n,), numeric
        Chunked by rows (chunks along K are merged first).
    name : str
        Argument name used in error messages.
    min_n : int
        Fewest rows accepted.

    Returns
    -------
    Probs
        The same object as for ``x.compute()``.

    Raises
    ------
    TypeError
        If the dtype is not real numeric.
    ValueError
        On a bad shape, unknown chunk sizes, too few rows, or a row that fails a check
        (the message names the block's rows and the index within the block).
    """
    dt = np.dtype(x.dtype)
    problem = _dtype_problem(dt, name)
    if problem is not None:
        raise TypeError(problem)
    if np.issubdtype(dt, np.complexfloating):
        raise TypeError(f"{name} must be real, got dtype {dt}")
    if x.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (n, K) or (n,), got shape {x.shape}")
    if any(isinstance(s, float) and math.isnan(s) for s in x.shape):
        raise ValueError(
            f"{name} is a dask array of unknown shape {x.shape}; call "
            f"{name}.compute_chunk_sizes() first"
        )
    if x.ndim == 2 and x.shape[1] == 1:
        raise ValueError(
            f"{name} has shape {x.shape}: K = 1 class is not a classification problem; "
            "pass a 1-D array of P(y = 1) for binary problems"
        )
    if x.size == 0:
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if x.shape[0] < min_n:
        raise ValueError(f"{name} needs at least {min_n} samples, got n = {x.shape[0]}")
    import dask  # an optional dependency, present since x is a dask array

    binary = x.ndim == 1
    if not binary and x.numblocks[1] != 1:
        x = x.rechunk({1: -1})
    edges = np.concatenate([[0], np.cumsum(x.chunks[0])]).astype(int)
    blocks = x.to_delayed().ravel()
    check = dask.delayed(_check_block, pure=True)
    parts = dask.compute(
        *[check(blk, name, int(a), int(b)) for blk, a, b in zip(blocks, edges, edges[1:])]
    )
    seen: dict[tuple[type[Warning], str], list[int]] = {}
    for (_, caught), a in zip(parts, edges):
        for category, message in caught:
            seen.setdefault((category, message), []).append(int(a))
    for (category, message), starts in seen.items():
        where = ", ".join(str(a) for a in starts[:5]) + (", ..." if len(starts) > 5 else "")
        warn_user(
            f"{name} (a dask array), in its block(s) starting at row {where} (row "
            f"numbers below count from the block's first row): {message}",
            category,
        )
    p = np.ascontiguousarray(np.concatenate([q for q, _ in parts]), dtype=np.float64)
    dtype = np.dtype(np.float32) if dt == np.float32 else np.dtype(np.float64)
    return Probs(p=p, dtype=dtype, binary=binary)


def softmax(logits: object, axis: int = -1) -> np.ndarray:
    """Turn logits into probabilities, ``exp(z) / sum exp(z)`` along ``axis``.

    Parameters
    ----------
    logits : array-like, shape (n, K), float
        Unnormalised log-probabilities (any real values).
    axis : int, default -1
        Axis over classes.

    Returns
    -------
    ndarray, shape (n, K), float64
        Probabilities; rows sum to 1. Computed stably by :func:`scipy.special.softmax`.

    Raises
    ------
    TypeError
        If ``logits`` is not numeric.
    ValueError
        If ``logits`` is empty or contains NaN or infinite values.
    """
    z = _numeric_array(logits, "logits").astype(np.float64)
    if z.size == 0:
        raise ValueError(f"logits is empty (shape {z.shape})")
    if not np.all(np.isfinite(z)):
        raise ValueError("logits contains NaN or infinite values")
    out = np.asarray(_sp_softmax(z, axis=axis))
    # C order: the same logits in another memory layout give the same bits downstream
    return out if out.flags.c_contiguous else np.ascontiguousarray(out)
