"""The tolerances of kdecal's input checks, in one place.

Probabilities are clipped at :data:`PROB_EPS` and renormalised; rows of probabilities
that do not sum to 1 are renormalised silently within :data:`ROW_SUM_ATOL`, with a
:class:`~kdecal.warnings.RenormalizationWarning` within :data:`PROBS_ROW_SUM_ATOL`, and
refused beyond it; ``input="auto"`` recognises probabilities by
:data:`INFER_ROW_SUM_ATOL` and :data:`INFER_RANGE_ATOL`; bandwidths are at least
:data:`MIN_BANDWIDTH`. Read-only: changing them does not change the checks.
"""

from __future__ import annotations

__all__ = [
    "INFER_RANGE_ATOL",
    "INFER_ROW_SUM_ATOL",
    "MIN_BANDWIDTH",
    "PROBS_RANGE_ATOL",
    "PROBS_ROW_SUM_ATOL",
    "PROB_EPS",
    "ROW_SUM_ATOL",
]

#: Probabilities below this are clipped to it and each row renormalised, so that the
#: Dirichlet kernel (which needs ``log f``) and the KL estimators never see ``log 0``.
PROB_EPS = 1e-12
#: Rows of probabilities whose sums differ from 1 by at most this are renormalised
#: silently (float32 storage, softmax rounding); half-precision inputs (float16,
#: bfloat16 tensors) within their dtype's machine epsilon (bfloat16: 7.8e-3), the
#: rounding of a softmax computed in them.
ROW_SUM_ATOL = 1e-3
#: With ``input="auto"``, scores in [0, 1] whose rows all sum to 1 within this are
#: recognised as probabilities.  Probabilities rounded to 3 decimals pass for every
#: K <= 40 (each entry moves by at most 5e-4); rows further off are neither clearly
#: probabilities nor clearly logits, and the caller must say which they are.
INFER_ROW_SUM_ATOL = 0.02
#: Probabilities passed as such (``input="probs"``, ``--probs``, or any function that
#: takes only probabilities) may have rows off by up to this (probabilities rounded to
#: 2 decimals at K = 10, for example); they are renormalised with a
#: :class:`~kdecal.warnings.RenormalizationWarning` that says by how much.
PROBS_ROW_SUM_ATOL = 0.1
#: With ``input="auto"``, scores whose entries all lie within this of [0, 1] but not all
#: inside it (``1.0000001``, ``-1e-7``: probabilities with a rounding error, or logits
#: that happen to be small) are refused as ambiguous rather than read as logits.
INFER_RANGE_ATOL = 0.05
#: Probabilities passed as such may stray outside [0, 1] by up to this (float rounding
#: in a softmax, a CSV written with too few digits); such entries are clipped to [0, 1]
#: with a :class:`~kdecal.warnings.RenormalizationWarning`; further out is an error.
PROBS_RANGE_ATOL = 0.01

#: Smallest bandwidth accepted.  Below about 3e-306 the kernel constants
#: ``lgamma(f / h + 1)`` overflow; long before that (h below about 1e-8 for
#: probabilities stored in float64) every estimate has reached its h -> 0 limit, the
#: nearest-neighbour estimate, so nothing is lost by refusing smaller values.
MIN_BANDWIDTH = 1e-300
