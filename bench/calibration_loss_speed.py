"""Time the cross-validated calibration loss with the affine and vector-scaling calibrators.

    python bench/calibration_loss_speed.py N K affine,vector [REPEATS]

A calibrated softmax (Gaussian logits of scale 2, labels drawn from the predictions,
seed 0); ``kdecal.scores.calibration_loss`` (log loss, 5 stratified folds, seed 0), the
value and the best wall time of REPEATS runs (default 2) per calibrator.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
from scipy.special import softmax

from kdecal import scores

n, K = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
P = softmax(2.0 * rng.normal(size=(n, K)), axis=1)
y = np.minimum((np.cumsum(P, 1) < rng.random(n)[:, None]).sum(1), K - 1)
warnings.simplefilter("ignore")
for cal in sys.argv[3].split(","):
    best = []
    for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 2):
        t = time.perf_counter()
        v = scores.calibration_loss(P, y, input="probs", relative=False, seed=0, calibrator=cal)
        best.append(time.perf_counter() - t)
    print(cal, repr(v), f"{min(best):.2f} s")
