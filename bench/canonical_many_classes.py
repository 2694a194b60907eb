"""Canonical and top-label estimates at many classes, against the truth.

    KDECAL_PROGRESS=0 python bench/canonical_many_classes.py [--n 5000] [--k 10 30 100 300 1000]

The seeds' protocol (:func:`kdecal.datasets.make_seeds_synthetic`, seed 0) in two cells:
calibrated (t1 = 0.6, t2 = 1: the truth of every notion is 0) and miscalibrated
(t1 = 1, t2 = 0.6). For each K, the default estimates (residual estimator, automatic
bandwidth) of the canonical notion with its truths (``E[y | f]`` is the protocol's
``calibrated``: L1 ``mean ||c - f||_1``, squared L2, KL) and of the top-label notion
with an upper bound of its L1 truth (``mean |c_top - max f|``, at least the truth by
Jensen's inequality) and the binned top-label ECE beside it.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import kdecal
from kdecal import binned
from kdecal.datasets import make_seeds_synthetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--k", type=int, nargs="+", default=[10, 30, 100, 300, 1000])
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    n = args.n
    print(
        "| K | cell | canonical h | L1 (truth) | squared L2 (truth) | KL (truth) | "
        "top-label L1 (bound) | binned ECE | time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for K in args.k:
        for t1, t2 in ((0.6, 1.0), (1.0, 0.6)):
            s = make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=0)
            f, c = s.probs, s.calibrated
            t = time.perf_counter()
            e = kdecal.estimate(f, s.labels)
            top = kdecal.estimate(f, s.labels, calibration="top_label")
            sec = time.perf_counter() - t
            l1 = np.mean(np.abs(c - f).sum(axis=1))
            l2 = np.mean(((c - f) ** 2).sum(axis=1))
            with np.errstate(divide="ignore", invalid="ignore"):
                kl = np.mean(np.sum(np.where(c > 0, c * np.log(c / f), 0.0), axis=1))
            rows = np.arange(n)
            bound = np.mean(np.abs(c[rows, f.argmax(axis=1)] - f.max(axis=1)))
            cell = "calibrated" if t2 == 1.0 else "miscalibrated"
            print(
                f"| {K} | {cell} | {e.bandwidth:.3g} | {e.value('ece_kde_l1'):.4f} ({l1:.4f}) "
                f"| {e.value('ce_l2'):.5f} ({l2:.5f}) | {e.value('ce_kl'):.4f} ({kl:.4f}) "
                f"| {top.value('ece_kde_l1'):.4f} ({bound:.4f}) "
                f"| {binned.ece(f, s.labels):.4f} | {sec:.1f} s |",
                flush=True,
            )


if __name__ == "__main__":
    main()
