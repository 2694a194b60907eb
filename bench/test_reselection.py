"""The calibration test with the automatic bandwidth: re-selecting it on each null replicate.

Study script of 2026-11-29 (bench/README.md, "The calibration test"). For each data set
of the seeds' protocol (calibrated: t2 = 1; or t2 < 1 for power) the test of the
residual squared-L2 statistic is run with its null replicates at the estimate's
bandwidth ("none") and re-selected on each replicate's labels among the searched
bandwidth and RESELECT_STEPS grid steps either side ("refit"), on the same data and
label draws; optionally with a label-free bandwidth ("loo-mle").

    python bench/test_reselection.py K n data_sets n_resamples [t2] [steps]
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

import kdecal
import kdecal._calibration_estimate as ce
from kdecal import datasets


def main() -> None:
    K, n, ndata, R = (int(a) for a in sys.argv[1:5])
    t2 = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
    if len(sys.argv) > 6:
        ce.RESELECT_STEPS = int(sys.argv[6])
    warnings.simplefilter("ignore")
    pv: dict[str, list[float]] = {"none": [], "refit": [], "loo-mle": []}
    sec = dict.fromkeys(pv, 0.0)
    for s in range(ndata):
        d = datasets.make_seeds_synthetic(n, K, t1=0.6, t2=t2, seed=1000 + s)
        est = kdecal.estimate(d.probs, d.labels)
        for v in ("none", "refit"):
            t0 = time.perf_counter()
            r = est.calibration_test("ce_l2", n_resamples=R, seed=s, bandwidth_variability=v)
            sec[v] += time.perf_counter() - t0
            pv[v].append(r.pvalue)
        t0 = time.perf_counter()
        r = kdecal.calibration_test(d.probs, d.labels, n_resamples=R, seed=s, bandwidth="loo-mle")
        sec["loo-mle"] += time.perf_counter() - t0
        pv["loo-mle"].append(r.pvalue)
    for v, ps in pv.items():
        p = np.array(ps)
        print(
            f"K={K} n={n} t2={t2} steps={ce.RESELECT_STEPS} {v}: rejections at 5 % "
            f"{np.mean(p <= 0.05):.3f}, at 10 % {np.mean(p <= 0.10):.3f}, mean p "
            f"{p.mean():.3f}, {sec[v]:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
