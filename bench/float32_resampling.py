"""The canonical bootstrap of float32 predictions: float32 products against float64 ones.

A float32 problem's dense bootstrap replicates form their products in float32 (the
compiled core's kernel weights rounded, blocks of ``PRODUCT_BLOCK`` centres summed in
float64; ``kdecal._estimation.replicates._single_products``). Per file (its
probabilities as float32): the canonical estimate at its automatic bandwidth, then
``confidence_intervals`` of the L1, squared L2 and KL errors, 100 resamples, with the
float32 products (the default) and with float64 ones, alternated ``--repeat`` times;
the largest relative difference of any replicate and of any interval endpoint, and
how many blocks of rows were counted and how many of those fell back to float64 (rows
with fewer than 40 centres within ``2^-40`` of their largest weight; the problem's later
blocks of the chunk then run in float64 without counting).

    KDECAL_PROGRESS=0 python bench/float32_resampling.py [--files F ...] [--repeat 2]
"""

from __future__ import annotations

import argparse
import pathlib
import time
import warnings

import numpy as np

import kdecal
from kdecal._estimation import replicates as _replicates
from kdecal._io import bundled_example_path

REAL = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
NAMES = ["ece_kde_l1", "ce_l2", "ce_kl"]


def run(est, single: bool) -> tuple[float, dict]:
    orig = _replicates._single_products
    if not single:
        _replicates._single_products = lambda e, b: (False, orig(e, b)[1])
    try:
        t = time.perf_counter()
        ci = est.confidence_intervals(NAMES, n_resamples=100, seed=0)
        return time.perf_counter() - t, ci
    finally:
        _replicates._single_products = orig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="*", default=None)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    files = (
        [pathlib.Path(f) for f in args.files]
        if args.files
        else [
            bundled_example_path(),
            REAL / "cifar10_resnet56_chenyaofo.npz",
            REAL / "cifar100_resnet56_chenyaofo.npz",
            REAL / "agnews_gpt2_zeroshot.npz",
        ]
    )
    warnings.simplefilter("ignore")
    print(
        "| file | n, K | h | float64 products | float32 products | replicates: max rel. diff | endpoints: max rel. diff | blocks in float64 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        with np.load(f) as d:
            if "probs" in d.files:
                P = np.asarray(d["probs"], dtype=np.float32)
            else:
                L = np.asarray(d["logits"], dtype=np.float64)
                P = np.exp(L - L.max(axis=1, keepdims=True))
                P = (P / P.sum(axis=1, keepdims=True)).astype(np.float32)
            y = d["labels"]
        est = kdecal.estimate(P, y, calibration="canonical")
        counted: list[bool] = []
        hold = _replicates._single_rows_hold

        def spy(W, counted=counted, hold=hold):
            counted.append(hold(W))
            return counted[-1]

        _replicates._single_rows_hold = spy
        t64, t32 = [], []
        try:
            for _ in range(args.repeat):
                a, ci64 = run(est, False)
                b, ci32 = run(est, True)
                t64.append(a)
                t32.append(b)
        finally:
            _replicates._single_rows_hold = hold
        rep = max(
            float(
                np.max(np.abs(ci32[q].bootstrap_distribution / ci64[q].bootstrap_distribution - 1))
            )
            for q in NAMES
        )
        end = max(
            abs(getattr(ci32[q], e) / getattr(ci64[q], e) - 1)
            for q in NAMES
            for e in ("low", "high")
        )
        fell = f"{counted.count(False)} of {len(counted)} counted" if counted else "none counted"
        print(
            f"| {f.stem} | {P.shape[0]}, {P.shape[1]} | {est.bandwidth:.3g} | "
            f"{min(t64):.2f} s | {min(t32):.2f} s | {rep:.1e} | {end:.1e} | {fell} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
