"""Binary problems on backend="dask": the fast binary engine in row blocks.

    python bench/dask_binary.py [n] [--workers 2] [--threads-per-worker 1]
                                [--notions top_label,classwise] [--dense]

The seeds' synthetic protocol (K = 10, t1 = t2 = 0.6) at n rows (default 100,000).
For each notion: ``kdecal.estimate`` with the automatic bandwidth (the search, then the
estimate's pass) with backend="cpp" in this process and backend="dask" on a
``LocalCluster`` of worker processes on the same machine; the results must be equal.
With ``--dense``, one fixed-bandwidth pass (the bandwidth dask chose) on dask the way
binary problems ran there before, dense O(n^2) row blocks (``BINARY_METHOD = "exact"``),
beside the same pass on the fast engine. Prints wall times.
"""

from __future__ import annotations

import argparse
import time

import kdecal
from kdecal._engine import backends as _backends
from kdecal.datasets import make_seeds_synthetic


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads-per-worker", type=int, default=1)
    ap.add_argument("--notions", default="top_label,classwise")
    ap.add_argument("--dense", action="store_true")
    a = ap.parse_args()
    from distributed import Client, LocalCluster

    s = make_seeds_synthetic(a.n, 10, t1=0.6, t2=0.6, seed=0)
    P, y = s.probs, s.labels
    with (
        LocalCluster(
            n_workers=a.workers,
            threads_per_worker=a.threads_per_worker,
            processes=True,
            dashboard_address=None,
        ) as cluster,
        Client(cluster),
    ):
        for notion in a.notions.split(","):
            kw = {"calibration": notion, "progress": False}
            ref, tc = _timed(lambda kw=kw: kdecal.estimate(P, y, backend="cpp", **kw))
            est, td = _timed(lambda kw=kw: kdecal.estimate(P, y, backend="dask", **kw))
            same = est.bandwidth == ref.bandwidth and all(
                est.value(q) == ref.value(q) for q in ("ece_kde_l1", "ce_l2", "ce_kl")
            )
            print(
                f"{notion:>9} n = {a.n}: auto bandwidth {est.bandwidth:.3g}; cpp {tc:.2f} s, "
                f"dask {td:.2f} s; equal: {same}",
                flush=True,
            )
            if a.dense:
                h = est.bandwidth
                fkw = {"bandwidth": h, "backend": "dask", **kw}
                _, tf = _timed(lambda fkw=fkw: kdecal.estimate(P, y, **fkw))
                old = _backends.BINARY_METHOD
                _backends.BINARY_METHOD = "exact"
                try:
                    _, tx = _timed(lambda fkw=fkw: kdecal.estimate(P, y, **fkw))
                finally:
                    _backends.BINARY_METHOD = old
                print(
                    f"{notion:>9} n = {a.n}: one estimate at h = {h:.3g} on dask: fast engine "
                    f"{tf:.2f} s, dense blocks {tx:.2f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
