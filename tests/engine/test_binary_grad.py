"""The backward pass of binary problems on the fast engine against the dense one.

``kdecal._engine.binary.loo_grad_k2`` (the query role by two weighted forward passes,
the centre role by ``kdecal._core.binary_grad_centres``) must equal the dense
``kdecal._core.loo_grad`` within 3e-9 of the sum of each accumulator's term magnitudes,
which a float64 brute force materialises (n x n) here; ``kdecal.torch`` losses of
binary problems take it for n >= 2,048 and give the dense engine's gradients.
"""

from __future__ import annotations

import numpy as np
import pytest

from _reference import adversarial_scores
from conftest import load_real_file
from kdecal._engine import backends as _backends
from kdecal._engine import binary as kb
from kdecal._engine import runtime as _runtime

core = _runtime._core
pytestmark = pytest.mark.skipif(
    core is None or not hasattr(core, "binary_grad_centres"), reason="compiled core needed"
)

#: the stated bound, relative to the sum of the terms' magnitudes
BOUND = 3e-9


def _problem(x, y, C, h, seed=0):
    """The backward pass's inputs of the binary problems (1 - x, x) (B, n) at h."""
    logq, p, bias = kb.binary_inputs(np.atleast_2d(x), [h])
    bias = np.ascontiguousarray(bias[:, 0])
    y = np.ascontiguousarray(np.atleast_2d(y), dtype=np.int64)
    s = 1.0 / h
    m, S = _backends.loo_reduce(logq, p, y, C, np.array([s]), bias[:, None, :], backend="cpp")[:2]
    lse = np.ascontiguousarray(m[:, 0] + np.log(S[:, 0].sum(axis=-1)))
    coef = np.random.default_rng(seed).normal(size=(*y.shape, C))
    return logq, p, y, s, bias, lse, coef


def _magnitudes(logq, p, y, s, bias, lse, coef):
    """Brute force: the sums of |terms| of the four outputs of loo_grad, per problem."""
    out = []
    for b in range(p.shape[0]):
        L = bias[b][:, None] + s * (p[b] @ logq[b].T)  # (centre i, query j)
        np.fill_diagonal(L, -np.inf)  # leave one out (the self term may exceed 1)
        W = np.exp(L - lse[b][None, :])
        cc = np.abs(coef[b][:, y[b]].T)  # (i, j): |coef[j, y_i]|
        A = W * cc
        g_logq = s * np.abs(A.T @ p[b])  # (j, k), p >= 0
        g_p = s * (A @ np.abs(logq[b]))
        g_b = A.sum(axis=1)
        rs = A.sum(axis=0)
        out.append((g_logq, g_p, g_b, rs))
    return [np.stack([o[k] for o in out]) for k in range(4)]


def _check(x, y, C, h, what=""):
    args = _problem(x, y, C, h)
    logq, p, y2, s, bias, lse, coef = args
    stats: dict[str, int] = {}
    fast = kb.loo_grad_k2(logq, p, y2, C, s, bias, lse, coef, stats=stats)
    dense = core.loo_grad(logq, p, y2, C, s, bias, lse, coef, 0)
    mags = _magnitudes(*args)
    # the dense pass drops weights below e^-64 (loo_grad.hpp): sums of such terms alone
    # are 0 there
    floor = p.shape[-2] * np.exp(-64.0) * np.max(np.abs(coef)) * (1.0 + s * np.max(-logq))
    for name, a, b, mag in zip(("grad_logq", "grad_p", "grad_bias", "row_sum"), fast, dense, mags):
        assert a.shape == b.shape, name
        err = np.abs(a - b)
        ok = err <= BOUND * mag + floor
        assert np.all(ok), f"{what} h={h} {name}: {np.max(err / np.maximum(mag, 1e-300)):.2e}"
    return stats


@pytest.mark.parametrize("name", list(adversarial_scores()))
@pytest.mark.parametrize("h", [1e-6, 1e-5, 3e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0])
def test_adversarial(name, h):
    x = adversarial_scores()[name]
    y = (np.random.default_rng(6).random(len(x)) < x).astype(np.int64)
    _check(x, y, 2, h, name)


@pytest.mark.parametrize("h", [2e-4, 1e-3, 1e-2, 0.3])
def test_synthetic_top_label_uses_cells(h):
    rng = np.random.default_rng(1)
    x = rng.beta(8, 1, 2500)
    y = (rng.random(2500) < x).astype(np.int64)
    stats = _check(x, y, 2, h)
    # the series do the work (not the exact fallback over all queries)
    assert stats["cells_taylor"] > 0 and stats["fallbacks"] == 0
    assert stats["pairs_direct"] < 0.5 * 2500 * 2500


def test_clustered_near_one_and_fine_cells():
    """A cluster within 1e-3 of 1 (79 % of real CIFAR-10 confidences exceed 0.999) beside
    spread scores: the coarse cell at 1 spans a wide logit range, so its far centres
    need its fine cells; the exact fallback stays rare."""
    rng = np.random.default_rng(7)
    x = np.concatenate([1 - rng.random(1800) * 1e-3, rng.beta(2, 2, 700)])
    y = (rng.random(len(x)) < x).astype(np.int64)
    for h in (1e-5, 2e-4, 1e-2):
        stats = _check(x, y, 2, h, "clustered")
        assert stats["fallbacks"] <= 0.01 * len(x)
        assert stats["pairs_direct"] < 0.3 * len(x) ** 2


@pytest.mark.parametrize("fname", ["cifar10_resnet50_psrcal.npz", "sst2_gpt2_zeroshot.npz"])
def test_real_files(fname):
    prefix = "test_" if fname.startswith("cifar10") else ""
    P, _, y = load_real_file(fname, prefix, "logits")
    idx = np.random.default_rng(3).choice(len(y), min(len(y), 2000), replace=False)
    P, y = P[idx], y[idx]
    correct = (P.argmax(axis=1) == y).astype(np.int64)
    for h in (2e-4, 1e-3, 1e-2):
        _check(P.max(axis=1), correct, 2, h, f"{fname} top-label")


def test_batched_classwise_and_one_class():
    rng = np.random.default_rng(2)
    X = rng.dirichlet(np.ones(3), size=1500).T  # (3, n): three one-vs-rest problems
    Y = (rng.random(X.shape) < X).astype(np.int64)
    _check(X, Y, 2, 1e-2, "batched")
    _check(X[0], np.zeros(1500, np.int64), 1, 1e-3, "one class")
    # one problem, no leading axis: the same numbers as the batch of one
    args = _problem(X[0], Y[0], 2, 1e-2)
    logq, p, y, s, bias, lse, coef = args
    one = kb.loo_grad_k2(logq[0], p[0], y[0], 2, s, bias[0], lse[0], coef[0])
    batch = kb.loo_grad_k2(logq, p, y, 2, s, bias, lse, coef)
    for a, b in zip(one, batch):
        assert np.array_equal(a, b[0])


def test_threads_do_not_change_the_bits():
    rng = np.random.default_rng(4)
    x = rng.beta(5, 1, 3000)
    y = (rng.random(3000) < x).astype(np.int64)
    logq, p, y2, s, bias, lse, coef = _problem(x, y, 2, 1e-3)
    one = core.binary_grad_centres(logq, p, y2, 2, s, bias, lse, coef, 1)
    two = core.binary_grad_centres(logq, p, y2, 2, s, bias, lse, coef, 2)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])


def test_dispatch_and_exact_switch(monkeypatch):
    """loo_grad takes the fast pass for K = 2 float64 at n >= 2,048 and h >= 1e-4; the
    exact switch, float32, smaller n and smaller h keep the dense pass."""
    rng = np.random.default_rng(5)
    x = rng.random(2100)
    y = (rng.random(2100) < x).astype(np.int64)
    logq, p, y2, s, bias, lse, coef = _problem(x, y, 2, 1e-2)
    calls = []
    real = kb.loo_grad_k2
    monkeypatch.setattr(kb, "loo_grad_k2", lambda *a, **k: calls.append(1) or real(*a, **k))
    _backends.loo_grad(logq, p, y2, 2, s, bias, lse, coef)
    assert calls == [1]
    _backends.loo_grad(logq, p, y2, 2, 1.0 / 5e-6, bias, lse, coef)  # h below GRAD_MIN_H
    _backends.loo_grad(
        logq[:, :2000].copy(),
        p[:, :2000].copy(),
        y2[:, :2000].copy(),
        2,
        s,
        bias[:, :2000].copy(),
        lse[:, :2000].copy(),
        coef[:, :2000].copy(),
    )
    assert calls == [1]
    monkeypatch.setattr(_backends, "BINARY_METHOD", "exact")
    _backends.loo_grad(logq, p, y2, 2, s, bias, lse, coef)
    assert calls == [1]


def test_bad_inputs():
    logq, p, y, s, bias, lse, coef = _problem(
        np.array([0.1, 0.5, 0.9]), np.array([0, 1, 1]), 2, 0.1
    )
    bad = y.copy()
    bad[0, 1] = 2
    with pytest.raises(ValueError, match="label 2"):
        core.binary_grad_centres(logq, p, bad, 2, s, bias, lse, coef)
    c2 = coef.copy()
    c2[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="coef must be finite"):
        core.binary_grad_centres(logq, p, y, 2, s, bias, lse, c2)
    with pytest.raises(ValueError, match="scale"):
        core.binary_grad_centres(logq, p, y, 2, -1.0, bias, lse, coef)
    with pytest.raises(ValueError, match="coef"):
        core.binary_grad_centres(logq, p, y, 2, s, bias, lse, coef[..., :1].copy())
    with pytest.raises(ValueError, match="K = 2"):
        core.binary_grad_centres(
            np.zeros((1, 3, 3)), np.zeros((1, 3, 3)), y, 2, s, bias, lse, coef
        )


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-8), ("float32", 1e-4)])
def test_torch_gradients_of_binary_losses_equal_the_dense_pass(monkeypatch, dtype, tol):
    """Top-label and class-wise losses take the fast pass and give the dense pass's
    gradients: float64 to 1e-8 of the largest entry; float32 tensors (their binary
    problems run in float64, the points' larger coordinate made 1 minus the smaller)
    to the dense float32 pass's own rounding (both evaluate |E - f| in float32)."""
    torch = pytest.importorskip("torch")
    import kdecal.torch as kt

    rng = np.random.default_rng(8)
    n, K = 2500, 4
    z = torch.tensor(rng.normal(size=(n, K)) * 3.0, dtype=getattr(torch, dtype))
    y = torch.tensor(rng.integers(0, K, n))
    calls = []
    real = kb.loo_grad_k2
    monkeypatch.setattr(kb, "loo_grad_k2", lambda *a, **k: calls.append(1) or real(*a, **k))
    for cal in ("top_label", "classwise"):
        grads = {}
        for method in ("auto", "exact"):
            monkeypatch.setattr(_backends, "BINARY_METHOD", method)
            a = z.clone().requires_grad_(True)
            loss = kt.ece_kde_loss(torch.softmax(a, 1), y, bandwidth=0.01, calibration=cal)
            assert loss.dtype == z.dtype
            (grads[method],) = torch.autograd.grad(loss, a)
        assert grads["auto"].dtype == z.dtype
        d = (grads["auto"] - grads["exact"]).abs().max() / grads["exact"].abs().max()
        assert float(d) <= tol, cal
    assert len(calls) == 2  # the fast pass served both notions


def test_complement_keeps_the_smaller_coordinate():
    pytest.importorskip("torch")
    from kdecal.torch import _complement

    p = np.array([[[0.3, 0.70000001], [1e-7, 0.9999999], [0.6, 0.4000001], [0.5, 0.5]]])
    out = _complement(p)
    np.testing.assert_array_equal(out[..., 0], [[0.3, 1e-7, 1.0 - 0.4000001, 0.5]])
    np.testing.assert_array_equal(out[..., 1], [[1.0 - 0.3, 1.0 - 1e-7, 0.4000001, 0.5]])
    assert np.all(np.abs(out.sum(-1) - 1.0) <= 2.3e-16)


def test_progress_counts_and_a_failing_callback():
    """The centre pass runs watched (B n rows of progress); an exception from the
    callback stops it and propagates."""
    B, n = 21, 5000  # 1000 B n >= WATCH_MIN_WORK: watched
    assert 1000.0 * B * n >= core.WATCH_MIN_WORK
    rng = np.random.default_rng(3)
    X = rng.beta(5, 1, size=(B, n))
    Y = (rng.random((B, n)) < X).astype(np.int64)
    logq, p, y, s, bias, lse, coef = _problem(X, Y, 2, 1e-2)
    seen: list[int] = []
    core.binary_grad_centres(logq, p, y, 2, s, bias, lse, coef, 0, seen.append)
    assert seen and seen[-1] == B * n and seen == sorted(seen)

    def fail(done: int) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        core.binary_grad_centres(logq, p, y, 2, s, bias, lse, coef, 0, fail)


def test_n_20000_clustered_against_the_dense_pass():
    """A larger problem (no brute force: each output against the dense pass, relative to
    the largest entry of its array), the scores clustered near 1 as real ones are."""
    rng = np.random.default_rng(12)
    n = 20000
    x = np.concatenate([1 - rng.random(15000) * 1e-3, rng.beta(2, 2, 5000)])
    y = (rng.random(n) < x).astype(np.int64)
    for h in (2e-4, 1e-2):
        logq, p, y2, s, bias, lse, coef = _problem(x, y, 2, h)
        stats: dict[str, int] = {}
        fast = kb.loo_grad_k2(logq, p, y2, 2, s, bias, lse, coef, stats=stats)
        dense = core.loo_grad(logq, p, y2, 2, s, bias, lse, coef, 0)
        for a, b in zip(fast, dense):
            assert np.max(np.abs(a - b)) <= 1e-9 * np.max(np.abs(b))
        assert stats["fallbacks"] <= 0.01 * n
