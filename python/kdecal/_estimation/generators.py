"""Bregman generators: the closed forms of KL and L2 and a user's :class:`Bregman`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import xlogy

from .. import _formulas as _f
from .problem import Problem
from .regression import Estimate

# ----------------------------------------------------------------------------- generators


class Generator:
    """A Bregman generator applied to estimates: ``F``, ``D_F`` and the risk term."""

    name = "custom"

    def F(self, est: Estimate) -> np.ndarray:
        """``F(E_j)`` per problem and row, shape (B, n)."""
        raise NotImplementedError

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        """``F(v)`` for points v of shape (B, m, D), shape (B, m)."""
        raise NotImplementedError

    def divergence(self, est: Estimate) -> np.ndarray:
        """``D_F(E_j, f_j)``, shape (B, n)."""
        raise NotImplementedError

    def risk(self, problem: Problem) -> np.ndarray:
        """``D_F(y_j, f_j) - F(y_j)`` with one-hot ``y_j``, shape (B, n)."""
        raise NotImplementedError


class KLGenerator(Generator):
    """``F(p) = sum_c p_c log p_c`` (binary problems: ``q log q + (1-q) log(1-q)``)."""

    name = "kl"

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        return np.asarray(_f.generator_rows("kl", v, problem.binary))

    def F(self, est: Estimate) -> np.ndarray:
        return self.F_points(est.problem, est.simplex_E())

    def divergence(self, est: Estimate) -> np.ndarray:
        pr = est.problem
        return np.asarray(_f.divergence_rows("kl", est.simplex_E(), pr.p, pr.binary))

    def risk(self, problem: Problem) -> np.ndarray:
        return np.asarray(_f.risk_rows("kl", problem.p, problem.labels, problem.binary))


class L2Generator(Generator):
    """``F(p) = ||p||^2`` (binary problems: ``F(q) = q^2``); uses debiased squares."""

    name = "l2"

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        return np.asarray(_f.generator_rows("l2", v, problem.binary))

    def F(self, est: Estimate) -> np.ndarray:
        if est.sqerr is not None:  # ||E||^2 = ||f||^2 + 2 <f, g> + ||g||^2 (U-statistic)
            c = est.problem.coords
            f = est.problem.p[..., c]
            g = est.E[..., c] - f
            return np.asarray(np.sum(f * f + 2.0 * f * g, axis=-1) + est.sqerr)
        return np.asarray(_f.generator_rows("l2", est.E, est.problem.binary, est.squares()))

    def divergence(self, est: Estimate) -> np.ndarray:
        if est.sqerr is not None:
            return est.sqerr
        pr = est.problem
        return np.asarray(_f.divergence_rows("l2", est.E, pr.p, pr.binary, est.squares()))

    def risk(self, problem: Problem) -> np.ndarray:
        return np.asarray(_f.risk_rows("l2", problem.p, problem.labels, problem.binary))


def _check_finite(out: np.ndarray, what: str, points: np.ndarray) -> None:
    """Refuse a user generator's non-finite values (a silent NaN estimate otherwise)."""
    bad = ~np.isfinite(out.reshape(points.shape[0], -1))
    rows = bad.any(axis=1)
    if rows.any():
        row = int(np.argmax(rows))
        value = float(out.reshape(points.shape[0], -1)[row][bad[row]][0])
        raise ValueError(
            f"Bregman {what} returned non-finite values at {int(rows.sum())} of "
            f"{points.shape[0]} points, the first {value!r} at the point "
            f"{[float(v) for v in points[row]]!r}; the generator and its gradient must be "
            "finite on the probability simplex"
        )


def _real_values(values: object, what: str) -> np.ndarray:
    """Return a user generator's output as float64, or raise a TypeError naming it."""
    arr = np.asarray(values)
    bad = arr.dtype.kind in "USVcMm" or (
        arr.dtype == object and any(isinstance(v, (str, bytes, complex)) for v in arr.flat)
    )
    if not bad:
        try:  # numbers, or Python numbers in an object array
            return np.asarray(arr, dtype=np.float64)
        except (TypeError, ValueError):
            pass
    raise TypeError(
        f"Bregman {what} must return real numbers, got dtype {arr.dtype}"
        + (f" (e.g. {arr.flat[0]!r})" if arr.size else "")
    )


class CustomGenerator(Generator):
    """A user's ``kdecal.Bregman``; binary problems pass the 2-vectors ``(1 - q, q)``."""

    def __init__(self, bregman: object) -> None:
        self.bregman = bregman
        self.name = getattr(bregman, "name", "custom")

    def _rows(self, fn: object, v: np.ndarray, what: str) -> np.ndarray:
        B, m, D = v.shape
        out = _real_values(fn(v.reshape(B * m, D)), what)  # type: ignore[operator]
        if out.shape != (B * m,):
            raise ValueError(f"Bregman {what} must return shape ({B * m},), got {out.shape}")
        _check_finite(out, what, v.reshape(B * m, D))
        return out.reshape(B, m)

    def F_points(self, problem: Problem, v: np.ndarray) -> np.ndarray:
        return self._rows(self.bregman.F, v, "F")  # type: ignore[attr-defined]

    def F(self, est: Estimate) -> np.ndarray:
        return self.F_points(est.problem, est.simplex_E())

    def _div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        B, m, D = a.shape
        g = _real_values(self.bregman.grad_F(b.reshape(B * m, D)), "grad_F")  # type: ignore[attr-defined]
        if g.shape != (B * m, D):
            raise ValueError(f"Bregman grad_F must return shape ({B * m}, {D}), got {g.shape}")
        _check_finite(g, "grad_F", b.reshape(B * m, D))
        lin = np.sum(g.reshape(B, m, D) * (a - b), axis=-1)
        return self._rows(self.bregman.F, a, "F") - self._rows(self.bregman.F, b, "F") - lin  # type: ignore[attr-defined]

    def divergence(self, est: Estimate) -> np.ndarray:
        return self._div(est.simplex_E(), est.problem.p)

    def risk(self, problem: Problem) -> np.ndarray:
        Y = problem.one_hot()
        return self._div(Y, problem.p) - self.F_points(problem, Y)


# ------------------------------------------------------- Bregman (the public generators)


@dataclass(frozen=True)
class Bregman:
    """A Bregman divergence given by its strictly convex generator F.

    ``D_F(a, b) = F(a) - F(b) - <grad_F(b), a - b>``; the proper calibration error is
    ``E[D_F(E[y | f(x)], f(x))]`` (Popordanoska et al. 2024, Eq. 9).

    Parameters
    ----------
    F : callable
        ``F(P) -> ndarray (n,)`` for ``P`` of shape (n, K): the generator, vectorised
        over rows.
    grad_F : callable
        ``grad_F(P) -> ndarray (n, K)``: its gradient, vectorised over rows.
    name : str, optional
        Label used in reports.

    Raises
    ------
    TypeError
        ``F`` or ``grad_F`` not callable, or ``name`` not a string.
    """

    F: Callable[[np.ndarray], np.ndarray]
    grad_F: Callable[[np.ndarray], np.ndarray]
    name: str = "custom"

    def __post_init__(self) -> None:
        for arg in ("F", "grad_F"):
            value = getattr(self, arg)
            if not callable(value):
                raise TypeError(
                    f"Bregman {arg} must be a callable of an (n, K) array, got "
                    f"{type(value).__name__} {value!r}"
                )
        if not isinstance(self.name, str):
            raise TypeError(f"Bregman name must be a str, got {type(self.name).__name__}")

    def divergence(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Row-wise ``D_F(a_j, b_j)``, shape (n,)."""
        return np.asarray(self.F(a) - self.F(b) - np.sum(self.grad_F(b) * (a - b), axis=1))

    def _F(self, P: np.ndarray) -> np.ndarray:
        out = np.asarray(self.F(P), dtype=np.float64)
        if out.shape != (P.shape[0],):
            raise ValueError(
                f"Bregman F must return shape ({P.shape[0]},) for input {P.shape}, got {out.shape}"
            )
        return out


def _neg_entropy(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(xlogy(P, P), axis=1))


def _neg_entropy_grad(P: np.ndarray) -> np.ndarray:
    return np.log(P) + 1.0


def _sq_norm(P: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(P * P, axis=1))


def _sq_norm_grad(P: np.ndarray) -> np.ndarray:
    return 2.0 * P


#: The built-in generators as Bregman objects (the estimators use closed forms for them).
KL = Bregman(_neg_entropy, _neg_entropy_grad, "kl")
L2 = Bregman(_sq_norm, _sq_norm_grad, "l2")
