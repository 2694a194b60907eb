"""The estimator formulas on the conditional expectation, written once for NumPy and torch.

Every function takes arrays of one array library (NumPy or torch, through the array API
and ``array-api-compat``) and returns arrays of the same library, so that
:mod:`kdecal._estimation` (NumPy, with debiasing and bootstrap weights) and
:mod:`kdecal.torch` (autograd) evaluate the same expressions. Shapes: ``E``, ``f``, ``sq``
are ``(B, n, D)`` (B problems of n points on the simplex of dimension D), ``labels`` is
``(B, n)``; every ``*_rows`` function reduces the last axis and returns ``(B, n)``.

The notions of calibration and their binary problems are those of Popordanoska,
Gruber, Tiulpin, Buettner & Blaschko (AISTATS 2024, Eq. 24-25 and App. D); the L_p
error is ECE^KDE of Popordanoska, Sayer & Blaschko (NeurIPS 2022, Eq. 9), the Bregman
quantities (divergence, refinement, risk) those of the AISTATS 2024 paper (Eq. 9-10,
14-15). For binary problems built from a multiclass output the L_p and L2 quantities use
the positive coordinate only (:func:`coords`), so the "l2" generator there is the scalar
``F(q) = q^2`` of App. D; "kl" is ``q log q + (1 - q) log(1 - q)``, the same formula as
the canonical negative entropy.
"""

from __future__ import annotations

from typing import Any

import scipy.special
from array_api_compat import array_namespace, device, is_numpy_namespace, is_torch_namespace

from .tolerances import PROB_EPS

Array = Any  # a NumPy array or a torch tensor


# ------------------------------------------------------------------------- problems


def clip_rows(x: Array) -> Array:
    """Rows clipped at ``PROB_EPS`` and renormalised to sum to 1; x of shape (..., D)."""
    xp = array_namespace(x)
    x = xp.clip(x, min=PROB_EPS)
    return x / xp.sum(x, axis=-1, keepdims=True)


def binary_points(q: Array) -> Array:
    """``(1 - q, q)`` clipped at ``PROB_EPS`` and renormalised; q (...) -> (..., 2)."""
    xp = array_namespace(q)
    return clip_rows(xp.stack([1.0 - q, q], axis=-1))


def simplex_points(probs: Array) -> Array:
    """``(n, K)`` rows, or ``(n,)`` = P(y = 1) as ``(1 - p, p)``, clipped and renormalised."""
    return binary_points(probs) if probs.ndim == 1 else clip_rows(probs)


def problem_arrays(P: Array, y: Array, calibration: str) -> tuple[Array, Array]:
    """Build the kernel problems of one notion of calibration.

    Parameters
    ----------
    P : array, shape (n, K), float
        Clipped predictions (:func:`simplex_points`).
    y : array, shape (n,), int64
        Labels in ``0..K-1``.
    calibration : {"canonical", "top_label", "classwise"}
        ``"canonical"``: one problem, the full vectors; ``"top_label"``: the binary
        problem ``(max_k f_k, 1[argmax_k f_k = y])`` (ties: the lowest index);
        ``"classwise"``: the K problems ``(f_c, 1[y = c])``.

    Returns
    -------
    points : array, shape (B, n, D), float
        Points on the simplex (binary problems: ``(1 - q, q)``, clipped again).
    labels : array, shape (B, n), int64
        Labels in ``0..D-1``.
    """
    xp = array_namespace(P, y)
    if calibration == "canonical":
        return P[None, ...], y[None, ...]
    if calibration == "top_label":
        top = xp.argmax(P, axis=1)
        q = xp.take_along_axis(P, top[:, None], axis=1)[:, 0]
        return binary_points(q)[None, ...], xp.astype(top == y, xp.int64)[None, ...]
    K = P.shape[1]
    labels = xp.astype(y[None, :] == xp.arange(K, device=device(y))[:, None], xp.int64)
    return binary_points(P.T), labels


def coords(binary: bool) -> slice:
    """Coordinates that enter L_p and L2 quantities (the positive one when binary)."""
    return slice(1, 2) if binary else slice(None)


def one_hot(labels: Array, D: int, dtype: Any = None) -> Array:
    """Labels (..., n) as one-hot vectors (..., n, D), float64 unless ``dtype``."""
    xp = array_namespace(labels)
    hit = labels[..., None] == xp.arange(D, device=device(labels))
    return xp.astype(hit, xp.float64 if dtype is None else dtype)


# --------------------------------------------------------------------- x log y terms


def xlogx(x: Array) -> Array:
    """``x log x`` with ``0 log 0 = 0`` (and, for torch, a finite gradient 0 at x = 0)."""
    xp = array_namespace(x)
    if is_numpy_namespace(xp):
        return scipy.special.xlogy(x, x)
    pos = x > 0
    return xp.where(pos, x * xp.log(xp.where(pos, x, xp.ones_like(x))), 0.0)


def xlogy(x: Array, y: Array) -> Array:
    """``x log y`` with ``0 log y = 0`` (y > 0 here: clipped predictions)."""
    xp = array_namespace(x, y)
    if is_numpy_namespace(xp):
        return scipy.special.xlogy(x, y)
    if is_torch_namespace(xp):
        import torch

        return torch.xlogy(x, y)
    return xp.where(x == 0, 0.0, x * xp.log(y))


# ---------------------------------------------------------------------- estimators


def lp_rows(E: Array, f: Array, p: float, sq: Array | None = None) -> Array:
    """Return ``sum_c |E_c - f_c|^p`` (Popordanoska et al. 2022, Eq. 9).

    At p = 2 with ``sq`` (estimates of ``E_c^2``, Eq. 7) the debiased
    ``sum_c (sq_c - 2 E_c f_c + f_c^2)``.
    """
    xp = array_namespace(E, f)
    if p == 2.0 and sq is not None:
        return squared_rows(E, f, sq)
    return xp.sum(xp.abs(E - f) ** p, axis=-1)


def squared_rows(E: Array, f: Array, sq: Array | None = None) -> Array:
    """Return ``||E - f||^2``, the L2 divergence ``D_F(E, f)`` with ``F = ||.||^2``.

    Given estimates ``sq`` of ``E_c^2``: ``sum_c (sq_c - 2 E_c f_c + f_c^2)``.
    """
    xp = array_namespace(E, f)
    if sq is None:
        return xp.sum((E - f) ** 2, axis=-1)
    return xp.sum(sq - 2.0 * E * f + f * f, axis=-1)


def neg_entropy_rows(v: Array) -> Array:
    """``F(v) = sum_c v_c log v_c``, the generator of the KL calibration error."""
    xp = array_namespace(v)
    return xp.sum(xlogx(v), axis=-1)


def kl_rows(E: Array, f: Array) -> Array:
    """``D_F(E, f) = sum_c E_c log(E_c / f_c)`` (Popordanoska et al. 2024, Eq. 10)."""
    xp = array_namespace(E, f)
    return xp.sum(xlogx(E) - xlogy(E, f), axis=-1)


def log_risk_rows(f: Array, labels: Array) -> Array:
    """``D_F(y, f) - F(y) = -log f_y`` for the negative entropy F (the log loss)."""
    xp = array_namespace(f, labels)
    return -xp.log(xp.take_along_axis(f, labels[..., None], axis=-1)[..., 0])


def l2_risk_rows(Y: Array, f: Array) -> Array:
    """``D_F(Y, f) - F(Y) = ||Y - f||^2 - ||Y||^2`` for ``F = ||.||^2`` (Y one-hot)."""
    xp = array_namespace(Y, f)
    return xp.sum((Y - f) ** 2 - Y * Y, axis=-1)


def generator_rows(divergence: str, E: Array, binary: bool, sq: Array | None = None) -> Array:
    """``F(E_j)`` of the built-in generators "kl" and "l2" (L2 with ``sq`` when debiased)."""
    if divergence == "kl":
        return neg_entropy_rows(E)
    xp = array_namespace(E)
    c = coords(binary)
    return xp.sum((E * E if sq is None else sq)[..., c], axis=-1)


def divergence_rows(
    divergence: str, E: Array, f: Array, binary: bool, sq: Array | None = None
) -> Array:
    """``D_F(E_j, f_j)`` of the built-in generators (Popordanoska et al. 2024, Eq. 9)."""
    if divergence == "kl":
        return kl_rows(E, f)
    c = coords(binary)
    return squared_rows(E[..., c], f[..., c], None if sq is None else sq[..., c])


def risk_rows(divergence: str, f: Array, labels: Array, binary: bool) -> Array:
    """``D_F(y_j, f_j) - F(y_j)`` of the built-in generators, one-hot ``y_j``."""
    if divergence == "kl":
        return log_risk_rows(f, labels)
    c = coords(binary)
    Y = one_hot(labels, f.shape[-1], f.dtype)
    return l2_risk_rows(Y[..., c], f[..., c])
