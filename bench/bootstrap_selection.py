"""Which bootstrap interval carries the automatic bandwidth's variability? (issue 26)

The protocol of ``bench/bootstrap_coverage.py`` (f ~ Dirichlet(1, ..., 1), labels from
temperature-scaled f, the truth by Monte Carlo), with every candidate interval computed
on the same draws and the same bootstrap row samples, so that the rules can be compared
and tuned offline:

- ``none``: the replicates at the estimate's bandwidth
  (``confidence_intervals(..., bandwidth_variability="none")``);
- ``refit``: each replicate at the bandwidth it re-selects (``"refit"``);
- ``fixed + own shift``: each ``none`` replicate plus its selection shift, the whole
  sample's estimate at the replicate's re-selected bandwidth minus the estimate;
- ``add``: each ``none`` replicate plus the previous replicate's selection shift (the
  default, ``"add"``: the two parts independent).

    python bench/bootstrap_selection.py run --K 10 --n 1000 --t 2 --draws 100 --R 100 \
        --out bench/selection/K10_n1000_t2.npz
    python bench/bootstrap_selection.py run ... --first 100 --draws 100 --out more.npz
    python bench/bootstrap_selection.py summarize bench/selection/*.npz

``--first`` starts at that draw index (new samples and row samples), and ``summarize``
pools the files of one cell.

``summarize`` prints, per cell and quantity, the coverage of the estimator's
expectation (the mean estimate over the draws) by each rule's 95 % interval.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

import kdecal
from kdecal._calibration_estimate import QUANTITIES, bootstrap_counts, centred_interval
from kdecal.datasets import temperature_scale

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bootstrap_coverage import draw, truths

NAMES = ("ece_kde_l1", "ce_l2")


def top_label_truths(K: int, t: float, n_mc: int = 400_000) -> dict[str, float]:
    """Top-label L1 and squared L2 errors of the protocol's model, by Monte Carlo."""
    rng = np.random.default_rng(12345)
    P = rng.dirichlet(np.ones(K), size=n_mc)
    k = P.argmax(axis=1)
    rows = np.arange(n_mc)
    D = temperature_scale(P, t)[rows, k] - P[rows, k]
    return {"ece_kde_l1": float(np.mean(np.abs(D))), "ce_l2": float(np.mean(D**2))}


def run(args: argparse.Namespace) -> None:
    K, n, t, R = args.K, args.n, args.t, args.R
    out: dict[str, list[np.ndarray] | list[float]] = {}
    for q in NAMES:
        for key in ("est", "fixed", "reselect", "shift"):
            out[f"{q}/{key}"] = []
    t0 = time.perf_counter()
    for d in range(args.first, args.first + args.draws):
        P, y = draw(n, K, t, 1000 * d + K)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kdecal.KdecalWarning)
            est = kdecal.estimate(P, y, calibration=args.calibration)
            fixed = est.confidence_intervals(
                list(NAMES), n_resamples=R, seed=d, bandwidth_variability="none"
            )
            resel = est.confidence_intervals(
                list(NAMES), n_resamples=R, seed=d, bandwidth_variability="refit"
            )
            counts = bootstrap_counts(n, R, np.random.default_rng(d))
            for q in NAMES:
                base = est._for(q)
                value = float(QUANTITIES[q](base))
                shift = np.zeros(R)
                for h, idx in est._reselected(base, counts).items():
                    if h != base.bandwidth:
                        shift[idx] = float(QUANTITIES[q](est._refit(base, h))) - value
                out[f"{q}/est"].append(value)  # type: ignore[arg-type]
                out[f"{q}/fixed"].append(fixed[q].bootstrap_distribution)  # type: ignore[arg-type]
                out[f"{q}/reselect"].append(resel[q].bootstrap_distribution)  # type: ignore[arg-type]
                out[f"{q}/shift"].append(shift)  # type: ignore[arg-type]
        if (d + 1 - args.first) % 10 == 0:
            print(
                f"draw {d + 1 - args.first} / {args.draws}, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    arrays = {k.replace("/", "__"): np.asarray(v) for k, v in out.items()}
    tr = truths(K, t) if args.calibration == "canonical" else top_label_truths(K, t)
    np.savez(
        args.out,
        K=K,
        n=n,
        calibration=args.calibration,
        t=t,
        R=R,
        seconds=time.perf_counter() - t0,
        **{f"{q}__truth": tr[q] for q in NAMES},
        **arrays,
    )
    print(f"wrote {args.out}")


def rules(d: dict[str, np.ndarray], q: str) -> dict[str, np.ndarray]:
    """Each rule's replicate distributions, (draws, R)."""
    fixed, resel, shift = d[f"{q}__fixed"], d[f"{q}__reselect"], d[f"{q}__shift"]
    return {
        "none": fixed,
        "refit": resel,
        "fixed + own shift": fixed + shift,
        # what bandwidth_variability="add" computes: replicate r plus the shift of r - 1
        "add": fixed + np.roll(shift, 1, axis=1),
    }


def summarize(args: argparse.Namespace) -> None:
    print("| notion | K | n | t | quantity | draws | rule | covers mean | sd / bootstrap sd |")
    print("|---|---|---|---|---|---|---|---|---|")
    cells: dict[tuple[str, int, int, float], dict[str, np.ndarray]] = {}
    for path in args.files:  # the runs of one cell (--first) are pooled
        with np.load(path) as f:
            part = {k: f[k] for k in f.files}
        key = (
            str(part.get("calibration", "canonical")),
            int(part["K"]),
            int(part["n"]),
            float(part["t"]),
        )
        if key not in cells:
            cells[key] = part
            continue
        for k, value in part.items():
            if k.endswith(("__est", "__fixed", "__reselect", "__shift")):
                cells[key][k] = np.concatenate([cells[key][k], value])
    for d in cells.values():
        for q in NAMES:
            est = d[f"{q}__est"]
            mu = float(est.mean())
            sd = float(est.std())
            dists = rules(d, q)
            for name, dist in dists.items():
                cover = []
                for e, b in zip(est, dist):
                    lo, hi = centred_interval(b, float(e), 0.95)
                    cover.append(lo <= mu <= hi)
                bsd = float(np.mean(np.std(dist, axis=1)))
                notion = str(d.get("calibration", "canonical")).replace("_", "-")
                print(
                    f"| {notion} | {int(d['K'])} | {int(d['n'])} | {float(d['t']):g} | {q} | {len(est)} "
                    f"| {name} | {100 * np.mean(cover):.1f} % | {sd:.4f} / {bsd:.4f} |"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--K", type=int, required=True)
    r.add_argument("--n", type=int, required=True)
    r.add_argument("--t", type=float, required=True)
    r.add_argument("--draws", type=int, default=100)
    r.add_argument(
        "--first", type=int, default=0, help="index of the first draw (to extend a cell's run)"
    )
    r.add_argument("--R", type=int, default=100)
    r.add_argument("--out", required=True)
    r.add_argument("--calibration", choices=("canonical", "top_label"), default="canonical")
    s = sub.add_parser("summarize")
    s.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
    else:
        summarize(args)


if __name__ == "__main__":
    main()
