"""Study of the residual-centred kernel estimators (issue 25), by a float64 brute force.

For the seeds' synthetic protocol (``kdecal.datasets.make_seeds_synthetic``), every
(K, n, cell, seed) and a set of bandwidths, the script forms the leave-one-out kernel
sums by materialising the kernel in row blocks (independent of the engine) and compares

- the plug-in of today (``E = S / S0``), and
- the residual-centred estimators (``E = f + (S - A) / S0``, ``A = sum w f_i``; the
  squared L2 error as the normalised U-statistic of the residuals),

with the truth of ``kdecal.datasets.true_calibration_error`` (10^6 Monte Carlo draws).
Bandwidths: multiples of the plug-in's automatic Brier bandwidth (``kdecal.estimate``)
and the minimiser of the residual estimator's own leave-one-out Brier risk over a grid.

Usage:
    python bench/residual_study.py K1,K2 n1,n2 seeds [notion]
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
from scipy.special import gammaln

import kdecal
from kdecal import datasets

CELLS = [(0.6, 0.6), (1.0, 0.6), (0.6, 1.5), (0.9, 0.6), (0.6, 1.0), (1.0, 1.0)]
GRID = np.logspace(-3.5, 0.5, 17)


def sums(P, Y, u, h, block=512):
    """Leave-one-out sums S (n, K), A (n, K), U (n,), Q0 (n,) at bandwidth h."""
    n, K = P.shape
    logq = np.log(P)
    bias = -gammaln(P / h + 1.0).sum(axis=1)
    S = np.empty((n, Y.shape[1]))
    A = np.empty((n, K))
    U = np.empty(n)
    Q0 = np.empty(n)
    for j0 in range(0, n, block):
        j1 = min(n, j0 + block)
        L = bias[None, :] + (logq[j0:j1] @ P.T) / h
        L[np.arange(j1 - j0), np.arange(j0, j1)] = -np.inf
        w = np.exp(L - L.max(axis=1, keepdims=True))
        S[j0:j1] = w @ Y
        A[j0:j1] = w @ P
        w2 = w * w
        U[j0:j1] = w2 @ u
        Q0[j0:j1] = w2.sum(axis=1)
    return S, A, U, Q0


def kl_rows(E, f):
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(E > 0, E * np.log(E / f), 0.0)
    return t.sum(axis=1)


def project(f, g, floor=1e-3):
    """f + t g with the largest t <= 1 keeping every coordinate >= floor * f."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lim = np.where(g < 0, (1.0 - floor) * f / -g, np.inf)
    t = np.minimum(1.0, lim.min(axis=1, keepdims=True))
    return f + t * g, float(np.mean(t < 1.0))


def estimators(P, Y, S, A, U, Q0, coords):
    """Plug-in and residual estimates at one bandwidth."""
    S0 = S.sum(axis=1, keepdims=True)
    E = S / S0
    g = (S - A) / S0
    f = P
    out = {}
    out["plug L1"] = np.mean(np.abs(E - f)[:, coords].sum(axis=1))
    out["res L1"] = np.mean(np.abs(g)[:, coords].sum(axis=1))
    num = ((S - A)[:, coords] ** 2).sum(axis=1) - U
    den = S0[:, 0] ** 2 - Q0
    ok = den > 1e-12 * S0[:, 0] ** 2
    out["res sqL2"] = np.mean(np.where(ok, num / np.where(ok, den, 1.0), 0.0))
    out["plug KL"] = np.mean(kl_rows(np.clip(E, 1e-300, None), f))
    Ep, frac = project(f, g)
    out["res KL"] = np.mean(kl_rows(Ep, f))
    out["res KL clipped"] = frac
    out["plug brier"] = np.mean(((Y - E) ** 2).sum(axis=1))
    out["res brier"] = np.mean(((Y - f - g) ** 2).sum(axis=1))
    return out


def problem(probs, labels, notion):
    if notion == "canonical":
        K = probs.shape[1]
        return [(probs, np.eye(K)[labels])]
    if notion == "top_label":
        x = probs.max(axis=1)
        y = (probs.argmax(axis=1) == labels).astype(float)
        return [(np.stack([1 - x, x], 1), np.stack([1 - y, y], 1))]
    return [
        (
            np.stack([1 - probs[:, c], probs[:, c]], 1),
            np.stack([1.0 - (labels == c), (labels == c) * 1.0], 1),
        )
        for c in range(probs.shape[1])
    ]


def run(K, n, seed, t1, t2, notion):
    s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=seed)
    probs = np.clip(s.probs, 1e-12, None)
    probs /= probs.sum(axis=1, keepdims=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = kdecal.estimate(s.probs, s.labels, calibration=notion)
    hb, hl = est.bandwidth, est.bandwidth_kl
    coords = slice(None) if notion == "canonical" else slice(1, 2)
    rows = {}
    hs = {f"{k}hB": k * hb for k in (0.25, 0.5, 1.0, 2.0)}
    hs["hlog"] = hl
    for h in GRID:
        hs[f"g{h:.3g}"] = h
    for name, h in hs.items():
        acc = None
        parts = problem(probs, s.labels, notion)
        for P, Y in parts:
            Pc = np.clip(P, 1e-12, None)
            Pc = Pc / Pc.sum(axis=1, keepdims=True)
            u = ((Y - Pc)[:, coords] ** 2).sum(axis=1)
            vals = estimators(Pc, Y, *sums(Pc, Y, u, h), coords)
            acc = vals if acc is None else {k: acc[k] + vals[k] for k in acc}
        rows[name] = {k: v / len(parts) for k, v in acc.items()} | {"h": h}
    # the residual estimator's own leave-one-out Brier bandwidth
    g = min((k for k in rows if k.startswith("g")), key=lambda k: rows[k]["res brier"])
    rows["hRB"] = rows[g]
    return rows


def main():
    Ks = [int(x) for x in sys.argv[1].split(",")]
    ns = [int(x) for x in sys.argv[2].split(",")]
    seeds = int(sys.argv[3])
    notion = sys.argv[4] if len(sys.argv) > 4 else "canonical"
    out = []
    for K in Ks:
        for t1, t2 in CELLS:
            truth = {}
            for q, kw in (
                ("L1", {"p": 1}),
                ("sqL2", {"divergence": "l2"}),
                ("KL", {"divergence": "kl"}),
            ):
                truth[q] = (
                    0.0
                    if t2 == 1.0
                    else float(
                        datasets.true_calibration_error(
                            K, t1=t1, t2=t2, calibration=notion, n_mc=10**6, **kw
                        )
                    )
                )
            for n in ns:
                for seed in range(seeds):
                    rows = run(K, n, seed, t1, t2, notion)
                    rec = {
                        "K": K,
                        "n": n,
                        "t1": t1,
                        "t2": t2,
                        "seed": seed,
                        "truth": truth,
                        "rows": rows,
                    }
                    out.append(rec)
                    print(json.dumps(rec), flush=True)
    return out


if __name__ == "__main__":
    main()
