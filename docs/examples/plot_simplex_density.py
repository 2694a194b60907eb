"""
Densities on the simplex
========================

For K = 3 the predictions live on a triangle. Left: the simplex-binned histogram behind
the binned canonical ECE (equal-area triangular cells); right: the Dirichlet kernel
density estimate that the canonical ECE^KDE is built on. The example takes the test
images of the first three classes and renormalises their first three probabilities.
"""

# %%
from __future__ import annotations

from importlib.resources import files

import numpy as np

import kdecal.plot as kp

with np.load(files("kdecal") / "data" / "cifar10_vgg16_keras_verifiedcal.npz") as d:
    probs, labels = d["probs"], d["labels"]

three = labels < 3
p3 = probs[three, :3] / probs[three, :3].sum(axis=1, keepdims=True)
sd = kp.simplex_density(p3, labels[three], class_names=["airplane", "automobile", "bird"])
