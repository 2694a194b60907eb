"""Do the default estimates move after temperature scaling on real CIFAR predictions?

For each file: a seeded random half of the rows fits temperature scaling
(kdecal.recalibration.TemperatureScaling), the other half (n = 5,000) is evaluated raw
and scaled. Prints the test NLL and, for the default call (the residual-centred
estimator, bandwidth "auto", debias "ustat") and the previous default
(``estimator="plugin"``), the canonical L1 ECE^KDE, KL and squared L2 calibration
errors and the top-label L1 ECE^KDE, and the p-value of the calibration test
(canonical, ce_l2, 100 resamples) under the default.

Usage: python bench/temperature_scaling.py [file ...]   (names in ../shared/data/real)
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

import kdecal
from kdecal.recalibration import TemperatureScaling

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
FILES = [
    "cifar10_resnet56_chenyaofo.npz",
    "cifar10_vgg19_bn_chenyaofo.npz",
    "cifar100_resnet56_chenyaofo.npz",
    "cifar100_vgg19_bn_chenyaofo.npz",
]


def row(P, y):
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        for tag, kw in (("new", {}), ("old", {"estimator": "plugin"})):
            est = kdecal.estimate(P, y, **kw)
            top = kdecal.estimate(P, y, calibration="top_label", **kw)
            out[tag] = (
                est.ece_kde(1),
                est.calibration_error("kl"),
                est.calibration_error("l2"),
                top.ece_kde(1),
                est.bandwidth,
            )
            if tag == "new":
                out["p"] = est.calibration_test("ce_l2", n_resamples=100, seed=0).pvalue
    return out


def main():
    files = sys.argv[1:] or FILES
    print(
        "| file | system | test NLL | default: L1 / KL / sq L2 / top-label L1 (h) | p-value "
        "| previous default: L1 / KL / sq L2 / top-label L1 (h) |"
    )
    print("|---|---|---|---|---|---|")
    for f in files:
        with np.load(DATA / f) as d:
            z = d["logits"].astype(np.float64)
            y = d["labels"].astype(np.int64)
        idx = np.random.default_rng(0).permutation(len(y))
        fit, ev = idx[: len(y) // 2], idx[len(y) // 2 :]
        ts = TemperatureScaling().fit(z[fit], y[fit])
        for name, P in (
            ("raw", kdecal.softmax(z[ev])),
            (f"TS (T = {ts.temperature_:.2f})", ts.transform(z[ev])),
        ):
            nll = float(-np.mean(np.log(np.maximum(P[np.arange(len(ev)), y[ev]], 1e-300))))
            r = row(P, y[ev])
            a, b = r["new"], r["old"]
            print(
                f"| {f} | {name} | {nll:.4f} | {a[0]:.4f} / {a[1]:.4f} / {a[2]:.5f} / "
                f"{a[3]:.4f} (h = {a[4]:.3g}) | {r['p']:.3f} | {b[0]:.4f} / {b[1]:.4f} / "
                f"{b[2]:.5f} / {b[3]:.4f} (h = {b[4]:.3g}) |",
                flush=True,
            )


if __name__ == "__main__":
    main()
