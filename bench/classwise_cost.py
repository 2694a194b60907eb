"""The class-wise estimate's cost model against measured time and memory.

    KDECAL_PROGRESS=0 python bench/classwise_cost.py [--sizes 3000x300,10000x500,...]
        [--json OUT]

``kdecal.evaluate`` leaves the class-wise notion out of ``notions="auto"`` where
``replicates.classwise_estimate_cost`` expects more than
``_evaluate.CLASSWISE_AUTO_MAX_SECONDS``, and warns before a class-wise estimate asked
for by name that it expects to take more than ``LONG_ESTIMATE_SECONDS``.  This script
measures what the model predicts: ``kdecal.estimate(probs, labels,
calibration="classwise")`` and its quantities, each size in a fresh process (wall time
and peak resident set size), on the data of ``bench/classwise_many_classes.py``
(softmax outputs of Gaussian logits, scale 3, labels drawn from them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from classwise_many_classes import run
from kdecal._estimation.replicates import classwise_estimate_cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="3000x300,1500x2000,10000x500,20000x1000")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for size in args.sizes.split(","):
        n, K = (int(v) for v in size.split("x"))
        r = run("estimate", n, K, 0, False)
        sec, size_b = classwise_estimate_cost(n, K)
        r.update(model_s=sec, model_gb=size_b / 1e9)
        rows.append(r)
        print(
            f"n={n} K={K}: {r['estimate_s']:.1f} s (model {sec:.1f} s), peak RSS "
            f"{r['peak_rss_gb']:.2f} GB (model {size_b / 1e9:.2f} GB)",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
