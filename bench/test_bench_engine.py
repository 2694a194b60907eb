"""Engine benchmarks (pytest-benchmark).  Run: ``pytest bench/ --benchmark-enable``.

Canonical calibration, K = 10, float64, against a materialised NumPy float64
implementation in the same group; each benchmarked result is checked against it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp

import kdecal
from conftest import cifar10_probs

H = 0.05


def numpy_conditional_expectation(p: np.ndarray, y: np.ndarray, h: float) -> np.ndarray:
    """Materialised n x n float64 reference (what peer libraries do)."""
    p = np.maximum(p, kdecal.tolerances.PROB_EPS)
    p = p / p.sum(axis=1, keepdims=True)
    K = p.shape[1]
    L = np.log(p) @ p.T / h - gammaln(p / h + 1).sum(axis=1)[None, :]
    np.fill_diagonal(L, -np.inf)
    den = logsumexp(L, axis=1)
    E = np.empty_like(p)
    for c in range(K):
        Lc = np.where((y == c)[None, :], L, -np.inf)
        E[:, c] = np.exp(logsumexp(Lc, axis=1) - den)
    return E


@pytest.mark.parametrize("n", [1000, 3000, 10000])
@pytest.mark.parametrize("impl", ["cpp", "numba", "numpy"])
def test_conditional_expectation(benchmark, n, impl):
    benchmark.group = f"conditional_expectation n={n} K=10 float64 h={H}"
    p, y = cifar10_probs(n)
    if impl == "numpy":
        if n > 3000:
            pytest.skip("materialised n x n reference limited to n <= 3000 (memory)")
        E = benchmark(numpy_conditional_expectation, p, y, H)
    else:
        if impl not in kdecal.available_backends():
            pytest.skip(f"backend {impl} not available")
        kdecal.conditional_expectation(p[:50], y[:50], bandwidth=H, backend=impl)  # warm-up
        E = benchmark(kdecal.conditional_expectation, p, y, bandwidth=H, backend=impl)
    ref = numpy_conditional_expectation(p[:1000], y[:1000], H) if n > 1000 else None
    if ref is not None:
        E_sub = kdecal.conditional_expectation(p[:1000], y[:1000], bandwidth=H, backend="cpp")
        np.testing.assert_allclose(E_sub, ref, rtol=1e-9, atol=1e-12)
    assert E.shape == (n, 10)
    np.testing.assert_allclose(E.sum(axis=1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("what", ["one_bandwidth", "grid55"])
def test_select_bandwidth_vs_one(benchmark, what):
    """select_bandwidth over the default 55-value grid vs one bandwidth, n = 10,000."""
    n = 10000
    benchmark.group = f"bandwidth selection n={n} K=10 float64"
    p, _ = cifar10_probs(n)
    if what == "one_bandwidth":
        out = benchmark(kdecal.loo_log_likelihood, p, [H])
        assert np.isfinite(out).all()
    else:
        h = benchmark(kdecal.select_bandwidth, p)
        assert h in kdecal.DEFAULT_BANDWIDTH_GRID


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ece_kde_dtype(benchmark, dtype):
    n = 10000
    benchmark.group = f"ece_kde n={n} K=10 h={H}"
    p, y = cifar10_probs(n)
    val = benchmark(kdecal.ece_kde, p.astype(dtype), y, bandwidth=H)
    ref = kdecal.ece_kde(p, y, bandwidth=H)
    assert val == pytest.approx(ref, rel=1e-3 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("what", ["fixed", "auto"])
def test_auto_bandwidth_vs_fixed(benchmark, what):
    """ECE^KDE with bandwidth="auto" (search + estimate) vs at the chosen bandwidth.

    The seeds' synthetic protocol, n = 10,000, K = 10, default debiasing; target: auto
    at most 3x fixed (hard limit 4x). ``bench/search_real.py`` covers the real files.
    """
    s = kdecal.datasets.make_seeds_synthetic(10000, 10, seed=0)
    benchmark.group = "auto bandwidth vs fixed n=10000 K=10 (synthetic)"
    h = kdecal.select_bandwidth(s.probs, s.labels)
    if what == "fixed":
        val = benchmark(kdecal.ece_kde, s.probs, s.labels, bandwidth=h)
    else:
        val = benchmark(kdecal.ece_kde, s.probs, s.labels)
    assert val == pytest.approx(kdecal.ece_kde(s.probs, s.labels, bandwidth=h), rel=1e-12)


@pytest.mark.parametrize("method", ["auto", "exact"])
def test_binary_loss_backward(benchmark, method, monkeypatch):
    """A top-label ECE^KDE loss, forward + backward, n = 20,000, K = 10, float64: the
    fast binary engine (default) against the dense passes (``method="exact"``)."""
    torch = pytest.importorskip("torch")
    import kdecal.torch as kt
    from kdecal._engine import backends

    rng = np.random.default_rng(0)
    z = torch.tensor(rng.normal(size=(20000, 10)) * 2.5)
    y = torch.tensor(rng.integers(0, 10, 20000))
    benchmark.group = "top-label loss forward + backward n=20000 K=10"

    def run():
        a = z.clone().requires_grad_(True)
        loss = kt.ece_kde_loss(torch.softmax(a, 1), y, bandwidth=1e-3, calibration="top_label")
        (g,) = torch.autograd.grad(loss, a)
        return g

    monkeypatch.setattr(backends, "BINARY_METHOD", "exact")
    ref = run()
    monkeypatch.setattr(backends, "BINARY_METHOD", method)
    g = benchmark(run)
    assert float((g - ref).abs().max()) <= 1e-8 * float(ref.abs().max())
