"""Does the null replicates' variance fix the calibrated squared-L2 over-coverage? (issue 26)

Per draw of the protocol of ``bench/bootstrap_coverage.py`` (canonical, the default
residual estimator and "add" intervals): the squared L2 estimate, its bootstrap
replicates and the consistency (null) replicates of the calibration test. ``summarize``
compares the coverage of the estimator's expectation (0 for a calibrated model, the
U-statistic being unbiased there; else the mean estimate) by the plain interval and by
intervals whose replicate deviations are rescaled to the variance
``max(V_boot - c V_null, V_null)`` (the U-statistic theory: the bootstrap world is not
calibrated, so its replicates carry a linear term of about twice the null variance).

    KDECAL_PROGRESS=0 python bench/bootstrap_null_variance.py run K n t draws OUT.npz
    python bench/bootstrap_null_variance.py summarize OUT*.npz
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import kdecal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bootstrap_coverage import draw, truths

R = 200


def run(args: argparse.Namespace) -> None:
    est, boot, null = [], [], []
    t0 = time.perf_counter()
    for d in range(args.draws):
        P, y = draw(args.n, args.K, args.t, 1000 * d + args.K)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kdecal.KdecalWarning)
            e = kdecal.estimate(P, y)
            ci = e.confidence_intervals(["ce_l2"], n_resamples=R, seed=d)["ce_l2"]
            te = e.calibration_tests(["ce_l2"], n_resamples=R, seed=d + 7)["ce_l2"]
        est.append(ci.estimate)
        boot.append(ci.bootstrap_distribution)
        null.append(te.null_distribution)
    np.savez(
        args.out,
        K=args.K,
        n=args.n,
        t=args.t,
        est=np.array(est),
        boot=np.array(boot),
        null=np.array(null),
        truth=truths(args.K, args.t)["ce_l2"],
        seconds=time.perf_counter() - t0,
    )
    print(f"wrote {args.out}")


def summarize(args: argparse.Namespace) -> None:
    print("| cell | draws | V_boot / V | V_null / V | plain | c = 1 | c = 1.5 | c = 2 |")
    print("|---|---|---|---|---|---|---|---|")
    for f in args.files:
        d = np.load(f)
        est, boot, null, truth = d["est"], d["boot"], d["null"], float(d["truth"])
        target = est.mean() if truth > 1e-12 else 0.0
        vs, vb, vn = est.var(), boot.var(axis=1), null.var(axis=1)
        cells = []
        for c in (None, 1.0, 1.5, 2.0):
            cov = 0
            for i in range(len(est)):
                dev = boot[i] - np.median(boot[i])
                if c is not None:
                    dev = dev * np.sqrt(max(vb[i] - c * vn[i], vn[i]) / vb[i])
                lo, hi = np.quantile(est[i] + dev, [0.025, 0.975])
                cov += bool(lo <= target <= hi)
            cells.append(f"{100.0 * cov / len(est):.1f} %")
        name = f"K = {int(d['K'])}, n = {int(d['n'])}, t = {float(d['t']):g}"
        print(
            f"| {name} | {len(est)} | {vb.mean() / vs:.2f} | {vn.mean() / vs:.2f} | "
            + " | ".join(cells)
            + " |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("K", type=int)
    r.add_argument("n", type=int)
    r.add_argument("t", type=float)
    r.add_argument("draws", type=int)
    r.add_argument("out")
    s = sub.add_parser("summarize")
    s.add_argument("files", nargs="+")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else summarize(args)


if __name__ == "__main__":
    main()
