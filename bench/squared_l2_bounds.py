"""The canonical squared L2 error against its lower bounds, top-label and K x class-wise.

In truth E||E[y|f] - f||^2 >= the top-label squared L2 error and >= K times the
class-wise one (Jensen's inequality). Prints the three default estimates, and the L1
ones, on the real files (K <= 10, 5,000 seeded rows) or on the seeds' protocol (n =
5,000, seed 0), and on real files the paired leave-one-out Brier risk of the residual
and the plug-in regressions at the canonical bandwidth (z > 0: the plug-in predicts
the labels better).

    KDECAL_PROGRESS=0 python bench/squared_l2_bounds.py real [DATA_DIR]
    KDECAL_PROGRESS=0 python bench/squared_l2_bounds.py proto
"""

from __future__ import annotations

import glob
import os
import sys
import warnings

import numpy as np

import kdecal
from kdecal import datasets


def risks(est: kdecal.CalibrationEstimate) -> float:
    """Paired z of the LOO Brier risk, residual minus plug-in regression, at the estimate."""
    e = est._est
    assert e.S is not None
    plug = e.S / e.S.sum(-1, keepdims=True)
    Y = np.zeros_like(plug)
    B, n, _ = Y.shape
    for b in range(B):
        Y[b, np.arange(n), e.problem.labels[b]] = 1.0
    d = (((Y - e.E) ** 2).sum(-1) - ((Y - plug) ** 2).sum(-1)).ravel()
    return float(d.mean() / (d.std(ddof=1) / np.sqrt(d.size)))


def row(name: str, P: np.ndarray, y: np.ndarray) -> None:
    K = P.shape[1]
    est = {
        c: kdecal.estimate(P, y, calibration=c) for c in ("canonical", "top_label", "classwise")
    }
    sq = {c: e.value("ce_l2") for c, e in est.items()}
    l1 = {c: e.value("ece_kde_l1") for c, e in est.items()}
    print(
        f"{name:38s} K={K:2d} h={est['canonical'].bandwidth:.3g} | squared L2 canonical "
        f"{sq['canonical']:.5f} top-label {sq['top_label']:.5f} K x class-wise "
        f"{K * sq['classwise']:.5f} | L1 {l1['canonical']:.4f} {l1['top_label']:.4f} "
        f"{K * l1['classwise']:.4f} | risk z {risks(est['canonical']):+.1f}",
        flush=True,
    )


def main() -> None:
    warnings.simplefilter("ignore")
    if sys.argv[1:2] == ["proto"]:
        for K in (4, 10):
            for t1, t2 in ((0.6, 0.6), (1.0, 0.6), (0.6, 1.5), (0.9, 0.6), (0.6, 1.0)):
                s = datasets.make_seeds_synthetic(5000, K, t1=t1, t2=t2, seed=0)
                row(f"protocol ({t1}, {t2})", s.probs, s.labels)
        return
    root = sys.argv[2] if len(sys.argv) > 2 else "../shared/data/real"
    for f in sorted(glob.glob(os.path.join(root, "*.npz"))):
        with np.load(f) as d:
            if "labels" not in d.files:
                continue
            if "probs" in d.files:
                P = d["probs"].astype(np.float64)
            else:
                P = kdecal.softmax(d["logits"].astype(np.float64))
            y = d["labels"]
        if P.shape[1] > 10:
            continue
        rows = np.random.default_rng(0).choice(len(y), min(5000, len(y)), replace=False)
        row(os.path.basename(f)[:-4], P[rows], y[rows])


if __name__ == "__main__":
    main()
