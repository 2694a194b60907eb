"""The engine primitive itself: kdecal._core.loo_reduce (and the numba twin).

Checks the raw accumulators m, S, Q, T against a float64 brute force that
materialises the n x n log-kernel, row chunking, every SIMD path, and the C++
argument checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import gammaln

import kdecal
from kdecal._engine import engines as _engines


def _problem(n, K, C, hs, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, 0.7), size=n)
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    labels = rng.integers(0, C, size=n).astype(np.int64)
    hs = np.asarray(hs, dtype=np.float64)
    bias = np.stack([-gammaln(P / h + 1).sum(axis=1) for h in hs])
    logq = np.ascontiguousarray(np.log(P), dtype=dtype)
    p = np.ascontiguousarray(P, dtype=dtype)
    return P, logq, p, labels, 1.0 / hs, bias


def _brute(P, labels, C, scale, bias):
    """Float64 brute force of (m, S, Q, T) with the n x n matrix."""
    G = np.log(P) @ P.T
    out = []
    for t in range(len(scale)):
        L = bias[t][None, :] + scale[t] * G
        np.fill_diagonal(L, -np.inf)
        m = L.max(axis=1)
        W = np.exp(L - m[:, None])
        S = np.stack([W[:, labels == c].sum(1) for c in range(C)], 1)
        Q = np.stack([(W**2)[:, labels == c].sum(1) for c in range(C)], 1)
        T = np.stack([(W**3)[:, labels == c].sum(1) for c in range(C)], 1)
        out.append((m, S, Q, T))
    return out


def _run(backend, *args):
    return _engines.engine(backend).loo_reduce(*args)


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize(
    "n,K,C", [(37, 3, 3), (300, 10, 10), (290, 2, 1), (120, 5, 7)], ids=lambda v: str(v)
)
def test_accumulators_match_brute_force(backend, n, K, C):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    hs = [3e-4, 0.02, 0.5]
    P, logq, p, labels, scale, bias = _problem(n, K, C, hs)
    m, S, Q, T = _run(backend, logq, p, labels, C, scale, bias, 3, 0, n)
    assert m.shape == (3, n) and S.shape == Q.shape == T.shape == (3, n, C)
    for t, (rm, rS, rQ, rT) in enumerate(_brute(P, labels, C, scale, bias)):
        np.testing.assert_allclose(m[t], rm, rtol=1e-12)
        # power sums relative to the row max: the largest is >= 1, compare absolutely
        for got, want in ((S[t], rS), (Q[t], rQ), (T[t], rT)):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * want.max())


@pytest.mark.parametrize("backend", ["cpp", "numba"])
def test_row_chunks_equal_full_pass(backend):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    n, K, C = 203, 4, 4
    _, logq, p, labels, scale, bias = _problem(n, K, C, [0.01, 0.1], seed=3)
    full = _run(backend, logq, p, labels, C, scale, bias, 2, 0, n)
    parts = [
        _run(backend, logq, p, labels, C, scale, bias, 2, a, b)
        for a, b in [(0, 17), (17, 17), (17, 150), (150, n)]
    ]
    for k in range(3):
        np.testing.assert_array_equal(full[k], np.concatenate([x[k] for x in parts], axis=1))


def test_skipped_chunks_keep_every_class_sum_to_1e12():
    """At small bandwidths the engine skips chunks of 32 centres whose terms are all below
    exp(-64) of a row's running class maximum.  Every (row, class) sum must still match the
    float64 brute force to 1e-12 *relative to itself* (not only to the row's largest sum):
    what is dropped is below n exp(-64) ~ 1e-25 of the class's own sum.  n spans several
    tiles of 256 centres, and the bandwidths skip most chunks (0.003) or few (0.3)."""
    core = kdecal._engine.runtime._core
    if core is None:
        pytest.skip("compiled core not available")
    n, K, C = 1100, 4, 3
    P, logq, p, labels, scale, bias = _problem(n, K, C, [0.003, 0.03, 0.3], seed=7)
    got = core.loo_reduce(logq, p, labels, C, scale, bias, 3, 0, n)
    for t, want in enumerate(_brute(P, labels, C, scale, bias)):
        np.testing.assert_allclose(got[0][t], want[0], rtol=1e-13)
        for k in (1, 2, 3):
            assert want[k].min() > 1e-280  # no sum near underflow in the brute force
            # the log-kernel itself carries a rounding error of about scale * eps (the
            # K-dot is computed in another order), which the k-th power multiplies by k
            rtol = 2e-15 * scale[t] * k + 1e-14
            np.testing.assert_allclose(got[k][t], want[k], rtol=rtol, err_msg=f"{t} {k}")


@pytest.mark.parametrize(
    "n,K,C,ties,empty",
    [
        (1, 3, 1, False, False),
        (5, 10, 2, True, False),
        (31, 2, 5, False, True),
        (32, 3, 5, True, True),
        (33, 1, 2, False, False),
        (257, 10, 5, False, True),
        (300, 2, 2, True, False),
    ],
    ids=lambda v: str(v),
)
def test_chunk_edges_ties_and_empty_classes_agree_with_numba(n, K, C, ties, empty):
    """The compiled engine (chunks of 32 sorted centres, skipped below exp(-64)) against
    the numba engine (no chunks, centres in input order) where chunks split unevenly:
    n = 1, 31, 32, 33, 257; exact ties (half the rows one point); an empty class;
    a partial row range; three bandwidths from 1e-3 to 2.  The sums agree to the
    log-kernel's rounding where both engines keep every term that matters (below)."""
    core = kdecal._engine.runtime._core
    if core is None or "numba" not in kdecal.available_backends():
        pytest.skip("needs both engines")
    rng = np.random.default_rng(n * 7 + K)
    P = rng.dirichlet(np.full(K, 0.3), size=n) if K > 1 else np.ones((n, 1))
    if ties:
        P[: n // 2] = P[0]
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    labels = rng.integers(0, C, size=n).astype(np.int64)
    if empty:
        labels[labels == 1] = 0
    hs = np.array([1e-3, 0.05, 2.0])
    bias = np.stack([-gammaln(P / h + 1).sum(axis=1) for h in hs])
    args = (np.log(P), P, labels, C, 1.0 / hs, bias, 3, n // 4, n)
    a = core.loo_reduce(*args, pairs=True)
    b = _engines.engine("numba").loo_reduce(*args, pairs=True)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12)
    S = a[1]
    assert np.array_equal(S > 0, b[1] > 0)  # the same classes have terms in each row
    # numba drops terms 64 nats below the row's maximum, the compiled engine 64 below
    # the class's: compare the classes within 9 nats of the row's maximum (where both
    # keep every term above exp(-55) of the class's maximum), and pair sums above the
    # estimators' degenerate-row threshold (1e-12 S^2)
    big = S > 1e-4
    assert n == 1 or big.mean() > 0.2
    for k in (1, 2, 3, 4):
        x, y = a[k], b[k]
        assert x.shape == y.shape
        live = big & (np.maximum(x, y) > 1e-12 * S**2) if k == 4 else big
        np.testing.assert_allclose(x[live], y[live], rtol=1e-10, err_msg=str(k))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_order_does_not_change_the_bits(dtype):
    """The engine sums each row's centres in an order of its own (label, predicted class,
    confidence), so permuting the rows permutes the outputs bit for bit: the results do
    not depend on the order in which a user's data arrive."""
    core = kdecal._engine.runtime._core
    if core is None:
        pytest.skip("compiled core not available")
    n, K, C = 613, 6, 6
    _, logq, p, labels, scale, bias = _problem(n, K, C, [0.01, 0.2], seed=8, dtype=dtype)
    perm = np.random.default_rng(9).permutation(n)
    a = core.loo_reduce(logq, p, labels, C, scale, bias, 3, 0, n, pairs=True)
    bias_p = np.ascontiguousarray(bias[:, perm])
    b = core.loo_reduce(logq[perm], p[perm], labels[perm], C, scale, bias_p, 3, 0, n, pairs=True)
    assert len(a) == 5
    for k in range(5):
        np.testing.assert_array_equal(b[k], a[k][:, perm], err_msg=str(k))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_task_size_does_not_change_results(monkeypatch, dtype):
    """Rows grouped 16, 32, 48 or 64 per task (KDECAL_TASK_ROWS) give the same bits.

    Every row is reduced by one thread in the same order whatever the task size; the
    row range and n are not multiples of any task size, so partial tasks are covered.
    """
    core = kdecal._engine.runtime._core
    if core is None:
        pytest.skip("compiled core not available")
    n, K, C = 301, 5, 4
    P, logq, p, labels, scale, bias = _problem(n, K, C, [0.003, 0.05, 0.4], seed=4, dtype=dtype)
    runs = {}
    for rows in ("16", "32", "48", "64"):
        monkeypatch.setenv("KDECAL_TASK_ROWS", rows)
        for nt in (1, 2, 3):
            runs[rows, nt] = core.loo_reduce(
                logq, p, labels, C, scale, bias, 3, 5, 290, n_threads=nt, pairs=True
            )
    first = runs["16", 1]
    assert len(first) == 5
    for key, got in runs.items():
        for k in range(5):
            np.testing.assert_array_equal(got[k], first[k], err_msg=f"{key} [{k}]")
    if dtype is np.float64:
        for t, (rm, rS, rQ, rT) in enumerate(_brute(P, labels, C, scale, bias)):
            np.testing.assert_allclose(first[0][t], rm[5:290], rtol=1e-12)
            np.testing.assert_allclose(first[1][t], rS[5:290], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(first[2][t], rQ[5:290], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(first[3][t], rT[5:290], rtol=1e-9, atol=1e-9)


def test_powers_one_returns_empty_q_t():
    n, K = 40, 3
    _, logq, p, labels, scale, bias = _problem(n, K, K, [0.1])
    _, _, Q, T = kdecal._engine.runtime._core.loo_reduce(
        logq, p, labels, K, scale, bias, 1, 0, n, 0
    )
    assert Q.shape == (0, 0, 0) and T.shape == (0, 0, 0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"labels_shift": 5}, "label"),
        ({"row_stop": 999}, "row_stop"),
        ({"powers": 4}, "powers"),
    ],
)
def test_core_argument_errors(kwargs, match):
    core = kdecal._engine.runtime._core
    if core is None:
        pytest.skip("compiled core not available")
    n, K = 30, 3
    _, logq, p, labels, scale, bias = _problem(n, K, K, [0.1])
    labels = labels + kwargs.get("labels_shift", 0)
    with pytest.raises(ValueError, match=match):
        core.loo_reduce(
            logq,
            p,
            labels,
            K,
            scale,
            bias,
            kwargs.get("powers", 1),
            0,
            kwargs.get("row_stop", n),
            0,
        )


def test_core_rejects_mixed_dtypes():
    core = kdecal._engine.runtime._core
    if core is None:
        pytest.skip("compiled core not available")
    n, K = 30, 3
    _, logq, p, labels, scale, bias = _problem(n, K, K, [0.1])
    with pytest.raises(TypeError):
        core.loo_reduce(logq.astype(np.float32), p, labels, K, scale, bias, 1, 0, n, 0)
    with pytest.raises(TypeError):  # no hidden conversion of int32 labels
        core.loo_reduce(logq, p, labels.astype(np.int32), K, scale, bias, 1, 0, n, 0)


_ISA_SCRIPT = r"""
import json, sys
import numpy as np
from scipy.special import gammaln
import kdecal
from kdecal._engine import runtime as _runtime
rng = np.random.default_rng(7)
n, K = 517, 10
P = rng.dirichlet(np.full(K, 0.5), size=n); P = np.maximum(P, 1e-12); P /= P.sum(1, keepdims=True)
y = rng.integers(0, K, n).astype(np.int64)
hs = np.array([1e-4, 0.01, 0.3])
bias = np.stack([-gammaln(P / h + 1).sum(1) for h in hs])
out = {"isa": _runtime._core.simd_path()}
for dt in ("float64", "float32"):
    m, S, Q, T = _runtime._core.loo_reduce(np.log(P).astype(dt), P.astype(dt), y, K, 1 / hs, bias, 3, 0, n, 0)
    out[dt] = [m.tolist(), S.tolist(), Q.tolist(), T.tolist()]
json.dump(out, sys.stdout)
"""


def _isa_run(isa):
    env = dict(os.environ, KDECAL_ISA=isa)
    res = subprocess.run(
        [sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(res.stdout.splitlines()[-1])


def test_every_simd_path_agrees():
    """The AVX-512, AVX2 and baseline kernels give the same numbers.

    They differ only in rounding (FMA contraction, summation order), amplified by the
    conditioning of exp(G / h): ~1e-16 * |G| / h relative, i.e. ~3e-11 at h = 1e-4.
    """
    if kdecal._engine.runtime._core is None:
        pytest.skip("compiled core not available")
    runs = {isa: _isa_run(isa) for isa in ("avx512", "avx2", "baseline")}
    base = runs["baseline"]
    assert base["isa"] == "baseline"
    for isa, r in runs.items():
        for k in range(4):
            np.testing.assert_allclose(
                np.array(r["float64"][k]),
                np.array(base["float64"][k]),
                rtol=1e-9,
                atol=0,
                err_msg=f"{isa} float64 [{k}]",
            )
            # float32 dot products (~1e-7 * |G| / h relative in L, x3 in T): compare at
            # h = 0.01 and 0.3 only (at 1e-4 the
            # rounding of G in float32 is amplified 1e4 times)
            np.testing.assert_allclose(
                np.array(r["float32"][k])[1:],
                np.array(base["float32"][k])[1:],
                rtol=3e-3,
                atol=1e-6,
                err_msg=f"{isa} float32 [{k}]",
            )


def _child_output(pid: int, r: int, w: int) -> tuple[int, str]:
    """Wait up to 120 s for a forked child (fail if it hangs); its status and output."""
    import time

    os.close(w)
    start = time.monotonic()
    while time.monotonic() - start < 120:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    out = os.read(r, 8192).decode()
    os.close(r)
    return status, out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_numba_in_a_forked_child_raises_or_computes():
    """A helper's probe: after the parent ran backend="numba" on numba's OpenMP layer, a
    forked child was terminated on its first numba call ("fork() called from a process
    already using GNU OpenMP") and multiprocessing.Pool.map never returned. Now the
    child gets a RuntimeError naming the start methods (OpenMP layer), or computes the
    parent's number (the fork-safe layers)."""

    pytest.importorskip("numba")
    import numba

    P = np.random.default_rng(1).dirichlet(np.ones(3), 300)
    y = P.argmax(axis=1)
    want = kdecal.ece_kde(P, y, bandwidth=0.1, backend="numba")  # numba's layer started
    from kdecal._engine import runtime

    assert numba.threading_layer()  # started in this (the parent) process
    gnu_omp = runtime._numba_gnu_omp_started()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            try:
                got = kdecal.ece_kde(P, y, bandwidth=0.1, backend="numba")
                os.write(w, f"value {got!r}".encode())
            except RuntimeError as exc:
                os.write(w, f"error {exc}".encode())
        finally:
            os._exit(0)
    status, out = _child_output(pid, r, w)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, out)
    kind, text = out.split(" ", 1)
    if gnu_omp:
        assert kind == "error" and "'spawn' or 'forkserver'" in text
    else:
        assert kind == "value" and float(text) == want


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_forked_child_computes_instead_of_hanging():
    """A child forked after the engine ran its OpenMP team hung on its first estimate (the
    "fork" start method of multiprocessing, gunicorn, DataLoader workers). The engine runs
    on one thread in such a child, with the same numbers; set_num_threads says why not more."""

    P = np.random.default_rng(0).dirichlet(np.ones(4), 3000)
    y = P.argmax(axis=1)
    want = kdecal.ece_kde(P, y, bandwidth=0.1)  # the parent's OpenMP team has run
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import warnings

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                kdecal.set_num_threads(2)
            got = kdecal.ece_kde(P, y, bandwidth=0.1)
            msg = f"{got!r} {kdecal.get_num_threads()} {len(caught)} {caught[0].message}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    _, out = _child_output(pid, r, w)
    value, threads, n_warn, message = out.split(" ", 3)
    assert float(value) == want and threads == "1" and n_warn == "1"
    assert "forked process: the engine stays on one thread" in message
    assert kdecal.get_num_threads() >= 1  # the parent keeps its own setting
