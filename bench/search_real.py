"""Automatic bandwidth: time against one fixed pass, and the exhaustive grid's argmin.

Not a pytest file. For each real file (``../shared/data/real``, n >= 5000; or the files
named on the command line) and notion, and for the seeds' synthetic protocol at
n = 10,000 and 100,000 (``--synthetic``):

- ``auto``: :func:`kdecal._estimation.regression.fit_criteria` with ``bandwidth="auto"`` and the
  default debiasing (the search plus the estimate's accumulators), one criterion
  ("brier"), or both ("brier", "log") as ``kdecal evaluate`` runs them (``--both``);
- ``fixed``: one estimate at the chosen bandwidth (``kdecal._estimation.regression.estimate``);
- ``--synthetic``: the seeds' synthetic protocol (K = 10) at ``--sizes`` rows (default
  10,000 and 100,000; canonical unless ``--notions`` says otherwise); ``--resampled``:
  the resampled CIFAR-10 logits of ``bench/large_n.py`` at the same sizes;
- with ``--exhaustive``, the argmin of the exact leave-one-out risk over the whole
  search grid and the search's distance from it in grid steps (slow: 73 bandwidths).

Times are the best of ``--repeat`` runs (default 3). Prints a markdown table.

Usage: python bench/search_real.py [--exhaustive] [--both] [--synthetic] [--resampled]
       [--sizes N,...] [--notions canonical,top_label,classwise] [--repeat R] [FILE ...]
"""

from __future__ import annotations

import argparse
import glob
import os
import warnings

import numpy as np

import kdecal
from conftest import best_of, cifar10_probs
from kdecal._estimation import problem as _problem
from kdecal._estimation import regression as _regression
from kdecal._estimation import search as _search
from kdecal._validation import check_probs

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "..", "..", "shared", "data", "real")


def load(path: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as d:
        pre = "test_" if "test_labels" in d.files else ""
        y = d[pre + "labels"].astype(np.int64)
        if pre + "probs" in d.files:
            return d[pre + "probs"].astype(np.float64), y
        return kdecal.softmax(d[pre + "logits"].astype(np.float64)), y


def row(name: str, P: np.ndarray, y: np.ndarray, cal: str, args: argparse.Namespace) -> str:
    pr = _problem.make_problem(check_probs(P), y, cal)
    criteria = ("brier", "log") if args.both else ("brier",)
    t_auto, fits = best_of(
        lambda: _regression.fit_criteria(pr, "auto", "ustat", "cpp", False, criteria), args.repeat
    )
    rec = fits["brier"][1]
    hs = sorted({fits[c][1].bandwidth for c in criteria})
    t_fixed = sum(
        best_of(lambda h=h: _regression.estimate(pr, h, "ustat", "cpp", False), args.repeat)[0]
        for h in hs
    )
    steps = ""
    if args.exhaustive:
        risk = _search.cv_risk_grid(pr, _search.SEARCH_GRID, "brier", "cpp", False)
        j = int(np.flatnonzero(_search.SEARCH_GRID == rec.bandwidth)[0])
        steps = f" {j - int(np.argmin(risk)):+d} |"
    return (
        f"| {name} | {cal} | {pr.n} | {rec.bandwidth:.3g} |{steps} {rec.kernel_work:.1f} | "
        f"{t_auto:.3f} s | {t_fixed:.3f} s | {t_auto / t_fixed:.1f}× |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--exhaustive", action="store_true")
    ap.add_argument("--both", action="store_true")
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--resampled", action="store_true")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--notions", default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore", kdecal.KdecalWarning)
    ex = " search − exhaustive argmin (grid steps) |" if args.exhaustive else ""
    print(f"| data | notion | n | chosen h |{ex} kernel work | auto | fixed | ratio |")
    print("|---|---|---|---|" + ("---|" if args.exhaustive else "") + "---|---|---|---|")
    if args.synthetic or args.resampled:
        for n in (int(v) for v in args.sizes.split(",")):
            for cal in (args.notions or "canonical").split(","):
                if args.synthetic:
                    s = kdecal.datasets.make_seeds_synthetic(n, 10, seed=0)
                    print(row("synthetic K = 10", s.probs, s.labels, cal, args), flush=True)
                if args.resampled:
                    P, y = cifar10_probs(n)
                    print(row("CIFAR-10, resampled", P, y, cal, args), flush=True)
        return
    notions = (args.notions or "canonical,top_label,classwise").split(",")
    files = args.files or sorted(glob.glob(os.path.join(REAL, "*.npz")))
    for path in files:
        P, y = load(path)
        if not args.files and not 5000 <= len(y) <= 20000:
            continue
        name = os.path.basename(path)[:-4]
        for cal in notions:
            print(row(name, P, y, cal, args), flush=True)


if __name__ == "__main__":
    main()
