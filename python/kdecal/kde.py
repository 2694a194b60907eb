"""Kernel (Dirichlet-KDE) estimators of calibration error.

Every estimator here is a cheap O(nK) plug-in on top of the engine's leave-one-out
reduction (:func:`kdecal._engine.backends.loo_reduce`: the compiled core, or the numba, CUDA or
Dask backend), which returns, per query row, the running max and class-wise sums of the
Dirichlet kernel. At a fixed bandwidth an estimate is one engine pass over the n x n
pairs (every bandwidth it needs in the same call). ``bandwidth="auto"`` first runs the
search of :func:`select_bandwidth`, several passes: on random subsets of the query rows,
then a local search on all of them (binary problems on the fast engine: a random sample
of the points places the start of a local search on all rows). The plug-in estimator takes the chosen bandwidth's
accumulators from those passes (while they fit in
:data:`kdecal._estimation.search.SEARCH_FUSE_BYTES`); the residual-centred default runs one
pass of its own after the search. ``"loo-mle"`` evaluates its whole grid in one pass,
then the estimate runs its own. Bootstrap intervals and the calibration test add one
multi-label pass per chunk of resamples (:mod:`kdecal._estimation.replicates`).

References
----------
- T. Popordanoska, R. Sayer, M. B. Blaschko. "A Consistent and Differentiable
  L_p Canonical Calibration Error Estimator". NeurIPS 2022.
- T. Popordanoska, S. G. Gruber, A. Tiulpin, F. Buettner, M. B. Blaschko.
  "Consistent and Asymptotically Unbiased Estimation of Proper Calibration Errors".
  AISTATS 2024.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ._calibration_estimate import CalibrationEstimate, CalibrationTestResult
from ._engine import backends as _backends
from ._engine.backends import Backend
from ._estimation import problem as _problem
from ._estimation import quantities as _quantities
from ._estimation import regression as _regression
from ._estimation import search as _search
from ._estimation.generators import Bregman
from ._estimation.replicates import classwise_estimate_cost
from ._estimation.search import DEFAULT_BANDWIDTH_GRID
from ._validation import (
    Probs,
    check_bandwidth,
    check_bandwidths,
    check_choice,
    check_labels,
    check_p,
    check_probs,
)
from .warnings import KdecalWarning, UnreliableEstimateWarning, quiet, warn_user

__all__ = [
    "calibration_error",
    "calibration_test",
    "conditional_expectation",
    "ece_kde",
    "estimate",
    "loo_log_likelihood",
    "refinement",
    "select_bandwidth",
    "sharpness",
]


# Parameters shared by every estimator that takes a notion of calibration and a
# debiasing mode; substituted into their docstrings by ``_doc`` ("{notion_params}"; the
# notions alone, below a caller's own first line, "{calibration_notions}").
_NOTION_PARAMS = """calibration : {"canonical", "classwise", "top_label"}, default "canonical"
        Notion of calibration (Popordanoska et al. 2024, Eq. 24-25, App. D):
        "canonical" uses the whole vector (Dirichlet kernel); "top_label" the binary
        problem ``(max_k f_jk, 1[argmax_k f_jk = y_j])`` (Beta kernel); "classwise" the
        K one-vs-rest problems ``(f_jc, 1[y_j = c])``, averaged over classes, all in one
        engine call. For binary problems the L_p errors and "l2" use the positive
        coordinate only (so the class-wise "l2" error is the square of the class-wise
        ECE^KDE at p = 2); a binary ``(n,)`` input is the canonical K = 2 problem, whose
        L_p^p error is twice the class-wise one."""

_DEBIAS_PARAM = """debias : {"none", "ustat", "ratio"}, default "ustat"
        Debiasing of the squared errors (the L2 / p = 2 quantities, which the plain
        squares overstate by the variance of the kernel regression; with "none" and
        "ustat" the L1 and KL quantities are the same; "ratio" corrects the conditional
        expectation itself, so it moves them too). "ustat": with the residual-centred
        estimator, each row's squared error as the normalised U-statistic of the
        residuals over pairs of distinct neighbours (unbiased under calibration); with
        ``estimator="plugin"``, the squared conditional expectations from the ratio of
        U-statistics of Popordanoska et al. 2022, Eq. 7. "none": the plain squares.
        "ratio" (``estimator="plugin"`` only; a ValueError otherwise): the
        geometric-series debiasing of App. C (conditional expectation) and App. D (its
        square), bias O(n^-2). Debiasing needs 2 (ustat) or 3 (ratio) power sums from
        the engine. Rows with a single effective neighbour have no pair to debias with:
        the residual estimator leaves them out of the squared error (each takes the mean
        of the other rows), the plug-in keeps their plain ratio; either is reported with
        a KdecalWarning where the quantity reads them."""


_BANDWIDTH_DOC = """Kernel bandwidth h > 0 (dimensionless, on the simplex); "auto" minimises the
        leave-one-out risk of the kernel regression of the labels on the predictions
        (a bandwidth for estimating ``E[y | f]``, chosen by :func:`select_bandwidth`
        with ``labels`` and the notion): the Brier risk
        ``mean_j ||y_j - E_-j[y | f_j]||^2``, whose minimiser h_B serves the L_p
        (p != 2) and custom-Bregman quantities; with the default
        ``estimator="residual"`` the squared L2, L2 and KL ones use ``h_B / 2``; with
        ``estimator="plugin"`` the L2 ones use h_B and the KL ones the minimiser of the
        log risk ``-mean_j log E_-j[y | f_j]_{y_j}``; "loo-mle" maximises the leave-one-out likelihood of the density of the
        predictions, the rule of Popordanoska et al. 2022 / 2024, kept for
        reproductions (it tunes h to the density of f, not to ``E[y | f]``, and
        overstates calibration errors; see bench/README.md)."""


_ESTIMATOR_DOC = """estimator : {"residual", "plugin"}, default "residual"
        "residual": the leave-one-out kernel regression of the residuals ``y_i - f_i``,
        ``E_j = f_j + sum_{i != j} w_ij (y_i - f_i) / sum_{i != j} w_ij``, whose squared
        L2 error is the normalised U-statistic of the residuals (unbiased under
        calibration; with ``debias="ustat"``); with ``bandwidth="auto"`` the L_p
        quantities use the leave-one-out Brier bandwidth h_B, the squared L2, L2 and
        KL ones ``h_B / 2`` (bench/README.md, "Residual-centred estimators"). Under
        calibration ``E[y - f | f] = 0``, so the kernel's smoothing of f does not show
        up as miscalibration, the bias that makes the plug-in overstate errors at
        large K. "plugin": the papers' ratio ``sum w_ij y_i / sum w_ij`` (Popordanoska
        et al. 2022, Eq. 3; 2024, Eq. 11), with the KL quantities at the log-risk
        bandwidth; kept for reproductions."""


_UNRELIABLE_WARNS = """UnreliableEstimateWarning
        With ``estimator="residual"`` and ``calibration="canonical"`` beyond K = 10
        classes (:data:`CANONICAL_RELIABLE_MAX_K`): there the canonical kernel estimates
        cannot tell a calibrated model from a miscalibrated one (a calibrated model
        scores a canonical L1 ECE^KDE of 0.27-0.37 from K = 30 to 1,000; bench/README.md,
        "Canonical estimates at many classes"). The top-label notion is reliable
        there."""


_F = TypeVar("_F", bound=Callable[..., object])


def _doc(func: _F) -> _F:
    func.__doc__ = (
        (func.__doc__ or "")
        .replace("{notion_params}", _NOTION_PARAMS + "\n    " + _DEBIAS_PARAM)
        .replace("{calibration_notions}", _NOTION_PARAMS.split("\n", 1)[1].lstrip())
        .replace("{debias_param}", _DEBIAS_PARAM)
        .replace("{bandwidth_doc}", _BANDWIDTH_DOC)
        .replace("{estimator_doc}", _ESTIMATOR_DOC)
        .replace("{unreliable_warns}", _UNRELIABLE_WARNS)
    )
    return func


# ------------------------------------------------------------------------ engine glue


def _check_bandwidth_spec(bandwidth: object) -> float | str:
    if isinstance(bandwidth, str):
        if bandwidth not in ("auto", "loo-mle"):
            raise ValueError(
                f"bandwidth must be a float > 0, 'auto' or 'loo-mle', got {bandwidth!r}"
            )
        return bandwidth
    return check_bandwidth(bandwidth)


def _resolve_bandwidth(
    probs: Probs,
    labels: np.ndarray | None,
    calibration: str,
    bandwidth: object,
    backend: str,
    progress: bool | None,
    criterion: str = "brier",
) -> float:
    """Turn a bandwidth spec into a float, for callers that need h alone.

    "auto" is the regression search of ``criterion``'s leave-one-out risk ("brier" or
    "log"; LOO-MLE without labels), "loo-mle" the papers' rule. Used by kdecal.torch.
    """
    spec = _check_bandwidth_spec(bandwidth)
    if not isinstance(spec, str):
        return spec
    problem = _problem.make_problem(probs, labels, calibration, backend)
    if spec == "loo-mle" or labels is None:
        return _search.select_bandwidth(
            problem, np.asarray(DEFAULT_BANDWIDTH_GRID), backend, progress
        )
    record, _ = _search.search_bandwidth(problem, criterion, 0, backend, progress)
    _warn_at_grid_end(record.bandwidth, _search.SEARCH_GRID, record.criterion, record.tried)
    return record.bandwidth


def _run(
    probs: object,
    labels: object,
    bandwidth: object,
    calibration: object,
    debias: object,
    backend: object,
    progress: bool | None = None,
    criterion: object = "brier",
    estimator: object = "plugin",
    kind: str = "lp",
) -> tuple[_regression.Estimate, Probs, np.ndarray, str, _search.Search | None]:
    """Validate, resolve the bandwidth, and run the engine once for one notion.

    ``estimator="residual"`` fits the residual-centred estimate of the quantity kind
    ``kind`` ("lp" or "sq", see :func:`kdecal._estimation.regression.fit_residual`); "plugin" the
    plug-in at the bandwidth of ``criterion``.
    """
    check_choice(estimator, "estimator", _regression.ESTIMATORS)
    if estimator == "residual":
        fits, P, y, be = _run_criteria(
            probs, labels, bandwidth, calibration, debias, backend, progress, (kind,), "brier"
        )
        est, search = fits[kind]
        return est, P, y, be, search
    check_choice(criterion, "criterion", _search.CRITERIA)
    fits, P, y, be = _run_criteria(
        probs, labels, bandwidth, calibration, debias, backend, progress, (str(criterion),)
    )
    est, search = fits[str(criterion)]
    return est, P, y, be, search


def _run_criteria(
    probs: object,
    labels: object,
    bandwidth: object,
    calibration: object,
    debias: object,
    backend: object,
    progress: bool | None,
    criteria: tuple[str, ...],
    residual: str | None = None,
) -> tuple[dict[str, tuple[_regression.Estimate, _search.Search | None]], Probs, np.ndarray, str]:
    """Validate and estimate one notion at the bandwidth of each criterion.

    With ``residual`` (the criterion of the residual rule: "brier", "log" or
    "loo-mle"), ``criteria`` are the quantity kinds of
    :func:`kdecal._estimation.regression.fit_residual` ("lp", "sq") and the estimates are
    residual-centred.
    """
    check_choice(calibration, "calibration", _problem.CALIBRATIONS)
    check_choice(debias, "debias", _problem.DEBIAS_MODES)
    if residual and debias == "ratio":
        raise ValueError(
            "debias='ratio' (App. C/D of Popordanoska et al. 2022) debiases the plug-in "
            "ratio; pass estimator='plugin' with it, or debias='ustat' or 'none' (command line: "
            "--estimator plugin, or --debias ustat or none)"
        )
    P = check_probs(probs)
    y = check_labels(labels, P.n, P.n_classes)
    be = _backends.resolve_backend(backend, probs)
    h = bandwidth if isinstance(bandwidth, dict) else _check_bandwidth_spec(bandwidth)
    problem = _problem.make_problem(P, y, str(calibration), be)
    why = _canonical_unreliable(calibration, P.n_classes) if residual else None
    if why is not None:  # the plug-in is for reproductions: no warning
        warn_user(f"kdecal: {why}", UnreliableEstimateWarning)
    if residual:
        fits = _regression.fit_residual(problem, h, str(debias), be, progress, criteria, residual)
    else:
        assert not isinstance(h, dict)  # the plug-in's bandwidth is one float
        fits = _regression.fit_criteria(problem, h, str(debias), be, progress, criteria)
    # the kinds of one criterion share its search: one warning per search
    searches = {id(search): search for _, search in fits.values() if search is not None}
    for search in searches.values():
        _warn_at_grid_end(search.bandwidth, _search.SEARCH_GRID, search.criterion, search.tried)
    return fits, P, y, be


_warn_at_grid_end = _search.warn_at_grid_end


# ------------------------------------------------------------------------- public API


@_doc
def estimate(
    probs: object,
    labels: object,
    *,
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "ustat",
    criterion: str = "auto",
    estimator: str = "residual",
    backend: Backend = "auto",
    progress: bool | None = None,
) -> CalibrationEstimate:
    """Compute the leave-one-out kernel estimate once; derive every quantity from it.

    One bandwidth search (when ``bandwidth="auto"``) whose last stage is the estimate's
    own engine pass, then O(nK) plug-ins: ``est.ece_kde(p)``, ``est.calibration_error(div)``,
    ``est.refinement(div)``, ``est.sharpness(div)``, ``est.conditional_expectation``,
    bootstrap intervals (``est.confidence_interval(quantity)``) and the calibration test
    (``est.calibration_test(statistic)``).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1); see :func:`conditional_expectation`.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    bandwidth : float, "auto" or "loo-mle", default "auto"
        {bandwidth_doc}
    {notion_params}
    criterion : {"auto", "brier", "log", "loo-mle"}, default "auto"
        Leave-one-out risk minimised by ``bandwidth="auto"``: "auto" uses the Brier
        risk for the L1 / L2 / custom-Bregman quantities and the log risk for the KL
        ones (the criterion that matches the quantity; both searches share their engine
        passes, and a second pass runs only when the two bandwidths differ). With
        ``estimator="residual"``, "auto" is the Brier rule of ``estimator`` below and
        "log" replaces the Brier risk by the log risk in it. "loo-mle": the papers'
        leave-one-out likelihood of the density of f (as ``bandwidth="loo-mle"``).
    {estimator_doc}
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
        See :func:`conditional_expectation`.
    progress : bool or None, default None
        Progress bar (``distributed.progress`` with "dask"); None shows one for long
        work where the output is a terminal or a notebook (none in logs and pipes).

    Returns
    -------
    CalibrationEstimate

    Warns
    -----
    {unreliable_warns}

    Raises
    ------
    TypeError, ValueError
        Invalid input (see :func:`conditional_expectation`), an unknown
        ``calibration``, ``debias`` or ``criterion``, or ``debias="ratio"`` with
        ``estimator="residual"``.

    Examples
    --------
    >>> import kdecal
    >>> from kdecal.datasets import make_seeds_synthetic
    >>> s = make_seeds_synthetic(2000, 4, seed=0)
    >>> est = kdecal.estimate(s.probs, s.labels)
    >>> round(est.ece_kde(1), 2), round(est.calibration_error("l2"), 3)  # doctest: +SKIP
    """
    return _estimate(
        probs, labels, bandwidth, calibration, debias, criterion, estimator, backend, progress
    )


def _estimate(
    probs: object,
    labels: object,
    bandwidth: object,
    calibration: object,
    debias: object,
    criterion: object,
    estimator: object,
    backend: object,
    progress: bool | None,
    rule_at: float | None = None,
) -> CalibrationEstimate:
    """:func:`estimate`; ``rule_at`` applies the residual rule to a common bandwidth.

    With ``rule_at = h`` (and ``bandwidth`` ignored) the residual estimator's L_p
    quantities are at h and its squared ones at ``RESIDUAL_SQ_FACTOR * h``, as if the
    search had chosen h (used by :func:`kdecal.compare`); the plug-in's are all at h.
    """
    check_choice(criterion, "criterion", ("auto", *_search.CRITERIA))
    check_choice(estimator, "estimator", _regression.ESTIMATORS)
    if rule_at is not None:
        bandwidth = (
            {"lp": rule_at, "sq": _regression.RESIDUAL_SQ_FACTOR * rule_at}
            if estimator == "residual"
            else rule_at
        )
    if estimator == "residual":
        fits, P, y, be = _run_criteria(
            probs,
            labels,
            bandwidth,
            calibration,
            debias,
            backend,
            progress,
            ("lp", "sq"),
            "brier" if criterion == "auto" else str(criterion),
        )
        (est, search), (est_sq, _) = fits["lp"], fits["sq"]
        out = CalibrationEstimate(
            est,
            P.p,
            y,
            be,
            search,
            est_kl=est_sq,
            search_kl=search,
            est_sq=est_sq,
            validated=P,
            progress=progress,
        )
    else:
        criteria = ("brier", "log") if criterion == "auto" else (str(criterion),)
        fits, P, y, be = _run_criteria(
            probs, labels, bandwidth, calibration, debias, backend, progress, criteria
        )
        est, search = fits[criteria[0]]
        est_kl, search_kl = fits[criteria[-1]]
        out = CalibrationEstimate(
            est,
            P.p,
            y,
            be,
            search,
            est_kl=est_kl,
            search_kl=search_kl,
            validated=P,
            progress=progress,
        )
    if bandwidth == "loo-mle" or criterion == "loo-mle":
        out.criterion = "loo-mle"
    elif rule_at is None and _floors_apply(
        out.calibration, bandwidth, criterion, debias, estimator, out.n_classes
    ):
        assert out._validated is not None
        # a partial of a module function, so that the estimate stays picklable
        out._floor_maker = functools.partial(
            _l2_floor_estimates, out._validated, out._labels, out.backend, progress
        )
    return out


#: The class-wise lower bound of the canonical squared L2 error is formed where the
#: class-wise estimate's estimated cost (:func:`kdecal._estimation.replicates.classwise_estimate_cost`,
#: 2 cores) is at most this many seconds; the top-label bound always.
L2_FLOOR_CLASSWISE_MAX_SECONDS = 20.0


def _floors_apply(
    calibration: object,
    bandwidth: object,
    criterion: object,
    debias: object,
    estimator: object,
    n_classes: int,
) -> bool:
    """Whether the canonical squared L2 error is raised to its lower bounds.

    The defaults only: canonical, residual estimator, the automatic Brier bandwidth,
    ``debias="ustat"``, and K >= 3 (at K = 2 the canonical error is twice the
    class-wise one, estimate and truth alike).
    """
    return (
        calibration == "canonical"
        and estimator == "residual"
        and bandwidth == "auto"
        and criterion in ("auto", "brier")
        and debias == "ustat"
        and n_classes >= 3
    )


def _l2_floor_estimates(
    P: Probs, y: np.ndarray, backend: str, progress: bool | None
) -> list[tuple[CalibrationEstimate, float]]:
    """Return the top-label and (where affordable) class-wise bounds of the squared L2 error.

    Returns ``[(estimate, factor)]``: the top-label estimate with factor 1 and the
    class-wise one with factor K (its squared L2 error is the mean over the classes), at
    their own automatic bandwidths, without their warnings (the canonical estimate's
    are the caller's).
    """
    with quiet(KdecalWarning):
        return [
            (_estimate(P, y, "auto", name, "ustat", "auto", "residual", backend, progress), f)
            for name, f in l2_floor_notions(P.n, P.n_classes).items()
        ]


def l2_floor_notions(n: int, K: int) -> dict[str, float]:
    """Return the notions that bound the canonical squared L2 error, with their factors.

    The top-label error (factor 1) and, where its estimate is affordable
    (:data:`L2_FLOOR_CLASSWISE_MAX_SECONDS`), the class-wise one (factor K: it is the
    mean over the classes).
    """
    out = {"top_label": 1.0}
    if classwise_estimate_cost(n, K)[0] <= L2_FLOOR_CLASSWISE_MAX_SECONDS:
        out["classwise"] = float(K)
    return out


def _l2_floor(
    P: Probs,
    y: np.ndarray,
    backend: str,
    calibration: object,
    bandwidth: object,
    debias: object,
    estimator: object,
) -> float | None:
    """Return the lower bound of the canonical squared L2 error where it applies, else None."""
    if not _floors_apply(calibration, bandwidth, "auto", debias, estimator, P.n_classes):
        return None
    return max(f * b.value("ce_l2") for b, f in _l2_floor_estimates(P, y, backend, None))


@_doc
def calibration_test(
    probs: object,
    labels: object,
    *,
    statistic: str = "ce_l2",
    n_resamples: int = 200,
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "ustat",
    seed: int | np.random.Generator | None = None,
    estimator: str = "residual",
    backend: Backend = "auto",
) -> CalibrationTestResult:
    """Test the null hypothesis that the model is calibrated, by consistency resampling.

    The statistic is computed on the data and on ``n_resamples`` label vectors redrawn
    from the predicted probabilities, ``y*_i ~ Categorical(f_i)`` (Bröcker & Smith 2007;
    Vaicenavicius et al., AISTATS 2019), at the same bandwidth: the null distribution
    keeps the estimator's finite-sample bias, so the test needs no bias correction. All
    resamples share the kernel of one estimate (multi-label engine passes).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    statistic : str, default "ce_l2"
        A quantity of ``kdecal.QUANTITIES``: "ce_l2" (squared L2 calibration error,
        U-statistic debiased), "ece_kde_l1", "ece_kde_l2", "ce_kl", ... The test
        rejects for large values, so the calibration errors test both directions; a
        sharpness or refinement statistic sees miscalibration in one direction only
        (sharpness: under-confidence; refinement: over-confidence; each rejected 0 of
        100 miscalibrated models of the other kind in a probe).
    n_resamples : int, default 200
        Number of resampled label vectors; the smallest attainable p-value is
        ``1 / (n_resamples + 1)``.
    bandwidth : float, "auto" or "loo-mle", default "auto"
        {bandwidth_doc} The bandwidth is chosen once, on the data's labels, and kept for
        the resampled ones: with "auto" the test rejects calibrated models more often
        than its level where the search lands on a small bandwidth (7.5-13.5 % at 5 %
        for K = 2, n = 500; bench/README.md, "The calibration test"); a fixed bandwidth
        keeps it at its level.
    {notion_params}
    seed : int or numpy Generator, optional
        Seed of the resampling.
    {estimator_doc}
        The residual squared-L2 statistic (the default) has its null distribution
        centred at 0, which gives the test more power than the plug-in's.
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"

    Returns
    -------
    CalibrationTestResult
        ``.statistic``, ``.pvalue``, ``.null_distribution`` (n_resamples,), ``.null_mean``.

    Warns
    -----
    {unreliable_warns}

    Raises
    ------
    TypeError, ValueError
        Invalid input, an unknown statistic, ``n_resamples < 1``, or ``debias="ratio"``.
    """
    # search only the criterion of the statistic (KL: the log risk, else Brier)
    quantity = _quantities.check_quantity(statistic, "statistic")
    est = estimate(
        probs,
        labels,
        bandwidth=bandwidth,
        calibration=calibration,
        debias=debias,
        criterion="brier" if estimator == "residual" else quantity.criterion,
        estimator=estimator,
        backend=backend,
    )
    return est.calibration_test(statistic, n_resamples=n_resamples, seed=seed)


def conditional_expectation(
    probs: object, labels: object, *, bandwidth: float | str, backend: Backend = "auto"
) -> np.ndarray:
    """Leave-one-out Nadaraya-Watson estimate of ``E[y | f(x_j)]`` (Dirichlet kernel).

    ``E_hat[y | f_j]_c = sum_{i != j} k(f_j; f_i) 1[y_i = c] / sum_{i != j} k(f_j; f_i)``
    with the Dirichlet kernel ``k(.; f_i) = Dir(.; f_i / h + 1)``
    (Popordanoska et al. 2022, Eq. 3 and 10), computed in log space so that it stays
    exact when every kernel value underflows.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities (rows on the simplex), or P(y = 1) for binary problems
        (then K = 2 with columns (1 - p, p)). Values below 1e-12 are clipped to 1e-12
        and rows renormalised. float32 input runs the kernel in float32 (top-label and
        class-wise problems of n >= 2,048 on the compiled engine: float64, on its fast
        binary engine).
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    bandwidth : float, "auto" or "loo-mle"
        Kernel bandwidth h > 0 (dimensionless, on the simplex); "auto" uses
        :func:`select_bandwidth` (the leave-one-out Brier risk), "loo-mle" the papers'
        leave-one-out likelihood rule.
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
        Engine backend: "auto" is the GPU engine ("cuda") for CUDA arrays, else the
        compiled core ("cpp"), else "numba" (an optional extra, ``pip install
        "kdecal[numba]"``); "cuda" runs the kernel sums on an NVIDIA GPU
        (``pip install "kdecal[cuda]"``, README "The GPU engine"); "dask" runs
        the compiled core on the workers of the current ``dask.distributed`` client, in
        blocks of query rows, with the same numbers as "cpp" (every function with a
        ``backend`` argument accepts it; probabilities may then be a row-chunked
        ``dask.array``; see the README section "Scale-out with Dask").

    Returns
    -------
    ndarray, shape (n, K), float64
        Row j is the estimate at ``f_j``; rows lie on the simplex.

    Raises
    ------
    TypeError
        Non-numeric input, or a bandwidth that is neither a number nor a string (None,
        a list).
    ValueError
        Invalid probabilities, labels or backend; a bandwidth that is not > 0 and finite,
        or a string other than "auto" and "loo-mle" (message names the argument).
    """
    est = _run(probs, labels, bandwidth, "canonical", "none", backend)[0]
    return np.asarray(est.E[0])


@_doc
def ece_kde(
    probs: object,
    labels: object,
    *,
    p: float = 1,
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "ustat",
    estimator: str = "residual",
    backend: Backend = "auto",
) -> float:
    """L_p calibration error ECE^KDE (Popordanoska et al. 2022).

    Canonical: ``CE_p = ( mean_j sum_c |E_hat[y | f_j]_c - f_jc|^p )^(1/p)``, the p-th
    root of the estimator of Eq. 9 (the authors' code returns the p-th power,
    ``CE_p ** p``). Class-wise: ``( mean_c mean_j |E_hat[y_c | f_jc] - f_jc|^p )^(1/p)``
    (Popordanoska et al. 2024, Eq. 24); top-label: the binary error of the confidence.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1); see :func:`conditional_expectation`.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    p : float, default 1
        Order of the L_p norm, ``p >= 1``.
    bandwidth : float, "auto" or "loo-mle", default "auto"
        {bandwidth_doc}
    {notion_params}
    {estimator_doc}
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"

    Returns
    -------
    float
        CE_p, in probability units (a fraction in [0, 2^(1/p)], not a percentage).
        At p = 2 with debiasing, the signed square root of the unbiased estimate of
        CE_2^2, negative when that is (the error is then indistinguishable from 0 at
        this n): ``sign(e) e^2`` equals ``calibration_error(divergence="l2")``; for the
        canonical notion with ``bandwidth="auto"`` and K >= 3 that estimate is raised
        to its top-label and K x class-wise lower bounds
        (:attr:`kdecal.CalibrationEstimate.l2_lower_bounds`).

    Warns
    -----
    {unreliable_warns}

    Raises
    ------
    TypeError, ValueError
        Invalid input (see :func:`conditional_expectation`), ``p < 1``, an unknown
        ``calibration`` or ``debias``, or ``debias="ratio"`` with
        ``estimator="residual"``.
    """
    p = check_p(p)
    kind = "sq" if p == 2.0 else "lp"
    est, P, y, be, _ = _run(
        probs,
        labels,
        bandwidth,
        calibration,
        _debias_read(debias, p == 2.0),
        backend,
        None,
        "brier",
        estimator,
        kind,
    )
    value = _quantities.ce_p(est, p)
    if p != 2.0:
        return value
    floor = _l2_floor(P, y, be, calibration, bandwidth, debias, estimator)
    return float(_quantities.floored("ece_kde_l2", value, floor))


def _debias_read(debias: object, squares: bool) -> object:
    """``debias`` as the quantity reads it: "ustat" forms nothing but debiased squares.

    A quantity that reads no squares (L_p with p != 2, KL, a custom Bregman) is the same
    number with "ustat" and "none"; its estimate is formed without them (no power sums
    it does not read, and no warning about rows whose debiased squares it does not use).
    Any other value goes on as given, to be checked.
    """
    return "none" if debias == "ustat" and not squares else debias


@_doc
def calibration_error(
    probs: object,
    labels: object,
    *,
    divergence: str | Bregman = "kl",
    bandwidth: float | str = "auto",
    estimator: str = "residual",
    calibration: str = "canonical",
    debias: str = "ustat",
    backend: Backend = "auto",
) -> float:
    """Proper calibration error CE_F for a Bregman generator F (Popordanoska et al. 2024).

    ``CE_F = E[ D_F(E[y | f(x)], f(x)) ]`` estimated with the leave-one-out Dirichlet
    kernel estimate ``E_j`` of ``E[y | f_j]``:

    - ``estimator="residual"`` (default): ``mean_j D_F(E_j, f_j)`` with the
      residual-centred ``E_j`` (see :func:`estimate`); for "l2" the normalised
      U-statistic of the residuals (canonical, with ``bandwidth="auto"``,
      ``debias="ustat"`` and K >= 3: raised to its lower bounds, the top-label and K
      times the class-wise squared L2 errors, Jensen's inequality;
      :attr:`kdecal.CalibrationEstimate.l2_lower_bounds`), for "kl" and a custom :class:`Bregman` ``E_j``
      moved into the simplex along its correction where it leaves it (so a custom
      ``F(q) = ||q||^2`` differs from "l2" by those rows, and ``debias`` applies to "l2"
      only);
    - ``estimator="plugin"`` (or its old name "direct"): ``mean_j D_F(E_j, f_j)`` with
      the papers' plug-in ratio ``E_j`` (Eq. 9 / 26);
    - ``estimator="refinement"``: ``mean_j F(E_j) + mean_i [D_F(y_i, f_i) - F(y_i)]``
      with the plug-in ratio, i.e. the risk minus the refinement (Eq. 14-15).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1); see :func:`conditional_expectation`.
    labels : array-like, shape (n,), int
        True classes in ``0..K-1``.
    divergence : "kl", "l2" or Bregman, default "kl"
        "kl": F(p) = sum p log p, the KL calibration error
        ``mean_j sum_c E_jc log(E_jc / f_jc)`` (Eq. 10); "l2": F(p) = ||p||^2, the
        *squared* L2 calibration error ``mean_j ||E_j - f_j||^2`` (Eq. 7); or a
        :class:`Bregman` with user callables.
    bandwidth : float, "auto" or "loo-mle", default "auto"
        {bandwidth_doc}
    estimator : {"residual", "plugin", "direct", "refinement"}, default "residual"
        See above; ``bandwidth="auto"`` chooses the bandwidth of :func:`estimate` for
        the estimator ("residual": half the leave-one-out Brier bandwidth for "kl" and
        "l2", the Brier bandwidth for a custom generator; "plugin": the log-risk
        bandwidth for "kl", the Brier one otherwise).
    {notion_params}
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"

    Returns
    -------
    float
        CE_F in nats for "kl", squared probability units for "l2". The debiased "l2"
        estimate is unbiased and unclipped: it can be negative when the error is close
        to 0 (indistinguishable from 0 at this n).

    Warns
    -----
    {unreliable_warns}
    UnreliableEstimateWarning
        For the canonical KL error (``divergence="kl"``) of the residual-centred
        estimator at 4 < K <= 10 (:data:`KL_RELIABLE_MAX_K`), the least reliable
        kernel estimate there.

    Raises
    ------
    TypeError, ValueError
        Invalid input, divergence, estimator, calibration or debias, or
        ``debias="ratio"`` with ``estimator="residual"``; a custom :class:`Bregman`
        whose F or gradient returns a non-finite value (ValueError naming the point).
    """
    div = _quantities.divergence_of(divergence)
    check_choice(estimator, "estimator", ("residual", "plugin", "direct", "refinement"))
    est, P, y, be, _ = _fit_divergence(
        probs, labels, div, bandwidth, calibration, debias, backend, str(estimator)
    )
    why = _kl_unreliable(calibration, est.problem.dim)
    # beyond K = 10 the fit has warned of every canonical estimate (_run_criteria)
    if (
        why is not None
        and _canonical_unreliable(calibration, est.problem.dim) is None
        and estimator == "residual"
        and div is _quantities.DIVERGENCES["kl"]
    ):
        warn_user(f"kdecal.calibration_error: {why}", UnreliableEstimateWarning)
    value = _quantities.calibration_error(
        est, div.generator, "refinement" if estimator == "refinement" else "direct"
    )
    if div is not _quantities.DIVERGENCES["l2"]:
        return value
    floor = _l2_floor(P, y, be, calibration, bandwidth, debias, estimator)
    return float(_quantities.floored("ce_l2", value, floor))


def _fit_divergence(
    probs: object,
    labels: object,
    div: _quantities.Divergence,
    bandwidth: object,
    calibration: object,
    debias: object,
    backend: object,
    estimator: str,
) -> tuple[_regression.Estimate, Probs, np.ndarray, str, _search.Search | None]:
    """Fit the estimate of a generator's quantities at the bandwidth of ``estimator``'s rule.

    ``debias`` as the generator reads it (:func:`_debias_read`: only L2 reads squares).
    Returns :func:`_run`'s tuple.
    """
    debias = _debias_read(debias, div is _quantities.DIVERGENCES["l2"])
    if estimator == "residual":
        return _run(
            probs,
            labels,
            bandwidth,
            calibration,
            debias,
            backend,
            None,
            "brier",
            "residual",
            div.residual_kind,
        )
    return _run(probs, labels, bandwidth, calibration, debias, backend, None, div.criterion)


@_doc
def refinement(
    probs: object,
    labels: object,
    *,
    divergence: str | Bregman = "kl",
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "ustat",
    estimator: str = "residual",
    backend: Backend = "auto",
) -> float:
    """Refinement ``REF_F = -mean_j F(E_j)`` (Popordanoska et al. 2024, Eq. 15).

    Parameters are those of :func:`calibration_error` (``estimator``: "residual" or
    "plugin").

    Returns
    -------
    float
        For "kl" the mean entropy of the estimated conditional expectation (nats);
        for "l2" minus its mean squared norm.

    Warns
    -----
    {unreliable_warns}

    Raises
    ------
    TypeError, ValueError
        As :func:`calibration_error`.
    """
    div = _quantities.divergence_of(divergence)
    check_choice(estimator, "estimator", _regression.ESTIMATORS)
    est = _fit_divergence(
        probs, labels, div, bandwidth, calibration, debias, backend, str(estimator)
    )[0]
    return _quantities.refinement(est, div.generator)


@_doc
def sharpness(
    probs: object,
    labels: object,
    *,
    divergence: str | Bregman = "kl",
    bandwidth: float | str = "auto",
    calibration: str = "canonical",
    debias: str = "ustat",
    estimator: str = "residual",
    backend: Backend = "auto",
) -> float:
    """Sharpness ``SHARP_F = mean_j F(E_j) - F(pi)`` (Popordanoska et al. 2024, Eq. 4-5).

    ``pi`` is the vector of class frequencies of ``labels``. Parameters are those of
    :func:`calibration_error` (``estimator``: "residual" or "plugin").

    Returns
    -------
    float
        Non-negative up to estimation error (F is convex).

    Warns
    -----
    {unreliable_warns}

    Raises
    ------
    TypeError, ValueError
        As :func:`calibration_error`.
    """
    div = _quantities.divergence_of(divergence)
    check_choice(estimator, "estimator", _regression.ESTIMATORS)
    est = _fit_divergence(
        probs, labels, div, bandwidth, calibration, debias, backend, str(estimator)
    )[0]
    return _quantities.sharpness(est, div.generator)


def loo_log_likelihood(
    probs: object, bandwidths: object, *, backend: Backend = "auto"
) -> np.ndarray:
    """Mean leave-one-out log density of the Dirichlet KDE at each bandwidth.

    ``mean_j log( 1/(n-1) sum_{i != j} Dir(f_j; f_i / h + 1) )``; the Dirichlet density
    is normalised on the simplex, so there is no extra ``-log h`` term (unlike the
    ECE^KDE reference code). All bandwidths share one engine pass.

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    bandwidths : array-like, shape (H,), float
        Bandwidths h > 0.
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"

    Returns
    -------
    ndarray, shape (H,), float64
        Mean LOO log density (nats) at each bandwidth.

    Raises
    ------
    TypeError, ValueError
        Invalid probabilities or bandwidths.
    """
    P = check_probs(probs)
    hs = check_bandwidths(bandwidths)
    be = _backends.resolve_backend(backend, probs)
    problem = _problem.make_problem(P, None, "canonical", be)
    return np.asarray(_search.loo_log_likelihood(problem, hs, be)[0])


def select_bandwidth(
    probs: object,
    labels: object = None,
    *,
    calibration: str = "canonical",
    criterion: str | None = None,
    grid: object = None,
    backend: Backend = "auto",
    progress: bool | None = None,
) -> float:
    """Choose the bandwidth: the one place the automatic bandwidth is decided.

    With ``labels`` (what ``bandwidth="auto"`` uses): the bandwidth of the kernel
    regression of the labels on the predictions of the given notion, minimising the
    leave-one-out risk ``mean_j ||y_j - E_-j[y | f_j]||^2`` ("brier", the default) or
    ``-mean_j log E_-j[y | f_j]_{y_j}`` ("log"), summed over the K one-vs-rest problems
    for ``calibration="classwise"``. Without labels, or with ``criterion="loo-mle"``: the
    bandwidth maximising the leave-one-out likelihood of the density of the predictions
    (Popordanoska et al. 2022, Sec. 5, "Hyperparameters"; the papers' rule).

    Parameters
    ----------
    probs : array-like, shape (n, K) or (n,), float
        Predicted probabilities or binary P(y = 1).
    labels : array-like, shape (n,), int, optional
        True classes in ``0..K-1``; needed by "brier" and "log".
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"
        The notion whose kernel problems are tuned.
    criterion : {"brier", "log", "loo-mle"}, optional
        Default "brier" with labels, "loo-mle" without.
    grid : array-like, shape (H,), optional
        Candidate bandwidths, all evaluated exactly in one pass (the exhaustive mode).
        Default: for "brier"/"log", a search over 73 log-spaced values in [1e-5, 10]
        (ratio 1.21): coarse, then fine, on a random subset of ``max(500, n / 20)``
        query rows, then a local search on twice, four times, ... as many rows up to
        all n, which ends at a local minimum of the exact risk on all rows (top-label
        and class-wise problems of n >= 2,048, whose passes cost nearly as much on a
        subset of the rows as on all: a random sample of the points places the start,
        then the local search runs on all rows; see
        ``kdecal._estimation.search.search_bandwidths``); for "loo-mle",
        :data:`DEFAULT_BANDWIDTH_GRID` (55 values) exhaustively.
    backend : {"auto", "cpp", "numba", "cuda", "dask"}, default "auto"
    progress : bool or None, default None
        Progress bar; None shows one for long work where the output is a terminal
        or a notebook (none in logs and pipes).

    Returns
    -------
    float
        The chosen bandwidth (the first on ties).

    Raises
    ------
    TypeError, ValueError
        Invalid probabilities, labels, grid or criterion; "brier"/"log" without labels.
    """
    P = check_probs(probs)
    check_choice(calibration, "calibration", _problem.CALIBRATIONS)
    if criterion is None:
        criterion = "loo-mle" if labels is None else "brier"
    check_choice(criterion, "criterion", _search.CRITERIA)
    if criterion != "loo-mle" and labels is None:
        raise ValueError(f"criterion={criterion!r} needs labels; pass labels or 'loo-mle'")
    y = None if labels is None else check_labels(labels, P.n, P.n_classes)
    be = _backends.resolve_backend(backend, probs)
    problem = _problem.make_problem(P, y, str(calibration), be)
    if criterion == "loo-mle":
        hs = DEFAULT_BANDWIDTH_GRID if grid is None else check_bandwidths(grid, "grid")
        return _search.select_bandwidth(problem, np.asarray(hs, dtype=np.float64), be, progress)
    if grid is not None:
        hs = np.asarray(check_bandwidths(grid, "grid"), dtype=np.float64)
        risk = _search.cv_risk_grid(problem, hs, str(criterion), be, progress)
        h = float(hs[int(np.argmin(risk))])
        _warn_at_grid_end(h, hs, str(criterion))  # a flat risk here may continue outside
        return h
    record, _ = _search.search_bandwidth(problem, str(criterion), 0, be, progress)
    _warn_at_grid_end(record.bandwidth, _search.SEARCH_GRID, record.criterion, record.tried)
    return record.bandwidth


#: Classes from which the canonical KL calibration error is flagged as unreliable.
KL_RELIABLE_MAX_K = 4


def _kl_unreliable(calibration: object, n_classes: int) -> str | None:
    """Why the canonical KL calibration error at this K is not to be trusted, or None."""
    if calibration != "canonical" or n_classes <= KL_RELIABLE_MAX_K:
        return None
    reliable = (
        "The top-label and class-wise KL errors (within 25 % there) and the canonical L1 "
        "error (within 30 %) are reliable"
        if n_classes <= CANONICAL_RELIABLE_MAX_K
        else "Beyond K = 10 no canonical estimate is reliable: "
        + str(_canonical_unreliable(calibration, n_classes))
    )
    return (
        f"the canonical KL calibration error at K = {n_classes} is the least reliable "
        "kernel estimate: the Dirichlet kernel cannot tell a probability of 1e-6 from one "
        "of 1e-3 near the faces of the simplex, and KL weighs exactly those by "
        "log(E / f); on the synthetic protocol of bench/README.md it is overstated by "
        f"up to +135 % at K = 10 (n = 5,000 to 20,000). {reliable}"
    )


#: Classes beyond which no canonical kernel estimate is trusted (the largest K of the
#: accuracy protocol; from K = 30 on a calibrated model scores an L1 error of 0.27-0.37,
#: bench/README.md, "Canonical estimates at many classes").
CANONICAL_RELIABLE_MAX_K = 10


def _canonical_unreliable(calibration: object, n_classes: int) -> str | None:
    """Why the canonical kernel estimates at this K are not to be trusted, or None."""
    if calibration != "canonical" or n_classes <= CANONICAL_RELIABLE_MAX_K:
        return None
    return (
        f"the canonical kernel estimates at K = {n_classes} cannot tell a calibrated "
        "model from a miscalibrated one: a Dirichlet kernel on the simplex of so many "
        "classes smooths the predictions together. On the synthetic protocol of "
        "bench/README.md (n = 5,000; measured up to K = 10 for its accuracy targets) a "
        "calibrated model scored canonical L1 ECE^KDE 0.27-0.37 from K = 30 to 1,000 "
        "(truth 0), and from K = 100 a miscalibrated one (truth 0.37) scored 0.20-0.35, "
        "its squared L2 error 0.0003 against a truth of 0.0066 at K = 100. The top-label "
        "notion is reliable there (calibrated models 0.001-0.004 from K = 100, 0.015 at "
        "K = 30; miscalibrated ones within 10 % of an upper bound of the truth): "
        "calibration='top_label' (command line: --calibration top_label)"
    )
