"""Thread scaling of one leave-one-out pass (not a pytest file).

Usage: python bench/scaling.py [--n N] [--threads 1,2,4,8,16] [--task-rows 16,64,auto]
                               [--repeat R] [--repeat1 R1] [--H H]

One engine call (``kdecal._engine.backends.loo_reduce``, powers 1, bar off) on CIFAR-10
predictions resampled to n rows, K = 10, float64, H bandwidths geometrically spaced
around 0.05 (default 1).  For every task size (``KDECAL_TASK_ROWS``, read by the engine
at each call; ``auto`` = the engine's own choice) and thread count: best-of-R wall time
(R1 runs at 1 thread, with the first task size only) and median, speed-up (the best
1-thread time over this one) and throughput in kernel evaluations (query, centre, bandwidth) per
second per thread.  Runs go in rounds over all configurations, so that a drift of the
machine's speed (turbo, neighbours on a shared host) hits every configuration alike.  The results of
every configuration must be bitwise identical (each row is reduced by one thread in a
fixed order); the script stops with an error otherwise.  Environment variables the
OpenMP runtime reads at start-up (OMP_PROC_BIND, OMP_PLACES) apply to the whole run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from scipy.special import gammaln

import kdecal
from conftest import cifar10_probs
from kdecal import _core
from kdecal._engine import backends as _backends


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--task-rows", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repeat1", type=int, default=1)
    ap.add_argument("--H", type=int, default=1)
    args = ap.parse_args()
    p, y = cifar10_probs(args.n)
    p = np.maximum(p, kdecal.tolerances.PROB_EPS)
    p /= p.sum(axis=1, keepdims=True)
    hs = 0.05 * np.geomspace(0.5, 2.0, args.H) if args.H > 1 else np.array([0.05])
    bias = np.stack([-gammaln(p / h + 1).sum(axis=1) for h in hs])
    logq, scale = np.log(p), 1.0 / hs
    y = y.astype(np.int64)
    threads = [int(t) for t in args.threads.split(",")]
    sizes = args.task_rows.split(",")
    # one thread: the first task size only (a lone thread's speed hardly depends on it)
    configs = [(tr, nt) for tr in sizes for nt in threads if nt > 1 or tr == sizes[0]]
    times: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    ref = None
    print(
        f"n = {args.n}, K = {p.shape[1]}, float64, H = {args.H}, SIMD path "
        f"{_core.simd_path()}, cores {os.cpu_count()}, OMP_PROC_BIND "
        f"{os.environ.get('OMP_PROC_BIND', '-')}, OMP_PLACES {os.environ.get('OMP_PLACES', '-')}"
    )
    # rounds over all configurations, so that slow drifts of the machine hit all alike
    for rnd in range(max(args.repeat, args.repeat1)):
        for tr, nt in configs:
            if len(times[tr, nt]) >= (args.repeat if nt > 1 else args.repeat1):
                continue
            if tr == "auto":
                os.environ.pop("KDECAL_TASK_ROWS", None)
            else:
                os.environ["KDECAL_TASK_ROWS"] = tr
            kdecal.set_num_threads(nt)
            t0 = time.perf_counter()
            out = _backends.loo_reduce(
                logq, p, y, 10, scale, bias, powers=1, backend="cpp", progress=False
            )
            times[tr, nt].append(time.perf_counter() - t0)
            if ref is None:
                ref = out
            elif not all(np.array_equal(a, b) for a, b in zip(out, ref)):
                raise SystemExit(
                    f"task rows {tr}, {nt} threads: results differ from the first run"
                )
        print(f"round {rnd + 1} done", file=sys.stderr, flush=True)
    kdecal.set_num_threads(None)
    t1 = min(min(times[c]) for c in configs if c[1] == 1) if 1 in threads else None
    print(
        f"{'task rows':>9} {'threads':>7} {'min s':>8} {'median s':>8} {'speed-up':>8} "
        f"{'Geval/s/thr':>11}   (speed-up: best 1-thread time over this min)"
    )
    for tr, nt in configs:
        dt = min(times[tr, nt])
        rate = args.n * (args.n - 1) * args.H / dt / nt / 1e9
        up = f"{t1 / dt:8.2f}" if t1 else f"{'':8}"
        print(
            f"{tr:>9} {nt:>7} {dt:8.3f} {statistics.median(times[tr, nt]):8.3f} {up} {rate:11.3f}"
        )


if __name__ == "__main__":
    main()
