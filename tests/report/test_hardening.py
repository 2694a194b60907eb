"""Hostile and careless inputs: the probs/logits rule, file limits, the CLI's output
contract, tiny bandwidths, large p and the small gaps (every test here failed before the
hardening change)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kdecal
from kdecal import binned
from kdecal._io import MAX_CSV_LINE, InputFileError, bundled_example_path, load_predictions
from kdecal._validation import (
    INFER_RANGE_ATOL,
    INFER_ROW_SUM_ATOL,
    MIN_BANDWIDTH,
    PROBS_RANGE_ATOL,
    PROBS_ROW_SUM_ATOL,
    as_array,
    resolve_input,
)
from kdecal.cli import main
from kdecal.warnings import RenormalizationWarning

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _calibrated(seed: int, n: int = 400, k: int = 4, conc: float = 0.5):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(k, conc), size=n)
    y = np.array([rng.choice(k, p=row) for row in P], dtype=np.int64)
    return P, y


def _write_csv(path, P, y, decimals):
    header = ",".join([f"c{k}" for k in range(P.shape[1])] + ["label"])
    with open(path, "w") as fh:
        fh.write(header + "\n")
        fh.writelines(
            ",".join(f"{v:.{decimals}f}" for v in row) + f",{label}\n" for row, label in zip(P, y)
        )


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- probabilities or logits


def test_rounded_probabilities_are_probabilities(tmp_path, capsys):
    """A CSV of probabilities rounded to 3 decimals is read as probabilities (it was
    softmaxed as logits: ECE^KDE 0.750 instead of 0.056); the renormalisation is reported
    with its size, and the estimate equals the Python API's on the same rows, bit for bit
    (the command line renormalised the rows before the API's clipping at PROB_EPS, so a
    rounded-away 0 became 1e-12 / rowsum instead of 1e-12: a helper's probe saw log loss
    0.442155 against the API's 0.442150)."""
    P, y = _calibrated(0, k=10)
    f = tmp_path / "rounded.csv"
    _write_csv(f, P, y, 3)
    R = np.round(P, 3)
    assert np.abs(R.sum(axis=1) - 1).max() > 1e-3  # the precondition: rows are off
    _, _, is_logits, desc = load_predictions(f)
    assert is_logits is False and "inferred" in desc
    code, out, err = _cli(
        capsys, "evaluate", str(f), "--json", "--quiet", "--bandwidth", "0.1", "--n-resamples", "0"
    )
    assert code == 0, err
    assert "were renormalised" in err and "largest deviation 0.00" in err
    report = json.loads(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same renormalisation warning
        api = kdecal.evaluate(R, y, bandwidth=0.1, n_resamples=0).to_dict()
    for key in ("ece_kde_l1", "ce_kl", "log_loss", "calibration_loss", "ce_l2"):
        assert report[key] == api[key], key
    # the old reading (softmax of the probabilities) gives another number altogether
    wrong = kdecal.ece_kde(kdecal.softmax(np.round(P, 3)), y, bandwidth=0.1)
    assert abs(report["ece_kde_l1"] - wrong) > 0.1


def test_two_decimals_need_the_probs_flag(tmp_path, capsys):
    """Rows off by more than INFER_ROW_SUM_ATOL are ambiguous: the error names --probs;
    with --probs they are renormalised with a warning."""
    P, y = _calibrated(1, k=10)
    f = tmp_path / "r2.csv"
    _write_csv(f, P, y, 2)
    dev = np.abs(np.round(P, 2).sum(axis=1) - 1).max()
    assert INFER_ROW_SUM_ATOL < dev <= PROBS_ROW_SUM_ATOL
    code, out, err = _cli(capsys, "evaluate", str(f), "--quiet", "--bandwidth", "0.1")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--probs" in err and "--logits" in err
    code, out, err = _cli(
        capsys,
        "evaluate",
        str(f),
        "--probs",
        "--json",
        "--quiet",
        "--bandwidth",
        "0.1",
        "--n-resamples",
        "0",
    )
    assert code == 0, err
    assert "renormalised" in err
    assert json.loads(out)["n"] == P.shape[0]


def test_probabilities_declared_as_logits_raise():
    P, _ = _calibrated(2)
    with pytest.raises(ValueError, match=r"given as logits .*input='probs'"):
        resolve_input(P, "logits")
    # logits that happen to be non-negative but are not on the simplex stay logits
    Z = np.abs(np.random.default_rng(0).normal(size=(50, 3))) + 1.5
    assert resolve_input(Z, "logits") == ("logits", "as specified")


@SETTINGS
@given(
    k=st.integers(2, 40),
    decimals=st.integers(3, 8),
    seed=st.integers(0, 2**32 - 1),
    conc=st.floats(0.05, 5.0),
)
def test_rounded_probabilities_never_become_logits(k, decimals, seed, conc):
    """Probabilities rounded to >= 3 decimals are recognised as probabilities for every
    K <= 40 (each entry moves by <= 5e-4, so a row by <= 0.02)."""
    rng = np.random.default_rng(seed)
    P = np.round(rng.dirichlet(np.full(k, conc), size=30), decimals)
    assert resolve_input(P, "auto")[0] == "probs"


@SETTINGS
@given(
    k=st.integers(2, 12),
    seed=st.integers(0, 2**32 - 1),
    scale=st.floats(0.01, 50.0),
    shift=st.floats(-5.0, 5.0),
)
def test_inference_is_never_a_near_miss(k, seed, scale, shift):
    """Whatever the scores, "auto" gives probabilities only when every entry lies in
    [0, 1] and every row sums to 1 within INFER_ROW_SUM_ATOL, logits only when some entry
    lies further than INFER_RANGE_ATOL outside [0, 1] or the median row is further than
    PROBS_ROW_SUM_ATOL from summing to 1, and raises otherwise, naming the choices; it
    never picks logits for probability rows with entries within INFER_RANGE_ATOL of
    [0, 1]."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(loc=shift, scale=scale, size=(20, k))
    if rng.uniform() < 0.5:
        Z = np.clip(Z, 0.0, 1.0)  # force the ambiguous region often
    inside = bool(np.all((Z >= 0) & (Z <= 1)))
    dev = np.abs(Z.sum(axis=1) - 1).max()
    near = bool(np.all((Z >= -INFER_RANGE_ATOL) & (Z <= 1 + INFER_RANGE_ATOL)))
    near = near and np.median(np.abs(Z.sum(axis=1) - 1)) <= PROBS_ROW_SUM_ATOL
    try:
        kind, _ = resolve_input(Z, "auto")
    except ValueError as exc:
        assert not (inside and dev <= INFER_ROW_SUM_ATOL)
        assert "input='logits'" in str(exc)
        if near:
            assert "input='probs'" in str(exc)
        return
    assert kind == ("probs" if inside else "logits")
    if kind == "probs":
        assert dev <= INFER_ROW_SUM_ATOL
    else:
        assert not near


def _corrupt(P, how, rng, delta):
    """Probabilities turned into what a careless file holds; the expected message."""
    n, k = P.shape
    r, c = int(rng.integers(n)), int(rng.integers(k))
    Z = P.copy()
    if how == "above":  # one cell a hair above 1 (the row's others shrink to keep it)
        Z[r] = 0.0
        Z[r, c] = 1.0 + delta
        return Z, re.escape(f"row {r}, column {c} holds {float(Z[r, c])!r}")
    if how == "below":
        Z[r, c] = -delta
        return Z, re.escape(f"row {r}, column {c} holds {-delta!r}")
    if how == "percent":
        return 100.0 * Z, "percentages"
    if how == "fold":  # an integer column 0..4 (folds, counts, ids) beside the scores
        fold = np.arange(n) % 5
        return np.insert(Z, c, fold, axis=1), rf"column {c} holds only integers"
    if how == "weight":  # a fractional column outside [0, 1] (weights) after the scores
        w = 1.0 + rng.uniform(0.1, 3.0, size=n)
        return np.column_stack([Z, w]), rf"column {k} lies outside \[0, 1\]"
    raise AssertionError(how)


@SETTINGS
@given(
    k=st.integers(2, 40),
    seed=st.integers(0, 2**32 - 1),
    conc=st.floats(0.05, 5.0),
    how=st.sampled_from(["above", "below", "percent", "fold", "weight"]),
    delta=st.floats(1e-12, INFER_RANGE_ATOL),
)
def test_careless_probabilities_are_never_read_as_logits(k, seed, conc, how, delta):
    """Issue 26: a probability file with one cell 1.0000001 or -1e-7, percentages, or an
    extra fold or weight column was read as logits (ECE 0.385 instead of 0.189, exit 0).
    Each is refused, naming the offending row and column and input='logits'."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(k, conc), size=30)
    Z, where = _corrupt(P, how, rng, delta)
    with pytest.raises(ValueError, match=where) as info:
        resolve_input(Z, "auto")
    msg = str(info.value)
    assert "input='logits'" in msg and "\n" not in msg
    if how in ("above", "below", "percent"):
        assert "input='probs'" in msg
    # binary P(y = 1) columns: the same cases in 1-D
    if how in ("above", "below", "percent"):
        z, _ = _corrupt(P[:, :1], how, rng, delta)
        with pytest.raises(ValueError, match="input='logits'"):
            resolve_input(z[:, 0], "auto")


def test_real_logits_stay_logits():
    """The refusals leave logits alone: real logit files, log-posteriors, logits with a
    zero reference column and tempered logits all read as logits."""
    z = np.load(bundled_example_path())["probs"]  # probabilities: the control
    assert resolve_input(z, "auto")[0] == "probs"
    rng = np.random.default_rng(3)
    L = rng.normal(scale=3.0, size=(200, 10))
    for Z in (L, L - np.log(np.exp(L).sum(1, keepdims=True)), L / 10, np.abs(L)):
        assert resolve_input(Z, "auto")[0] == "logits"
    Z = np.column_stack([np.zeros(200), L[:, 0]])  # binary logits (0, t)
    assert resolve_input(Z, "auto")[0] == "logits"
    assert resolve_input(L / 300, "auto")[0] == "logits"  # all within 0.05 of 0
    assert resolve_input(L[:, 0], "auto")[0] == "logits"
    data = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
    seen = 0
    for name in sorted(os.listdir(data)):
        if name.endswith(".npz"):
            with np.load(os.path.join(data, name)) as z:
                for key in z.files:
                    if key.endswith(("logits", "probs")):
                        want = "logits" if key.endswith("logits") else "probs"
                        assert resolve_input(z[key], "auto")[0] == want, (name, key)
                        seen += 1
    assert seen >= 8


def test_stray_probabilities_with_probs_flag(tmp_path, capsys):
    """A CSV of probabilities with one cell 1.0000001 and one -1e-7: refused without a
    flag (naming the file, row and column); with --probs clipped, with a warning, to the
    numbers of the clean file."""
    P, y = _calibrated(5)
    f = tmp_path / "stray.csv"
    Q = P.copy()
    Q[7] = [1.0000001, 0.0, 0.0, 0.0]
    Q[9, 3] += Q[9, 2] + 1e-7
    Q[9, 2] = -1e-7
    _write_csv(f, Q, y, 9)
    code, out, err = _cli(capsys, "evaluate", str(f), "--quiet", "--n-resamples", "0")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "stray.csv" in err and "row 7, column 0 ('c0') holds 1.0000001" in err
    assert "--probs" in err and "--logits" in err
    argv = ["evaluate", str(f), "--probs", "--json", "--quiet", "--bandwidth", "0.1"]
    code, out, err = _cli(capsys, *argv, "--n-resamples", "0")
    assert code == 0, err
    assert "2 of 1600 entries lie outside [0, 1], by at most 1e-07" in err  # not the tolerance
    clean = np.clip(np.round(Q, 9), 0.0, 1.0)
    want = kdecal.ece_kde(clean / clean.sum(1, keepdims=True), y, bandwidth=0.1)
    assert json.loads(out)["ece_kde_l1"] == pytest.approx(want, rel=1e-12)
    # beyond PROBS_RANGE_ATOL a negative entry is an error even with --probs
    Q[9, 2] = -2 * PROBS_RANGE_ATOL
    _write_csv(f, Q, y, 9)
    code, out, err = _cli(capsys, *argv, "--n-resamples", "0")
    assert code == 2 and "stray.csv" in err and "negative probability -0.02" in err


def test_extra_columns_in_files_are_named(tmp_path, capsys):
    """A fold column in a CSV, and a missing value in a score column: refused, naming the
    column by its header (an 'NA' cell used to drop its column silently)."""
    P, y = _calibrated(6, k=3)
    f = tmp_path / "fold.csv"
    rows = (
        ",".join(f"{v:.6f}" for v in r) + f",{i % 5},{c}" for i, (r, c) in enumerate(zip(P, y))
    )
    f.write_text("\n".join(["a,b,c,fold,label", *rows]) + "\n")
    code, _, err = _cli(capsys, "evaluate", str(f), "--quiet", "--n-resamples", "0")
    assert code == 2 and "column 3 ('fold') holds only integers (0, 1, 2, 3, 4)" in err
    g = tmp_path / "na.csv"
    lines = f.read_text().splitlines()
    lines[5] = "0.5,NA,0.5,0," + lines[5].split(",")[-1]
    g.write_text("\n".join(lines) + "\n")
    code, _, err = _cli(capsys, "evaluate", str(g), "--quiet", "--n-resamples", "0")
    assert code == 2 and "column 'b' holds numbers but 'NA' on line 6" in err
    # a non-finite number: the same line and column, not the array's 0-based indices
    for cell in ("nan", "-inf"):
        lines[5] = f"0.5,{cell},0.5,0," + lines[5].split(",")[-1]
        g.write_text("\n".join(lines) + "\n")
        code, _, err = _cli(capsys, "evaluate", str(g), "--quiet", "--n-resamples", "0")
        assert code == 2, err
        assert f"score column 'b' holds '{cell}' on line 6; every score must be finite" in err


def test_explicit_probs_tolerance_and_message():
    P, y = _calibrated(3)
    Q = P.copy()
    Q[7] *= 1.05
    with pytest.warns(RenormalizationWarning, match=r"1 of 400 rows .*deviation 0.05"):
        a = kdecal.ece_kde(Q, y, bandwidth=0.1)
    Q[7] /= Q[7].sum()
    assert a == pytest.approx(kdecal.ece_kde(Q, y, bandwidth=0.1), rel=1e-12)
    Q[7] *= 1.2
    with pytest.raises(ValueError, match=r"rows of probs must sum to 1 \(tolerance 0.1\)"):
        kdecal.ece_kde(Q, y, bandwidth=0.1)


# --------------------------------------------------------------------------- array inputs


class _DLPackOnly:
    """An object that offers only the DLPack protocol (no __array__)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_only_objects_are_read():
    P, y = _calibrated(4)
    ref = kdecal.ece_kde(P, y, bandwidth=0.1)
    assert kdecal.ece_kde(_DLPackOnly(P), _DLPackOnly(y), bandwidth=0.1) == ref


def test_torch_tensors_with_grad_are_read():
    torch = pytest.importorskip("torch")
    P, y = _calibrated(5)
    ref = kdecal.ece_kde(P, y, bandwidth=0.1)
    t = torch.tensor(P, requires_grad=True)
    assert kdecal.ece_kde(t, torch.tensor(y), bandwidth=0.1) == ref
    assert binned.ece(t, torch.tensor(y)) == binned.ece(P, y)


def test_unreadable_objects_name_the_argument():
    with pytest.raises(TypeError, match="probs must be"):
        kdecal.ece_kde(object(), [0, 1, 2], bandwidth=0.1)
    with pytest.raises(TypeError, match="scores"):
        as_array(_Broken(), "scores")
    # a SciPy sparse matrix became a 0-d object array: "must be a numeric array, got
    # dtype object", not naming the sparsity
    sparse = pytest.importorskip("scipy.sparse")
    P, y = _calibrated(5)
    for make in (sparse.csr_matrix, sparse.csr_array):
        with pytest.raises(TypeError, match=r"probs is a SciPy sparse csr_.*toarray"):
            kdecal.ece_kde(make(P), y, bandwidth=0.1)
        with pytest.raises(TypeError, match=r"scores is a SciPy sparse"):
            kdecal.recalibration.TemperatureScaling().fit(make(P), y)


class _Broken:
    def __array__(self, *args, **kwargs):
        raise RuntimeError("device memory")


# --------------------------------------------------------------------------- memory bombs


def test_binned_bins_are_bounded():
    P, y = _calibrated(6, n=50)
    with pytest.raises(ValueError, match=r"n_bins = 1000000000 is more than max\(n, 1000\)"):
        binned.ece(P, y, n_bins=10**9)
    with pytest.raises(ValueError, match="n_bins"):
        binned.binned_statistics(P, y, n_bins=10**7)
    assert binned.ece(P, y, n_bins=1000) >= 0.0  # up to 1000 bins stay allowed


def test_npy_header_larger_than_file(tmp_path):
    f = tmp_path / "huge.npy"
    with open(f, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
        )
    np.save(tmp_path / "huge_labels.npy", np.zeros(3, dtype=np.int64))
    with pytest.raises(InputFileError, match=r"declares an array of shape \(1000000000000,\)"):
        load_predictions(f)


def test_npz_member_lying_about_its_size(tmp_path):
    """An archive whose array header claims more data than the member holds is refused
    from the headers alone (no allocation)."""
    f = tmp_path / "liar.npz"
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("probs.npy", "w") as fh:
            np.lib.format.write_array_header_1_0(
                fh, {"descr": "<f8", "fortran_order": False, "shape": (10**9, 10)}
            )
            fh.write(b"\0" * 800)
        with zf.open("labels.npy", "w") as fh:
            np.lib.format.write_array(fh, np.zeros(10**9 // 10**6, dtype=np.int64))
    with pytest.raises(InputFileError, match=r"liar.npz \[probs\]: declares an array"):
        load_predictions(f)


def test_npz_lengths_checked_before_loading(tmp_path):
    f = tmp_path / "bomb.npz"
    np.savez_compressed(f, probs=np.zeros((2_000_000, 10)), labels=np.zeros(5, dtype=int))
    with pytest.raises(InputFileError, match="probs has 2000000 rows but labels has 5"):
        load_predictions(f)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_devices_are_not_read(tmp_path):
    link = tmp_path / "zero.csv"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputFileError, match="is not a regular file"):
        load_predictions(link)


def test_csv_line_length_is_bounded(tmp_path, capsys):
    f = tmp_path / "long.csv"
    f.write_text("a,label\n" + "1" * (MAX_CSV_LINE + 10) + ",1\n0.5,0\n")
    code, out, err = _cli(capsys, "evaluate", str(f), "--quiet")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "longer than" in err


def test_csv_long_field_is_one_line_error(tmp_path, capsys):
    """A 200,000-character field used to raise csv.Error with a traceback."""
    f = tmp_path / "field.csv"
    f.write_text('a,label\n"' + "x" * 200_000 + '",1\n')
    code, out, err = _cli(capsys, "evaluate", str(f), "--quiet")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("kdecal: error: ")


# ---------------------------------------------------------------------- the CLI contract


def test_long_file_name_is_one_line_error(capsys):
    code, out, err = _cli(capsys, "evaluate", "x" * 300 + ".csv", "--quiet")
    assert code == 2 and out == "" and err.count("\n") == 1


def _kdecal(args, **kwargs):
    env = dict(os.environ, KDECAL_PROGRESS="0")
    cmd = [sys.executable, "-c", "import sys, kdecal.cli; sys.exit(kdecal.cli.main())", *args]
    return subprocess.run(cmd, env=env, check=False, **kwargs)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    P, y = _calibrated(7, n=60, k=3)
    f = tmp_path_factory.mktemp("cli") / "small.npz"
    np.savez(f, probs=P, labels=y)
    return str(f)


ARGS = ["--quiet", "--bandwidth", "0.1", "--n-resamples", "0"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_device_is_an_error(small_file):
    with open("/dev/full", "w") as full:
        r = _kdecal(
            ["evaluate", small_file, *ARGS], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "kdecal: error: cannot write standard output ([Errno 28] No space left on device)"
    ]


def test_closed_stdout_is_an_error(small_file):
    r = _kdecal(
        ["evaluate", small_file, *ARGS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.close(1),
    )
    assert r.returncode == 2
    assert "standard output is closed" in r.stderr and r.stderr.count("\n") == 1


def test_broken_pipe_exits_quietly(small_file):
    """The reader of the pipe has gone before kdecal writes: exit 141, nothing on stderr."""
    read, write = os.pipe()
    os.close(read)  # nobody will ever read
    try:
        r = _kdecal(
            ["evaluate", small_file, "--json", *ARGS], stdout=write, stderr=subprocess.PIPE
        )
    finally:
        os.close(write)
    assert r.returncode == 141
    assert r.stderr == b""


# ------------------------------------------------------------------ numerical edges


def test_tiny_bandwidths_are_refused_not_nan():
    P, y = _calibrated(8, n=100)
    for h in (3e-306, 1e-310, 5e-324):
        with pytest.raises(ValueError, match="smallest supported bandwidth"):
            kdecal.ece_kde(P, y, bandwidth=h)
    with pytest.raises(ValueError, match="smallest supported bandwidth"):
        kdecal.select_bandwidth(P, grid=[5e-324, 0.1])
    # at the limit every estimate is finite and equal to its h -> 0 value
    for quantity in (kdecal.ece_kde, kdecal.calibration_error):
        lo = quantity(P, y, bandwidth=MIN_BANDWIDTH, debias="none")
        assert np.isfinite(lo)
        assert lo == pytest.approx(quantity(P, y, bandwidth=1e-12, debias="none"), rel=1e-12)
    assert np.all(np.isfinite(kdecal.loo_log_likelihood(P, [MIN_BANDWIDTH])))


@pytest.mark.parametrize("p", [300.0, 700.0, 1e4, 1e8])
def test_large_p_is_the_scaled_root(p):
    """|x|^p underflows for p = 700; the p-th root is computed in a scaled form and tends
    to the largest deviation (checked against the rescaling written out by hand)."""
    P, y = _calibrated(9, n=200)
    P = 0.7 * P + 0.3 * np.eye(4)[0]  # miscalibrated
    est = kdecal.estimate(P, y, bandwidth=0.2, debias="none")
    d = np.abs(est.conditional_expectation - P)
    top = d.max()
    expected = top * np.mean(np.sum((d / top) ** p, axis=1)) ** (1.0 / p)
    got = kdecal.ece_kde(P, y, p=p, bandwidth=0.2, debias="none")
    assert got == pytest.approx(expected, rel=1e-12)
    assert 0.5 * top < got <= top * 4 ** (1 / p) * (1 + 1e-12)
    # binned: same scaled form
    s = binned.binned_statistics(P, y, n_bins=10)
    gaps = np.abs(np.where(s.counts > 0, s.gap, 0.0))
    g = gaps.max()
    ref = g * np.sum(s.weights * (gaps / g) ** p) ** (1.0 / p)
    assert binned.ece(P, y, n_bins=10, p=p) == pytest.approx(ref, rel=1e-12)


# ------------------------------------------------------------------------- small gaps


def test_boolean_bandwidths_refused():
    P, _ = _calibrated(10, n=20)
    with pytest.raises(TypeError, match="booleans"):
        kdecal.loo_log_likelihood(P, [True])


def test_thread_count_is_bounded():
    before = kdecal.get_num_threads()
    for bad in (10**6, 2**31, -1):
        with pytest.raises(ValueError, match="n must be an integer in 0..4096"):
            kdecal.set_num_threads(bad)
    assert kdecal.get_num_threads() == before


@pytest.mark.parametrize(
    "labels, shown",
    [
        (np.array([0, 1, 2, 1e20]), "100000000000000000000"),
        (np.array([0, 1, 2, 2**64 - 1], dtype=np.uint64), "18446744073709551615"),
        (np.array([0, 1, 2, -3.0]), "-3"),
    ],
)
def test_out_of_range_labels_reported_as_given(labels, shown):
    P = np.full((4, 3), 1 / 3)
    with pytest.raises(ValueError, match=f"got {shown} at index"):
        kdecal.ece_kde(P, labels, bandwidth=0.1)


def test_grid_end_warns_for_every_rule():
    """An end of the search range chosen by loo-mle, by a user grid or by "auto" warns."""
    P, y = _calibrated(11, n=300)
    P = np.repeat(P[:150], 2, axis=0)  # duplicated predictions pull h to the bottom
    y = np.repeat(y[:150], 2)
    with pytest.warns(kdecal.KdecalWarning, match="smallest value of the search range"):
        kdecal.select_bandwidth(P)
    with pytest.warns(kdecal.KdecalWarning, match="smallest value of the search range"):
        kdecal.select_bandwidth(P, y, grid=[1e-4, 1e-2, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kdecal.select_bandwidth(P, y, grid=[0.3])  # a single value is not a search


# ------------------------------------------------------------ the CLI on arbitrary files


def _no_constant(name):
    raise AssertionError(f"{name} in JSON output")


_CELLS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(0.0, 1.0).map(lambda v: f"{v:.3f}"),
    st.integers(-5, 5).map(str),
    st.text(alphabet='ab,"\n x;', max_size=6),
    st.just(""),
    st.just("9" * 400),
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    header=st.lists(st.sampled_from(["label", "a", "b", "c", "id", ""]), min_size=1, max_size=4),
    rows=st.lists(st.lists(_CELLS, min_size=1, max_size=4), min_size=0, max_size=8),
    flag=st.sampled_from([[], ["--probs"], ["--logits"]]),
)
def test_cli_on_arbitrary_csv_is_success_or_one_line_error(tmp_path_factory, header, rows, flag):
    """Whatever a CSV holds, `kdecal evaluate` exits 0 with valid JSON, or 2 with one
    line on stderr and nothing on stdout; never a traceback, a NaN in JSON, or a hang."""
    import contextlib
    import io

    f = tmp_path_factory.mktemp("csv") / "x.csv"
    f.write_text("\n".join([",".join(header)] + [",".join(r) for r in rows]) + "\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["evaluate", str(f), "--json", *ARGS, *flag])
    lines = [ln for ln in err.getvalue().splitlines() if not ln.startswith("kdecal: warning:")]
    if code == 0:
        report = json.loads(out.getvalue(), parse_constant=_no_constant)  # strict JSON
        assert report["n"] >= 1
    else:
        assert code == 2, err.getvalue()
        assert out.getvalue() == ""
        assert len(lines) == 1 and lines[0].startswith("kdecal: error: "), err.getvalue()


def test_curve_sizes_are_bounded():
    from kdecal import curves

    P, y = _calibrated(12, n=50, k=3)
    with pytest.raises(ValueError, match="n_bins = 1000000000 is more than"):
        curves.ReliabilityDiagram.from_predictions(P, y, n_bins=10**9)
    with pytest.raises(ValueError, match="n_grid must be at most 100,000"):
        curves.ReliabilityDiagram.from_predictions(P, y, kind="kernel", n_grid=10**9)
    with pytest.raises(ValueError, match="n_bins_per_side must be at most 1000"):
        curves.SimplexDensity.from_predictions(P, y, n_bins_per_side=10**6)
    # these allocated 745 GiB and 7.3 TiB (MemoryError), or a few GB below that
    p2 = P[:, :2] / P[:, :2].sum(axis=1, keepdims=True)
    y2 = np.minimum(y, 1)
    with pytest.raises(ValueError, match="n_grid must be at most 100,000"):
        curves.CalibrationSharpnessDiagram.from_predictions(p2, y2, n_grid=10**11)
    with pytest.raises(ValueError, match="n_grid must be at most 100,000"):
        curves.BayesRiskCurve.from_predictions(p2[:, 1], y2, n_grid=10**11)
    with pytest.raises(ValueError, match="resolution must be at most 2,000"):
        curves.SimplexDensity.from_predictions(P, y, bandwidth=0.1, resolution=10**6)
    # int64 cell keys overflowed: distinct cells merged into a wrong number (0.94)
    with pytest.raises(ValueError, match="n_bins_per_side = 10000000000000000000 is more"):
        kdecal.binned.simplex_ece(P, y, n_bins_per_side=10**19)


def test_results_compare_by_value():
    """``==`` on a result that holds arrays raised "truth value of an array is ambiguous"
    (the dataclass-generated ``__eq__`` compares the fields' tuples). Results now compare
    their fields by value, arrays element by element and NaN equal to NaN; they stay
    unhashable, as their arrays are."""
    from kdecal import curves, datasets, skce

    def _sample(seed):
        t = datasets.make_seeds_synthetic(60, 3, seed=seed)
        return t.probs, t.labels

    s = datasets.make_seeds_synthetic(200, 3, seed=0)
    est = kdecal.estimate(s.probs, s.labels, bandwidth=0.1)
    makers = {
        "interval": lambda seed: est.confidence_interval("ece_kde_l1", n_resamples=6, seed=seed),
        "test": lambda seed: est.calibration_test(n_resamples=6, seed=seed),
        "sample": lambda seed: datasets.make_seeds_synthetic(30, 3, seed=seed),
        "diagram": lambda seed: curves.ReliabilityDiagram.from_predictions(
            *_sample(seed), bandwidth=0.1
        ),
        "skce": lambda seed: skce.skce_test(*_sample(seed)),
    }
    for name, make in makers.items():
        a, b, c = make(0), make(0), make(1)
        assert (a == b) is True and (a != b) is False, name
        assert (a != c) is True and (a == c) is False, name
        assert a != "something else", name
        with pytest.raises(TypeError, match="unhashable"):
            hash(a)
    assert binned.binned_statistics(s.probs, s.labels) == binned.binned_statistics(
        s.probs, s.labels
    )
    assert binned.binned_statistics(s.probs, s.labels) != binned.binned_statistics(
        s.probs, s.labels, n_bins=10
    )
    from dataclasses import replace

    from kdecal._numerics import same_value

    ci = makers["interval"](0)
    nan = replace(ci, estimate=float("nan"), bootstrap_distribution=np.full(3, np.nan))
    assert nan == replace(nan) and nan != ci
    assert same_value({"a": [np.arange(3), (1.0, "x")]}, {"a": [np.arange(3), (1.0, "x")]})
    assert not same_value({"a": [np.arange(3)]}, {"a": [np.arange(4)]})
    assert not same_value([1, 2], (1, 2))


def test_warnings_point_at_the_callers_line():
    """Warnings raised deep in the estimators (rows with one effective neighbour, the
    plug-in's debiasing fallback) and in the calibrators' fits named a line inside
    kdecal (a fixed ``stacklevel`` that the call depth did not match): they now name the
    line of the user's call, so ``-W error::...:module`` filters and the printed
    location work."""
    from kdecal.recalibration import MeanReplacement, TemperatureScaling

    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(4) * 0.3, size=300)
    y = rng.integers(0, 4, size=300)
    calls = [
        lambda: kdecal.calibration_error(P, y, divergence="l2", bandwidth=1e-3),
        lambda: kdecal.estimate(P, y, bandwidth=1e-3, estimator="plugin").calibration_error("l2"),
        lambda: kdecal.ece_kde(P, y, p=2, bandwidth=1e-4, calibration="classwise"),
        lambda: MeanReplacement().fit(P, y),
        lambda: TemperatureScaling(input="probs").fit(
            P[:, :2] / P[:, :2].sum(1, keepdims=True), y % 2
        ),
    ]
    for k, call in enumerate(calls):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            call()
        mine = [w for w in rec if issubclass(w.category, kdecal.KdecalWarning)]
        assert mine, k
        for w in mine:
            assert w.filename == __file__, (k, w.filename, str(w.message)[:60])


def test_cli_prints_non_ascii_names_on_an_ascii_stream(tmp_path):
    """Under ``PYTHONIOENCODING=ascii`` (or an ASCII terminal) a file name with ``é``
    made ``kdecal evaluate`` print only "cannot write standard output" and no report;
    the report is now printed with the character escaped, and the JSON stays ASCII."""
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(3), size=200)
    path = tmp_path / "modèle.npz"
    np.savez(path, probs=P, labels=rng.integers(0, 3, 200))
    env = dict(os.environ, PYTHONIOENCODING="ascii", KDECAL_PROGRESS="0")
    for extra in ([], ["--json"]):
        cmd = [sys.executable, "-m", "kdecal.cli", "evaluate", str(path), "--n-resamples", "0"]
        out = subprocess.run(cmd + extra, capture_output=True, env=env, check=False)
        assert out.returncode == 0, out.stderr.decode("ascii", "replace")
        text = out.stdout.decode("ascii")  # ASCII only
        if extra:
            assert json.loads(text)["source"].startswith("modèle.npz [probs, labels]")
        else:
            assert "mod\\xe8le.npz" in text and "kdecal calibration report" in text


def test_cli_refuses_boolean_masks_and_flag_columns(tmp_path, capsys):
    """A helper's probe: boolean labels in a file (a mask ``argmax == y``) were cast to
    classes 0/1 before the labels' check (accuracy 0.366 instead of 0.732, ECE^KDE 1.016
    instead of 0.096, exit 0), where ``kdecal.evaluate`` refuses them; and a 0/1 column
    beside logits (``correct``, ``pred``) or probabilities became one more class (K = 11
    for CIFAR-10 logits). Both are refused in one line naming the file and the column;
    boolean labels of a binary file stay classes 0/1, and an all-zero column (a binary
    logit reference, a class never predicted) stays a class."""
    import pandas as pd

    P, y = _calibrated(0, n=300, k=3)
    mask = P.argmax(1) == y
    np.savez(tmp_path / "mask.npz", probs=P, labels=mask)
    code, out, err = _cli(capsys, "evaluate", str(tmp_path / "mask.npz"), "--n-resamples", "0")
    assert code == 2 and out == "" and "mask.npz" in err and "a mask such as argmax" in err
    rng = np.random.default_rng(1)
    L = rng.normal(size=(300, 4))
    yl = rng.integers(0, 4, 300)
    cols = {f"z{k}": L[:, k] for k in range(4)}
    for extra, values in (("correct", (L.argmax(1) == yl).astype(int)), ("pred", yl % 2)):
        f = tmp_path / f"{extra}.csv"
        pd.DataFrame({**cols, extra: values, "label": yl}).to_csv(f, index=False)
        code, out, err = _cli(capsys, "evaluate", str(f), "--n-resamples", "0")
        assert code == 2 and out == "", err
        assert f"{f.name}:" in err and f"column 4 ('{extra}') holds only integers" in err
        assert err.count("\n") == 1
    # the same column named as a class's scores is taken as the user says
    code, _, _ = _cli(capsys, "evaluate", str(f), "--n-resamples", "0", "--logits")
    assert code == 0
    # binary files: boolean labels are classes 0/1; an all-zero reference column passes
    t = rng.normal(size=300)
    yb = rng.random(300) < 1 / (1 + np.exp(-t))
    np.savez(tmp_path / "bin.npz", logits=np.column_stack([np.zeros(300), t]), labels=yb)
    code, out, err = _cli(capsys, "evaluate", str(tmp_path / "bin.npz"), "--n-resamples", "0")
    assert code == 0, err
    assert "n = 300, K = 2," in out


def test_cli_reads_true_false_labels_of_a_csv_as_boolean_labels(tmp_path, capsys):
    """The README says boolean labels are classes 0/1 of a binary file; a CSV written by
    pandas from a boolean column holds True/False text, which was refused ("must hold
    integer class indices, found 'True'") where the same labels in .npz worked. Read as
    boolean labels: the same report as the .npz, and the same refusal beside K > 2."""
    import json

    import pandas as pd

    rng = np.random.default_rng(3)
    p = rng.random(300)
    yb = rng.random(300) < p
    np.savez(tmp_path / "b.npz", probs=p, labels=yb)
    pd.DataFrame({"score": p, "label": yb}).to_csv(tmp_path / "b.csv", index=False)
    args = ("--n-resamples", "0", "--metrics", "ece_kde_l1,ece_binned", "--json")
    code, out_csv, err = _cli(capsys, "evaluate", str(tmp_path / "b.csv"), *args)
    assert code == 0, err
    code, out_npz, err = _cli(capsys, "evaluate", str(tmp_path / "b.npz"), *args)
    assert code == 0, err
    a, b = json.loads(out_csv), json.loads(out_npz)
    assert a["ece_kde_l1"] == b["ece_kde_l1"] and a["ece_binned"] == b["ece_binned"]
    assert a["accuracy"] == b["accuracy"] and a["n_classes"] == 2
    P = rng.dirichlet(np.ones(3), 300)
    frame = pd.DataFrame({"a": P[:, 0], "b": P[:, 1], "c": P[:, 2], "label": P.argmax(1) == 0})
    frame.to_csv(tmp_path / "m.csv", index=False)
    code, out, err = _cli(capsys, "evaluate", str(tmp_path / "m.csv"), "--n-resamples", "0")
    assert code == 2 and out == "" and "a mask such as argmax" in err


def test_unnormalised_probabilities_are_refused():
    """Probability rows times a constant (P * 2, P * 1.2, the votes of 10 annotators)
    were read as logits by input="auto": log_loss(P * 2) gave 1.3977 (1.8985 on P), and
    TemperatureScaling fitted them as logits to T = 1e12. Non-negative rows with one
    common sum are refused, naming the argument, the sum and both choices; genuine
    logits, a single row and 1-D scores are read as before."""
    r = np.random.default_rng(1)
    P = r.dirichlet(np.ones(3), 20)
    y = r.integers(0, 3, 20)
    tail = (
        "divide each row by its sum and pass input='probs'. Pass input='logits' if they "
        "are logits."
    )
    with pytest.raises(ValueError) as info:
        kdecal.scores.log_loss(P * 2, y, input="auto")
    assert str(info.value) == (
        "probs look like unnormalised probabilities (entries >= 0, every row summing to "
        f"2; row 0, column 2 holds 1.5910910988618865): {tail}"
    )
    for score in (kdecal.scores.brier_score, kdecal.scores.calibration_loss):
        with pytest.raises(ValueError, match=r"every row summing to 2; row 0, column 2"):
            score(P * 2, y, input="auto")
    with pytest.raises(ValueError) as info:
        kdecal.recalibration.TemperatureScaling().fit(P * 1.2, y)
    assert str(info.value) == (
        "scores look like unnormalised probabilities (entries >= 0, every row summing to "
        f"1.2; row 9, column 1 holds 1.146415347433722): {tail}"
    )
    votes = np.array([r.multinomial(10, p) for p in P])
    with pytest.raises(ValueError, match=r"every row summing to 10; row 0, column 0 holds"):
        resolve_input(votes, "auto")
    # the choices the message names give the numbers
    assert kdecal.scores.log_loss(P * 2 / 2, y, input="auto") == pytest.approx(
        1.8985252946257112, rel=1e-12
    )
    assert kdecal.scores.log_loss(P * 2, y, input="logits") == pytest.approx(
        1.397675269816049, rel=1e-12
    )
    # logits: never all non-negative with one common row sum
    L = np.random.default_rng(3).normal(scale=3.0, size=(200, 10))
    # (one row, or one row repeated, could be either: the same logits for every sample)
    same = (L[:1] ** 2 + 2.0, np.tile([2.0, 2.0, 0.0], (10, 1)))
    # logits with a large common offset have row sums within 2 % of each other (sklearn's
    # estimator checks draw N(100, 1) entries), not within the tolerance of a scaling
    offset = np.random.default_rng(4).normal(loc=100.0, size=(20, 2))
    for Z in (L - L.min(axis=1, keepdims=True), np.abs(L) + 1.0, offset, *same):
        assert resolve_input(Z, "auto")[0] == "logits"
    # 1-D scores keep their rule (P(y = 1) in [0, 1]; [0, 100]: percentages)
    assert resolve_input(P[:, 1], "auto")[0] == "probs"
    with pytest.raises(ValueError, match="look like percentages"):
        resolve_input(2 * P[:, 1] + 1, "auto")


def test_the_librarys_quiet_blocks_are_thread_local():
    """A helper's probe: kdecal silenced its own warnings inside a call (once per
    bootstrap replicate) with ``warnings.catch_warnings``, which swaps the process-wide
    filter list (not thread-safe before Python 3.14): four threads running
    confidence_interval at once left an "ignore KdecalWarning" filter installed, and a
    later K = 100 canonical estimate gave no UnreliableEstimateWarning. ``quiet`` drops
    only the calling thread's warnings and changes no filter."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from kdecal.warnings import KdecalWarning, quiet, warn_user

    before = list(warnings.filters)
    entered, release = threading.Event(), threading.Event()

    def inside() -> None:
        with quiet(KdecalWarning):
            entered.set()
            release.wait(10)
            warn_user("dropped inside the block")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = threading.Thread(target=inside)
        t.start()
        assert entered.wait(10)
        warn_user("another thread's warning is kept")  # while the block is open
        release.set()
        t.join()
    texts = [str(w.message) for w in caught]
    assert texts == ["another thread's warning is kept"]
    assert warnings.filters == before
    # concurrent bootstraps leave the process's filters as they were
    P, y = _calibrated(3, n=300, k=3)
    est = kdecal.estimate(P, y, bandwidth=0.2)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: est.confidence_interval("ce_l2", n_resamples=8, seed=s), range(8)))
    assert warnings.filters == before


def test_blas_limits_of_concurrent_calls_are_restored(monkeypatch):
    """A helper's probe: the recalibration fits and the resampling limit the BLAS
    library's threads (process-wide, threadpoolctl), each block restoring what its entry
    saw; two blocks on two threads exiting out of order (A in, B in, A out, B out)
    restored A's limit last and left the host's BLAS on one thread for good. The
    bookkeeping is checked on a stand-in for threadpoolctl's limiter (OpenBLAS itself
    applies a thread count set from one thread while another exits nondeterministically)."""
    import threading

    import threadpoolctl

    from kdecal._engine import runtime

    state = {"threads": 8}

    class FakeLimits:
        def __init__(self, limits: int, user_api: str) -> None:
            assert user_api == "blas"
            self.original = state["threads"]
            state["threads"] = limits

        def restore_original_limits(self) -> None:
            state["threads"] = self.original

    monkeypatch.setattr(threadpoolctl, "threadpool_limits", FakeLimits)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a() -> None:
        with runtime.blas_threads(1):
            a_in.set()
            assert b_in.wait(10)
        a_out.set()

    def b() -> None:
        assert a_in.wait(10)
        with runtime.blas_threads(2):
            b_in.set()
            assert a_out.wait(10)
            seen["b after a"] = state["threads"]  # B's block keeps its own limit

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"b after a": 2} and state["threads"] == 8
    # nested on one thread: the inner limit, then the outer's again, then the original
    with runtime.blas_threads(1):
        with runtime.blas_threads(2):
            assert state["threads"] == 2
        assert state["threads"] == 1
    assert state["threads"] == 8 and runtime._blas_active == []


def test_cli_page_of_a_binary_file_gets_its_one_column(tmp_path, capsys, monkeypatch):
    """The command line passes its validated probabilities on; the page of a binary
    file (one score column) got the (n, 2) rows, which its calibration-sharpness panel
    reads as K = 2 top-label confidences (another figure than the API's page of the same
    file). The page gets the file's P(y = 1)."""
    pytest.importorskip("matplotlib")
    from kdecal import cli

    seen = []

    class Page:
        def savefig(self, path):
            seen.append(path)

    def page(probs, labels, **kw):
        seen.append(np.asarray(probs).shape)
        return Page()

    monkeypatch.setattr(cli, "evaluation_page", page)
    rng = np.random.default_rng(2)
    p = rng.random(200)
    np.savez(tmp_path / "b.npz", probs=p, labels=(rng.random(200) < p).astype(int))
    code, _, err = _cli(
        capsys,
        "evaluate",
        str(tmp_path / "b.npz"),
        "--n-resamples",
        "0",
        "--plot",
        str(tmp_path / "page.png"),
    )
    assert code == 0, err
    assert seen[0] == (200,)


@pytest.mark.filterwarnings("ignore::kdecal.warnings.KdecalWarning")  # single-neighbour rows
def test_estimates_do_not_depend_on_the_memory_layout():
    """The same float64 values in C and in Fortran order give the same estimates, bit for
    bit. Saturated rows (confidence within 1e-11 of 1, rounded to 2 decimals and
    renormalised) summed their row sums in another order in Fortran order, and the
    binary problems' 1 - p moved by 1e-5 relative (top-label L1 1.9e-7 apart on a
    probe's 2-decimal logistic regression; 4.5e-10 on this test's data)."""
    rng = np.random.default_rng(4)
    z = rng.normal(size=(400, 10)) * 8.0
    P = np.exp(z - z.max(axis=1, keepdims=True))
    P = np.round(P / P.sum(axis=1, keepdims=True), 2)
    P = P / P.sum(axis=1, keepdims=True)
    y = np.array([rng.choice(10, p=np.clip(q, 0, None) / np.clip(q, 0, None).sum()) for q in P])
    C, F = np.ascontiguousarray(P), np.asfortranarray(P)
    for calibration in ("canonical", "top_label", "classwise"):
        for h in (0.003, 0.5):
            kw = {"calibration": calibration, "bandwidth": h}
            assert kdecal.ece_kde(C, y, **kw) == kdecal.ece_kde(F, y, **kw)
            a = kdecal.calibration_error(C, y, divergence="l2", **kw)
            assert a == kdecal.calibration_error(F, y, divergence="l2", **kw)


@pytest.mark.parametrize("case", ["identical rows", "one-hot top-label"])
def test_no_grid_end_warning_where_the_risk_does_not_depend_on_the_bandwidth(case):
    """All prediction vectors identical (or one-hot, top-label: every confidence 1): the
    kernel weighs every centre alike at every bandwidth, the risk is the same over the
    grid, and the search's end value is a tie, not an optimum outside the range."""
    rng = np.random.default_rng(0)
    if case == "identical rows":
        P, cal = np.tile([0.5, 0.3, 0.2], (200, 1)), "canonical"
        y = rng.choice(3, 200, p=[0.5, 0.3, 0.2])
    else:
        top = rng.choice(2, 300)
        P, cal = np.eye(2)[top], "top_label"
        y = np.where(rng.random(300) < 0.9, top, 1 - top)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = kdecal.estimate(P, y, calibration=cal)
        h = kdecal.select_bandwidth(P, y, calibration=cal)
    assert est.value("ece_kde_l1") == pytest.approx(
        kdecal.ece_kde(P, y, calibration=cal, bandwidth=1.0), rel=1e-12
    )
    assert h == est.bandwidth
