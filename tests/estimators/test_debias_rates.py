"""Slow Monte Carlo check that the debiasing removes the O(1/n) bias.

The setting of Popordanoska et al. (NeurIPS 2022), Fig. 2b.

Uses bench/debias_rates.py (the full study is recorded in bench/README.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import kdecal

BENCH = Path(__file__).resolve().parents[2] / "bench" / "debias_rates.py"


@pytest.mark.slow
def test_ratio_debiasing_bias_rates():
    if "cpp" not in kdecal.available_backends():
        pytest.skip("the study calls the compiled core directly")
    spec = importlib.util.spec_from_file_location("debias_rates", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    R1, R2 = mod.truth()
    rng = np.random.default_rng(7)
    reps = 30000
    bias = {}
    for n in (32, 64):
        vals = np.array(
            [mod.one_sample(rng, n, kdecal._engine.runtime._core) for _ in range(reps)]
        )
        bias[n] = vals.mean(axis=0) - np.array([R2, R2, R2, R1, R1])
    plain, ustat, ratio = 0, 1, 2
    # plain ratio of squares: bias O(1/n), halves when n doubles
    assert 1.6 < bias[32][plain] / bias[64][plain] < 2.5
    # the U-statistic ratio (Eq. 7) has a smaller, still O(1/n), bias
    assert 0 < bias[32][ustat] < 0.5 * bias[32][plain]
    # App. D: an order smaller than the plain estimate at both n
    for n in (32, 64):
        assert abs(bias[n][ratio]) < 0.25 * bias[n][plain]
    # App. C on the conditional expectation itself
    assert abs(bias[32][4]) < 0.5 * bias[32][3]
