"""Coverage of kdecal's bootstrap intervals (issue 26).

Data with an exactly known calibration error: f ~ Dirichlet(1, ..., 1) on K classes and
``y ~ Categorical(T(f))`` with ``T`` temperature scaling by ``t`` (``t = 1``: calibrated),
so ``E[y | f] = T(f)`` and the truth of the canonical L1 error is ``E ||T(f) - f||_1``
and of the squared L2 error ``E ||T(f) - f||^2`` (Monte Carlo, 400,000 points).

Each draw: a fresh sample of n rows, ``kdecal.estimate`` at its automatic bandwidth, and
``confidence_intervals(["ece_kde_l1", "ce_l2"], n_resamples=R)`` (95 %). Per cell: the
fraction of draws whose interval covers the truth, covers the estimator's expectation
(the mean of the estimates over the draws), and contains its own estimate; the mean
estimate; the sampling sd of the estimate against the mean bootstrap sd.

    python bench/bootstrap_coverage.py --K 2 4 10 --n 1000 5000 --draws 200 --R 200 \
        [--variability add|refit|none]

``--variability``: ``confidence_intervals(..., bandwidth_variability=...)``, how the
replicates carry the automatic bandwidth's own variability (default "add", the
library's default; "none" holds the bandwidth fixed, as the tables before 2026-11-27).
``python bench/bootstrap_selection.py`` compares the three on the same draws.

Prints one Markdown row per cell and quantity (bench/README.md, "Bootstrap intervals").
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import kdecal
from kdecal.datasets import temperature_scale

QUANTITIES = ("ece_kde_l1", "ce_l2")


def truths(K: int, t: float, n_mc: int = 400_000) -> dict[str, float]:
    rng = np.random.default_rng(12345)
    P = rng.dirichlet(np.ones(K), size=n_mc)
    D = temperature_scale(P, t) - P
    return {"ece_kde_l1": float(np.mean(np.abs(D).sum(1))), "ce_l2": float(np.mean((D**2).sum(1)))}


def draw(n: int, K: int, t: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), size=n)
    T = temperature_scale(P, t)
    y = np.minimum((rng.random(n)[:, None] > np.cumsum(T, axis=1)).sum(axis=1), K - 1)
    return P, y


def cell(
    n: int, K: int, t: float, draws: int, R: int, h: float | str = "auto", variability: str = "add"
) -> dict[str, dict[str, float]]:
    truth = truths(K, t)
    rows: dict[str, list[tuple[float, ...]]] = {q: [] for q in QUANTITIES}
    for d in range(draws):
        P, y = draw(n, K, t, 1000 * d + K)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kdecal.KdecalWarning)
            est = kdecal.estimate(P, y, bandwidth=h)
            cis = est.confidence_intervals(
                list(QUANTITIES), n_resamples=R, seed=d, bandwidth_variability=variability
            )
        for q, ci in cis.items():
            b = ci.bootstrap_distribution
            rows[q].append((ci.estimate, ci.low, ci.high, float(np.std(b))))
    out = {}
    for q, r in rows.items():
        est, lo, hi, bsd = np.array(r).T
        mu = float(est.mean())
        out[q] = {
            "truth": truth[q],
            "mean": mu,
            "cover_truth": float(np.mean((lo <= truth[q]) & (truth[q] <= hi))),
            "cover_mean": float(np.mean((lo <= mu) & (mu <= hi))),
            "contains": float(np.mean((lo <= est) & (est <= hi))),
            "sd": float(est.std()),
            "boot_sd": float(bsd.mean()),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, nargs="+", default=[2, 4, 10])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--t", type=float, nargs="+", default=[1.0, 2.0])
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--R", type=int, default=200)
    ap.add_argument(
        "--bandwidth", default="auto", help="'auto' (searched per draw) or a fixed float"
    )
    ap.add_argument("--variability", choices=("add", "refit", "none"), default="add")
    args = ap.parse_args()
    print(
        "| n | K | t | quantity | truth | mean estimate | covers truth | covers mean "
        "| contains estimate | sd / bootstrap sd | draws | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for K in args.K:
            for t in args.t:
                t0 = time.perf_counter()
                h = args.bandwidth if args.bandwidth == "auto" else float(args.bandwidth)
                res = cell(n, K, t, args.draws, args.R, h, args.variability)
                s = time.perf_counter() - t0
                for q, r in res.items():
                    print(
                        f"| {n} | {K} | {t:g} | {q} | {r['truth']:.4f} | {r['mean']:.4f} "
                        f"| {100 * r['cover_truth']:.1f} % | {100 * r['cover_mean']:.1f} % "
                        f"| {100 * r['contains']:.0f} % | {r['sd']:.4f} / {r['boot_sd']:.4f} "
                        f"| {args.draws} | {s:.0f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
