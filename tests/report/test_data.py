"""The real-data files shipped in tests/data and how tests find them.

The shipped files must equal the project's real-data folder (whole files, or the rows
conftest.subsample_rows keeps), be listed with their licence in tests/data/README.md,
and a test that needs a file that is neither shipped nor present must skip with a reason
(or fail under KDECAL_REQUIRE_REAL_DATA=1), never pass silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    REAL,
    REAL_N_MAX,
    SHIPPED_FULL,
    SHIPPED_SUBSETS,
    TEST_DATA_DIR,
    find_real_file,
    subsample_rows,
)

SHIPPED = sorted([*SHIPPED_FULL, *(subset for subset, _ in SHIPPED_SUBSETS.values())])


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def test_shipped_files_are_listed_with_their_licence():
    readme = (TEST_DATA_DIR / "README.md").read_text(encoding="utf-8")
    on_disk = sorted(p.name for p in TEST_DATA_DIR.glob("*.npz"))
    assert on_disk == SHIPPED
    for name in SHIPPED:
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert row.rstrip().endswith(("| MIT |", "| Apache-2.0 |")), row
    assert (TEST_DATA_DIR / "LICENSE-Apache-2.0.txt").is_file()
    assert sum(p.stat().st_size for p in TEST_DATA_DIR.iterdir()) < 2_000_000


@pytest.mark.parametrize("fname", sorted(SHIPPED_SUBSETS))
def test_subsets_hold_the_rows_the_tests_use(fname):
    subset, prefix = SHIPPED_SUBSETS[fname]
    d = _arrays(TEST_DATA_DIR / subset)
    rows = d["rows"]
    assert rows.dtype == np.int64 and rows.shape == (REAL_N_MAX,)
    assert np.all(np.diff(rows) > 0)  # sorted, distinct
    assert d[prefix + "labels"].shape == (REAL_N_MAX,)
    # every conftest dataset built on this file can be built from the subset alone
    assert any(f == fname and p == prefix for f, p, _, _ in REAL.values())


@pytest.mark.parametrize("fname", SHIPPED)
def test_shipped_files_equal_the_real_data_folder(data_dir, fname):
    # (data_dir: marked realdata, skips without the folder)
    source = next((f for f, (s, _) in SHIPPED_SUBSETS.items() if s == fname), fname)
    full, shipped = _arrays(data_dir / source), _arrays(TEST_DATA_DIR / fname)
    if fname in SHIPPED_FULL:
        assert sorted(full) == sorted(shipped)
        for k in full:
            np.testing.assert_array_equal(shipped[k], full[k], err_msg=k)
        return
    _, prefix = SHIPPED_SUBSETS[source]
    rows = subsample_rows(full[prefix + "labels"].shape[0])
    np.testing.assert_array_equal(shipped["rows"], rows)
    for k in shipped:
        if k.startswith(prefix) and k not in ("rows", "note"):
            np.testing.assert_array_equal(shipped[k], full[k][rows], err_msg=k)


def test_shipped_copies_are_found_first():
    for fname in SHIPPED_FULL:
        assert find_real_file(fname) == TEST_DATA_DIR / fname
    assert find_real_file("no_such_file.npz") is None


def _run_pytest(env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KDECAL_REAL_DATA": str(TEST_DATA_DIR / "no-such-folder"), **env_extra}
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-ra", *args]
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, check=False)


def test_missing_real_data_skips_with_a_reason_or_fails_when_required():
    target = "tests/estimators/test_reference.py::TestSoftmax::test_real_logits"
    out = _run_pytest({"KDECAL_REQUIRE_REAL_DATA": "0"}, target)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed, 1 skipped" in out.stdout, out.stdout
    assert "realdata: needs cifar100_resnet20_chenyaofo.npz" in out.stdout, out.stdout
    out = _run_pytest({"KDECAL_REQUIRE_REAL_DATA": "1"}, target)
    assert out.returncode == 1 and "1 failed, 1 passed" in out.stdout, out.stdout
    assert "KDECAL_REQUIRE_REAL_DATA is set" in out.stdout, out.stdout
