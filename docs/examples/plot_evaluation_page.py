"""
The one-page evaluation summary
===============================

:func:`kdecal.plot.evaluation_page` draws what ``kdecal evaluate FILE --plot page.png``
writes: reliability diagrams (binned, top-label kernel, canonical kernel), the
calibration-sharpness diagram and the report of :func:`kdecal.evaluate`. To keep this
example fast it evaluates a random subset of 2,000 of the 10,000 test images with 20
bootstrap and consistency resamples (the command line uses all rows and 100).
"""

# %%
from __future__ import annotations

from importlib.resources import files

import numpy as np

import kdecal
import kdecal.plot as kp

with np.load(files("kdecal") / "data" / "cifar10_vgg16_keras_verifiedcal.npz") as d:
    probs, labels = d["probs"], d["labels"]

rows = np.random.default_rng(0).choice(len(labels), size=2000, replace=False)
report = kdecal.evaluate(probs[rows], labels[rows], n_resamples=20, seed=0)
print(report)

# %%
# The page is a figure outside pyplot; ``page.savefig("page.png")`` writes it.
page = kp.evaluation_page(probs[rows], labels[rows], report=report)
