"""The report's top-label metrics without a kernel: their bootstrap intervals, and the
selection of what ``kdecal.evaluate`` / ``kdecal evaluate --metrics`` reports (issue 28)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import kdecal
from kdecal import binned
from kdecal._estimation import replicates as _replicates
from kdecal.cli import main

R, SEED = 12, 5


def _data(n: int = 300, k: int = 3, seed: int = 3):
    """Predictions over-confident by a temperature of 1.4: miscalibrated, top-label."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(k, 0.8), n)
    Q = kdecal.datasets.temperature_scale(P, 1.4)  # the true class distribution
    y = np.array([rng.choice(k, p=q) for q in Q])
    return P, y


def _evaluate(P, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        return kdecal.evaluate(P, y, bandwidth=0.1, **kw)


def _table_rows(text: str) -> list[str]:
    """Names of the metric table's rows (between the rule and the first blank line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("-----")) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.startswith("bandwidth rule"):
            break
        rows.append(line.split()[0])
    return rows


def test_smooth_and_debiased_ece_intervals_recomputed_by_hand():
    """The intervals of smooth_ece and ece_binned_debiased are the percentile intervals,
    centred on the estimate, of the public functions on the bootstrap row samples drawn
    with the report's seed (those of the kernel intervals): recomputed here from
    ``draw_bootstrap_counts`` and ``np.quantile``, they agree to 1e-12."""
    P, y = _data()
    report = _evaluate(P, y, n_resamples=R, seed=SEED, calibration_loss=False)
    assert set(report.intervals) == {"smooth_ece", "ece_binned_debiased"}
    Pv = report.estimates["canonical"]._probs
    publics = {
        "smooth_ece": kdecal.smooth_ece,
        "ece_binned_debiased": lambda p, t: binned.ece(p, t, p=2, debias=True),
    }
    counts = _replicates.draw_bootstrap_counts(len(y), R, np.random.default_rng(SEED))
    for q, fn in publics.items():
        value = fn(Pv, y)
        assert getattr(report, q) == pytest.approx(value, rel=1e-12)
        idx = [np.repeat(np.arange(len(y)), c) for c in counts]
        reps = np.array([fn(Pv[i], y[i]) for i in idx])
        lo, hi = np.quantile(reps, [0.025, 0.975]) - np.median(reps) + value
        low, high = report.intervals[q]
        assert low == pytest.approx(lo, rel=1e-12, abs=1e-15)
        assert high == pytest.approx(hi, rel=1e-12, abs=1e-15)
        assert low <= getattr(report, q) <= high
        assert high - low > 0.0
    # the kernel intervals of the same report come from the same seed's samples: their
    # numbers are those of the estimate's own interval with that seed
    top = report.estimates["top_label"]
    ci = top.confidence_interval("ece_kde_l1", n_resamples=R, seed=SEED)
    assert report.notions["top_label"]["ece_kde_l1_ci"] == pytest.approx([ci.low, ci.high])


def test_intervals_in_the_table_and_the_json_and_none_without_resampling():
    P, y = _data()
    report = _evaluate(P, y, n_resamples=R, seed=SEED, calibration_loss=False)
    text = str(report)
    assert "  95% CI  " in text
    low, high = report.intervals["smooth_ece"]
    line = next(x for x in text.splitlines() if x.startswith("smooth_ece "))
    assert f"[{low:.6f}, {high:.6f}]" in line
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["intervals"] == {q: list(v) for q, v in report.intervals.items()}
    assert d["metrics"] is None and d["mce_binned"] is None
    assert kdecal.CalibrationReport(**d).intervals == report.intervals
    # the full report's table: every row as before, in the same order
    assert _table_rows(text) == [
        *kdecal.QUANTITIES,
        "accuracy",
        "log_loss",
        "brier_score",
        "ece_binned",
        "smooth_ece",
        "ece_binned_debiased",
    ]

    bare = _evaluate(P, y, n_resamples=0, calibration_loss=False)
    assert bare.intervals == {}
    assert "  95% CI  " not in str(bare)  # no interval column in the metric table
    assert bare.smooth_ece == report.smooth_ece


def test_metrics_selects_what_the_report_computes_and_prints():
    """A selection prints its metrics in its order, computes mce_binned only when named,
    gives every named row metric an interval, and leaves out the notion table (and its
    resampling) and the calibration loss unless a notion quantity is named; the
    numbers are those of the full report."""
    P, y = _data()
    full = _evaluate(P, y, n_resamples=R, seed=SEED)
    sel = _evaluate(P, y, n_resamples=R, seed=SEED, metrics=["mce_binned", "ce_kl", "ece_binned"])
    Pv = full.estimates["canonical"]._probs
    assert sel.metrics == ["mce_binned", "ce_kl", "ece_binned"]
    assert sel.mce_binned == pytest.approx(binned.ece(Pv, y, p=np.inf), rel=1e-12)
    assert sel.ce_kl == full.ce_kl and sel.ece_binned == full.ece_binned
    assert sel.notions == {} and sel.calibration_loss is None
    assert set(sel.intervals) == {"mce_binned", "ece_binned"}
    for q, (low, high) in sel.intervals.items():
        assert low <= getattr(sel, q) <= high
    text = str(sel)
    assert _table_rows(text) == ["mce_binned", "ce_kl", "ece_binned"]
    assert "[N15]" in text and "[FR25]" not in text and "notion" not in text

    with_notions = _evaluate(P, y, n_resamples=R, seed=SEED, metrics="ece_kde_l1")
    assert with_notions.metrics == ["ece_kde_l1"]
    assert with_notions.notions == full.notions
    assert with_notions.intervals == {}
    assert _table_rows(str(with_notions)) == ["ece_kde_l1"]


@pytest.mark.parametrize(
    ("metrics", "error", "match"),
    [
        (["smooth_ece", "ece_kde_l3"], ValueError, r"metrics must be keys .*got 'ece_kde_l3'"),
        ([], ValueError, "metrics is empty"),
        (3, TypeError, "metrics must be None, a metric name or a sequence"),
    ],
)
def test_metrics_refused(metrics, error, match):
    P, y = _data(n=40)
    with pytest.raises(error, match=match) as info:
        kdecal.evaluate(P, y, n_resamples=0, metrics=metrics)
    if error is ValueError and "keys" in match:
        assert "smooth_ece" in str(info.value) and "ce_l2" in str(info.value)


def test_cli_evaluate_metrics(tmp_path, capsys):
    P, y = _data()
    f = tmp_path / "p.npz"
    np.savez(f, probs=P, labels=y)
    args = ["evaluate", str(f), "--quiet", "--bandwidth", "0.1", "--n-resamples", "6"]
    assert main([*args, "--json", "--metrics", "smooth_ece, ce_l2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"] == ["smooth_ece", "ce_l2"]
    assert set(out["intervals"]) == {"smooth_ece"}
    assert set(out["notions"]) == {"canonical", "top_label", "classwise"}
    assert out["smooth_ece"] == pytest.approx(kdecal.smooth_ece(P, y), rel=1e-12)

    assert main([*args, "--metrics", "ece_binned_debiased"]) == 0
    text = capsys.readouterr().out
    assert _table_rows(text) == ["ece_binned_debiased"]

    assert main([*args, "--metrics", "smooth_ece,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("kdecal: error: argument --metrics")
    assert "unknown 'nope'" in err and "mce_binned" in err and "ece_kde_l1" in err


def test_cli_evaluate_metrics_json_holds_what_the_table_prints(tmp_path, capsys):
    """``--metrics M1,M2 --json`` printed every kernel quantity and context metric of the
    report (ece_kde_l1, accuracy, ...), where the table prints M1 and M2: the metrics
    not named are now null; the keys are those of the full report's JSON."""
    P, y = _data()
    f = tmp_path / "p.npz"
    np.savez(f, probs=P, labels=y)
    args = ["evaluate", str(f), "--quiet", "--bandwidth", "0.1", "--n-resamples", "6"]
    args += ["--metrics", "ce_kl,smooth_ece"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main([*args[:-2], "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert list(d) == list(full)  # the same schema
    assert _table_rows(text) == ["ce_kl", "smooth_ece"]
    shown = {
        x.split()[0]: x.split()[1]
        for x in text.splitlines()
        if x.startswith(("ce_kl ", "smooth_ece "))
    }
    assert shown == {"ce_kl": f"{d['ce_kl']:.6f}", "smooth_ece": f"{d['smooth_ece']:.6f}"}
    assert d["ce_kl"] == pytest.approx(full["ce_kl"], rel=1e-12)
    assert d["smooth_ece"] == pytest.approx(kdecal.smooth_ece(P, y), rel=1e-12)
    assert list(d["intervals"]) == ["smooth_ece"]
    hidden = [*kdecal.QUANTITIES, "accuracy", "log_loss", "brier_score", "ece_binned"]
    hidden += ["ece_binned_debiased", "mce_binned", "calibration_loss"]
    hidden.remove("ce_kl")
    assert {q: d[q] for q in hidden} == dict.fromkeys(hidden)  # were numbers
    assert full["ece_kde_l1"] == pytest.approx(0.135817, abs=1e-6)  # was in d too
    assert full["accuracy"] == pytest.approx(0.616667, abs=1e-6)
    assert d["n"] == 300 and d["bandwidth"] == 0.1 and d["notions"] == {}
    # a report made from that JSON prints the same table
    table = [x for x in text.splitlines() if not x.startswith("n = ")]
    again = str(kdecal.CalibrationReport(**d)).splitlines()
    assert [x for x in again if not x.startswith("n = ")] == table


def test_row_bootstrap_equals_the_metrics_of_the_resampled_rows():
    # a replicate of every row metric is the metric of the rows repeated by their
    # multiplicities (taken from the top-label problem of all rows, once per model), bit
    # for bit; two models on the same row samples
    from kdecal._row_metrics import ROW_METRICS, row_bootstrap

    P, y = _data(400, 4, seed=9)
    Q = kdecal.datasets.temperature_scale(P, 1.4)
    R = 5
    got = row_bootstrap({"a": P, "b": Q}, y, list(ROW_METRICS), R, 7)
    counts = _replicates.draw_bootstrap_counts(len(y), R, np.random.default_rng(7))
    for r in range(R):
        idx = np.repeat(np.arange(len(y)), counts[r])
        for name, M in (("a", P), ("b", Q)):
            for q, f in ROW_METRICS.items():
                assert got[name][q][r] == f(M[idx], y[idx]), (name, q, r)
    assert ROW_METRICS["ece_binned"](P, y) == binned.ece(P, y, n_bins=15)


def test_calibration_loss_notes_the_affine_floor_at_many_classes():
    """Beyond K = 10 the stratified cross-validated affine calibrator gives a calibrated
    model a loss of about (K - 1) / (2n) nats (the sampling noise of the class
    frequencies): the report notes it where its loss is within three times that floor,
    not for a model whose loss is far above it, nor at K <= 10."""
    from kdecal import scores

    rng = np.random.default_rng(11)
    n, k = 2000, 40  # 50 rows per class: affine
    z = 2.0 * rng.normal(size=(n, k))
    P = np.exp(z - z.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    y = np.array([rng.choice(k, p=p) for p in P])  # calibrated
    floor = (k - 1) / (2 * n)
    report = _evaluate(P, y, n_resamples=0, notions=())
    assert report.calibration_loss_calibrator == "affine"
    assert 0 < report.calibration_loss < 3 * floor  # the floor, not miscalibration
    noted = [note for note in report.notes if "floor of the affine calibrator" in note]
    assert len(noted) == 1 and f"(K - 1) / (2n) = {floor:.4g} nats" in noted[0]
    ts = scores.calibration_loss(P, y, input="probs", relative=False, calibrator="temperature")
    assert abs(ts) < 0.2 * floor  # temperature scaling has no such floor
    hot = kdecal.datasets.temperature_scale(P, 0.5)  # under-confident: a loss far above it
    report = _evaluate(hot, y, n_resamples=0, notions=())
    assert report.calibration_loss > 3 * floor
    assert not any("floor of the affine" in note for note in report.notes)
    P10, y10 = _data(600, 10, seed=2)
    report = _evaluate(P10, y10, n_resamples=0, notions=())
    assert not any("floor of the affine" in note for note in report.notes)


def test_report_equality_ignores_the_estimates_it_holds():
    """A report and its JSON round trip compare equal (the estimates it holds for plots
    are declared compare=False, and the value equality of results now honours that);
    two evaluations of the same data differ only in their wall time."""
    import dataclasses

    P, y = _data(200, 3, seed=0)
    report = _evaluate(P, y, n_resamples=0)
    back = kdecal.CalibrationReport(**json.loads(json.dumps(report.to_dict())))
    assert report.estimates and not back.estimates
    assert back == report
    again = _evaluate(P, y, n_resamples=0)
    assert dataclasses.replace(again, wall_time_s=report.wall_time_s) == report
    assert dataclasses.replace(again, ece_kde_l1=0.5) != report


def test_kl_note_names_the_calibration_losss_recalibration():
    """The note on a KL figure below the calibration loss names the recalibration the
    loss was measured with: temperature scaling with few rows per class, else affine."""
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(4), size=40)  # 10 rows per class: temperature scaling
    y = rng.integers(0, 3, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        report = kdecal.evaluate(P, y, n_resamples=0)
    assert report.calibration_loss_calibrator == "temperature"
    noted = [note for note in report.notes if note.startswith("ce_kl (")]
    assert report.ce_kl < report.calibration_loss and len(noted) == 1
    assert "a cross-validated temperature scaling removes" in noted[0]
    assert "affine" not in noted[0]


def test_calibration_loss_uses_temperature_scaling_with_few_rows_per_class():
    """Below 20 rows per class the affine calibrator's K + 1 parameters overfit the
    cross-validation folds (n = 5,000, K = 1,000: -0.125 nats for a calibrated model,
    temperature scaling -0.0001): the report's calibration loss is then that of
    temperature scaling, says so in its description, its note and its JSON; above, the
    affine one, as before."""
    from kdecal import scores

    for n, k, calibrator in ((300, 30, "temperature"), (300, 3, "affine")):
        P, y = _data(n, k, seed=7)
        report = _evaluate(P, y, n_resamples=0)
        assert report.calibration_loss_calibrator == calibrator
        want = scores.calibration_loss(
            P, y, input="probs", relative=False, seed=0, calibrator=calibrator
        )
        assert report.calibration_loss == pytest.approx(want, rel=1e-6)  # clipped input
        text = str(report)
        words = {"affine": "affine calibration", "temperature": "temperature scaling"}
        assert f"after cross-validated {words[calibrator]} [FR25]" in text
        noted = [note for note in report.notes if "uses temperature scaling" in note]
        assert len(noted) == (calibrator == "temperature")
        if noted:
            assert "10.0 rows per class (n = 300, K = 30)" in noted[0]
        back = kdecal.CalibrationReport(**json.loads(json.dumps(report.to_dict())))
        assert back.calibration_loss_calibrator == calibrator
