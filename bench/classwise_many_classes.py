"""Class-wise calibration at many classes: peak memory of the estimate, and resampling.

    KDECAL_PROGRESS=0 python bench/classwise_many_classes.py [--n 10000] [--k 1000]
        [--test-n 3000] [--test-k 300] [--resamples 20] [--json OUT]

Each measurement runs in a fresh process (its peak resident set size is the
process's, ``resource.getrusage``), on softmax outputs of Gaussian logits (scale 3)
with labels drawn from them (a calibrated model):

- ``estimate``: ``kdecal.estimate(probs, labels, calibration="classwise")`` and its
  quantities (L1, squared L2, KL, sharpness, refinement) at n = ``--n``, K = ``--k``:
  wall time and peak RSS, with the problems chunked (now) and as one batch
  (``PROBLEM_CHUNK_MIN_BYTES`` set to infinity: before);
- ``test``: ``calibration_test("ce_l2", n_resamples=R)`` of such an estimate at n =
  ``--test-n``, K = ``--test-k`` (below the fast binary engine's ``BINARY_REPLICATES_MIN_N``: dense
  replicates), with chunks of at least ``MIN_CHUNK_REPLICATES`` replicates (now) and with
  the budgets alone (``MIN_CHUNK_REPLICATES = 1``: before, one replicate per chunk
  from K of about 300 at n = 3,000), its wall time, and the same p-value either way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, warnings
import numpy as np
import kdecal
from kdecal._estimation import problem as _problem
from kdecal._estimation import replicates as _replicates

what, n, K, R, before = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
warnings.simplefilter("ignore")
if before and what == "estimate":
    _problem.PROBLEM_CHUNK_MIN_BYTES = float("inf")
if before and what == "test":
    _replicates.MIN_CHUNK_REPLICATES = 1
rng = np.random.default_rng(0)
p = rng.normal(size=(n, K)) * 3.0
p -= p.max(axis=1, keepdims=True)
np.exp(p, out=p)
p /= p.sum(axis=1, keepdims=True)
y = (rng.random(n)[:, None] > p.cumsum(axis=1)).sum(axis=1).clip(0, K - 1)
t0 = time.perf_counter()
est = kdecal.estimate(p, y, calibration="classwise")
values = {q: est.value(q) for q in ("ece_kde_l1", "ce_l2", "ce_kl", "sharpness_kl", "refinement_l2")}
t1 = time.perf_counter()
out = {"what": what, "n": n, "K": K, "before": before, "estimate_s": t1 - t0,
       "bandwidth": est.bandwidth, "values": values}
if what == "test":
    res = est.calibration_test("ce_l2", n_resamples=R, seed=0)
    out.update(test_s=time.perf_counter() - t1, resamples=R, pvalue=res.pvalue,
               null_mean=float(np.mean(res.null_distribution)))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
out.update(peak_rss_gb=rss / 1e9, bytes_per_row_class=rss / (n * K))
print(json.dumps(out))
"""


def run(what: str, n: int, K: int, R: int, before: bool) -> dict:
    args = [sys.executable, "-c", CHILD, what, str(n), str(K), str(R), "1" if before else "0"]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--test-n", type=int, default=3000)
    ap.add_argument("--test-k", type=int, default=300)
    ap.add_argument("--resamples", type=int, default=20)
    ap.add_argument("--skip-before-test", action="store_true")
    ap.add_argument("--skip-test", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for before in (False, True):
        r = run("estimate", args.n, args.k, 0, before)
        rows.append(r)
        print(
            f"estimate n={r['n']} K={r['K']} {'before' if before else 'now   '}: "
            f"{r['estimate_s']:.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB "
            f"({r['bytes_per_row_class']:.0f} B per (row, class)); {r['values']}",
            flush=True,
        )
    tests = () if args.skip_test else (False,) if args.skip_before_test else (False, True)
    for before in tests:
        r = run("test", args.test_n, args.test_k, args.resamples, before)
        rows.append(r)
        print(
            f"test n={r['n']} K={r['K']} R={r['resamples']} "
            f"{'before' if before else 'now   '}: {r['test_s']:.1f} s "
            f"(estimate {r['estimate_s']:.1f} s), p = {r['pvalue']:.4f}, "
            f"null mean {r['null_mean']:.3e}, peak RSS {r['peak_rss_gb']:.2f} GB",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
