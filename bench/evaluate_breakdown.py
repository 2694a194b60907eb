"""Where the time of the default ``kdecal evaluate`` goes, on the bundled example.

Times ``kdecal.evaluate`` as the command line runs it (three notions, 100 resamples of
the bootstrap and the calibration test for the canonical and top-label notions), then
the same work piece by piece through the public API: per notion, the estimate, the
bootstrap intervals and the calibration test of the report's quantities.

    KDECAL_PROGRESS=0 python bench/evaluate_breakdown.py [--threads N] [--backend B] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

import kdecal
from kdecal._io import bundled_example_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--resamples", type=int, default=100)
    ap.add_argument("--backend", default="auto", help="kdecal's backend (default: auto)")
    ap.add_argument("--json", default=None, help="write the timings here")
    args = ap.parse_args()
    if args.threads:
        kdecal.set_num_threads(args.threads)
    with np.load(bundled_example_path()) as d:
        P, y = d["probs"], d["labels"]
    warnings.simplefilter("ignore")
    out: dict[str, float] = {}
    t = time.perf_counter()
    kdecal.evaluate(P, y, n_resamples=args.resamples, progress=False, backend=args.backend)
    out["evaluate"] = time.perf_counter() - t
    for notion in ("canonical", "top_label", "classwise"):
        t = time.perf_counter()
        est = kdecal.estimate(P, y, calibration=notion, backend=args.backend)
        out[f"{notion} estimate"] = time.perf_counter() - t
        if notion == "classwise":  # evaluate resamples canonical and top-label only
            continue
        t = time.perf_counter()
        est.confidence_intervals(["ece_kde_l1", "ce_l2"], n_resamples=args.resamples, seed=0)
        out[f"{notion} bootstrap"] = time.perf_counter() - t
        t = time.perf_counter()
        est.calibration_tests(["ece_kde_l1", "ce_l2"], n_resamples=args.resamples, seed=0)
        out[f"{notion} test"] = time.perf_counter() - t
    for k, v in out.items():
        print(f"{k:24s} {v:7.2f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
