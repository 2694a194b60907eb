"""The quantities of an estimate, and the one table that routes them.

L_p ECE^KDE, proper calibration errors, refinement and sharpness as O(nK) plug-ins on
an :class:`~kdecal._estimation.regression.Estimate`, and the one table that routes them:
:data:`QUANTITIES` (name -> :class:`Quantity`: formula, divergence, estimate, bandwidth
criterion, unit, label) and :func:`divergence_of` (a ``divergence`` argument -> its
:class:`Divergence`: generator, estimate, criterion). The public functions, the
:class:`kdecal.CalibrationEstimate`, the report, :func:`kdecal.compare` and
:mod:`kdecal.torch` read them instead of testing names themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _formulas as _f
from .generators import KL, L2, Bregman, CustomGenerator, Generator, KLGenerator, L2Generator
from .regression import Estimate

# ----------------------------------------------------------------------------- estimators


def ce_p(est: Estimate, p: float) -> float:
    """``(mean_b mean_j sum_coords |E - f|^p)^(1/p)``; p = 2 uses the debiased squares.

    With the debiased squares, the mean estimates ``CE_2^2`` without bias and may be
    negative when the error is close to 0, meaning "indistinguishable from 0 at this n"
    (the one rule for squared errors of issue 26, README "Debiasing"): it is reported
    unclipped, and the root keeps its sign, ``-sqrt(-mean)``, so that ``sign(v) v^2`` is
    the squared L2 calibration error of the same estimate (to rounding) in the API, the
    report, its JSON and the bootstrap replicates alike.
    """
    c = est.problem.coords
    scale = 1.0
    if p == 2.0 and est.sqerr is not None:
        inner = est.sqerr
    elif p == 2.0 and est.sq is not None:
        inner = est.rows(
            lambda e: _f.squared_rows(e.E[..., c], e.problem.p[..., c], e.sq[..., c])  # type: ignore[index]
        )
    else:
        d = est.rows(lambda e: np.abs(e.E[..., c] - e.problem.p[..., c]).max(axis=-1))
        scale = power_scale(d, p)
        inner = est.rows(
            lambda e: np.sum((np.abs(e.E[..., c] - e.problem.p[..., c]) / scale) ** p, axis=-1)
        )
    value = est.mean(inner)
    if value < 0.0:  # only the debiased squares can be negative
        return -math.sqrt(-value)
    return scale * value ** (1.0 / p)


#: The one rule of kdecal for debiased squared errors (issue 26), stated in the README
#: ("Debiasing"), the docstrings and every report: the U-statistic (and App. D)
#: estimates of a squared L2 calibration error are unbiased and are reported unclipped,
#: so they can be negative when the error is close to 0; a negative value means
#: "indistinguishable from 0 at this n". The L2 ECE^KDE (p = 2) is the signed root
#: ``sign(v) sqrt(|v|)`` of the same value v, so that ``ece_kde(p=2) ** 2 ==
#: abs(calibration_error(divergence="l2"))`` (to rounding), both with the sign of v, in
#: the API, the report, its JSON and the bootstrap replicates alike.
SQUARED_RULE = (
    "squared L2 errors are unbiased estimates reported unclipped: a negative value "
    "means the error is indistinguishable from 0 at this n; the L2 ECE^KDE is its "
    "signed square root"
)


#: The quantities a lower bound applies to (:func:`floored`): the canonical squared L2
#: error and its signed root, the L2 ECE^KDE.
FLOORED = ("ce_l2", "ece_kde_l2")


def floored(name: str, value: np.ndarray | float, floor: np.ndarray | float | None) -> np.ndarray:
    """Return ``value`` of quantity ``name`` raised to a lower bound of the squared L2 error.

    ``floor`` is a bound of the squared L2 error (squared probability units; None: no
    bound): "ce_l2" becomes ``max(value, floor)``, "ece_kde_l2" (the signed root of the
    squared error) ``sign(m) sqrt(|m|)`` with ``m = max(sign(v) v^2, floor)`` where the
    bound is the larger, and is kept bit for bit otherwise; any other quantity is
    returned as it is. Element-wise on arrays of replicates.
    """
    v = np.asarray(value, dtype=np.float64)
    if floor is None or name not in FLOORED:
        return v
    f = np.asarray(floor, dtype=np.float64)
    if name == "ce_l2":
        return np.where(f > v, f, v)
    sq = np.sign(v) * np.square(v)
    return np.where(f > sq, np.sign(f) * np.sqrt(np.abs(f)), v)


def power_scale(d: np.ndarray, p: float) -> float:
    """Return s with ``mean(|d|^p)^(1/p) = s mean(|d / s|^p)^(1/p)`` in float range.

    The scale keeps ``|d / s|^p`` representable for any finite p >= 1: it is 1.0 (so
    the plain formula, bit for bit) unless ``max|d|^p`` would leave [1e-250, 1e250];
    then ``max|d|``, so the largest term is exactly 1 and the terms that underflow are
    below ``1e-308`` of it.
    """
    top = float(np.max(d, initial=0.0))
    if top == 0.0 or not np.isfinite(top):
        return 1.0
    log_top = p * np.log(top)
    return 1.0 if -575.0 < log_top < 575.0 else top


def calibration_error(est: Estimate, gen: Generator, estimator: str) -> float:
    """Proper calibration error, direct (Eq. 9/26) or via refinement (Eq. 14-15)."""
    if estimator == "direct":
        return est.mean(est.rows(gen.divergence))
    return est.mean(est.rows(gen.F)) + est.mean(est.rows(lambda e: gen.risk(e.problem)))


def refinement(est: Estimate, gen: Generator) -> float:
    """``REF_F = -mean F(E_j)`` (Eq. 15), averaged over the problems of the batch."""
    return -est.mean(est.rows(gen.F))


def sharpness(est: Estimate, gen: Generator) -> float:
    """``mean F(E_j) - F(class frequencies)`` (Eq. 4-5), averaged over the batch."""
    freq = est.frequencies()
    return est.mean(est.rows(gen.F)) - float(np.mean(gen.F_points(est.problem, freq)))


# -------------------------------------------------------------------- the routing table


@dataclass(frozen=True)
class Divergence:
    """How the estimators treat one Bregman divergence (a ``divergence`` argument).

    Attributes
    ----------
    name : str
        "kl", "l2", or the name of a user's :class:`~kdecal.Bregman`.
    generator : Generator
        The generator applied to estimates (closed forms for "kl" and "l2").
    fit : {"kl", "sq", "main"}
        The estimate of a :class:`kdecal.CalibrationEstimate` its quantities read: the
        KL one (plug-in: at the log-risk bandwidth), the squared-error one (residual: at
        half the Brier bandwidth) or the main one.
    criterion : {"log", "brier"}
        The plug-in estimator's ``bandwidth="auto"`` criterion: the leave-one-out log
        risk for KL, the Brier risk otherwise.
    residual_kind : {"sq", "lp"}
        The residual fit its quantities use (:func:`kdecal._estimation.regression.fit_residual`).
    """

    name: str
    generator: Generator
    fit: str
    criterion: str
    residual_kind: str


#: The built-in divergences by name.
DIVERGENCES: dict[str, Divergence] = {
    "kl": Divergence("kl", KLGenerator(), "kl", "log", "sq"),
    "l2": Divergence("l2", L2Generator(), "sq", "brier", "sq"),
}


def divergence_of(divergence: object) -> Divergence:
    """Return the routing of a divergence: "kl", "l2", the built-in KL or L2, or a Bregman.

    Raises
    ------
    ValueError
        Anything else, naming the argument and the value.
    """
    if divergence is KL or divergence is L2:
        return DIVERGENCES[divergence.name]
    if isinstance(divergence, str) and divergence in DIVERGENCES:
        return DIVERGENCES[divergence]
    if isinstance(divergence, Bregman):
        return Divergence(divergence.name, CustomGenerator(divergence), "main", "brier", "lp")
    raise ValueError(
        f"divergence must be 'kl', 'l2' or a kdecal.Bregman(F, grad_F), got {divergence!r}"
    )


@dataclass(frozen=True)
class Quantity:
    """One named quantity of an estimate (a field of :class:`kdecal.CalibrationReport`).

    Calling it on an :class:`~kdecal._estimation.regression.Estimate` returns its value.

    Attributes
    ----------
    name : str
        The key of :data:`QUANTITIES`, e.g. "ece_kde_l1".
    kind : {"ece", "ce", "refinement", "sharpness"}
        L_p ECE^KDE (Popordanoska, Sayer & Blaschko, NeurIPS 2022, Eq. 9), proper
        calibration error (Popordanoska et al., AISTATS 2024, Eq. 9-10), refinement
        (2024, Eq. 15) or sharpness (2024, Eq. 4-5).
    divergence : {"l1", "l2", "kl"}
        The norm of an ECE^KDE (p = 1 or 2) or the Bregman divergence of the others.
    unit : str
        "probability", "squared probability" or "nats".
    label : str
        The description of the quantity's row in ``str(report)``.
    """

    name: str
    kind: str
    divergence: str
    unit: str
    label: str

    @property
    def p(self) -> float:
        """The order of an ECE^KDE's norm (1 or 2); 2 for the L2 divergences."""
        return 1.0 if self.divergence == "l1" else 2.0

    @property
    def fit(self) -> str:
        """The estimate it is computed on: "kl", "sq" (the squared-error one) or "main"."""
        return "main" if self.divergence == "l1" else DIVERGENCES[self.divergence].fit

    @property
    def squares(self) -> bool:
        """Whether it reads the debiased squares (``sqerr``/``sq``) of an estimate."""
        return self.divergence == "l2"

    @property
    def lower_bound(self) -> float | None:
        """The least value of every estimate, where an interval may be cut.

        0 where every estimate is >= 0 by construction (a norm or a divergence of E from
        f: the L1 ECE^KDE and the KL error); None where an unbiased estimate may be
        negative (the squared L2 U-statistic and the L2 ECE^KDE, its signed root) or the
        quantity has no sign (refinement, sharpness).
        """
        if (self.kind == "ece" and not self.squares) or (
            self.kind == "ce" and self.divergence == "kl"
        ):
            return 0.0
        return None

    def lower_bound_for(self, debias: str) -> float | None:
        """:attr:`lower_bound` of the estimates made with ``debias``.

        Without debiasing (``"none"``) the squared L2 error and the L2 ECE^KDE are plain
        squares (of ``E - f``, or of the residual regression): >= 0, so their intervals
        are cut at 0 too (they reached -0.04 for an estimate of 0.01 at n = 200).
        """
        if self.lower_bound is None and self.squares and debias == "none":
            return 0.0
        return self.lower_bound

    @property
    def criterion(self) -> str:
        """The plug-in estimator's ``bandwidth="auto"`` criterion of the quantity."""
        return "log" if self.divergence == "kl" else "brier"

    def __call__(self, est: Estimate) -> float:
        if self.kind == "ece":
            return ce_p(est, self.p)
        gen = DIVERGENCES[self.divergence].generator
        if self.kind == "ce":
            return calibration_error(est, gen, "direct")
        if self.kind == "refinement":
            return refinement(est, gen)
        return sharpness(est, gen)


def _quantities(*rows: tuple[str, str, str, str, str]) -> dict[str, Quantity]:
    return {r[0]: Quantity(*r) for r in rows}


#: The named quantities of every estimate, in the report's order.
QUANTITIES: dict[str, Quantity] = _quantities(
    ("ece_kde_l1", "ece", "l1", "probability", "ECE^KDE (L1, {calibration}) [P22]"),
    ("ece_kde_l2", "ece", "l2", "probability", "ECE^KDE (L2, {calibration}) [P22]"),
    ("ce_kl", "ce", "kl", "nats", "calibration error, KL divergence, {calibration}, nats [P24]"),
    (
        "ce_l2",
        "ce",
        "l2",
        "squared probability",
        "calibration error, squared L2, {calibration} [P24]",
    ),
    (
        "refinement_kl",
        "refinement",
        "kl",
        "nats",
        "refinement, KL: mean entropy of E[y|f], nats [P24]",
    ),
    (
        "refinement_l2",
        "refinement",
        "l2",
        "squared probability",
        "refinement, L2: -mean ||E[y|f]||^2 [P24]",
    ),
    (
        "sharpness_kl",
        "sharpness",
        "kl",
        "nats",
        "sharpness, KL: mean F(E[y|f]) - F(class freq) [P24]",
    ),
    (
        "sharpness_l2",
        "sharpness",
        "l2",
        "squared probability",
        "sharpness, L2: mean F(E[y|f]) - F(class freq) [P24]",
    ),
)


def check_quantity(name: object, what: str = "quantity") -> Quantity:
    """Return the :class:`Quantity` of a name, or raise a ValueError naming ``what``."""
    if not isinstance(name, str) or name not in QUANTITIES:
        raise ValueError(f"{what} must be one of {sorted(QUANTITIES)}, got {name!r}")
    return QUANTITIES[name]
