"""`kdecal evaluate` at ImageNet's size, and its stages alone.

    KDECAL_PROGRESS=0 /usr/bin/time -v python bench/evaluate_stages.py 50000 1000

The seeds' protocol, calibrated (t1 = 0.6, t2 = 1), n and K from the command line: the
top-label and class-wise estimates, the calibration loss with each calibrator, then the
default report (wall time, headline, calibration loss, notes). The process holds each
stage's result while the next runs, so its peak RSS bounds, not measures, the report's.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

import kdecal
from kdecal import scores
from kdecal.datasets import make_seeds_synthetic

n, K = int(sys.argv[1]), int(sys.argv[2])
t = time.perf_counter()
s = make_seeds_synthetic(n, K, t1=0.6, t2=1.0, seed=0)
P, y = np.asarray(s.probs), np.asarray(s.labels)
print(f"data {time.perf_counter() - t:.1f} s", flush=True)
for name, fn in [
    ("top_label estimate", lambda: kdecal.estimate(P, y, calibration="top_label")),
    ("classwise estimate", lambda: kdecal.estimate(P, y, calibration="classwise")),
    (
        "calibration_loss affine",
        lambda: scores.calibration_loss(P, y, input="probs", relative=False, seed=0),
    ),
    (
        "calibration_loss temperature",
        lambda: scores.calibration_loss(
            P, y, input="probs", relative=False, seed=0, calibrator="temperature"
        ),
    ),
]:
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = fn()
    print(
        f"{name}: {time.perf_counter() - t:.1f} s", r if isinstance(r, float) else "", flush=True
    )
t = time.perf_counter()
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    rep = kdecal.evaluate(P, y)
print(
    f"evaluate: {time.perf_counter() - t:.1f} s; {rep.calibration}; l1 {rep.ece_kde_l1:.4f}; cal loss {rep.calibration_loss}",
    flush=True,
)
print(rep.notes)
