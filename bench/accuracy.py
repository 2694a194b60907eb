"""Accuracy of the default estimates against the ground truth, and the calibration test.

The seeds' synthetic protocol (kdecal.datasets.make_seeds_synthetic: q uniform on the
simplex, c = T_t1(q), y ~ Categorical(c), f = T_t2(c), so E[y | f] = c), with the truth
from kdecal.datasets.true_calibration_error (10^6 Monte Carlo samples).

Part 1 (``accuracy``): for K in {2, 4, 10}, n in {1000, 5000, 20000} and (t1, t2) in
{(0.6, 0.6), (1.0, 0.6), (0.6, 1.5)} plus the calibrated (0.6, 1.0), (1.0, 1.0): the
mean over ``reps`` samples of

- the DEFAULT call (``kdecal.estimate(probs, labels)``: the residual-centred estimator,
  bandwidth "auto" = leave-one-out Brier risk of the regression for L1, half of it for
  squared L2 and KL, debias "ustat"), and
- the previous default (``estimator="plugin"``: the plug-in ratio at the Brier
  bandwidth, the log-risk one for KL, debias "ustat"),

for canonical L1 ECE^KDE, KL CE and squared L2 CE, and top-label / class-wise L1, KL and
squared L2. Prints the relative error (estimate / truth - 1) per cell, or, for the
calibrated cells (truth 0), the value itself.

Part 2 (``test``): type-I error of kdecal.calibration_test (statistic ce_l2, 100
resamples) over ``reps`` calibrated samples (n = 1000, K = 4, (t1, t2) = (0.6, 1.0)),
and its power against t2 = 0.9 and 0.8.

Part 3 (``corrections``): plain vs variance-corrected canonical KL and L1 (see
:func:`corrections`), the study behind leaving KL and L1 uncorrected.

Usage:
    python bench/accuracy.py accuracy [reps] [K1,K2] [n1,n2]
    python bench/accuracy.py test [reps]
    python bench/accuracy.py corrections [reps] [K1,K2] [n1,n2]
    python bench/accuracy.py summarize OUT1 [OUT2 ...]    (tables from saved output)
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np

import kdecal
from kdecal import datasets

CELLS = [(0.6, 0.6), (1.0, 0.6), (0.6, 1.5), (0.6, 1.0), (1.0, 1.0)]
QUANT = {  # name -> (notion, kwargs of true_calibration_error, quantity of an estimate)
    "canonical L1": ("canonical", {"p": 1}, "ece_kde_l1"),
    "canonical KL": ("canonical", {"divergence": "kl"}, "ce_kl"),
    "canonical sq L2": ("canonical", {"divergence": "l2"}, "ce_l2"),
    "top-label L1": ("top_label", {"p": 1}, "ece_kde_l1"),
    "top-label KL": ("top_label", {"divergence": "kl"}, "ce_kl"),
    "top-label sq L2": ("top_label", {"divergence": "l2"}, "ce_l2"),
    "class-wise L1": ("classwise", {"p": 1}, "ece_kde_l1"),
    "class-wise KL": ("classwise", {"divergence": "kl"}, "ce_kl"),
    "class-wise sq L2": ("classwise", {"divergence": "l2"}, "ce_l2"),
}
NOTIONS = ("canonical", "top_label", "classwise")


def truth(K, t1, t2):
    out = {}
    for name, (notion, kw, _) in QUANT.items():
        if t2 == 1.0:
            out[name] = 0.0
            continue
        out[name] = float(
            datasets.true_calibration_error(
                K, t1=t1, t2=t2, calibration=notion, n_mc=10**6, seed=0, **kw
            )
        )
    return out


def estimates(probs, labels, **kw):
    vals = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdecal.KdecalWarning)
        for notion in NOTIONS:
            est = kdecal.estimate(probs, labels, calibration=notion, **kw)
            for name, (nt, _, q) in QUANT.items():
                if nt == notion:
                    vals[name] = est.value(q)
                    vals[f"h {notion}"] = est.bandwidth
    return vals


def accuracy(reps, Ks, ns):
    rows = []
    t0 = time.perf_counter()
    for K in Ks:
        for t1, t2 in CELLS:
            tr = truth(K, t1, t2)
            for n in ns:
                r_eff = reps if n < 20000 else max(1, reps // 2)
                new, old = [], []
                for r in range(r_eff):
                    s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=100 * r + K)
                    new.append(estimates(s.probs, s.labels))
                    old.append(estimates(s.probs, s.labels, estimator="plugin"))
                row = {"K": K, "n": n, "t1": t1, "t2": t2, "reps": r_eff, "truth": tr}
                for tag, vals in (("default", new), ("previous", old)):
                    row[tag] = {k: float(np.mean([v[k] for v in vals])) for k in vals[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
                print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print_tables(rows)


def print_tables(rows):
    print()
    print("| K | n | (t1, t2) | quantity | truth | default | previous default (plug-in) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        for name in QUANT:
            tr = row["truth"][name]
            a, b = row["default"][name], row[_old(row)][name]
            if tr == 0.0:
                ca, cb = f"{a:.4f}", f"{b:.4f}"
            else:
                ca, cb = f"{100 * (a / tr - 1):+.0f} %", f"{100 * (b / tr - 1):+.0f} %"
            print(
                f"| {row['K']} | {row['n']} | ({row['t1']}, {row['t2']}) | {name} | "
                f"{tr:.4f} | {ca} | {cb} |"
            )


def test(reps):
    out = {}
    for t2 in (1.0, 0.9, 0.8):
        pv = []
        t0 = time.perf_counter()
        for r in range(reps):
            s = datasets.make_seeds_synthetic(1000, 4, t1=0.6, t2=t2, seed=7919 * r + 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", kdecal.KdecalWarning)
                res = kdecal.calibration_test(s.probs, s.labels, n_resamples=100, seed=r)
            pv.append(res.pvalue)
        pv = np.asarray(pv)
        out[t2] = {
            "reps": reps,
            "rejection rate at 5 %": float(np.mean(pv <= 0.05)),
            "rejection rate at 1 %": float(np.mean(pv <= 0.01)),
            "seconds": time.perf_counter() - t0,
        }
        print(f"t2 = {t2}: {json.dumps(out[t2])}", flush=True)
    return out


def corrections(reps, Ks, ns):
    """Plain vs variance-corrected canonical KL and L1 at the default bandwidth.

    With w_i the LOO kernel weights of a query, S_c = sum w_i 1[y_i = c], Q_c = sum
    w_i^2 1[y_i = c] (S0, Q0 their sums), the variance of the ratio E_c = S_c / S0 given
    the predictions is estimated by V_c = (Q_c (1 - 2 E_c) + E_c^2 Q0) / S0^2 (the
    delta method with the empirical residuals). Candidates: KL - 1/2 sum_c V_c / E_c
    (second-order bias of KL(E_hat || f), a Miller-Madow-like term) and
    sum_c sqrt(max((E_c - f_c)^2 - V_c, 0)) for L1 (squared-bias deconvolution).
    """
    from scipy.special import xlogy

    print(
        "| K | n | (t1, t2) | KL plain | KL corrected | L1 plain | L1 corrected | n_eff (L1 h) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for K in Ks:
        for t1, t2 in CELLS[:3]:
            tr = truth(K, t1, t2)
            for n in ns:
                acc = []
                for r in range(reps):
                    s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=100 * r + K)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", kdecal.KdecalWarning)
                        both = kdecal.estimate(s.probs, s.labels)
                    row = []
                    # KL at the log-risk bandwidth, L1 at the Brier one (the defaults)
                    for est in (both._est_kl, both._est):
                        S, Q, f = est.S[0], est.Q[0], est.problem.p[0]
                        S0, Q0 = S.sum(-1, keepdims=True), Q.sum(-1, keepdims=True)
                        E = S / S0
                        V = (Q * (1 - 2 * E) + E**2 * Q0) / S0**2
                        if not row:
                            kl = np.mean(np.sum(xlogy(E, E) - xlogy(E, f), -1))
                            corr = np.where(E > 0, V / np.maximum(E, 1e-300), 0)
                            row += [kl, kl - np.mean(0.5 * np.sum(corr, -1))]
                        else:
                            row.append(np.mean(np.sum(np.abs(E - f), -1)))
                            dev = np.sqrt(np.maximum((E - f) ** 2 - V, 0))
                            row.append(np.mean(np.sum(dev, -1)))
                            row.append(np.mean(S0[:, 0] ** 2 / Q0[:, 0]))
                    acc.append(row)
                a = np.mean(acc, axis=0)
                rel = lambda v, t: f"{100 * (v / t - 1):+.0f} %"
                print(
                    f"| {K} | {n} | ({t1}, {t2}) | {rel(a[0], tr['canonical KL'])} | "
                    f"{rel(a[1], tr['canonical KL'])} | {rel(a[2], tr['canonical L1'])} | "
                    f"{rel(a[3], tr['canonical L1'])} | {a[4]:.0f} |",
                    flush=True,
                )


def _old(row):
    """Key of the comparison column (older output files: the LOO-MLE plug-in)."""
    return "previous" if "previous" in row else "loo-mle"


def summarize(paths):
    """Compact tables from the JSON lines printed by ``accuracy``.

    Per quantity, K and n: the range (min ... max) of the relative error over the three
    miscalibrated cells, default vs previous default, and the targets at n >= 5000; then
    the values reported for the two calibrated cells (truth 0).
    """
    rows = []
    for p in paths:
        with open(p) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{")]
    Ks = sorted({r["K"] for r in rows})
    ns = sorted({r["n"] for r in rows})
    target = {
        "canonical L1": 30,
        "canonical sq L2": 30,
        "canonical KL": "30 (K <= 4), 100 (K = 10)",
    }
    print(
        "Relative error (estimate / truth - 1), range over (t1, t2) = (0.6, 0.6), "
        "(1.0, 0.6), (0.6, 1.5); default | previous default:"
    )
    print()
    head = " | ".join(f"K = {K}, n = {n}" for K in Ks for n in ns)
    print(f"| quantity (target at n >= 5000) | {head} |")
    print("|---" * (1 + len(Ks) * len(ns)) + "|")
    worse = []
    for q in QUANT:
        cells = []
        for K in Ks:
            for n in ns:
                sel = [r for r in rows if r["K"] == K and r["n"] == n and r["t2"] != 1.0]
                if not sel:
                    cells.append("")
                    continue
                e_new = [100 * (r["default"][q] / r["truth"][q] - 1) for r in sel]
                e_old = [100 * (r[_old(r)][q] / r["truth"][q] - 1) for r in sel]
                for r, a, b in zip(sel, e_new, e_old):
                    if abs(a) > abs(b) + 1:
                        worse.append(
                            f"{q}, K = {K}, n = {n}, ({r['t1']}, {r['t2']}): "
                            f"{a:+.0f} % vs {b:+.0f} %"
                        )
                cells.append(
                    f"{min(e_new):+.0f}…{max(e_new):+.0f} \\| {min(e_old):+.0f}…{max(e_old):+.0f}"
                )
        print(f"| {q} (±{target.get(q, 25)} %) | " + " | ".join(cells) + " |")
    print()
    print(
        "Calibrated models (truth 0): value reported, default | previous default, mean "
        "over the two cells (0.6, 1.0) and (1.0, 1.0):"
    )
    print()
    print(f"| quantity | {head} |")
    print("|---" * (1 + len(Ks) * len(ns)) + "|")
    for q in QUANT:
        cells = []
        for K in Ks:
            for n in ns:
                sel = [r for r in rows if r["K"] == K and r["n"] == n and r["t2"] == 1.0]
                if not sel:
                    cells.append("")
                    continue
                a = np.mean([r["default"][q] for r in sel])
                b = np.mean([r[_old(r)][q] for r in sel])
                cells.append(f"{a:.4f} \\| {b:.4f}")
        print(f"| {q} | " + " | ".join(cells) + " |")
    print()
    print(
        "Cells where the default is further from the truth than the previous default "
        "(by more than 1 point):"
    )
    for w in worse:
        print(f"- {w}")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "accuracy"
    if what == "summarize":
        summarize(sys.argv[2:])
        return
    if what == "corrections":
        reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
        Ks = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [4, 10]
        ns = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else [5000]
        corrections(reps, Ks, ns)
        return
    if what == "test":
        test(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
        return
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    Ks = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [2, 4, 10]
    ns = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else [1000, 5000, 20000]
    accuracy(reps, Ks, ns)


if __name__ == "__main__":
    main()
