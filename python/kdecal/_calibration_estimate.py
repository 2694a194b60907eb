"""The estimate object of :func:`kdecal.estimate` and the results derived from it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ._estimation import problem as _problem
from ._estimation import quantities as _quantities
from ._estimation import regression as _regression
from ._estimation import replicates as _replicates
from ._estimation import search as _search
from ._estimation.quantities import QUANTITIES
from ._estimation.regression import ESTIMATORS
from ._numerics import ValueEq, resampling_pvalue
from ._validation import Probs, check_choice, check_p, check_seed
from .warnings import KdecalWarning, quiet

__all__ = [
    "CalibrationEstimate",
    "CalibrationTestResult",
    "ConfidenceInterval",
    "ResamplingError",
]


class ResamplingError(ValueError):
    """A bootstrap replicate on which the estimator is undefined.

    Every row of the replicate lost its neighbours: a bandwidth far too small for the
    sample.
    """


def _needs_squares(names: list[str]) -> bool:
    """Whether a replicate must carry the debiased squares for any of ``names``."""
    return any(QUANTITIES[q].squares for q in names)


def _check_quantity(name: object, what: str = "quantity") -> str:
    return _quantities.check_quantity(name, what).name


def _check_level(level: object) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)):
        raise TypeError(f"level must be a float in (0, 1), got {level!r}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return float(level)


def _quiet(fn: Callable[[_regression.Estimate], float], e: _regression.Estimate) -> float:
    with quiet(KdecalWarning):
        return fn(e)


@dataclass(frozen=True, eq=False)
class ConfidenceInterval(ValueEq):
    """A bootstrap interval of one quantity (percentile, centred on the estimate).

    Attributes
    ----------
    quantity : str
        Name of the quantity (a key of ``kdecal.QUANTITIES``).
    estimate : float
        The point estimate on the data.
    low, high : float
        The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the bootstrap
        distribution, moved so that its median is ``estimate``
        (``estimate + q - median``): the interval always contains the estimate, and
        covers what the estimator reports on average (the truth plus the estimator's
        bias, e.g. the null mean for a calibrated model; see bench/README.md).
    level : float
        Confidence level, e.g. 0.95.
    bootstrap_distribution : ndarray, shape (n_resamples,), float64
        The quantity on each bootstrap replicate (rows resampled with replacement, the
        copies of a query row left out with it, at the estimate's bandwidth; plus the
        selection shift of ``bandwidth_variability="add"``, or at the replicate's own
        bandwidth with ``"refit"``), not centred.
    """

    quantity: str
    estimate: float
    low: float
    high: float
    level: float
    bootstrap_distribution: np.ndarray = field(repr=False)

    def __iter__(self) -> Iterator[float]:
        return iter((self.low, self.high))


@dataclass(frozen=True, eq=False)
class CalibrationTestResult(ValueEq):
    """Result of :func:`kdecal.calibration_test`.

    Attributes
    ----------
    statistic_name : str
        The quantity used as the test statistic.
    statistic : float
        Its value on the data.
    pvalue : float
        ``(1 + #{T*_b >= T}) / (1 + n_resamples)``, the Monte Carlo p-value of the null
        hypothesis "the model is calibrated" (in the notion of the estimate); a ``T*_b``
        equal to ``T`` up to rounding (within 1e-13, or 1e-12 of the larger magnitude: a
        redrawn label set equal to the observed one) counts as ``>=``.
    null_distribution : ndarray, shape (n_resamples,), float64
        The statistic on labels redrawn from the predicted probabilities.
    bandwidth : float
        The bandwidth used for the data and every resample.
    null_mean : float
        The mean of ``null_distribution`` (a property): what the estimator reports, on
        average, for a perfectly calibrated model with these predictions.
    """

    statistic_name: str
    statistic: float
    pvalue: float
    null_distribution: np.ndarray = field(repr=False)
    bandwidth: float

    @property
    def null_mean(self) -> float:
        """Mean of the null distribution.

        What the estimator reports, on average, for a perfectly calibrated model with
        these predictions (its bias at zero error).
        """
        return float(np.mean(self.null_distribution))


#: Grid steps of :data:`kdecal._estimation.search.SEARCH_GRID` either side of a searched
#: bandwidth among which each bootstrap replicate selects its own (issue 26; see
#: :meth:`CalibrationEstimate._reselected`).
RESELECT_STEPS = 3

#: How a bootstrap interval of an estimate at a searched bandwidth carries the
#: selection's own variability (:meth:`CalibrationEstimate.confidence_interval`'s
#: ``bandwidth_variability``): "add" (the default), "refit" or "none".
BANDWIDTH_VARIABILITY = ("add", "refit", "none")


def bootstrap_counts(n: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Row multiplicities of ``n_resamples`` bootstrap samples of n rows, (R, n) int64.

    All at once, for tests; the estimators draw them in chunks
    (:func:`kdecal._estimation.replicates.draw_bootstrap_counts`), which gives the same samples.
    """
    return _replicates.draw_bootstrap_counts(n, n_resamples, rng)


def bootstrap_distributions(
    estimates: list[CalibrationEstimate],
    names: list[str],
    n_resamples: int,
    rng: np.random.Generator,
) -> list[dict[str, np.ndarray]]:
    """Compute ``names`` of every estimate on the same bootstrap row samples.

    The samples (:func:`kdecal._estimation.replicates.draw_bootstrap_counts`) are drawn a chunk at a
    time and applied to every estimate (a paired bootstrap when there are several), so
    memory is O(n + chunk x n) for any ``n_resamples``.

    Raises
    ------
    ValueError
        When a replicate has no query row with a neighbour of non-negligible kernel
        weight (a bandwidth far too small for the sample).
    """
    R = n_resamples
    n = estimates[0].n
    dists = [{q: np.empty(R) for q in names} for _ in estimates]
    widest = max(e._est.problem.labels.shape[0] for e in estimates)
    step = _replicates.draw_chunk(n, widest + 2, R)
    for r0 in range(0, R, step):
        counts = _replicates.draw_bootstrap_counts(n, min(step, R - r0), rng)
        for est, dist in zip(estimates, dists):
            est._bootstrap_chunk(names, counts, dist, r0)
    for est, dist in zip(estimates, dists):
        _check_replicates(est, dist)
    return dists


def _check_replicates(est: CalibrationEstimate, dist: dict[str, np.ndarray]) -> None:
    """Raise :class:`ResamplingError` on a bootstrap replicate that is not finite."""
    for q, values in dist.items():
        bad = ~np.isfinite(values)
        if np.any(bad):
            raise ResamplingError(
                f"bootstrap replicate {int(np.argmax(bad))} of {q}: no row of the "
                f"resampled data keeps a neighbour of non-negligible kernel weight at "
                f"bandwidth {est._for(q).bandwidth:g} (n = {est.n}); pass a larger bandwidth"
            )


def percentile_interval(dist: np.ndarray, level: float) -> tuple[float, float]:
    """Return the ``(1 -+ level) / 2`` quantiles of a bootstrap distribution."""
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(dist, [a, 1.0 - a])
    return float(lo), float(hi)


def centred_interval(
    dist: np.ndarray, estimate: float, level: float, lower: float | None = None
) -> tuple[float, float]:
    """Return the percentile interval of ``dist`` moved so that its median is ``estimate``.

    ``estimate + q_a - median``, ``estimate + q_(1-a) - median`` with ``a = (1 - level)
    / 2``: the spread of the bootstrap distribution around the point estimate, which the
    interval therefore always contains. A kernel replicate's plug-in sees noisier class
    sums than the estimate (multiplicities ~ Poisson(1) halve the effective number of
    neighbours), so the L1 and KL replicates are biased upwards by more than the
    estimate is and the plain percentile interval sat above the estimate (issue 26);
    their spread matches the estimator's sampling spread (bench/README.md).

    ``lower``: the quantity's least value (0 for an ECE^KDE or a KL error,
    :attr:`Quantity.lower_bound`), where the interval is cut: at small n the moved
    quantiles can fall below it ([-0.04, 0.22] for a top-label L1 of 0.08 at n = 10),
    and the cut keeps the estimate (>= lower) inside and loses no coverage of a truth
    that is >= lower.
    """
    lo, hi = percentile_interval(dist, level)
    med = float(np.median(dist))
    lo, hi = estimate + (lo - med), estimate + (hi - med)
    if lower is not None:
        lo, hi = max(lo, lower), max(hi, lower)
    return lo, hi


def _signed_square(x: np.ndarray | float) -> np.ndarray:
    return np.sign(x) * np.square(x)


def _signed_root(x: np.ndarray | float) -> np.ndarray:
    return np.sign(x) * np.sqrt(np.abs(x))


def quantity_interval(
    q: str, dist: np.ndarray, estimate: float, level: float, lower: float | None = None
) -> tuple[float, float]:
    """:func:`centred_interval` of a quantity; the L2 ECE^KDE's from the squared error's.

    ``ece_kde_l2`` is the signed root of ``ce_l2`` (README: the same number in the API,
    the report and the replicates), so its interval is the signed root of the interval
    of the signed squares: the two intervals then correspond as their estimates do (each
    centred on its own estimate, they did not).
    """
    if q != "ece_kde_l2":
        return centred_interval(dist, estimate, level, lower)
    lower_sq = None if lower is None else float(_signed_square(lower))
    lo, hi = centred_interval(
        _signed_square(dist), float(_signed_square(estimate)), level, lower_sq
    )
    return float(_signed_root(lo)), float(_signed_root(hi))


def _names(names: object) -> list[object]:
    """Return a single name as a list of one (a string is not iterated by character)."""
    return [names] if isinstance(names, str) else list(names)  # type: ignore[call-overload]


class CalibrationEstimate:
    """The leave-one-out kernel estimate of ``E[y | f]`` for one notion and bandwidth.

    Made by :func:`kdecal.estimate`; every quantity is a cheap O(nK) plug-in on it, and
    intervals and the calibration test reuse its kernel (one multi-label engine pass per
    chunk of resamples), so nothing recomputes the bandwidth search.

    Attributes
    ----------
    estimator : str
        "residual" (residual-centred regression, the default) or "plugin".
    bandwidth : float
        The bandwidth h of the L_p (p != 2) and custom-Bregman quantities, and of the
        plug-in's L2 ones (with ``bandwidth="auto"``: the minimiser of the leave-one-out
        Brier risk).
    bandwidth_l2 : float
        The bandwidth of the squared L2 and L2 quantities: ``bandwidth / 2`` for the
        residual estimator with ``bandwidth="auto"``, else ``bandwidth``.
    bandwidth_kl : float
        The bandwidth of the KL quantities: ``bandwidth_l2`` for the residual estimator;
        for the plug-in with ``bandwidth="auto"`` and the default criterion the
        minimiser of the leave-one-out log risk; else ``bandwidth``.
    calibration : str
        The notion: "canonical", "classwise" or "top_label".
    debias : str
        The debiasing mode of the squared (L2) quantities.
    criterion : str or None
        The criterion of ``bandwidth``: "brier" or "log" when it was searched,
        "loo-mle" for the papers' rule, None for a fixed bandwidth.
    n, n_classes : int
        Number of rows and of classes.
    backend : str
        Engine backend used.
    """

    def __init__(
        self,
        est: _regression.Estimate,
        probs: np.ndarray,
        labels: np.ndarray,
        backend: str,
        search: _search.Search | None,
        *,
        est_kl: _regression.Estimate | None = None,
        search_kl: _search.Search | None = None,
        est_sq: _regression.Estimate | None = None,
        validated: Probs | None = None,
        progress: bool | None = None,
        floors: Callable[[], list[tuple[CalibrationEstimate, float]]] | None = None,
    ) -> None:
        self._est = est
        # the lower bounds of the canonical squared L2 error (:meth:`_floor_estimates`):
        # made on first use by ``floors``, or given by kdecal.evaluate
        self._floor_maker = floors
        self._floors: list[tuple[CalibrationEstimate, float]] | None = None
        # squared L2 bootstrap replicates by (seed, n_resamples, variability), for the
        # canonical estimate's bounds on the same row samples (kdecal.evaluate)
        self._replicates_made: dict[tuple[int, int, str], np.ndarray] = {}
        # the progress setting of the call that made it, for its resampling passes
        self._progress = progress
        # the validated probabilities (dtype, binary input), for the estimates of other
        # notions on the same rows (kdecal.evaluate) without validating them again
        self._validated = validated
        self._est_kl = est if est_kl is None else est_kl
        self._est_sq = est if est_sq is None else est_sq
        self._probs = probs
        self._labels = labels
        self.bandwidth = float(est.bandwidth)
        self.bandwidth_kl = float(self._est_kl.bandwidth)
        self.bandwidth_l2 = float(self._est_sq.bandwidth)
        self.estimator = est.estimator
        self.calibration = est.problem.calibration
        self.debias = est.debias
        self.search = search
        self.search_kl = search_kl
        self.criterion = None if search is None else search.criterion
        self.backend = backend
        self.n = int(probs.shape[0])
        self.n_classes = int(probs.shape[1])
        # the bootstrap's bandwidth re-selection: the candidates' per-row risks, and the
        # estimates refitted at the bandwidths the replicates select
        self._risks: tuple[np.ndarray, np.ndarray] | None = None
        self._refits: dict[tuple[int, float], _regression.Estimate] = {}

    def _for(self, quantity: str) -> _regression.Estimate:
        """Return the estimate a named quantity is computed on.

        KL quantities: the KL estimate (plug-in: at the log-risk bandwidth); squared L2
        and L2 ones: the squared-error estimate (residual: at half the Brier bandwidth);
        the rest: the main estimate.
        """
        return self._fit(QUANTITIES[quantity].fit)

    def _fit(self, which: str) -> _regression.Estimate:
        """Return the estimate "kl", "sq" or "main" (:attr:`Quantity.fit`, :attr:`Divergence.fit`)."""
        return self._est_kl if which == "kl" else self._est_sq if which == "sq" else self._est

    def __repr__(self) -> str:
        return (
            f"CalibrationEstimate(calibration={self.calibration!r}, n={self.n}, "
            f"n_classes={self.n_classes}, estimator={self.estimator!r}, "
            f"bandwidth={self.bandwidth:.4g}, bandwidth_l2={self.bandwidth_l2:.4g}, "
            f"bandwidth_kl={self.bandwidth_kl:.4g}, debias={self.debias!r})"
        )

    # ------------------------------------------------------------------ arrays

    @property
    def conditional_expectation(self) -> np.ndarray:
        """Leave-one-out estimate of ``E[y | f_j]``, the one the quantities are computed from.

        Shape (n, K) for "canonical"; (n,) for "top_label" (``P(correct | confidence)``);
        (n, K) for "classwise" (column c is ``P(y = c | f_c)``). float64.

        With ``estimator="residual"`` (the default) it is the residual regression
        ``f_j + g_j``, ``g_j = sum_i w_ij (y_i - f_i) / sum_i w_ij``: canonical rows sum to 1,
        but entries may leave [0, 1] by the regression's noise (a row of small
        probabilities whose neighbours hold larger ones), most at small bandwidths. The
        L_p and squared L2 quantities read it as it is; the KL and custom Bregman ones
        move it into the simplex first (``bench/README.md``, "KL: keeping E in the
        simplex"). With ``estimator="plugin"`` it is the kernel ratio ``sum_i w_ij y_i /
        sum_i w_ij``, on the simplex (:func:`kdecal.conditional_expectation`).
        """
        E = self._est.E
        if self.calibration == "canonical":
            return np.asarray(E[0])
        if self.calibration == "top_label":
            return np.asarray(E[0, :, 1])
        return np.ascontiguousarray(E[:, :, 1].T)

    # -------------------------------------------------------------- quantities

    def ece_kde(self, p: float = 1) -> float:
        """L_p calibration error ECE^KDE (Popordanoska et al. 2022, Eq. 9, p-th root).

        Parameters
        ----------
        p : float, default 1
            Order of the norm, ``p >= 1``.

        Returns
        -------
        float
            In probability units; p = 2 uses the debiased squares when ``debias`` is
            "ustat" or "ratio".

        Raises
        ------
        TypeError, ValueError
            ``p`` not a real number >= 1.
        """
        p = check_p(p)
        if p == 2.0:
            return self._floored("ece_kde_l2", _quantities.ce_p(self._est_sq, p))
        return _quantities.ce_p(self._est, p)

    def ece(self, p: float = 1) -> float:
        """Return :meth:`ece_kde` (deprecated alias, removed in the next release)."""
        warnings.warn(
            "CalibrationEstimate.ece is deprecated and will be removed in the next "
            "release; use CalibrationEstimate.ece_kde (binned.ece is the binned ECE)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.ece_kde(p)

    def calibration_error(self, divergence: object = "kl", estimator: str = "direct") -> float:
        """Proper calibration error for a Bregman generator, from this estimate's regression.

        Popordanoska et al., AISTATS 2024, Eq. 9-10 (direct) and Eq. 14-15 (risk minus
        refinement). The regression ``E`` is the one this estimate was made with
        (:attr:`estimator`: residual-centred or the plug-in ratio), at the bandwidth of
        the divergence's rule (:attr:`bandwidth_kl` for KL, :attr:`bandwidth_l2` for L2,
        :attr:`bandwidth` for a custom generator).

        Parameters
        ----------
        divergence : {"kl", "l2"} or Bregman, default "kl"
            As :func:`kdecal.calibration_error`.
        estimator : {"direct", "refinement"}, default "direct"
            ``"direct"``: ``mean_j D_F(E_j, f_j)``; ``"refinement"``: ``mean_j F(E_j) +
            mean_i [D_F(y_i, f_i) - F(y_i)]``, the risk minus the refinement. The name
            of this estimate's own regression (``"residual"`` or ``"plugin"``) is
            accepted for ``"direct"``. :func:`kdecal.calibration_error` with
            ``estimator="refinement"`` uses the plug-in ratio: it equals this method on
            an estimate made with ``estimator="plugin"``.

        Returns
        -------
        float
            In nats for KL, squared probability units for L2; an L2 error with
            ``debias="ustat"`` is an unbiased estimate and may be negative.

        Raises
        ------
        ValueError
            Unknown divergence (neither "kl", "l2" nor a :class:`kdecal.Bregman`) or
            estimator, or the other regression's name (the regression is fixed when the
            estimate is made: :func:`kdecal.estimate` with ``estimator=``).
        """
        if estimator in ESTIMATORS:
            if estimator != self.estimator:
                raise ValueError(
                    f"estimator={estimator!r}: this estimate's regression is "
                    f"{self.estimator!r}; make the estimate with "
                    f"kdecal.estimate(..., estimator={estimator!r}) for the other one"
                )
            estimator = "direct"
        check_choice(estimator, "estimator", ("direct", "refinement"))
        d = _quantities.divergence_of(divergence)
        value = _quantities.calibration_error(self._fit(d.fit), d.generator, estimator)
        if d is _quantities.DIVERGENCES["l2"] and estimator == "direct":
            return self._floored("ce_l2", value)
        return value

    def refinement(self, divergence: object = "kl") -> float:
        """Refinement ``-mean_j F(E_j)`` (Popordanoska et al., AISTATS 2024, Eq. 15).

        Parameters
        ----------
        divergence : {"kl", "l2"} or Bregman, default "kl"
            The generator F, as :meth:`calibration_error` (at its bandwidth).

        Returns
        -------
        float
            In nats for KL (the mean entropy of ``E``), squared probability units for L2.
        """
        d = _quantities.divergence_of(divergence)
        return _quantities.refinement(self._fit(d.fit), d.generator)

    def sharpness(self, divergence: object = "kl") -> float:
        """Sharpness ``mean_j F(E_j) - F(class frequencies)`` (AISTATS 2024, Eq. 4-5).

        Parameters
        ----------
        divergence : {"kl", "l2"} or Bregman, default "kl"
            The generator F, as :meth:`calibration_error` (at its bandwidth).

        Returns
        -------
        float
            In nats for KL, squared probability units for L2.
        """
        d = _quantities.divergence_of(divergence)
        return _quantities.sharpness(self._fit(d.fit), d.generator)

    def value(self, quantity: str) -> float:
        """Return a quantity by name.

        Parameters
        ----------
        quantity : str
            One of ``kdecal.QUANTITIES`` (the report's fields, e.g. "ece_kde_l1",
            "ce_l2", "ce_kl").

        Returns
        -------
        float

        Raises
        ------
        ValueError
            An unknown name.
        """
        q = _check_quantity(quantity)
        return self._floored(q, QUANTITIES[q](self._for(q)))

    # ------------------------------------------------------- the squared L2 bounds

    def _floor_estimates(self) -> list[tuple[CalibrationEstimate, float]]:
        """Return the estimates that bound the squared L2 error below, with their factors.

        ``[(top-label estimate, 1), (class-wise estimate, K)]`` (the class-wise one only
        where it is affordable) for a canonical residual estimate at the automatic
        bandwidth (:func:`kdecal.estimate`); empty otherwise. Made on first use.
        """
        if self._floors is None:
            self._floors = [] if self._floor_maker is None else self._floor_maker()
        return self._floors

    def _set_floors(self, floors: list[tuple[CalibrationEstimate, float]]) -> None:
        """Give the bounds already made (kdecal.evaluate's other notions on the same rows)."""
        if self._floor_maker is not None:
            self._floors = floors

    def _floor(self) -> float | None:
        """Return the largest lower bound of the squared L2 error, or None without bounds."""
        bounds = self.l2_lower_bounds
        return max(bounds.values()) if bounds else None

    def _floored(self, q: str, value: float) -> float:
        """``value`` of quantity ``q`` raised to the lower bound where it applies."""
        if q not in _quantities.FLOORED:
            return value
        return float(_quantities.floored(q, value, self._floor()))

    @property
    def l2_lower_bounds(self) -> dict[str, float]:
        """The lower bounds of the canonical squared L2 error this estimate reports.

        In truth ``E||E[y | f] - f||^2`` is at least the top-label squared L2 error and
        at least K times the class-wise one (each conditions on a function of f;
        Jensen's inequality). With the defaults (canonical, residual estimator,
        ``bandwidth="auto"``, ``debias="ustat"``, K >= 3) the reported "ce_l2" and
        "ece_kde_l2" are the residual U-statistic raised to the larger of the two
        estimates, which this returns: ``{"top_label": v, "classwise_times_K": K v}``
        (the class-wise one only where its estimate is affordable:
        ``kdecal._estimation.replicates.classwise_estimate_cost`` at most
        ``kdecal.kde.L2_FLOOR_CLASSWISE_MAX_SECONDS``). Empty otherwise: other notions, a fixed
        bandwidth, "loo-mle", the plug-in, ``debias="none"``, binary problems. The
        U-statistic alone: ``kdecal.estimate(probs, labels,
        bandwidth=est.bandwidth_l2).value("ce_l2")``. Computed on first use (the
        top-label and class-wise estimates with their own automatic bandwidths).
        """
        return {
            ("classwise_times_K" if b.calibration == "classwise" else b.calibration): f
            * _quiet(QUANTITIES["ce_l2"], b._for("ce_l2"))
            for b, f in self._floor_estimates()
        }

    # -------------------------------------------------------------- resampling

    def confidence_interval(
        self,
        quantity: str = "ece_kde_l1",
        *,
        level: float = 0.95,
        n_resamples: int = 200,
        seed: int | np.random.Generator | None = None,
        bandwidth_variability: str = "add",
    ) -> ConfidenceInterval:
        """Bootstrap interval of a quantity: the percentile interval centred on the estimate.

        Rows are resampled with replacement ``n_resamples`` times; each replicate is the
        same leave-one-out estimator on the resampled rows, computed from the kernel of
        this estimate in multi-label engine passes (the copies of a query row are left
        out with it). With a searched bandwidth (``bandwidth="auto"``) each replicate
        also carries the selection's own variability (``bandwidth_variability``). The
        interval is the ``(1 -+ level) / 2`` quantiles of the replicates moved so that
        their median is the estimate (:func:`centred_interval`): it contains the
        estimate and covers the estimator's expectation (for L1 and KL, the truth plus
        the estimator's noise bias).

        Parameters
        ----------
        quantity : str, default "ece_kde_l1"
            One of ``kdecal.QUANTITIES``.
        level : float, default 0.95
        n_resamples : int, default 200
        seed : int or numpy Generator, optional
        bandwidth_variability : {"add", "refit", "none"}, default "add"
            How the interval carries the variability of a searched bandwidth, which the
            replicates at the estimate's bandwidth leave out (at K = 10 it doubles the
            canonical L1 estimate's spread). Each replicate selects a bandwidth among
            the search grid's values within :data:`RESELECT_STEPS` steps of the
            searched one: the minimiser of the leave-one-out risk curve with the rows
            weighted by its multiplicities (the whole sample's per-row risks, one engine
            pass for the candidates); the squared L2 estimate's bandwidth moves by the
            same factor. Then

            - "add": the replicate at the estimate's bandwidth plus a selection shift,
              the whole sample's estimate at the bandwidth selected by the previous
              replicate minus the estimate (paired with another replicate, so that the
              two parts add as independent: the bootstrap's pairing correlates a noisy
              replicate with a smoother bandwidth, which the estimates' sampling
              spread does not show);
            - "refit": the replicate computed at its own selected bandwidth;
            - "none": every replicate at the estimate's bandwidth.

            On the protocol of ``bench/README.md`` ("Bootstrap intervals"), canonical
            L1 intervals covered the estimator's expectation in 94-98.5 % of draws at
            K = 2, 4 and 10 with "add" (K = 10: 49-74 % with "none"; "refit"
            87.5-91.5 % in three K <= 4 cells; the calibrated K = 10 cell at n = 5,000
            over-covered, 98.5 %). Ignored for a fixed bandwidth, "loo-mle", and the
            plug-in's KL quantities at their own log-risk bandwidth.

        Returns
        -------
        ConfidenceInterval

        Raises
        ------
        TypeError, ValueError
            Unknown quantity, level outside (0, 1), ``n_resamples < 2``, or
            ``debias="ratio"``.
        """
        name = _check_quantity(quantity)
        level = _check_level(level)
        R = _replicates.check_resamples(n_resamples, "n_resamples", 2)
        return self.confidence_intervals(
            [name],
            level=level,
            n_resamples=R,
            seed=seed,
            bandwidth_variability=bandwidth_variability,
        )[name]

    def confidence_intervals(
        self,
        quantities: list[str] | tuple[str, ...] | str = tuple(QUANTITIES),
        *,
        level: float = 0.95,
        n_resamples: int = 200,
        seed: int | np.random.Generator | None = None,
        bandwidth_variability: str = "add",
    ) -> dict[str, ConfidenceInterval]:
        """Bootstrap intervals of several quantities from the same replicates.

        ``quantities``: names of ``kdecal.QUANTITIES`` (a single name is one of them);
        the other arguments are those of :meth:`confidence_interval`. Returns a dict
        name -> :class:`ConfidenceInterval`.
        """
        names = [_check_quantity(q) for q in _names(quantities)]
        level = _check_level(level)
        R = _replicates.check_resamples(n_resamples, "n_resamples", 2)
        variability = check_choice(
            bandwidth_variability, "bandwidth_variability", BANDWIDTH_VARIABILITY
        )
        dist, _ = self._resampled(names, [], R, check_seed(seed), None, variability=variability)
        return self._intervals(dist, level)

    def _intervals(
        self, dist: dict[str, np.ndarray], level: float
    ) -> dict[str, ConfidenceInterval]:
        out = {}
        for q, values in dist.items():
            value = self._floored(q, _quiet(QUANTITIES[q], self._for(q)))
            lower = QUANTITIES[q].lower_bound_for(self.debias)
            lo, hi = quantity_interval(q, values, value, level, lower)
            out[q] = ConfidenceInterval(q, value, lo, hi, level, values)
        return out

    def _intervals_and_tests(
        self,
        quantities: list[str],
        statistics: list[str],
        *,
        level: float,
        n_resamples: int,
        seed: int | None,
    ) -> tuple[dict[str, ConfidenceInterval], dict[str, CalibrationTestResult]]:
        """:meth:`confidence_intervals` and :meth:`calibration_tests` with the same seed.

        The same numbers as the two calls (to the rounding of the products, which sum
        the same terms in another blocking: float32 products for float32 predictions),
        from one resampling pass: each chunk of bootstrap replicates and of consistency
        replicates shares the kernel weights
        (:func:`kdecal._estimation.replicates.replicates_jobs`).
        """
        R = _replicates.check_resamples(n_resamples, "n_resamples", 2)
        boot, test = self._resampled(
            [_check_quantity(q) for q in quantities],
            [_check_quantity(s, "statistic") for s in statistics],
            R,
            check_seed(seed),
            check_seed(seed),
            key=(int(seed), R, "add") if isinstance(seed, (int, np.integer)) else None,
        )
        return self._intervals(boot, _check_level(level)), self._tests(test, R)

    def _resampled(
        self,
        boot: list[str],
        test: list[str],
        R: int,
        boot_rng: np.random.Generator | None,
        test_rng: np.random.Generator | None,
        variability: str = "add",
        key: tuple[int, int, str] | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Bootstrap replicates of ``boot`` and consistency replicates of ``test``.

        Drawn a chunk at a time (memory O(n + chunk x n) for any R; the draws do not
        depend on the chunking), each chunk of both in one resampling pass per estimate.
        ``variability``: see :meth:`confidence_interval`'s ``bandwidth_variability``;
        with "add", replicate ``r`` gets the selection shift of replicate ``r - 1``
        (cyclically). The canonical squared L2 replicates are raised to their bounds'
        replicates on the same row samples (:attr:`l2_lower_bounds`). ``key`` (seed,
        R, variability) of an integer seed keeps the squared L2 replicates, and takes a
        bound's where it made them with the same key (the same row samples: the draws
        do not depend on the chunking).

        Raises
        ------
        ResamplingError
            A bootstrap replicate on which the estimator is undefined.
        """
        dist_b = {q: np.empty(R) for q in boot}
        dist_t = {s: np.empty(R) for s in test}
        shifts = {q: np.zeros(R) for q in boot} if variability == "add" else None
        # the lower bounds' squared L2 replicates, on the same row samples
        floors = self._floor_estimates() if set(boot) & set(_quantities.FLOORED) else []
        made = [None if key is None else b._replicates_made.get(key) for b, _ in floors]
        floor_b = [{"ce_l2": np.empty(R) if m is None else m} for m in made]
        floor_s = [{"ce_l2": np.zeros(R)} if shifts is not None else None for _ in floors]
        todo = [m is None for m in made]
        B = max(
            [self._est.problem.labels.shape[0]]
            + [b._est.problem.labels.shape[0] for (b, _), run in zip(floors, todo) if run]
        )
        step = R
        if boot:
            step = min(step, _replicates.draw_chunk(self.n, B + 2, R))
        if test:
            step = min(step, _replicates.draw_chunk(self.n, B + 1, R))
        for r0 in range(0, R, step):
            c = min(step, R - r0)
            counts = None
            if boot:
                assert boot_rng is not None
                counts = _replicates.draw_bootstrap_counts(self.n, c, boot_rng)
            labels = None
            if test:
                assert test_rng is not None
                ystar = _replicates.draw_consistency_labels(self._probs, c, test_rng)
                labels = np.stack(
                    [_replicates.problem_labels(self.calibration, self._probs, ys) for ys in ystar]
                )
            self._fill_chunk(
                boot, counts, dist_b, test, labels, dist_t, r0, variability == "refit"
            )
            if shifts is not None and counts is not None:
                self._selection_shifts(boot, counts, shifts, r0)
            for (b, _), bd, bs, run in zip(floors, floor_b, floor_s, todo):
                if not run:
                    continue
                assert counts is not None
                b._fill_chunk(["ce_l2"], counts, bd, [], None, {}, r0, variability == "refit")
                if bs is not None:
                    b._selection_shifts(["ce_l2"], counts, bs, r0)
        _check_replicates(self, dist_b)
        self._add_shifts(dist_b, shifts)
        if key is not None and "ce_l2" in dist_b:
            self._replicates_made[key] = dist_b["ce_l2"].copy()
        if floors:
            for (b, _), bd, bs, run in zip(floors, floor_b, floor_s, todo):
                if run:
                    b._add_shifts(bd, bs)
                    if key is not None:
                        b._replicates_made[key] = bd["ce_l2"].copy()
            # a bound undefined on a replicate (no row keeps a neighbour at its own
            # bandwidth, e.g. n = 4) bounds nothing there
            floor = np.max(
                [
                    np.where(np.isfinite(bd["ce_l2"]), f * bd["ce_l2"], -np.inf)
                    for (_, f), bd in zip(floors, floor_b)
                ],
                axis=0,
            )
            for q in set(dist_b) & set(_quantities.FLOORED):
                dist_b[q] = _quantities.floored(q, dist_b[q], floor)
        return dist_b, dist_t

    def _add_shifts(
        self, dist_b: dict[str, np.ndarray], shifts: dict[str, np.ndarray] | None
    ) -> None:
        """Add the selection shifts of :meth:`_selection_shifts` to the replicates.

        Replicate ``r`` gets the shift of replicate ``r - 1`` (cyclically); nothing
        without shifts.
        """
        if shifts is None:
            return
        for q, s in shifts.items():
            if q == "ece_kde_l2":
                # the shift in the squared error's units, so that every replicate
                # stays the signed root of the squared error's replicate
                e = _quiet(QUANTITIES[q], self._for(q))
                s2 = _signed_square(e + np.roll(s, 1)) - _signed_square(e)
                dist_b[q] = _signed_root(_signed_square(dist_b[q]) + s2)
            else:
                dist_b[q] += np.roll(s, 1)

    def _selection_shifts(
        self, boot: list[str], counts: np.ndarray, shifts: dict[str, np.ndarray], r0: int
    ) -> None:
        """Fill ``shifts[q][r0:r0 + c]``: each replicate's selection shift of ``q``.

        The whole sample's estimate of ``q`` at the bandwidth the replicate selects
        (:meth:`_reselected`, estimates refitted there once and cached) minus the
        estimate; 0 where it selects the estimate's own bandwidth.
        """
        for base, group in self._groups(boot):
            for h, idx in self._reselected(base, counts).items():
                if h == base.bandwidth:
                    continue
                est_h = self._refit(base, h)
                for q in group:
                    shift = _quiet(QUANTITIES[q], est_h) - _quiet(QUANTITIES[q], base)
                    # not finite: the quantity is undefined there; the replicate keeps 0
                    shifts[q][r0 + idx] = shift if np.isfinite(shift) else 0.0

    def _fill_chunk(
        self,
        boot: list[str],
        counts: np.ndarray | None,
        dist_b: dict[str, np.ndarray],
        test: list[str],
        labels: np.ndarray | None,
        dist_t: dict[str, np.ndarray],
        r0: int,
        reselect: bool = False,
    ) -> None:
        """Fill the replicates ``r0 .. r0 + c`` of the bootstrap and consistency samples.

        ``counts`` (c, n): row multiplicities of the bootstrap samples of ``boot``;
        ``labels`` (c, B, n): problem labels of the consistency samples of ``test``.
        Per estimate the quantities are computed on, one resampling pass for both; a
        bootstrap replicate whose re-selected bandwidth (``reselect``, :meth:`_reselected`)
        differs from the estimate's runs on the estimate refitted there, in a pass of its
        own.
        """
        for base, group in self._groups(list(dict.fromkeys(boot + test))):
            gb = [q for q in group if q in boot]
            gt = [s for s in group if s in test]
            squares = _needs_squares(group)
            at: dict[float, np.ndarray] = {}
            if gb:
                assert counts is not None
                at = (
                    self._reselected(base, counts)
                    if reselect
                    else {base.bandwidth: np.arange(len(counts))}
                )
            # every bootstrap replicate at the estimate's bandwidth: one pass with the test
            together = bool(gb) and list(at) == [base.bandwidth]
            jobs: list[tuple[np.ndarray, np.ndarray | None]] = []
            if together:
                assert counts is not None
                jobs.append((self._labels_of(base, len(counts)), counts.astype(np.float64)))
            if gt:
                assert labels is not None
                jobs.append((labels, None))
            if jobs:
                reps = _replicates.replicates_jobs(
                    base, jobs, self.backend, squares, self._progress
                )
                for r, rep in enumerate(reps):
                    if together:
                        for q in gb:
                            dist_b[q][r0 + r] = _quiet(QUANTITIES[q], rep[0])
                    for s in gt:
                        dist_t[s][r0 + r] = _quiet(QUANTITIES[s], rep[-1])
            if together or not gb:
                continue
            assert counts is not None
            for h, idx in at.items():  # each bandwidth the replicates selected
                est_h = base if h == base.bandwidth else self._refit(base, h)
                sub = counts[idx].astype(np.float64)
                reps = _replicates.replicates_jobs(
                    est_h,
                    [(self._labels_of(base, len(idx)), sub)],
                    self.backend,
                    squares,
                    self._progress,
                )
                for k, rep in zip(idx, reps):
                    for q in gb:
                        dist_b[q][r0 + int(k)] = _quiet(QUANTITIES[q], rep[0])

    @staticmethod
    def _labels_of(base: _regression.Estimate, c: int) -> np.ndarray:
        """Return the problem labels of ``base`` for c bootstrap replicates, (c, B, n)."""
        lab = base.problem.labels
        return np.ascontiguousarray(np.broadcast_to(lab, (c, *lab.shape)))

    def _reselected(
        self, base: _regression.Estimate, counts: np.ndarray
    ) -> dict[float, np.ndarray]:
        """Return the bandwidth of each bootstrap replicate of ``base``: {bandwidth: indices}.

        With a searched bandwidth (``bandwidth="auto"``, Brier or log criterion), each
        replicate selects its own among the :data:`RESELECT_STEPS` grid values either
        side of the searched one: the minimiser of the leave-one-out risk curve with the
        rows weighted by the replicate's multiplicities (the per-row risks of the whole
        sample, :func:`kdecal._estimation.search.cv_risk_rows`, one engine pass for all
        the candidates, made once), and ``base`` moves by the same factor (the squared
        L2 estimate keeps its half). The interval then carries the automatic
        bandwidth's own variability, which a fixed bandwidth left out: at K = 10 it was
        half the spread of the estimate (bench/README.md, "Bootstrap intervals";
        :meth:`confidence_interval`'s ``bandwidth_variability``).
        Otherwise (a fixed bandwidth, "loo-mle", the plug-in's KL estimate at its own
        log-risk bandwidth) every replicate keeps ``base.bandwidth``.
        """
        every = {base.bandwidth: np.arange(counts.shape[0])}
        main = base is self._est or base is self._est_sq or self.search_kl is self.search
        if self.search is None or not main:
            return every
        risks = self._selection_risks()
        if risks is None:
            return every
        G, L = risks
        w = counts.astype(np.float64)
        risk = (L @ w.T) / w.sum(axis=1)  # (H, c)
        # a candidate whose risk is not finite is never selected (argmin would pick a
        # NaN); the searched value, finite on the whole sample, stays selectable
        home = int(np.argmin(np.abs(G - self.search.bandwidth)))
        risk[~np.isfinite(risk)] = np.inf
        risk[home, np.all(np.isinf(risk), axis=0)] = 0.0
        pick = np.argmin(risk, axis=0)
        ratio = G[pick] / self.search.bandwidth
        out: dict[float, np.ndarray] = {}
        for r in np.unique(ratio):
            h = base.bandwidth if r == 1.0 else float(base.bandwidth * r)
            if h != base.bandwidth and not self._finite(self._refit(base, h)):
                h = base.bandwidth  # a refit without a finite estimate: keep the bandwidth
            idx = np.flatnonzero(ratio == r)
            out[h] = np.sort(np.concatenate([out[h], idx])) if h in out else idx
        return out

    @staticmethod
    def _finite(est: _regression.Estimate) -> bool:
        """Whether an estimate's conditional expectations (and squared errors) are finite."""
        ok = bool(np.all(np.isfinite(est.E)))
        if est.sqerr is not None:
            ok = ok and bool(np.all(np.isfinite(est.sqerr)))
        return ok

    def _selection_risks(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Return the candidate bandwidths of :meth:`_reselected` and their per-row risks.

        None where the searched bandwidth is not a value of the search grid.
        """
        if self._risks is not None:
            return self._risks
        assert self.search is not None
        grid = _search.SEARCH_GRID
        hb = self.search.bandwidth
        i0 = int(np.argmin(np.abs(np.log(grid) - np.log(hb))))
        if not np.isclose(grid[i0], hb, rtol=1e-9, atol=0.0):
            return None
        lo, hi = max(0, i0 - RESELECT_STEPS), min(len(grid), i0 + RESELECT_STEPS + 1)
        G = np.array(grid[lo:hi])
        G[i0 - lo] = hb  # the searched value itself, bit for bit
        problem = self._est.problem
        _, S, _, _ = _problem.engine(
            problem, G, labelled=True, powers=1, backend=self.backend, progress=self._progress
        )
        L = _search.cv_risk_rows(problem, S, self.search.criterion, slice(None))
        self._risks = (G, L)
        return self._risks

    def _refit(self, base: _regression.Estimate, h: float) -> _regression.Estimate:
        """``base``'s estimator, debiasing and problem at bandwidth ``h`` (cached)."""
        key = (id(base), h)
        est = self._refits.get(key)
        if est is None:
            if base.estimator == "residual":
                est = _regression.fit_residual(
                    base.problem, h, base.debias, self.backend, self._progress, kinds=("lp",)
                )["lp"][0]
            else:
                est = _regression.estimate(
                    base.problem, h, base.debias, self.backend, self._progress
                )
            self._refits[key] = est
        return est

    def _bootstrap_chunk(
        self, names: list[str], counts: np.ndarray, dist: dict[str, np.ndarray], r0: int
    ) -> None:
        """Fill ``dist[q][r0:r0 + c]`` with the quantities on the row samples ``counts`` (c, n)."""
        self._fill_chunk(names, counts, dist, [], None, {}, r0)

    def _groups(self, names: list[str]) -> list[tuple[_regression.Estimate, list[str]]]:
        """Group the quantities by the estimate they are computed on."""
        out: list[tuple[_regression.Estimate, list[str]]] = []
        for q in names:
            base = self._for(q)
            for b, group in out:
                if b is base:
                    group.append(q)
                    break
            else:
                out.append((base, [q]))
        return out

    def calibration_test(
        self,
        statistic: str = "ce_l2",
        *,
        n_resamples: int = 200,
        seed: int | np.random.Generator | None = None,
    ) -> CalibrationTestResult:
        """Consistency-resampling test of calibration; see :func:`kdecal.calibration_test`."""
        return self.calibration_tests([statistic], n_resamples=n_resamples, seed=seed)[statistic]

    def calibration_tests(
        self,
        statistics: list[str] | tuple[str, ...] | str = ("ce_l2",),
        *,
        n_resamples: int = 200,
        seed: int | np.random.Generator | None = None,
    ) -> dict[str, CalibrationTestResult]:
        """Run the test for several statistics on the same resampled label sets.

        ``statistics``: names of ``kdecal.QUANTITIES`` (a single name is one of them);
        the other arguments are those of :meth:`calibration_test`. Returns a dict name
        -> :class:`CalibrationTestResult`.
        """
        names = [_check_quantity(s, "statistic") for s in _names(statistics)]
        R = _replicates.check_resamples(n_resamples, "n_resamples", 1)
        _, dist = self._resampled([], names, R, None, check_seed(seed))
        return self._tests(dist, R)

    def _tests(self, dist: dict[str, np.ndarray], R: int) -> dict[str, CalibrationTestResult]:
        out = {}
        for s, null in dist.items():
            t = _quiet(QUANTITIES[s], self._for(s))
            pv = resampling_pvalue(null, t)
            h = self._for(s).bandwidth
            out[s] = CalibrationTestResult(s, t, float(pv), null, float(h))
        return out
