"""Dump kdecal's public numbers to JSON, and compare two dumps (restructurings).

A restructuring must leave every public number bit-identical (or within 1e-14 where a
summation order changes). This script computes, on the bundled example (first 1,500
rows) and on synthetic K = 3 (float64 and float32) and binary sets: every quantity of
``kdecal.estimate`` for each notion and estimator, its bandwidths, a bootstrap interval
and a calibration test, the public functions at a fixed bandwidth, and one
``kdecal.evaluate`` report (20 resamples).

Usage::

    python bench/public_numbers.py dump OUT.json        # on each commit
    python bench/public_numbers.py compare A.json B.json
"""

from __future__ import annotations

import json
import math
import sys
import warnings

import numpy as np


def dump(path: str) -> None:
    import kdecal
    from kdecal._io import bundled_example_path, load_predictions

    warnings.simplefilter("ignore")
    out: dict[str, object] = {}
    probs, labels, *_ = load_predictions(bundled_example_path())
    probs, labels = np.asarray(probs)[:1500], np.asarray(labels)[:1500]
    rng = np.random.default_rng(0)
    P3 = rng.dirichlet(np.ones(3), 600)
    y3 = np.array([rng.choice(3, p=p) for p in P3])
    b = rng.uniform(0.05, 0.95, 500)
    yb = (rng.uniform(size=500) < b).astype(int)
    sets = {"bundled": (probs, labels), "k3": (P3, y3), "bin": (b, yb)}
    sets["f32"] = (P3.astype(np.float32), y3)
    for name, (P, y) in sets.items():
        for cal in ["canonical", "classwise", "top_label"]:
            if name == "bin" and cal != "canonical":
                continue
            for estimator in ["residual", "plugin"]:
                e = kdecal.estimate(P, y, calibration=cal, estimator=estimator)
                row: dict[str, object] = {q: e.value(q) for q in kdecal.QUANTITIES}
                row["bw"] = [e.bandwidth, e.bandwidth_l2, e.bandwidth_kl]
                row["ce_kl_ref"] = e.calibration_error("kl", "refinement")
                row["ci"] = list(e.confidence_interval("ce_l2", n_resamples=20, seed=1))
                row["test"] = e.calibration_test("ce_l2", n_resamples=20, seed=1).pvalue
                kw = {"calibration": cal, "estimator": estimator, "bandwidth": 0.1}
                row["fn_ce"] = kdecal.calibration_error(P, y, divergence="l2", **kw)
                row["fn_ref"] = kdecal.refinement(P, y, divergence="kl", **kw)
                row["fn_sh"] = kdecal.sharpness(P, y, divergence="kl", **kw)
                row["fn_ece"] = kdecal.ece_kde(P, y, **kw)
                out[f"{name}/{cal}/{estimator}"] = row
    report = kdecal.evaluate(probs, labels, n_resamples=20)
    out["evaluate"] = {k: v for k, v in report.to_dict().items() if k != "wall_time_s"}
    test = kdecal.calibration_test(
        P3, y3, statistic="ce_kl", estimator="plugin", n_resamples=10, seed=0
    )
    out["ctest"] = test.statistic
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True, default=str)
    print(f"dumped {len(out)} groups to {path}")


def _walk(a: object, b: object, key: str, diffs: list[tuple[str, float]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            _walk(a.get(k), b.get(k), f"{key}/{k}", diffs)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{key}[{i}]", diffs)
    elif isinstance(a, float) and isinstance(b, float):
        if a != b and not (math.isnan(a) and math.isnan(b)):
            diffs.append((key, abs(a - b) / max(abs(a), abs(b), 1e-300)))
    elif a != b:
        diffs.append((key, math.inf))


def compare(path_a: str, path_b: str) -> int:
    with open(path_a) as fa, open(path_b) as fb:
        a, b = json.load(fa), json.load(fb)
    diffs: list[tuple[str, float]] = []
    _walk(a, b, "", diffs)
    if not diffs:
        print("bit-identical")
        return 0
    for key, rel in diffs:
        print(f"{key}: relative difference {rel:.2e}")
    worst = max(rel for _, rel in diffs)
    print(f"{len(diffs)} values differ; largest relative difference {worst:.2e}")
    return 0 if worst <= 1e-14 else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"]:
        dump(sys.argv[2])
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
