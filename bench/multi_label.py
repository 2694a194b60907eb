"""Time of the multi-label pass against one ordinary pass (not a pytest file).

Usage: python bench/multi_label.py [n,n,...] [B] [h,h,...] [--dense]
(defaults: n = 5000,10000, B = 200, h = 0.05; K = C = 10, float64, the threads of
kdecal.get_num_threads()).

For each n and h: one ordinary ``_core.loo_reduce`` pass (which also gives the row max
``m``), then ``_core.loo_reduce_multi`` for consistency resampling (B label sets drawn
from the predicted probabilities, no weights) and for the bootstrap (the true labels,
B multinomial count vectors as centre weights), with powers 1 and 2.  Best of 3 runs.
``--dense`` also times the dense alternative's arithmetic alone: the BLAS product of
the materialised n x n kernel matrix with the (n, B C) one-hot label matrix.
"""

from __future__ import annotations

import sys
from functools import partial

import numpy as np
from scipy.special import gammaln

import kdecal
from conftest import best_of
from kdecal._engine import runtime as _runtime


def main() -> None:
    pos = [a for a in sys.argv[1:] if not a.startswith("--")]
    ns = [int(v) for v in pos[0].split(",")] if pos else [5000, 10000]
    B = int(pos[1]) if len(pos) > 1 else 200
    hs = [float(v) for v in pos[2].split(",")] if len(pos) > 2 else [0.05]
    dense = "--dense" in sys.argv
    core = _runtime._core
    nt = kdecal.get_num_threads()
    K = C = 10
    print(f"K = C = {K}, B = {B}, float64, {nt} threads, SIMD path {core.simd_path()}")
    for n in ns:
        rng = np.random.default_rng(0)
        P = rng.dirichlet(np.full(K, 0.3), size=n)
        P = np.maximum(P, 1e-12)
        P /= P.sum(axis=1, keepdims=True)
        logq = np.log(P)
        cum = np.cumsum(P, axis=1)
        y = (rng.random((n, 1)) > cum).sum(axis=1).clip(0, K - 1).astype(np.int64)
        resampled = (rng.random((B, n, 1)) > cum[None]).sum(axis=-1).clip(0, K - 1)
        resampled = resampled.astype(np.int64)
        boot_labels = np.ascontiguousarray(np.broadcast_to(y, (B, n)))
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=B).astype(np.float64)
        for h in hs:
            bias = -gammaln(P / h + 1).sum(axis=1)
            scale = np.array([1 / h])
            t1, (m, _, _, _) = best_of(
                partial(core.loo_reduce, logq, P, y, C, scale, bias[None], 1, 0, n, nt)
            )
            m = m[0].copy()
            line = [f"n = {n}, h = {h}: loo_reduce {t1 * 1e3:.0f} ms"]
            for name, lab, w in (
                ("resampling", resampled, None),
                ("bootstrap", boot_labels, counts),
            ):
                for powers in (1, 2):
                    run = partial(core.loo_reduce_multi, logq, P, m, lab, C, 1 / h, bias, w)
                    t, _ = best_of(partial(run, powers, 0, 0, nt))
                    line.append(f"{name} powers={powers} {t * 1e3:.0f} ms ({t / t1:.1f}x)")
            print(" | ".join(line), flush=True)
            if dense:
                L = bias[None, :] + (logq @ P.T) / h
                np.fill_diagonal(L, -np.inf)
                W = np.exp(L - m[:, None])
                del L
                Y = np.zeros((n, B * C))
                Y[np.arange(n)[:, None], np.arange(B)[None, :] * C + resampled.T] = 1.0
                t, _ = best_of(partial(np.matmul, W, Y), 2)
                print(f"    dense BLAS W @ onehot (n x n) @ (n x {B * C}): {t * 1e3:.0f} ms")
                del W, Y


if __name__ == "__main__":
    main()
