"""The canonical squared L2 error raised to its lower bounds, against the truth.

In truth E||E[y|f] - f||^2 is at least the top-label squared L2 error and K times the
class-wise one (Jensen). For each cell of the seeds' protocol, prints one JSON line per
draw: the canonical residual U-statistic alone (at the default's bandwidth), the
top-label and class-wise default estimates, the truths (Monte Carlo, 4e5 draws); then
`summarize` gives the relative errors of the U-statistic and of the default (the larger
of the three), as means over the draws of each cell.

    KDECAL_PROGRESS=0 OMP_NUM_THREADS=1 python bench/squared_l2_floor.py run 2,4,10 1000,5000 0,1,2 > a.jsonl
    KDECAL_PROGRESS=0 OMP_NUM_THREADS=1 python bench/squared_l2_floor.py run 2,4,10 20000 0 > b.jsonl
    python bench/squared_l2_floor.py summarize a.jsonl b.jsonl
    KDECAL_PROGRESS=0 OMP_NUM_THREADS=1 python bench/squared_l2_floor.py coverage 4 1000 0.6 0.6 40

`coverage K n t1 t2 draws`: per draw (seeds 100, 101, ...) the 95 % bootstrap interval
(100 resamples) of the default and of the U-statistic alone, and at the end how often
each covers the truth.
"""

from __future__ import annotations

import collections
import json
import sys
import time
import warnings

import numpy as np

import kdecal
from kdecal import datasets

CELLS = ((0.6, 0.6), (1.0, 0.6), (0.6, 1.5), (0.9, 0.6), (0.6, 1.0), (1.0, 1.0))
NOTIONS = ("canonical", "top_label", "classwise")


def run(Ks: list[int], ns: list[int], seeds: list[int]) -> None:
    warnings.simplefilter("ignore")
    for n in ns:
        for K in Ks:
            for t1, t2 in CELLS:
                truth = {
                    c: datasets.true_calibration_error(
                        K, t1=t1, t2=t2, divergence="l2", calibration=c, n_mc=400_000
                    )
                    for c in NOTIONS
                }
                for seed in seeds:
                    t0 = time.time()
                    s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=seed)
                    rec: dict[str, object] = {
                        "K": K,
                        "n": n,
                        "t1": t1,
                        "t2": t2,
                        "seed": seed,
                        "truth": truth,
                    }
                    for c in NOTIONS:
                        e = kdecal.estimate(s.probs, s.labels, calibration=c)
                        rec[c] = e.value("ce_l2")
                        if c == "canonical":
                            u = kdecal.estimate(s.probs, s.labels, bandwidth=e.bandwidth_l2)
                            rec["ustat"] = u.value("ce_l2")
                    rec["time"] = time.time() - t0
                    print(json.dumps(rec), flush=True)


def summarize(files: list[str]) -> None:
    recs = []
    for f in files:
        with open(f) as fh:
            recs += [json.loads(line) for line in fh]
    cells = collections.defaultdict(list)
    for r in recs:
        cells[(r["K"], r["n"], r["t1"], r["t2"])].append(
            (r["ustat"], r["canonical"], r["truth"]["canonical"])
        )
    print(
        "| K | n | U-statistic alone | raised to the bounds (default) | calibrated: alone | default |"
    )
    print("|---|---|---|---|---|---|")
    for K in sorted({k[0] for k in cells}):
        for n in sorted({k[1] for k in cells if k[0] == K}):
            u, d, cu, cd = [], [], [], []
            for (k, nn, _, _), v in cells.items():
                if (k, nn) != (K, n):
                    continue
                a = np.array(v)
                if a[0, 2] > 1e-3:
                    u.append(100 * (a[:, 0].mean() / a[0, 2] - 1))
                    d.append(100 * (a[:, 1].mean() / a[0, 2] - 1))
                else:
                    cu.append(a[:, 0].mean())
                    cd.append(a[:, 1].mean())
            print(
                f"| {K} | {n} | {min(u):+.0f}…{max(u):+.0f} % | {min(d):+.0f}…{max(d):+.0f} % | "
                f"{', '.join(f'{x:+.4f}' for x in cu)} | {', '.join(f'{x:+.4f}' for x in cd)} |"
            )


def coverage(K: int, n: int, t1: float, t2: float, draws: int) -> None:
    warnings.simplefilter("ignore")
    truth = datasets.true_calibration_error(K, t1=t1, t2=t2, divergence="l2", n_mc=400_000)
    hits = {"default": 0, "alone": 0}
    for seed in range(100, 100 + draws):
        s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=seed)
        est = kdecal.estimate(s.probs, s.labels)
        cis = {"default": est.confidence_interval("ce_l2", n_resamples=100, seed=seed)}
        est._floors = []  # the U-statistic alone, the same replicates otherwise
        cis["alone"] = est.confidence_interval("ce_l2", n_resamples=100, seed=seed)
        for k, ci in cis.items():
            hits[k] += ci.low <= truth <= ci.high
        print(json.dumps({k: [ci.estimate, ci.low, ci.high] for k, ci in cis.items()}), flush=True)
    print(
        f"K = {K}, n = {n}, ({t1}, {t2}), truth {truth:.5f}: coverage",
        {k: v / draws for k, v in hits.items()},
    )


def main() -> None:
    if sys.argv[1] == "coverage":
        K, n, draws = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[6])
        coverage(K, n, float(sys.argv[4]), float(sys.argv[5]), draws)
        return
    if sys.argv[1] == "summarize":
        summarize(sys.argv[2:])
        return
    Ks, ns, seeds = ([int(x) for x in a.split(",")] for a in sys.argv[2:5])
    run(Ks, ns, seeds)


if __name__ == "__main__":
    main()
