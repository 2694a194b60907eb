"""Tests of the command line (kdecal.cli), the file reader (kdecal._io) and the report."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import warnings

import numpy as np
import pytest

import kdecal
from kdecal._io import InputFileError, bundled_example_path, load_predictions
from kdecal._report import CalibrationReport
from kdecal.cli import main

N, K = 200, 3
BW = "0.05"  # a fixed bandwidth keeps the tests fast (no bandwidth search)
# no bootstrap intervals / calibration tests: these tests are about reading files
NO_RESAMPLING = ("--n-resamples", "0")


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def _synthetic(seed: int = 0, n: int = N, k: int = K):
    """Logits, probabilities and labels drawn from the model itself (calibrated)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, k))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(k, p=row) for row in probs], dtype=np.int64)
    return logits, probs, labels


def _accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    if scores.ndim == 1:
        return float(np.mean((scores > 0.5).astype(int) == labels))
    return float(np.mean(scores.argmax(axis=1) == labels))


def _run_json(capsys, *argv: str) -> dict:
    code = main(["evaluate", *argv, "--json", "--quiet", "--bandwidth", BW, *NO_RESAMPLING])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _run_error(capsys, *argv: str) -> str:
    code = main(["evaluate", *argv, "--quiet", "--bandwidth", BW])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kdecal: error: ")
    return lines[0]


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


# --------------------------------------------------------------------------- #
# round trips through each format
# --------------------------------------------------------------------------- #


def test_npz_probs_round_trip(tmp_path, capsys):
    """A probs/labels .npz gives the right n, K and accuracy."""
    _, probs, labels = _synthetic()
    f = tmp_path / "preds.npz"
    np.savez(f, probs=probs, labels=labels)
    d = _run_json(capsys, str(f))
    assert d["n"] == N
    assert d["n_classes"] == K
    assert d["accuracy"] == pytest.approx(_accuracy(probs, labels), abs=1e-12)
    assert d["bandwidth"] == pytest.approx(float(BW))
    assert "preds.npz" in d["source"]


def test_npz_logits_key_applies_softmax(tmp_path, capsys):
    """A 'logits' key is passed through softmax before evaluation."""
    logits, probs, labels = _synthetic(1)
    f = tmp_path / "logits.npz"
    np.savez(f, logits=logits, labels=labels)
    # debias "none" on both sides: "ustat" warns (negative CE_2^2) on calibrated data
    d = _run_json(capsys, str(f), "--debias", "none")
    direct = kdecal.evaluate(
        probs, labels, bandwidth=float(BW), debias="none", backend="auto", n_resamples=0
    )
    assert d["n"] == N and d["n_classes"] == K
    assert d["accuracy"] == pytest.approx(_accuracy(logits, labels), abs=1e-12)
    assert d["log_loss"] == pytest.approx(direct.log_loss, rel=1e-9)
    assert d["ece_kde_l1"] == pytest.approx(direct.ece_kde_l1, rel=1e-6)


def test_npy_pair_with_prefixed_labels(tmp_path, capsys):
    """X.npy takes its labels from X_labels.npy before labels.npy."""
    _, probs, labels = _synthetic(2)
    np.save(tmp_path / "preds.npy", probs)
    np.save(tmp_path / "preds_labels.npy", labels)
    np.save(tmp_path / "labels.npy", np.zeros(N, dtype=np.int64))  # must not be used
    d = _run_json(capsys, str(tmp_path / "preds.npy"))
    assert d["n"] == N and d["n_classes"] == K
    assert d["accuracy"] == pytest.approx(_accuracy(probs, labels), abs=1e-12)


def test_npy_pair_with_plain_labels_file(tmp_path, capsys):
    """X.npy falls back to labels.npy in the same folder."""
    _, probs, labels = _synthetic(3)
    np.save(tmp_path / "scores.npy", probs.astype(np.float32))
    np.save(tmp_path / "labels.npy", labels.astype(np.int32))
    d = _run_json(capsys, str(tmp_path / "scores.npy"))
    assert d["n"] == N and d["n_classes"] == K
    assert d["accuracy"] == pytest.approx(_accuracy(probs, labels), abs=1e-12)


def test_csv_round_trip_ignores_id_and_text_columns(tmp_path, capsys):
    """CSV score columns are read in order; id and text columns are ignored."""
    _, probs, labels = _synthetic(4)
    f = tmp_path / "preds.csv"
    rows = [
        [i, f"img_{i}.png", *map(repr, map(float, p)), int(y)]
        for i, (p, y) in enumerate(zip(probs, labels))
    ]
    _write_csv(f, ["id", "file", "p0", "p1", "p2", "label"], rows)
    d = _run_json(capsys, str(f))
    assert d["n"] == N and d["n_classes"] == K
    assert d["accuracy"] == pytest.approx(_accuracy(probs, labels), abs=1e-12)
    scores, lab, is_logits, desc = load_predictions(f)
    assert scores.shape == (N, K) and not is_logits
    np.testing.assert_allclose(scores, probs, rtol=1e-15)
    np.testing.assert_array_equal(lab, labels)
    assert "'id'" in desc and "'file'" in desc


def test_csv_binary_single_column(tmp_path, capsys):
    """A single CSV score column is binary P(y=1)."""
    rng = np.random.default_rng(5)
    p1 = rng.uniform(size=N)
    labels = (rng.uniform(size=N) < p1).astype(int)
    f = tmp_path / "binary.csv"
    _write_csv(f, ["score", "labels"], [[repr(float(p)), y] for p, y in zip(p1, labels)])
    scores, _, is_logits, _ = load_predictions(f)
    assert scores.shape == (N,) and not is_logits
    d = _run_json(capsys, str(f))
    assert d["n"] == N and d["n_classes"] == 2
    assert d["accuracy"] == pytest.approx(_accuracy(p1, labels), abs=1e-12)


def test_parquet_round_trip(tmp_path, capsys):
    """Parquet with one numeric column per class."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _, probs, labels = _synthetic(6)
    f = tmp_path / "preds.parquet"
    table = pa.table({"p0": probs[:, 0], "p1": probs[:, 1], "p2": probs[:, 2], "label": labels})
    pq.write_table(table, f)
    d = _run_json(capsys, str(f))
    assert d["n"] == N and d["n_classes"] == K
    assert d["accuracy"] == pytest.approx(_accuracy(probs, labels), abs=1e-12)


def test_parquet_list_column(tmp_path):
    """Parquet with one list-valued column holding each row's vector."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _, probs, labels = _synthetic(7)
    f = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"probs": list(probs), "labels": labels}), f)
    scores, lab, is_logits, _ = load_predictions(f)
    np.testing.assert_allclose(scores, probs)
    np.testing.assert_array_equal(lab, labels)
    assert not is_logits


def test_parquet_duplicate_columns_are_named(tmp_path, capsys):
    """Columns sharing a name made pyarrow fail ("Multiple matches for FieldRef.Name(p)"),
    reported as "is not a readable Parquet file": now the error names them."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _, probs, labels = _synthetic(8)
    cols = [pa.array(probs[:, 0]), pa.array(probs[:, 1]), pa.array(probs[:, 2])]
    f = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([*cols, pa.array(labels)], ["p", "p", "q", "label"]), f)
    assert _run_error(capsys, str(f)) == (
        f"kdecal: error: {f}: has duplicate column names: 'p' (2 times); give each column "
        "a unique name"
    )
    g = tmp_path / "dup_labels.parquet"
    table = pa.Table.from_arrays(
        [*cols, pa.array(labels), pa.array(labels), pa.array(labels), cols[0]],
        ["p0", "p1", "p2", "label", "label", "label", "p0"],
    )
    pq.write_table(table, g)
    with pytest.raises(InputFileError) as info:
        load_predictions(g)
    assert str(info.value) == (
        f"{g}: has duplicate column names: 'p0' (2 times), 'label' (3 times); give each "
        "column a unique name"
    )


def test_default_bandwidth_is_auto(tmp_path, capsys):
    """Without --bandwidth the bandwidth is selected (and reported); --debias is ustat."""
    _, probs, labels = _synthetic(9)
    f = tmp_path / "auto.npz"
    np.savez(f, probs=probs, labels=labels)
    assert main(["evaluate", str(f), "--json", "--quiet", *NO_RESAMPLING]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bandwidth"] == pytest.approx(kdecal.select_bandwidth(probs, labels))
    assert d["bandwidth_rule"] == "brier (L2, KL: brier / 2)"
    assert d["estimator"] == "residual"
    assert d["bandwidth_l2"] == d["bandwidth_kl"] == pytest.approx(d["bandwidth"] / 2)
    assert d["debias"] == "ustat"
    assert d["n"] == N


def test_class_count_rules_match_the_api(tmp_path, capsys, monkeypatch):
    """The command line applies evaluate's rules that read the predictions' shape as the
    API does: beyond K = 10 the report is top-label without a canonical row, the
    class-wise cost limit drops that notion, and the long-run warning is given (the
    command line passes validated predictions, whose shape these rules once missed)."""
    _, probs, labels = _synthetic(11, n=300, k=11)
    f = tmp_path / "k11.npz"
    np.savez(f, probs=probs, labels=labels)
    d = _run_json(capsys, str(f), "--metrics", "ece_kde_l1")
    api = kdecal.evaluate(
        probs, labels, n_resamples=0, bandwidth=float(BW), metrics=["ece_kde_l1"]
    ).to_dict()
    assert d["calibration"] == api["calibration"] == "top_label"
    assert list(d["notions"]) == list(api["notions"]) == ["top_label", "classwise"]
    assert d["ece_kde_l1"] == api["ece_kde_l1"]
    from kdecal import _evaluate

    monkeypatch.setattr(_evaluate, "CLASSWISE_AUTO_MAX_SECONDS", 0.0)
    d = _run_json(capsys, str(f), "--metrics", "ece_kde_l1")
    assert list(d["notions"]) == ["top_label"]
    monkeypatch.setattr(_evaluate, "LONG_ESTIMATE_SECONDS", 0.0)
    assert main(["evaluate", str(f), "--json", *NO_RESAMPLING, "--notions", "classwise"]) == 0
    err = capsys.readouterr().err
    assert "kdecal: warning: kdecal.evaluate: the class-wise estimate at n = 300, K = 11" in err
    # the library's "kdecal: " prefix is not repeated after the command's own
    g = tmp_path / "k11b.npz"
    np.savez(g, probs=np.roll(probs, 1, axis=0), labels=labels)
    argv = ["compare", str(f), str(g), "--calibration", "canonical", "--bandwidth", BW]
    assert main([*argv, "--n-resamples", "3"]) == 0
    err = capsys.readouterr().err
    assert "kdecal: warning: the canonical kernel estimates at K = 11" in err
    assert "kdecal: warning: kdecal: " not in err


def test_text_output_is_a_table(tmp_path, capsys):
    """Without --json the report is printed as a table."""
    _, probs, labels = _synthetic(8)
    f = tmp_path / "preds.npz"
    np.savez(f, probs=probs, labels=labels)
    assert main(["evaluate", str(f), "--quiet", "--bandwidth", BW, *NO_RESAMPLING]) == 0
    out = capsys.readouterr().out
    assert "preds.npz" in out
    assert f"n = {N}, K = {K}" in out
    for name in ("ece_kde_l1", "ece_kde_l2", "ce_kl", "accuracy", "ece_binned"):
        assert name in out
    assert "ECE^KDE (L1, canonical)" in out


# --------------------------------------------------------------------------- #
# splits
# --------------------------------------------------------------------------- #


@pytest.fixture
def split_file(tmp_path):
    """Write a .npz file with val_ and test_ prefixed keys of different sizes."""
    lv, _, yv = _synthetic(10, n=150)
    lt, _, yt = _synthetic(11, n=N)
    f = tmp_path / "splits.npz"
    np.savez(f, val_logits=lv, val_labels=yv, test_logits=lt, test_labels=yt)
    return f, (lv, yv), (lt, yt)


def test_split_default_is_test(split_file, capsys):
    """Without --split the test split is used."""
    f, _, (lt, yt) = split_file
    d = _run_json(capsys, str(f))
    assert d["n"] == N
    assert d["accuracy"] == pytest.approx(_accuracy(lt, yt), abs=1e-12)
    assert "test_logits" in d["source"]


def test_split_val(split_file, capsys):
    """--split val reads the val_ keys."""
    f, (lv, yv), _ = split_file
    d = _run_json(capsys, str(f), "--split", "val")
    assert d["n"] == 150
    assert d["accuracy"] == pytest.approx(_accuracy(lv, yv), abs=1e-12)
    assert "val_logits" in d["source"]


def test_split_absent_lists_splits_present(tmp_path, capsys):
    """Asking for a missing split lists the splits present."""
    lv, _, yv = _synthetic(12)
    f = tmp_path / "valonly.npz"
    np.savez(f, val_logits=lv, val_labels=yv)
    line = _run_error(capsys, str(f), "--split", "test")
    assert "valonly.npz" in line and "'test'" in line and "val" in line
    # without --split, the only split present is used
    d = _run_json(capsys, str(f))
    assert d["n"] == N


def test_split_on_unsplit_file_is_an_error(tmp_path, capsys):
    """--split on a file without prefixed keys is an error."""
    _, probs, labels = _synthetic(13)
    f = tmp_path / "plain.npz"
    np.savez(f, probs=probs, labels=labels)
    line = _run_error(capsys, str(f), "--split", "val")
    assert "plain.npz" in line


# --------------------------------------------------------------------------- #
# logits inference
# --------------------------------------------------------------------------- #


def test_logits_inferred_from_values(tmp_path, capsys):
    """Values outside [0, 1] are taken as logits."""
    logits, probs, labels = _synthetic(14)
    np.save(tmp_path / "raw.npy", logits)
    np.save(tmp_path / "raw_labels.npy", labels)
    _, _, is_logits, desc = load_predictions(tmp_path / "raw.npy")
    assert is_logits and "logits" in desc
    d = _run_json(capsys, str(tmp_path / "raw.npy"))
    direct = kdecal.evaluate(probs, labels, bandwidth=float(BW), backend="auto", n_resamples=0)
    assert d["accuracy"] == pytest.approx(_accuracy(logits, labels), abs=1e-12)
    assert d["log_loss"] == pytest.approx(direct.log_loss, rel=1e-9)


def test_scores_in_unit_interval_off_the_simplex_are_refused(tmp_path):
    """Scores in [0, 1] whose rows do not sum to 1 are neither inferred as logits nor as
    probabilities: the error names both flags; either flag is then honoured."""
    rng = np.random.default_rng(15)
    scores = rng.uniform(0.0, 1.0, size=(N, K))  # inside [0, 1] but not normalised
    np.save(tmp_path / "u.npy", scores)
    np.save(tmp_path / "labels.npy", rng.integers(0, K, N))
    with pytest.raises(InputFileError, match=r"cannot tell .*--probs.*--logits"):
        load_predictions(tmp_path / "u.npy")
    assert load_predictions(tmp_path / "u.npy", logits=True)[2] is True
    assert load_predictions(tmp_path / "u.npy", logits=False)[2] is False


def test_probabilities_not_taken_for_logits(tmp_path):
    """Proper probabilities are inferred as such, and refused when declared logits."""
    _, probs, labels = _synthetic(16)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "labels.npy", labels)
    assert load_predictions(tmp_path / "p.npy")[2] is False
    with pytest.raises(InputFileError, match=r"given as logits .*Pass --probs"):
        load_predictions(tmp_path / "p.npy", logits=True)


def test_binary_logit_column_uses_sigmoid(tmp_path, capsys):
    """A single log-odds column goes through the sigmoid."""
    rng = np.random.default_rng(17)
    z = rng.normal(scale=3.0, size=N)
    labels = (rng.uniform(size=N) < 1 / (1 + np.exp(-z))).astype(int)
    f = tmp_path / "logodds.csv"
    _write_csv(f, ["logit", "label"], [[repr(float(v)), y] for v, y in zip(z, labels)])
    assert load_predictions(f)[2] is True
    d = _run_json(capsys, str(f))
    assert d["n_classes"] == 2
    assert d["accuracy"] == pytest.approx(np.mean((z > 0).astype(int) == labels), abs=1e-12)


def test_probs_flag_overrides_logits_key(tmp_path, capsys):
    """--probs overrides the 'logits' key name."""
    _, probs, labels = _synthetic(18)
    f = tmp_path / "mislabelled.npz"
    np.savez(f, logits=probs, labels=labels)  # probabilities stored under "logits"
    d = _run_json(capsys, str(f), "--probs")
    direct = kdecal.evaluate(probs, labels, bandwidth=float(BW), backend="auto", n_resamples=0)
    assert d["log_loss"] == pytest.approx(direct.log_loss, rel=1e-9)


def test_forcing_probs_on_logits_is_an_error(tmp_path, capsys):
    """Logits forced to be probabilities fail kdecal's validation."""
    logits, _, labels = _synthetic(19)
    f = tmp_path / "logits.npz"
    np.savez(f, logits=logits, labels=labels)
    _run_error(capsys, str(f), "--probs")


# --------------------------------------------------------------------------- #
# bad input: exit status 2 and one line on stderr naming the file
# --------------------------------------------------------------------------- #


def test_missing_file(tmp_path, capsys):
    """A missing file is one error line."""
    line = _run_error(capsys, str(tmp_path / "nope.npz"))
    assert "nope.npz" in line and "not found" in line


def test_unknown_extension(tmp_path, capsys):
    """An unknown extension is one error line naming it."""
    f = tmp_path / "preds.txt"
    f.write_text("0.5,0.5,1\n")
    line = _run_error(capsys, str(f))
    assert "preds.txt" in line and ".txt" in line and "extension" in line


def test_npz_missing_labels_key(tmp_path, capsys):
    """A .npz without labels is one error line."""
    _, probs, _ = _synthetic(20)
    f = tmp_path / "nolabels.npz"
    np.savez(f, probs=probs)
    line = _run_error(capsys, str(f))
    assert "nolabels.npz" in line and "labels" in line


def test_npz_missing_scores_key(tmp_path, capsys):
    """A .npz without probs/logits is one error line."""
    f = tmp_path / "noscores.npz"
    np.savez(f, labels=np.zeros(N, dtype=int))
    line = _run_error(capsys, str(f))
    assert "noscores.npz" in line and "probs" in line


def test_npz_wrong_score_shape(tmp_path, capsys):
    """3-D scores are rejected."""
    f = tmp_path / "cube.npz"
    np.savez(f, probs=np.full((N, K, 2), 1.0 / (2 * K)), labels=np.zeros(N, dtype=int))
    line = _run_error(capsys, str(f))
    assert "cube.npz" in line and "shape" in line


def test_npz_wrong_label_shape(tmp_path, capsys):
    """2-D labels are rejected."""
    _, probs, _ = _synthetic(21)
    f = tmp_path / "labels2d.npz"
    np.savez(f, probs=probs, labels=np.zeros((N, 2), dtype=int))
    line = _run_error(capsys, str(f))
    assert "labels2d.npz" in line and "shape" in line


def test_labels_length_mismatch(tmp_path, capsys):
    """Scores and labels of different lengths are rejected with both lengths."""
    _, probs, labels = _synthetic(22)
    f = tmp_path / "short.npz"
    np.savez(f, probs=probs, labels=labels[:-5])
    line = _run_error(capsys, str(f))
    assert "short.npz" in line and str(N) in line and str(N - 5) in line


def test_npy_without_labels_file(tmp_path, capsys):
    """A lone .npy names the labels files it looked for."""
    _, probs, _ = _synthetic(23)
    np.save(tmp_path / "alone.npy", probs)
    line = _run_error(capsys, str(tmp_path / "alone.npy"))
    assert "alone.npy" in line and "alone_labels.npy" in line and "labels.npy" in line


def test_csv_without_label_column(tmp_path, capsys):
    """A CSV without a label column is rejected."""
    _, probs, _ = _synthetic(24)
    f = tmp_path / "nolabel.csv"
    _write_csv(f, ["p0", "p1", "p2"], probs.tolist())
    line = _run_error(capsys, str(f))
    assert "nolabel.csv" in line and "label" in line


def test_csv_ragged_row(tmp_path, capsys):
    """A CSV row with the wrong number of fields is reported by line."""
    f = tmp_path / "ragged.csv"
    f.write_text("p0,p1,label\n0.2,0.8,1\n0.5,0\n")
    line = _run_error(capsys, str(f))
    assert "ragged.csv" in line and "line 3" in line


def test_csv_non_integer_labels(tmp_path, capsys):
    """Fractional CSV labels are rejected."""
    f = tmp_path / "fraclabels.csv"
    f.write_text("p0,p1,label\n0.2,0.8,1\n0.5,0.5,0.5\n0.1,0.9,1\n")
    line = _run_error(capsys, str(f))
    assert "fraclabels.csv" in line and "integer" in line


def test_corrupt_npz(tmp_path, capsys):
    """A .npz that is not a zip archive is rejected."""
    f = tmp_path / "corrupt.npz"
    f.write_bytes(b"this is not a zip archive")
    line = _run_error(capsys, str(f))
    assert "corrupt.npz" in line


def test_label_out_of_range_is_reported_by_kdecal(tmp_path, capsys):
    """Kdecal's own ValueError becomes one error line."""
    _, probs, labels = _synthetic(25)
    labels = labels.copy()
    labels[0] = K + 3
    f = tmp_path / "badlabel.npz"
    np.savez(f, probs=probs, labels=labels)
    line = _run_error(capsys, str(f))
    assert "labels" in line


def test_load_predictions_raises_input_file_error(tmp_path):
    """load_predictions raises InputFileError, a ValueError."""
    with pytest.raises(InputFileError, match="nope.csv"):
        load_predictions(tmp_path / "nope.csv")
    assert issubclass(InputFileError, ValueError)


# --------------------------------------------------------------------------- #
# usage errors
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["evaluate", "--backend", "gpu"],
        ["evaluate", "--bandwidth", "0"],
        ["evaluate", "--bandwidth", "-1"],
        ["evaluate", "--bandwidth", "wide"],
        ["evaluate", "--split", "train"],
        ["evaluate", "--logits", "--probs"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    """Usage errors exit with status 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "kdecal: error:" in err


def test_help_exits_0(capsys):
    """--help exits with status 0."""
    assert main(["evaluate", "--help"]) == 0
    assert "--bandwidth" in capsys.readouterr().out


# --------------------------------------------------------------------------- #
# bundled example
# --------------------------------------------------------------------------- #


def test_bundled_example_file():
    """The bundled example is installed and readable."""
    path = bundled_example_path()
    assert path.name == "cifar10_vgg16_keras_verifiedcal.npz"
    scores, labels, is_logits, _ = load_predictions(path)
    assert scores.shape == (10000, 10) and labels.shape == (10000,)
    assert not is_logits


def test_bundled_example_runs(capsys):
    """Kdecal evaluate without FILE evaluates the bundled example."""
    # A fixed bandwidth keeps this quick; test_default_bandwidth_is_auto covers auto.
    code = main(["evaluate", "--json", "--quiet", "--bandwidth", "0.01", *NO_RESAMPLING])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert d["n"] == 10000
    assert d["n_classes"] == 10
    assert d["accuracy"] == pytest.approx(0.9359, abs=1e-4)
    assert d["source"].startswith("bundled example")
    assert "cifar10_vgg16_keras_verifiedcal.npz" in d["source"]


# --------------------------------------------------------------------------- #
# CalibrationReport
# --------------------------------------------------------------------------- #


def _report(**overrides) -> CalibrationReport:
    values: dict = {
        "n": np.int64(500),
        "n_classes": 3,
        "bandwidth": np.float64(0.01),
        "ece_kde_l1": np.float32(0.05),
        "ece_kde_l2": 0.03,
        "ce_kl": 2e-6,
        "ce_l2": 0.004,
        "refinement_kl": 0.6,
        "refinement_l2": -0.7,
        "sharpness_kl": 0.2,
        "sharpness_l2": 0.1,
        "accuracy": 0.8,
        "log_loss": 0.5,
        "brier_score": 0.3,
        "ece_binned": 0.04,
        "backend": "numba",
        "wall_time_s": 1.25,
        "source": None,
    }
    values.update(overrides)
    return CalibrationReport(**values)


def test_report_to_dict_is_plain_json():
    """to_dict gives plain JSON types and round-trips."""
    r = _report()
    d = r.to_dict()
    # every field but the estimates (objects, kept on the report only)
    names = [f.name for f in dataclasses.fields(CalibrationReport)]
    assert list(d) == [name for name in names if name != "estimates"]
    assert names[-1] == "estimates"
    assert type(d["n"]) is int and type(d["bandwidth"]) is float
    assert type(d["ece_kde_l1"]) is float and d["source"] is None
    assert json.loads(json.dumps(d)) == d
    assert CalibrationReport(**d).to_dict() == d


def test_report_is_frozen():
    """CalibrationReport is immutable."""
    r = _report()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.n = 3  # type: ignore[misc]


def test_report_str():
    """str(report) has the header and the metric table."""
    text = str(_report(source="x.npz"))
    assert "source: x.npz" in text
    assert "n = 500, K = 3" in text and "backend = numba" in text
    assert "ECE^KDE (L1, canonical)" in text and "Popordanoska" in text
    assert "2.000e-06" in text  # small values stay readable
    assert "(in-memory arrays)" in str(_report())


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, capsys, monkeypatch):
    """Without pyarrow, .parquet input says how to install it."""
    f = tmp_path / "preds.parquet"
    f.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    line = _run_error(capsys, str(f))
    assert "preds.parquet" in line and "pip install 'kdecal[parquet]'" in line


def test_csv_error_line_numbers_count_blank_lines(tmp_path, capsys):
    """CSV error line numbers are file line numbers."""
    f = tmp_path / "gaps.csv"
    f.write_text("p0,p1,label\n\n0.2,0.8,1\n\n0.5,,0\n")
    line = _run_error(capsys, str(f))
    assert "gaps.csv" in line and "line 5" in line


def test_report_has_smooth_and_debiased_binned_ece(tmp_path):
    """The report shows the smooth ECE and the debiased binned ECE beside the kernel
    estimates (issue 28): the public functions' values on the report's probabilities, in
    the table, the JSON and the CLI's --json output."""
    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.full(4, 0.6), 600)
    y = np.array([rng.choice(4, p=p) for p in P])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        report = kdecal.evaluate(P, y, n_resamples=0, calibration_loss=False)
    Pv = report.estimates["canonical"]._probs
    assert report.smooth_ece == kdecal.smooth_ece(Pv, y)
    assert report.ece_binned_debiased == kdecal.binned.ece(Pv, y, p=2, debias=True)
    assert 0.0 < report.smooth_ece < 1.0
    text = str(report)
    assert "smooth_ece" in text and "ece_binned_debiased" in text
    d = json.loads(json.dumps(report.to_dict()))
    assert d["smooth_ece"] == report.smooth_ece
    assert kdecal.CalibrationReport(**d).ece_binned_debiased == report.ece_binned_debiased


def test_notions_and_resample_notions_options(tmp_path, capsys):
    """--notions picks the notion table's rows, --resample-notions the resampled ones
    (the --calibration notion always), and a bad value is a usage error naming it."""
    _, probs, labels = _synthetic(seed=5, n=300, k=3)
    f = tmp_path / "p.npz"
    np.savez(f, probs=probs, labels=labels)
    base = ["evaluate", str(f), "--json", "--quiet", "--bandwidth", BW, "--n-resamples", "5"]
    assert (
        main([*base, "--notions", "top_label,classwise", "--resample-notions", "classwise"]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert set(d["notions"]) == {"top_label", "classwise"}
    assert "ce_l2_ci" in d["notions"]["classwise"] and "ce_l2_ci" not in d["notions"]["top_label"]
    assert main([*base, "--notions", "none", "--calibration", "top_label"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["notions"] == {}  # no notion table: estimates of --calibration only
    assert main([*base, "--resample-notions", "none"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [k for k, row in d["notions"].items() if "ce_l2_ci" in row] == ["canonical"]
    for opt, bad in (("--notions", "canonical,bogus"), ("--resample-notions", "all")):
        assert main([*base, opt, bad]) == 2
        out, err = capsys.readouterr()
        last = err.strip().splitlines()[-1]  # after argparse's usage lines
        assert out == "" and last.startswith(f"kdecal: error: argument {opt}")
        assert repr(bad.split(",")[-1]) in last


def test_cli_prints_the_unreliable_kl_note_once(tmp_path, capsys):
    """The canonical KL warning at K = 5 is a note of the report: the command line printed
    it twice, on stderr and in the report; now once, in the report (and its JSON)."""
    _, probs, labels = _synthetic(seed=3, n=150, k=5)
    path = tmp_path / "k5.npz"
    np.savez(path, probs=probs, labels=labels)
    for extra in ((), ("--json",)):
        code = main(["evaluate", str(path), "--quiet", "--bandwidth", BW, *NO_RESAMPLING, *extra])
        out, err = capsys.readouterr()
        assert code == 0
        assert out.count("the least reliable kernel estimate") == 1, out
        assert "least reliable" not in err, err
    # without the report's KL rows there is no note, and no warning either
    code = main(
        ["evaluate", str(path), "--quiet", "--bandwidth", BW, *NO_RESAMPLING]
        + ["--metrics", "ece_kde_l1"]
    )
    out, err = capsys.readouterr()
    assert code == 0 and "least reliable" not in out + err
    # the API still warns: a program reading no notes is told
    with pytest.warns(kdecal.UnreliableEstimateWarning, match="least reliable"):
        kdecal.evaluate(probs, labels, bandwidth=0.05, n_resamples=0, calibration_loss=False)


def test_cli_shows_the_bandwidth_search_warning_once(tmp_path, capsys):
    """Labels independent of near-uniform binary predictions: the search of every notion
    (canonical, top-label, class-wise) chooses h = 10, the end of its range, and warns in
    the same words. The command line printed that line three times (kdecal's own
    catch_warnings blocks clear the record of the "default" filter); now once."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([5.0, 5.0], 400)
    labels = rng.integers(0, 2, 400)
    path = tmp_path / "flat.npz"
    np.savez(path, probs=probs, labels=labels)
    text = (
        "kdecal: warning: the bandwidth search (brier criterion) chose h = 10, the largest "
        "value of the search range [1e-05, 10]: the optimum may lie outside it; pass a "
        "fixed bandwidth or inspect kdecal.select_bandwidth(..., grid=...)"
    )
    for extra in ((), ("--json",)):
        code = main(["evaluate", str(path), "--quiet", *NO_RESAMPLING, *extra])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert err.splitlines() == [text]  # was 3 times
    d = json.loads(out)
    assert list(d["notions"]) == ["canonical", "top_label", "classwise"]
    assert {row["bandwidth"] for row in d["notions"].values()} == {10.0}
    # the API raises it once per call of evaluate (it was once per search: 6 here),
    # naming the caller's line; each search on its own still warns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kdecal.evaluate(probs, labels, n_resamples=0)
    assert [str(w.message) for w in caught] == [text[len("kdecal: warning: ") :]]
    assert caught[0].filename == __file__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kdecal.estimate(probs, labels, calibration="top_label")
        kdecal.estimate(probs, labels, calibration="classwise")
    assert len(caught) == 2


# --------------------------------------------------------------------------- #
# messages of the command line: the file, the model, the option, the line
# --------------------------------------------------------------------------- #


def _off_by(probs: np.ndarray, row: int, factor: float) -> np.ndarray:
    """Probabilities whose row ``row`` sums to ``factor`` (renormalised, with a warning)."""
    out = probs.copy()
    out[row] *= factor
    return out


def test_warnings_about_a_file_name_the_file(tmp_path, capsys):
    """compare reads several files: each warning that rows were renormalised (or entries
    clipped) names the file it is about, and so does evaluate's."""
    _, probs, labels = _synthetic(40)
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(a, probs=_off_by(probs, 3, 1.01), labels=labels)
    np.savez(b, probs=_off_by(probs, 5, 1.005), labels=labels)
    code = main(["compare", str(a), str(b), "--bandwidth", BW, "--n-resamples", "2", "--json"])
    _, err = capsys.readouterr()
    assert code == 0, err
    lines = err.strip().splitlines()
    renormalised = "rows do not sum to 1 (largest deviation {}); they were renormalised"
    assert f"kdecal: warning: {a}: probs: 1 of {N} " + renormalised.format("0.01, row 3") in lines
    assert f"kdecal: warning: {b}: probs: 1 of {N} " + renormalised.format("0.005, row 5") in lines
    # an entry just below 0, with --probs: clipped, and the row renormalised
    c = tmp_path / "c.npz"
    clipped = probs.copy()
    clipped[7, 1] += clipped[7, 0] + 0.005
    clipped[7, 0] = -0.005
    np.savez(c, probs=clipped, labels=labels)
    code = main(["evaluate", str(c), "--probs", "--quiet", "--bandwidth", BW, *NO_RESAMPLING])
    _, err = capsys.readouterr()
    assert code == 0, err
    warned = [t for t in err.strip().splitlines() if t.startswith("kdecal: warning: ")]
    assert any("were clipped to [0, 1]" in t for t in warned), err
    assert warned and all(t.startswith(f"kdecal: warning: {c}: probs: ") for t in warned), err


def test_compare_names_models_of_the_same_file_name_by_their_folders(tmp_path, capsys):
    """dir1/preds.npz and dir2/preds.npz were both named by their file name ("preds.npz"
    and "preds.npz'"): now by the shortest suffixes of their paths that tell them apart."""
    _, probs, labels = _synthetic(41)
    for sub in ("dir1", "dir2"):
        (tmp_path / sub).mkdir()
        np.savez(tmp_path / sub / "preds.npz", probs=probs, labels=labels)
    np.savez(tmp_path / "other.npz", probs=probs, labels=labels)
    files = [str(tmp_path / "dir1" / "preds.npz"), str(tmp_path / "dir2" / "preds.npz")]
    code = main(
        ["compare", *files, str(tmp_path / "other.npz"), "--bandwidth", BW, "--n-resamples", "2"]
        + ["--metrics", "ece_binned", "--json"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["names"] == ["dir1/preds.npz", "dir2/preds.npz", "other.npz"]
    from kdecal.cli import _model_names

    t = tmp_path
    assert _model_names(
        [str(t / "x" / "a" / "p.npz"), str(t / "y" / "a" / "p.npz"), str(t / "q.npz")]
        + [str(t / "q.npz"), str(t / "x" / ".." / "q.npz")]
    ) == ["x/a/p.npz", "y/a/p.npz", "q.npz", "q.npz'", "q.npz''"]


def test_errors_and_warnings_advise_options_not_python_calls(tmp_path, capsys, monkeypatch):
    """The command line advised kdecal.softmax (a Python call) for rows far from summing
    to 1, nothing for logits under a 'probs' key, calibration='top_label' and
    n_resamples before a long compare, and named n_resamples: now the options."""
    logits, probs, labels = _synthetic(42)
    far = tmp_path / "far.npz"
    np.savez(far, probs=_off_by(probs, 4, 1.5), labels=labels)
    line = _run_error(capsys, str(far))
    assert line == (
        f"kdecal: error: {far}: rows of probs must sum to 1 (tolerance 0.1); row 4 sums to "
        f"{float(_off_by(probs, 4, 1.5)[4].sum())!r}; if the scores are logits, pass --logits"
    )
    under_probs = tmp_path / "logits_as_probs.npz"
    np.savez(under_probs, probs=logits, labels=labels)
    line = _run_error(capsys, str(under_probs))
    i, j = np.argwhere(logits < 0)[0]
    assert line == (
        f"kdecal: error: {under_probs}: probs contains a negative probability "
        f"{float(logits[i, j])!r} at index ({i}, {j}); if the scores are logits, pass --logits"
    )
    # compare's warning before a long canonical paired bootstrap (here: any)
    import kdecal._compare

    monkeypatch.setattr(kdecal._compare, "LONG_BOOTSTRAP_SECONDS", -1.0)
    good = tmp_path / "good.npz"
    np.savez(good, probs=probs, labels=labels)
    code = main(["compare", str(good), str(good), "--bandwidth", BW, "--n-resamples", "2"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "(command line: --calibration top_label, --n-resamples)" in err
    code = main(["compare", str(good), str(good), "--bandwidth", BW, "--n-resamples", "1"])
    _, err = capsys.readouterr()
    assert code == 2 and err == "kdecal: error: --n-resamples must be an integer >= 2, got 1\n"


def test_csv_label_errors_give_the_line_of_the_file(tmp_path, capsys):
    """A label beyond the classes was reported at its 0-based row of the array ("at index
    (2,)"); in a CSV it is the line of the file (the header and blank lines counted)."""
    f = tmp_path / "badlabel.csv"
    f.write_text("p0,p1,label\n0.2,0.8,1\n0.6,0.4,0\n\n0.3,0.7,2\n0.5,0.5,1\n")
    assert _run_error(capsys, str(f)) == (
        f"kdecal: error: {f}: label column 'label' must hold class indices 0..1 "
        "(2 score columns), found '2' on line 5"
    )
    g = tmp_path / "binary.csv"
    g.write_text("p,Label\n0.2,1\n0.6,-1\n0.3,1\n0.9,0\n")
    assert _run_error(capsys, str(g)) == (
        f"kdecal: error: {g}: label column 'Label' must hold class indices 0..1 "
        "(one binary score column), found '-1' on line 3"
    )


def test_plot_to_a_folder_is_refused_with_a_file_name(tmp_path, capsys, monkeypatch):
    """--plot . suggested the file '..png'; a folder is now named as one, with a file in
    it to write, and a missing folder written with a trailing slash is reported missing."""
    pytest.importorskip("matplotlib")
    _, probs, labels = _synthetic(43)
    np.savez(tmp_path / "preds.npz", probs=probs, labels=labels)
    monkeypatch.chdir(tmp_path)
    assert _run_error(capsys, "preds.npz", "--plot", ".") == (
        "kdecal: error: --plot: '.' is a folder; name the file to write in it, e.g. ./preds.png"
    )
    (tmp_path / "figs").mkdir()
    assert _run_error(capsys, "preds.npz", "--plot", "figs") == (
        "kdecal: error: --plot: 'figs' is a folder; name the file to write in it, e.g. "
        "figs/preds.png"
    )
    assert _run_error(capsys, "preds.npz", "--plot", "nofolder/") == (
        "kdecal: error: --plot: folder 'nofolder/' does not exist"
    )


def test_numbers_python_reads_but_a_csv_does_not_hold_are_refused(tmp_path, capsys):
    """float() reads '1_0' as 10 and full-width digits as digits: a CSV label '1_0' was
    class 10, and a score '0_5' made its column logits. Now they are not numbers; nor in
    the numeric options."""
    f = tmp_path / "underscore.csv"
    f.write_text("p0,p1,label\n0.2,0.8,1\n0.6,0.4,0\n0.3,0.7,1_0\n0.5,0.5,1\n")
    assert _run_error(capsys, str(f)) == (
        f"kdecal: error: {f}: label column 'label' must hold integer class indices, "
        "found '1_0' on line 4"
    )
    g = tmp_path / "fullwidth.csv"
    g.write_text("p0,p1,label\n0.2,0.8,1\n0.6,0.4,0\n0.3,0.7,\uff11\n0.5,0.5,1\n", "utf-8")
    assert _run_error(capsys, str(g)) == (
        f"kdecal: error: {g}: label column 'label' must hold integer class indices, "
        "found '\uff11' on line 4"
    )
    h = tmp_path / "score.csv"
    h.write_text("p0,p1,label\n0.2,0.8,1\n0.6,0.4,0\n0.3,0_7,1\n0.5,0.5,1\n0.1,0.9,1\n")
    assert _run_error(capsys, str(h)) == (
        f"kdecal: error: {h}: column 'p1' holds numbers but '0_7' on line 4 (not a plain "
        "number: digit separators '_' and non-ASCII digits are not read); write it as a "
        "plain number or drop the column"
    )
    for option, value in (("--seed", "1_0"), ("--n-resamples", "\uff12"), ("--bandwidth", "0_1")):
        code = main(["evaluate", str(h), option, value])
        out, err = capsys.readouterr()
        assert code == 2 and out == "", err
        assert err.splitlines()[-1].startswith(f"kdecal: error: argument {option}: ")
        assert err.splitlines()[-1].endswith(f"got {value!r}")
