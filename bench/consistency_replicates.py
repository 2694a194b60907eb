"""Consistency replicates of residual estimates: dense products or the multi-label pass.

The calibration test of a residual estimate redraws the labels from the predictions;
each replicate needs, per query row, the label sums ``sum_i w_ij onehot(y*_i)`` (and
``U``). As dense products with the kernel weights that is ``D`` (``D + 1``)
multiply-adds per pair and replicate; the multi-label pass adds each weight into its
label's sum, one add per pair. This times ``calibration_tests`` of ``ece_kde_l1`` and
``ce_l2`` both ways on the synthetic protocol (compiled core), and the bundled example:

    KDECAL_PROGRESS=0 python bench/consistency_replicates.py [--resamples R]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import kdecal
from kdecal import datasets
from kdecal._estimation import replicates as _replicates
from kdecal._io import bundled_example_path

NAMES = ["ece_kde_l1", "ce_l2"]


def timed(P: np.ndarray, y: np.ndarray, bandwidth: float | str, R: int, multi: bool) -> float:
    """Seconds of one ``calibration_tests`` call, consistency replicates dense or not."""
    old = _replicates.CONSISTENCY_MULTI_MIN_DIM
    _replicates.CONSISTENCY_MULTI_MIN_DIM = 1 if multi else 10**9
    try:
        est = kdecal.estimate(P, y, bandwidth=bandwidth)
        t = time.perf_counter()
        est.calibration_tests(NAMES, n_resamples=R, seed=0)
        return time.perf_counter() - t
    finally:
        _replicates.CONSISTENCY_MULTI_MIN_DIM = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resamples", type=int, default=40)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    cases: list[tuple[str, np.ndarray, np.ndarray, float | str]] = []
    for K, n in ((2, 3000), (3, 5000), (4, 10000), (10, 10000), (100, 5000)):
        s = datasets.make_seeds_synthetic(n, K, t1=0.6, t2=0.6, seed=1)
        cases.append((f"synthetic K = {K}, n = {n}, h = 0.3", s.probs, s.labels, 0.3))
    with np.load(bundled_example_path()) as d:
        cases.append(
            ("bundled example (K = 10, n = 10,000), auto", d["probs"], d["labels"], "auto")
        )
    print(f"| case | dense | multi-label | ({args.resamples} replicates) |")
    print("|---|---|---|---|")
    for name, P, y, h in cases:
        dense = timed(P, y, h, args.resamples, False)
        multi = timed(P, y, h, args.resamples, True)
        print(f"| {name} | {dense:.2f} s | {multi:.2f} s | {dense / multi:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
