"""
Reliability diagrams: binned and kernel
=======================================

A reliability diagram plots the accuracy E[1{y = top class} | confidence] against the
confidence. The binned version averages within 15 equal-width bins; the kernel version
is the leave-one-out Beta-kernel regression of the top-label problem, the curve whose
L1 distance from the diagonal is the top-label ECE^KDE. Both show the distribution of
the confidences beneath.
"""

# %%
from __future__ import annotations

from importlib.resources import files

import matplotlib.pyplot as plt
import numpy as np

import kdecal
import kdecal.plot as kp

with np.load(files("kdecal") / "data" / "cifar10_vgg16_keras_verifiedcal.npz") as d:
    probs, labels = d["probs"], d["labels"]  # (10000, 10) float32, (10000,) int32

# %%
# The binned diagram (15 bins, top-label) and the kernel curve at h = 0.02.
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.5))
binned = kp.reliability_diagram(probs, labels, ax=left)
kernel = kp.reliability_diagram(probs, labels, kind="kernel", bandwidth=0.02, ax=right)
print(f"binned top-label ECE (15 bins): {binned.ece:.4f}")
print(f"top-label ECE^KDE (L1, h = 0.02): {kernel.ece:.4f}")

# %%
# The same number from the estimator itself:
print(kdecal.ece_kde(probs, labels, p=1, calibration="top_label", bandwidth=0.02))
