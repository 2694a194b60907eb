"""
Calibration-sharpness diagram
=============================

The diagram of Chidambaram & Ge (2024, Sec. 5, Fig. 1): a reliability curve with a band
whose height shows, at each confidence, how much of the expected Brier loss is a
sharpness gap rather than calibration error.
"""

# %%
from __future__ import annotations

from importlib.resources import files

import numpy as np

import kdecal.plot as kp

with np.load(files("kdecal") / "data" / "cifar10_vgg16_keras_verifiedcal.npz") as d:
    probs, labels = d["probs"], d["labels"]

cs = kp.calibration_sharpness_diagram(probs, labels, divergence="l2")
