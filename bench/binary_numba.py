"""The numba twin of the fast binary engine against the compiled core (issue 27 item 1).

One engine pass at n = 100,000 (top-label-like scores x ~ Beta(8, 1), labels ~
Bernoulli(x), h = 1e-3, powers 2 with the pair and residual sums) by the window,
binned and local methods of both, the largest relative difference
of their accumulators; the dense numba loop at ``--dense-n`` rows; then
``kdecal.estimate(..., bandwidth="auto")`` for top-label and class-wise calibration on
both backends (the synthetic protocol's K = 10 model of ``bench/binary_speed.py``).

    KDECAL_PROGRESS=0 python bench/binary_numba.py [--n N] [--dense-n N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import kdecal
from kdecal._engine import binary as kb
from kdecal._engine import engines as _engines

sys.path.insert(0, str(Path(__file__).resolve().parent))
from binary_speed import best_of, synthetic


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.size == 0:
        return 0.0
    d = np.abs(a - b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d == 0, 0.0, d / np.abs(b))
    return float(r.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dense-n", type=int, default=20_000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    out: list[dict] = []
    rng = np.random.default_rng(0)
    n = args.n
    x = rng.beta(8.0, 1.0, size=n)
    lab = (rng.random(n) < x).astype(np.int64)[None]
    h = 1e-3
    logq, p, bias = kb.binary_inputs(x, [h])
    u = np.ascontiguousarray(((lab == 1) - p[..., 1]) ** 2)
    common = (logq, p, lab, 2, np.array([1.0 / h]), bias)
    kw = {"powers": 2, "pairs": True, "u": u}
    # compile the numba kernels first (cached on disk after the first run)
    small = (logq[:, :500], p[:, :500], lab[:, :500], 2, common[4], bias[:, :, :500])
    for method in ("binned", "local"):
        kb.loo_reduce_k2(
            *small, method=method, backend="numba", powers=2, pairs=True, u=u[:, :500]
        )
    ref = kb.loo_reduce_k2(*common, method="window", **kw)
    for backend, methods in (
        ("cpp", ("window", "binned", "local")),
        ("numba", ("window", "binned", "local")),
    ):
        for method in methods:
            res = kb.loo_reduce_k2(*common, method=method, backend=backend, **kw)
            t = best_of(
                lambda m=method, b=backend: kb.loo_reduce_k2(*common, method=m, backend=b, **kw),
                2,
            )
            diff = max(rel(a, b) for a, b in zip(res, ref))
            row = {
                "what": f"one pass, {backend} {method}",
                "n": n,
                "s": t,
                "max_rel_diff_vs_cpp_window": diff,
            }
            out.append(row)
            print(
                f"{row['what']:28s} n={n}  {t:7.3f} s  max rel diff vs cpp window {diff:.1e}",
                flush=True,
            )
    nd = args.dense_n
    dl = lab[:, :nd]
    lq, pp, bb = kb.binary_inputs(x[:nd], [h])
    t = best_of(
        lambda: _engines.dense_loo_reduce(
            "numba",
            lq[0],
            pp[0],
            dl[0],
            2,
            np.array([1.0 / h]),
            bb[0],
            2,
            0,
            nd,
            progress=False,
            pairs=True,
        ),
        1,
    )
    out.append(
        {"what": "one pass, numba dense", "n": nd, "s": t, "s_at_n_scaled": t * (n / nd) ** 2}
    )
    print(
        f"{'one pass, numba dense':28s} n={nd}  {t:7.3f} s  (x (n / {nd})^2: {t * (n / nd) ** 2:.0f} s)",
        flush=True,
    )
    P, y = synthetic(n)
    for notion in ("top_label", "classwise"):
        for backend in ("cpp", "numba"):
            t0 = time.perf_counter()
            est = kdecal.estimate(P, y, calibration=notion, backend=backend, progress=False)
            t = time.perf_counter() - t0
            row = {
                "what": f"estimate auto, {notion}, {backend}",
                "n": n,
                "s": t,
                "bandwidth": float(est.bandwidth),
                "ece_kde_l1": float(est.value("ece_kde_l1")),
            }
            out.append(row)
            print(
                f"{row['what']:36s} {t:7.2f} s  h = {est.bandwidth:.3g}  L1 = {row['ece_kde_l1']:.6g}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
