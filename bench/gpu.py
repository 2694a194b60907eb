"""The CUDA engine on a GPU: time, memory, rate against the card's limit, fast-mode error.

Usage: python bench/gpu.py [--sizes 10000,100000,1000000] [--K 10,100] [--budget 30]
       [--materialised 10000,20000,40000] [--out FILE.json]

Needs a CUDA device and numba-cuda (``pip install "kdecal[cuda]"``); torch for the
materialised reference. Prints one table row per configuration, and with ``--out``
writes every number as JSON. What it runs:

1. ``kdecal._engine.cuda.loo_reduce`` (the canonical forward pass: per-query maximum and class
   sums, one bandwidth h = 0.05, powers 1) on CIFAR-10-like predictions resampled to n
   rows (``bench/conftest.py``; K = 100 takes the CIFAR-10 logits' first 10 columns
   repeated with jitter), inputs already on the device, in the fast (float32) and float64
   modes; the median of 3 timed runs after one warm-up (compilation). A configuration
   whose predicted time exceeds ``--budget`` seconds is skipped.
2. The ECE^KDE paper's approach in PyTorch: the n x n log-kernel materialised on the GPU
   (float32), LOO mask, softmax and the product with the one-hot labels.
3. The multi-label pass (B = 100 bootstrap weightings) and the backward pass at n = 10^5.
3b. "lean": the lean kernel (powers 1) against the general one at K = 10, n = 10^5 and
   10^6, for each shape of ``LEAN_VARIANTS`` (query rows per thread, centres per group);
   "leank": lean against general over K at n = 10^5 (where ``LEAN_MAX_K`` comes from);
   "sums": the default residual estimate's pass (powers 2, pair and residual sums)
   through the lean kernel with those sums against the general one, K = 10 and 20.
4. The fast mode's error against the float64 mode on the real files in
   ``../shared/data/real`` at h = 1e-3, 1e-2, 0.1: max relative error of the row maxima,
   max absolute error of the conditional expectation E = S / sum_c S.

Rates: a forward pass makes two passes over the pairs (class maxima, then sums), each a
K-dot, so 2 K fused multiply-adds per pair, and one exponential per pair; the card's
FMA rate is taken from its datasheet (H100 SXM: 33.5 TFLOP/s FP64, 67 TFLOP/s FP32,
i.e. 16.7e12 and 33.5e12 FMA/s).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import gammaln

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import REAL, cifar10_probs
from kdecal._engine import cuda as _cuda

PEAK_FMA = {"float64": 16.7e12, "float32": 33.5e12}  # H100 SXM datasheet


def _data(n: int, K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    p, y = cifar10_probs(n, seed)
    if K == 10:
        return p, y
    rng = np.random.default_rng(seed)
    z = np.log(np.tile(p, (1, K // 10))) + rng.normal(scale=0.3, size=(n, K))
    q = np.exp(z - z.max(axis=1, keepdims=True))
    return q / q.sum(axis=1, keepdims=True), (y + 10 * rng.integers(0, K // 10, n)) % K


def _inputs(P: np.ndarray, h: float, dtype: type) -> tuple:
    from numba import cuda

    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    logq = cuda.to_device(np.ascontiguousarray(np.log(P), dtype=dtype))
    p = cuda.to_device(np.ascontiguousarray(P, dtype=dtype))
    bias = cuda.to_device(-gammaln(P / h + 1.0).sum(axis=1)[None, :])
    return logq, p, bias


def _time(fn, repeat: int = 3) -> float:
    from numba import cuda

    ts = []
    for _ in range(repeat):
        cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def forward_table(sizes, Ks, budget, results):
    from numba import cuda

    h = 0.05
    rate = {}  # seconds per pair seen so far, per (K, mode)
    for K in Ks:
        for mode, dt in (("fast", np.float32), ("float64", np.float64)):
            for n in sizes:
                key = (K, mode)
                if key in rate and rate[key] * n * n > budget:
                    print(
                        f"K = {K:>3} {mode:>7} n = {n:>8}: skipped (predicted "
                        f"{rate[key] * n * n:.1f} s > {budget} s)",
                        flush=True,
                    )
                    continue
                P, y = _data(n, K)
                logq, p, bias = _inputs(P, h, dt)
                free0 = cuda.current_context().get_memory_info()[0]

                def run(logq=logq, p=p, y=y, K=K, bias=bias):
                    return _cuda.loo_reduce(
                        logq, p, y, K, np.array([1 / h]), bias, 1, device_out=True
                    )

                out = run()  # warm-up: compilation
                free1 = cuda.current_context().get_memory_info()[0]
                del out
                t = _time(run, 3 if n <= 300_000 else 1)
                rate[key] = t / n / n
                pairs = float(n) * (n - 1)
                fma_rate = 2 * K * pairs / t
                peak = PEAK_FMA["float32" if mode == "fast" else "float64"]
                row = {
                    "K": K,
                    "mode": mode,
                    "n": n,
                    "seconds": t,
                    "pairs_per_s": pairs / t,
                    "exps_per_s": pairs / t,
                    "fma_per_s": fma_rate,
                    "fma_share_of_peak": fma_rate / peak,
                    "gpu_mem_engine_MB": (free0 - free1) / 2**20,
                }
                results["forward"].append(row)
                print(
                    f"K = {K:>3} {mode:>7} n = {n:>8}: {t:9.4f} s  {pairs / t:.3g} pairs/s  "
                    f"{fma_rate / 1e12:.2f}e12 FMA/s ({100 * fma_rate / peak:.0f} % of peak)  "
                    f"engine memory {row['gpu_mem_engine_MB']:.0f} MB",
                    flush=True,
                )


#: (query rows per thread, centre tile as rows, threads per block, fast math)
VARIANTS = [
    (1, False, 128, False),
    (1, True, 128, False),
    (2, True, 128, False),
    (1, False, 64, False),
    (1, False, 256, False),
    (1, False, 128, True),
]


def variants(results):
    """Forward kernel variants: query rows per thread and the layout of a centre tile
    (K x TILE, or TILE x K padded: contiguous coordinates): time, registers, local memory.
    """
    h, K = 0.05, 10
    for n in (100_000, 1_000_000):
        P, y = _data(n, K)
        for mode, dt in (("fast", np.float32), ("float64", np.float64)):
            logq, p, bias = _inputs(P, h, dt)
            for qb, rows, tb, fm in VARIANTS:
                if fm and mode != "fast":
                    continue
                _cuda.QUERIES_PER_THREAD = qb
                _cuda.CENTRE_ROWS = rows
                _cuda.FORWARD_TILE = tb
                _cuda.FAST_MATH = fm

                def run(logq=logq, p=p, y=y, K=K, bias=bias):
                    return _cuda.loo_reduce(
                        logq, p, y, K, np.array([1 / h]), bias, 1, device_out=True
                    )

                run()
                t = _time(run, 3 if n <= 100_000 else 1)
                kern, _ = _cuda._forward_kernel(K, mode == "fast", 1, False)
                regs = list(kern.get_regs_per_thread().values())
                local = list(kern.get_local_mem_per_thread().values())
                results["variants"].append(
                    {
                        "n": n,
                        "mode": mode,
                        "qb": qb,
                        "rows": rows,
                        "tile": tb,
                        "fastmath": fm,
                        "seconds": t,
                        "regs": regs,
                        "local": local,
                    }
                )
                print(
                    f"variant n = {n:>8} {mode:>7} QB = {qb} rows {rows:d} tile {tb:>3} "
                    f"fastmath {fm:d}: {t:.4f} s, "
                    f"registers {regs}, "
                    f"local memory {local} B",
                    flush=True,
                )
    _cuda.QUERIES_PER_THREAD = 1
    _cuda.CENTRE_ROWS = True
    _cuda.FORWARD_TILE = _cuda.TILE
    _cuda.FAST_MATH = False


#: (query rows per thread, centres per group) of the lean kernel; None: the general kernel
LEAN_VARIANTS = [None, (1, 4), (1, 8), (2, 4), (2, 8)]


def lean_variants(results):
    """The lean kernel (powers 1) against the general one, and its shapes: time, registers."""
    h, K = 0.05, 10
    shape0 = dict(_cuda.LEAN_SHAPE)
    for n in (100_000, 1_000_000):
        P, y = _data(n, K)
        for mode, dt in (("fast", np.float32), ("float64", np.float64)):
            logq, p, bias = _inputs(P, h, dt)
            for v in LEAN_VARIANTS:
                _cuda.LEAN = v is not None
                _cuda.LEAN_SUMS = v is not None  # None: the general kernel itself
                if v is not None:
                    _cuda.LEAN_SHAPE = {True: v, False: v}

                def run(logq=logq, p=p, y=y, K=K, bias=bias):
                    return _cuda.loo_reduce(
                        logq, p, y, K, np.array([1 / h]), bias, 1, device_out=True
                    )

                run()
                t = _time(run, 3 if n <= 100_000 else 1)
                if v is None:
                    kern, _ = _cuda._forward_kernel(K, mode == "fast", 1, False)
                else:
                    kern = _cuda._lean_kernel(K, mode == "fast", False, *v)
                regs = list(kern.get_regs_per_thread().values())
                row = {"n": n, "mode": mode, "lean": v, "seconds": t, "regs": regs}
                results["lean_variants"].append(row)
                print(
                    f"lean variant n = {n:>8} {mode:>7} {v or 'general'}: {t:.4f} s, "
                    f"{n * (n - 1) / t:.3g} pairs/s, registers {regs}",
                    flush=True,
                )
    _cuda.LEAN = True
    _cuda.LEAN_SUMS = True
    _cuda.LEAN_SHAPE = dict(shape0)


def lean_sums(sizes, results):
    """The default residual estimate's pass (powers 2, pair and residual sums): the lean
    kernel with squared, pair and residual sums against the general one, K = 10 and 20."""
    h = 0.05
    for K in (10, 20):
        for n in sizes:
            if K == 20 and n > 100_000:
                continue
            P, y = _data(n, K)
            u = np.random.default_rng(1).random(n)
            for mode, dt in (("fast", np.float32), ("float64", np.float64)):
                logq, p, bias = _inputs(P, h, dt)
                for on in (True, False):
                    _cuda.LEAN_SUMS = on

                    def run(logq=logq, p=p, y=y, K=K, bias=bias, u=u):
                        return _cuda.loo_reduce(
                            logq, p, y, K, np.array([1 / h]), bias, 2, pairs=True, resid=u,
                            device_out=True,
                        )  # fmt: skip

                    run()
                    t = _time(run, 3 if n <= 100_000 else 1)
                    row = {"K": K, "n": n, "mode": mode, "lean_sums": on, "seconds": t}
                    results["lean_sums"].append(row)
                    print(
                        f"residual pass K = {K:>3} n = {n:>8} {mode:>7} "
                        f"{'lean sums' if on else 'general  '}: {t:.4f} s, "
                        f"{n * (n - 1) / t:.3g} pairs/s",
                        flush=True,
                    )
    _cuda.LEAN_SUMS = True


def lean_k_sweep(results):
    """Lean (the default shape, K <= LEAN_MAX_K lifted) against general kernel over K."""
    h, n = 0.05, 100_000
    kmax = _cuda.LEAN_MAX_K
    _cuda.LEAN_MAX_K = 10**6
    for K in (10, 20, 30, 40, 60, 100):
        P, y = _data(n, K)
        for mode, dt in (("fast", np.float32), ("float64", np.float64)):
            logq, p, bias = _inputs(P, h, dt)
            ts = {}
            for lean in (True, False):
                _cuda.LEAN = lean
                _cuda.LEAN_SUMS = lean

                def run(logq=logq, p=p, y=y, K=K, bias=bias):
                    return _cuda.loo_reduce(
                        logq, p, y, K, np.array([1 / h]), bias, 1, device_out=True
                    )

                run()
                ts[lean] = _time(run, 3)
            results["lean_k"].append(
                {"K": K, "mode": mode, "lean_s": ts[True], "general_s": ts[False]}
            )
            print(
                f"lean vs general K = {K:>3} {mode:>7} n = {n}: {ts[True]:.4f} s vs {ts[False]:.4f} s",
                flush=True,
            )
    _cuda.LEAN = True
    _cuda.LEAN_SUMS = True
    _cuda.LEAN_MAX_K = kmax


def materialised(sizes, results):
    """The ECE^KDE paper's PyTorch approach: the n x n log-kernel on the GPU, float32."""
    import torch

    h = 0.05
    for n in sizes:
        P, y = _data(n, 10)
        Pt = torch.tensor(np.maximum(P, 1e-12), dtype=torch.float32, device="cuda")
        Y = torch.nn.functional.one_hot(torch.tensor(y, device="cuda"), 10).float()

        def run(Pt=Pt, Y=Y):
            alphas = Pt / h + 1
            log_beta = torch.sum(torch.lgamma(alphas), dim=1) - torch.lgamma(torch.sum(alphas, 1))
            L = torch.log(Pt) @ (alphas - 1).T - log_beta[None, :]  # [j, i]
            L.fill_diagonal_(-float("inf"))
            W = torch.softmax(L, dim=1)
            return W @ Y

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        try:
            run()
            torch.cuda.synchronize()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
            t = float(np.median(ts))
            mem = torch.cuda.max_memory_allocated() / 2**30
            print(
                f"materialised (PyTorch, float32) n = {n:>6}: {t:.4f} s, peak {mem:.1f} GiB",
                flush=True,
            )
            results["materialised"].append({"n": n, "seconds": t, "peak_GiB": mem})
        except torch.OutOfMemoryError:
            print(f"materialised n = {n}: out of GPU memory", flush=True)
            results["materialised"].append({"n": n, "seconds": None, "peak_GiB": None})
        torch.cuda.empty_cache()


def other_passes(results):
    n, K, h, B = 100_000, 10, 0.05, 100
    P, y = _data(n, K)
    rng = np.random.default_rng(1)
    for mode, dt in (("fast", np.float32), ("float64", np.float64)):
        logq, p, bias = _inputs(P, h, dt)
        m, S = _cuda.loo_reduce(logq, p, y, K, np.array([1 / h]), bias, 1)[:2]
        w = rng.multinomial(n, np.full(n, 1 / n), size=B).astype(np.float64)
        labels = np.tile(y, (B, 1))
        bias1 = bias.copy_to_host()[0]
        args = (logq, p, m[0], labels, K, 1 / h, bias1, w, 2, 0, n)
        _cuda.loo_reduce_multi(*args)
        t = _time(lambda args=args: _cuda.loo_reduce_multi(*args), 1)
        print(f"multi-label pass, B = {B}, n = {n}, {mode}: {t:.3f} s", flush=True)
        lse = m[0] + np.log(S[0].sum(-1))
        coef = rng.normal(size=(n, K))
        gargs = (logq, p, y, K, 1 / h, bias1, lse, coef)
        _cuda.loo_grad(*gargs, device_out=True)
        tg = _time(lambda g=gargs: _cuda.loo_grad(*g, device_out=True), 1)
        print(f"backward pass, n = {n}, {mode}: {tg:.3f} s", flush=True)
        results["other"].append({"mode": mode, "n": n, "multi_B100_s": t, "backward_s": tg})


def fast_mode_error(results):
    from numba import cuda

    files = sorted(REAL.glob("*.npz")) if REAL.exists() else []
    if not files:
        print("fast-mode error: no real files found", flush=True)
    for f in files:
        with np.load(f) as d:
            keys = [k for k in ("probs", "test_probs", "logits", "test_logits") if k in d]
            lab = [k for k in ("labels", "test_labels") if k in d]
            if not keys or not lab:
                continue
            X = d[keys[0]].astype(np.float64)
            y = d[lab[0]].astype(np.int64)
        if X.ndim == 1:
            X = np.stack([1 - X, X], axis=1)
        if "logits" in keys[0]:
            X = np.exp(X - X.max(axis=1, keepdims=True))
            X /= X.sum(axis=1, keepdims=True)
        K = X.shape[1]
        if K > 100 or len(y) > 60_000:
            continue
        for h, powers in [(h, pw) for h in (1e-3, 1e-2, 0.1) for pw in (1, 2)]:
            # fast: float32 inputs; f64r: the float64 engine on the same float32-rounded
            # inputs (the fast mode's arithmetic alone); f64: float64 inputs (the rounding of
            # the inputs too, which the CPU engine's float32 mode shares)
            outs = {}
            for mode in ("fast", "f64r", "f64"):
                logq, p, bias = _inputs(X.copy(), h, np.float32 if mode != "f64" else np.float64)
                if mode == "f64r":
                    logq = cuda.to_device(logq.copy_to_host().astype(np.float64))
                    p = cuda.to_device(p.copy_to_host().astype(np.float64))
                outs[mode] = _cuda.loo_reduce(logq, p, y, K, np.array([1 / h]), bias, powers)
            if powers == 1 and _cuda.LEAN:
                kernel = "lean"
            elif _cuda.LEAN_SUMS and K <= _cuda.LEAN_SUMS_MAX_K:
                kernel = "lean sums"
            else:
                kernel = "general"
            row = {"file": f.name, "K": K, "n": len(y), "h": h, "kernel": kernel}
            for ref in ("f64r", "f64"):
                m32, S32 = outs["fast"][:2]
                m64, S64 = outs[ref][:2]
                E32 = S32 / S32.sum(-1, keepdims=True)
                E64 = S64 / S64.sum(-1, keepdims=True)
                row[f"m_rel_{ref}"] = float(
                    np.max(np.abs(m32 - m64) / np.maximum(np.abs(m64), 1e-300))
                )
                row[f"E_abs_{ref}"] = float(np.max(np.abs(E32 - E64)))
                row[f"S0_rel_{ref}"] = float(
                    np.max(np.abs(S32.sum(-1) - S64.sum(-1)) / S64.sum(-1))
                )
            results["fast_error"].append(row)
            print(
                f"fast vs float64 {kernel:>7} {f.name:<40} h = {h:<6g} same inputs: E {row['E_abs_f64r']:.1e}"
                f" abs, sum S {row['S0_rel_f64r']:.1e} rel, m {row['m_rel_f64r']:.1e} rel; "
                f"float64 inputs: E {row['E_abs_f64']:.1e}, sum S {row['S0_rel_f64']:.1e}",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--K", default="10,100")
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--materialised", default="10000,20000,40000")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of: sums,lean,leank,variants,forward,materialised,other,error",
    )
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from numba import cuda

    dev = cuda.get_current_device()
    print(
        f"device: {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}, "
        f"compute capability {dev.compute_capability}",
        flush=True,
    )
    results: dict = {
        "forward": [],
        "materialised": [],
        "other": [],
        "fast_error": [],
        "variants": [],
        "lean_variants": [],
        "lean_k": [],
        "lean_sums": [],
    }
    skip = set(a.skip.split(","))
    if "sums" not in skip:
        lean_sums([int(x) for x in a.sizes.split(",")], results)
    if "lean" not in skip:
        lean_variants(results)
    if "leank" not in skip:
        lean_k_sweep(results)
    if "variants" not in skip:
        variants(results)
    if "forward" not in skip:
        forward_table(
            [int(x) for x in a.sizes.split(",")],
            [int(x) for x in a.K.split(",")],
            a.budget,
            results,
        )
    if "materialised" not in skip and a.materialised:
        materialised([int(x) for x in a.materialised.split(",")], results)
    if "other" not in skip:
        other_passes(results)
    if "error" not in skip:
        fast_mode_error(results)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1, default=float))
    assert all(math.isfinite(r["seconds"]) for r in results["forward"])


if __name__ == "__main__":
    main()
