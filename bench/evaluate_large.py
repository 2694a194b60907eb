"""``kdecal evaluate`` at large n: the default report and the top-label one.

    KDECAL_PROGRESS=0 python bench/evaluate_large.py [--n 30000 100000] [--json OUT]

On the seeds' synthetic protocol (K = 10, t1 = t2 = 0.6), per n: the default report
(``kdecal.evaluate(probs, labels)``: canonical estimate and notion table, the canonical
resampling only within ``CANONICAL_RESAMPLING_MAX_WORK`` and ``_MAX_N``) and the report of
``--calibration top_label --notions top_label,classwise``, with the wall time of each
and which notions were resampled. ``--canonical-resamples R`` also times R resamples of
the canonical notion at each n (``CalibrationEstimate._intervals_and_tests``: the
bootstrap and test of the report's two quantities), to check the report's estimate of
what leaving them out saves.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import kdecal
from kdecal._estimation.replicates import dense_resampling_seconds
from kdecal._evaluate import _resampled_notions
from kdecal.datasets import make_seeds_synthetic

NAMES = ["ece_kde_l1", "ce_l2"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[30_000, 100_000])
    ap.add_argument("--canonical-resamples", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for n in args.n:
        d = make_seeds_synthetic(n, 10, seed=0)
        P, y = d.probs, d.labels
        K = P.shape[1]
        work = float(n) * n * (K + 3)
        row: dict[str, object] = {"n": n, "K": K, "work": work}
        for name, kw in (
            ("default", {}),
            ("top_label", {"calibration": "top_label", "notions": ("top_label", "classwise")}),
        ):
            t = time.perf_counter()
            rep = kdecal.evaluate(P, y, **kw)
            row[f"{name} s"] = round(time.perf_counter() - t, 2)
            row[f"{name} resampled"] = [k for k, v in rep.notions.items() if "pvalue" in v]
        row["canonical resampled by default"] = not _resampled_notions(
            "auto", "canonical", n, K, 100, "cpp"
        )[1]
        row["estimated canonical resampling s (100)"] = round(
            dense_resampling_seconds(n, K, 100), 1
        )
        if args.canonical_resamples:
            est = kdecal.estimate(P, y)
            t = time.perf_counter()
            est._intervals_and_tests(
                NAMES, NAMES, level=0.95, n_resamples=args.canonical_resamples, seed=0
            )
            row[f"canonical resampling s ({args.canonical_resamples})"] = round(
                time.perf_counter() - t, 2
            )
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
