"""
Bayes risk against the decision threshold
=========================================

For binary posteriors, the Bayes risk of deciding "class 1" above each threshold t,
with the costs that make t the Bayes decision (Ferrer & Ramos 2025, Fig. 4): the area
under the curve is the cross-entropy. Here the binary problem airplane (0) against
automobile (1), before and after temperature scaling fitted on half of the images.
"""

# %%
from __future__ import annotations

from importlib.resources import files

import numpy as np

import kdecal.plot as kp
from kdecal.recalibration import TemperatureScaling

with np.load(files("kdecal") / "data" / "cifar10_vgg16_keras_verifiedcal.npz") as d:
    probs, labels = d["probs"], d["labels"]

two = labels < 2
p1 = probs[two, 1] / probs[two, :2].sum(axis=1)  # P(y = 1) of the binary problem
y = labels[two]
fit, test = slice(0, len(y) // 2), slice(len(y) // 2, None)
ts = TemperatureScaling(input="probs").fit(p1[fit], y[fit])
print(f"temperature: {ts.temperature_:.3f}")

curves = kp.bayes_risk_curve(
    {"raw": p1[test], "temperature-scaled": ts.transform(p1[test])}, y[test]
)
