"""Differentiable kernel calibration errors for training with PyTorch.

``kdecal.torch`` turns the estimators of :mod:`kdecal` into losses: the calibration
regularised risk ``XE + lambda * ECE^KDE`` of Popordanoska et al. 2022 (Sec. 5, Eq. 5,
"KDE-XE") and the proper calibration errors of Popordanoska et al. 2024.

The forward pass is the engine's streaming leave-one-out reduction (O(nK) memory). The
backward pass is computed in the engine as well, by two more streaming passes that
recompute the kernel weights from the per-query maximum and sum saved by the forward
pass (as the backward pass of flash attention does): the n x n matrix of kernel values,
which autograd through a materialised implementation would store (several GB at
n = 20,000), is never formed. The binary problems of top-label and class-wise losses
(float64, n >= 2,048, h >= 1e-5) take the fast binary engine for both passes instead:
O(n log n), each sum within 3e-9 of the sum of its terms' magnitudes
(``docs/guide/binary_engine.md``; float32 tensors as well: the engine computes in
float64 and returns the tensor's dtype). Gradients flow through both roles of every prediction,
as a query point (through ``log f_j``) and as a kernel centre (through ``f_i`` and the
normalising term ``-sum_k lgamma(f_ik / h + 1)``, whose derivative is a digamma term).

Everything that is O(nK) (clipping, the binary problems of top-label and class-wise
calibration, the estimator on top of the conditional expectation) is the array-API code
that :mod:`kdecal` runs on NumPy arrays (``kdecal._formulas``), here evaluated on
tensors, so autograd differentiates it; only the leave-one-out conditional expectation
``E[y | f_j]`` is a custom :class:`torch.autograd.Function`. This module holds that
Function, the tensor checks and the ``nn.Module`` wrappers.

Requires torch (``pip install "kdecal[torch]"``) and, for CPU tensors, the compiled core
``kdecal._core`` (the numba fallback has no backward pass). CUDA tensors run the forward
and the backward pass on their device with the GPU engine (:mod:`kdecal._engine.cuda`,
``pip install "kdecal[cuda]"``): the kernel sums, the gradient and every O(nK) step stay
on the device; only the validation reads the predictions and labels (O(nK)) on the host.
float32 or float64 tensors; float16 and bfloat16 are converted to float32 (differentiably,
so the gradient comes back in the input's dtype). Importing :mod:`kdecal` does not import
torch; import this module explicitly.

References
----------
- T. Popordanoska, R. Sayer, M. B. Blaschko. "A Consistent and Differentiable
  L_p Canonical Calibration Error Estimator". NeurIPS 2022.
- T. Popordanoska, S. G. Gruber, A. Tiulpin, F. Buettner, M. B. Blaschko.
  "Consistent and Asymptotically Unbiased Estimation of Proper Calibration Errors".
  AISTATS 2024.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.special import digamma
from torch.autograd.function import once_differentiable

from . import _formulas as _f
from . import kde as _kde
from ._engine import backends as _backends
from ._engine import binary as _binary
from ._engine import engines as _engines
from ._engine import runtime as _runtime
from ._estimation import problem as _problem
from ._estimation import quantities as _quantities
from ._validation import check_bandwidth, check_choice, check_labels, check_p, check_probs

__all__ = [
    "CalibrationErrorLoss",
    "ECEKDELoss",
    "calibration_error_loss",
    "conditional_expectation",
    "ece_kde_loss",
]

#: The built-in divergences of the losses (the keys of the estimators' table).
DIVERGENCES = tuple(_quantities.DIVERGENCES)
ESTIMATORS = ("direct", "refinement")


def __dir__() -> list[str]:
    return __all__


# ----------------------------------------------------------------------------- engine


def _core() -> Any:
    """Return the compiled core, or raise a RuntimeError saying why the losses need it."""
    if _runtime._core is None:
        raise RuntimeError(
            "kdecal.torch losses need kdecal's compiled core (kdecal._core), which could not "
            f"be imported ({_runtime._core_error}); the numba fallback has no backward "
            "pass. Reinstall kdecal with a C++17 compiler to build it."
        )
    return _runtime._core


class _LooExpectation(torch.autograd.Function):
    """Leave-one-out kernel conditional expectation of a batch of problems.

    ``points`` (B, n, D) on the simplex (already clipped), ``labels`` (B, n) int64 in
    ``0..D-1`` (constants), bandwidth h, and the engine: ``"cpp"`` or ``"cuda"`` (the
    points' device for CUDA tensors). Returns E (B, n, D) in the dtype of ``points``.
    The backward pass is ``kdecal._core.loo_grad`` (or its CUDA twin) chained through
    ``logq = log f`` and ``bias = -sum_k lgamma(f_k / h + 1)``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, points: torch.Tensor, labels: np.ndarray, bandwidth: float, backend: str
    ) -> torch.Tensor:
        ctx.backend = backend
        if backend == "cuda":
            return _cuda_forward(ctx, points, labels, bandwidth)
        _core()
        kdt = np.float32 if points.dtype == torch.float32 else np.float64
        if (
            points.shape[-1] == 2
            and _backends.binary_engine_serves("cpp", points.shape[-2])
            and bandwidth >= _binary.GRAD_MIN_H
        ):
            # binary problems of float32 tensors too: the fast binary engine (float64,
            # O(n log n), both passes) is faster than the dense float32 loop and more
            # accurate
            kdt = np.float64
        p64 = np.ascontiguousarray(points.detach().to(torch.float64).numpy())
        if p64.shape[-1] == 2:
            p64 = _complement(p64)
        problem = _problem.Problem("canonical", p64, labels, np.dtype(kdt))
        logq, pk, bias = _problem.kernel_inputs(problem, np.array([bandwidth]))
        scale = 1.0 / bandwidth
        # one engine call; a progress bar for long work, Ctrl-C stops it
        m, S, _, _ = _backends.loo_reduce(
            logq, pk, labels, problem.dim, np.array([scale]), bias, backend="cpp"
        )
        bias = bias[:, 0]  # (B, n)
        S = S[:, 0]  # (B, n, D)
        S0 = S.sum(axis=-1)  # >= 1: the largest term is exp(0)
        E = S / S0[..., None]
        # saved for the backward pass: O(B n D), never a pairwise quantity
        ctx.kdecal = (logq, pk, p64, labels, bias, m[:, 0] + np.log(S0), E, scale)
        return torch.from_numpy(E).to(points.dtype)

    @staticmethod
    def backward(ctx: Any, grad_E: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        if torch.is_grad_enabled():
            # create_graph=True: the engine's gradient is computed outside autograd, so
            # a second derivative through it would be silently wrong (once_differentiable
            # let torch.autograd.grad(..., inputs) skip its error node: a Hessian-vector
            # product came back 3x too small); refuse it instead
            raise RuntimeError(
                "kdecal.torch losses have first-order gradients only: their kernel "
                "gradient cannot be differentiated again (create_graph=True, gradient "
                "penalties, Hessian-vector products). Detach the loss's input for the "
                "higher-order term, or compute it without create_graph."
            )
        return _LooExpectation._first_order(ctx, grad_E)

    @staticmethod
    @once_differentiable
    def _first_order(ctx: Any, grad_E: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        """Return the gradient of the points, outside autograd (see :meth:`backward`)."""
        if ctx.backend == "cuda":
            return _cuda_backward(ctx, grad_E), None, None, None
        logq, pk, p64, labels, bias, lse, E, scale = ctx.kdecal
        g = grad_E.detach().to(torch.float64).numpy()
        # dloss/dL_ij = w_ij * coef[j, y_i], coef = g - <g, E> (the softmax Jacobian)
        coef = np.ascontiguousarray(g - np.sum(g * E, axis=-1, keepdims=True))
        D = E.shape[-1]
        # one engine call; a progress bar for long work, Ctrl-C stops it
        g_logq, g_p, g_bias, _ = _backends.loo_grad(logq, pk, labels, D, scale, bias, lse, coef)
        # query role through log f, centre role through f and through the bias
        grad = g_logq / p64 + g_p - (scale * g_bias)[..., None] * digamma(p64 * scale + 1.0)
        return torch.from_numpy(grad).to(grad_E.dtype), None, None, None


def _complement(p: np.ndarray) -> np.ndarray:
    """Binary points (B, n, 2) with the larger coordinate set to 1 minus the smaller.

    Points made in float32 sum to 1 only within float32 rounding (6e-8), which the fast
    binary engine's error bound counts against every term (``s |p0 + p1 - 1|``): at
    h = 0.01 nearly every centre failed it and was summed exactly, 20-40x slower. The
    smaller coordinate carries the precision near 0 and 1, so it is kept; the change
    lies along (1, 1), which the points' renormalisation before this function removes
    from the gradient, so the gradient with respect to the scores is unchanged.
    """
    small0 = p[..., 0] <= p[..., 1]
    out = np.empty_like(p)
    out[..., 0] = np.where(small0, p[..., 0], 1.0 - p[..., 1])
    out[..., 1] = np.where(small0, 1.0 - p[..., 0], p[..., 1])
    return out


def _cuda_forward(ctx: Any, points: torch.Tensor, labels: np.ndarray, h: float) -> torch.Tensor:
    """Run the forward pass of :class:`_LooExpectation` on the tensor's CUDA device.

    The same inputs as on the CPU (``log f`` and ``f`` in the kernel dtype, the float64
    bias ``-sum_k lgamma(f_k / h + 1)``), made on the device; the engine's outputs are
    wrapped without a copy.
    """
    kdt = torch.float32 if points.dtype == torch.float32 else torch.float64
    p64 = points.detach().to(torch.float64).contiguous()
    logq = torch.log(p64).to(kdt).contiguous()
    pk = p64.to(kdt).contiguous()
    scale = 1.0 / h
    cu = _engines.load_cuda()
    B, n, D = p64.shape
    # the engine's own bias kernel, -sum_k lgamma(f_k / h + 1), on the device: (B, n)
    bias = _from_device(
        cu.kernel_bias(p64.reshape(B * n, D), np.array([scale]), device_out=True), points.device
    ).reshape(B, n)
    m, S = cu.loo_reduce(
        logq, pk, labels, D, np.array([scale]), bias[:, None, :], device_out=True
    )[:2]
    m = _from_device(m, points.device)[:, 0]
    S = _from_device(S, points.device)[:, 0]
    S0 = S.sum(dim=-1)  # >= 1: the largest term is exp(0)
    E = S / S0[..., None]
    lab = torch.as_tensor(labels, device=points.device)
    ctx.kdecal = (logq, pk, p64, lab, bias.contiguous(), m + torch.log(S0), E, scale)
    return E.to(points.dtype)


def _from_device(x: Any, device: torch.device) -> torch.Tensor:
    """Wrap an engine output (a numba device array) as a tensor, without a copy on CUDA.

    Under numba's CUDA simulator (the tests without a GPU) the arrays are host arrays.
    """
    if hasattr(x, "__cuda_array_interface__"):
        return torch.as_tensor(x, device=device)
    return torch.from_numpy(np.asarray(x.copy_to_host())).to(device)


def _cuda_backward(ctx: Any, grad_E: torch.Tensor) -> torch.Tensor:
    """Run the backward pass of :class:`_LooExpectation` on the tensor's CUDA device."""
    logq, pk, p64, labels, bias, lse, E, scale = ctx.kdecal
    g = grad_E.detach().to(torch.float64)
    coef = (g - torch.sum(g * E, dim=-1, keepdim=True)).contiguous()
    g_logq, g_p, g_bias, _ = (
        _from_device(x, grad_E.device)
        for x in _backends.loo_grad(
            logq, pk, labels, E.shape[-1], scale, bias, lse.contiguous(), coef, backend="cuda"
        )
    )
    grad = g_logq / p64 + g_p - (scale * g_bias)[..., None] * torch.digamma(p64 * scale + 1.0)
    return grad.to(grad_E.dtype)


# ------------------------------------------------------------------------- validation


def _check_tensor(probs: object) -> torch.Tensor:
    """Check the tensor's type, device and dtype; half precision becomes float32."""
    if not isinstance(probs, torch.Tensor):
        raise TypeError(
            "probs must be a torch.Tensor (float32 or float64; CPU or CUDA), got "
            f"{type(probs).__name__}"
        )
    if probs.layout != torch.strided:
        raise TypeError(
            f"probs must be a dense tensor, got layout {probs.layout}; call .to_dense() first"
        )
    if probs.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"probs is on device {probs.device}; kdecal.torch supports CPU and CUDA tensors "
            "(move it with .cpu())"
        )
    if probs.is_cuda and _engines.load_cuda() is None:
        raise ValueError(
            f"probs is on device {probs.device}, but kdecal's GPU engine is not usable here: "
            f"{_engines._cuda_error}; move the tensor with .cpu()"
        )
    if probs.dtype in (torch.float16, torch.bfloat16):
        return probs.to(torch.float32)  # differentiable: the gradient returns in half
    if probs.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            "probs must be a float32 or float64 tensor (float16 and bfloat16 are computed "
            f"in float32), got dtype {probs.dtype}"
        )
    return probs


def _prepare(
    probs: object,
    labels: object,
    bandwidth: object,
    calibration: object,
    criterion: str = "brier",
) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray, float, str]:
    """Validate; return the problem and its engine.

    Returns points (B, n, D), labels (B, n), clipped P, y, the bandwidth and the engine
    ("cuda" for CUDA tensors, else "cpp"). ``criterion``: the leave-one-out risk that
    ``bandwidth="auto"`` minimises ("brier", or "log" for the KL loss, as the NumPy
    plug-in chooses its KL bandwidth).
    """
    x = _check_tensor(probs)
    if not x.is_cuda:
        _core()
    check_choice(calibration, "calibration", _problem.CALIBRATIONS)
    # shapes, NaN, negatives, row sums (a half-precision softmax's rounding renormalised
    # without a warning: a bfloat16 one misses 1 by up to about 4e-3 in every batch)
    given = probs.dtype if isinstance(probs, torch.Tensor) else x.dtype
    eps = float(torch.finfo(given).eps) if given != x.dtype else 0.0  # float16, bfloat16
    checked = check_probs(x.detach().cpu().numpy(), input_eps=eps)
    # labels as the NumPy API reads them (any device; floats when integral, e.g. 0.0/1.0
    # in bfloat16; a fraction or a complex dtype refused with the same message)
    y = check_labels(labels, checked.n, checked.n_classes)
    be = "cuda" if x.is_cuda else "cpp"
    if isinstance(bandwidth, str):
        h = _kde._resolve_bandwidth(checked, y, str(calibration), bandwidth, be, False, criterion)
    else:
        h = check_bandwidth(bandwidth)
    P = _f.simplex_points(x)
    points, lab = _f.problem_arrays(P, torch.from_numpy(y).to(x.device), str(calibration))
    return points, np.ascontiguousarray(lab.cpu().numpy()), P, y, h, be


# ------------------------------------------------------------------------- public API


def conditional_expectation(
    probs: torch.Tensor, labels: object, *, bandwidth: float | str
) -> torch.Tensor:
    """Differentiable leave-one-out estimate of ``E[y | f(x_j)]`` (Dirichlet kernel).

    The torch version of :func:`kdecal.conditional_expectation`:
    ``E_jc = sum_{i != j} k(f_j; f_i) 1[y_i = c] / sum_{i != j} k(f_j; f_i)`` with the
    Dirichlet kernel ``Dir(.; f_i / h + 1)`` (Popordanoska et al. 2022, Eq. 3, 10), for
    building other losses on top of it.

    Parameters
    ----------
    probs : torch.Tensor, shape (n, K) or (n,), floating point, CPU or CUDA
        float32 or float64; float16 and bfloat16 are computed in float32.
        Predicted probabilities (rows on the simplex), or P(y = 1) of a binary problem.
        Clipped at 1e-12 and renormalised (differentiably) before the kernel.
    labels : torch.Tensor or array-like, shape (n,), integer-valued
        True classes in ``0..K-1`` (constants).
    bandwidth : float, "auto" or "loo-mle"
        Kernel bandwidth h > 0; "auto" and "loo-mle" choose it on the detached batch as
        in :func:`ece_kde_loss` (a constant, not differentiated).

    Returns
    -------
    torch.Tensor, shape (n, K), dtype of ``probs`` (float32 for float16 and bfloat16)
        Differentiable with respect to ``probs``; rows on the simplex.

    Raises
    ------
    TypeError, ValueError
        Invalid input, as :func:`kdecal.conditional_expectation`, a tensor that is not
        floating point, or on a device other than the CPU
        or a usable CUDA device.
    RuntimeError
        If the compiled core is not available.
    """
    points, lab, _, _, h, be = _prepare(probs, labels, bandwidth, "canonical")
    return _LooExpectation.apply(points, lab, h, be)[0]  # type: ignore[no-any-return]


def ece_kde_loss(
    probs: torch.Tensor,
    labels: object,
    *,
    p: float = 1,
    bandwidth: float | str,
    calibration: str = "canonical",
) -> torch.Tensor:
    """Differentiable L_p calibration error ECE^KDE (Popordanoska et al. 2022, Eq. 9).

    The same value as :func:`kdecal.ece_kde` with ``estimator="plugin",
    debias="none"`` (the papers' plug-in ratio, whose gradient the engine streams),
    ``CE_p = (mean_j sum_c |E_hat[y | f_j]_c - f_jc|^p)^(1/p)``, as a scalar tensor whose
    gradient with respect to ``probs`` is computed by the engine in a streaming backward
    pass (O(nK) memory). The regulariser of KDE-XE (Sec. 5, Eq. 5) is
    ``loss = cross_entropy + lam * ece_kde_loss(softmax(logits), labels, ...)``; the
    authors' code uses ``CE_p ** p`` (the same at p = 1).

    Parameters
    ----------
    probs : torch.Tensor, shape (n, K) or (n,), floating point, CPU or CUDA
        float32 or float64; float16 and bfloat16 are computed in float32.
        Predicted probabilities of a batch, or P(y = 1): rows summing to 1 within 0.1
        (``kdecal.tolerances.PROBS_ROW_SUM_ATOL``), renormalised, with a
        ``RenormalizationWarning`` beyond 1e-3 (beyond the dtype's machine epsilon for
        float16 and bfloat16, the rounding of a softmax computed in them).
        Clipped at 1e-12 and renormalised with torch operations, so the gradient includes
        that Jacobian (zero for the clipped entries). n >= 3.
    labels : torch.Tensor or array-like, shape (n,), integer-valued
        True classes in ``0..K-1``.
    p : float, default 1
        Order of the L_p norm, ``p >= 1``.
    bandwidth : float, "auto" or "loo-mle"
        Kernel bandwidth h > 0 (required). "auto" chooses it on the detached batch, as a
        constant, as :func:`kdecal.select_bandwidth` does with labels: the bandwidth
        minimising the leave-one-out Brier risk of the kernel regression of the labels
        over a grid of 73 values in [1e-5, 10] (a coarse-to-fine search on subsets of the
        rows, then a local search on all of them: several engine passes);
        "loo-mle" maximises the papers' leave-one-out likelihood of the predictions'
        density over :data:`kdecal.DEFAULT_BANDWIDTH_GRID` instead.
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"
        Notion of calibration, as in :func:`kdecal.ece_kde`: the full vector (Dirichlet
        kernel), the K one-vs-rest problems ``(f_c, 1[y = c])`` averaged over classes, or
        the confidence problem ``(max_k f_k, 1[argmax_k f_k = y])`` (Beta kernel). The
        binary problems are built with torch operations (the gradient of the maximum goes
        to the arg max).

    Returns
    -------
    torch.Tensor, shape (), dtype of ``probs`` (float32 for float16 and bfloat16)
        CE_p in probability units.

    Raises
    ------
    TypeError, ValueError
        Invalid input (as :func:`kdecal.ece_kde`), ``p < 1``, a tensor that is not
        floating point, or on a device other than the CPU
        or a usable CUDA device.
    RuntimeError
        If the compiled core ``kdecal._core`` is not available.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"p must be a real number >= 1, got {p!r}")
    if not np.isfinite(p) or p < 1:
        raise ValueError(f"p must be a finite real number >= 1, got {p!r}")
    points, lab, _, _, h, be = _prepare(probs, labels, bandwidth, calibration)
    E = _LooExpectation.apply(points, lab, h, be)
    c = _f.coords(calibration != "canonical")
    return torch.mean(_f.lp_rows(E[..., c], points[..., c], float(p))) ** (1.0 / float(p))


def calibration_error_loss(
    probs: torch.Tensor,
    labels: object,
    *,
    divergence: str = "kl",
    bandwidth: float | str,
    calibration: str = "canonical",
    estimator: str = "direct",
) -> torch.Tensor:
    """Differentiable proper calibration error CE_F (Popordanoska et al. 2024).

    The same value as :func:`kdecal.calibration_error` with ``estimator="plugin",
    debias="none"`` (the papers' plug-in ratio), as a scalar tensor with an engine-computed streaming gradient (O(nK) memory).

    Parameters
    ----------
    probs : torch.Tensor, shape (n, K) or (n,), floating point, CPU or CUDA
        float32 or float64; float16 and bfloat16 are computed in float32.
        Predicted probabilities (see :func:`ece_kde_loss`).
    labels : torch.Tensor or array-like, shape (n,), integer-valued
        True classes in ``0..K-1``.
    divergence : {"kl", "l2"}, default "kl"
        "kl": F(p) = sum p log p, ``mean_j sum_c E_jc log(E_jc / f_jc)`` (Eq. 10);
        "l2": F(p) = ||p||^2, the squared L2 calibration error ``mean_j ||E_j - f_j||^2``
        (Eq. 7). For the binary problems of "classwise"/"top_label", "l2" uses the
        positive coordinate, as :func:`kdecal.calibration_error`.
    bandwidth : float, "auto" or "loo-mle"
        Kernel bandwidth h > 0 (required); "loo-mle" as in :func:`ece_kde_loss`; "auto"
        minimises the leave-one-out log risk for "kl" and the Brier risk for "l2", the
        bandwidths :func:`kdecal.calibration_error` chooses for its plug-in.
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"
        Notion of calibration (see :func:`ece_kde_loss`).
    estimator : {"direct", "refinement"}, default "direct"
        "direct": ``mean_j D_F(E_j, f_j)`` (Eq. 9); "refinement": the risk minus the
        refinement, ``mean_j F(E_j) + mean_i [D_F(y_i, f_i) - F(y_i)]`` (Eq. 14-15).

    Returns
    -------
    torch.Tensor, shape (), dtype of ``probs`` (float32 for float16 and bfloat16)
        CE_F in nats for "kl", squared probability units for "l2".

    Raises
    ------
    TypeError, ValueError
        Invalid input, divergence, estimator or calibration; a tensor that is not
        floating point, or on a device other than the CPU
        or a usable CUDA device.
    RuntimeError
        If the compiled core ``kdecal._core`` is not available.
    """
    check_choice(divergence, "divergence", DIVERGENCES)
    check_choice(estimator, "estimator", ESTIMATORS)
    criterion = "log" if divergence == "kl" else "brier"
    points, lab, _, _, h, be = _prepare(probs, labels, bandwidth, calibration, criterion)
    E = _LooExpectation.apply(points, lab, h, be)
    binary = calibration != "canonical"
    if estimator == "direct":
        return torch.mean(_f.divergence_rows(divergence, E, points, binary))
    F = _f.generator_rows(divergence, E, binary)
    risk = _f.risk_rows(divergence, points, torch.from_numpy(lab).to(points.device), binary)
    return torch.mean(F) + torch.mean(risk)


def _check_options(bandwidth: object, calibration: object) -> None:
    """Refuse a module's bad bandwidth or notion when it is made, naming the argument."""
    _kde._check_bandwidth_spec(bandwidth)
    check_choice(calibration, "calibration", _problem.CALIBRATIONS)


class ECEKDELoss(torch.nn.Module):
    """``nn.Module`` form of :func:`ece_kde_loss`.

    Parameters
    ----------
    p : float, default 1
        Order of the L_p norm.
    bandwidth : float, "auto" or "loo-mle"
        Kernel bandwidth (required; see :func:`ece_kde_loss`).
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"

    Raises
    ------
    TypeError, ValueError
        A bad option, at construction (not at the first ``forward``).

    Examples
    --------
    >>> ece = ECEKDELoss(p=1, bandwidth=0.05)  # doctest: +SKIP
    >>> loss = F.cross_entropy(logits, y) + 0.1 * ece(logits.softmax(-1), y)  # doctest: +SKIP
    """

    def __init__(
        self, *, p: float = 1, bandwidth: float | str, calibration: str = "canonical"
    ) -> None:
        super().__init__()
        _check_options(bandwidth, calibration)
        check_p(p)
        self.p = p
        self.bandwidth = bandwidth
        self.calibration = calibration

    def forward(self, probs: torch.Tensor, labels: object) -> torch.Tensor:
        """Return ``ece_kde_loss(probs, labels, ...)``, a scalar tensor."""
        return ece_kde_loss(
            probs, labels, p=self.p, bandwidth=self.bandwidth, calibration=self.calibration
        )

    def extra_repr(self) -> str:
        """Options shown in ``repr``."""
        return f"p={self.p}, bandwidth={self.bandwidth!r}, calibration={self.calibration!r}"


class CalibrationErrorLoss(torch.nn.Module):
    """``nn.Module`` form of :func:`calibration_error_loss`.

    Parameters
    ----------
    divergence : {"kl", "l2"}, default "kl"
    bandwidth : float, "auto" or "loo-mle"
        Kernel bandwidth (required; see :func:`ece_kde_loss`).
    calibration : {"canonical", "classwise", "top_label"}, default "canonical"
    estimator : {"direct", "refinement"}, default "direct"

    Raises
    ------
    TypeError, ValueError
        A bad option, at construction (not at the first ``forward``).
    """

    def __init__(
        self,
        *,
        divergence: str = "kl",
        bandwidth: float | str,
        calibration: str = "canonical",
        estimator: str = "direct",
    ) -> None:
        super().__init__()
        _check_options(bandwidth, calibration)
        check_choice(divergence, "divergence", DIVERGENCES)
        check_choice(estimator, "estimator", ESTIMATORS)
        self.divergence = divergence
        self.bandwidth = bandwidth
        self.calibration = calibration
        self.estimator = estimator

    def forward(self, probs: torch.Tensor, labels: object) -> torch.Tensor:
        """Return ``calibration_error_loss(probs, labels, ...)``, a scalar tensor."""
        return calibration_error_loss(
            probs,
            labels,
            divergence=self.divergence,
            bandwidth=self.bandwidth,
            calibration=self.calibration,
            estimator=self.estimator,
        )

    def extra_repr(self) -> str:
        """Options shown in ``repr``."""
        return (
            f"divergence={self.divergence!r}, bandwidth={self.bandwidth!r}, "
            f"calibration={self.calibration!r}, estimator={self.estimator!r}"
        )
