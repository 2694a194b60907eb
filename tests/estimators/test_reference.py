"""Every public kdecal function against the float64 brute-force reference.

Datasets: conftest (synthetic K = 2, 2-as-vector, 3, 4-with-absent-class, 10;
real K = 2 (x3), 10, 100; n <= 400).  Backends: cpp and numba (each skipped if
unavailable), plus backend="auto" once.  float64 tolerance: rtol64(h) (1e-9 for
h >= 1e-4) with a 1e-13 absolute floor for scalars; float32 tolerances: see
_helpers.py (measured, documented there).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import gammaln

import _reference as ref
from _helpers import (
    E_ATOL,
    F32_BANDWIDTHS,
    F32_E_ATOL,
    F32_RTOL,
    LL_ATOL,
    assert_close,
    assert_scalar,
    assert_simplex_rows,
    auto_bandwidth,
    bw_id,
    record_warnings,
    resolve_bw,
    rtol64,
)
from conftest import dataset_or_skip as _get
from conftest import load_real_file, real_file

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

# "loo-mle" is kdecal's LOO-likelihood rule = the reference's ref_select_bandwidth
# (resolve_bw); kdecal calls pass debias="none", the reference's plain plug-in.
BANDWIDTHS = [1e-3, 0.05, 0.5, "loo-mle"]
BW_IDS = [bw_id(b) for b in BANDWIDTHS]


@pytest.fixture(scope="module")
def kd(kdecal_module):
    """Return the kdecal module."""
    return kdecal_module


# ------------------------------------------------------------------ softmax
class TestSoftmax:
    """kdecal.softmax vs the reference."""

    @pytest.mark.parametrize("scale", [1.0, 30.0], ids=["scale1", "scale30"])
    @pytest.mark.parametrize("K", [2, 10, 100], ids=["K2", "K10", "K100"])
    def test_matches_reference(self, kd, K, scale):
        """Check softmax against the reference."""
        X = np.random.default_rng(K).normal(size=(50, K)) * scale
        P = kd.softmax(X)
        assert_close(P, ref.ref_softmax(X), rtol=1e-12, atol=1e-300, what="softmax")
        assert_close(P.sum(axis=-1), np.ones(50), rtol=0, atol=1e-14, what="row sums")

    def test_shift_invariant_no_overflow(self, kd):
        """Check that softmax(x + 1e4) does not overflow."""
        X = np.random.default_rng(0).normal(size=(20, 5)) * 10
        P = kd.softmax(X + 1e4)  # naive exp overflows
        assert_close(P, ref.ref_softmax(X), rtol=1e-9, atol=1e-300, what="softmax(x + 1e4)")

    def test_axis0(self, kd):
        """Check softmax along axis 0."""
        X = np.random.default_rng(1).normal(size=(7, 4)) * 5
        assert_close(kd.softmax(X, axis=0), ref.ref_softmax(X, axis=0), rtol=1e-12, what="axis=0")

    @pytest.mark.parametrize(
        "fname",
        [
            "pneumoniamnist_resnet50.npz",
            # no stated licence, so not in tests/data
            pytest.param("cifar100_resnet20_chenyaofo.npz", marks=pytest.mark.realdata),
        ],
    )
    def test_real_logits(self, kd, fname):
        """Check softmax of real logits."""
        with np.load(real_file(fname)) as d:
            X = d["logits"].astype(np.float64)
        assert_close(
            kd.softmax(X),
            ref.ref_softmax(X),
            rtol=1e-12,
            atol=1e-300,
            what="softmax real",
        )


# -------------------------------------------------------- conditional expectation
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
def test_conditional_expectation(kd, dataset, bandwidth, backend):
    """conditional_expectation matches the reference."""
    h = resolve_bw(dataset, bandwidth)
    E = kd.conditional_expectation(
        dataset.probs, dataset.labels, bandwidth=bandwidth, backend=backend
    )
    assert isinstance(E, np.ndarray) and E.dtype == np.float64
    assert E.shape == (dataset.n, dataset.K)
    E_ref = ref.ref_conditional_expectation(dataset.probs, dataset.labels, h)
    assert_close(E, E_ref, rtol=rtol64(h), atol=E_ATOL, what=f"E {dataset.name} h={h}")
    assert_simplex_rows(E)


# ------------------------------------------------------------------ ece_kde
@pytest.mark.parametrize("p", [1, 2], ids=["p1", "p2"])
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
def test_ece_kde(kd, dataset, bandwidth, p, backend):
    """ece_kde (p = 1, 2) matches the reference."""
    h = resolve_bw(dataset, bandwidth)
    got = kd.ece_kde(
        dataset.probs, dataset.labels, p=p, bandwidth=bandwidth, debias="none", backend=backend
    )
    want = ref.ref_ece_kde(dataset.probs, dataset.labels, p=p, bandwidth=h)
    assert want > 0
    assert_scalar(got, want, rtol=rtol64(h), what=f"ece_kde p={p} {dataset.name} h={h}")


@pytest.mark.parametrize("p", [1.5, 3], ids=["p1.5", "p3"])
def test_ece_kde_other_p(kd, dataset, p, backend):
    """ece_kde with non-integer / larger p matches the reference."""
    h = 0.05
    got = kd.ece_kde(
        dataset.probs, dataset.labels, p=p, bandwidth=h, debias="none", backend=backend
    )
    assert_scalar(got, ref.ref_ece_kde(dataset.probs, dataset.labels, p=p, bandwidth=h), rtol=1e-9)


def test_ece_kde_default_bandwidth_is_auto(kd, dataset):
    """ece_kde defaults: p = 1, bandwidth = 'auto' (select_bandwidth with labels), ustat."""
    # on some real datasets (n = 300) "auto" picks an end of its range (h = 1, or
    # h = 1e-5 where "ustat" also warns about degenerate rows) and warns
    h, expect_warning = auto_bandwidth(kd, dataset.probs, dataset.labels)
    explicit, warned = record_warnings(
        kd.ece_kde, dataset.probs, dataset.labels, p=1, bandwidth=h, debias="ustat"
    )
    with expect_warning(*warned):
        got = kd.ece_kde(dataset.probs, dataset.labels)  # p=1, bandwidth="auto", backend="auto"
    assert_scalar(got, explicit, rtol=1e-12, what="ece_kde defaults vs explicit")
    # "ustat" only changes p = 2 quantities: p = 1 is the plain plug-in at h
    assert_scalar(
        got,
        ref.ref_ece_kde(dataset.probs, dataset.labels, p=1, bandwidth=h),
        rtol=rtol64(h),
    )
    # the default debias ("ustat") shows at p = 2
    explicit2, warned2 = record_warnings(
        kd.ece_kde, dataset.probs, dataset.labels, p=2, bandwidth=h, debias="ustat"
    )
    with expect_warning(*warned2):
        got2 = kd.ece_kde(dataset.probs, dataset.labels, p=2)
    assert_scalar(got2, explicit2, rtol=1e-12, what="ece_kde p=2 defaults vs explicit")


# ------------------------------------------------------------ calibration_error
@pytest.mark.parametrize("estimator", ["direct", "refinement"])
@pytest.mark.parametrize("divergence", ["kl", "l2"])
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
def test_calibration_error(kd, dataset, bandwidth, divergence, estimator, backend):
    """calibration_error (kl/l2, direct/refinement) matches the reference."""
    h = resolve_bw(dataset, bandwidth)
    got = kd.calibration_error(
        dataset.probs,
        dataset.labels,
        divergence=divergence,
        bandwidth=bandwidth,
        estimator=estimator,
        debias="none",
        backend=backend,
    )
    want = ref.ref_calibration_error(dataset.probs, dataset.labels, divergence, h, estimator)
    assert_scalar(
        got,
        want,
        rtol=rtol64(h),
        what=f"CE {divergence}/{estimator} {dataset.name} h={h}",
    )


def test_calibration_error_defaults_kl_direct_auto(kd, dataset):
    """calibration_error defaults: kl, direct, 'auto' (for KL: select_bandwidth with labels
    and the log risk), ustat."""
    h, expect_warning = auto_bandwidth(kd, dataset.probs, dataset.labels, criterion="log")
    explicit, warned = record_warnings(
        kd.calibration_error,
        dataset.probs,
        dataset.labels,
        divergence="kl",
        bandwidth=h,
        estimator="direct",
        debias="ustat",
    )
    with expect_warning(*warned):
        got = kd.calibration_error(dataset.probs, dataset.labels)
    assert_scalar(got, explicit, rtol=1e-12, what="calibration_error defaults vs explicit")
    # "ustat" leaves the KL quantities unchanged: the plain plug-in at h
    want = ref.ref_calibration_error(dataset.probs, dataset.labels, "kl", h, "direct")
    assert_scalar(got, want, rtol=rtol64(h))


# ---- custom Bregman generators (F: (n, K) -> (n,), grad_F: (n, K) -> (n, K))
def _F_sq(X):
    return np.sum(np.asarray(X) ** 2, axis=-1)


def _g_sq(X):
    return 2.0 * np.asarray(X)


def _F_negent(X):
    X = np.asarray(X, dtype=np.float64)
    return np.sum(np.where(X > 0, X * np.log(np.where(X > 0, X, 1.0)), 0.0), axis=-1)


def _g_negent(X):
    return np.log(np.asarray(X, dtype=np.float64)) + 1.0


def _F_exp(X):  # not a built-in divergence
    return np.sum(np.exp(np.asarray(X, dtype=np.float64)), axis=-1)


def _g_exp(X):
    return np.exp(np.asarray(X, dtype=np.float64))


CUSTOM = {
    "sq": (_F_sq, _g_sq),
    "negentropy": (_F_negent, _g_negent),
    "sumexp": (_F_exp, _g_exp),
}
BUILTIN_EQUIV = {"sq": "l2", "negentropy": "kl"}


@pytest.mark.parametrize("estimator", ["direct", "refinement"])
@pytest.mark.parametrize("gen", list(CUSTOM), ids=list(CUSTOM))
@pytest.mark.parametrize("name", ["syn-K3-n150", "syn-K2vec-n80", "real-vgg16-K10"])
def test_calibration_error_custom_bregman(kd, name, gen, estimator, backend):
    """A user Bregman(F, grad_F) matches the reference (and the built-ins)."""
    ds = _get(name)
    F, gF = CUSTOM[gen]
    h = 0.05
    got = kd.calibration_error(
        ds.probs,
        ds.labels,
        divergence=kd.Bregman(F, gF, name=gen),
        bandwidth=h,
        estimator=estimator,
        backend=backend,
    )
    want = ref.ref_calibration_error(ds.probs, ds.labels, (F, gF), h, estimator)
    assert_scalar(got, want, rtol=1e-9, what=f"Bregman({gen}) {estimator}")
    if gen in BUILTIN_EQUIV:  # same generator as a built-in -> same number
        builtin = ref.ref_calibration_error(ds.probs, ds.labels, BUILTIN_EQUIV[gen], h, estimator)
        assert_scalar(
            got,
            builtin,
            rtol=1e-9,
            atol=1e-12,
            what=f"Bregman({gen}) vs {BUILTIN_EQUIV[gen]}",
        )


def test_custom_bregman_non_finite_values_are_refused():
    """A generator that is not finite on the simplex gave a silent NaN estimate."""
    import kdecal

    s = kdecal.datasets.make_seeds_synthetic(60, 3, t1=0.6, t2=0.8, seed=0)
    with np.errstate(all="ignore"):
        bad_F = kdecal.Bregman(lambda q: np.sum(np.log(q - 0.5), -1), lambda q: 1 / (q - 0.5))
        with pytest.raises(
            ValueError,
            match=r"Bregman F returned non-finite values at 60 of 60 points, the first nan at the point \[0\.",
        ) as info:
            kdecal.calibration_error(s.probs, s.labels, divergence=bad_F, bandwidth=0.1)
        assert "must be finite on the probability simplex" in str(info.value)
        bad_g = kdecal.Bregman(lambda q: np.sum(q**2, -1), lambda q: 1 / (q - q))
        with pytest.raises(ValueError, match="Bregman grad_F returned non-finite values"):
            kdecal.calibration_error(s.probs, s.labels, divergence=bad_g, bandwidth=0.1)
    # text or complex values named by the function (a bare "could not convert string")
    text_F = kdecal.Bregman(lambda q: np.full(len(q), "x"), lambda q: 2 * q)
    with pytest.raises(TypeError, match=r"Bregman F must return real numbers, got dtype <U1"):
        kdecal.calibration_error(s.probs, s.labels, divergence=text_F, bandwidth=0.1)
    complex_g = kdecal.Bregman(lambda q: np.sum(q**2, -1), lambda q: (2 * q).astype(complex))
    with pytest.raises(TypeError, match=r"Bregman grad_F must return real numbers"):
        kdecal.calibration_error(s.probs, s.labels, divergence=complex_g, bandwidth=0.1)
    # Python floats in an object array (np.frompyfunc) are numbers
    square = np.frompyfunc(lambda v: v * v, 1, 1)
    objects = kdecal.Bregman(lambda q: square(q).sum(axis=1), lambda q: 2 * q)
    plain = kdecal.Bregman(lambda q: np.sum(q**2, -1), lambda q: 2 * q)
    assert kdecal.calibration_error(
        s.probs, s.labels, divergence=objects, bandwidth=0.1
    ) == pytest.approx(
        kdecal.calibration_error(s.probs, s.labels, divergence=plain, bandwidth=0.1), rel=1e-12
    )


# ------------------------------------------------------- refinement / sharpness
@pytest.mark.parametrize("divergence", ["kl", "l2"])
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
def test_refinement(kd, dataset, bandwidth, divergence, backend):
    """Check refinement against the reference."""
    h = resolve_bw(dataset, bandwidth)
    got = kd.refinement(
        dataset.probs,
        dataset.labels,
        divergence=divergence,
        bandwidth=bandwidth,
        debias="none",
        backend=backend,
    )
    want = ref.ref_refinement(dataset.probs, dataset.labels, divergence, h)
    assert_scalar(got, want, rtol=rtol64(h), what=f"refinement {divergence} {dataset.name} h={h}")


@pytest.mark.parametrize("divergence", ["kl", "l2"])
@pytest.mark.parametrize("bandwidth", BANDWIDTHS, ids=BW_IDS)
def test_sharpness(kd, dataset, bandwidth, divergence, backend):
    """Check sharpness against the reference."""
    h = resolve_bw(dataset, bandwidth)
    got = kd.sharpness(
        dataset.probs,
        dataset.labels,
        divergence=divergence,
        bandwidth=bandwidth,
        debias="none",
        backend=backend,
    )
    want = ref.ref_sharpness(dataset.probs, dataset.labels, divergence, h)
    assert_scalar(got, want, rtol=rtol64(h), what=f"sharpness {divergence} {dataset.name} h={h}")


@pytest.mark.parametrize("gen", list(CUSTOM), ids=list(CUSTOM))
def test_refinement_sharpness_custom_bregman(kd, syn_k3, gen, backend):
    """Check refinement / sharpness with a user Bregman generator."""
    F, gF = CUSTOM[gen]
    div = kd.Bregman(F, gF)
    got_r = kd.refinement(
        syn_k3.probs, syn_k3.labels, divergence=div, bandwidth=0.1, backend=backend
    )
    got_s = kd.sharpness(
        syn_k3.probs, syn_k3.labels, divergence=div, bandwidth=0.1, backend=backend
    )
    assert_scalar(got_r, ref.ref_refinement(syn_k3.probs, syn_k3.labels, (F, gF), 0.1), rtol=1e-9)
    assert_scalar(got_s, ref.ref_sharpness(syn_k3.probs, syn_k3.labels, (F, gF), 0.1), rtol=1e-9)


# ------------------------------------------------------ bandwidth selection
def test_loo_log_likelihood_default_grid(kd, dataset, backend):
    """loo_log_likelihood on the 55-value grid matches the reference."""
    grid = ref.DEFAULT_GRID
    got = kd.loo_log_likelihood(dataset.probs, grid, backend=backend)
    assert isinstance(got, np.ndarray) and got.shape == (len(grid),) and got.dtype == np.float64
    want = ref.ref_loo_log_likelihood(dataset.probs, grid)
    rt = np.array([rtol64(h) for h in grid])
    # The log density is lgamma(1/h + D) plus the centres' biases -sum_k lgamma(p_ik/h + 1)
    # plus ...: at small h, terms of size lgamma(1/h + D) (1.6e5 at h = 5e-5) cancel to a
    # value near 0, so two correct implementations whose lgamma round differently (the
    # engine's own and SciPy's, each within 2 ulp at these large arguments) differ by a
    # few ulp of that size (measured: up to 2.3 on real-adrenal-K2).
    D = dataset.probs.shape[1] if dataset.probs.ndim == 2 else 2  # a binary vector: D = 2
    floor = 8 * np.finfo(float).eps * gammaln(1.0 / grid + D)
    err = np.abs(got - want)
    bad = err > rt * np.abs(want) + LL_ATOL + floor
    assert not bad.any(), f"loo-LL mismatch at h={grid[bad]}: got {got[bad]}, want {want[bad]}"


@pytest.mark.parametrize("bandwidths", [[0.3], [1.0, 1e-3, 0.02]], ids=["single", "unsorted3"])
def test_loo_log_likelihood_custom_bandwidths(kd, dataset, bandwidths, backend):
    """loo_log_likelihood keeps the order of the bandwidths given."""
    got = kd.loo_log_likelihood(dataset.probs, np.array(bandwidths), backend=backend)
    want = ref.ref_loo_log_likelihood(dataset.probs, bandwidths)
    assert_close(got, want, rtol=rtol64(min(bandwidths)), atol=LL_ATOL, what="loo-LL")


def test_select_bandwidth_default_grid(kd, dataset, backend):
    """select_bandwidth picks the reference's grid value."""
    got = kd.select_bandwidth(dataset.probs, backend=backend)
    assert float(got) in set(ref.DEFAULT_GRID.tolist())
    # the reference's top-2 LOO-LL gap is >= 6e-4 relative on every fixture
    # dataset, so the argmax is not a rounding-level tie
    assert float(got) == dataset.ref_bandwidth


def test_select_bandwidth_custom_grid(kd, dataset, backend):
    """select_bandwidth over a user grid."""
    grid = [0.4, 0.003, 0.05, 0.01, 1.0]
    got = kd.select_bandwidth(dataset.probs, grid=grid, backend=backend)
    assert float(got) == ref.ref_select_bandwidth(dataset.probs, grid)


def test_default_grid_matches_spec(kd, real_k10, backend):
    """grid=None is the spec's default grid."""
    # grid=None must behave as the spec's 55-value grid
    a = kd.select_bandwidth(real_k10.probs, backend=backend)
    b = kd.select_bandwidth(real_k10.probs, grid=ref.DEFAULT_GRID, backend=backend)
    assert float(a) == float(b) == real_k10.ref_bandwidth


# ----------------------------------------------------------------- evaluate
REPORT_FLOAT_FIELDS = [
    "ece_kde_l1",
    "ece_kde_l2",
    "ce_kl",
    "ce_l2",
    "refinement_kl",
    "refinement_l2",
    "sharpness_kl",
    "sharpness_l2",
    "accuracy",
    "log_loss",
    "brier_score",
    "ece_binned",
]


@pytest.mark.parametrize("bandwidth", [0.05, "loo-mle"], ids=["h=0.05", "loo-mle"])
def test_evaluate(kd, dataset, bandwidth, backend):
    """Every CalibrationReport field matches the reference."""
    h = resolve_bw(dataset, bandwidth)
    rep = kd.evaluate(
        dataset.probs,
        dataset.labels,
        bandwidth=bandwidth,
        calibration="canonical",  # the reference's notion at every K
        debias="none",
        backend=backend,
        n_resamples=0,
    )
    want = ref.ref_evaluate(dataset.probs, dataset.labels, h)
    assert rep.n == want["n"] and rep.n_classes == want["n_classes"]
    assert float(rep.bandwidth) == h
    assert rep.bandwidth_rule == ("fixed" if bandwidth == 0.05 else "loo-mle")
    assert rep.debias == "none"
    assert rep.backend == backend
    assert isinstance(rep.wall_time_s, float) and rep.wall_time_s >= 0.0
    for f in REPORT_FLOAT_FIELDS:
        assert_scalar(getattr(rep, f), want[f], rtol=rtol64(h), what=f"report.{f} {dataset.name}")


def _bin_edge_rows():
    """Return K = 3 rows whose top probability lies exactly on a bin edge.

    The top probability c = k/15 has c * 15 == k exactly and the entries sum
    to exactly 1.0 in every summation order (so clip + renormalise, however
    implemented, leaves c on the bin edge).
    """
    rows = []
    for k in range(6, 15):
        c = k / 15
        for s in (0.05, 0.1, 0.15, 0.2):
            r = [c, s, 1.0 - c - s]
            if not (0 < r[2] < c and s < c and c * 15 == k):
                continue
            if all((r[a] + r[b]) + r[d] == 1.0 for a, b, d in itertools.permutations(range(3))):
                rows.append(np.roll(r, len(rows) % 3))
    return np.array(rows)


def test_evaluate_binned_ece_bin_edges(kd, backend):
    """Confidences exactly on bin edges (conf * 15 integral): bin = ceil(conf*15) - 1."""
    edge = _bin_edge_rows()
    m = edge.shape[0]
    assert m >= 20
    assert np.array_equal(ref.ref_clip(edge).max(axis=1), edge.max(axis=1))
    # off-edge rows just below (all correct) and just above (all wrong) each edge,
    # so that the bin an edge row falls into changes the binned accuracy
    ks = np.unique(np.round(edge.max(axis=1) * 15)).astype(int)
    below = np.array(
        [[k / 15 - 0.02, (1 - k / 15 + 0.02) / 2, (1 - k / 15 + 0.02) / 2] for k in ks]
    )
    above = np.array(
        [[k / 15 + 0.02, (1 - k / 15 - 0.02) / 2, (1 - k / 15 - 0.02) / 2] for k in ks]
    )
    P = np.vstack([edge, below, above])
    y = np.concatenate(
        [
            edge.argmax(axis=1) * (np.arange(m) % 2 == 0)
            + (edge.argmax(axis=1) + 1) % 3 * (np.arange(m) % 2 == 1),
            np.zeros(len(ks), int),
            np.ones(len(ks), int),
        ]
    )
    conf = P.max(axis=1)
    want = ref.ref_ece_binned(P, y)
    # the floor(conf*15) convention would give a different number on this data
    bins_floor = np.clip(np.floor(conf * 15).astype(int), 0, 14)
    correct = P.argmax(axis=1) == y
    floor_val = sum(
        np.mean(bins_floor == b)
        * abs(correct[bins_floor == b].mean() - conf[bins_floor == b].mean())
        for b in range(15)
        if np.any(bins_floor == b)
    )
    assert abs(floor_val - want) > 1e-3
    rep = kd.evaluate(P, y, bandwidth=0.1, backend=backend, n_resamples=0)
    assert_scalar(rep.ece_binned, want, rtol=1e-12, what="ece_binned on bin edges")
    assert_scalar(rep.accuracy, ref.ref_accuracy(P, y), rtol=0, atol=1e-15)


def test_evaluate_full_vgg16_binned_ece(kd):
    """Full 10,000-row file: binned ECE equals the README's ECE15 = 3.98 %.

    The KDE part runs on n = 10,000 at a fixed h = 0.1 (one O(n^2 K) pass,
    ~0.1 s with the cpp backend); the reference itself is checked in
    test_reference_selfcheck.
    """
    P64, _, y = load_real_file("cifar10_vgg16_keras_verifiedcal.npz", "", "probs")
    rep = kd.evaluate(P64, y, bandwidth=0.1, n_resamples=0, notions=())
    assert rep.n == 10000 and rep.n_classes == 10
    assert_scalar(rep.ece_binned, ref.ref_ece_binned(P64, y), rtol=1e-9, atol=1e-12)
    assert round(100 * rep.ece_binned, 2) == 3.98  # fraction, README gives %
    assert_scalar(rep.accuracy, 0.9359, rtol=0, atol=1e-12)
    assert_scalar(rep.log_loss, ref.ref_log_loss(P64, y), rtol=1e-9)
    assert_scalar(rep.brier_score, ref.ref_brier(P64, y), rtol=1e-9)


# ------------------------------------------------------- binary convention
@pytest.mark.parametrize("name", ["syn-K2vec-n80", "real-pneumonia-K2"])
def test_binary_vector_equals_two_columns(kd, name, backend):
    """(n,) binary probs give the same numbers as (n, 2)."""
    ds = _get(name)
    p = ds.probs if ds.probs.ndim == 1 else ds.probs[:, 1].copy()
    P2 = np.stack([1.0 - p, p], axis=1)
    h = 0.05
    E1 = kd.conditional_expectation(p, ds.labels, bandwidth=h, backend=backend)
    E2 = kd.conditional_expectation(P2, ds.labels, bandwidth=h, backend=backend)
    assert E1.shape == (ds.n, 2)
    assert_close(E1, E2, rtol=1e-12, atol=1e-300, what="(n,) vs (n,2)")
    assert_close(E1, ref.ref_conditional_expectation(p, ds.labels, h), rtol=1e-9, atol=E_ATOL)
    for fn in ("ece_kde", "calibration_error", "refinement", "sharpness"):
        a = getattr(kd, fn)(p, ds.labels, bandwidth=h, backend=backend)
        b = getattr(kd, fn)(P2, ds.labels, bandwidth=h, backend=backend)
        assert_scalar(a, b, rtol=1e-12, what=fn)
    assert_close(
        kd.loo_log_likelihood(p, [h], backend=backend),
        ref.ref_loo_log_likelihood(p, [h]),
        rtol=1e-9,
        atol=LL_ATOL,
    )


# -------------------------------------------------------------- float32 input
@pytest.mark.parametrize("bandwidth", F32_BANDWIDTHS, ids=[bw_id(b) for b in F32_BANDWIDTHS])
def test_float32_input(kd, dataset, bandwidth, backend):
    """float32 probs: G is computed in float32 (spec), so only ~1e-5 accuracy.

    Reference = float64 computation on the same float32 values.  Bounds from the
    float32 simulation in _helpers.py (observed: scalars <= 3.8e-6 rel, E <= 1.7e-5
    abs, LOO-LL <= 1.2e-5 rel for h >= 1e-2).
    """
    P32 = dataset.probs32
    assert P32.dtype == np.float32
    P = P32.astype(np.float64)
    y = dataset.labels
    h = bandwidth
    E = kd.conditional_expectation(P32, y, bandwidth=h, backend=backend)
    assert E.dtype == np.float64
    assert_close(
        E,
        ref.ref_conditional_expectation(P, y, h),
        rtol=0,
        atol=F32_E_ATOL,
        what="E f32",
    )
    assert_simplex_rows(E, atol=1e-6)
    for p in (1, 2):
        assert_scalar(
            kd.ece_kde(P32, y, p=p, bandwidth=h, debias="none", backend=backend),
            ref.ref_ece_kde(P, y, p=p, bandwidth=h),
            rtol=F32_RTOL,
            atol=1e-7,
            what=f"ece p={p} f32",
        )
    for div in ("kl", "l2"):
        for est in ("direct", "refinement"):
            assert_scalar(
                kd.calibration_error(
                    P32,
                    y,
                    divergence=div,
                    bandwidth=h,
                    estimator=est,
                    debias="none",
                    backend=backend,
                ),
                ref.ref_calibration_error(P, y, div, h, est),
                rtol=F32_RTOL,
                atol=1e-7,
                what=f"CE {div}/{est} f32",
            )
        assert_scalar(
            kd.refinement(P32, y, divergence=div, bandwidth=h, debias="none", backend=backend),
            ref.ref_refinement(P, y, div, h),
            rtol=F32_RTOL,
            atol=1e-7,
            what=f"refinement {div} f32",
        )
        assert_scalar(
            kd.sharpness(P32, y, divergence=div, bandwidth=h, debias="none", backend=backend),
            ref.ref_sharpness(P, y, div, h),
            rtol=F32_RTOL,
            atol=1e-7,
            what=f"sharpness {div} f32",
        )
    assert_close(
        kd.loo_log_likelihood(P32, [h], backend=backend),
        ref.ref_loo_log_likelihood(P, [h]),
        rtol=F32_RTOL,
        atol=1e-6,
        what="loo-LL f32",
    )
