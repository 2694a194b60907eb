"""CPU torch tensors are accepted wherever arrays are (through np.asarray)."""

from __future__ import annotations

import numpy as np
import pytest

import kdecal


def test_cpu_tensors_as_inputs():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(4), size=200)
    y = rng.integers(0, 4, size=200)
    ref = kdecal.ece_kde(P, y, bandwidth=0.1)
    assert kdecal.ece_kde(torch.tensor(P), torch.tensor(y), bandwidth=0.1) == ref
    # float32 tensors run the kernel in float32 (documented ~1e-7 relative at h = 0.1)
    got32 = kdecal.ece_kde(torch.tensor(P, dtype=torch.float32), torch.tensor(y), bandwidth=0.1)
    assert got32 == pytest.approx(ref, rel=1e-5)
    rep = kdecal.evaluate(torch.tensor(P), torch.tensor(y), bandwidth=0.1, n_resamples=0)
    assert rep.ece_kde_l1 == ref
