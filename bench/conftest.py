"""Shared helpers for the benchmarks: real CIFAR-10 logits tiled up to the requested n, best-of timing."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"


def best_of(fn, repeat: int = 3) -> tuple[float, object]:
    """Best wall time of ``repeat`` calls of ``fn`` (seconds) and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def cifar10_probs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of real CIFAR-10 predictions (K = 10), resampled with jitter if n > 10k."""
    path = REAL / "cifar10_resnet18_undertrained.npz"
    rng = np.random.default_rng(seed)
    if path.exists():
        with np.load(path) as d:
            logits, labels = d["logits"].astype(np.float64), d["labels"].astype(np.int64)
    else:  # synthetic stand-in with the same shape
        logits = rng.normal(scale=3.0, size=(10000, 10))
        labels = rng.integers(0, 10, size=10000)
    idx = rng.choice(len(labels), size=n, replace=n > len(labels))
    z = logits[idx] + (rng.normal(scale=0.05, size=(n, 10)) if n > len(labels) else 0.0)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p, labels[idx]


@pytest.fixture(scope="session")
def data_cache() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    return {}
