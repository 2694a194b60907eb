"""Vector scaling on the real files: NLL, iterations and time of the fit, and the optimum.

For each file of the real-data folder (``../shared/data/real``; multi-class, n <= 20,000,
K <= 120; the ``val_`` split where there is one) fits ``VectorScaling`` and prints its
NLL, ``converged_``, iterations and wall time; for K <= 20 also the NLL of an independent
Newton fit (scipy's trust-exact with the exact Hessian, a gauge term for the common
shift of the biases), the optimum the fit must reach.

    KDECAL_PROGRESS=0 python bench/vector_scaling_fit.py [DATA_DIR]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import optimize
from scipy.special import log_softmax, logsumexp, softmax

from kdecal.recalibration import VectorScaling


def newton_nll(L: np.ndarray, y: np.ndarray) -> float:
    """Minimum NLL of softmax(w * L + b) by trust-exact with the exact Hessian."""
    n, K = L.shape
    rows = np.arange(n)
    c = np.array([np.median(L[y == k, k]) if np.any(y == k) else 0.0 for k in range(K)])
    Lc = L - c  # centred as the fit is (the optimum does not depend on it)

    def fun(th: np.ndarray) -> tuple[float, np.ndarray]:
        U = th[:K] * Lc + th[K:]
        R = softmax(U, axis=1)
        R[rows, y] -= 1.0
        mb = th[K:].mean()
        f = float(np.mean(logsumexp(U, axis=1) - U[rows, y])) + 0.5 * mb * mb
        return f, np.concatenate([(R * Lc).sum(0) / n, R.sum(0) / n + mb / K])

    def hess(th: np.ndarray) -> np.ndarray:
        P = softmax(th[:K] * Lc + th[K:], axis=1)
        A = P * Lc
        Hwb = np.diag(A.sum(0)) - A.T @ P
        H = np.block(
            [[np.diag((A * Lc).sum(0)) - A.T @ A, Hwb], [Hwb.T, np.diag(P.sum(0)) - P.T @ P]]
        )
        H /= n
        H[K:, K:] += 1.0 / K**2
        return H

    x0 = np.r_[np.ones(K), np.zeros(K)]
    res = optimize.minimize(
        fun,
        x0,
        jac=True,
        hess=hess,
        method="trust-exact",
        options={"gtol": 1e-13, "maxiter": 5000},
    )
    return float(res.fun)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("../shared/data/real")
    warnings.simplefilter("ignore")
    print(
        f"{'file':36s} {'n x K':>11s} {'NLL':>14s} conv {'iter':>5s} {'time':>7s} {'Newton NLL':>14s}"
    )
    for f in sorted(folder.glob("*.npz")):
        with np.load(f) as d:
            pre = "val_" if "val_labels" in d.files else ""
            kind = "logits" if pre + "logits" in d.files else "probs"
            X, y = d[pre + kind].astype(np.float64), d[pre + "labels"].astype(np.int64)
        if X.ndim != 2 or X.shape[0] > 20000 or X.shape[1] > 120:
            continue
        t = time.perf_counter()
        cal = VectorScaling(input=kind).fit(X, y)
        sec = time.perf_counter() - t
        ref = ""
        if X.shape[1] <= 20:
            L = log_softmax(X, axis=1) if kind == "logits" else np.log(np.maximum(X, 1e-300))
            ref = f"{newton_nll(L, y):14.10f}"
        print(
            f"{f.name[:36]:36s} {X.shape[0]:>6d} x {X.shape[1]:<3d} {cal.nll_:14.10f} "
            f"{'yes' if cal.converged_ else 'NO ':4s} {cal.n_iter_:5d} {sec:6.2f}s {ref}"
        )


if __name__ == "__main__":
    main()
