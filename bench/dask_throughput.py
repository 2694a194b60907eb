"""Throughput of backend="dask" on a LocalCluster against the in-process engine.

    python bench/dask_throughput.py [n] [--K 10] [--bandwidth 0.1] [--workers 2]
                                    [--threads-per-worker 1]

One leave-one-out pass (``kdecal.conditional_expectation`` at a fixed bandwidth: n (n - 1)
kernel pairs) with backend="cpp" in this process (all cores) and with backend="dask"
on a ``LocalCluster`` of worker processes on the same machine; both results must be
identical. Prints the wall time and pairs per second of each, then the projected time
of one pass at n = 10^7 on 100 workers of 16 cores, from the measured rate per core.
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

    t = time.perf_counter()
    ref = kdecal.conditional_expectation(P, y, bandwidth=h, backend="cpp")
    t_cpp = time.perf_counter() - t

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
        t = time.perf_counter()
        out = kdecal.conditional_expectation(P, y, bandwidth=h, backend="dask")
        t_dask = time.perf_counter() - t
        cores_dask = sum(client.nthreads().values())
    np.testing.assert_array_equal(out, ref)

    print(f"n = {n:,}, K = {K}, h = {h:g}: {pairs:.3g} kernel pairs per pass")
    print(f"in-process cpp, {cores_here} threads: {t_cpp:.2f} s, {pairs / t_cpp:.3g} pairs/s")
    print(
        f"LocalCluster {args.workers} x {args.threads_per_worker} threads: {t_dask:.2f} s "
        f"(centres sent included), {pairs / t_dask:.3g} pairs/s, {t_dask / t_cpp:.2f}x the "
        "in-process time; results identical"
    )
    per_core = pairs / t_dask / cores_dask
    big_n, big_cores = 10**7, 100 * 16
    big_pairs = float(big_n) * (big_n - 1)
    proj = big_pairs / (per_core * big_cores)
    print(
        f"projection (arithmetic, not measured): n = 10^7 is {big_pairs:.3g} pairs; at "
        f"{per_core:.3g} pairs/s per core (the LocalCluster's measured rate) 100 workers "
        f"x 16 cores take {proj:.0f} s = {proj / 60:.1f} min per pass at K = {K}, "
        f"vs {big_pairs / (per_core * 16) / 3600:.1f} h on one 16-core machine"
    )


if __name__ == "__main__":
    main()
