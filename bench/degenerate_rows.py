"""Rows with one effective neighbour in the residual squared L2 error (issue 26).

A query row whose kernel weights hold one effective neighbour (``sum_{i != k} w_i w_k <=
1e-8 (sum_i w_i)^2``) has no pair for its U-statistic. It used to take the plain square
``||g_j||^2`` of that neighbour's residual (up to 2); it now takes the mean of its
problem's other rows, i.e. it leaves the estimate. This script compares the two on the
seeds' protocol (truth by Monte Carlo) and on a real file where such rows occur at the
automatic bandwidth. The "plain" figure is rebuilt from the estimate's own ``g``.

Usage: ``python bench/degenerate_rows.py [--seeds 6] [--n 1000]``
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

import kdecal
from kdecal._estimation.regression import RESIDUAL_DEGENERATE
from kdecal.datasets import make_seeds_synthetic, true_calibration_error


def both(est: kdecal.CalibrationEstimate) -> tuple[float, float, int]:
    """(the estimate, the old plain-square figure, degenerate rows) of its squared L2 error."""
    e = est._est_sq
    S0 = e.S.sum(-1)
    deg = ~(S0**2 - e.Q.sum(-1) > RESIDUAL_DEGENERATE * S0**2)
    c = e.problem.coords
    g = (e.E - e.problem.p)[..., c]
    plain = np.where(deg, np.sum(g**2, axis=-1), e.sqerr)
    return float(e.sqerr.mean()), float(plain.mean()), int(deg.sum())


def _fmt(values: list[float], truth: float) -> str:
    m = float(np.mean(values))
    return f"{m:.5f}" + (f" ({100 * (m / truth - 1):+.0f} %)" if truth > 1e-9 else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--real", default=str(Path(__file__).parents[2] / "shared/data/real"))
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(
        "| cell | h | rows with one neighbour | truth | plain square (before) | left out (now) |"
    )
    print("|---|---|---|---|---|---|")
    for K, t2 in ((4, 0.6), (10, 0.6), (10, 1.0)) if args.seeds else ():
        truth = true_calibration_error(K, t1=0.6, t2=t2, divergence="l2", n_mc=200_000)
        for h in (0.002, 0.005, 0.01):
            now, old, deg = [], [], []
            for seed in range(args.seeds):
                s = make_seeds_synthetic(args.n, K, t1=0.6, t2=t2, seed=seed)
                a, b, d = both(kdecal.estimate(s.probs, s.labels, bandwidth=h, progress=False))
                now.append(a)
                old.append(b)
                deg.append(d)

            print(
                f"| K = {K}, t2 = {t2} | {h} | {np.mean(deg):.0f} of {args.n} | {truth:.5f} "
                f"| {_fmt(old, truth)} | {_fmt(now, truth)} |"
            )
    path = Path(args.real) / "pathmnist_resnet50.npz"
    if path.exists():
        with np.load(path) as d:
            P = d["probs"] if "probs" in d.files else kdecal.softmax(d["logits"])
            P = np.asarray(P, dtype=np.float64)
            y = d["labels"]
        print("\npathmnist_resnet50 (n = 7,180, K = 9), canonical:")
        print("| h | rows with one neighbour | plain square (before) | left out (now) |")
        print("|---|---|---|---|")
        est = kdecal.estimate(P, y, progress=False)
        for h in (est.bandwidth_l2, 2 * est.bandwidth_l2, 4 * est.bandwidth_l2):
            a, b, d = both(kdecal.estimate(P, y, bandwidth=h, progress=False))
            print(f"| {h:.3g} | {d} | {b:.5f} | {a:.5f} |")


if __name__ == "__main__":
    main()
