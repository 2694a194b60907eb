"""The class-wise bandwidth search on a random subset of the classes, against all of them.

    KDECAL_PROGRESS=0 python bench/classwise_subset_search.py N K M

A measurement for a possible speed-up at many classes (not adopted): the seeds'
protocol (calibrated and miscalibrated cells, seed 0), the automatic class-wise
bandwidth (Brier criterion) searched on all K one-vs-rest problems and on M classes
drawn at random (3 draws), with each search's wall time.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

from kdecal._engine import binary as B
from kdecal._estimation import problem as _problem
from kdecal._estimation import search as _search
from kdecal._validation import check_probs
from kdecal.datasets import make_seeds_synthetic

n, K, m = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
warnings.simplefilter("ignore")
for t1, t2 in ((0.6, 1.0), (1.0, 0.6)):
    s = make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=0)
    P = check_probs(np.asarray(s.probs))
    y = np.asarray(s.labels)
    prob = _problem.make_problem(P, y, "classwise", "cpp")
    t = time.perf_counter()
    with B.reuse_plans():
        full, _ = _search.search_bandwidth(prob, "brier", 0, "cpp", False)
    tf = time.perf_counter() - t
    out = [f"cell ({t1}, {t2}) full h {full.bandwidth:.4g} ({tf:.1f} s)"]
    for seed in range(3):
        idx = np.sort(np.random.default_rng(seed).choice(K, m, replace=False))
        sub = _problem.Problem(prob.calibration, prob.p[idx], prob.labels[idx], prob.dtype)
        t = time.perf_counter()
        with B.reuse_plans():
            rec, _ = _search.search_bandwidth(sub, "brier", 0, "cpp", False)
        out.append(f"subset{seed} h {rec.bandwidth:.4g} ({time.perf_counter() - t:.1f} s)")
    print("; ".join(out), flush=True)
