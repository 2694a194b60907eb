"""Kernel vs binned estimators against the ground truth (003 Fig. 2a, 000 Fig. 2 setting).

The seeds' synthetic protocol (kdecal.datasets.make_seeds_synthetic, t1 = t2 = 0.6),
K = 4 and 8, n from 100 to 20,000.  For each (K, n) and each of ``reps`` samples:

- the LOO-MLE bandwidth (kdecal.select_bandwidth, default 55-value grid);
- ECE^KDE L1 and L2, KL CE and squared L2 CE at that bandwidth, for debias = none,
  ustat and ratio (one kdecal.evaluate call each);
- the binned canonical estimator (kdecal.binned.simplex_ece, Doane's m) at p = 1, 2;

compared with the Monte Carlo ground truth (kdecal.datasets.true_calibration_error,
10^6 samples).  Prints a markdown table of the mean estimate and the relative error
(estimate / truth - 1) for each quantity.

Usage: python bench/synthetic_fig2a.py [reps] [n1,n2,...] [K1,K2,...]
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

import kdecal
from kdecal import binned, datasets

QUANTITIES = ("ece_kde_l1", "ece_kde_l2", "ce_kl", "ce_l2")


def truths(K):
    kw = {"t1": 0.6, "t2": 0.6, "n_mc": 10**6, "seed": 0}
    return {
        "ece_kde_l1": datasets.true_calibration_error(K, p=1, **kw),
        "ece_kde_l2": datasets.true_calibration_error(K, p=2, **kw),
        "ce_kl": datasets.true_calibration_error(K, divergence="kl", **kw),
        "ce_l2": datasets.true_calibration_error(K, divergence="l2", **kw),
    }


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ns = (
        [int(x) for x in sys.argv[2].split(",")]
        if len(sys.argv) > 2
        else [100, 300, 1000, 3000, 10000, 20000]
    )
    Ks = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [4, 8]
    rows = []
    t0 = time.perf_counter()
    for K in Ks:
        truth = truths(K)
        print(
            f"K = {K}: truth " + ", ".join(f"{k} = {v:.5f}" for k, v in truth.items()), flush=True
        )
        for n in ns:
            acc: dict[str, list[float]] = {}
            hs = []
            for r in range(reps):
                s = datasets.make_seeds_synthetic(n, K, t1=0.6, t2=0.6, seed=1000 * K + r)
                h = kdecal.select_bandwidth(s.probs)
                hs.append(h)
                for debias in ("none", "ustat", "ratio"):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", kdecal.KdecalWarning)
                        rep = kdecal.evaluate(
                            s.probs, s.labels, bandwidth=h, debias=debias, progress=False
                        )
                    for q in QUANTITIES:
                        acc.setdefault(f"{q} [{debias}]", []).append(getattr(rep, q))
                acc.setdefault("ece_kde_l1 [simplex-binned]", []).append(
                    binned.simplex_ece(s.probs, s.labels, p=1)
                )
                acc.setdefault("ece_kde_l2 [simplex-binned]", []).append(
                    binned.simplex_ece(s.probs, s.labels, p=2)
                )
            for key, vals in acc.items():
                q = key.split(" ")[0]
                mean = float(np.mean(vals))
                rows.append(
                    (K, n, key, mean, truth[q], mean / truth[q] - 1.0, float(np.median(hs)))
                )
            print(
                f"  n = {n}: median h = {np.median(hs):.3g} [{time.perf_counter() - t0:.0f} s]",
                flush=True,
            )
    print("\n| K | n | estimator | mean estimate | truth | relative error | median h |")
    print("|---|---|---|---|---|---|---|")
    for K, n, key, mean, truth_v, rel, h in rows:
        print(f"| {K} | {n} | {key} | {mean:.5f} | {truth_v:.5f} | {rel:+.1%} | {h:.3g} |")


if __name__ == "__main__":
    main()
