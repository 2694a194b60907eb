"""The progress setting of an estimate reaches its resampling passes (bootstrap and test).

``kdecal evaluate --quiet`` passes ``progress=False``; the "kdecal LOO resampling" bars
of the intervals and tests used to ignore it and showed for long work anyway.
"""

from __future__ import annotations

import numpy as np
import pytest

import kdecal
from kdecal._engine import runtime as _runtime


def _data(n=120, K=3, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), size=n)
    y = np.array([rng.choice(K, p=p) for p in P])
    return P, y


@pytest.mark.parametrize("estimator", ["residual", "plugin"])
@pytest.mark.parametrize("progress", [False, True])
def test_resampling_bars_follow_the_estimates_progress(monkeypatch, estimator, progress):
    P, y = _data()
    shown: list[tuple[str, bool]] = []
    real = _runtime.progress_bar

    def spy(show, total, desc):
        shown.append((desc, bool(show)))
        return real(False, total, desc)  # never draw in the test

    # long work everywhere: progress=None would show every bar
    monkeypatch.setattr(_runtime, "PROGRESS_MIN_WORK", 0.0)
    monkeypatch.setattr(_runtime, "progress_bar", spy)
    est = kdecal.estimate(
        P, y, bandwidth=0.2, estimator=estimator, backend="cpp", progress=progress
    )
    shown.clear()
    ci = est.confidence_interval("ece_kde_l1", n_resamples=8, seed=0)
    assert ci.low <= est.ece_kde() <= ci.high
    est.calibration_test("ce_l2", n_resamples=8, seed=0)
    resampling = [s for d, s in shown if d == "kdecal LOO resampling"]
    assert resampling, shown  # the passes ran through a bar decision
    assert all(s == progress for s in resampling), shown
