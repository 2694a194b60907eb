"""The floor of the cross-validated affine calibration loss at many classes.

    python bench/calibration_loss_floor.py [--cells 1000x10 3000x30 10000x100 10000x300] [--seeds 5] [--real]

A calibrated model (softmax of Gaussian logits with scale 2, labels drawn from the
predictions; the truth of every calibration loss is 0): the mean and standard deviation
over seeds of ``kdecal.scores.calibration_loss`` (log loss, affine calibrator, 5 folds,
seed 0) with stratified folds (Ferrer & Ramos's choice, kdecal's default) and without,
beside ``(K - 1) / (2 n)``, the expected in-sample gain of fitting K class biases to the
sample's class frequencies. ``--real`` adds the CIFAR-100 files of ../shared/data/real:
the affine and the temperature-scaling calibration losses.
"""

from __future__ import annotations

import argparse
import glob
import os
import warnings

import numpy as np
from scipy.special import softmax

from kdecal import scores

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "real")


def calibrated(n: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    P = softmax(2.0 * rng.normal(size=(n, K)), axis=1)
    u = rng.random(n)[:, None]
    y = np.minimum((np.cumsum(P, axis=1) < u).sum(axis=1), K - 1)
    return P, y


def loss(P: np.ndarray, y: np.ndarray, **kw: object) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(scores.calibration_loss(P, y, input="probs", relative=False, seed=0, **kw))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="+", default=["1000x10", "3000x30", "10000x100", "10000x300"])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--real", action="store_true")
    args = ap.parse_args()
    print("| n | K | (K - 1) / (2n) | stratified (default) | not stratified | seeds |")
    print("|---|---|---|---|---|---|")
    for cell in args.cells:
        n, K = map(int, cell.split("x"))
        out = {}
        for strat in (True, False):
            v = np.array([loss(*calibrated(n, K, s), stratified=strat) for s in range(args.seeds)])
            out[strat] = f"{v.mean():+.4f} ± {v.std(ddof=1) / np.sqrt(len(v)):.4f}"
        print(
            f"| {n:,} | {K:,} | {(K - 1) / (2 * n):.4f} | {out[True]} | {out[False]} "
            f"| {args.seeds} |",
            flush=True,
        )
    if args.real:
        print("\n| file | affine | temperature scaling | difference | (K - 1) / (2n) |")
        print("|---|---|---|---|---|")
        for path in sorted(glob.glob(os.path.join(REAL, "cifar100_*.npz"))):
            d = np.load(path)
            P = softmax(d["logits"].astype(np.float64), 1) if "logits" in d.files else d["probs"]
            y = d["labels"]
            a, t = loss(P, y), loss(P, y, calibrator="temperature")
            name = os.path.basename(path)[:-4]
            floor = (P.shape[1] - 1) / (2 * len(y))
            print(f"| {name} | {a:.4f} | {t:.4f} | {a - t:+.4f} | {floor:.4f} |", flush=True)


if __name__ == "__main__":
    main()
