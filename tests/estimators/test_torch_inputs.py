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


def test_half_precision_tensors_in_the_numpy_api():
    """A bfloat16 tensor failed in every NumPy-API function ("could not read
    torch.Tensor: Got unsupported ScalarType BFloat16"); it is read through float32, as
    kdecal.torch reads it, and so are bfloat16 labels."""
    torch = pytest.importorskip("torch")
    r = np.random.default_rng(1)
    P = r.dirichlet(np.ones(3), 20)
    y = r.integers(0, 3, 20)
    Pb = torch.tensor(P, dtype=torch.bfloat16)
    P32 = Pb.float().numpy()
    with pytest.warns(kdecal.RenormalizationWarning, match="rows do not sum to 1"):
        got = kdecal.ece_kde(Pb, y, bandwidth=0.1)
    with pytest.warns(kdecal.RenormalizationWarning, match="rows do not sum to 1"):
        want = kdecal.ece_kde(P32, y, bandwidth=0.1)
    assert got == want
    yb = torch.tensor(y, dtype=torch.bfloat16)
    assert kdecal.ece_kde(P, yb, bandwidth=0.1) == kdecal.ece_kde(P, y, bandwidth=0.1)
    with pytest.warns(kdecal.RenormalizationWarning):
        got = kdecal.scores.log_loss(Pb.requires_grad_(), y, input="probs")
    with pytest.warns(kdecal.RenormalizationWarning):
        assert got == kdecal.scores.log_loss(P32, y, input="probs")


def test_loss_labels_as_integral_floats():
    """kdecal.torch refused float labels 0.0/1.0 ("labels must be an integer tensor")
    that the NumPy API accepts; integral float tensors now give the loss of the integer
    labels, and a fraction is refused with the NumPy API's message."""
    torch = pytest.importorskip("torch")
    from kdecal.torch import calibration_error_loss, ece_kde_loss

    r = np.random.default_rng(1)
    P = torch.tensor(r.dirichlet(np.ones(3), 20))
    y = r.integers(0, 3, 20)
    yi = torch.tensor(y)
    for loss in (ece_kde_loss, calibration_error_loss):
        want = loss(P, yi, bandwidth=0.1)
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            assert torch.equal(loss(P, yi.to(dtype), bandwidth=0.1), want)
        assert torch.equal(loss(P, y.astype(np.float64), bandwidth=0.1), want)
        with pytest.raises(ValueError) as info:
            loss(P, yi.to(torch.float32) + 0.5, bandwidth=0.1)
        assert str(info.value) == "labels must be integers in 0..2, got 2.5 at index (0,)"
        with pytest.raises(ValueError) as numpy_api:
            kdecal.ece_kde(P.numpy(), y + 0.5, bandwidth=0.1)
        assert str(numpy_api.value) == str(info.value)
