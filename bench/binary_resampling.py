"""Resampling binary problems: the fast binary engine per replicate against dense products.

    KDECAL_PROGRESS=0 python bench/binary_resampling.py [--resamples 20]
        [--sizes 2048,4096,10000] [--large 100000] [--dense-large 2]
        [--notions top_label,classwise] [--json OUT]

For top-label and class-wise calibration, the bootstrap intervals and the calibration
tests of ``ece_kde_l1`` and ``ce_l2`` (one resampling pass, as ``kdecal evaluate`` runs
them: ``CalibrationEstimate._intervals_and_tests``) timed two ways on the same estimate:

- "fast": each replicate one call of the fast binary engine with the bootstrap's
  multiplicities as centre weights (``kdecal._estimation.replicates._binary_replicates``);
- "dense": the kernel weights a block of rows at a time times the replicates' value
  columns, one BLAS product per block (``_residual_replicates``), O(n^2) per replicate.

The largest difference between the two ways' replicates is printed too (both reach 230
nats below a row's maximum, where a bootstrap sample that draws none of a query row's
near centres leaves it; ``tests/estimators/test_residual.py``, the isolated rows against
a brute force).
Sizes up to 10,000: rows of the bundled example drawn without replacement (drawing with
replacement would tie rows and drive the automatic bandwidth to the grid's end).
``--large``: the seeds' synthetic protocol (K = 10, t1 = t2 = 0.6) at that n, fast with
all the resamples and dense with ``--dense-large`` of them (the per-replicate times are
compared; 0 skips the dense run there: at n = 10^5 a class-wise dense replicate takes
about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

import kdecal
from kdecal._estimation import replicates as _replicates
from kdecal._io import bundled_example_path
from kdecal.datasets import make_seeds_synthetic

NAMES = ["ece_kde_l1", "ce_l2"]


def _run(est, R: int, fast: bool) -> tuple[float, dict[str, np.ndarray]]:
    real, floor = _replicates._fast_binary, _replicates.BINARY_REPLICATES_MIN_N
    if fast:  # also below the default's threshold
        _replicates.BINARY_REPLICATES_MIN_N = 0
    else:
        _replicates._fast_binary = lambda est, backend: False
    try:
        t = time.perf_counter()
        ci, tests = est._intervals_and_tests(NAMES, NAMES, level=0.95, n_resamples=R, seed=0)
        dt = time.perf_counter() - t
    finally:
        _replicates._fast_binary, _replicates.BINARY_REPLICATES_MIN_N = real, floor
    dists = {f"boot {q}": ci[q].bootstrap_distribution for q in NAMES}
    dists.update({f"test {q}": tests[q].null_distribution for q in NAMES})
    return dt, dists


def _max_rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray], R: int) -> float:
    """Largest relative difference of two ways' replicates (a squared L2 near 0, whose
    U-statistic cancels, can differ relatively by more than its sums do)."""
    out = 0.0
    for k in a:
        x, y = a[k][:R], b[k][:R]
        out = max(out, float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-12))))
    return out


def _max_abs(a: dict[str, np.ndarray], b: dict[str, np.ndarray], R: int) -> float:
    return max(float(np.max(np.abs(a[k][:R] - b[k][:R]))) for k in a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resamples", type=int, default=20)
    ap.add_argument("--sizes", default="2048,4096,10000")
    ap.add_argument("--large", type=int, default=100_000)
    ap.add_argument("--dense-large", type=int, default=2)
    ap.add_argument("--notions", default="top_label,classwise")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    with np.load(bundled_example_path()) as d:
        P, y = d["probs"], d["labels"]
    rng = np.random.default_rng(0)
    rows = []
    cases = [(int(n), "example") for n in a.sizes.split(",") if n]
    if a.large:
        cases.append((a.large, "synthetic"))
    for n, src in cases:
        if src == "example":
            idx = rng.permutation(len(y))[:n]
            Pn, yn = P[idx], y[idx]
        else:
            s = make_seeds_synthetic(n, 10, t1=0.6, t2=0.6, seed=0)
            Pn, yn = s.probs, s.labels
        for notion in a.notions.split(","):
            est = kdecal.estimate(Pn, yn, calibration=notion, progress=False)
            R = a.resamples
            Rd = R if src == "example" else a.dense_large
            tf, df = _run(est, R, True)
            td, dd = _run(est, Rd, False) if Rd else (float("nan"), None)
            fast_used = _replicates._fast_binary(est._for("ece_kde_l1"), est.backend)
            row = {
                "n": n,
                "source": src,
                "notion": notion,
                "bandwidth": est._for("ece_kde_l1").bandwidth,
                "resamples_fast": R,
                "resamples_dense": Rd,
                "fast_s": tf,
                "dense_s": td,
                "fast_per_replicate_s": tf / R,
                "dense_per_replicate_s": td / Rd if Rd else float("nan"),
                "default_is_fast": fast_used,
                "max_rel_diff": _max_rel(df, dd, Rd) if dd is not None else float("nan"),
                "max_abs_diff": _max_abs(df, dd, Rd) if dd is not None else float("nan"),
            }
            rows.append(row)
            print(
                f"{notion:>9} n = {n:>6} ({src}, h = {row['bandwidth']:.3g}): fast "
                f"{tf:.2f} s / {R}, dense {td:.2f} s / {Rd} resamples; per replicate "
                f"{1e3 * tf / R:.1f} vs {1e3 * row['dense_per_replicate_s']:.1f} ms "
                f"(default: {'fast' if fast_used else 'dense'}); "
                f"max diff {row['max_rel_diff']:.1e} rel., {row['max_abs_diff']:.1e} abs.",
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
