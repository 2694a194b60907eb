"""`kdecal.evaluate` on the bundled example with a given chunk budget of the dense replicates.

Sets ``kdecal._estimation.replicates._RESIDUAL_CHUNK_BYTES`` (bytes of one chunk of the
canonical residual replicates' sums; each chunk forms the kernel weights anew), runs a
small warm-up report, then times the default report and prints the wall time and the
process's peak RSS. Run it alternately with two budgets, one process each:

    for b in 64e6 200e6 64e6 200e6; do KDECAL_PROGRESS=0 python bench/residual_chunk_ab.py $b; done
"""

from __future__ import annotations

import resource
import sys
import time
import warnings

import numpy as np

import kdecal
from kdecal._estimation import replicates
from kdecal._io import bundled_example_path


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else replicates._RESIDUAL_CHUNK_BYTES
    with np.load(bundled_example_path()) as d:
        P, y = d["probs"], d["labels"]
    warnings.simplefilter("ignore")
    replicates._RESIDUAL_CHUNK_BYTES = budget
    kdecal.evaluate(P[:2000], y[:2000], progress=False)  # warm-up: imports, first calls
    t = time.perf_counter()
    kdecal.evaluate(P, y, progress=False)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"budget {budget:.3g} B: evaluate {wall:.2f} s, peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
