"""Regenerate ``tests/data/`` from the real classifier outputs in ``../shared/data/real``.

Usage (from the repository root, with the shared data folder beside the repository)::

    python scripts/make_test_data.py [--source DIR]

The test suite ships the permissively licensed real files it needs (see
``tests/data/README.md`` for sources and licences): small files whole, and for two large
ones only the rows that ``tests/conftest.py`` uses (``conftest.subsample_rows``), with a
``rows`` key holding their indices in the source file. ``tests/report/test_data.py`` checks
that the shipped files equal the source whenever the source folder is present.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import DATA_DIR, SHIPPED_FULL, SHIPPED_SUBSETS, TEST_DATA_DIR, subsample_rows


def main(argv: list[str] | None = None) -> int:
    """Copy the whole files and write the row subsets into tests/data."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DATA_DIR, help="real-data folder")
    args = parser.parse_args(argv)
    TEST_DATA_DIR.mkdir(exist_ok=True)
    for fname in SHIPPED_FULL:
        shutil.copyfile(args.source / fname, TEST_DATA_DIR / fname)
        print(f"copied {fname}")
    for fname, (subset, prefix) in SHIPPED_SUBSETS.items():
        with np.load(args.source / fname, allow_pickle=False) as d:
            labels = d[prefix + "labels"]
            rows = subsample_rows(labels.shape[0])
            kind = "logits" if prefix + "logits" in d.files else "probs"
            out = {
                prefix + kind: d[prefix + kind][rows],
                prefix + "labels": labels[rows],
                "rows": rows,
                "note": np.asarray(
                    f"rows {'of the ' + prefix[:-1] + ' split ' if prefix else ''}of "
                    f"{fname} (indices in 'rows', {rows.size} of {labels.shape[0]}); "
                    f"source note: {d['note']}"
                ),
            }
        np.savez_compressed(TEST_DATA_DIR / subset, **out)
        print(f"wrote {subset} ({rows.size} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
