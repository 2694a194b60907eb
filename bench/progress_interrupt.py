"""Progress-bar overhead and time to stop after SIGINT (not a pytest file).

Usage: python bench/progress_interrupt.py [--n N] [--threads T] [--runs R] [--stop-n N2]

1. Overhead: one leave-one-out pass (``kdecal._engine.backends.loo_reduce``, K = 10, one
   bandwidth, powers 2) with the bar on and off, interleaved R times each; prints min and
   median of both and the relative overhead.  The bar writes to stderr.
2. Time to stop: a subprocess runs a pass of N2 rows (minutes of work) with the bar on
   or off; 2 s after the pass starts it gets SIGINT; prints the time from the signal to
   the process's exit, its exit status (-2: Python re-raises SIGINT after an uncaught
   KeyboardInterrupt) and the last line of its stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
from scipy.special import gammaln

import kdecal
from kdecal._engine import backends as _backends

CHILD = r"""
import os, sys, numpy as np
from scipy.special import gammaln
import kdecal
from kdecal._engine import backends as _backends
n, nt, bar = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "on"
rng = np.random.default_rng(0)
P = rng.dirichlet(np.full(10, 0.7), size=n)
h = np.array([0.05])
kdecal.set_num_threads(nt)
print("start", flush=True)
_backends.loo_reduce(np.log(P), P, rng.integers(0, 10, n), 10, 1 / h,
                     -gammaln(P / h[0] + 1).sum(axis=1)[None], powers=2, progress=bar)
print("finished", flush=True)
"""


def problem(n: int):
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.full(10, 0.7), size=n)
    h = np.array([0.05])
    bias = -gammaln(P / h[0] + 1).sum(axis=1)[None]
    return np.log(P), P, rng.integers(0, 10, n), 1 / h, bias


def overhead(n: int, runs: int) -> None:
    logq, P, y, scale, bias = problem(n)
    times: dict[bool, list[float]] = {False: [], True: []}
    ref = None
    for _ in range(runs):
        for bar in (False, True):
            t0 = time.perf_counter()
            out = _backends.loo_reduce(logq, P, y, 10, scale, bias, powers=2, progress=bar)
            times[bar].append(time.perf_counter() - t0)
            if ref is None:
                ref = out
            elif not all(np.array_equal(a, b) for a, b in zip(out, ref)):
                raise SystemExit("bar on and off gave different results")
    off, on = times[False], times[True]
    print(
        f"overhead n = {n}, threads = {kdecal.get_num_threads()}, {runs} interleaved runs: "
        f"off min/median {min(off):.3f}/{statistics.median(off):.3f} s, "
        f"on {min(on):.3f}/{statistics.median(on):.3f} s: "
        f"{100 * (min(on) / min(off) - 1):+.1f} % min, "
        f"{100 * (statistics.median(on) / statistics.median(off) - 1):+.1f} % median",
        flush=True,
    )


def stop_time(n: int, threads: int, bar: str) -> None:
    env = dict(os.environ)
    env.pop("KDECAL_PROGRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(n), str(threads), bar],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "start"
    time.sleep(2.0)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    dt = time.perf_counter() - t0
    last = err.strip().splitlines()[-1] if err.strip() else ""
    print(
        f"SIGINT, n = {n}, threads = {threads}, bar {bar}: exit {proc.returncode} after "
        f"{dt:.2f} s ({last[:60]})",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stop-n", type=int, default=1_000_000)
    args = ap.parse_args()
    kdecal.set_num_threads(args.threads or None)
    overhead(args.n, args.runs)
    for bar in ("off", "on"):
        stop_time(args.stop_n, kdecal.get_num_threads(), bar)


if __name__ == "__main__":
    main()
