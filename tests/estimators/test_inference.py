"""Statistics users can rely on (issue 26): one rule for squared errors, small n, bounded
resampling, and comparisons at one common bandwidth.

Every number is checked against an independent computation: the squared errors against
the brute-force reference, bootstrap replicates of a 4-row sample against a float64
brute force over every possible resample (enumerated exactly), the pooled bandwidth
against the brute-force leave-one-out risk, and compare's values against separate
estimator calls.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
import re
import tracemalloc
import warnings
from collections import Counter

import numpy as np
import pytest

import _reference as ref
import kdecal
import kdecal._evaluate
from kdecal import binned, datasets, scores
from kdecal._calibration_estimate import ResamplingError, bootstrap_counts
from kdecal._engine import backends as _backends
from kdecal._estimation import replicates as _replicates
from kdecal._report import _format_value
from kdecal._validation import check_probs
from kdecal.cli import main
from kdecal.datasets import make_seeds_synthetic, temperature_scale


def _calibrated(n=300, K=3, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), size=n)
    y = np.array([rng.choice(K, p=row) for row in P])
    return P, y


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        return fn(*args, **kwargs)


# ------------------------------------------------------------- one rule for squared errors


@pytest.mark.usefixtures("plugin_estimator")
@pytest.mark.parametrize("calibration", ["canonical", "classwise", "top_label"])
def test_squared_errors_one_value_everywhere(calibration):
    """Issue 26: on 300 calibrated rows at h = 0.01 the debiased squared L2 CE is about
    -0.0043; ``ece_kde(p=2)`` returned 0 with a warning, ``evaluate`` printed ce_l2
    -0.004295 beside ece_kde_l2 0.000000. Now: the unclipped value everywhere (API,
    estimate, report, JSON, notion row), its signed root as the L2 ECE^KDE, a note."""
    P, y = _calibrated()
    h = 0.01
    _, problems = ref.ref_notion_estimates(P, y, calibration, h, "ustat")
    want = ref.ref_notion_ce_pp(problems, calibration, 2)
    assert want < 0  # the precondition: an unbiased estimate below 0
    kw = {"bandwidth": h, "calibration": calibration}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "returning 0" warning any more
        v = kdecal.calibration_error(P, y, divergence="l2", **kw)
        e2 = kdecal.ece_kde(P, y, p=2, **kw)
    assert v == pytest.approx(want, rel=1e-9)
    assert e2 == pytest.approx(-math.sqrt(-want), rel=1e-9)
    assert -(e2**2) == pytest.approx(v, rel=1e-14)
    est = kdecal.estimate(P, y, **kw)
    assert est.value("ce_l2") == v and est.ece_kde(2) == e2
    rep = _quiet(kdecal.evaluate, P, y, notions=(calibration,), n_resamples=0, **kw)
    d = json.loads(json.dumps(rep.to_dict()))
    assert rep.ce_l2 == d["ce_l2"] == d["notions"][calibration]["ce_l2"] == v
    assert rep.ece_kde_l2 == d["ece_kde_l2"] == e2
    assert any("indistinguishable from 0" in note for note in rep.notes)
    assert _format_value(e2) in str(rep) and _format_value(v) in str(rep)


# ----------------------------------------------------------------------------- small n


def _small_n_calls():
    yield "evaluate", lambda P, y: kdecal.evaluate(P, y, n_resamples=20)
    yield "interval", lambda P, y: kdecal.estimate(P, y).confidence_intervals(n_resamples=20)
    yield "test", lambda P, y: kdecal.calibration_test(P, y, n_resamples=20)
    yield "compare", lambda P, y: kdecal.compare([P, P[:, ::-1]], y, n_resamples=20)
    for c in ("canonical", "classwise", "top_label"):
        yield f"ece_kde {c}", lambda P, y, c=c: kdecal.ece_kde(P, y, calibration=c)
        yield f"kl {c}", lambda P, y, c=c: kdecal.calibration_error(P, y, calibration=c)
    yield "loo-mle", lambda P, y: kdecal.ece_kde(P, y, bandwidth="loo-mle")
    yield "sharpness", lambda P, y: kdecal.sharpness(P, y)
    yield "binned", lambda P, y: binned.ece(P, y)
    yield "log_loss", lambda P, y: scores.log_loss(P, y)
    yield "calibration_loss", lambda P, y: scores.calibration_loss(P, y)
    yield (
        "bootstrap_ci",
        lambda P, y: scores.bootstrap_ci(binned.ece, P, y, n_boot=5),
    )


def test_small_n_works_or_raises_one_clear_error():
    """n = 3 .. 10, with a class of one row: every call returns finite numbers or raises
    one ValueError that says what to change (a ZeroDivisionError came out of evaluate
    at n = 3; "n_folds = 5 ... use fewer folds" out of evaluate, which has no folds)."""
    rng = np.random.default_rng(0)
    clear = ("bandwidth", "n_folds", "folds", "samples")
    for n in range(3, 11):
        P = rng.dirichlet(np.ones(3), size=n)
        for y in (np.arange(n) % 3, np.r_[np.zeros(n - 1, dtype=int), 2]):
            for name, call in _small_n_calls():
                try:
                    out = _quiet(call, P, y)
                except ValueError as exc:
                    msg = str(exc)
                    assert "\n" not in msg and any(w in msg for w in clear), (name, n, msg)
                    assert name not in ("evaluate",), (n, msg)  # evaluate always works
                    continue
                if name == "evaluate":
                    assert np.isfinite(out.ce_l2) and np.isfinite(out.ece_kde_l1)
                    assert (out.calibration_loss is None) == (np.bincount(y).max() < 5)


def test_evaluate_at_n_3_and_a_bandwidth_too_small_to_resample():
    """n = 3: the estimates, no calibration loss (5 folds need 5 rows of a class), a note
    for each; h = 1e-5 at n = 6 leaves bootstrap replicates without neighbours: a note
    instead of intervals, never a crash or a NaN."""
    P = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    rep = _quiet(kdecal.evaluate, P, [0, 1, 2], n_resamples=20)
    assert rep.n == 3 and rep.calibration_loss is None
    assert any("calibration_loss skipped" in note for note in rep.notes)
    rng = np.random.default_rng(1)
    P = rng.dirichlet(np.ones(3), size=6)
    y = np.array([0, 0, 0, 0, 0, 2])
    rep = _quiet(kdecal.evaluate, P, y, bandwidth=1e-5, n_resamples=20, notions=("canonical",))
    row = rep.notions["canonical"]
    assert "resampling_skipped" in row and "ece_kde_l1_ci" not in row
    assert any("larger bandwidth" in note for note in rep.notes)
    est = _quiet(kdecal.estimate, P, y, bandwidth=1e-5)
    with pytest.raises(ResamplingError, match="pass a larger bandwidth"):
        est.confidence_interval(n_resamples=20, seed=0)


def _brute_replicate(points, labels, counts, h):
    """Plain ratio E and U-statistic squares of one bootstrap sample (multiplicities
    ``counts``, the copies of a query left out with it), from the materialised float64
    kernel; rows with one effective neighbour keep E^2 as the library does."""
    D = points.shape[1]
    W = ref.ref_loo_weights(points, h)  # (query, centre), W[j, j] = 0
    Y = ref.ref_one_hot(labels, D)
    S = (W * counts[None, :]) @ Y
    Q = (W**2 * counts[None, :] ** 2) @ Y  # the copies of a centre: one U-statistic point
    S0, Q0 = S.sum(1, keepdims=True), Q.sum(1, keepdims=True)
    E = S / S0
    den = S0 * S0 - Q0
    ok = den > ref.DEGENERATE_RTOL * S0 * S0
    sq = np.where(ok, (S * S - Q) / np.where(ok, den, 1.0), E * E)
    w = counts / counts.sum()
    l1 = np.sum(w * np.sum(np.abs(E - points), axis=1))
    l2 = np.sum(w * np.sum(sq - 2 * E * points + points * points, axis=1))
    return l1, l2


@pytest.mark.usefixtures("plugin_estimator")
def test_small_n_bootstrap_enumerated_exactly():
    """n = 4: every bootstrap sample (the 4^4 index tuples, as 35 multiplicity vectors)
    is evaluated by the library's chunked machinery and by brute force; the samples of a
    single repeated row (the estimator is undefined there) are never drawn, and the
    drawn samples follow the multinomial law conditioned on two distinct rows."""
    P = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2]])
    y = np.array([0, 1, 2, 1])
    h = 0.5
    est = kdecal.estimate(P, y, bandwidth=h)
    pts = check_probs(P).p
    prob: Counter[tuple[int, ...]] = Counter()
    for idx in itertools.product(range(4), repeat=4):
        prob[tuple(np.bincount(idx, minlength=4))] += 1
    comps = [c for c in prob if np.count_nonzero(c) >= 2]
    assert len(prob) == 35 and len(comps) == 31
    counts = np.array(comps)
    dist = {q: np.empty(len(comps)) for q in ("ece_kde_l1", "ce_l2")}
    est._bootstrap_chunk(list(dist), counts, dist, 0)
    exact = {}
    for r, c in enumerate(comps):
        l1, l2 = _brute_replicate(pts, y, counts[r].astype(float), h)
        assert dist["ece_kde_l1"][r] == pytest.approx(l1, rel=1e-10)
        assert dist["ce_l2"][r] == pytest.approx(l2, rel=1e-10, abs=1e-15)
        exact[c] = l1
    R = 3000
    drawn = bootstrap_counts(4, R, np.random.default_rng(3))
    assert np.all(np.count_nonzero(drawn, axis=1) >= 2)
    freq = Counter(tuple(c) for c in drawn)
    total = sum(prob[c] for c in comps)  # 256 - 4
    for c in comps:
        p = prob[c] / total
        assert abs(freq[c] / R - p) < 5 * math.sqrt(p * (1 - p) / R) + 1e-12, c
    # the library's bootstrap distribution is the enumerated one on the drawn samples
    ci = est.confidence_interval("ece_kde_l1", n_resamples=R, seed=3)
    want = np.array([exact[tuple(c)] for c in drawn])
    np.testing.assert_allclose(ci.bootstrap_distribution, want, rtol=1e-10)


def test_intervals_stay_in_the_range_of_their_quantity():
    """The L1 ECE^KDE and the KL error are >= 0: their intervals are cut at 0 (the moved
    quantiles fall below it at n = 10), exactly where the uncut interval goes below; the
    squared L2 U-statistic and its signed root, the L2 ECE^KDE, may be negative and are
    not cut; the same in compare."""
    from kdecal._calibration_estimate import centred_interval

    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.full(3, 0.5), size=10)
    y = np.array([rng.choice(3, p=p) for p in P])
    est = _quiet(kdecal.estimate, P, y, calibration="top_label")
    qs = ["ece_kde_l1", "ce_kl", "ce_l2"]
    ci = _quiet(est.confidence_intervals, qs, n_resamples=40, seed=0)
    cut = 0
    for q in qs:
        c = ci[q]
        lo, hi = centred_interval(c.bootstrap_distribution, c.estimate, 0.95)
        assert c.low <= c.estimate <= c.high
        if q == "ce_l2":
            assert (c.low, c.high) == (lo, hi)
        else:
            assert c.estimate >= 0.0
            assert c.low == max(lo, 0.0) and c.high == max(hi, 0.0)
            cut += lo < 0.0
    assert cut >= 1  # the case is one where the uncut interval reaches below 0
    # the L2 ECE^KDE is the squared error's signed root: a negative estimate's interval
    # holds it (it was cut at 0, above the estimate)
    s = kdecal.datasets.make_seeds_synthetic(300, 3, t1=1.0, t2=1.0, seed=3)
    est = _quiet(kdecal.estimate, s.probs, s.labels, bandwidth=0.05)
    c = _quiet(est.confidence_interval, "ece_kde_l2", n_resamples=20, seed=0)
    assert c.estimate < 0.0
    # (the signed root of the squared error's interval, not cut)
    ssq = np.sign(c.bootstrap_distribution) * c.bootstrap_distribution**2
    lo2, hi2 = centred_interval(ssq, -(c.estimate**2), 0.95)
    assert (c.low, c.high) == (-np.sqrt(-lo2), np.sign(hi2) * np.sqrt(abs(hi2)))
    assert c.low < c.estimate < c.high
    cmp = _quiet(
        kdecal.compare,
        {"a": P, "b": np.roll(P, 1, axis=0)},
        y,
        quantities=["ece_kde_l1"],
        calibration="top_label",
        n_resamples=40,
    )
    for k in ("a", "b"):
        assert cmp.estimates[k]["ece_kde_l1"]["low"] >= 0.0


def test_plain_squared_errors_are_cut_at_0_without_debiasing():
    """With debias="none" the squared L2 error and the L2 ECE^KDE are plain squares
    (>= 0): their intervals are cut at 0 (they reached -0.0018 and -0.042 for estimates
    of 0.008 and 0.09); with "ustat" they are not; the same in compare."""
    from kdecal._calibration_estimate import centred_interval

    s = make_seeds_synthetic(200, 3, t1=0.6, t2=0.8, seed=4)
    est = _quiet(kdecal.estimate, s.probs, s.labels, bandwidth=0.1, debias="none")
    ci = _quiet(est.confidence_intervals, ["ce_l2", "ece_kde_l2"], n_resamples=30, seed=0)
    c = ci["ce_l2"]
    lo, hi = centred_interval(c.bootstrap_distribution, c.estimate, 0.95)
    assert lo < 0.0 < c.estimate  # the uncut interval reaches below 0
    assert (c.low, c.high) == (0.0, hi)
    c2 = ci["ece_kde_l2"]
    assert c2.estimate == pytest.approx(np.sqrt(c.estimate), rel=1e-12)
    assert c2.low == 0.0 and c2.high == pytest.approx(np.sqrt(hi), rel=1e-12)
    ust = _quiet(kdecal.estimate, s.probs, s.labels, bandwidth=0.1)
    cu = _quiet(ust.confidence_interval, "ce_l2", n_resamples=30, seed=0)
    assert (cu.low, cu.high) == centred_interval(cu.bootstrap_distribution, cu.estimate, 0.95)
    cmp = _quiet(
        kdecal.compare,
        {"a": s.probs, "b": np.roll(s.probs, 1, axis=0)},
        s.labels,
        quantities=["ce_l2"],
        bandwidth=0.1,
        debias="none",
        n_resamples=30,
    )
    for k in ("a", "b"):
        assert cmp.estimates[k]["ce_l2"]["low"] >= 0.0


def test_row_metric_intervals_stay_in_their_range():
    """The binned ECE and the smooth ECE are >= 0, and their intervals in evaluate and
    compare are cut at 0 (evaluate printed smooth_ece 0.055 [-0.002, 0.160] at n = 20);
    the debiased binned L2 ECE, a signed root, is not cut."""
    from kdecal._calibration_estimate import centred_interval
    from kdecal._evaluate import _row_intervals
    from kdecal._row_metrics import ROW_METRICS, row_bootstrap

    s = make_seeds_synthetic(12, 10, t1=1.0, t2=1.0, seed=17)
    qs = ["smooth_ece", "ece_binned", "ece_binned_debiased"]
    values = {q: ROW_METRICS[q](s.probs, s.labels) for q in qs}
    dist = row_bootstrap({"": s.probs}, s.labels, qs, 40, 0)[""]
    got = _row_intervals(s.probs, s.labels, values, 40, 0)
    cut = 0
    for q in qs:
        lo, hi = centred_interval(dist[q], values[q], 0.95)
        if q == "ece_binned_debiased":
            assert got[q] == [lo, hi]
        else:
            assert got[q] == [max(lo, 0.0), max(hi, 0.0)] and values[q] >= 0.0
            cut += lo < 0.0
    assert cut == 2  # both uncut intervals reached below 0 here
    cmp = _quiet(
        kdecal.compare,
        {"a": s.probs, "b": s.probs},
        s.labels,
        quantities=["smooth_ece", "ece_binned"],
        n_resamples=40,
        seed=0,
    )
    for q in ("smooth_ece", "ece_binned"):
        assert cmp.estimates["a"][q]["low"] == got[q][0] == 0.0


# ------------------------------------------------------------------- resampling limits


def test_resampling_memory_is_chunked(monkeypatch):
    """The row multiplicities and resampled labels are drawn a chunk at a time: memory
    O(n + chunk x n), not the R x n arrays built in full about three times (4.8 GB for
    n = 100,000 and 2,000 resamples). With a small chunk budget the peak of numpy's
    traced allocations stays far below one R x n array, and the numbers do not change."""
    P, y = _calibrated(n=2000, K=3, seed=4)
    est = kdecal.estimate(P, y, bandwidth=0.2)
    R = 600
    full = R * 2000 * 8  # one (R, n) int64 array: 9.6 MB
    want = est.confidence_intervals(["ce_l2"], n_resamples=R, seed=1)["ce_l2"]
    null = est.calibration_tests(["ce_l2"], n_resamples=R, seed=1)["ce_l2"]
    monkeypatch.setattr(_replicates, "DRAW_CHUNK_BYTES", 2e5)
    monkeypatch.setattr(_replicates, "_CHUNK_BYTES", 2e5)
    monkeypatch.setattr(_replicates, "_RESIDUAL_CHUNK_BYTES", 2e5)
    monkeypatch.setattr(_replicates, "MAX_CHUNK_BYTES", 2e5)
    tracemalloc.start()
    try:
        got = est.confidence_intervals(["ce_l2"], n_resamples=R, seed=1)["ce_l2"]
        _, peak_ci = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        got_null = est.calibration_tests(["ce_l2"], n_resamples=R, seed=1)["ce_l2"]
        _, peak_test = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_ci < full / 4 and peak_test < full / 4, (peak_ci, peak_test, full)
    # the residual replicates are BLAS products of the kernel weights with the value
    # columns of a chunk: another chunk size changes the GEMM's shape, and its last bits
    np.testing.assert_allclose(
        got.bootstrap_distribution, want.bootstrap_distribution, rtol=1e-10, atol=1e-16
    )
    np.testing.assert_allclose(
        got_null.null_distribution, null.null_distribution, rtol=1e-10, atol=1e-16
    )


def test_chunk_size_amortises_the_kernel_weights():
    """A chunk holds what its budget holds, but at least MIN_CHUNK_REPLICATES (16)
    replicates where MAX_CHUNK_BYTES (1 GB) holds them, never more than asked."""
    cs = _replicates.chunk_size
    assert cs(200, 1e6, 64e6) == 64  # the budget holds more than 16
    assert cs(200, 72e6, 64e6) == 13  # 16 would exceed 1 GB: as many as fit
    assert cs(200, 10e6, 64e6) == 16  # the budget's 6, raised to 16
    assert cs(5, 72e6, 64e6) == 5  # never more than asked
    assert cs(200, 2e9, 64e6) == 1  # one replicate beyond every budget
    assert cs(0, 1e6, 64e6) == 1


def test_many_problems_share_the_kernel_weights_across_replicates(monkeypatch):
    """Class-wise at many classes: the dense resampling pass computes each problem's
    kernel weights once per chunk of replicates. The budgets held one replicate per
    chunk there, so the weights were computed anew for every replicate (a class-wise
    test at n = 3,000, K = 1,000: 20 resamples in over 14 minutes). Counted with budgets
    that hold one replicate, and the numbers are those of chunks of one."""
    P, y = _calibrated(n=300, K=40, seed=2)
    est = kdecal.estimate(P, y, bandwidth=0.05, calibration="classwise")
    R = 20
    starts = []  # one weight pass per (chunk, problem) starts at query row 0
    real = _replicates._backends.kernel_weights

    def counted(*args, **kwargs):
        starts.append(args[5] == 0)
        return real(*args, **kwargs)

    monkeypatch.setattr(_replicates._backends, "kernel_weights", counted)
    monkeypatch.setattr(_replicates, "DRAW_CHUNK_BYTES", 1.0)
    monkeypatch.setattr(_replicates, "_CHUNK_BYTES", 1.0)
    monkeypatch.setattr(_replicates, "_RESIDUAL_CHUNK_BYTES", 1.0)
    got = est.calibration_tests(["ce_l2"], n_resamples=R, seed=3)["ce_l2"]
    # ceil(20 / 16) = 2 chunks of replicates, each computing every problem's weights once
    assert sum(starts) == 2 * 40, sum(starts)
    monkeypatch.setattr(_replicates, "MAX_CHUNK_BYTES", 1.0)  # one replicate per chunk
    starts.clear()
    one = est.calibration_tests(["ce_l2"], n_resamples=R, seed=3)["ce_l2"]
    assert sum(starts) == R * 40, sum(starts)
    np.testing.assert_allclose(
        got.null_distribution, one.null_distribution, rtol=1e-10, atol=1e-16
    )


def test_absurd_resample_counts_are_refused_before_allocating():
    """n_resamples = 10**12 grew memory at ~230 MB/s; now every entry point refuses it
    at once, naming the argument and the limit."""
    P, y = _calibrated(n=50)
    est = kdecal.estimate(P, y, bandwidth=0.2)
    big = 10**12
    pattern = r"n_resamples = 1000000000000 is more than 1,000,000 resamples"
    for call in (
        lambda: est.confidence_interval(n_resamples=big),
        lambda: est.calibration_test(n_resamples=big),
        lambda: kdecal.evaluate(P, y, bandwidth=0.2, n_resamples=big),
        lambda: kdecal.compare([P, P], y, bandwidth=0.2, n_resamples=big),
    ):
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.raises(ValueError, match=r"n_boot = 1000000000000 is more than") as err:
        scores.bootstrap_ci(scores.log_loss, P, y, n_boot=big)
    # a row metric's resample is a call of the metric, not a kernel pass
    assert "each a call of the metric on n rows" in str(err.value)
    assert "kernel" not in str(err.value)


def test_bad_seeds_are_refused_naming_the_argument(monkeypatch):
    """A seed numpy refuses raised numpy's message ("SeedSequence expects int ..."),
    naming no argument, and evaluate and compare raised it after their estimates."""
    P, y = _calibrated(n=50)
    est = kdecal.estimate(P, y, bandwidth=0.2)
    ran = []
    monkeypatch.setattr(kdecal._evaluate, "_estimate_quietly", lambda *a, **k: ran.append(1))
    for bad, exc in (("x", TypeError), (-1, ValueError), (1.5, TypeError)):
        want = rf"seed must be None, a non-negative integer, .*got {re.escape(repr(bad))}"
        for call in (
            lambda b: est.confidence_interval(n_resamples=5, seed=b),
            lambda b: est.calibration_test(n_resamples=5, seed=b),
            lambda b: kdecal.calibration_test(P, y, bandwidth=0.2, n_resamples=5, seed=b),
            lambda b: kdecal.evaluate(P, y, bandwidth=0.2, n_resamples=5, seed=b),
            lambda b: kdecal.compare([P, P], y, bandwidth=0.2, n_resamples=5, seed=b),
            lambda b: datasets.make_seeds_synthetic(10, 3, seed=b),
        ):
            with pytest.raises(exc, match=want):
                call(bad)
    assert not ran  # evaluate refused the seed before estimating
    ci = est.confidence_interval(n_resamples=5, seed=np.random.default_rng(1))
    assert ci.low <= ci.estimate <= ci.high


# --------------------------------------------------------------- compare: one bandwidth


def _brute_brier_risk(P, y, hs):
    pts = check_probs(P).p
    Y = ref.ref_one_hot(y, P.shape[1])
    out = []
    for h in hs:
        W = ref.ref_loo_weights(pts, h)
        E = W @ Y / W.sum(axis=1, keepdims=True)
        out.append(np.mean(np.sum((Y - E) ** 2, axis=1)))
    return np.array(out)


@pytest.mark.usefixtures("plugin_estimator")
def test_compare_uses_one_bandwidth_and_flags_a_reversal():
    """Issue 26: compare gave each model its own bandwidth, and the L1 error rises
    steeply with h, so the verdict reversed with --bandwidth. Here model a's own
    bandwidth makes a - b = -0.05 and model b's makes it +0.02 (the reversal). compare
    now evaluates both at the one candidate with the smallest pooled brute-force LOO
    Brier risk, prints it, reports the difference at every candidate and at h/2, 2h, and
    flags the verdict as sensitive; "auto" gives exactly the comparison at that h."""
    s = make_seeds_synthetic(400, 3, t1=0.6, t2=0.6, seed=1)
    P, y = np.array(s.probs), np.array(s.labels)
    Q = temperature_scale(P, 0.5)
    ha, hb = (_quiet(kdecal.select_bandwidth, X, y) for X in (P, Q))

    def diff(h):
        return kdecal.ece_kde(P, y, bandwidth=h) - kdecal.ece_kde(Q, y, bandwidth=h)

    assert ha != hb and diff(ha) * diff(hb) < 0  # the precondition: a reversal
    res = _quiet(kdecal.compare, {"a": P, "b": Q}, y, quantities=("ece_kde_l1",), n_resamples=30)
    cands = np.array(sorted({ha, hb}))
    risk = _brute_brier_risk(P, y, cands) + _brute_brier_risk(Q, y, cands)
    h = float(cands[np.argmin(risk)])
    assert res.bandwidth == h
    assert [res.estimates[k]["bandwidth"] for k in "ab"] == [h, h]
    assert [res.estimates[k]["own_bandwidth"] for k in "ab"] == [ha, hb]
    assert res.estimates["a"]["ece_kde_l1"]["value"] == pytest.approx(
        kdecal.ece_kde(P, y, bandwidth=h), rel=1e-12
    )
    (d,) = res.differences
    assert d["difference"] == pytest.approx(diff(h), rel=1e-12)
    assert sorted(d["by_bandwidth"]) == sorted({ha, hb, h / 2, 2 * h})
    for g, v in d["by_bandwidth"].items():
        assert v == pytest.approx(diff(g), rel=1e-10, abs=1e-14)
    assert d["sensitive"]
    text = str(res)
    assert f"every model at bandwidth h = {h:.4g}" in text and "sensitive to the bandwidth" in text
    assert json.loads(json.dumps(res.to_dict(), allow_nan=False))["bandwidth"] == h
    fixed = kdecal.compare(
        {"a": P, "b": Q}, y, quantities=("ece_kde_l1",), n_resamples=30, bandwidth=h
    )
    (f,) = fixed.differences
    for key in ("difference", "low", "high", "pvalue", "significant", "sensitive"):
        assert f[key] == d[key], key


def test_compare_sensitivity_ignores_rounding_and_the_ends_of_the_bandwidth_range():
    """The bandwidth check of compare: the same predictions in two forms (probabilities
    and their round trip through logits, 1e-16 apart) differ by rounding at every
    bandwidth, which is not a sign change; a fixed bandwidth at either end of the
    supported range is checked at the other bandwidths only (h / 2 and 2 h outside the
    range used to fail after the estimates, naming a bandwidth nobody passed)."""
    rng = np.random.default_rng(0)
    p = rng.random(1200)
    y = (rng.random(1200) < p).astype(int)
    q = 1.0 / (1.0 + np.exp(-np.log(p / (1.0 - p))))
    assert 0 < np.abs(p - q).max() < 1e-15
    res = _quiet(kdecal.compare, {"p": p, "q": q}, y, quantities=("ece_kde_l1",), n_resamples=5)
    (d,) = res.differences
    assert len(d["by_bandwidth"]) == 3 and max(map(abs, d["by_bandwidth"].values())) < 1e-15
    assert not d["sensitive"] and "sensitive to the bandwidth" not in str(res)
    P = rng.dirichlet(np.ones(3), size=200)
    Q = rng.dirichlet(np.ones(3), size=200)
    y3 = np.array([rng.choice(3, p=r) for r in P])
    low = kdecal.tolerances.MIN_BANDWIDTH
    for h, other in ((low, 2.0 * low), (1e308, 5e307)):
        res = _quiet(kdecal.compare, [P, Q], y3, bandwidth=h, n_resamples=5)
        assert res.bandwidth == h
        assert sorted(res.differences[0]["by_bandwidth"]) == [other, h][:: 1 if other < h else -1]


def test_compare_names_the_bandwidth_of_each_quantity(tmp_path, capsys):
    """A helper's probe: with "auto" and the residual estimator the squared L2 and KL
    quantities are at half the common bandwidth, but compare printed only the common h
    (rerun there, ce_l2 0.00104 became 0.00127 under the same header), and its
    "sensitive" lines keyed their differences by the L1 bandwidths. Each quantity now
    carries its bandwidth, the header names both, and by_bandwidth is keyed by the
    quantity's own bandwidth; compare of row metrics alone names no bandwidth."""
    s = make_seeds_synthetic(400, 3, t1=0.6, t2=0.6, seed=1)
    P, y = np.array(s.probs), np.array(s.labels)
    Q = temperature_scale(P, 0.5)
    res = _quiet(
        kdecal.compare,
        {"a": P, "b": Q},
        y,
        quantities=("ece_kde_l1", "ce_l2", "ce_kl"),
        n_resamples=10,
    )
    h = res.bandwidth
    assert res.bandwidth_l2 == res.bandwidth_kl == h / 2
    for q, hq in (("ece_kde_l1", h), ("ce_l2", h / 2), ("ce_kl", h / 2)):
        e = res.estimates["a"][q]
        assert e["bandwidth"] == hq
        divergence = {"ce_l2": "l2", "ce_kl": "kl"}.get(q)
        direct = (
            kdecal.ece_kde(P, y, bandwidth=hq)
            if divergence is None
            else _quiet(kdecal.calibration_error, P, y, divergence=divergence, bandwidth=hq)
        )
        assert e["value"] == pytest.approx(direct, rel=1e-10, abs=1e-15)
        d = next(x for x in res.differences if x["quantity"] == q)
        assert hq in d["by_bandwidth"]
        assert d["by_bandwidth"][hq] == pytest.approx(d["difference"], rel=1e-12, abs=1e-15)
    text = str(res)
    assert f"the squared L2, L2 and KL quantities at h = {h / 2:.4g}" in text
    assert json.loads(json.dumps(res.to_dict(), allow_nan=False))["bandwidth_l2"] == h / 2
    rows = kdecal.compare({"a": P, "b": Q}, y, quantities=("ece_binned",), n_resamples=10)
    assert np.isnan(rows.bandwidth) and "no bandwidth is used" in str(rows)
    assert "own h" not in str(rows)
    as_json = json.loads(json.dumps(rows.to_dict(), allow_nan=False))
    assert as_json["bandwidth"] is None and as_json["estimates"]["a"]["own_bandwidth"] is None
    # the command line's compare takes --quiet (the README's progress-bar paragraph)
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(a, probs=P, labels=y)
    np.savez(b, probs=Q, labels=y)
    code = main(
        ["compare", str(a), str(b), "--n-resamples", "2", "--metrics", "ece_binned", "--quiet"]
    )
    assert code == 0 and "no bandwidth is used" in capsys.readouterr().out


def test_compare_warns_once_per_model_by_its_name():
    """Rows that do not sum to 1 were reported six times by compare, five of them naming
    ``probs`` (each estimate re-validated the raw array); now once, naming the model."""
    import warnings

    rng = np.random.default_rng(5)
    P = rng.dirichlet(np.ones(3), 500)
    y = np.array([rng.choice(3, p=p) for p in P])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kdecal.compare({"a": P, "b": np.round(P, 2)}, y, n_resamples=4)
    texts = [str(w.message) for w in caught if "do not sum to 1" in str(w.message)]
    assert len(texts) == 1 and texts[0].startswith("models['b']:")


# --------------------------------------------------------------------------- command line


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_small_smaller_items(tmp_path, capsys, monkeypatch):
    """--plot x (matplotlib wrote x.png), --seed -1, a p-value at the resampling floor
    (printed 0.009901, now "< 0.0099"), class-wise intervals with --calibration
    classwise (were "n/a"), and an internal error: one line, never a traceback."""
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.full(3, 0.3), size=400)
    y = rng.integers(0, 3, size=400)  # labels independent of sharp predictions: p at the floor
    f = tmp_path / "m.npz"
    np.savez(f, probs=P, labels=y)
    code, out, err = _cli(capsys, "evaluate", str(f), "--plot", str(tmp_path / "x"))
    assert code == 2 and "--plot" in err and "has no file extension" in err
    assert not (tmp_path / "x.png").exists()
    code, _, err = _cli(capsys, "evaluate", str(f), "--seed", "-1")
    assert code == 2 and "--seed" in err and "non-negative" in err
    argv = ["evaluate", str(f), "--quiet", "--bandwidth", "0.1", "--calibration", "classwise"]
    code, out, err = _cli(capsys, *argv)
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line[:10].strip()}
    assert rows["classwise"].rstrip().endswith("< 0.0099") and "[" in rows["classwise"]
    code, out, _ = _cli(capsys, *argv, "--json")
    row = json.loads(out)["notions"]["classwise"]
    assert row["pvalue"] == pytest.approx(1 / 101) and row["n_resamples"] == 100

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(kdecal, "evaluate", broken)
    code, out, err = _cli(capsys, "evaluate", str(f), "--quiet")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "internal error (ZeroDivisionError: float division by zero)" in err


def test_cli_file_messages_name_the_file(tmp_path, capsys):
    """Random bytes in a .npz ("pickled data"), uint64 labels (shown wrapped to
    -9223372036854775808), a 3-row file (a 40-line traceback)."""
    rng = np.random.default_rng(0)
    bad = tmp_path / "rand.npz"
    bad.write_bytes(rng.bytes(300))
    code, _, err = _cli(capsys, "evaluate", str(bad))
    assert code == 2 and "rand.npz: is not a .npz file (not a zip archive" in err
    P, y = _calibrated(n=20, K=3)
    u = tmp_path / "u64.npz"
    np.savez(u, probs=P, labels=np.where(np.arange(20) == 3, 2**64 - 1, y).astype(np.uint64))
    code, _, err = _cli(capsys, "evaluate", str(u))
    assert code == 2 and "u64.npz" in err and "18446744073709551615" in err
    small = tmp_path / "three.npz"
    np.savez(small, probs=P[:3], labels=np.array([0, 1, 2]))
    code, out, err = _cli(capsys, "evaluate", str(small), "--quiet", "--json")
    assert code == 0 and "Traceback" not in err
    assert json.loads(out)["n"] == 3
    # non-finite scores: named with the file and the cell, logits of one column or of
    # several alike (one +inf logit column was read as P = 1, exit 0; several columns
    # were refused by the softmax without the file's name)
    logits = np.log(P)
    for name, bad_scores, where in (
        ("inf2.npz", np.where(np.arange(20)[:, None] == 4, np.inf, logits), "row 4, column 0"),
        ("inf1.npz", np.where(np.arange(20) == 2, np.inf, logits[:, 1]), "row 2)"),
        ("nan.npz", np.where(np.arange(20)[:, None] == 5, np.nan, P), "row 5, column 0"),
    ):
        f = tmp_path / name
        np.savez(f, logits=bad_scores, labels=y % 2 if bad_scores.ndim == 1 else y)
        code, out, err = _cli(capsys, "evaluate", str(f), "--n-resamples", "0")
        assert code == 2 and out == "" and f"{name}: scores contain " in err and where in err
    # float labels beyond int64 (1e300 was cast to -9223372036854775808, with numpy's
    # warning), and a fraction shown as a number, not np.float64(2.5)
    for bad, shown in ((1e300, "found 1e+300"), (2.5, "found 2.5")):
        f = tmp_path / "flab.npz"
        np.savez(f, probs=P, labels=np.where(np.arange(20) == 7, bad, y.astype(float)))
        code, out, err = _cli(capsys, "evaluate", str(f), "--n-resamples", "0")
        assert code == 2 and "flab.npz: labels must be integer class indices" in err
        assert shown in err and "warning" not in err


def test_array_containers_read_as_their_values():
    """pandas nullable Float64 frames (refused as dtype object), np.matrix (a matrix.sum
    TypeError), masked arrays (the mask silently dropped): read, or refused by name."""
    pd = pytest.importorskip("pandas")
    P, y = _calibrated(n=60)
    want = kdecal.ece_kde(P, y, bandwidth=0.1)
    frame = pd.DataFrame(P).astype("Float64")
    assert kdecal.ece_kde(frame, pd.Series(y, dtype="Int64"), bandwidth=0.1) == want
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # np.matrix itself
        matrix = np.matrix(P)
    assert kdecal.ece_kde(matrix, y, bandwidth=0.1) == want
    holed = frame.copy()
    holed.iloc[4, 1] = pd.NA
    with pytest.raises(
        ValueError, match=r"probs contains a non-finite value nan at index \(4, 1\)"
    ):
        kdecal.ece_kde(holed, y, bandwidth=0.1)
    with pytest.raises(
        ValueError, match=r"labels contains a non-finite value nan at index \(2,\)"
    ):
        kdecal.ece_kde(P, pd.Series(y, dtype="Int64").mask(np.arange(60) == 2), bandwidth=0.1)
    with pytest.raises(ValueError, match=r"masked array with a masked entry at index \(0, 0\)"):
        kdecal.ece_kde(np.ma.masked_array(P, mask=np.eye(60, 3, dtype=bool)), y, bandwidth=0.1)


def test_evaluation_page_panels_use_the_table_bandwidths():
    """The page's canonical panel used another bandwidth than its table (0.0657 against
    0.0910); the top-label panel (drawn at 0.02) now names the table's bandwidth; the
    table's font fits every line in its panel (it was clipped)."""
    pytest.importorskip("matplotlib")
    from kdecal.plot import evaluation_page

    s = make_seeds_synthetic(600, 4, seed=0)
    rep = _quiet(kdecal.evaluate, s.probs, s.labels, calibration="top_label", n_resamples=10)
    fig = evaluation_page(s.probs, s.labels, report=rep)
    titles = [a.get_title() for a in fig.axes[:3]]
    h_can = rep.notions["canonical"]["bandwidth"]
    h_top = rep.notions["top_label"]["bandwidth"]
    assert f"canonical Dirichlet KDE, h = {h_can:.3g}" in titles[2]
    assert h_top != 0.02 and f"(table: h = {h_top:.3g})" in titles[1]
    # the kernel panels draw the report's residual-centred curve, so the canonical one
    # shows the table's figure (its plug-in curve had shown 0.1344 beside the table's
    # 0.0586); a plug-in curve beside a residual table names both
    table = rep.notions["canonical"]["ece_kde_l1"]
    assert f"ECE$^{{KDE}}$ (L1) = {table:.4f}" in titles[2]
    assert "plug-in" not in titles[1] + titles[2] and "table" not in titles[2]
    plug = kdecal.curves.ReliabilityDiagram.from_predictions(
        s.probs,
        s.labels,
        kind="kernel",
        calibration="canonical",
        bandwidth=h_can,
        estimator="plugin",
    )
    both = kdecal.plot._canonical_panel_title(plug, rep)
    assert f"plug-in ECE$^{{KDE}}$ (L1) = {float(plug.ece):.4f}" in both
    assert f"table (residual): {table:.4f}" in both and abs(plug.ece - table) > 1e-4
    (text,) = fig.axes[-1].texts
    n_lines = len(text.get_text().splitlines())
    box = fig.axes[-1].get_position()
    assert 1.2 * n_lines * text.get_fontsize() <= box.height * 12 * 72 + 1e-9


def test_evaluation_page_refuses_a_report_of_other_predictions():
    """A helper's probe: a 300-row report passed with 500 rows of other predictions drew
    a's table and canonical view beside b's panels, titled n = 300, with no error."""
    pytest.importorskip("matplotlib")
    from kdecal.plot import evaluation_page

    a = make_seeds_synthetic(300, 3, seed=0)
    b = make_seeds_synthetic(500, 3, t2=1.0, seed=1)
    rep = _quiet(kdecal.evaluate, a.probs, a.labels, n_resamples=0)
    with pytest.raises(ValueError, match=r"report is of n = 300, K = 3 .* n = 500, K = 3"):
        evaluation_page(b.probs, b.labels, report=rep)
    with pytest.raises(ValueError, match=r"probs has n = 300, K = 2"):
        evaluation_page(
            a.probs[:, :2] / a.probs[:, :2].sum(1, keepdims=True), a.labels % 2, report=rep
        )


def test_evaluation_page_beyond_ten_classes_draws_no_canonical_view():
    """A report that left the canonical notion out (K = 11, the defaults) gets the
    top-label kernel diagram at its table's bandwidth in the third panel, from the
    report's own sums (no canonical search, no canonical figure on the page)."""
    pytest.importorskip("matplotlib")
    from kdecal import curves
    from kdecal.plot import evaluation_page

    s = make_seeds_synthetic(400, 11, seed=1)
    rep = _quiet(kdecal.evaluate, s.probs, s.labels, n_resamples=0)
    assert rep.calibration == "top_label" and "canonical" not in rep.notions
    fig = evaluation_page(s.probs, s.labels, report=rep)
    title = fig.axes[2].get_title()
    h_top = rep.notions["top_label"]["bandwidth"]
    assert f"at the table's h = {h_top:.3g}" in title and "no canonical view at K = 11" in title
    assert not any(
        "canonical" in a.get_title() and "no canonical" not in a.get_title() for a in fig.axes
    )
    want = curves.ReliabilityDiagram.from_predictions(
        s.probs, s.labels, kind="kernel", bandwidth=h_top
    )
    (line,) = [ln for ln in fig.axes[2].lines if ln.get_label().startswith("LOO kernel")]
    np.testing.assert_allclose(line.get_ydata(), want.y, rtol=1e-9)


def test_calibrators_and_scores_refuse_careless_probabilities():
    """input="auto" of the calibrators and the scoring rules goes through the same rule:
    a stray 1.0000001 or an extra fold column is refused, naming the row or column."""
    from kdecal.recalibration import TemperatureScaling

    P, y = _calibrated(n=200, K=4, seed=8)
    Z = P.copy()
    Z[3] = [1.0000001, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"row 3, column 0 holds 1\.0000001"):
        TemperatureScaling().fit(Z, y)
    with pytest.raises(ValueError, match=r"row 3, column 0 holds 1\.0000001"):
        scores.calibration_loss(Z, y, input="auto")
    F = np.column_stack([P, np.arange(200) % 5])
    with pytest.raises(ValueError, match=r"column 4 holds only integers"):
        TemperatureScaling(input="auto").fit(F, y)
    # with input="probs" the stray entry is clipped (with a warning) and the fit runs
    ts = _quiet(TemperatureScaling(input="probs").fit, Z, y)
    assert np.isfinite(ts.temperature_)


def test_report_keeps_its_estimates():
    """The report holds the CalibrationEstimate of every notion: its numbers are those
    estimates' quantities, bit for bit, and they answer further questions without a new
    kernel pass; the dict and JSON forms leave them out and still round-trip."""
    P, y = _calibrated(n=300, K=3, seed=2)
    rep = kdecal.evaluate(P, y, bandwidth=0.2, n_resamples=8, calibration_loss=False)
    assert set(rep.estimates) == {"canonical", "top_label", "classwise"}
    main = rep.estimates["canonical"]
    assert main.value("ce_l2") == rep.ce_l2
    assert main.value("ece_kde_l1") == rep.ece_kde_l1
    assert main.value("ce_kl") == rep.ce_kl
    for name, row in rep.notions.items():
        est = rep.estimates[name]
        assert est.calibration == name
        assert est.value("ece_kde_l1") == row["ece_kde_l1"]
        assert est.value("ce_l2") == row["ce_l2"]
    # the numbers of a fresh estimate, bit for bit: evaluate validates the probabilities
    # once (validating the renormalised rows again moved their last bits)
    for name in ("top_label", "classwise"):
        fresh = kdecal.estimate(P, y, bandwidth=0.2, calibration=name)
        assert rep.estimates[name].value("ce_l2") == fresh.value("ce_l2")
        assert rep.estimates[name].value("ece_kde_l1") == fresh.value("ece_kde_l1")
    d = rep.to_dict()
    assert "estimates" not in d
    json.dumps(d)
    again = kdecal.CalibrationReport(**d)
    assert again.estimates == {} and again.ce_l2 == rep.ce_l2


# ------------------------------------------- intervals and tests share one resampling pass


@pytest.mark.parametrize("bandwidth", ["auto", 0.2])
@pytest.mark.parametrize("calibration", ["canonical", "classwise", "top_label"])
@pytest.mark.parametrize("estimator", ["residual", "plugin"])
def test_intervals_and_tests_share_one_pass(monkeypatch, calibration, estimator, bandwidth):
    """evaluate's joint resampling equals the two separate calls.

    To rounding (1e-13 relative): the shared products sum the same terms in another
    blocking; the intervals, p-values and statistics are equal.

    On the compiled core a residual estimate computes the kernel weights once for the
    bootstrap and the consistency replicates of a chunk, up to
    CONSISTENCY_SHARED_MAX_DIM classes (alone, the consistency replicates of
    CONSISTENCY_MULTI_MIN_DIM classes or more run on the multi-label pass, no
    kernel_weights call; below, on weights of their own); the plug-in runs them one
    after the other.
    """
    from kdecal._estimation import replicates as _replicates

    P, y = _calibrated(n=400, K=4, seed=5)
    est = _quiet(
        kdecal.estimate, P, y, calibration=calibration, estimator=estimator, bandwidth=bandwidth
    )
    names = ["ece_kde_l1", "ce_l2", "ce_kl"]
    calls = Counter()
    real = _backends.kernel_weights

    def counted(*args, **kwargs):
        calls["w"] += 1
        return real(*args, **kwargs)

    real_multi = _backends.loo_reduce_multi

    def counted_multi(*args, **kwargs):
        calls["multi"] += 1
        return real_multi(*args, **kwargs)

    monkeypatch.setattr(_backends, "kernel_weights", counted)
    monkeypatch.setattr(_backends, "loo_reduce_multi", counted_multi)
    cis = est.confidence_intervals(names, n_resamples=30, seed=7)
    tests = est.calibration_tests(names, n_resamples=30, seed=7)
    separate, separate_multi = calls["w"], calls["multi"]
    calls.clear()
    cis2, tests2 = est._intervals_and_tests(names, names, level=0.95, n_resamples=30, seed=7)
    for q in names:
        np.testing.assert_allclose(
            cis2[q].bootstrap_distribution, cis[q].bootstrap_distribution, rtol=1e-13, atol=1e-17
        )
        assert cis[q].estimate == cis2[q].estimate
        np.testing.assert_allclose(
            [cis2[q].low, cis2[q].high], [cis[q].low, cis[q].high], rtol=1e-13
        )
        np.testing.assert_allclose(
            tests2[q].null_distribution, tests[q].null_distribution, rtol=1e-13, atol=1e-17
        )
        assert tests[q].pvalue == tests2[q].pvalue and tests[q].statistic == tests2[q].statistic
    dim = est._for("ece_kde_l1").problem.dim
    alone_dense = dim < _replicates.CONSISTENCY_MULTI_MIN_DIM
    if estimator == "residual" and "cpp" in kdecal.available_backends():
        assert dim <= _replicates.CONSISTENCY_SHARED_MAX_DIM
        assert separate > 0
        # the test alone: weights of its own, or the multi-label pass
        assert (separate_multi > 0) == (not alone_dense)
        # together: the bootstrap's weights, no multi-label pass
        assert calls["w"] * (2 if alone_dense else 1) == separate
        assert calls["multi"] == 0
    else:
        assert calls["w"] == separate


# ------------------------------------------------- compare: metrics without a kernel


def test_compare_takes_metrics_without_a_kernel():
    """compare's row metrics (issue 28): values equal the public functions, replicates
    are the metrics on the same paired row samples as the kernel bootstrap (checked
    against an independent resampling of the rows), and adding them leaves the kernel
    quantities' numbers unchanged."""
    from kdecal._compare import ROW_METRICS

    rng = np.random.default_rng(11)
    P = rng.dirichlet(np.full(3, 0.8), 400)
    y = np.array([rng.choice(3, p=p) for p in P])
    Q = kdecal.datasets.temperature_scale(P, 1.6)
    models = {"a": P, "b": Q}
    names = ["ece_kde_l1", *ROW_METRICS]
    both = _quiet(kdecal.compare, models, y, quantities=names, n_resamples=12, seed=4)
    kernel = _quiet(kdecal.compare, models, y, quantities=["ece_kde_l1"], n_resamples=12, seed=4)
    assert both.estimates["a"]["ece_kde_l1"] == kernel.estimates["a"]["ece_kde_l1"]
    np.testing.assert_array_equal(
        both.bootstrap["b"]["ece_kde_l1"], kernel.bootstrap["b"]["ece_kde_l1"]
    )
    publics = {
        "ece_binned": lambda p, t: binned.ece(p, t),
        "ece_binned_debiased": lambda p, t: binned.ece(p, t, p=2, debias=True),
        "mce_binned": lambda p, t: binned.ece(p, t, p=np.inf),
        "smooth_ece": kdecal.smooth_ece,
    }
    counts = _replicates.draw_bootstrap_counts(len(y), 12, np.random.default_rng(4))
    for k, probs in models.items():
        Pv = check_probs(probs).p
        for q, fn in publics.items():
            assert both.estimates[k][q]["value"] == pytest.approx(fn(Pv, y), rel=1e-12, abs=1e-15)
            for r in (0, 7):
                idx = np.repeat(np.arange(len(y)), counts[r])
                assert both.bootstrap[k][q][r] == pytest.approx(
                    fn(Pv[idx], y[idx]), rel=1e-12, abs=1e-15
                )
    d = next(x for x in both.differences if x["quantity"] == "smooth_ece")
    assert d["difference"] == pytest.approx(
        both.estimates["a"]["smooth_ece"]["value"] - both.estimates["b"]["smooth_ece"]["value"]
    )
    assert not d["sensitive"]  # no bandwidth: the same value at every h
    with pytest.raises(ValueError, match="metrics without a kernel"):
        kdecal.compare(models, y, quantities=["ece_binned_l3"])


def test_cli_compare_metrics(tmp_path, capsys):
    rng = np.random.default_rng(2)
    P = rng.dirichlet(np.full(3, 0.8), 300)
    y = np.array([rng.choice(3, p=p) for p in P])
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(a, probs=P, labels=y)
    np.savez(b, probs=kdecal.datasets.temperature_scale(P, 1.5), labels=y)
    args = ["compare", str(a), str(b), "--n-resamples", "10", "--json"]
    assert main([*args, "--metrics", "ece_binned,ce_l2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quantities"] == ["ece_binned", "ce_l2"]
    assert out["estimates"]["a.npz"]["ece_binned"]["value"] == pytest.approx(
        binned.ece(check_probs(P).p, y), rel=1e-12
    )
    assert main([*args, "--metrics", "nope"]) == 2
    assert "expected comma-separated metrics" in capsys.readouterr().err


# ------------------------------------- the automatic bandwidth re-selected per replicate


@pytest.mark.parametrize("calibration", ["canonical", "top_label"])
def test_bootstrap_reselects_the_bandwidth_per_replicate(calibration):
    """With bandwidth="auto" each bootstrap replicate selects the grid bandwidth (within
    RESELECT_STEPS steps of the searched one) that minimises the leave-one-out Brier
    risk with the rows weighted by its multiplicities; the squared L2 estimate's moves
    by the same factor. bandwidth_variability="refit": the replicate is computed there;
    "none": at the estimate's bandwidth; "add" (the default): the "none" replicate r
    plus the whole sample's estimate at replicate r - 1's bandwidth minus the estimate.
    Reference: the per-row risks from a materialised kernel (tests/_reference.py), each
    replicate recomputed on an estimate at its bandwidth with the same multiplicities.
    A fixed bandwidth re-selects nothing."""
    from _reference import ref_loo_weights, ref_notion_problems, ref_one_hot
    from kdecal._calibration_estimate import RESELECT_STEPS
    from kdecal._estimation import replicates as _replicates
    from kdecal._estimation import search as _search

    rng = np.random.default_rng(3)
    n, K = 300, 3
    P = rng.dirichlet(np.ones(K), size=n)
    T = P**2 / (P**2).sum(axis=1, keepdims=True)  # over-confident: some calibration error
    y = np.array([rng.choice(K, p=row) for row in T])
    est = _quiet(kdecal.estimate, P, y, calibration=calibration)
    # the U-statistic's own replicates: without the canonical bounds (their replicates:
    # test_canonical_squared_l2_replicates_are_raised_to_their_bounds_replicates)
    est._floors = []
    names = ["ece_kde_l1", "ce_l2"]
    R, seed = 40, 9
    got = _quiet(
        est.confidence_intervals, names, n_resamples=R, seed=seed, bandwidth_variability="refit"
    )
    plain = _quiet(
        est.confidence_intervals, names, n_resamples=R, seed=seed, bandwidth_variability="none"
    )
    added = _quiet(est.confidence_intervals, names, n_resamples=R, seed=seed)
    counts = _replicates.draw_bootstrap_counts(n, R, np.random.default_rng(seed)).astype(float)
    grid = _search.SEARCH_GRID
    i0 = int(np.argmin(np.abs(np.log(grid) - np.log(est.bandwidth))))
    cand = [
        est.bandwidth if i == i0 else float(grid[i])
        for i in range(max(0, i0 - RESELECT_STEPS), min(len(grid), i0 + RESELECT_STEPS + 1))
    ]
    ((points, lab),) = ref_notion_problems(P, y, calibration)
    Y = ref_one_hot(lab, points.shape[1])
    coords = slice(None) if calibration == "canonical" else slice(1, 2)
    risks = []
    for h in cand:  # per-row leave-one-out Brier risk of the plug-in regression
        W = ref_loo_weights(points, h)
        E = (W @ Y) / W.sum(axis=1, keepdims=True)
        risks.append(np.sum((Y - E)[:, coords] ** 2, axis=1))
    risk = np.array(risks) @ counts.T  # (candidates, R): the weighted sums
    pick = np.argmin(risk, axis=0)
    assert len(set(pick.tolist())) > 1  # replicates did move (else the test shows nothing)
    shift = {q: np.zeros(R) for q in names}
    for k in range(R):
        h = cand[pick[k]]
        ratio = h / est.bandwidth
        for q in names:
            fixed = _quiet(
                kdecal.estimate,
                P,
                y,
                calibration=calibration,
                bandwidth=(est.bandwidth if q == "ece_kde_l1" else est.bandwidth_l2) * ratio,
            )
            dist = {q: np.empty(1)}
            fixed._bootstrap_chunk([q], counts[k : k + 1].astype(np.int64), dist, 0)
            assert got[q].bootstrap_distribution[k] == pytest.approx(dist[q][0], rel=1e-9), (k, q)
            if ratio != 1.0:
                shift[q][k] = _quiet(fixed.value, q) - _quiet(est.value, q)
    for q in names:
        assert np.count_nonzero(shift[q]) > 0
        want = plain[q].bootstrap_distribution + np.roll(shift[q], 1)
        np.testing.assert_allclose(added[q].bootstrap_distribution, want, rtol=1e-9, atol=1e-14)
        assert added[q].low <= added[q].estimate <= added[q].high
    # by default, and with a fixed bandwidth, every replicate at the estimate's
    fixed = _quiet(kdecal.estimate, P, y, calibration=calibration, bandwidth=est.bandwidth)
    d = {"ece_kde_l1": np.empty(R)}
    fixed._bootstrap_chunk(["ece_kde_l1"], counts.astype(np.int64), d, 0)
    np.testing.assert_allclose(
        plain["ece_kde_l1"].bootstrap_distribution, d["ece_kde_l1"], rtol=1e-12
    )
    assert list(fixed._reselected(fixed._est, counts)) == [est.bandwidth]
    np.testing.assert_array_equal(  # nothing to add at a fixed bandwidth
        _quiet(fixed.confidence_intervals, names, n_resamples=R, seed=seed)[
            "ece_kde_l1"
        ].bootstrap_distribution,
        d["ece_kde_l1"],
    )
    with pytest.raises(ValueError, match="bandwidth_variability"):
        est.confidence_intervals(names, n_resamples=4, bandwidth_variability="yes")


def test_reselection_never_picks_an_undefined_bandwidth():
    """A candidate bandwidth whose leave-one-out risk is not finite is never selected
    (np.argmin would return a NaN's index), and one whose refitted estimate is not
    finite leaves its replicates at the estimate's bandwidth with no shift: the
    interval stays finite and holds its estimate."""
    from dataclasses import replace

    from kdecal._estimation import replicates as _replicates

    rng = np.random.default_rng(3)
    n, K = 300, 3
    P = rng.dirichlet(np.ones(K), size=n)
    T = P**2 / (P**2).sum(axis=1, keepdims=True)
    y = np.array([rng.choice(K, p=row) for row in T])
    est = _quiet(kdecal.estimate, P, y)
    R, seed = 40, 9
    counts = _replicates.draw_bootstrap_counts(n, R, np.random.default_rng(seed))
    G, L = est._selection_risks()
    home = int(np.argmin(np.abs(G - est.search.bandwidth)))
    picked = est._reselected(est._est, counts)
    moved = [h for h in picked if h != est.bandwidth]
    assert moved  # the replicates select other bandwidths (else the test shows nothing)
    # 1. NaN risks on every candidate but the searched one: all stay at home
    Lbad = L.copy()
    Lbad[np.arange(len(G)) != home, 0] = np.nan
    est._risks = (G, Lbad)
    assert list(est._reselected(est._est, counts)) == [est.bandwidth]
    # every candidate NaN: still the searched value, never a NaN's index
    est._risks = (G, np.full_like(L, np.nan))
    assert list(est._reselected(est._est, counts)) == [est.bandwidth]
    # 2. a refit without a finite estimate: its replicates keep the estimate's bandwidth
    est._risks = (G, L)
    h_bad = moved[0]
    good = est._refit(est._est, h_bad)
    est._refits[(id(est._est), h_bad)] = replace(good, E=np.full_like(good.E, np.nan))
    again = est._reselected(est._est, counts)
    assert h_bad not in again
    np.testing.assert_array_equal(
        np.sort(np.concatenate(list(again.values()))), np.arange(R)
    )  # every replicate still assigned exactly once
    np.testing.assert_array_equal(
        again[est.bandwidth], np.sort(np.concatenate([picked[est.bandwidth], picked[h_bad]]))
    )
    ci = _quiet(est.confidence_interval, "ece_kde_l1", n_resamples=R, seed=seed)
    assert np.all(np.isfinite(ci.bootstrap_distribution))
    assert ci.low <= ci.estimate <= ci.high


def test_compare_calls_nothing_significant_that_its_resamples_cannot_show():
    """With 2 or 10 resamples a paired interval's ends are the replicates' extremes, and
    compare printed "p < 0.33 (significant)"; now "significant" needs the p-value at most
    1 - level too, and the text says why it is not."""
    s = make_seeds_synthetic(400, 3, t1=1.0, t2=1.0, seed=0)
    over = temperature_scale(s.probs, 0.4)  # over-confident: far worse calibrated
    models = {"cal": s.probs, "over": over}
    for R, can in ((2, False), (10, False), (19, True), (40, True)):
        cmp = _quiet(
            kdecal.compare,
            models,
            s.labels,
            quantities=["ece_kde_l1"],
            bandwidth=0.1,
            n_resamples=R,
            seed=0,
        )
        (d,) = cmp.differences
        assert d["high"] < 0.0  # the interval excludes 0 at every R
        assert d["significant"] is can
        assert ("cannot show p <= 0.05" in str(cmp)) is (not can)


def test_cli_reads_any_split_the_file_holds(tmp_path, capsys):
    """The loader takes any NAME_probs / NAME_labels split, and its error said "choose
    one with --split", but the option only took val or test."""
    P, y = _calibrated(n=30, K=3)
    f = tmp_path / "tr_cal.npz"
    np.savez(f, train_probs=P[::-1], train_labels=y[::-1], calib_probs=P, calib_labels=y)
    code, _, err = _cli(capsys, "evaluate", str(f), "--n-resamples", "0")
    assert code == 2 and "choose one with split (--split on the command line)" in err
    code, out, _ = _cli(
        capsys,
        "evaluate",
        str(f),
        "--split",
        "calib",
        "--n-resamples",
        "0",
        "--json",
        "--bandwidth",
        "0.1",
        "--quiet",
    )
    assert code == 0
    want = kdecal.ece_kde(P, y, bandwidth=0.1)
    assert json.loads(out)["ece_kde_l1"] == pytest.approx(want, rel=1e-12)
    code, _, err = _cli(capsys, "evaluate", str(f), "--split", "xx")
    assert code == 2 and "has no split 'xx'; splits present: calib, train" in err


def test_probabilities_above_one_are_refused_before_any_renormalisation_warning(recwarn):
    """A file times 1.05 warned that its rows "were renormalised", then refused an entry
    (1.034) that renormalising would have brought to 0.98: the range is checked first."""
    P, _ = _calibrated(n=50, K=3)
    P[7] = [0.985, 0.01, 0.005]
    P = P * 1.05
    with pytest.raises(ValueError, match=r"probs contains a probability above 1, 1\.0"):
        check_probs(P)
    assert not [w for w in recwarn if issubclass(w.category, kdecal.RenormalizationWarning)]
    # rows off by less than the tolerance, every entry within [0, 1]: renormalised
    with pytest.warns(kdecal.RenormalizationWarning, match="were renormalised"):
        check_probs(np.minimum(P / 1.05 * 1.02, 1.0))


def test_report_values_of_any_size_print_in_a_column():
    """--bandwidth 1e300 filled the notion table's bandwidth column with 300 digits."""
    assert _format_value(1e300) == "1.000e+300"
    assert _format_value(-2.5e7) == "-2.500e+07"
    assert _format_value(123456.5) == "123456.500000"
    assert _format_value(0.5) == "0.500000" and _format_value(5e-5) == "5.000e-05"
    assert _format_value(0.0) == "0.000000" and _format_value(None) == "n/a"


def test_resample_notions_outside_the_notion_table_are_refused(monkeypatch):
    """--notions top_label --resample-notions classwise resampled nothing it was asked
    for and said nothing: a notion to resample must be one of the table's."""
    P, y = _calibrated(n=60, K=3)
    monkeypatch.setattr(kdecal._evaluate, "_estimate_quietly", lambda *a, **k: 1 / 0)
    with pytest.raises(ValueError, match=r"names 'classwise', which the notion table does not"):
        kdecal.evaluate(P, y, notions=("top_label",), resample_notions=("classwise",))
    with pytest.raises(ValueError, match=r"\(notions: none\); add them to notions"):
        kdecal.evaluate(P, y, notions=None, resample_notions=("classwise", "top_label"))


def test_evaluate_refuses_one_resample_and_says_why_calibration_loss_is_missing(monkeypatch):
    """n_resamples = 1 passed evaluate's check and failed after the estimates; a file of
    one class dropped the calibration loss from the report without a word."""
    P, y = _calibrated(n=40, K=3)
    with monkeypatch.context() as m:
        m.setattr(kdecal._evaluate, "_estimate_quietly", lambda *a, **k: 1 / 0)
        with pytest.raises(ValueError, match=r"n_resamples must be 0 .* or at least 2, got 1"):
            kdecal.evaluate(P, y, n_resamples=1)
    rep = _quiet(kdecal.evaluate, P, np.zeros(40, dtype=int), bandwidth=0.2, n_resamples=0)
    assert rep.calibration_loss is None
    assert any("calibration_loss skipped: every label is class 0" in t for t in rep.notes)


def test_cli_row_and_label_errors_name_the_file(tmp_path, capsys):
    """Labels beyond the file's classes and files of fewer than 3 rows were refused by
    evaluate and compare without the file's name."""
    P, y = _calibrated(n=40, K=3)
    oor = tmp_path / "oor.npz"
    np.savez(oor, probs=P, labels=np.where(np.arange(40) == 6, 3, y))
    two = tmp_path / "two.npz"
    np.savez(two, probs=P[:2], labels=y[:2])
    for f, msg in ((oor, "labels must lie in 0..2"), (two, "needs at least 3 samples")):
        for cmd in (("evaluate", str(f)), ("compare", str(f), str(f))):
            code, out, err = _cli(capsys, *cmd, "--n-resamples", "2")
            assert code == 2 and out == "" and f"{f.name}: " in err and msg in err
    # one column (here an (n, 1) array) is read as P(y = 1), and the source line says so
    one = tmp_path / "one.npz"
    np.savez(one, probs=P[:, :1], labels=(y == 0).astype(int))
    code, out, _ = _cli(capsys, "evaluate", str(one), "--n-resamples", "0", "--json", "--quiet")
    assert code == 0 and json.loads(out)["n_classes"] == 2
    assert json.loads(out)["source"].endswith("one column: P(y = 1) of a binary problem")


def test_ratio_debias_says_why_it_has_no_intervals():
    """With debias="ratio" every notion row showed n/a for its intervals and test, and
    no note said why."""
    P, y = _calibrated(n=60, K=3)
    rep = _quiet(
        kdecal.evaluate, P, y, estimator="plugin", debias="ratio", bandwidth=0.2, n_resamples=4
    )
    assert all("ece_kde_l1_ci" not in row for row in rep.notions.values())
    assert any(t.startswith("No intervals or test with debias='ratio'") for t in rep.notes)
    rep = _quiet(kdecal.evaluate, P, y, bandwidth=0.2, n_resamples=4)
    assert not any("debias='ratio'" in t for t in rep.notes)


# ------------------------------------------------- what the docstring review found
def test_estimate_calibration_error_method_names_its_own_regression():
    """CalibrationEstimate.calibration_error refused the names of kdecal.calibration_error's
    estimators; its own regression's name is now "direct", the other one a clear error,
    and "refinement" on a plug-in estimate is the function's "refinement"."""
    s = make_seeds_synthetic(300, 3, seed=4)
    res = kdecal.estimate(s.probs, s.labels, bandwidth=0.1, progress=False)
    assert res.calibration_error("kl", estimator="residual") == res.calibration_error("kl")
    with pytest.raises(ValueError, match=r"estimator='plugin': this estimate's regression is"):
        res.calibration_error("kl", estimator="plugin")
    plug = kdecal.estimate(
        s.probs, s.labels, bandwidth=0.1, estimator="plugin", criterion="brier", progress=False
    )
    want = kdecal.calibration_error(
        s.probs, s.labels, bandwidth=0.1, estimator="refinement", divergence="l2"
    )
    assert plug.calibration_error("l2", estimator="refinement") == pytest.approx(want, rel=1e-12)
    with pytest.raises(TypeError, match="Bregman F must be a callable"):
        kdecal.Bregman(1, 2)
    with pytest.raises(TypeError, match="Bregman grad_F must be a callable"):
        kdecal.Bregman(np.sum, "grad")


def test_single_names_are_not_iterated_by_character():
    s = make_seeds_synthetic(200, 3, seed=5)
    est = kdecal.estimate(s.probs, s.labels, bandwidth=0.2, progress=False)
    one = est.calibration_tests("ce_l2", n_resamples=9, seed=1)
    assert one.keys() == {"ce_l2"}
    assert (
        one["ce_l2"].pvalue
        == est.calibration_tests(("ce_l2",), n_resamples=9, seed=1)["ce_l2"].pvalue
    )
    ci = est.confidence_intervals("ece_kde_l1", n_resamples=9, seed=1)
    assert ci.keys() == {"ece_kde_l1"}
    P2 = temperature_scale(s.probs, 1.5)
    cmp = kdecal.compare({"a": s.probs, "b": P2}, s.labels, quantities="ece_kde_l1", **_FAST)
    assert cmp.quantities == ["ece_kde_l1"]


_FAST = {"bandwidth": 0.2, "n_resamples": 9, "seed": 0}


def test_debiasing_warnings_only_where_the_number_reads_the_debiased_squares():
    """A row with one effective neighbour keeps its plain square; ece_kde(p=1) and the KL
    error read no square, returned the same number with and without debiasing, and still
    warned about those rows."""
    s = make_seeds_synthetic(60, 3, seed=2)
    P, y = s.probs, s.labels
    for estimator in ("residual", "plugin"):
        kw = {"bandwidth": 0.002, "estimator": estimator}
        with pytest.warns(kdecal.KdecalWarning, match="single effective neighbour"):
            kdecal.ece_kde(P, y, p=2, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("error", kdecal.KdecalWarning)
            warnings.simplefilter("ignore", kdecal.UnreliableEstimateWarning)
            l1 = kdecal.ece_kde(P, y, **kw)
            kl = kdecal.calibration_error(P, y, **kw)
        assert l1 == kdecal.ece_kde(P, y, debias="none", **kw)
        assert kl == kdecal.calibration_error(P, y, debias="none", **kw)
    with pytest.raises(ValueError, match="debias='ratio'"):
        kdecal.ece_kde(P, y, bandwidth=0.1, debias="ratio")  # p = 1 too: still refused
    with pytest.raises(TypeError, match="bandwidth must be a positive float, 'auto' or 'loo-mle'"):
        kdecal.ece_kde(P, y, bandwidth=[0.1])


def test_bin_index_refuses_what_has_no_bin():
    assert binned.bin_index([0.0, 0.3, 1.0], [0.0, 0.5, 1.0]).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match=r"x contains NaN at index \(1,\)"):
        binned.bin_index([0.2, np.nan], [0.0, 0.5, 1.0])
    for edges in ([1.0, 0.0], [0.0, np.nan, 1.0], [0.0, np.inf]):
        with pytest.raises(ValueError, match="edges must be finite and increasing"):
            binned.bin_index([0.2], edges)


def test_boolean_labels_of_more_than_two_classes_are_refused():
    """A correctness mask (argmax == y) passed as labels of a 10-class problem was read as
    the classes 0 and 1: an L1 error of 1.62 instead of 0.30, with no word."""
    s = make_seeds_synthetic(300, 4, seed=6)
    mask = s.probs.argmax(axis=1) == s.labels
    for call in (
        lambda: kdecal.ece_kde(s.probs, mask, bandwidth=0.2),
        lambda: binned.ece(s.probs, mask),
        lambda: kdecal.recalibration.TemperatureScaling().fit(np.log(s.probs), mask),
    ):
        with pytest.raises(ValueError, match=r"booleans, but (probs|scores) has K = 4 columns"):
            call()
    P2 = np.stack([1 - s.probs[:, 0], s.probs[:, 0]], axis=1)  # K = 2: booleans are 0/1
    yb = s.labels == 0
    assert kdecal.ece_kde(P2, yb, bandwidth=0.2) == kdecal.ece_kde(
        P2, yb.astype(int), bandwidth=0.2
    )


def test_l2_ece_intervals_are_the_signed_roots_of_the_squared_errors():
    """A helper's probe: with the default bandwidth_variability="add" the selection shift
    was added to the L2 ECE^KDE and to the squared L2 error separately, so 178 of 200
    replicates broke the README's identity ece_kde_l2 = signed root of ce_l2, and the two
    intervals (each centred on its estimate) did not correspond. Now every replicate and
    both endpoints are signed roots of the squared error's, in confidence_intervals and
    in compare."""
    s = make_seeds_synthetic(300, 3, t1=1, t2=1, seed=6)
    est = _quiet(kdecal.estimate, s.probs, s.labels)
    ci = _quiet(est.confidence_intervals, ["ece_kde_l2", "ce_l2"], n_resamples=200, seed=0)
    a, b = ci["ece_kde_l2"], ci["ce_l2"]

    def ssq(v):
        return np.sign(v) * np.square(v)

    plain = _quiet(
        est.confidence_interval,
        "ece_kde_l2",
        n_resamples=200,
        seed=0,
        bandwidth_variability="none",
    )  # the shifts moved the replicates (else this test shows nothing)
    assert not np.allclose(plain.bootstrap_distribution, a.bootstrap_distribution)
    np.testing.assert_allclose(ssq(a.bootstrap_distribution), b.bootstrap_distribution, atol=1e-15)
    np.testing.assert_allclose(
        ssq(np.array([a.estimate, a.low, a.high])),
        [b.estimate, b.low, b.high],
        rtol=1e-12,
        atol=1e-17,
    )
    assert a.low <= a.estimate <= a.high
    # alone, the same interval
    alone = _quiet(est.confidence_interval, "ece_kde_l2", n_resamples=200, seed=0)
    assert (alone.low, alone.high) == (a.low, a.high)
    res = _quiet(
        kdecal.compare,
        {"a": s.probs, "b": temperature_scale(s.probs, 0.8)},
        s.labels,
        quantities=("ece_kde_l2", "ce_l2"),
        n_resamples=40,
    )
    for k in "ab":
        r = res.estimates[k]
        got = ssq(np.array([r["ece_kde_l2"][x] for x in ("value", "low", "high")]))
        want = [r["ce_l2"][x] for x in ("value", "low", "high")]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-17)


def test_resampling_pvalue_counts_ties_up_to_rounding():
    """A null value equal to the statistic up to rounding counts as >=, a clearly smaller one not."""
    from kdecal._numerics import resampling_pvalue

    t = 0.014039857914926578
    below = np.array([t - 5.2e-18, t - 6.9e-18, t * (1 - 1e-9), t + 1e-3, 0.0])
    # the first two are ties, the third is 1e-9 below (not a tie), the fourth is above
    assert resampling_pvalue(below, t) == (1 + 3) / 6
    assert resampling_pvalue(np.array([0.0, -0.0]), 0.0) == 1.0
    assert resampling_pvalue(np.array([np.nan, 1.0]), 0.5) == 2 / 3
    # tiny statistics: ties within 1e-13 absolute, differences beyond it count
    t = 4.000600211385183e-24
    assert resampling_pvalue(np.array([t - 1.85e-28, t - 2e-13]), t) == 2 / 3
    # large statistics: ties within 1e-12 relative
    assert resampling_pvalue(np.array([1e4 * (1 - 1e-13), 1e4 * (1 - 1e-11)]), 1e4) == 2 / 3


@pytest.mark.parametrize("calibration", ["canonical", "top_label", "classwise"])
def test_calibration_test_of_one_hot_predictions_ties_every_resample(calibration):
    """Correct one-hot predictions: every redrawn label set is the observed one, so p = 1.

    Each null value equals the statistic in exact arithmetic; their rounding differed
    (summation order), and the p-value was 0.09 on one backend and 1.0 on another.
    """
    y = np.tile(np.arange(3), 14)
    P = np.eye(3)[y]
    for q in ("ce_l2", "ece_kde_l1"):
        t = kdecal.calibration_test(
            P, y, statistic=q, bandwidth=0.1, calibration=calibration, n_resamples=10, seed=0
        )
        assert t.pvalue == 1.0, (q, t.statistic, t.null_distribution - t.statistic)


def test_ordering_note_rule():
    """The canonical squared L2 error bounds the top-label one and K times the class-wise
    one from above in truth: the note speaks where the canonical interval's upper end is
    below half of the larger bound (each at its interval's lower end where it has one)."""
    from kdecal import _evaluate

    can = {"ce_l2": 0.0014, "ce_l2_ci": [0.0011, 0.0017], "bandwidth_l2": 0.889}
    top = {"ce_l2": 0.0062, "ce_l2_ci": [0.0052, 0.0079]}
    cw = {"ce_l2": 0.00086}
    (note,) = _evaluate._ordering_notes({"canonical": can, "top_label": top, "classwise": cw}, 10)
    assert "below 10 times the class-wise one (0.0086)" in note  # > 0.0052
    assert "interval up to 0.0017" in note and "at least about 0.0086" in note
    assert "(h = 0.889)" in note
    (note,) = _evaluate._ordering_notes({"canonical": can, "top_label": top}, 10)
    assert "below the top-label one (0.0052, its interval's lower end)" in note
    # a class-wise interval: K times its lower end
    cw_ci = {"ce_l2": 0.00086, "ce_l2_ci": [0.0002, 0.0015]}
    (note,) = _evaluate._ordering_notes(
        {"canonical": can, "top_label": top, "classwise": cw_ci}, 10
    )
    assert "the top-label one (0.0052" in note  # 10 x 0.0002 < 0.0052
    # the interval's upper end at half the bound or above: no note
    wide = dict(can, ce_l2_ci=[0.0011, 0.0027])
    assert _evaluate._ordering_notes({"canonical": wide, "top_label": top}, 10) == []
    # no canonical interval: no note (a calibrated model's point estimates cross the rule)
    point = {"ce_l2": 0.0001}
    assert _evaluate._ordering_notes({"canonical": point, "classwise": cw}, 10) == []
    assert not _evaluate._ordering_notes({"canonical": can, "classwise": cw}, 3)  # 0.0026
    # a NaN bound does not hide a finite one
    nan = {"ce_l2": math.nan}
    assert _evaluate._ordering_notes({"canonical": can, "top_label": nan, "classwise": cw}, 10)
    # bounds below ORDERING_MIN_SQUARED say nothing
    tiny = {"canonical": dict(can, ce_l2_ci=[-0.003, 0.0004]), "classwise": {"ce_l2": 0.00009}}
    assert _evaluate._ordering_notes(tiny, 10) == []
    assert _evaluate._ordering_notes({"top_label": top}, 10) == []


def test_evaluate_raises_the_canonical_squared_error_to_its_bounds():
    """A CIFAR-10 model (first 3,000 rows): at the Brier bandwidth the canonical squared
    L2 U-statistic is a third of the top-label estimate, its lower bound in truth. The
    report's canonical figure and its interval are raised to the bounds (so the ordering
    note has nothing left to say), the same numbers as kdecal.estimate's."""
    from conftest import real_file

    with np.load(real_file("cifar10_wideresnet164_netcal.npz")) as d:
        P, y = d["probs"][:3000], d["labels"][:3000]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        rep = kdecal.evaluate(P, y, n_resamples=20, seed=0)
        est = kdecal.estimate(P, y)
        ustat = kdecal.estimate(P, y, bandwidth=est.bandwidth_l2).value("ce_l2")
        ci = est.confidence_intervals(["ece_kde_l1", "ce_l2"], n_resamples=20, seed=0)
    can, top, cw = (rep.notions[k] for k in ("canonical", "top_label", "classwise"))
    bound = max(top["ce_l2"], 10 * cw["ce_l2"])
    assert ustat < 0.5 * bound  # the U-statistic alone: 0.0031 against 0.0058
    assert can["ce_l2"] == rep.ce_l2 == bound == est.value("ce_l2")
    # evaluate's bootstrap shares its pass (and its float32 products' blocking, float32
    # predictions) with the test's replicates: the same intervals to that rounding
    for q in ("ce_l2", "ece_kde_l1"):
        np.testing.assert_allclose(can[f"{q}_ci"], [ci[q].low, ci[q].high], rtol=1e-7)
    assert can["ce_l2_ci"][0] <= bound <= can["ce_l2_ci"][1]
    assert not any("Jensen" in note for note in rep.notes)
    # the class-wise row, not resampled itself, shows the squared L2 interval of the
    # replicates the canonical interval made: its own interval with the same seed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        own = kdecal.estimate(P, y, calibration="classwise").confidence_interval(
            "ce_l2", n_resamples=20, seed=0
        )
    assert "pvalue" not in cw and "ece_kde_l1_ci" not in cw
    assert cw["ce_l2_ci"] == [own.low, own.high]


def test_canonical_squared_l2_error_is_raised_to_its_lower_bounds():
    """In truth the canonical squared L2 error is at least the top-label one and K times
    the class-wise one (Jensen). With the defaults the residual U-statistic is raised to
    the larger estimate, in every public door; a fixed bandwidth or another notion keeps
    the U-statistic. The protocol's face cell, where the U-statistic is half the truth
    (0.0224): K = 4, (t1, t2) = (0.6, 0.6)."""
    s = make_seeds_synthetic(1000, 4, t1=0.6, t2=0.6, seed=0)
    P, y = s.probs, s.labels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        est = kdecal.estimate(P, y)
        ustat = kdecal.estimate(P, y, bandwidth=est.bandwidth_l2)
        top = kdecal.estimate(P, y, calibration="top_label").value("ce_l2")
        cw = kdecal.estimate(P, y, calibration="classwise").value("ce_l2")
        public = (
            kdecal.calibration_error(P, y, divergence="l2"),
            kdecal.ece_kde(P, y, p=2),
            kdecal.calibration_error(P, y, divergence="l2", estimator="residual"),
        )
    u = ustat.value("ce_l2")
    assert ustat.l2_lower_bounds == {}
    assert est.l2_lower_bounds == {"top_label": top, "classwise_times_K": 4 * cw}
    bound = max(top, 4 * cw)
    assert u < 0.75 * bound  # the bound binds: 0.0103 against 0.0213
    assert est.value("ce_l2") == bound == est.calibration_error("l2") == public[0] == public[2]
    assert est.value("ece_kde_l2") == est.ece_kde(2) == public[1] == math.sqrt(bound)
    # an estimate whose bounds are not made yet stays picklable (they are made on use)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        fresh = pickle.loads(pickle.dumps(kdecal.estimate(P, y)))
        assert fresh.value("ce_l2") == bound
    # the other quantities of the same estimate are untouched
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        at_h = kdecal.estimate(P, y, bandwidth=est.bandwidth)
    assert est.value("ece_kde_l1") == pytest.approx(at_h.value("ece_kde_l1"), rel=1e-12)
    assert est.value("ce_kl") == pytest.approx(ustat.value("ce_kl"), rel=1e-12)
    assert est.calibration_error("kl") == _quiet(kdecal.calibration_error, P, y, divergence="kl")
    # other notions and fixed bandwidths: the U-statistic
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        assert kdecal.calibration_error(P, y, divergence="l2", bandwidth=est.bandwidth_l2) == u
        assert kdecal.estimate(P, y, debias="none").l2_lower_bounds == {}
        assert kdecal.estimate(P, y, estimator="plugin").l2_lower_bounds == {}
        assert (
            kdecal.estimate(P[:, :2] / P[:, :2].sum(1, keepdims=True), y % 2).l2_lower_bounds == {}
        )


def test_canonical_squared_l2_replicates_are_raised_to_their_bounds_replicates():
    """Each bootstrap replicate of the canonical squared L2 error is the larger of the
    U-statistic's replicate and its bounds' replicates on the same row samples: the
    top-label and class-wise estimates' own replicates with the same seed."""
    s = make_seeds_synthetic(800, 4, t1=0.6, t2=0.6, seed=1)
    P, y = s.probs, s.labels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        est = kdecal.estimate(P, y)
        can = est.confidence_intervals(["ce_l2", "ece_kde_l2"], n_resamples=30, seed=4)
        top = kdecal.estimate(P, y, calibration="top_label").confidence_interval(
            "ce_l2", n_resamples=30, seed=4
        )
        cw = kdecal.estimate(P, y, calibration="classwise").confidence_interval(
            "ce_l2", n_resamples=30, seed=4
        )
    d = can["ce_l2"].bootstrap_distribution
    floor = np.maximum(top.bootstrap_distribution, 4 * cw.bootstrap_distribution)
    assert np.all(d >= floor)
    assert np.count_nonzero(d == floor) >= 15  # the bound binds in most replicates
    np.testing.assert_allclose(
        np.sign(can["ece_kde_l2"].bootstrap_distribution)
        * can["ece_kde_l2"].bootstrap_distribution ** 2,
        d,
        rtol=1e-12,
        atol=1e-15,
    )
    assert can["ce_l2"].low <= can["ce_l2"].estimate <= can["ce_l2"].high


def test_canonical_bounds_never_make_an_interval_fail_at_small_n():
    """At n = 4-6 a bootstrap replicate can leave a bound without any row that keeps a
    neighbour at its own bandwidth: the bound is undefined there and bounds nothing, so
    the canonical interval exists wherever the U-statistic's does."""
    rng = np.random.default_rng(0)
    made = 0
    for n in (4, 5, 6):
        for _ in range(4):
            P = rng.dirichlet(np.ones(3), n)
            y = rng.integers(0, 3, n)
            outcome = []
            for bounded in (True, False):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", kdecal.KdecalWarning)
                    est = kdecal.estimate(P, y)
                    if not bounded:
                        est._floors = []
                    try:
                        ci = est.confidence_interval("ce_l2", n_resamples=10, seed=0)
                    except ResamplingError:
                        outcome.append(None)
                    else:
                        assert np.all(np.isfinite(ci.bootstrap_distribution))
                        outcome.append(ci.estimate)
            assert (outcome[0] is None) == (outcome[1] is None)
            made += outcome[0] is not None
    assert made >= 6
