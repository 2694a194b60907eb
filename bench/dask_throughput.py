"""Throughput of backend="dask" on a LocalCluster against the in-process engine.

    python bench/dask_throughput.py [n] [--K 10] [--bandwidth 0.1] [--workers 2]
                                    [--threads-per-worker 1]

One leave-one-out pass (``kdecal.conditional_expectation`` at a fixed bandwidth: n (n - 1)
kernel pairs) with backend="cpp" in this process (all cores) and with backend="dask"
on a ``LocalCluster`` of worker processes on the same machine; both results must be
identical. Prints the wall time and pairs per second of each, the CPU time of the
pass (this process for cpp, the worker processes for dask: less sensitive to other
jobs on a shared machine than the wall time), then the projected time of one pass at
n = 10^7 on 100 workers of 16 cores, from the measured rates per core.
The projection is arithmetic (linear scaling of the per-core rate), not a measurement:
it ignores the broadcast of the centres (2 n K 8 bytes to every worker), the client's
O(n K) work and scheduler overheads.

Default n = 200,000 (K = 10): two passes of 4e10 pairs, about a minute each on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import kdecal


def _data(n: int, K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, 0.5), size=n)
    y = np.array([rng.choice(K, p=p) for p in P[: min(n, 1000)]])
    y = np.resize(y, n)  # labels do not change the pass's cost
    return P, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=200_000)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--bandwidth", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads-per-worker", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("KDECAL_PROGRESS", "0")
    from distributed import Client, LocalCluster

    n, K, h = args.n, args.K, args.bandwidth
    P, y = _data(n, K)
    pairs = float(n) * (n - 1)
    cores_here = kdecal.get_num_threads()

    t, c = time.perf_counter(), time.process_time()
    ref = kdecal.conditional_expectation(P, y, bandwidth=h, backend="cpp")
    t_cpp, c_cpp = time.perf_counter() - t, time.process_time() - c

    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=args.threads_per_worker,
            processes=True,
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        # start-up: workers import kdecal (timed apart from the pass)
        kdecal.conditional_expectation(P[:500], y[:500], bandwidth=h, backend="dask")
        c0 = client.run(time.process_time)
        t = time.perf_counter()
        out = kdecal.conditional_expectation(P, y, bandwidth=h, backend="dask")
        t_dask = time.perf_counter() - t
        c1 = client.run(time.process_time)
        c_dask = sum(c1[w] - c0[w] for w in c0)
        cores_dask = sum(client.nthreads().values())
    np.testing.assert_array_equal(out, ref)

    print(f"n = {n:,}, K = {K}, h = {h:g}: {pairs:.3g} kernel pairs per pass")
    print(
        f"in-process cpp, {cores_here} threads: {t_cpp:.2f} s wall, {pairs / t_cpp:.3g} "
        f"pairs/s; {c_cpp:.2f} CPU s, {pairs / c_cpp:.3g} pairs per CPU second"
    )
    print(
        f"LocalCluster {args.workers} x {args.threads_per_worker} threads: {t_dask:.2f} s "
        f"wall (centres sent included), {pairs / t_dask:.3g} pairs/s, {t_dask / t_cpp:.2f}x "
        f"the in-process time; {c_dask:.2f} CPU s in the workers, {pairs / c_dask:.3g} "
        "pairs per CPU second; results identical"
    )
    big_n, big_cores = 10**7, 100 * 16
    big_pairs = float(big_n) * (big_n - 1)
    print(
        f"projection (arithmetic, not measured): n = 10^7 is {big_pairs:.3g} pairs, one "
        f"pass at K = {K} on 100 workers x 16 cores, assuming linear scaling:"
    )
    for what, rate in (
        ("wall rate per core of the LocalCluster", pairs / t_dask / cores_dask),
        ("rate per CPU second of the workers (a dedicated core)", pairs / c_dask),
    ):
        proj = big_pairs / (rate * big_cores)
        print(
            f"  at {rate:.3g} pairs/s per core ({what}): {proj:.0f} s = {proj / 60:.1f} min "
            f"(one 16-core machine: {big_pairs / (rate * 16) / 3600:.1f} h)"
        )


if __name__ == "__main__":
    main()
