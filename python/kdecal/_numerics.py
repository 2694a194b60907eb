"""Exactly rounded sums of NumPy arrays (``math.fsum``'s value, vectorised)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["ValueEq", "exact_sum", "resampling_pvalue", "same_value"]

#: Null values within this fraction of the larger magnitude (the statistic's or the null
#: values'), or within :data:`PVALUE_TIE_ATOL`, of the statistic count as ties in
#: :func:`resampling_pvalue`.
PVALUE_TIE_RTOL = 1e-12

#: ... the absolute part: the statistics are means of functions of probabilities (values
#: of order 1, rounded at about 1e-16), so two evaluations of one label set on different
#: paths differ by a few 1e-16 however small the statistic (a residual ``y - f`` of
#: 2e-12 computed as ``1 - f`` carries a relative error of 1e-4).
PVALUE_TIE_ATOL = 1e-13

#: Below this many terms :func:`exact_sum` is ``math.fsum`` itself.
_EXACT_SUM_MIN = 1024
#: Rounds of error-free extraction before :func:`exact_sum` hands the rest to fsum.
_EXACT_SUM_ROUNDS = 6


def exact_sum(x: np.ndarray) -> float:
    """Return ``math.fsum(x)``, the exactly rounded sum, bit for bit, faster for large x.

    Error-free extraction (Rump, Ogita & Oishi, SIAM J. Sci. Comput. 31(1), 2008,
    Algorithm 3.2, ExtractVector): with ``sigma`` a power of two at least ``2n`` times
    the largest ``|r_i|``, ``q_i = (sigma + r_i) - sigma`` and ``r_i - q_i`` are exact,
    every ``q_i`` is a multiple of ``ulp(sigma) / 2`` and every partial sum of the
    ``q_i`` stays below ``sigma``, so NumPy's sum of them is exact in any order. Each
    round leaves remainders about ``2^-(52 - log2(2n))`` times smaller; after at most
    :data:`_EXACT_SUM_ROUNDS` rounds (or when they vanish) the round sums and the
    remainders go to ``math.fsum``, which rounds their exact total once. Non-finite or
    huge terms (where ``sigma`` would overflow) go to ``math.fsum`` directly.
    """
    r = np.asarray(x, dtype=np.float64).ravel()
    n = r.shape[0]
    if n < _EXACT_SUM_MIN:
        return math.fsum(r.tolist())
    parts: list[float] = []
    grow = math.ceil(math.log2(n)) + 1
    for _ in range(_EXACT_SUM_ROUNDS):
        amax = float(np.max(np.abs(r)))
        if amax == 0.0:
            break
        k = math.frexp(amax)[1] + grow  # amax < 2^(k - grow)
        if not math.isfinite(amax) or k > 1023:
            break
        sigma = math.ldexp(1.0, k)
        q = (sigma + r) - sigma
        parts.append(float(np.sum(q)))
        r = r - q
    else:
        return math.fsum(parts + r.tolist())
    if amax == 0.0 and parts:
        return math.fsum(parts)
    return math.fsum(parts + r.tolist())  # also every term a zero (fsum's sign of 0)


def same_value(a: object, b: object) -> bool:
    """Whether two result values are equal, arrays compared as values.

    Arrays (and array-likes met beside one) are equal when their shapes and elements
    are, NaN equal to NaN; dicts, lists and tuples compare item by item; floats NaN
    equal to NaN; anything else with ``==``. Mappings (dicts and read-only views of
    them) compare item by item.
    """
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        try:
            return bool(np.array_equal(a, b, equal_nan=True))  # type: ignore[arg-type]
        except TypeError:  # object arrays cannot test NaN
            return bool(np.array_equal(a, b))  # type: ignore[arg-type]
    if isinstance(a, Mapping) and isinstance(b, Mapping):  # dicts, read-only views
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (
            type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


class ValueEq:
    """Value equality for frozen result dataclasses that hold arrays (``eq=False``).

    The dataclass-generated ``__eq__`` compares the fields' tuples, which raises on
    arrays; this one compares the fields with :func:`same_value`, except those declared
    ``field(compare=False)`` (as the generated one would). Results stay unhashable, as
    their arrays are.
    """

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        fields = self.__dataclass_fields__  # type: ignore[attr-defined]
        return all(
            same_value(getattr(self, k), getattr(other, k)) for k, f in fields.items() if f.compare
        )


def resampling_pvalue(null: np.ndarray, statistic: float) -> float:
    """Return the resampling p-value ``(1 + #{null >= statistic}) / (1 + R)``.

    A null value equal to the statistic up to rounding counts as at least as large: one
    within ``max(PVALUE_TIE_RTOL * max(|statistic|, max |null|), PVALUE_TIE_ATOL)`` of
    it. Such ties are exact in exact arithmetic (a resampled label set equal to the
    observed one, which small or near one-hot samples redraw often), and which side of
    the statistic their rounding fell on depended on the summation order and the path
    (the backend, the row blocks).
    """
    null = np.asarray(null, dtype=np.float64)
    scale = max(abs(float(statistic)), float(np.max(np.abs(null), initial=0.0)))
    tie = max(PVALUE_TIE_RTOL * scale, PVALUE_TIE_ATOL) if math.isfinite(scale) else 0.0
    return float((1.0 + np.count_nonzero(null >= statistic - tie)) / (1.0 + null.size))
