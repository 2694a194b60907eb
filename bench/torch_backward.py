"""Forward + backward of ECE^KDE in kdecal.torch against autograd through a materialised
n x n implementation: wall time and peak memory (not a pytest file).

Usage: python bench/torch_backward.py [--engine-n 1000,2000,5000,20000]
                                      [--materialised-n 1000,2000,5000] [--repeat 3]

Each configuration runs in a fresh subprocess; its peak memory is the growth of the
process's peak RSS (resource.getrusage ru_maxrss) over the RSS it had after the imports,
the data and a small warm-up call, so it counts torch's and the engine's C++
allocations, which tracemalloc would not see. Times are the best of --repeat runs of
forward + backward (float64, canonical L1 ECE^KDE, h = 0.05, K = 10, real CIFAR-10
predictions resampled as in bench/conftest.py). The materialised version needs several
n x n float64 matrices (about 1 GB at n = 5,000, so about 16 GB at n = 20,000): it is
measured at n <= 5,000 only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

H = 0.05


def materialised_ece(probs, labels, h):
    """L1 ECE^KDE by autograd through the full log-kernel matrix (what the official code does)."""
    import torch

    P = torch.clamp(probs, min=1e-12)
    P = P / P.sum(dim=1, keepdim=True)
    n, K = P.shape
    logk = -torch.lgamma(P / h + 1.0).sum(dim=1)[:, None] + P @ torch.log(P).T / h
    logk = logk.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    W = torch.softmax(logk, dim=0)
    E = W.T @ torch.nn.functional.one_hot(labels, K).to(P.dtype)
    return torch.mean(torch.sum(torch.abs(E - P), dim=1))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(kind: str, n: int, repeat: int) -> dict[str, float]:
    import torch

    import kdecal
    import kdecal.torch as kt

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import cifar10_probs

    p, y = cifar10_probs(n)
    labels = torch.from_numpy(y)

    def step(probs: torch.Tensor, lab: torch.Tensor) -> float:
        x = probs.clone().requires_grad_(True)
        if kind == "engine":
            loss = kt.ece_kde_loss(x, lab, p=1, bandwidth=H)
        else:
            loss = materialised_ece(x, lab, H)
        loss.backward()
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())
        return float(loss)

    step(torch.from_numpy(p[:200]), labels[:200])  # warm-up
    probs = torch.from_numpy(p)
    base = _peak_mb()
    times, value = [], 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = step(probs, labels)
        times.append(time.perf_counter() - t0)
    out = {"n": n, "time_s": min(times), "peak_growth_mb": _peak_mb() - base, "value": value}
    if kind == "engine":  # forward alone (best of the same number of runs), for scale
        fwd = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            kt.ece_kde_loss(probs, labels, p=1, bandwidth=H)
            fwd.append(time.perf_counter() - t0)
        out["forward_s"] = min(fwd)
        out["numpy_value"] = kdecal.ece_kde(p, y, p=1, bandwidth=H)
        out["threads"] = kdecal.get_num_threads()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine-n", default="1000,2000,5000,20000")
    ap.add_argument("--materialised-n", default="1000,2000,5000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        json.dump(run_one(args.one[0], int(args.one[1]), args.repeat), sys.stdout)
        return
    rows = []
    for kind, ns in (("engine", args.engine_n), ("materialised", args.materialised_n)):
        for n in (int(v) for v in ns.split(",") if v):
            res = subprocess.run(
                [sys.executable, __file__, "--one", kind, str(n), "--repeat", str(args.repeat)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            r = json.loads(res.stdout)
            rows.append((kind, r))
            extra = f", forward alone {r['forward_s']:.3f} s" if kind == "engine" else ""
            print(
                f"{kind:>12}  n = {n:>6}: forward + backward {r['time_s']:.3f} s{extra}, "
                f"peak memory growth {r['peak_growth_mb']:.1f} MB, ECE^KDE = {r['value']:.6f}",
                flush=True,
            )
    print("\n| version | n | forward + backward | peak memory growth |")
    print("|---|---|---|---|")
    for kind, r in rows:
        print(f"| {kind} | {r['n']:,} | {r['time_s']:.3f} s | {r['peak_growth_mb']:.1f} MB |")


if __name__ == "__main__":
    main()
