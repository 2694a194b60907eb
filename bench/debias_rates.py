"""Monte Carlo check of the debiasing rates (Popordanoska et al. 2022, Fig. 2b setting).

Binary problem, Beta kernel (the K = 2 Dirichlet kernel) with bandwidth 0.5, the query
point fixed at f = 0.17, and a sigmoid-miscalibrated sample: c ~ Uniform(0, 1) is the
calibrated probability, y ~ Bernoulli(c), and the prediction is f = sigmoid(2.5 logit c).
The estimand at fixed bandwidth is the kernel-smoothed ratio of population means
R1 = E[k(0.17; f) y] / E[k(0.17; f)] and its square R2 = R1^2 (the "sharpness term"),
computed by numerical integration over c.  For each n, ``reps`` independent samples
give the mean estimate of

- R2: plain (S_1 / S_0)^2, "ustat" (Eq. 7) and "ratio" (App. D);
- R1: plain S_1 / S_0 and "ratio" (App. C);

and the bias with its Monte Carlo standard error.  All estimators see the same samples.
The slopes are least-squares fits of log |bias| on log n over the n where |bias| exceeds
3 standard errors.

Usage: python bench/debias_rates.py [reps] [n1,n2,...]
"""

from __future__ import annotations

import sys
import time

import numpy as np
from scipy import integrate
from scipy.special import expit, gammaln, logit

from kdecal._engine import runtime as _runtime

H = 0.5
F0 = 0.17
A = 2.5


def fmap(c):
    return expit(A * logit(c))


def beta_kernel_at_f0(f):
    """Beta(f / h + 1, (1 - f) / h + 1) density evaluated at F0."""
    a, b = f / H + 1.0, (1.0 - f) / H + 1.0
    return np.exp(
        gammaln(a + b) - gammaln(a) - gammaln(b) + (a - 1) * np.log(F0) + (b - 1) * np.log1p(-F0)
    )


def truth():
    opts = {"epsabs": 1e-14, "epsrel": 1e-13, "limit": 200}
    mx = integrate.quad(lambda c: beta_kernel_at_f0(fmap(c)), 0, 1, **opts)[0]
    my = integrate.quad(lambda c: beta_kernel_at_f0(fmap(c)) * c, 0, 1, **opts)[0]
    return my / mx, (my / mx) ** 2


def one_sample(rng, n, core):
    c = rng.uniform(size=n)
    y = (rng.uniform(size=n) < c).astype(np.int64)
    f = np.clip(fmap(c), 1e-12, 1 - 1e-12)
    P = np.vstack([np.stack([1 - f, f], axis=1), [1 - F0, F0]])  # the query point last
    lab = np.append(y, 0)  # its own label never enters its own row (leave-one-out)
    bias = -gammaln(P / H + 1).sum(axis=1)[None, :]
    _, S, Q, T = core.loo_reduce(np.log(P), P, lab, 2, np.array([1 / H]), bias, 3, n, n + 1, 1)
    E_r, sq_r, _ = core.debias(S[0], Q[0], T[0], float(n), 2)
    _, sq_u, _ = core.debias(S[0], Q[0], None, float(n), 1)
    e = S[0, 0, 1] / S[0, 0].sum()
    return e * e, sq_u[0, 1], sq_r[0, 1], e, E_r[0, 1]


NAMES = ("R2 plain", "R2 ustat", "R2 ratio", "R1 plain", "R1 ratio")


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    ns = (
        [int(x) for x in sys.argv[2].split(",")]
        if len(sys.argv) > 2
        else [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    )
    core = _runtime._core
    R1, R2 = truth()
    print(f"truth: R1 = {R1:.10f}, R2 = {R2:.10f}; reps = {reps}")
    rng = np.random.default_rng(20221128)
    table = []
    t0 = time.perf_counter()
    for n in ns:
        vals = np.array([one_sample(rng, n, core) for _ in range(reps)])
        target = np.array([R2, R2, R2, R1, R1])
        bias = vals.mean(axis=0) - target
        se = vals.std(axis=0, ddof=1) / np.sqrt(reps)
        table.append((n, bias, se))
        cells = " | ".join(f"{b:+.2e} ± {s:.1e}" for b, s in zip(bias, se))
        print(f"n = {n:6d}: {cells}   [{time.perf_counter() - t0:.0f} s]", flush=True)
    print("\n| n | " + " | ".join(NAMES) + " |")
    print("|---|" + "---|" * len(NAMES))
    for n, bias, se in table:
        print(f"| {n} | " + " | ".join(f"{b:+.2e} ± {s:.1e}" for b, s in zip(bias, se)) + " |")
    print("\nslopes of log|bias| vs log n (points with |bias| > 3 SE):")
    for k, name in enumerate(NAMES):
        pts = [(n, abs(b[k])) for n, b, s in table if abs(b[k]) > 3 * s[k]]
        if len(pts) >= 2:
            x, yv = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            slope = np.polyfit(x, yv, 1)[0]
            print(f"  {name}: {slope:+.2f} over n = {[p[0] for p in pts]}")
        else:
            print(f"  {name}: bias below 3 SE at all but {len(pts)} n (no slope)")


if __name__ == "__main__":
    main()
