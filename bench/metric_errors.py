"""Each top-label estimator's error against the truth on the synthetic protocol (issue 28).

The figure and table of docs/guide/metrics.md ("Which calibration metric?"). The
protocol is that of bench/accuracy.py (:func:`kdecal.datasets.make_seeds_synthetic`:
q uniform on the simplex, c = T_t1(q), y ~ Categorical(c), f = T_t2(c), so
E[y | f] = c) with its cells (t1, t2) in {(0.6, 0.6), (1.0, 0.6), (0.6, 1.5)}
(miscalibrated) and {(0.6, 1.0), (1.0, 1.0)} (calibrated: truth 0), and the truth of
:func:`kdecal.datasets.true_calibration_error` (10^6 Monte Carlo samples, top-label).

Each estimator is compared to the truth of the quantity it estimates:

- L1 top-label ECE ``E|E[y = argmax f | max f] - max f|``: ECE^KDE L1 top-label at the
  "auto" bandwidth (Popordanoska et al. 2022), the binned ECE with 15 equal-width bins
  (Guo et al. 2017), the sweep ECE with equal-width bins and p = 1 (Roelofs et al.
  2022), and the smooth ECE (Blasiok & Nakkiran 2024). The smooth ECE is a different
  population quantity in general; on this protocol every top-label residual of a
  miscalibrated cell has the same sign (f_max >= c_max for t2 < 1, <= for t2 > 1), so
  its population value equals the L1 ECE (checked: 0.157696 both, K = 10, (0.6, 0.6),
  2 x 10^5 noise-free rows), and it is 0 for a calibrated model.
- L2 top-label ECE ``(E (E[...] - max f)^2)^(1/2)``: ECE^KDE L2 top-label, the debiased
  binned L2 ECE with 15 bins (Kumar, Liang & Ma 2019; its target is the binned
  population error, at most the L2 ECE), and the sweep ECE with equal-mass bins and
  p = 2 (the form Roelofs et al. recommend).

For each K in {4, 10}, n in {1000, 5000, 20000} and ``seeds`` samples per cell (fewer at
n = 20000), the error is ``estimate - truth``; the summaries are the mean absolute error
and the mean signed error (bias) over the cells and samples, separately for the
miscalibrated and the calibrated cells.

Usage::

    python bench/metric_errors.py [seeds]             (default 5; about 2 minutes)

Writes docs/figures/metric_errors.png, bench/metric_errors.json and
bench/metric_errors.md (the table of docs/guide/metrics.md).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import kdecal
from kdecal import binned, datasets

ROOT = Path(__file__).resolve().parent.parent
FIGURE = ROOT / "docs" / "figures" / "metric_errors.png"
JSON_OUT = ROOT / "bench" / "metric_errors.json"
MD_OUT = ROOT / "bench" / "metric_errors.md"

KS = (4, 10)
NS = (1000, 5000, 20000)
MISCALIBRATED = ((0.6, 0.6), (1.0, 0.6), (0.6, 1.5))
CALIBRATED = ((0.6, 1.0), (1.0, 1.0))

#: estimator -> the truth it is compared to: the L1 or the L2 top-label ECE;
#: ECE^KDE's two entries come from one estimate (see ``_estimates``)
ESTIMATORS = {
    "ECE^KDE L1 (auto h)": "L1",
    "binned ECE, 15 bins": "L1",
    "sweep ECE (equal width, L1)": "L1",
    "smooth ECE": "L1",
    "ECE^KDE L2 (auto h)": "L2",
    "debiased binned L2, 15 bins": "L2",
    "sweep ECE (equal mass, L2)": "L2",
}


def _estimates(P: np.ndarray, y: np.ndarray) -> dict[str, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        est = kdecal.estimate(P, y, calibration="top_label", progress=False)
        return {
            "ECE^KDE L1 (auto h)": est.value("ece_kde_l1"),
            "binned ECE, 15 bins": binned.ece(P, y, n_bins=15),
            "sweep ECE (equal width, L1)": binned.ece(P, y, n_bins="sweep"),
            "smooth ECE": float(kdecal.smooth_ece(P, y)),
            "ECE^KDE L2 (auto h)": est.value("ece_kde_l2"),
            "debiased binned L2, 15 bins": binned.ece(P, y, n_bins=15, p=2, debias=True),
            "sweep ECE (equal mass, L2)": binned.ece(
                P, y, n_bins="sweep", binning="quantile", p=2
            ),
        }


def _truth(K: int, t1: float, t2: float) -> dict[str, float]:
    if t2 == 1.0:
        return {"L1": 0.0, "L2": 0.0}
    return {
        f"L{p}": float(
            datasets.true_calibration_error(
                K, t1=t1, t2=t2, calibration="top_label", p=p, n_mc=10**6, seed=0
            )
        )
        for p in (1, 2)
    }


def run(seeds: int) -> dict:
    t0 = time.perf_counter()
    samples = []
    for K in KS:
        for t1, t2 in MISCALIBRATED + CALIBRATED:
            truth = _truth(K, t1, t2)
            for n in NS:
                for r in range(seeds if n < 20000 else max(1, (seeds + 1) // 2)):
                    s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=1000 * r + K)
                    est = _estimates(np.asarray(s.probs), np.asarray(s.labels))
                    samples.append(
                        {
                            "K": K,
                            "n": n,
                            "t1": t1,
                            "t2": t2,
                            "seed": 1000 * r + K,
                            "truth": truth,
                            "estimates": est,
                        }
                    )
            print(
                f"# K = {K}, ({t1}, {t2}): truth {truth}, {time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return {"samples": samples, "summary": summarize(samples), "seconds": time.perf_counter() - t0}


def summarize(samples: list[dict]) -> list[dict]:
    """Mean absolute and signed error per K, n, estimator and kind of cell."""
    out = []
    for K in KS:
        for n in NS:
            for kind, cells in (("miscalibrated", MISCALIBRATED), ("calibrated", CALIBRATED)):
                sel = [
                    s
                    for s in samples
                    if s["K"] == K and s["n"] == n and (s["t1"], s["t2"]) in cells
                ]
                for name, truth in ESTIMATORS.items():
                    err = np.array([s["estimates"][name] - s["truth"][truth] for s in sel])
                    out.append(
                        {
                            "K": K,
                            "n": n,
                            "cells": kind,
                            "estimator": name,
                            "truth": truth,
                            "samples": len(sel),
                            "mean_abs_error": float(np.mean(np.abs(err))),
                            "mean_error": float(np.mean(err)),
                        }
                    )
    return out


def markdown(summary: list[dict]) -> str:
    lines = []
    for kind in ("miscalibrated", "calibrated"):
        lines.append(
            f"Mean absolute error (mean signed error), {kind} cells "
            + (
                "(0.6, 0.6), (1.0, 0.6), (0.6, 1.5)"
                if kind == "miscalibrated"
                else "(0.6, 1.0), (1.0, 1.0): truth 0"
            )
            + ":"
        )
        lines.append("")
        head = " | ".join(f"K = {K}, n = {n:,}" for K in KS for n in NS)
        lines.append(f"| estimator | truth | {head} |")
        lines.append("|---|---|" + "---|" * (len(KS) * len(NS)))
        for name, truth in ESTIMATORS.items():
            cells = []
            for K in KS:
                for n in NS:
                    row = next(
                        r
                        for r in summary
                        if r["K"] == K
                        and r["n"] == n
                        and r["cells"] == kind
                        and r["estimator"] == name
                    )
                    cells.append(f"{row['mean_abs_error']:.4f} ({row['mean_error']:+.4f})")
            lines.append(f"| {name} | {truth} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def figure(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True, constrained_layout=True)
    markers = "os^Dvxp"
    for i, K in enumerate(KS):
        for j, kind in enumerate(("miscalibrated", "calibrated")):
            ax = axes[i, j]
            for m, (name, truth) in zip(markers, ESTIMATORS.items()):
                ys = [
                    next(
                        r["mean_abs_error"]
                        for r in summary
                        if r["K"] == K
                        and r["n"] == n
                        and r["cells"] == kind
                        and r["estimator"] == name
                    )
                    for n in NS
                ]
                ax.plot(
                    NS,
                    ys,
                    marker=m,
                    linestyle="-" if truth == "L1" else "--",
                    label=f"{name} (vs {truth})",
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(NS, [f"{n:,}" for n in NS])
            ax.set_title(f"K = {K}, {kind} cells" + (" (truth 0)" if kind == "calibrated" else ""))
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("mean |estimate - truth|")
            if i == 1:
                ax.set_xlabel("n")
    axes[0, 1].legend(fontsize=8, loc="upper right")
    fig.suptitle(
        "Top-label estimators against the truth (bench/metric_errors.py; solid: L1 "
        "top-label ECE, dashed: L2)",
        fontsize=11,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    result = run(seeds)
    JSON_OUT.write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result["summary"])
    MD_OUT.write_text(md)
    figure(result["summary"], FIGURE)
    print(md)
    print(f"# {result['seconds']:.0f} s; wrote {FIGURE}, {JSON_OUT}, {MD_OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
