"""Time and peak memory of one leave-one-out pass at large n (not a pytest file).

Usage: python bench/large_n.py [n] [debias]   (defaults: n = 100000, debias = "ustat")
K = 10.  debias "ustat" (the default of ece_kde: powers 2 and the pair sums) or "none"
(the plain pass: powers 1).  Prints wall time and the process's peak RSS
(resource.getrusage) after the run.
"""

from __future__ import annotations

import resource
import sys
import time

import kdecal
from conftest import cifar10_probs


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    debias = sys.argv[2] if len(sys.argv) > 2 else "ustat"
    K_note = "K = 10 (CIFAR-10 logits, resampled)"
    p, y = cifar10_probs(n)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    ece = kdecal.ece_kde(p, y, bandwidth=0.05, debias=debias, backend="cpp")
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"n = {n}, {K_note}, float64, one bandwidth (0.05), debias {debias!r}, threads = "
        f"{kdecal.get_num_threads()}: {dt:.2f} s, ECE^KDE = {ece:.6f}, "
        f"peak RSS {rss:.0f} MB (before the pass: {rss0:.0f} MB)"
    )


if __name__ == "__main__":
    main()
