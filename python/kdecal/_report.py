"""The :class:`CalibrationReport` returned by :func:`kdecal.evaluate`."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from ._estimation.quantities import QUANTITIES
from ._numerics import ValueEq

__all__ = ["CalibrationReport"]

# Short references used in the description column of ``str(report)``.
_REFERENCES: dict[str, str] = {
    "P22": (
        "Popordanoska, Sayer & Blaschko, 'A Consistent and Differentiable Lp "
        "Canonical Calibration Error Estimator', NeurIPS 2022"
    ),
    "P24": (
        "Popordanoska, Gruber, Tiulpin, Buettner & Blaschko, 'Consistent and "
        "Asymptotically Unbiased Estimation of Proper Calibration Errors', "
        "AISTATS 2024"
    ),
    "G17": "Guo, Pleiss, Sun & Weinberger, 'On Calibration of Modern Neural Networks', ICML 2017",
    "BN24": (
        "Blasiok & Nakkiran, 'Smooth ECE: Principled Reliability Diagrams via Kernel "
        "Smoothing', ICLR 2024"
    ),
    "KLM19": "Kumar, Liang & Ma, 'Verified Uncertainty Calibration', NeurIPS 2019",
    "N15": (
        "Naeini, Cooper & Hauskrecht, 'Obtaining Well Calibrated Probabilities Using "
        "Bayesian Binning', AAAI 2015"
    ),
    "FR25": (
        "Ferrer & Ramos, 'Evaluating Posterior Probabilities: Decision Theory, Proper "
        "Scoring Rules, and Calibration', TMLR 2025"
    ),
}


def format_pvalue(p: float, n_resamples: int) -> str:
    """Format a Monte Carlo p-value for tables: ``"< 0.0099"`` at the floor ``1 / (R + 1)``.

    At the floor no resample reached the statistic: the p-value is below the
    resolution of ``n_resamples`` resamples, not equal to it.
    """
    floor = 1.0 / (n_resamples + 1)
    if p <= floor * (1.0 + 1e-9):
        return f"< {floor:.2g}"
    return f"{p:.3g}"


def _notion_line(name: str, row: dict[str, Any]) -> str:
    def cell(q: str) -> str:
        v = row.get(q)
        ci = row.get(f"{q}_ci")
        null = row.get(f"{q}_null_mean")
        text = _format_value(v)
        if ci is not None:
            text += f" [{_format_value(ci[0])}, {_format_value(ci[1])}]"
        if null is not None:
            text += f" ({_format_value(null)})"
        return text

    pv, R = row.get("pvalue"), row.get("n_resamples")
    if pv is None:
        p_text = "n/a"
    elif isinstance(R, int):
        p_text = format_pvalue(float(pv), R)
    else:
        p_text = _format_value(pv)
    return (
        f"{name:<11} {_format_value(row.get('bandwidth')):>9}  {cell('ece_kde_l1'):<44} "
        f"{cell('ce_l2'):<44} {p_text}"
    )


# (field name, description) for each metric row of the table, in display order: the
# kernel quantities of the estimators' table, then the context metrics.
_METRICS: tuple[tuple[str, str], ...] = (
    *((q.name, q.label) for q in QUANTITIES.values()),
    ("accuracy", "top-1 (argmax) accuracy"),
    ("log_loss", "log loss: -mean log p(true class), nats"),
    ("brier_score", "Brier score, summed over classes"),
    ("ece_binned", "binned top-label ECE, 15 equal-width bins [G17]"),
)

# (field name, description) of the metrics printed after the table's rows: the top-label
# metrics without a kernel that the default report adds, and the calibration loss.
_EXTRA_METRICS: tuple[tuple[str, str], ...] = (
    ("smooth_ece", "smooth ECE, top-label, fixed-point bandwidth [BN24]"),
    (
        "ece_binned_debiased",
        "debiased binned top-label L2 ECE, 15 bins (signed root) [KLM19]",
    ),
    (
        "calibration_loss",
        "log loss minus log loss after cross-validated {calibrator} [FR25]",
    ),
)

# How the calibration loss's description names its calibrator.
_CALIBRATOR_NAMES = {"affine": "affine calibration", "temperature": "temperature scaling"}

# Descriptions of every name a selection (``metrics``) can print.
_DESCRIPTIONS: dict[str, str] = {
    **dict(_METRICS),
    **dict(_EXTRA_METRICS),
    "mce_binned": "binned top-label maximum calibration error, 15 bins [N15]",
}


def _plain(value: Any) -> Any:
    """Convert numpy scalars (and other number types) to plain Python types."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # numpy scalar
        return _plain(value.item())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _format_value(value: Any) -> str:
    """Format one metric value for the table."""
    if value is None:
        return "n/a"
    value = _plain(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value != 0.0 and not 1e-4 <= abs(value) < 1e6:  # (1e300 printed 300 digits)
        return f"{value:.3e}"
    return f"{value:.6f}"


def _format_interval(ci: Any) -> str:
    """Format an interval ``[low, high]`` for the table; "" for None."""
    if ci is None:
        return ""
    return f"[{_format_value(ci[0])}, {_format_value(ci[1])}]"


@dataclass(frozen=True, eq=False)
class CalibrationReport(ValueEq):
    """All calibration metrics of one set of predictions, from :func:`kdecal.evaluate`.

    Every error, score and accuracy is a plain fraction (0.05 means 5 %), never
    a percentage. Quantities based on the Kullback-Leibler divergence or the log
    are in nats. All metrics are computed on the clipped and renormalised
    probabilities ``P~ = max(P, 1e-12) / rowsum(max(P, 1e-12))``. The KDE-based
    metrics use ``E[y|f]``, the leave-one-out Dirichlet-kernel estimate of the
    conditional class distribution given the prediction ``f`` in the notion
    :attr:`calibration`: by default (:attr:`estimator` ``"residual"``) the
    residual-centred regression ``f + g``, ``g`` the kernel regression of ``y - f``,
    with the L1 quantities at :attr:`bandwidth` and the squared L2, L2 and KL ones at
    :attr:`bandwidth_l2` and :attr:`bandwidth_kl` (half of it with ``bandwidth="auto"``);
    with ``"plugin"`` the papers' kernel ratio (Popordanoska et al. 2022, Eq. 3).

    Attributes
    ----------
    n : int
        Number of samples (rows of ``probs``).
    n_classes : int
        Number of classes ``K`` (2 for binary input given as ``P(y=1)``).
    bandwidth : float
        Kernel bandwidth ``h`` of the L1 quantities (the selected value when
        ``bandwidth="auto"`` was requested); see :attr:`bandwidth_l2` and
        :attr:`bandwidth_kl` for the others.
    ece_kde_l1 : float
        KDE estimate of the L1 calibration error in the notion :attr:`calibration`,
        ``mean_j sum_c |E[y|f_j]_c - f_jc|`` (Popordanoska et al. 2022), a fraction.
    ece_kde_l2 : float
        KDE estimate of the L2 calibration error in the notion :attr:`calibration`,
        ``(mean_j sum_c (E[y|f_j]_c - f_jc)^2)^(1/2)`` (Popordanoska et al. 2022),
        a fraction: the signed square root of ``ce_l2`` (negative when ``ce_l2`` is).
    ce_kl : float
        Proper calibration error induced by the log loss,
        ``mean_j KL(E[y|f_j] || f_j)`` (Popordanoska et al. 2024), in nats.
    ce_l2 : float
        Proper calibration error induced by the Brier score,
        ``mean_j ||E[y|f_j] - f_j||^2`` (Popordanoska et al. 2024), a fraction. With
        ``debias="ustat"`` or ``"ratio"`` an unbiased estimate, reported unclipped: a
        negative value means the error is indistinguishable from 0 at this n (the same
        value in the API, this report and its JSON; a note says so).
    refinement_kl : float
        Refinement term of the log loss, ``-mean_j F(E[y|f_j])`` with
        ``F(p) = sum_c p_c log p_c``, i.e. the mean entropy of ``E[y|f]``, in nats.
    refinement_l2 : float
        Refinement term for the Brier score as defined by :func:`kdecal.refinement`,
        ``-mean_j F(E[y|f_j])`` with ``F(p) = sum_c p_c^2``.
    sharpness_kl : float
        ``mean_j F(E[y|f_j]) - F(freq)`` with ``F(p) = sum_c p_c log p_c`` and
        ``freq`` the empirical class frequencies, in nats.
    sharpness_l2 : float
        ``mean_j F(E[y|f_j]) - F(freq)`` with ``F(p) = sum_c p_c^2``.
    accuracy : float
        Fraction of samples whose argmax prediction equals the label.
    log_loss : float
        ``-mean_i log P~_{i, y_i}``, in nats.
    brier_score : float
        ``mean_i sum_c (P~_ic - y_ic)^2`` with ``y_i`` one-hot (range 0 to 2).
    ece_binned : float
        Classical binned top-label L1 ECE with 15 equal-width confidence bins,
        bin ``= clip(ceil(conf * 15) - 1, 0, 14)`` (Guo et al. 2017), a fraction.
        Given for comparison only; it is a biased, inconsistent estimator.
    backend : str
        Engine that computed the kernel sums (``"cpp"``, ``"numba"``, ``"cuda"`` or ``"dask"``).
    wall_time_s : float
        Wall-clock time of the whole evaluation, in seconds.
    source : str or None
        Where the predictions came from (a file name or short description), or
        None when :func:`kdecal.evaluate` was called on in-memory arrays.
    calibration : str
        Notion of calibration of the kernel estimators: ``"canonical"``,
        ``"classwise"`` (mean over the K one-vs-rest problems) or ``"top_label"``
        (Popordanoska et al. 2024, Eq. 24-25, App. D).
    debias : str
        Debiasing of the squared errors: ``"none"``, ``"ustat"`` (residual: the
        normalised U-statistic of the residuals; plug-in: Eq. 7 of [1]) or ``"ratio"``
        (plug-in only, App. C-D of [1]).
    bandwidth_rule : str
        How the bandwidth was chosen: ``"brier (L2, KL: brier / 2)"`` (residual
        estimator: the leave-one-out Brier risk of the kernel regression for the L1
        quantities, half its bandwidth for the squared L2, L2 and KL ones), ``"brier
        (KL: log)"`` (plug-in: the Brier risk, and the log risk for the KL quantities),
        ``"loo-mle"`` (the papers' density likelihood) or ``"fixed"``.
    bandwidth_kl : float or None
        Bandwidth of the KL quantities (``ce_kl``, ``refinement_kl``, ``sharpness_kl``):
        half of ``bandwidth`` by the residual rule, the log risk's for the plug-in
        (equal to ``bandwidth`` where it chose the same), ``bandwidth`` when fixed.
    smooth_ece : float or None
        Top-label smooth ECE (``kdecal.smooth_ece``; Blasiok & Nakkiran, ICLR 2024) at
        its fixed-point bandwidth, a fraction; beside the kernel estimates so that a
        reader sees where the estimators agree. None in reports made before it existed.
    ece_binned_debiased : float or None
        Debiased binned top-label L2 ECE with 15 equal-width bins
        (``kdecal.binned.ece(p=2, debias=True)``; Kumar, Liang & Ma, NeurIPS 2019): the
        signed root of an unbiased estimate of the binned squared error (negative:
        indistinguishable from 0). None in reports made before it existed.
    mce_binned : float or None
        Binned top-label maximum calibration error with 15 equal-width bins
        (``kdecal.binned.ece(p=np.inf)``; Naeini, Cooper & Hauskrecht, AAAI 2015); None
        unless asked for in :attr:`metrics`.
    intervals : dict
        Bootstrap 95 % intervals ``[low, high]`` of the top-label metrics without a
        kernel (``smooth_ece`` and ``ece_binned_debiased`` by default; those of
        :attr:`metrics` when it names some of ``ece_binned``, ``ece_binned_debiased``,
        ``mce_binned``, ``smooth_ece``), keyed by field name: each metric recomputed on
        the bootstrap row samples of the kernel intervals (the same ``n_resamples`` and
        seed, so the same resampled rows), the percentile interval centred on the
        estimate as theirs. Empty with ``n_resamples=0`` and in reports made before it
        existed.
    metrics : list of str or None
        The metrics asked for (``kdecal evaluate --metrics``), in the order printed;
        None for the full report. The table prints only these; the other fields hold
        what the one kernel estimate and the context give anyway.
    calibration_loss : float or None
        Calibration loss of [4]: the log loss minus the log loss after affine
        calibration (``calibration_loss_calibrator``) trained by 5-fold cross-validation
        on the same data, in nats (``kdecal.scores.calibration_loss(...,
        relative=False)``); None when skipped.
    calibration_loss_calibrator : {"affine", "temperature"}
        The calibrator of ``calibration_loss``: affine (Ferrer & Ramos's DP
        calibration), or temperature scaling where n / K is below
        ``kdecal._evaluate.CAL_LOSS_AFFINE_MIN_ROWS_PER_CLASS`` (the affine calibrator's
        K + 1 parameters overfit there; a note says so).
    notions : dict
        Per notion ("canonical", "top_label", "classwise"): ``bandwidth``,
        ``ece_kde_l1`` and ``ce_l2`` with bootstrap 95 % intervals (``*_ci``, [low,
        high]) and consistency-resampling null means (``*_null_mean``: what a perfectly
        calibrated model with these predictions scores on average), ``pvalue`` of
        the calibration test with the ``ce_l2`` statistic and its ``n_resamples`` (the
        table prints a p-value at the floor ``1 / (n_resamples + 1)`` as
        ``< 0.0099``), for the notions resampled; ``resampling_skipped`` (the reason)
        where resampling is undefined (every row of a replicate lost its neighbours);
        ``ce_l2_lower_bounds`` where the canonical ``ce_l2`` is raised to its lower
        bounds (:attr:`kdecal.CalibrationEstimate.l2_lower_bounds`); a bound notion not
        resampled itself gets the ``ce_l2_ci`` of the replicates made for that.
    notes : list of str
        Plain-language warnings, e.g. when an estimate is dominated by its bias.
    estimator : str
        Regression of ``E[y | f]``: ``"residual"`` (residual-centred, the default of
        :func:`kdecal.evaluate`) or ``"plugin"`` (the papers' ratio).
    bandwidth_l2 : float or None
        Bandwidth of the squared L2 and L2 quantities (``ce_l2``, ``ece_kde_l2``,
        ``refinement_l2``, ``sharpness_l2``); equal to ``bandwidth`` for the plug-in.
    estimates : dict
        Per notion of :attr:`notions` (and the notion of :attr:`calibration`), the
        :class:`kdecal.CalibrationEstimate` its numbers were computed from (its engine sums kept): further quantities, intervals at
        another level or more resamples, without a new kernel pass. Not part of
        :meth:`to_dict` (nor of the JSON of ``kdecal evaluate --json``); empty for a
        report made from such a dict.

    References
    ----------
    .. [1] T. Popordanoska, R. Sayer and M. B. Blaschko, "A Consistent and
       Differentiable Lp Canonical Calibration Error Estimator", NeurIPS 2022.
    .. [2] T. Popordanoska, S. G. Gruber, A. Tiulpin, F. Buettner and
       M. B. Blaschko, "Consistent and Asymptotically Unbiased Estimation of
       Proper Calibration Errors", AISTATS 2024.
    .. [3] C. Guo, G. Pleiss, Y. Sun and K. Q. Weinberger, "On Calibration of
       Modern Neural Networks", ICML 2017.
    .. [4] L. Ferrer and D. Ramos, "Evaluating Posterior Probabilities: Decision
       Theory, Proper Scoring Rules, and Calibration", TMLR 2025.
    """

    n: int
    n_classes: int
    bandwidth: float
    ece_kde_l1: float
    ece_kde_l2: float
    ce_kl: float
    ce_l2: float
    refinement_kl: float
    refinement_l2: float
    sharpness_kl: float
    sharpness_l2: float
    accuracy: float
    log_loss: float
    brier_score: float
    ece_binned: float
    backend: str
    wall_time_s: float
    source: str | None = None
    calibration: str = "canonical"
    debias: str = "ustat"
    bandwidth_rule: str = "fixed"
    bandwidth_kl: float | None = None
    calibration_loss: float | None = None
    notions: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    estimator: str = "plugin"
    bandwidth_l2: float | None = None
    smooth_ece: float | None = None
    ece_binned_debiased: float | None = None
    mce_binned: float | None = None
    intervals: dict[str, list[float]] = field(default_factory=dict)
    metrics: list[str] | None = None
    calibration_loss_calibrator: str = "affine"
    estimates: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a dict of plain Python values.

        Returns
        -------
        dict
            One entry per field but ``estimates``, in field order. Numbers are plain ``int`` or
            ``float`` (numpy scalars are converted), ``backend`` is a ``str`` and
            ``source`` a ``str`` or None, so the result can be passed to
            :func:`json.dumps` directly and back to ``CalibrationReport(**d)``.
        """
        return {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name != "estimates"
        }

    def _selection_dict(self) -> dict[str, Any]:
        """Return :meth:`to_dict` with only the metrics that ``str(self)`` prints.

        The JSON of ``kdecal evaluate --json``. For the full report (``metrics`` None)
        this is ``to_dict()``. With a selection, the metric fields it does not name
        (``_DESCRIPTIONS``: the kernel quantities, accuracy, log loss, Brier score and
        the top-label metrics without a kernel) are None and ``intervals`` keeps the
        named ones: the same keys, the values of the table, and
        ``CalibrationReport(**d)`` prints the same table.
        """
        d = self.to_dict()
        if self.metrics is None:
            return d
        keep = set(self.metrics)
        for name in _DESCRIPTIONS:
            if name not in keep:
                d[name] = None
        d["intervals"] = {k: v for k, v in d["intervals"].items() if k in keep}
        return d

    def __str__(self) -> str:
        """Return a human-readable table of all metrics."""
        bw = _plain(self.bandwidth)
        bw_text = f"{bw:.6g}" if isinstance(bw, (int, float)) else str(bw)
        lines = [
            "kdecal calibration report",
            f"source: {self.source if self.source is not None else '(in-memory arrays)'}",
            (
                f"n = {_plain(self.n)}, K = {_plain(self.n_classes)}, "
                f"bandwidth = {bw_text}, backend = {self.backend}, "
                f"wall time = {_plain(self.wall_time_s):.3g} s"
            ),
            (
                f"calibration = {self.calibration}, debias = {self.debias}, "
                f"estimator = {self.estimator}"
            ),
            "",
        ]
        notion = self.calibration.replace("_", "-")
        if self.metrics is None:  # the full report: the table, then the extras
            shown = [name for name, _ in _METRICS]
            shown += [name for name, _ in _EXTRA_METRICS if getattr(self, name) is not None]
        else:
            shown = [
                name
                for name in self.metrics
                if name in _DESCRIPTIONS and getattr(self, name, None) is not None
            ]
        rows = [
            (
                name,
                _format_value(getattr(self, name)),
                _format_interval(self.intervals.get(name)),
                _DESCRIPTIONS[name].format(
                    calibration=notion,
                    calibrator=_CALIBRATOR_NAMES.get(
                        self.calibration_loss_calibrator, self.calibration_loss_calibrator
                    ),
                ),
            )
            for name in shown
        ]
        w_name = max(len("metric"), len("ece_binned_debiased"), *(len(r[0]) for r in rows))
        w_val = max(len("value"), *(len(r[1]) for r in rows))
        w_ci = max(len("95% CI"), *(len(r[2]) for r in rows))
        w_desc = max(len("description"), *(len(r[3]) for r in rows))
        with_ci = any(r[2] for r in rows)
        ci_head, ci_rule = (f"  {'95% CI':<{w_ci}}", f"  {'-' * w_ci}") if with_ci else ("", "")
        lines.append(f"{'metric':<{w_name}}  {'value':>{w_val}}{ci_head}  description")
        lines.append(f"{'-' * w_name}  {'-' * w_val}{ci_rule}  {'-' * w_desc}")
        for name, val, ci, desc in rows:
            ci_cell = f"  {ci:<{w_ci}}" if with_ci else ""
            lines.append(f"{name:<{w_name}}  {val:>{w_val}}{ci_cell}  {desc}")
        kl_h = (
            "" if self.bandwidth_kl is None else f", KL quantities at h = {self.bandwidth_kl:.6g}"
        )
        if self.bandwidth_l2 is not None and self.bandwidth_l2 != self.bandwidth:
            kl_h = (
                f", L2 quantities at h = {self.bandwidth_l2:.6g}"
                if self.bandwidth_kl != self.bandwidth_l2
                else f", L2 and KL quantities at h = {self.bandwidth_l2:.6g}"
            ) + (
                ""
                if self.bandwidth_kl in (None, self.bandwidth_l2)
                else f", KL quantities at h = {self.bandwidth_kl:.6g}"
            )
        if self.metrics is None or any(q in QUANTITIES for q in self.metrics):
            lines.append(f"bandwidth rule: {self.bandwidth_rule}{kl_h}")
        if self.notions:
            lines.append("")
            lines.append(
                f"{'notion':<11} {'bandwidth':>9}  {'ECE^KDE L1 [95% CI] (null)':<44} "
                f"{'squared L2 CE [95% CI] (null)':<44} p-value"
            )
            for name, row in self.notions.items():
                lines.append(_notion_line(name, row))
            lines.append(
                "p-value: consistency-resampling test of calibration (squared L2 statistic); "
                "(null): the mean score of a perfectly calibrated model with these predictions."
            )
            bounded = [k for k, row in self.notions.items() if row.get("ce_l2_lower_bounds")]
            if bounded:
                lines.append(
                    f"{', '.join(bounded)} squared L2 CE: the U-statistic raised to its lower "
                    "bounds, the top-label and K x class-wise errors (Jensen); its test and "
                    "(null) use the U-statistic alone."
                )
        for note in self.notes:
            lines.append("")
            lines.append("note: " + note)
        lines.append("")
        lines.append(
            "Errors are fractions (0.05 = 5 %), not percent; KL and log quantities in nats."
        )
        body = "\n".join(lines)
        for key, ref in _REFERENCES.items():
            # the full report lists its references (as it always has); a selection, and
            # a metric only a selection prints, the cited ones
            cited = f"[{key}]" in body
            if cited or (self.metrics is None and key != "N15"):
                lines.append(f"[{key}] {ref}")
        return "\n".join(lines)
