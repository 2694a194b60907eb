"""Progress reporting and Ctrl-C inside one engine call.

The compiled core runs each call on a worker thread and polls it from the calling
thread (kdecal::Control, cpp/bindings/watch.hpp): a progress callback sees the rows
done, and SIGINT or an exception from the callback stops the engine and propagates.
The numba backend runs its rows in short chunks and sees SIGINT between two of them.
Neither changes a single bit of the results.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from scipy.special import gammaln

import kdecal
from kdecal._engine import backends as _backends
from kdecal._engine import runtime as _runtime

needs_cpp = pytest.mark.skipif(_runtime._core is None, reason="compiled core not available")


def _problem(n, K, H, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, 0.7), size=n)
    P = np.maximum(P, 1e-12)
    P /= P.sum(axis=1, keepdims=True)
    labels = rng.integers(0, K, size=n).astype(np.int64)
    hs = np.geomspace(0.005, 0.5, H)
    bias = np.stack([-gammaln(P / h + 1).sum(axis=1) for h in hs])
    logq = np.ascontiguousarray(np.log(P), dtype=dtype)
    p = np.ascontiguousarray(P, dtype=dtype)
    return logq, p, labels, np.ascontiguousarray(1.0 / hs), bias


def _watched(work):
    """Whether the core runs a call of this work on a worker thread (else inline)."""
    return _runtime._core is not None and work >= _runtime._core.WATCH_MIN_WORK


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------- (a) bar on == bar off


@pytest.mark.parametrize("backend", ["cpp", "numba"])
@pytest.mark.parametrize("n", [300, 4500])  # inline (small) and watched calls
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bar_on_and_off_give_the_same_bits(backend, n, dtype, monkeypatch):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    monkeypatch.delenv("KDECAL_PROGRESS", raising=False)
    assert backend == "numba" or _watched(n * n * (2 + 5)) == (n > 300)
    logq, p, labels, scale, bias = _problem(n, 5, 2, dtype=dtype)
    kw = {"powers": 3, "backend": backend}
    off = _backends.loo_reduce(logq, p, labels, 5, scale, bias, progress=False, **kw)
    on = _backends.loo_reduce(logq, p, labels, 5, scale, bias, progress=True, **kw)
    _same(off, on)
    # against the row chunks of the old bar
    edges = [0, 7, n // 2, n]
    parts = [
        _backends.loo_reduce(logq, p, labels, 5, scale, bias, rows=(a, b), progress=False, **kw)
        for a, b in zip(edges[:-1], edges[1:])
    ]
    for k in range(4):
        axis = -1 if k == 0 else -2  # m: (H, R); S, Q, T: (H, R, C)
        np.testing.assert_array_equal(on[k], np.concatenate([x[k] for x in parts], axis=axis))
    # a batch of problems
    lb = np.stack([logq, logq[::-1].copy()])
    pb = np.stack([p, p[::-1].copy()])
    yb = np.stack([labels, labels[::-1].copy()])
    bb = np.stack([bias, bias[:, ::-1].copy()])
    _same(
        _backends.loo_reduce(lb, pb, yb, 5, scale, bb, progress=False, **kw),
        _backends.loo_reduce(lb, pb, yb, 5, scale, bb, progress=True, **kw),
    )


@pytest.mark.parametrize("backend", ["cpp", "numba"])
def test_multi_bar_on_and_off_give_the_same_bits(backend, monkeypatch):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    monkeypatch.delenv("KDECAL_PROGRESS", raising=False)
    n, K, B = 5000, 4, 24
    assert backend == "numba" or _watched(n * n * (K + B / 8))
    logq, p, labels, scale, bias = _problem(n, K, 1, seed=1)
    m = _backends.loo_reduce(logq, p, labels, K, scale, bias, backend="cpp", progress=False)[0][0]
    rng = np.random.default_rng(2)
    sets = rng.integers(0, K, size=(B, n)).astype(np.int64)
    weights = rng.poisson(1.0, size=(B, n)).astype(np.float64)
    args = (logq, p, m, sets, K, float(scale[0]), np.ascontiguousarray(bias[0]), weights)
    off = _backends.loo_reduce_multi(*args, powers=2, backend=backend, progress=False)
    on = _backends.loo_reduce_multi(*args, powers=2, backend=backend, progress=True)
    _same(off, on)


@needs_cpp
def test_grad_bar_on_and_off_give_the_same_bits(monkeypatch):
    monkeypatch.delenv("KDECAL_PROGRESS", raising=False)
    n, K = 3000, 4
    assert _watched(2 * n * n * (2 * K + 2))
    logq, p, labels, scale, bias = _problem(n, K, 1, seed=4)
    rng = np.random.default_rng(5)
    lse = rng.normal(size=n)
    coef = rng.normal(size=(n, K))
    args = (logq, p, labels, K, float(scale[0]), np.ascontiguousarray(bias[0]), lse, coef)
    off = _backends.loo_grad(*args, progress=False)
    on = _backends.loo_grad(*args, progress=True)
    _same(off, on)
    _same(off, _runtime._core.loo_grad(*args, 1))  # one thread, no watcher callback


# ------------------------------------------------------- (c) the progress callback


@needs_cpp
@pytest.mark.parametrize("n", [200, 6000])
def test_progress_counts_increase_to_the_total(n):
    core = _runtime._core
    assert _watched(n * n * (3 + 8)) == (n > 200)
    logq, p, labels, scale, bias = _problem(n, 8, 3)
    seen = []
    out = core.loo_reduce(logq, p, labels, 8, scale, bias, 1, 0, n, 0, progress=seen.append)
    assert seen and seen[-1] == n
    assert np.all(np.diff(seen) > 0)
    _same(out, core.loo_reduce(logq, p, labels, 8, scale, bias, 1, 0, n, 0))
    # a row range of a batch: counted over the batch
    seen.clear()
    lb, pb, yb, bb = (np.stack([x, x]) for x in (logq, p, labels, bias))
    core.loo_reduce(lb, pb, yb, 8, scale, bb, 1, 10, n - 5, 0, progress=seen.append)
    assert np.all(np.diff(seen) > 0) and seen[-1] == 2 * (n - 15)


@needs_cpp
def test_progress_of_grad_and_multi():
    core = _runtime._core
    n, K = 5000, 6
    assert _watched(2 * n * n * (2 * K + 2)) and _watched((n - 100) * n * (K + 16 / 8))
    logq, p, labels, scale, bias = _problem(n, K, 1, seed=6)
    b0 = np.ascontiguousarray(bias[0])
    seen = []
    core.loo_grad(
        logq, p, labels, K, float(scale[0]), b0, np.zeros(n), np.ones((n, K)), 0,
        progress=seen.append,
    )  # fmt: skip
    assert np.all(np.diff(seen) > 0) and seen[-1] == 2 * n  # two passes
    m = core.loo_reduce(logq, p, labels, K, scale[:1], bias[:1], 1, 0, n, 0)[0][0]
    sets = np.random.default_rng(7).integers(0, K, size=(16, n)).astype(np.int64)
    seen.clear()
    core.loo_reduce_multi(
        logq, p, m, sets, K, float(scale[0]), b0, None, 1, 100, n, 0, progress=seen.append
    )
    assert np.all(np.diff(seen) > 0) and seen[-1] == n - 100


def test_numba_progress_counts_increase_to_the_total():
    if "numba" not in kdecal.available_backends():
        pytest.skip("numba not available")
    from kdecal._engine import numba as _numba

    n = 3000
    logq, p, labels, scale, bias = _problem(n, 4, 2)
    seen = []
    _numba.loo_reduce(logq, p, labels, 4, scale, bias, 1, 5, n, progress=seen.append)
    assert np.all(np.diff(seen) > 0) and seen[-1] == n - 5


class _Terminal:
    """A text stream that says it is a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_automatic_bars_show_on_a_terminal_only(monkeypatch, capsys):
    """progress=None: long work gets a bar on a terminal, none in a file or a pipe."""
    monkeypatch.delenv("KDECAL_PROGRESS", raising=False)
    big = 10.0 * _runtime.PROGRESS_MIN_WORK
    assert _runtime.show_progress(big, None) is None  # automatic
    assert _runtime.show_progress(1.0, None) is False  # short work
    assert _runtime.show_progress(1.0, True) is True
    assert _runtime.show_progress(big, False) is False
    monkeypatch.setenv("KDECAL_PROGRESS", "0")
    assert _runtime.show_progress(big, True) is False
    monkeypatch.delenv("KDECAL_PROGRESS")
    # pytest's capture is not a terminal: no bar and no callback (long calls still run
    # watched, so that Ctrl-C stops them)
    with _runtime.progress_bar(None, 10, "kdecal test bar") as cb:
        assert cb is None
    with _runtime.progress_bar(True, 10, "kdecal forced bar") as cb:
        assert cb is not None
        cb(10)
    err = capsys.readouterr().err
    assert "kdecal test bar" not in err and "kdecal forced bar" in err
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    with _runtime.progress_bar(None, 10, "kdecal test bar") as cb:
        assert cb is not None
        cb(10)
    assert "kdecal test bar" in tty.text and "/10 " in tty.text


def test_cli_writes_no_bar_into_a_log(monkeypatch, capsys, tmp_path):
    """kdecal evaluate with its output in a file: the report, no carriage-return bars."""
    from kdecal import cli

    monkeypatch.delenv("KDECAL_PROGRESS", raising=False)
    monkeypatch.setattr(_runtime, "PROGRESS_MIN_WORK", 0.0)  # every pass is long work
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(3), size=150)
    y = np.array([rng.choice(3, p=p) for p in P])
    path = tmp_path / "preds.npz"
    np.savez(path, probs=P, labels=y)
    assert cli.main(["evaluate", str(path), "--n-resamples", "9"]) == 0
    out, err = capsys.readouterr()
    assert "kdecal calibration report" in out
    assert "kdecal LOO" not in err and "\r" not in err


# --------------------------------------------- (d) an exception from the callback


class _Stop(Exception):
    pass


@needs_cpp
@pytest.mark.parametrize("which", ["loo_reduce", "loo_grad", "loo_reduce_multi"])
def test_callback_exception_propagates_and_stops_the_engine(which):
    core = _runtime._core
    n, K = 30000, 10
    logq, p, labels, scale, bias = _problem(n, K, 8, seed=8)
    b0 = np.ascontiguousarray(bias[0])
    seen = []

    def cb(done):
        seen.append(done)
        raise _Stop(f"stop at {done}")

    if which == "loo_reduce":
        call = lambda: core.loo_reduce(logq, p, labels, K, scale, bias, 3, 0, n, 0, progress=cb)
    elif which == "loo_grad":
        call = lambda: core.loo_grad(
            logq, p, labels, K, float(scale[0]), b0, np.zeros(n), np.ones((n, K)), 0, progress=cb
        )
    else:
        m = np.zeros(n)
        sets = np.zeros((64, n), dtype=np.int64)
        call = lambda: core.loo_reduce_multi(
            logq, p, m, sets, K, float(scale[0]), b0, None, 2, 0, n, 0, progress=cb
        )
    t = time.perf_counter()
    with pytest.raises(_Stop, match="stop at"):
        call()
    elapsed = time.perf_counter() - t
    assert len(seen) == 1 and 0 < seen[0] < (2 * n if which == "loo_grad" else n)
    assert elapsed < 5.0  # the full call takes far longer


@needs_cpp
def test_engine_errors_still_raise_valueerror_from_the_worker():
    core = _runtime._core
    n = 4000
    assert _watched(n * n * (4 + 4))  # the error is raised on the worker thread
    logq, p, labels, scale, bias = _problem(n, 4, 4)
    labels[17] = 9
    with pytest.raises(ValueError, match="label 9 at index 17"):
        core.loo_reduce(logq, p, labels, 4, scale, bias, 1, 0, n, 0, progress=lambda d: None)


# ------------------------------------------------------------------ (b) Ctrl-C


_CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from scipy.special import gammaln
    import kdecal
    from kdecal._engine import backends as _backends

    which, backend = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    # seconds of work on 2 threads and on many: n grows with the root of the threads
    # (on 16 threads, n = 60,000 makes the single-bandwidth calls end within 1 s)
    n = int(60000 * max(1.0, kdecal.get_num_threads() / 2) ** 0.5)
    K, H = 10, 20
    P = rng.dirichlet(np.ones(K), size=n)
    y = rng.integers(0, K, n).astype(np.int64)
    hs = np.geomspace(0.01, 0.5, H)
    bias = np.stack([-gammaln(P / h + 1).sum(1) for h in hs])
    logq = np.log(P)
    # warm up (numba: compile or load the cache) before the clock starts
    _backends.loo_reduce(logq[:50], P[:50], y[:50], K, 1 / hs, bias[:, :50].copy(),
                         backend=backend, progress=False)
    # 8 label sets: outputs of (8, n, K) as in kdecal's resampling, whose chunks of label
    # sets hold 64 MB of sums (far more would make the first touch of the output pages
    # the longest step)
    sets = rng.integers(0, K, (8, n)).astype(np.int64)
    # one bandwidth's backward pass takes about 1.4 s at this n on 2 threads, too close
    # to the signal's delay: twice the rows (4x the pairs) for loo_grad
    n2 = 2 * n
    P2 = rng.dirichlet(np.ones(K), size=n2)
    y2 = rng.integers(0, K, n2).astype(np.int64)
    b2 = -gammaln(P2 / hs[0] + 1).sum(1)
    print("started", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        if which == "loo_reduce":
            _backends.loo_reduce(logq, P, y, K, 1 / hs, bias, backend=backend, progress=False)
        elif which == "loo_grad":
            _backends.loo_grad(np.log(P2), P2, y2, K, 1 / hs[0], b2, np.zeros(n2),
                               np.ones((n2, K)), progress=False)
        else:
            _backends.loo_reduce_multi(logq, P, np.zeros(n), sets, K, 1 / hs[-1], bias[-1],
                                       None, powers=2, backend=backend, progress=False)
    finally:
        print(f"elapsed {time.perf_counter() - t0:.3f}", file=sys.stderr, flush=True)
    print("finished", file=sys.stderr, flush=True)
    """
)


def _interrupt(argv, *, delay=1.5, marker="started", timeout=60.0):
    """Start argv, wait for `marker` on its stderr, SIGINT it `delay` s later.

    Returns (exit status, seconds from SIGINT to exit, stderr).
    """
    env = dict(os.environ, KDECAL_PROGRESS="0")
    lines = []
    with subprocess.Popen(
        argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    ) as proc:
        try:
            deadline = time.monotonic() + timeout
            for line in proc.stderr:
                lines.append(line)
                if line.startswith(marker):
                    break
                assert time.monotonic() < deadline, "the child never started"
            else:
                pytest.fail("the child exited before starting: " + "".join(lines))
            time.sleep(delay)
            assert proc.poll() is None, "the call finished before the signal: make it longer"
            t = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=timeout)
            stop = time.monotonic() - t
            lines.append(proc.stderr.read())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rc, stop, "".join(lines)


@pytest.mark.parametrize(
    "which,backend",
    [("loo_reduce", "cpp"), ("loo_reduce", "numba"), ("loo_grad", "cpp"),
     ("loo_reduce_multi", "cpp")],
)  # fmt: skip
def test_sigint_stops_a_long_engine_call(which, backend):
    if backend not in kdecal.available_backends():
        pytest.skip(f"{backend} not available")
    if which == "loo_grad" and _runtime._core is None:
        pytest.skip("compiled core not available")
    rc, stop, err = _interrupt([sys.executable, "-c", _CHILD, which, backend])
    assert "KeyboardInterrupt" in err, err
    assert "finished" not in err
    assert rc != 0
    # seconds, not the minutes the full call takes (generous: CI machines are loaded)
    assert stop < 5.0, (stop, err)


def test_cli_evaluate_quiet_exits_130_on_sigint(tmp_path):
    rng = np.random.default_rng(3)
    n, K = 60000, 10
    logits = rng.normal(scale=2.0, size=(n, K)).astype(np.float32)
    labels = rng.integers(0, K, size=n)
    path = tmp_path / "big.npz"
    np.savez(path, logits=logits, labels=labels)
    child = (
        "import sys; from kdecal.cli import main; "
        "print('started', file=sys.stderr, flush=True); "
        f"sys.exit(main(['evaluate', {str(path)!r}, '--quiet']))"
    )
    rc, stop, err = _interrupt([sys.executable, "-c", child], delay=2.0)
    assert rc == 130, err
    assert stop < 5.0, (stop, err)
