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


def test_loss_modules_refuse_bad_options_when_made():
    """ECEKDELoss(calibration="foo") and p=0 were accepted and failed at the first forward,
    deep in a training loop; they are refused at construction, naming the argument."""
    from kdecal.torch import CalibrationErrorLoss, ECEKDELoss

    bad = [
        (lambda: ECEKDELoss(bandwidth=0.1, calibration="foo"), "calibration must be one of"),
        (lambda: ECEKDELoss(bandwidth=0.1, p=0), "p must be a finite real number >= 1"),
        (lambda: ECEKDELoss(bandwidth=-1.0), "bandwidth must be a finite float > 0"),
        (lambda: CalibrationErrorLoss(bandwidth="x"), "bandwidth must be a float > 0, 'auto'"),
        (lambda: CalibrationErrorLoss(bandwidth=0.1, divergence="js"), "divergence must be"),
        (lambda: CalibrationErrorLoss(bandwidth=0.1, estimator="plug"), "estimator must be"),
    ]
    for make, message in bad:
        with pytest.raises(ValueError, match=message):
            make()
    assert ECEKDELoss(bandwidth="auto", calibration="top_label").calibration == "top_label"
