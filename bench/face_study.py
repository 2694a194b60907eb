"""Study of the kernel's resolution near the faces of the simplex (issue 25, item 3).

Float64 brute force (the kernel materialised in row blocks, independent of the engine)
on the seeds' synthetic protocol (``kdecal.datasets.make_seeds_synthetic``), canonical
calibration, comparing residual-centred estimators of L1 ECE, squared L2 (normalised
U-statistic) and KL with different kernels / regressions:

a   ``dir``      residual Dirichlet (the default): w_ij = Dir(f_j; f_i / h + 1),
                 g_j = sum_i w_ij r_i / sum_i w_ij, r_i = y_i - f_i.
                 Bandwidths: the rule of ``kdecal.estimate`` (L1 at h_B, squared L2 and
                 KL at h_B / 2 = ``est.bandwidth_l2``).
b   ``dir-resc`` per-class rescaling of the residuals, same Dirichlet weights:
                 g_jc = f_jc * sum_i w_ij r_ic / sum_i w_ij f_ic, i.e. the residual
                 regression of (a) times rho_jc = f_jc / (local kernel mean of f_c)
                 (positive, so the sign of g is that of (a); sum_c g_jc != 0 in general).
                 L1 and KL use E_j = (f_j + g_j) / sum_c (f_jc + g_jc), which is
                 f_jc S_c / A_c normalised (S = sum w y, A = sum w f; always inside the
                 simplex, no projection needed); squared L2 uses the U-statistic of the
                 rescaled residuals, mean_j sum_c rho_jc^2 [(S - A)_jc^2 -
                 sum_i w_ij^2 r_ic^2] / ((sum w)^2 - sum w^2) (rho depends on f only, so it
                 stays unbiased under calibration).  Bandwidth: its own rule (below) on the
                 Dirichlet grid (``dir-resc``), and (a)'s bandwidths (``dir-resc@hB``).
c   ``beta-logit`` / ``beta-sqrt``: product of Beta marginals with per-centre,
                 per-coordinate bandwidths h_ik = h (f_ik (1 - f_ik))^gamma:
                 w_ij = prod_k Beta(f_jk; a_ik, b_ik), a_ik = f_ik / h_ik + 1,
                 b_ik = (1 - f_ik) / h_ik + 1.  Every marginal has its mode at f_ik
                 (a Dirichlet with per-coordinate bandwidths cannot keep its mode at f_i);
                 gamma = 1 (``beta-logit``) gives a log-odds spread of about sqrt(h)
                 whatever f_ik, so 1e-6 and 1e-3 are resolved; gamma = 1/2
                 (``beta-sqrt``) sits between that and the Dirichlet's additive spread
                 (gamma = 0).  Residual-centred like (a).
d   ``clr-gauss`` Gaussian kernel in centred log-ratio space, z = log f - mean_k log f,
                 w_ij = exp(-||z_i - z_j||^2 / (2 s^2)).  Residual-centred like (a).
d'  ``clr-lap``  Laplace kernel in clr space, w_ij = exp(-||z_i - z_j|| / s).

Bandwidth rule "own" (b, c, d, d'): the minimiser over the kernel's grid (``GRIDS``) of
the leave-one-out Brier risk of the residual regression, mean_j ||y_j - f_j - g_j||^2,
used for L1; squared L2 and KL use the "half" bandwidth: h / 2 for the variance-like h of
(a)-(c) and s / sqrt(2) for (d) (the kernel's variance halved, as (a)'s h_B / 2), s / 2
for (d').  The grid's oracle (the grid point with the smallest |relative error| per
quantity, noisy labels) is recorded too, to separate the bandwidth rule from the kernel.
Predictions are clipped at 1e-12 and renormalised before any kernel is formed.

Every variant is also run with the labels replaced by the exact E[y | f] = c
(``SyntheticSample.calibrated``; residual r_i = c_i - f_i) at the same bandwidths as the
noisy run, which removes the label noise and leaves the kernel's bias.

Truth: ``kdecal.datasets.true_calibration_error`` (10^6 Monte Carlo draws); calibrated
cells (t2 = 1) have truth 0 and the value itself is reported.

Usage:
    python bench/face_study.py K1,K2 n seeds
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import numpy as np
from scipy.special import betaln, gammaln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kdecal
from kdecal import datasets
from residual_study import kl_rows, project, sums

# The five cells of bench/accuracy.py (four miscalibrated, one calibrated).
CELLS = [(0.6, 0.6), (1.0, 0.6), (0.6, 1.5), (0.9, 0.6), (0.6, 1.0)]
QUANTS = ("L1", "sqL2", "KL")
GRIDS = {
    "dir": np.logspace(-2.5, 0.5, 9),
    "beta-logit": np.logspace(-1.5, 2.0, 9),
    "beta-sqrt": np.logspace(-2.5, 1.5, 9),
    "clr-gauss": np.logspace(-0.3, 1.2, 9),
    "clr-lap": np.logspace(-0.3, 1.2, 9),
}
# kernel variance halved for squared L2 and KL: h / 2 for the variance-like h, s / sqrt 2, s / 2
HALF = {"dir": 0.5, "beta-logit": 0.5, "beta-sqrt": 0.5, "clr-gauss": 2**-0.5, "clr-lap": 0.5}
# variant -> (kernel, per-class rescaling, bandwidth rule)
VARIANT_SPECS = {
    "dir": ("dir", False, "kdecal"),
    "dir-resc": ("dir", True, "own"),
    "dir-resc@hB": ("dir", True, "kdecal"),
    "beta-logit": ("beta-logit", False, "own"),
    "beta-sqrt": ("beta-sqrt", False, "own"),
    "clr-gauss": ("clr-gauss", False, "own"),
    "clr-lap": ("clr-lap", False, "own"),
}
VARIANTS = tuple(VARIANT_SPECS)


# --------------------------------------------------------------------------- kernels


def logw_dirichlet(P, h):
    """Log Dirichlet weights Dir(f_j; f_i / h + 1) up to a row constant, per row block."""
    logq = np.log(P)
    bias = -gammaln(P / h + 1.0).sum(axis=1)
    return lambda j0, j1: bias[None, :] + (logq[j0:j1] @ P.T) / h


def logw_beta(P, h, gamma=1.0):
    """Log of prod_k Beta(f_jk; a_ik, b_ik) with h_ik = h (f_ik (1 - f_ik))^gamma.

    a_ik = f_ik / h_ik + 1, b_ik = (1 - f_ik) / h_ik + 1: each marginal has its mode at
    f_ik; gamma = 1 gives a log-odds spread of about sqrt(h) whatever f_ik.
    """
    K = P.shape[1]
    comp = P @ (1.0 - np.eye(K))  # 1 - f, summed from the other coordinates (no cancellation)
    hik = h * (P * comp) ** gamma
    a1 = P / hik  # a - 1
    b1 = comp / hik  # b - 1
    bias = -betaln(a1 + 1.0, b1 + 1.0).sum(axis=1)
    lf, l1f = np.log(P), np.log(comp)
    return lambda j0, j1: bias[None, :] + lf[j0:j1] @ a1.T + l1f[j0:j1] @ b1.T


def _clr(P):
    lf = np.log(P)
    return lf - lf.mean(axis=1, keepdims=True)


def logw_clr_gauss(P, s):
    z = _clr(P)
    zz = (z * z).sum(axis=1)
    return lambda j0, j1: (z[j0:j1] @ z.T - 0.5 * zz[None, :]) / s**2


def logw_clr_laplace(P, s):
    z = _clr(P)
    zz = (z * z).sum(axis=1)

    def f(j0, j1):
        d2 = zz[j0:j1, None] + zz[None, :] - 2.0 * (z[j0:j1] @ z.T)
        return -np.sqrt(np.maximum(d2, 0.0)) / s

    return f


KERNELS = {
    "dir": logw_dirichlet,
    "beta-logit": lambda P, h: logw_beta(P, h, 1.0),
    "beta-sqrt": lambda P, h: logw_beta(P, h, 0.5),
    "clr-gauss": logw_clr_gauss,
    "clr-lap": logw_clr_laplace,
}


def ksums(logw, P, Ys, block=500):
    """Leave-one-out sums for a kernel given as a row-block log-weight function.

    Returns S0 (n,), A = sum w f_i (n, K), Q0 = sum w^2 (n,), and per label matrix Y in
    ``Ys``: S = sum w y_i (n, K) and U = sum w^2 (y_i - f_i)^2 (n, K), each row scaled by
    the same (row max) factor, which cancels in every estimator below.
    """
    n, K = P.shape
    S0, Q0, A = np.empty(n), np.empty(n), np.empty((n, K))
    S = [np.empty((n, K)) for _ in Ys]
    U = [np.empty((n, K)) for _ in Ys]
    R2 = [(Y - P) ** 2 for Y in Ys]
    for j0 in range(0, n, block):
        j1 = min(n, j0 + block)
        L = logw(j0, j1)
        L[np.arange(j1 - j0), np.arange(j0, j1)] = -np.inf
        w = np.exp(L - L.max(axis=1, keepdims=True))
        S0[j0:j1] = w.sum(axis=1)
        A[j0:j1] = w @ P
        w2 = w * w
        Q0[j0:j1] = w2.sum(axis=1)
        for m, Y in enumerate(Ys):
            S[m][j0:j1] = w @ Y
            U[m][j0:j1] = w2 @ R2[m]
    return S0, A, Q0, S, U


# ------------------------------------------------------------------------ estimators


def u_stat(D, U, S0, Q0, rho=None):
    """mean_j sum_c rho^2 (D_jc^2 - U_jc) / (S0_j^2 - Q0_j)  (D = S - A)."""
    num = D**2 - U
    if rho is not None:
        num = rho**2 * num
    num = num.sum(axis=1)
    den = S0**2 - Q0
    ok = den > 1e-12 * S0**2
    return float(np.mean(np.where(ok, num / np.where(ok, den, 1.0), 0.0)))


def estimates(P, Y, S0, A, Q0, S, U, rescale=False):
    """L1, squared L2, KL (and the LOO Brier risk, the KL clip fraction) at one bandwidth."""
    D = S - A
    out = {}
    if not rescale:
        g = D / S0[:, None]
        out["L1"] = float(np.mean(np.abs(g).sum(axis=1)))
        out["sqL2"] = u_stat(D, U, S0, Q0)
        Ep, frac = project(P, g)
        out["KL"] = float(np.mean(kl_rows(Ep, P)))
        out["clip"] = frac
        out["brier"] = float(np.mean(((Y - P - g) ** 2).sum(axis=1)))
    else:
        Am = np.maximum(A, 1e-300)
        rho = P * S0[:, None] / Am  # f_jc / local mean of f_c
        E = P * np.maximum(S, 0.0) / Am
        E /= E.sum(axis=1, keepdims=True)
        out["L1"] = float(np.mean(np.abs(E - P).sum(axis=1)))
        out["sqL2"] = u_stat(D, U, S0, Q0, rho)
        out["KL"] = float(np.mean(kl_rows(E, P)))
        out["clip"] = 0.0
        out["brier"] = float(np.mean(((Y - P - rho * D / S0[:, None]) ** 2).sum(axis=1)))
    return out


def evaluate(kernel, P, Y, C, h, rescale=(False,)):
    """Noisy and noise-free estimates of one kernel at one bandwidth."""
    S0, A, Q0, S, U = ksums(KERNELS[kernel](P, h), P, [Y, C])
    res = {}
    for rs in rescale:
        res[rs] = {
            "noisy": estimates(P, Y, S0, A, Q0, S[0], U[0], rs),
            "clean": estimates(P, C, S0, A, Q0, S[1], U[1], rs),
        }
    return res


# ------------------------------------------------------------------------------ runs


def rel(v, truth):
    return v if truth == 0.0 else (v - truth) / truth


def run(K, n, seed, t1, t2, truth):
    s = datasets.make_seeds_synthetic(n, K, t1=t1, t2=t2, seed=seed)
    P = np.clip(s.probs, 1e-12, None)
    P = P / P.sum(axis=1, keepdims=True)
    Y = np.eye(K)[s.labels]
    C = np.asarray(s.calibrated, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = kdecal.estimate(s.probs, s.labels)
    hB, hL = float(est.bandwidth), float(est.bandwidth_l2)

    # every kernel on its grid (the Dirichlet's also at the rule's h_B and h_B / 2)
    tables = {}
    for kern, grid in GRIDS.items():
        hs = [float(h) for h in grid] + ([hB, hL] if kern == "dir" else [])
        rs = (False, True) if kern == "dir" else (False,)
        tables[kern] = {h: evaluate(kern, P, Y, C, h, rs) for h in hs}

    out = {}
    for var, (kern, rs, rule) in VARIANT_SPECS.items():
        tab = tables[kern]
        if rule == "kdecal":
            h1, h2 = hB, hL
        else:
            grid = [float(h) for h in GRIDS[kern]]
            h1 = min(grid, key=lambda h: tab[h][rs]["noisy"]["brier"])
            h2 = h1 * HALF[kern]
        if h2 not in tab:
            tab[h2] = evaluate(kern, P, Y, C, h2, (False, True) if kern == "dir" else (False,))
        rec = {"h": {"L1": h1, "sqL2": h2, "KL": h2}, "noisy": {}, "clean": {}}
        for q in QUANTS:
            h = h1 if q == "L1" else h2
            for mode in ("noisy", "clean"):
                rec[mode][q] = tab[h][rs][mode][q]
        rec["clip"] = tab[h2][rs]["noisy"]["clip"]
        rec["brier"] = tab[h1][rs]["noisy"]["brier"]
        # the grid's oracle: smallest |relative error| per quantity (noisy labels)
        grid = [float(h) for h in GRIDS[kern]]
        rec["oracle"] = {}
        for q in QUANTS:
            hb = min(grid, key=lambda h: abs(rel(tab[h][rs]["noisy"][q], truth[q])))
            rec["oracle"][q] = {
                "h": hb,
                "noisy": tab[hb][rs]["noisy"][q],
                "clean": tab[hb][rs]["clean"][q],
            }
        out[var] = rec
    return out


def truths(K, t1, t2):
    if t2 == 1.0:
        return {q: 0.0 for q in QUANTS}
    kws = {"L1": {"p": 1}, "sqL2": {"divergence": "l2"}, "KL": {"divergence": "kl"}}
    return {
        q: float(datasets.true_calibration_error(K, t1=t1, t2=t2, n_mc=10**6, **kws[q]))
        for q in QUANTS
    }


def summary(recs):
    """Markdown table: median over seeds of the relative error (calibrated: the value)."""
    lines = []
    for mode in ("noisy", "clean"):
        lines.append(
            f"\n### labels: {mode} (median over seeds; % relative error, calibrated cells: value)\n"
        )
        lines.append("| K | cell | quantity | " + " | ".join(VARIANTS) + " |")
        lines.append("|---|---|---|" + "---|" * len(VARIANTS))
        keys = sorted(
            {(r["K"], r["t1"], r["t2"]) for r in recs},
            key=lambda k: (k[0], k[2] == 1.0, CELLS.index(k[1:])),
        )
        for K, t1, t2 in keys:
            rs = [r for r in recs if (r["K"], r["t1"], r["t2"]) == (K, t1, t2)]
            for q in QUANTS:
                cells = []
                for v in VARIANTS:
                    vals = [rel(r["rows"][v][mode][q], r["truth"][q]) for r in rs]
                    m = float(np.median(vals))
                    cells.append(f"{m:.2g}" if t2 == 1.0 else f"{100 * m:+.0f}")
                lines.append(f"| {K} | ({t1}, {t2}) | {q} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    Ks = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4, 10]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    seeds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    recs = []
    for K in Ks:
        for t1, t2 in CELLS:
            truth = truths(K, t1, t2)
            for seed in range(seeds):
                t0 = time.time()
                rows = run(K, n, seed, t1, t2, truth)
                rec = {
                    "K": K,
                    "n": n,
                    "t1": t1,
                    "t2": t2,
                    "seed": seed,
                    "truth": truth,
                    "rows": rows,
                    "seconds": round(time.time() - t0, 1),
                }
                recs.append(rec)
                print(json.dumps(rec), flush=True)
    print(summary(recs), flush=True)
    return recs


def _check(n=300, K=4, h=0.1):
    """The generic block sums agree with bench/residual_study.sums for the Dirichlet kernel."""
    s = datasets.make_seeds_synthetic(n, K, seed=1)
    P = np.clip(s.probs, 1e-12, None)
    P /= P.sum(axis=1, keepdims=True)
    Y = np.eye(K)[s.labels]
    u = ((Y - P) ** 2).sum(axis=1)
    S_ref, A_ref, U_ref, Q_ref = sums(P, Y, u, h, block=64)
    S0, A, Q0, S, U = ksums(logw_dirichlet(P, h), P, [Y], block=128)
    sc = S_ref.sum(axis=1) / S0  # both are scaled by row maxima
    assert np.allclose(S[0] * sc[:, None], S_ref) and np.allclose(A * sc[:, None], A_ref)
    assert np.allclose(U[0].sum(axis=1) * sc**2, U_ref) and np.allclose(Q0 * sc**2, Q_ref)


if __name__ == "__main__":
    _check()
    main()
