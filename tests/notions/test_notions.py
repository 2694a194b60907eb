"""Notions of calibration (canonical, class-wise, top-label) against the brute-force reference.

The reference (tests/_reference.py, ``ref_notion_*``) builds the kernel problems of each
notion itself (Popordanoska et al. 2024, Eq. 24-25 and App. D):

- top-label: one binary problem, points ``(1 - c, c)`` with ``c = max_k f~`` (clipped at
  1e-12 and renormalised) and labels ``1[argmax f~ = y]``;
- class-wise: K binary problems ``(1 - f~_c, f~_c)`` with labels ``1[y = c]``;

materialises each n x n log kernel in float64 (gammaln, -inf diagonal, per-class
logsumexp) and applies the conventions of kdecal._estimation: L_p errors use the positive
coordinate only, "l2" is ``F(q) = q^2`` and "kl" is ``q log q + (1 - q) log(1 - q)`` for
binary problems; "loo-mle" maximises the sum over the problems of a notion of their mean
leave-one-out log likelihoods over the default grid (kdecal's bandwidth="loo-mle"; its
"auto", the LOO Brier risk of the label regression, is not in the reference and is
resolved with kdecal.select_bandwidth where a test needs it).  kdecal calls that are
compared with the reference's plain plug-in pass debias="none" explicitly.

The grid test here uses ``debias="none"`` (debiasing: test_debias.py, which reuses the
helpers of this module); the identity and evaluate() tests run every debias mode.
float64, backend "auto"; rtol 1e-9 with a 1e-13 absolute floor.  Measured worst relative
error over the grid (kdecal 997f19e..a87ee2d): 3.4e-13 (none), 1.9e-11 (ustat / ratio).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from dataclasses import dataclass

import numpy as np
import pytest

import _reference as ref
from _helpers import SCALAR_ATOL, assert_scalar, auto_bandwidth, bw_id
from conftest import SYNTHETIC, SYNTHETIC_NAMES
from conftest import dataset_or_skip as _get

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

RTOL = 1e-9
BANDWIDTHS = [0.05, 0.5, "loo-mle"]
BW_IDS = [bw_id(b) for b in BANDWIDTHS]
NOTIONS = list(ref.NOTIONS)
DATASETS = [*SYNTHETIC_NAMES, "real-pneumonia-K2", "real-vgg16-K10"]
# the reference materialises K n x n kernels for each of the 55 grid bandwidths ("loo-mle");
# larger datasets are cut to their first N_MAX rows to keep the suite fast
N_MAX = 100
DATASET_IDS = [
    name if SYNTHETIC.get(name, {}).get("n", N_MAX + 1) <= N_MAX else f"{name}-first{N_MAX}"
    for name in DATASETS
]
IDENTITY_DATASETS = ["syn-K2vec-n80", "syn-K4-absentclass-n100", "real-vgg16-K10"]
# quantities for which a notion built from binary problems is exactly a mean of canonical
# K = 2 problems (kl: the same formula; L_p^p and l2: 2 x, the two coordinates mirror)
BINARY_FACTOR = {
    "ece_p1": 2.0,
    "ece_p2": 2.0,
    "ece_p3": 2.0,
    "ce_l2_direct": 2.0,
    "ce_kl_direct": 1.0,
    "ce_kl_refinement": 1.0,
    "refinement_kl": 1.0,
    "sharpness_kl": 1.0,
}


@dataclass(frozen=True)
class Data:
    """A (possibly cut) conftest dataset."""

    name: str
    probs: np.ndarray
    labels: np.ndarray

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    @property
    def K(self) -> int:
        return 2 if self.probs.ndim == 1 else int(self.probs.shape[1])


@functools.cache
def _data(name: str) -> Data:
    d = _get(name)
    m = min(d.n, N_MAX)
    return Data(name, np.ascontiguousarray(d.probs[:m]), d.labels[:m].copy())


def get_data(name: str) -> Data:
    """conftest dataset ``name`` cut to N_MAX rows (skips when its real data is missing)."""
    return _data(name)


@pytest.fixture(scope="module")
def kd(kdecal_module):
    """Return the kdecal module."""
    return kdecal_module


@pytest.fixture(scope="module", params=DATASETS, ids=DATASET_IDS)
def ds(request):
    """Synthetic datasets of conftest plus a real K = 2 and a real K = 10 one (<= N_MAX rows)."""
    return get_data(request.param)


def _power(name: str, value: float) -> float:
    """L_p^p for the ece_p* quantities (what is additive over problems), else the value.

    Signed: a negative ece_p2 (the signed root of a negative debiased CE_2^2) gives -|v|^2.
    """
    if not name.startswith("ece_p"):
        return value
    return float(np.sign(value)) * abs(value) ** int(name[-1])


def formulas(debias: str) -> dict:
    """App. C / App. D as transcribed in kdecal._debias, for the reference's own moments.

    (The reference's independent transcription of Eq. 73-75 is cross-checked against
    kdecal._debias.ratio_of_means in test_debias.py::test_eq73_transcription.)
    """
    if debias != "ratio":
        return {}
    nd = importlib.import_module("kdecal._debias")
    return {"ratio_of_means": nd.ratio_of_means, "ratio_of_squares": nd.ratio_of_squares}


def expect_warnings(n_degenerate: int = 0, n_rows: int = 0, negative: bool = False):
    """Expect exactly the KdecalWarnings the reference predicts (pyproject: warnings=error).

    ``n_degenerate`` of ``n_rows`` query rows with a single effective neighbour. A
    negative debiased CE_2^2 warns no more (issue 26: reported unclipped, signed root), so
    ``negative`` must be False.
    """
    assert not negative, "a negative CE_2^2 is reported unclipped, without a warning"
    stack = contextlib.ExitStack()
    warning = importlib.import_module("kdecal.warnings").KdecalWarning
    if n_degenerate:
        pattern = rf"\b{n_degenerate} of {n_rows} query rows have a single effective neighbour"
        stack.enter_context(pytest.warns(warning, match=pattern))
    return stack


#: The quantities of ref.QUANTITIES that read the (debiased) squares of E.
SQUARED_QUANTITIES = frozenset(
    {"ece_p2", "ce_l2_direct", "ce_l2_refinement", "refinement_l2", "sharpness_l2"}
)


def check_quantities(kd, data, calibration, bandwidth, debias, *, backend="auto"):
    """All 11 public quantities of a notion vs the reference; returns the reference problems.

    Compared on the additive scale (CE_p^p for ece_kde) with rtol RTOL and an absolute
    allowance of 1e-13 plus ``ref_debias_atol`` (rounding amplified by near-degenerate rows).
    """
    _, problems = ref.ref_notion_estimates(
        data.probs,
        data.labels,
        calibration,
        bandwidth,
        debias,
        **formulas(debias),
    )
    n_deg = int(sum(p["degenerate"].sum() for p in problems))
    n_rows = sum(p["degenerate"].size for p in problems)
    atol = SCALAR_ATOL + ref.ref_debias_atol(problems)
    bad = []
    for q in ref.QUANTITIES:
        expected, negative = ref.ref_notion_quantity(q, problems, calibration, debias)
        # "ustat" debiases nothing but the squares: the other quantities are formed
        # without them, and say nothing of their degenerate rows
        warned = n_deg if debias != "ustat" or q in SQUARED_QUANTITIES else 0
        with expect_warnings(warned, n_rows, negative):
            got = ref.call_quantity(
                kd,
                q,
                data.probs,
                data.labels,
                bandwidth=bandwidth,
                calibration=calibration,
                debias=debias,
                backend=backend,
            )
        a, b = _power(q, got), _power(q, expected)
        if not (isinstance(got, float) and abs(a - b) <= atol + RTOL * abs(b)):
            bad.append(f"{q}: got {got!r}, expected {expected!r}")
    assert not bad, f"{calibration} h={bandwidth} debias={debias}:\n" + "\n".join(bad)
    return problems


# ------------------------------------------------------------------ every function
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
def test_quantities_match_reference(kd, ds, calibration, bandwidth):
    """Every function x divergence x estimator of a notion equals the brute force.

    ece_kde p = 1, 2, 3; calibration_error kl / l2 x direct / refinement; refinement and
    sharpness kl / l2 (the list is ref.QUANTITIES).
    """
    check_quantities(kd, ds, calibration, bandwidth, "none")


@pytest.mark.parametrize("calibration", NOTIONS)
def test_auto_bandwidth_rule(kd, ds, calibration):
    """'loo-mle' picks the grid value maximising the summed LOO likelihood of the problems.

    ('auto', the LOO Brier risk of the notion's label regression, is the bandwidth
    select_bandwidth(probs, labels, calibration=...) chooses.)
    """
    h = ref.ref_notion_bandwidth(ds.probs, ds.labels, calibration, "loo-mle")
    report = kd.evaluate(
        ds.probs,
        ds.labels,
        bandwidth="loo-mle",
        calibration=calibration,
        debias="none",
        n_resamples=0,
        notions=(),
    )
    assert report.bandwidth == h, (calibration, report.bandwidth, h)
    assert report.bandwidth_rule == "loo-mle"
    assert h == kd.select_bandwidth(
        ds.probs, ds.labels, calibration=calibration, criterion="loo-mle"
    )
    if calibration == "canonical":
        assert h == kd.select_bandwidth(ds.probs)
    h_auto, expect_warning = auto_bandwidth(kd, ds.probs, ds.labels, calibration=calibration)
    with expect_warning():
        report = kd.evaluate(
            ds.probs,
            ds.labels,
            bandwidth="auto",
            calibration=calibration,
            debias="none",
            n_resamples=0,
            notions=(),
        )
    assert report.bandwidth == h_auto, (calibration, report.bandwidth, h_auto)
    assert report.bandwidth_rule == "brier (KL: log)"


def test_notions_differ(kd):
    """The three notions give three different numbers on a K = 3 problem (not one code path)."""
    ds = get_data("syn-K3-n150")
    vals = {}
    for c in NOTIONS:
        _, problems = ref.ref_notion_estimates(ds.probs, ds.labels, c, 0.05)
        vals[c] = kd.ece_kde(ds.probs, ds.labels, bandwidth=0.05, calibration=c)
        assert_scalar(
            vals[c], ref.ref_notion_quantity("ece_p1", problems, c, "none")[0], rtol=RTOL
        )
    assert len({round(v, 6) for v in vals.values()}) == 3, vals


# ------------------------------------------------------------------ identities
@pytest.mark.parametrize("debias", ref.DEBIAS_MODES)
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
def test_classwise_l2_is_square_of_classwise_ce2(kd, ds, bandwidth, debias):
    """Class-wise "l2" CE = mean_c mean_j (e - f)^2 = (class-wise CE_2)^2 (App. D, F = q^2).

    With debiasing both use ``sq - 2 E f + f^2``; a negative estimate is clamped to 0 (with
    a warning) by ece_kde only.
    """
    h, problems = ref.ref_notion_estimates(
        ds.probs,
        ds.labels,
        "classwise",
        bandwidth,
        debias,
        **formulas(debias),
    )
    raw = ref.ref_notion_ce_pp(problems, "classwise", 2)
    kw = {"bandwidth": h, "calibration": "classwise", "debias": debias}
    n_deg = int(sum(p["degenerate"].sum() for p in problems))
    n_rows = sum(p["degenerate"].size for p in problems)
    with expect_warnings(n_deg, n_rows):
        ce2 = kd.ece_kde(ds.probs, ds.labels, p=2, **kw)
    with expect_warnings(n_deg, n_rows):
        l2 = kd.calibration_error(ds.probs, ds.labels, divergence="l2", **kw)
    atol = SCALAR_ATOL + ref.ref_debias_atol(problems)
    assert_scalar(l2, raw, rtol=RTOL, atol=atol, what="classwise ce_l2")
    # one rule for squared errors (issue 26): the signed root of the same value
    assert_scalar(np.sign(ce2) * ce2**2, l2, rtol=1e-12, what="ece_kde(p=2)^2 vs ce_l2")
    assert np.sign(ce2) == np.sign(l2)


@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("name", IDENTITY_DATASETS)
def test_classwise_equals_k_binary_problems(kd, name, bandwidth):
    """Class-wise = mean over c of the canonical K = 2 problem (f~_c as (n,), 1[y = c]).

    canonical K = 2 L_p^p (and "l2") = 2 x the positive-coordinate value; kl is identical
    (quantities in BINARY_FACTOR).  'loo-mle' is resolved once by the class-wise rule (a
    separate 'loo-mle' per class would select other bandwidths).
    """
    ds = get_data(name)
    h = ref.ref_notion_bandwidth(ds.probs, ds.labels, "classwise", bandwidth)
    _, problems = ref.ref_notion_estimates(ds.probs, ds.labels, "classwise", bandwidth)
    P = ref.ref_clip(ds.probs)
    for quantity, factor in BINARY_FACTOR.items():
        per_class = [
            _power(
                quantity,
                ref.call_quantity(
                    kd,
                    quantity,
                    P[:, c].copy(),
                    (ds.labels == c).astype(int),
                    bandwidth=h,
                    debias="none",
                ),
            )
            for c in range(ds.K)
        ]
        got = ref.call_quantity(
            kd,
            quantity,
            ds.probs,
            ds.labels,
            bandwidth=bandwidth,
            calibration="classwise",
            debias="none",
        )
        want = ref.ref_notion_quantity(quantity, problems, "classwise", "none")[0]
        assert_scalar(got, want, rtol=RTOL, what=f"{quantity}: classwise vs reference")
        assert_scalar(
            _power(quantity, got),
            np.mean(per_class) / factor,
            rtol=RTOL,
            what=f"{quantity}: classwise vs K binary calls",
        )


@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("name", IDENTITY_DATASETS)
def test_top_label_equals_binary_problem(kd, name, bandwidth):
    """Top-label = the canonical K = 2 problem on (max_k f~, 1[argmax = y]) (/2 for L_p^p)."""
    ds = get_data(name)
    h = ref.ref_notion_bandwidth(ds.probs, ds.labels, "top_label", bandwidth)
    P = ref.ref_clip(ds.probs)
    conf = P.max(axis=1)
    correct = (P.argmax(axis=1) == ds.labels).astype(int)
    for quantity, factor in BINARY_FACTOR.items():
        binary = _power(
            quantity,
            ref.call_quantity(kd, quantity, conf, correct, bandwidth=h, debias="none"),
        )
        got = ref.call_quantity(
            kd,
            quantity,
            ds.probs,
            ds.labels,
            bandwidth=bandwidth,
            calibration="top_label",
            debias="none",
        )
        assert_scalar(_power(quantity, got), binary / factor, rtol=RTOL, what=quantity)


# 1 - (1 - q) != q in float64: for the real scores (q down to 6e-9) the class-0 problem
# ((1 - f0, f0) with f0 = 1 - q) is the mirror of the class-1 one only up to ~1e-8
# relative in its points (measured effect on CE_p^p: 4e-9), so the docstring identity is
# checked at 1e-7; each side is checked against the reference at RTOL.
MIRROR_RTOL = 1e-7


@pytest.mark.parametrize("p", [1, 2, 3], ids=["p1", "p2", "p3"])
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("name", ["syn-K2vec-n80", "real-pneumonia-K2"])
def test_binary_input_canonical_is_twice_classwise(kd, name, bandwidth, p):
    """(n,) input: canonical K = 2 CE_p^p = 2 x class-wise CE_p^p (the docstring relation)."""
    d = get_data(name)
    q = d.probs if d.probs.ndim == 1 else d.probs[:, 1].copy()
    kw = {"p": p, "bandwidth": bandwidth, "debias": "none"}
    can = kd.ece_kde(q, d.labels, calibration="canonical", **kw)
    cw = kd.ece_kde(q, d.labels, calibration="classwise", **kw)
    assert_scalar(can**p, 2.0 * cw**p, rtol=MIRROR_RTOL, what="canonical^p vs 2 classwise^p")
    _, problems = ref.ref_notion_estimates(q, d.labels, "classwise", bandwidth)
    want = ref.ref_notion_quantity(f"ece_p{p}", problems, "classwise", "none")[0]
    assert_scalar(cw, want, rtol=RTOL, what="classwise vs reference")
    _, problems = ref.ref_notion_estimates(q, d.labels, "canonical", bandwidth)
    want = ref.ref_notion_quantity(f"ece_p{p}", problems, "canonical", "none")[0]
    assert_scalar(can, want, rtol=RTOL, what="canonical vs reference")


# ------------------------------------------------------------------ evaluate
@pytest.mark.parametrize("debias", ref.DEBIAS_MODES)
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
@pytest.mark.parametrize("calibration", NOTIONS)
def test_evaluate_fields(kd, calibration, bandwidth, debias):
    """evaluate(calibration=, debias=) fields = the individual functions = the reference."""
    ds = get_data("syn-K3-n150")
    h, problems = ref.ref_notion_estimates(
        ds.probs,
        ds.labels,
        calibration,
        bandwidth,
        debias,
        **formulas(debias),
    )
    kw = {"bandwidth": bandwidth, "calibration": calibration, "debias": debias}
    neg = ref.ref_notion_ce_pp(problems, calibration, 2) < 0
    n_deg = int(sum(p["degenerate"].sum() for p in problems))
    n_rows = sum(p["degenerate"].size for p in problems)
    with expect_warnings(n_deg, n_rows, neg):
        report = kd.evaluate(ds.probs, ds.labels, n_resamples=0, notions=(), **kw)
    assert report.calibration == calibration and report.debias == debias
    assert report.bandwidth == h
    assert report.bandwidth_rule == ("fixed" if isinstance(bandwidth, float) else bandwidth)
    assert report.notions == {} and report.notes == []
    assert isinstance(report.calibration_loss, float) and np.isfinite(report.calibration_loss)
    assert report.n == ds.n and report.n_classes == ds.K
    atol = SCALAR_ATOL + ref.ref_debias_atol(problems)
    for field, quantity in ref.REPORT_FIELDS.items():
        expected = ref.ref_notion_quantity(quantity, problems, calibration, debias)[0]
        with expect_warnings(n_deg, n_rows, quantity == "ece_p2" and neg):
            single = ref.call_quantity(kd, quantity, ds.probs, ds.labels, **kw)
        value = getattr(report, field)
        assert_scalar(value, expected, rtol=RTOL, atol=atol, what=field)
        assert_scalar(value, single, rtol=1e-12, what=f"{field} vs function")
    # notion-independent context fields
    assert_scalar(report.accuracy, ref.ref_accuracy(ds.probs, ds.labels), rtol=1e-12)
    assert_scalar(report.log_loss, ref.ref_log_loss(ds.probs, ds.labels), rtol=1e-12)
    assert_scalar(report.brier_score, ref.ref_brier(ds.probs, ds.labels), rtol=1e-12)
    assert_scalar(report.ece_binned, ref.ref_ece_binned(ds.probs, ds.labels), rtol=1e-12)


def test_default_calibration_is_canonical(kd, syn_k3):
    """calibration defaults to "canonical" (the existing reference of test_reference.py)."""
    got = kd.ece_kde(syn_k3.probs, syn_k3.labels, bandwidth=0.05)
    assert_scalar(got, ref.ref_ece_kde(syn_k3.probs, syn_k3.labels, 1, 0.05), rtol=RTOL)
    report = kd.evaluate(syn_k3.probs, syn_k3.labels, bandwidth=0.05, n_resamples=0)
    assert report.calibration == "canonical"


def test_absent_class_classwise_sharpness_kl(kd):
    """A class that never occurs has frequency 0: F(0) = 0 log 0 + 1 log 1 = 0 (finite)."""
    ds = get_data("syn-K4-absentclass-n100")
    assert not np.any(ds.labels == 3)
    _, problems = ref.ref_notion_estimates(ds.probs, ds.labels, "classwise", 0.05)
    got = kd.sharpness(ds.probs, ds.labels, bandwidth=0.05, calibration="classwise")
    want = ref.ref_notion_sharpness(problems, "classwise", "kl", "none")
    assert np.isfinite(want) and want > SCALAR_ATOL
    assert_scalar(got, want, rtol=RTOL)


# ------------------------------------------------------------------ bad input
CALLS = {
    "ece_kde": lambda kd, P, y, **kw: kd.ece_kde(P, y, bandwidth=0.1, **kw),
    "calibration_error": lambda kd, P, y, **kw: kd.calibration_error(P, y, bandwidth=0.1, **kw),
    "refinement": lambda kd, P, y, **kw: kd.refinement(P, y, bandwidth=0.1, **kw),
    "sharpness": lambda kd, P, y, **kw: kd.sharpness(P, y, bandwidth=0.1, **kw),
    "evaluate": lambda kd, P, y, **kw: kd.evaluate(P, y, bandwidth=0.1, **kw),
}


@pytest.mark.parametrize("value", ["bogus", "top-label", "Canonical", None, 1], ids=repr)
@pytest.mark.parametrize("fn", list(CALLS))
def test_bad_calibration(kd, syn_k3, fn, value):
    """An unknown calibration raises ValueError naming the argument (and the value)."""
    with pytest.raises(ValueError, match="calibration") as info:
        CALLS[fn](kd, syn_k3.probs, syn_k3.labels, calibration=value)
    assert repr(value) in str(info.value)
