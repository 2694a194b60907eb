"""`kdecal evaluate` at many classes: its default report against the canonical one.

    KDECAL_PROGRESS=0 python bench/evaluate_many_classes.py [--configs default canonical]

Cases: a real CIFAR-100 model (cifar100_resnet56_chenyaofo, n = 10,000, K = 100, from
../shared/data/real) and the seeds' protocol, calibrated (t1 = 0.6, t2 = 1: every truth
0), at n = 10,000, K = 100 and n = 5,000, K = 1,000. Configurations: ``default`` is
``kdecal.evaluate(probs, labels)``; ``canonical`` asks for the canonical notion as the
headline and in the notion table (``calibration="canonical", notions=("canonical",
"top_label", "classwise")``), the default before 2026-11-27's fourteenth session. One
process, wall time of each call, the headline notion and its L1 ECE^KDE and squared L2
error, the notes' count and the warnings' categories.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
from scipy.special import softmax

import kdecal
from kdecal.datasets import make_seeds_synthetic

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "real")


def cases() -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = []
    path = os.path.join(REAL, "cifar100_resnet56_chenyaofo.npz")
    if os.path.exists(path):
        d = np.load(path)
        out.append(
            (
                "cifar100_resnet56 (n = 10,000, K = 100)",
                softmax(d["logits"].astype(np.float64), 1),
                d["labels"],
            )
        )
    for n, K in ((10_000, 100), (5_000, 1_000)):
        s = make_seeds_synthetic(n, K, t1=0.6, t2=1.0, seed=0)
        out.append((f"synthetic calibrated (n = {n:,}, K = {K:,})", s.probs, s.labels))
    return out


CONFIGS = {
    "default": {},
    "canonical": {"calibration": "canonical", "notions": ("canonical", "top_label", "classwise")},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = ap.parse_args()
    print(
        "| case | configuration | headline notion | L1 ECE^KDE | squared L2 | notion rows | notes | warnings | wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, P, y in cases():
        for config in args.configs:
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                t = time.perf_counter()
                rep = kdecal.evaluate(P, y, **CONFIGS[config])
                sec = time.perf_counter() - t
            cats = sorted({w.category.__name__ for w in rec})
            print(
                f"| {name} | {config} | {rep.calibration} | {rep.ece_kde_l1:.4f} | {rep.ce_l2:.5f} "
                f"| {', '.join(rep.notions)} | {len(rep.notes)} | {', '.join(cats) or '-'} "
                f"| {sec:.1f} s |",
                flush=True,
            )


if __name__ == "__main__":
    main()
