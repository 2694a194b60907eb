"""Consistency replicates of binary problems: label sums as centre weights vs own labels.

    KDECAL_PROGRESS=0 python bench/consistency_binary.py [--n 10000 100000] [--resamples 20]

Times ``CalibrationEstimate.calibration_tests(["ece_kde_l1", "ce_l2"])`` (the
consistency replicates of ``kdecal evaluate``'s two quantities, top-label and class-wise)
on the bundled example (a real CIFAR-10 network, n = 10,000: confidences near 1, so the
one-vs-rest problems' positive labels are rare) and on the seeds' synthetic protocol
(K = 10, t1 = t2 = 0.6) at each ``--n``, best of 2, and prints the per-replicate time. Run it on two checkouts to compare (the replicates' values agree
to 1e-8: ``tests/estimators/test_residual.py``).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

import kdecal
from kdecal._io import bundled_example_path
from kdecal.datasets import make_seeds_synthetic

NAMES = ["ece_kde_l1", "ce_l2"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--resamples", type=int, default=20)
    ap.add_argument("--notions", default="top_label,classwise")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    with np.load(bundled_example_path()) as f:
        data = [("bundled", f["probs"], f["labels"])]
    for n in args.n:
        d = make_seeds_synthetic(n, 10, seed=0)
        data.append((f"synthetic {n}", d.probs, d.labels))
    for name, P, y in data:
        n = len(y)
        for notion in args.notions.split(","):
            est = kdecal.estimate(P, y, calibration=notion)
            best = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                est.calibration_tests(NAMES, n_resamples=args.resamples, seed=0)
                best = min(best, time.perf_counter() - t)
            row = {"data": name, "n": n, "notion": notion, "test s": round(best, 3)}
            row["per replicate ms"] = round(1e3 * best / args.resamples, 1)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
