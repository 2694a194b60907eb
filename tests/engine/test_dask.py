"""backend="dask": the leave-one-out reduction in row blocks on a dask.distributed cluster.

The reference is the in-process compiled engine (backend="cpp"): every query row's
accumulators depend on that row and on all centres only, in the same order whatever the
row block, so the dask results must equal the cpp ones exactly (the promise is 1e-12
relative; the tests hold it to equality). A task stream records which tasks ran where,
so every comparison also checks that the work really went through several blocks on
the workers.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

# the papers' plug-in estimators against the plug-in brute force of _reference.py
pytestmark = pytest.mark.usefixtures("plugin_estimator")

pytest.importorskip("dask", reason='backend="dask" needs dask: pip install "kdecal[dask]"')
distributed = pytest.importorskip(
    "distributed", reason='backend="dask" needs dask.distributed: pip install "kdecal[dask]"'
)
da = pytest.importorskip("dask.array", reason="dask.array needs numpy-compatible dask")

import kdecal
from conftest import make_synthetic
from kdecal._engine import dask as _dask

NOTIONS = ("canonical", "top_label", "classwise")
DEBIAS = ("none", "ustat", "ratio")


@pytest.fixture(scope="module")
def client():
    """Two single-threaded worker processes, shared by the module (one start-up)."""
    if "cpp" not in kdecal.available_backends():
        pytest.skip("backend='dask' runs kdecal's compiled core, which is not built here")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    c = distributed.Client(cluster)
    # small blocks so that even these small problems go out in several tasks
    old = _dask.MIN_BLOCK_WORK
    _dask.MIN_BLOCK_WORK = 1e4
    try:
        yield c
    finally:
        _dask.MIN_BLOCK_WORK = old
        _dask.clear_cache()
        c.close()
        cluster.close()


@pytest.fixture(scope="module")
def data():
    P, y = make_synthetic(500, 4, alpha=0.7, temperature=0.5, seed=11)
    return P, y


def _on_cluster(client, fn, *args, **kwargs):
    """Run ``fn`` and return its result and the kdecal tasks the workers ran."""
    with distributed.get_task_stream(client) as ts:
        out = fn(*args, **kwargs)
    tasks = [t for t in ts.data if str(t["key"]).startswith("kdecal-loo")]
    return out, tasks


def _assert_distributed(tasks, min_blocks=2):
    assert len(tasks) >= min_blocks, f"only {len(tasks)} kdecal task(s) ran on the cluster"


def test_plan_blocks(monkeypatch):
    """Blocks tile the rows in order; their number follows the work and the threads."""
    monkeypatch.setattr(_dask, "BLOCKS_PER_THREAD", 3)
    old = _dask.MIN_BLOCK_WORK, _dask.MAX_BLOCK_WORK
    try:
        _dask.MIN_BLOCK_WORK, _dask.MAX_BLOCK_WORK = 2e8, 2e12
        # total work 1e9: at most 5 blocks of >= 2e8, although 2 threads want 6
        assert _dask.plan_blocks(0, 1000, 1e6, 2) == [
            (0, 200), (200, 400), (400, 600), (600, 800), (800, 1000)
        ]  # fmt: skip
        # large work: 3 blocks per thread
        b = _dask.plan_blocks(10, 1010, 1e9, 2)
        assert len(b) == 6 and b[0] == (10, 176) and b[-1] == (843, 1010)
        # very large work: blocks of at most MAX_BLOCK_WORK
        b = _dask.plan_blocks(0, 10_000, 1e10, 2)
        assert len(b) == 50 and all(s - a == 200 for a, s in b)
        # small work: one block; no rows: none
        assert _dask.plan_blocks(5, 9, 10.0, 100) == [(5, 9)]
        assert _dask.plan_blocks(7, 7, 1e9, 2) == []
    finally:
        _dask.MIN_BLOCK_WORK, _dask.MAX_BLOCK_WORK = old


@pytest.mark.parametrize("debias", DEBIAS)
@pytest.mark.parametrize("calibration", NOTIONS)
def test_estimate_equals_cpp(client, data, calibration, debias):
    """Every quantity of an estimate (fixed bandwidth) equals backend='cpp' exactly."""
    P, y = data
    kw = {"bandwidth": 0.05, "calibration": calibration, "debias": debias}
    ref = kdecal.estimate(P, y, backend="cpp", **kw)
    est, tasks = _on_cluster(client, kdecal.estimate, P, y, backend="dask", **kw)
    _assert_distributed(tasks)
    assert est.backend == "dask"
    for q in ("ece_kde_l1", "ece_kde_l2", "ce_l2", "ce_kl", "refinement_l2", "sharpness_l2"):
        assert est.value(q) == ref.value(q), q
    np.testing.assert_array_equal(est._est.E, ref._est.E)
    if debias != "none":
        np.testing.assert_array_equal(est._est.sq, ref._est.sq)


def test_residual_sums_by_blocks_on_dask(client, data, monkeypatch):
    """Where the in-pass residual sums would need a large scratch on each worker thread
    (many classes), the workers run the pass without them and the client forms them from
    blocks of kernel weights, as backend="cpp" does: the same numbers as cpp's, and
    those of the in-pass sums to rounding."""
    from kdecal._engine import backends as be

    P, y = data
    # (this module's default estimator is the plug-in: the residual one by name)
    kw = {"bandwidth": 0.05, "calibration": "canonical", "estimator": "residual"}
    in_pass = kdecal.estimate(P, y, backend="cpp", **kw)
    monkeypatch.setattr(be, "RESIDUAL_SCRATCH_BYTES", 0.0)
    ref = kdecal.estimate(P, y, backend="cpp", **kw)
    calls = []
    blocks = be._residual_sums_by_blocks

    def spy(*args, **kwargs):
        calls.append(args[-1])  # the engine of the blocks
        return blocks(*args, **kwargs)

    monkeypatch.setattr(be, "_residual_sums_by_blocks", spy)
    est, tasks = _on_cluster(client, kdecal.estimate, P, y, backend="dask", **kw)
    _assert_distributed(tasks)
    assert calls and set(calls) == {"cpp"}  # formed on the client, not in the workers' pass
    for q in ("ece_kde_l1", "ce_l2", "ce_kl", "refinement_l2"):
        assert est.value(q) == ref.value(q), q
        assert est.value(q) == pytest.approx(in_pass.value(q), rel=1e-10, abs=1e-14), q


@pytest.mark.parametrize("estimator", ["residual", "plugin"])
@pytest.mark.parametrize("calibration", ["top_label", "classwise"])
def test_binary_problems_on_the_fast_engine_equal_cpp(client, calibration, estimator):
    """Binary problems of n >= 2,048 run the fast binary engine in row blocks.

    Each block plans all the centres and sums its own query rows, one thread each: the
    automatic bandwidth (the search on all rows) and every quantity equal the in-process
    engine's (two threads, all rows at once) exactly.
    """
    P, y = make_synthetic(5000, 4, alpha=0.7, temperature=0.5, seed=3)
    kw = {"calibration": calibration, "estimator": estimator}
    ref = kdecal.estimate(P, y, backend="cpp", **kw)
    est, tasks = _on_cluster(client, kdecal.estimate, P, y, backend="dask", **kw)
    binary = [t for t in tasks if str(t["key"]).startswith("kdecal-loo-binary")]
    assert len(binary) >= 2, [t["key"] for t in tasks]
    assert est.bandwidth == ref.bandwidth and est.bandwidth_l2 == ref.bandwidth_l2
    for q in ("ece_kde_l1", "ece_kde_l2", "ce_l2", "ce_kl", "refinement_l2"):
        assert est.value(q) == ref.value(q), q


@pytest.mark.parametrize("estimator", ["residual", "plugin"])
@pytest.mark.parametrize("calibration", ["top_label", "classwise"])
def test_binary_replicates_on_the_workers_equal_cpp(client, calibration, estimator):
    """The bootstrap and consistency replicates of binary problems (n >= 4,096) run as
    tasks of the fast binary engine on the workers (a few replicates each, one thread),
    and every replicate equals the in-process ones (replicates side by side on two
    threads) exactly."""
    from kdecal._estimation import replicates as _replicates

    n = _replicates.BINARY_REPLICATES_MIN_N
    P, y = make_synthetic(n, 4, alpha=0.7, temperature=0.5, seed=5)
    kw = {"calibration": calibration, "estimator": estimator}
    ref = kdecal.estimate(P, y, backend="cpp", **kw)
    est = kdecal.estimate(P, y, backend="dask", **kw)
    names = ["ece_kde_l1", "ce_l2"]
    want = ref._intervals_and_tests(names, names, level=0.9, n_resamples=5, seed=4)
    with distributed.get_task_stream(client) as ts:
        got = est._intervals_and_tests(names, names, level=0.9, n_resamples=5, seed=4)
    tasks = [t for t in ts.data if str(t["key"]).startswith("kdecal-replicates-binary")]
    assert len(tasks) >= 2, [t["key"] for t in ts.data]
    for q in names:
        np.testing.assert_array_equal(
            got[0][q].bootstrap_distribution, want[0][q].bootstrap_distribution
        )
        np.testing.assert_array_equal(got[1][q].null_distribution, want[1][q].null_distribution)


@pytest.mark.parametrize("calibration", NOTIONS)
def test_public_functions_equal_cpp(client, data, calibration):
    """Each engine-backed public function, bandwidth 'auto' (the search), equals cpp."""
    P, y = data
    calls = {
        "ece_kde_p1": lambda b: kdecal.ece_kde(P, y, calibration=calibration, backend=b),
        "ece_kde_p2": lambda b: kdecal.ece_kde(P, y, p=2, calibration=calibration, backend=b),
        "calibration_error_kl": lambda b: kdecal.calibration_error(
            P, y, divergence="kl", calibration=calibration, backend=b
        ),
        "refinement": lambda b: kdecal.refinement(P, y, calibration=calibration, backend=b),
        "sharpness": lambda b: kdecal.sharpness(P, y, calibration=calibration, backend=b),
        "select_bandwidth": lambda b: kdecal.select_bandwidth(
            P, y, calibration=calibration, backend=b
        ),
    }
    for name, call in calls.items():
        ref = call("cpp")
        out, tasks = _on_cluster(client, call, "dask")
        _assert_distributed(tasks)
        assert out == ref, name
        assert np.isfinite(ref) and ref != 0.0, name


def test_conditional_expectation_and_likelihood_equal_cpp(client, data):
    """Arrays: LOO conditional expectations and log likelihoods at many bandwidths."""
    P, y = data
    ref = kdecal.conditional_expectation(P, y, bandwidth=0.1, backend="cpp")
    out, tasks = _on_cluster(
        client, kdecal.conditional_expectation, P, y, bandwidth=0.1, backend="dask"
    )
    _assert_distributed(tasks)
    assert out.shape == (500, 4)
    np.testing.assert_array_equal(out, ref)
    hs = np.logspace(-3, 0, 7)
    ref = kdecal.loo_log_likelihood(P, hs, backend="cpp")
    out, tasks = _on_cluster(client, kdecal.loo_log_likelihood, P, hs, backend="dask")
    _assert_distributed(tasks)
    np.testing.assert_array_equal(out, ref)
    for kw in ({}, {"criterion": "loo-mle"}, {"grid": hs}):
        assert kdecal.select_bandwidth(P, y, backend="dask", **kw) == kdecal.select_bandwidth(
            P, y, backend="cpp", **kw
        ), kw


def test_evaluate_equals_cpp(client, data):
    """evaluate: estimates, bootstrap intervals and tests (the multi-label pass) equal cpp."""
    P, y = data
    kw = {"n_resamples": 8, "notions": ("canonical", "top_label"), "calibration_loss": False}
    ref = kdecal.evaluate(P, y, backend="cpp", **kw).to_dict()
    out, tasks = _on_cluster(client, kdecal.evaluate, P, y, backend="dask", **kw)
    out = out.to_dict()
    assert any(str(t["key"]).startswith("kdecal-loo-multi") for t in tasks)
    assert out.pop("backend") == "dask" and ref.pop("backend") == "cpp"
    out.pop("wall_time_s"), ref.pop("wall_time_s")
    assert out == ref
    ci = ref["notions"]["canonical"]["ece_kde_l1_ci"]
    assert ci[0] < ci[1]  # a real interval came out of the resamples


def test_dask_array_input(client, data):
    """Dask arrays chunked by rows (also along K, and binary 1-D) give the same numbers."""
    P, y = data
    ref = kdecal.ece_kde(P, y, bandwidth=0.05, p=2, backend="cpp")
    for chunks in ((120, 4), (100, 2)):
        Pd = da.from_array(P, chunks=chunks)
        yd = da.from_array(y, chunks=120)
        out, tasks = _on_cluster(
            client, kdecal.ece_kde, Pd, yd, bandwidth=0.05, p=2, backend="dask"
        )
        assert any(str(t["key"]).startswith("kdecal-loo") for t in tasks)
        assert out == ref, chunks
    # float32 input keeps the float32 kernel
    ref32 = kdecal.ece_kde(P.astype(np.float32), y, bandwidth=0.05, backend="cpp")
    out32 = kdecal.ece_kde(
        da.from_array(P.astype(np.float32), chunks=(120, 4)), y, bandwidth=0.05, backend="dask"
    )
    assert out32 == ref32 != kdecal.ece_kde(P, y, bandwidth=0.05, backend="cpp")
    # binary P(y = 1)
    q, yb = P[:, 1] / (P[:, 0] + P[:, 1]), (y == 1).astype(np.int64)
    refb = kdecal.ece_kde(q, yb, bandwidth=0.05, backend="cpp")
    assert kdecal.ece_kde(da.from_array(q, chunks=90), yb, bandwidth=0.05, backend="dask") == refb


def test_dask_array_bad_row_names_block(client, data):
    """A bad row of a dask array fails with the block's rows and the in-block index."""
    P, y = data
    bad = P.copy()
    bad[263, 2] = np.nan
    with pytest.raises(
        ValueError, match=r"rows 200\.\.299 .*non-finite value .*nan.* at index \(63, 2\)"
    ):
        kdecal.ece_kde(da.from_array(bad, chunks=(100, 4)), y, bandwidth=0.1, backend="dask")
    bad = P.copy()
    bad[7] *= 1.5
    with pytest.raises(ValueError, match=r"rows 0\.\.99 .*row 7 sums to"):
        kdecal.ece_kde(da.from_array(bad, chunks=(100, 4)), y, bandwidth=0.1, backend="dask")
    with pytest.raises(ValueError, match="at least 3 samples"):
        kdecal.ece_kde(da.from_array(P[:2]), y[:2], bandwidth=0.1, backend="dask")
    with pytest.raises(TypeError, match="numeric"):
        kdecal.ece_kde(da.from_array(P.astype(str)), y, bandwidth=0.1, backend="dask")


def test_dask_array_renormalised_rows_warn(client, data):
    """The blocks' warnings (rows renormalised) reach the caller, naming the blocks."""
    P, y = data
    off = P.copy()
    off[[150, 420]] *= 1.01  # 1 % off: renormalised with a warning, like a NumPy input
    with pytest.warns(kdecal.RenormalizationWarning) as rec:
        ref = kdecal.ece_kde(off, y, bandwidth=0.05, backend="cpp")
    assert len(rec) == 1
    with pytest.warns(kdecal.RenormalizationWarning) as rec:
        out = kdecal.ece_kde(
            da.from_array(off, chunks=(100, 4)), y, bandwidth=0.05, backend="dask"
        )
    assert out == ref
    msgs = sorted(str(w.message) for w in rec)
    assert len(msgs) == 2
    assert "starting at row 100 " in msgs[0] and "row 50)" in msgs[0]
    assert "starting at row 400 " in msgs[1] and "row 20)" in msgs[1]


def test_dask_array_block_warnings_on_threads():
    """On the threaded scheduler the blocks are validated at once on several threads, and
    ``warnings.catch_warnings`` swaps process-wide state: the captures interleaved, so a
    call re-issued 1 or all 136 of its blocks' warnings at random (the rest escaped the
    capture, or were lost) and could leave an "always" filter installed. Each call now
    collects every block's warning (one per distinct message, naming the blocks), and
    the filters are as before."""
    import warnings

    import dask

    from kdecal._validation import check_probs_dask

    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(3), size=8000)
    bad = np.arange(0, 8000, 100)[::2] + 7  # one renormalised row in every other block
    P[bad] *= 1.01
    x = da.from_array(P, chunks=(100, 3))
    before = list(warnings.filters)
    for _ in range(8):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            with dask.config.set(scheduler="threads", num_workers=8):
                check_probs_dask(x)
        # the blocks' identical messages, one warning naming the first five blocks
        assert len(rec) == 1, [str(w.message)[:60] for w in rec]
        assert issubclass(rec[0].category, kdecal.RenormalizationWarning)
        assert "starting at row 0, 200, 400, 600, 800, ... (row" in str(rec[0].message)
        assert list(warnings.filters) == before


def test_progress_report(client, data, monkeypatch, capsys):
    """progress=True shows dask's own progress bar over the tasks."""
    P, y = data
    monkeypatch.setenv("KDECAL_PROGRESS", "1")
    kdecal.estimate(P, y, bandwidth=0.1, backend="dask", progress=True)
    assert "100% Completed" in capsys.readouterr().out


def test_no_client_and_no_dask(monkeypatch, data):
    """Clear errors: no current client (ValueError), dask not installed (ImportError)."""
    P, y = data

    def none():
        raise ValueError("No clients found")

    monkeypatch.setattr(distributed, "default_client", none)
    with pytest.raises(ValueError, match="no.*client.*Client\\("):
        kdecal.ece_kde(P, y, bandwidth=0.1, backend="dask")
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ImportError, match=r'pip install "kdecal\[dask\]"'):
        kdecal.ece_kde(P, y, bandwidth=0.1, backend="dask")
    with pytest.raises(ValueError, match="'dask'"):
        kdecal.ece_kde(P, y, bandwidth=0.1, backend="dusk")


def test_lost_inputs_are_broadcast_again(client, data, monkeypatch):
    """Where a lost worker took the only replica of an input (the scheduler's active
    memory manager reduces the broadcast replicas between calls), the call's futures end
    as cancelled: the call broadcasts its inputs again and reruns, up to
    LOST_INPUT_RETRIES times, and equals the in-process result; beyond, the error
    propagates. The same for map_ordered, from the task that was lost."""
    from distributed.client import FutureCancelledError

    P, _ = data
    hs = np.array([0.05, 0.2])
    ref = kdecal.loo_log_likelihood(P, hs, backend="cpp")
    real = _dask._run_blocks
    calls = []

    def lose(n_lost):
        def run(*args, **kwargs):
            calls.append(1)
            if len(calls) <= n_lost:
                raise FutureCancelledError("lost", "already forgotten")
            return real(*args, **kwargs)

        return run

    kdecal.loo_log_likelihood(P, hs, backend="dask")  # the centres now cached
    cleared = []
    real_clear = _dask.clear_cache
    monkeypatch.setattr(_dask, "clear_cache", lambda: (cleared.append(1), real_clear()))
    monkeypatch.setattr(_dask, "_run_blocks", lose(_dask.LOST_INPUT_RETRIES))
    out = kdecal.loo_log_likelihood(P, hs, backend="dask")
    np.testing.assert_array_equal(out, ref)
    assert len(calls) == _dask.LOST_INPUT_RETRIES + 1
    assert len(cleared) == _dask.LOST_INPUT_RETRIES  # the cached replicas dropped each time
    calls.clear()
    monkeypatch.setattr(_dask, "_run_blocks", lose(_dask.LOST_INPUT_RETRIES + 1))
    with pytest.raises(FutureCancelledError):
        kdecal.loo_log_likelihood(P, hs, backend="dask")
    monkeypatch.setattr(_dask, "_run_blocks", real)

    # map_ordered: the first future of the second task cancelled (as a lost input
    # ends it); the tasks are rerun from there, in order
    submitted = []
    real_submit = client.submit

    def submit(fn, *args, key=None, **kwargs):
        fut = real_submit(fn, *args, key=key, **kwargs)
        submitted.append(key)
        if key.endswith("-0-1"):
            client.cancel(fut)
        return fut

    monkeypatch.setattr(client, "submit", submit)
    got = list(_dask.map_ordered(np.add, (np.arange(3.0),), [(i,) for i in range(5)], "t"))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, np.arange(3.0) + i)
    assert any(k.endswith("-1-1") for k in submitted)  # task 1 again, after the loss


def test_worker_killed_mid_call(client, monkeypatch):
    """A worker process killed during a call: dask reruns its blocks, the result is unchanged.

    Runs last in the module (it restarts a worker of the shared cluster).
    """
    P, _ = make_synthetic(4000, 4, seed=12)
    hs = np.asarray(kdecal.DEFAULT_BANDWIDTH_GRID)
    ref = kdecal.loo_log_likelihood(P, hs, backend="cpp")
    monkeypatch.setattr(_dask, "BLOCKS_PER_THREAD", 20)  # 40 blocks: a long call
    pids = client.run(os.getpid)
    victim = min(pids)
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(kdecal.loo_log_likelihood, P, hs, backend="dask")
        deadline = time.monotonic() + 120
        while not any(
            str(k).startswith("kdecal-loo") for k in client.processing().get(victim, ())
        ):
            assert time.monotonic() < deadline and not call.done(), "no block reached the victim"
            time.sleep(0.01)
        os.kill(pids[victim], signal.SIGKILL)
        assert not call.done()  # killed mid-call
        out = call.result(timeout=300)
    np.testing.assert_array_equal(out, ref)
    client.wait_for_workers(2, timeout=120)
    assert pids[victim] not in client.run(os.getpid).values()  # it really died


def test_cli_backend_dask_on_a_scheduler(client, data, tmp_path, capsys):
    """`kdecal evaluate --backend dask --scheduler ADDRESS` equals the cpp report."""
    import json

    from kdecal.cli import main

    P, y = data
    f = tmp_path / "preds.npz"
    np.savez(f, probs=P, labels=y)
    args = ["evaluate", str(f), "--json", "--quiet", "--bandwidth", "0.1", "--n-resamples", "0"]
    assert main(args) == 0
    ref = json.loads(capsys.readouterr().out)
    address = client.scheduler.address
    assert main([*args, "--backend", "dask", "--scheduler", address]) == 0
    got = json.loads(capsys.readouterr().out)
    for key in ("ece_kde_l1", "ece_kde_l2", "ce_kl", "ce_l2", "refinement_kl", "sharpness_kl"):
        if key in ref:
            assert got[key] == ref[key], key
    # --scheduler without the dask backend is a usage error
    assert main([*args, "--scheduler", address]) == 2
    assert "--scheduler applies only with --backend dask" in capsys.readouterr().err
