"""The calibration loss with affine calibration and with temperature scaling at many classes.

    python bench/calibration_loss_many_classes.py N K

Softmax outputs of Gaussian logits (scale 3, seed 0) with labels drawn from them (a
calibrated model), and the same predictions made over-confident (temperature 0.7): the
calibration loss of :func:`kdecal.scores.calibration_loss` (5-fold stratified
cross-validation, absolute, nats) with each calibrator, and its wall time. Used to set
``kdecal._evaluate.CAL_LOSS_AFFINE_MIN_ROWS_PER_CLASS``.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

from kdecal import scores


def main() -> None:
    n, K = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(0)
    z = rng.normal(size=(n, K)) * 3.0
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (rng.random(n)[:, None] > p.cumsum(axis=1)).sum(axis=1).clip(0, K - 1)
    q = np.exp(np.log(p) / 0.7)
    q /= q.sum(axis=1, keepdims=True)
    for name, P in (("calibrated", p), ("over-confident", q)):
        for cal in ("temperature", "affine"):
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                v = scores.calibration_loss(
                    P, y, input="probs", relative=False, seed=0, calibrator=cal
                )
            sec = time.perf_counter() - t
            print(f"n={n} K={K} {name} {cal}: {v:.5f} nats, {sec:.1f} s", flush=True)


if __name__ == "__main__":
    main()
