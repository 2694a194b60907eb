"""The search's tolerance: estimates at the bandwidth it stops at against the full local search.

Not a pytest file. The search on all rows (top-label and class-wise problems on the fast
binary engine) skips its last one-step checks where the parabola through the risks two
grid steps either side predicts no neighbour better by more than
``SEARCH_TOLERANCE_SE`` paired standard errors (:func:`kdecal._estimation.search._settled`;
off by default). For each real file (``../shared/data/real``, 5,000 <= n <= ``--max-n``,
or the files named) and notion: ``kdecal.estimate(..., bandwidth="auto")`` with the
tolerance ``--tol`` and without it (the default: every local minimum checked one step
away, which is the exhaustive grid's argmin on every real file,
``bench/search_real_2026-11-26.md``), the
search's kernel work (pass-equivalents), the chosen bandwidths, and the difference of the
estimates (``ece_kde_l1``, ``ce_l2``) in units of the estimate's bootstrap standard
error (50 replicates; the issue's tolerance: 0.1).

Usage: python bench/search_tolerance.py [--tol 0.1] [--notions top_label,classwise] [--max-n 20000]
       [FILE ...]
"""

from __future__ import annotations

import argparse
import glob
import os
import warnings

import numpy as np

import kdecal
from kdecal._estimation import search as _search
from search_real import load

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "..", "..", "shared", "data", "real")
Q = ("ece_kde_l1", "ce_l2")


def run(P, y, notion, tol):
    _search.SEARCH_TOLERANCE_SE = tol
    try:
        return kdecal.estimate(P, y, calibration=notion, bandwidth="auto", progress=False)
    finally:
        _search.SEARCH_TOLERANCE_SE = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notions", default="top_label")
    ap.add_argument("--max-n", type=int, default=20000)
    ap.add_argument("--tol", type=float, default=0.1)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    files = a.files or sorted(glob.glob(os.path.join(REAL, "*.npz")))
    print(
        "| data | notion | n | h: tolerance / full | kernel work | L1 diff (SE) | sq L2 diff (SE) |"
    )
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for f in files:
        try:
            P, y = load(f)
        except KeyError:
            continue
        if not 5000 <= len(y) <= a.max_n:  # the bootstrap's dense passes are O(n^2)
            continue
        name = os.path.basename(f)[:-4]
        for notion in a.notions.split(","):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                et = run(P, y, notion, a.tol)
                ef = run(P, y, notion, None)
                dist, _ = ef._resampled(list(Q), [], 50, np.random.default_rng(1), None)
            se = {q: float(np.std(dist[q], ddof=1)) for q in Q}
            d = {q: (et.value(q) - ef.value(q)) / se[q] for q in Q}
            worst = max(worst, *(abs(v) for v in d.values()))
            wt, wf = et.search.kernel_work, ef.search.kernel_work
            print(
                f"| {name} | {notion} | {len(y)} | {et.bandwidth:.3g} / {ef.bandwidth:.3g} | "
                f"{wt:.1f} / {wf:.1f} | {d['ece_kde_l1']:+.3f} | {d['ce_l2']:+.3f} |",
                flush=True,
            )
    print(f"\nlargest |difference|: {worst:.3f} bootstrap standard errors")


if __name__ == "__main__":
    main()
