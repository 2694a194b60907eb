"""The backward pass of binary problems: fast engine against the dense pass.

Times ``kdecal.torch.ece_kde_loss`` (forward + backward, float64) for top-label and
class-wise calibration on a synthetic K = 10 problem and on a CIFAR-10 model's
predictions resampled to n rows, with the fast binary engine (the default) and with the
dense passes (``KDECAL_BINARY_METHOD=exact``, up to ``--dense-max`` rows), and the
largest difference of the gradients. Also times the centre pass alone.

    KDECAL_PROGRESS=0 python bench/binary_grad.py [--n 10000 100000] [--h 1e-3]
        [--dense-max 20000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import kdecal.torch as kt
from kdecal._engine import backends as _backends

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


def _data(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if name == "synthetic":
        K = 10
        logits = rng.normal(size=(n, K)) * 2.5
        P = np.exp(logits - logits.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        y = np.array([rng.choice(K, p=p) for p in P[: min(n, 200000)]])
        if len(y) < n:
            y = np.concatenate([y, rng.integers(0, K, n - len(y))])
        return np.log(np.maximum(P, 1e-300)), y
    with np.load(REAL / "cifar10_resnet56_chenyaofo.npz") as d:
        L, y = d["logits"].astype(np.float64), d["labels"]
    idx = rng.integers(0, len(y), n)
    # a smoothed bootstrap: resampled rows, their logits jittered
    return L[idx] + rng.normal(scale=0.05, size=(n, L.shape[1])), y[idx]


def _time(logits: np.ndarray, y: np.ndarray, cal: str, h: float) -> tuple[float, np.ndarray]:
    z = torch.tensor(logits, requires_grad=True)
    t = time.perf_counter()
    loss = kt.ece_kde_loss(torch.softmax(z, 1), torch.tensor(y), bandwidth=h, calibration=cal)
    (g,) = torch.autograd.grad(loss, z)
    return time.perf_counter() - t, g.numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--h", type=float, default=1e-3)
    ap.add_argument("--dense-max", type=int, default=20000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for n in args.n:
        for name in ("synthetic", "cifar10_resnet56"):
            logits, y = _data(name, n, rng)
            for cal in ("top_label", "classwise"):
                _backends.BINARY_METHOD = "auto"
                fast, gf = _time(logits, y, cal, args.h)
                row = {"n": n, "data": name, "calibration": cal, "h": args.h, "fast_s": fast}
                if n <= args.dense_max:
                    _backends.BINARY_METHOD = "exact"
                    dense, gd = _time(logits, y, cal, args.h)
                    row["dense_s"] = dense
                    row["max_rel_grad_diff"] = float(
                        np.max(np.abs(gf - gd)) / max(np.max(np.abs(gd)), 1e-300)
                    )
                    _backends.BINARY_METHOD = "auto"
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
