"""Speed of the fast binary engine: one pass, and the public API with automatic bandwidths.

One engine pass at n = 100,000 (top-label problems: a synthetic K = 10 model and a
CIFAR-10 model resampled to that size) by the binned and the local method, with the
largest relative difference of their accumulators; then top-label and class-wise
``kdecal.estimate(..., bandwidth="auto")`` at n = 100,000 with the engine's method and
the bandwidth search's plans switched, the search on all rows (the default for the
problems the fast engine serves) against the previous search on row subsets, and
``kdecal.binned.ece`` beside them.

    KDECAL_PROGRESS=0 python bench/binary_speed.py [--n N] [--threads T] [--json OUT]
        [--api-only] [--notions top_label,classwise] [--searches]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

import kdecal
from kdecal._engine import backends as _backends
from kdecal._engine import binary as kb
from kdecal._engine import runtime as _runtime
from kdecal._estimation import search as _search

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


def synthetic(n: int, K: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The accuracy protocol's model: softmax of 2.5 N(0, 1) logits, labels drawn from it."""
    rng = np.random.default_rng(seed)
    z = 2.5 * rng.normal(size=(n, K))
    P = np.exp(z - z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    y = (rng.random(n)[:, None] > P.cumsum(axis=1)).sum(axis=1)
    return P, np.minimum(y, K - 1)


def cifar(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cifar10_resnet56_chenyaofo.npz's test predictions resampled to n rows.

    A smoothed bootstrap: rows drawn with replacement, their logits jittered by
    N(0, 0.5^2).  With exact copies (or jitter of 0.01) every leave-one-out criterion
    chooses the smallest bandwidth of the grid (a copy predicts its twin), an artefact of
    the resampling (and a slow case of its own: see bench/README.md).
    """
    with np.load(REAL / "cifar10_resnet56_chenyaofo.npz") as d:
        z, y = d["logits"], d["labels"]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(y), n)
    z = z[idx] + 0.5 * rng.normal(size=(n, z.shape[1]))
    P = np.exp(z - z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return P, y[idx]


def best_of(fn: Callable[[], object], repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


@contextlib.contextmanager
def engine_setting(method: str, plans: bool) -> Iterator[None]:
    saved_method, saved_plans = _backends.BINARY_METHOD, kb.reuse_plans
    _backends.BINARY_METHOD = method
    if not plans:
        kb.reuse_plans = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        _backends.BINARY_METHOD, kb.reuse_plans = saved_method, saved_plans


def one_pass(name: str, P: np.ndarray, y: np.ndarray, out: list[dict]) -> None:
    x = P.max(axis=1)
    correct = (P.argmax(axis=1) == y).astype(np.int64)
    for h in (1e-3, 2e-4):
        logq, p, bias = kb.binary_inputs(x, [h])
        args = (logq, p, correct[None].copy(), 2, 1.0 / np.array([h]), bias)
        for powers, pairs in ((1, False), (3, True)):
            res = {}
            for method in ("binned", "local"):
                res[method] = kb.loo_reduce_k2(*args, powers=powers, pairs=pairs, method=method)
                t = best_of(
                    lambda m=method, a=args, pw=powers, pr=pairs: kb.loo_reduce_k2(
                        *a, powers=pw, pairs=pr, method=m
                    ),
                    3,
                )
                res[method + "_s"] = t  # type: ignore[assignment]
            diff = max(
                float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-300)))
                for a, b in zip(res["binned"], res["local"])
                if np.size(a)
            )
            row = {
                "data": name,
                "h": h,
                "sums": "S" if powers == 1 else "S, Q, T, D",
                "binned_s": res["binned_s"],
                "local_s": res["local_s"],
                "max_rel_diff": diff,
            }
            out.append(row)
            print(
                f"{name:10s} h={h:g} {row['sums']:10s} binned {row['binned_s']:.3f} s  "
                f"local {row['local_s']:.3f} s  max rel diff {diff:.1e}",
                flush=True,
            )


def api(
    name: str, P: np.ndarray, y: np.ndarray, out: list[dict], args: argparse.Namespace
) -> None:
    warnings.simplefilter("ignore")
    t = best_of(lambda: kdecal.binned.ece(P, y), 3)
    out.append({"data": name, "what": "kdecal.binned.ece", "s": t})
    print(f"{name:10s} kdecal.binned.ece {t:.3f} s", flush=True)
    settings = (
        [("local", True, "row subsets"), ("local", True, "all rows")] * 2
        if args.searches
        else [
            ("binned", False, "all rows"),
            ("local", False, "all rows"),
            ("local", True, "all rows"),
        ]
    )
    for notion in args.notions.split(","):
        for method, plans, search in settings:
            with engine_setting(method, plans), search_setting(search):
                t0 = time.perf_counter()
                est = kdecal.estimate(P, y, calibration=notion, progress=False)
                t = time.perf_counter() - t0
            what = f"{notion} auto, {method}, plans {'on' if plans else 'off'}, search on {search}"
            out.append({"data": name, "what": what, "s": t, "bandwidth": float(est.bandwidth)})
            print(f"{name:10s} {what:56s} {t:6.2f} s  h = {est.bandwidth:.3g}", flush=True)


@contextlib.contextmanager
def search_setting(search: str) -> Iterator[None]:
    """``"row subsets"``: the fast engine's problems searched as the dense engine's are."""
    saved = _search._search_all_rows
    if search == "row subsets":
        _search._search_all_rows = _search._search_bandwidths  # type: ignore[assignment]
    try:
        yield
    finally:
        _search._search_all_rows = saved  # type: ignore[assignment]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--api-only", action="store_true", help="skip the one-pass timings")
    ap.add_argument("--notions", default="top_label,classwise")
    ap.add_argument(
        "--searches", action="store_true", help="the two searches, twice each (local, plans)"
    )
    args = ap.parse_args()
    if args.threads:
        kdecal.set_num_threads(args.threads)
    out: list[dict] = []
    data = {"synthetic": synthetic(args.n), "cifar10": cifar(args.n)}
    if not args.api_only:
        for name, (P, y) in data.items():
            one_pass(name, P, y, out)
    for name, (P, y) in data.items():
        api(name, P, y, out, args)
    print(f"threads: {_runtime.get_num_threads()}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
