"""Search rows: the bandwidth search on at most ``--cap`` query rows against all rows.

Not a pytest file. For each data set (the seeds' synthetic protocol, K = 10, three
miscalibrated cells; the CIFAR-10 predictions of ``bench/conftest.py`` resampled to n
rows) and notion, ``kdecal.estimate(..., bandwidth="auto")`` with the search's rows
capped at ``--cap`` (:data:`kdecal._estimation.search.SEARCH_ROWS_MAX`) and uncapped
(every row, the default): the wall time of each, the chosen bandwidths, and the
difference of the estimates (``ece_kde_l1``, ``ce_l2``) in units of the estimate's
bootstrap standard error, taken from 50 bootstrap replicates on a random 10,000-row
subset and scaled by sqrt(10,000 / n) (the issue's tolerance: 0.1 standard error).

Usage: python bench/search_rows.py [--n 100000] [--cap 20000] [--notions top_label,classwise]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import kdecal
from conftest import cifar10_probs
from kdecal._estimation import search as _search
from kdecal.datasets import make_seeds_synthetic

Q = ("ece_kde_l1", "ce_l2")


def _run(P, y, notion, cap: int | None):
    _search.SEARCH_ROWS_MAX = cap
    t0 = time.perf_counter()
    est = kdecal.estimate(P, y, calibration=notion, bandwidth="auto", progress=False)
    _search.SEARCH_ROWS_MAX = None
    return est, time.perf_counter() - t0


def _se(P, y, notion, h, rng):
    idx = rng.choice(len(y), size=min(len(y), 10_000), replace=False)
    est = kdecal.estimate(P[idx], y[idx], calibration=notion, bandwidth=h, progress=False)
    dist, _ = est._resampled(list(Q), [], 50, np.random.default_rng(1), None)
    return {q: float(np.std(dist[q], ddof=1)) * math.sqrt(len(idx) / len(y)) for q in Q}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--cap", type=int, default=20_000)
    ap.add_argument("--notions", default="top_label,classwise")
    a = ap.parse_args()
    cap0 = a.cap
    sets = {}
    for t1, t2 in ((0.6, 0.6), (1.0, 0.6), (0.6, 1.5)):
        s = make_seeds_synthetic(a.n, 10, t1=t1, t2=t2, seed=0)
        sets[f"synthetic ({t1}, {t2})"] = (s.probs, s.labels)
    sets["CIFAR-10 resampled"] = cifar10_probs(a.n, 0)
    print(f"n = {a.n}, rows cap {cap0}")
    print(
        "| data | notion | time capped / all rows | h capped / all rows | "
        "L1 diff (SE) | sq L2 diff (SE) |"
    )
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name, (P, y) in sets.items():
        for notion in a.notions.split(","):
            ec, tc = _run(P, y, notion, cap0)
            eu, tu = _run(P, y, notion, None)
            se = _se(P, y, notion, eu.bandwidth, rng)
            d = {q: (ec.value(q) - eu.value(q)) / se[q] for q in Q}
            print(
                f"| {name} | {notion} | {tc:.2f} / {tu:.2f} s | {ec.bandwidth:.3g} / "
                f"{eu.bandwidth:.3g} | {d['ece_kde_l1']:+.3f} | {d['ce_l2']:+.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
