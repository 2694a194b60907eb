"""NumPy twin of ``cpp/include/kdecal/debias.hpp`` for the numba (no compiled core) backend.

Debiasing of the leave-one-out kernel ratios per query row from the power sums
``S, Q, T`` (Popordanoska et al. 2022, Eq. 7, App. C Eq. 73-75, App. D Eq. 89-91).  With
``N = n - 1`` leave-one-out terms and ``(X_i, Y_i) = (w_i, w_i 1[y_i = c])``::

    sum X = S0, sum Y = S_c, sum X^2 = Q0, sum XY = sum Y^2 = Q_c,
    sum X^3 = T0, sum X^2 Y = sum Y^2 X = T_c.

The formulas mirror the C++ line by line; :func:`ratio_of_means` and
:func:`ratio_of_squares` take the sample moments as arguments so that the tests can feed
them moments computed independently from the materialised kernel weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["debias", "moments", "ratio_of_means", "ratio_of_squares"]

#: Classes with S_c <= NEGLIGIBLE * S0 are not corrected (as in debias.hpp).
NEGLIGIBLE = 1e-30


def moments(
    S0: np.ndarray,
    Sc: np.ndarray,
    Q0: np.ndarray,
    Qc: np.ndarray,
    T0: np.ndarray,
    Tc: np.ndarray,
    N: float,
) -> dict[str, Any]:
    """Unbiased sample moments (``N - 1`` divisor) from power sums; a dict of arrays."""
    d = N - 1.0
    return {
        "N": N,
        "mx": S0 / N,
        "my": Sc / N,
        "varx": (Q0 - S0 * S0 / N) / d,
        "vary": (Qc - Sc * Sc / N) / d,
        "covxy": (Qc - S0 * Sc / N) / d,
        "covx2y": (Tc - Q0 * Sc / N) / d,
        "covx2x": (T0 - Q0 * S0 / N) / d,
        "covy2x": (Tc - Qc * S0 / N) / d,
    }


def _ra_rb_star(m: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    n1 = m["N"] - 1.0
    mx, my = m["mx"], m["my"]
    ra = m["covxy"] / (mx * my)
    rb = m["varx"] / (mx * mx)
    cross = (my * m["covx2y"] + mx * m["covy2x"]) / (mx * mx * my * my)
    ra_star = ra + (cross - 4.0 * ra) / n1 - ra / n1 * (rb + m["vary"] / (my * my) + 2.0 * ra)
    rb_star = rb + 4.0 / n1 * (0.5 * m["covx2x"] / (mx * mx * mx) - rb) - 4.0 / n1 * rb * rb
    return ra_star, rb_star


def ratio_of_means(m: dict[str, Any]) -> np.ndarray:
    """``mu_Y / mu_X`` debiased to O(N^-2) (App. C, Eq. 73); 0 where ``mu_Y = 0``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ra_star, rb_star = _ra_rb_star(m)
        mx, N = m["mx"], m["N"]
        mx3, mx4 = mx**3, mx**4
        r = m["my"] / mx
        second = (
            (m["covx2y"] - 2.0 * mx * m["covxy"]) / mx3
            - r * (m["covx2x"] - 2.0 * mx * m["varx"]) / mx3
            - 3.0 * m["varx"] * m["covxy"] / mx4
            + r * 3.0 * m["varx"] ** 2 / mx4
        )
        out = r * (1.0 - (rb_star - ra_star) / N) - second / (N * N)
    return np.where(m["my"] > 0, out, 0.0)


def ratio_of_squares(m: dict[str, Any], r_ustat: np.ndarray) -> np.ndarray:
    """``mu_Y^2 / mu_X^2`` debiased to O(N^-2) from the U-statistic ratio (App. D, Eq. 89)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ra_star, rb_star = _ra_rb_star(m)
        n = m["N"]
        n1, n2, n3, n4, n5 = n - 1.0, n - 2.0, n - 3.0, n - 4.0, n - 5.0
        mx, my = m["mx"], m["my"]
        mx2 = mx * mx
        mx3, mx4 = mx2 * mx, mx2 * mx2
        cxy2 = m["covxy"] ** 2 / (mx2 * my * my)
        vx2 = m["varx"] ** 2 / mx4
        a3 = m["covx2y"] / (mx2 * my)
        cxyv = m["covxy"] * (m["varx"] + mx2) / (mx3 * my)
        d3 = m["covx2x"] / mx3
        vxv = m["varx"] * (m["varx"] + mx2) / mx4
        c34 = 4.0 * n2 * n3 / (n * n1)
        c5 = n2 * n3 * n4 * n5 / (n * n * n1 * n1)
        t1 = 12.0 / (n * n1) * cxy2 + 24.0 / n * ra_star
        t2 = 12.0 / (n * n1) * vx2 + 24.0 / n * rb_star
        t3 = 32.0 * n2 / (n * n1 * n1) * (a3 + 2.0 * cxyv) + c34 * (
            8.0 / n * ra_star + 12.0 / (n * n1) * cxy2
        )
        t4 = 32.0 * n2 / (n * n1 * n1) * (d3 + 2.0 * vxv) + c34 * (
            8.0 / n * rb_star + 12.0 / (n * n1) * vx2
        )
        k5 = 24.0 * n2 * n3 * n4 / (n * n * n1 * n1 * n1)
        t5 = k5 * (a3 + 4.0 * cxyv) + c5 * (12.0 / n * ra_star + 30.0 / (n * n1) * cxy2)
        t6 = k5 * (d3 + 4.0 * vxv) + c5 * (12.0 / n * rb_star + 30.0 / (n * n1) * vx2)
        out = r_ustat * (1.0 + t1 - t2 - t3 + t4 + t5 - t6)
    return np.where(my > 0, out, 0.0)


def debias(
    S: np.ndarray,
    Q: np.ndarray,
    T: np.ndarray | None,
    n_terms: float,
    mode: int,
    D: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Debias like ``kdecal._core.debias``; returns ``(E, sq, degenerate)``.

    ``D`` (optional, the shape of ``S``): the pair sums ``S_c^2 - Q_c`` from the engine
    (``loo_reduce(..., pairs=True)``).  With them the U-statistic ratio (Eq. 7) has
    numerator ``D_c`` and denominator ``S0^2 - Q0 = sum_c D_c + 2 sum_{c' < c} S_c S_c'``,
    sums of non-negative terms, so it keeps a few-ulp relative error also when one
    neighbour carries almost all the weight (``S0^2 - Q0 << S0^2``), where forming it
    from ``S`` and ``Q`` cancels and depends on the order of the engine's sums.
    """
    if mode not in (1, 2):
        raise ValueError(f"mode must be 1 (ustat) or 2 (ratio), got {mode!r}")
    if mode == 2 and T is None:
        raise ValueError("mode 2 (ratio) needs T")
    if D is not None and np.shape(D) != np.shape(S):
        raise ValueError(f"D must have the shape of S {np.shape(S)}, got {np.shape(D)}")
    S0 = S.sum(axis=-1, keepdims=True)
    Q0 = Q.sum(axis=-1, keepdims=True)
    if D is None:
        num = S * S - Q
        den = S0 * S0 - Q0
    else:
        num = D
        # S_c times the classes before c (an exclusive running sum, no subtraction)
        before = np.cumsum(S, axis=-1)
        before = np.concatenate([np.zeros_like(S[..., :1]), before[..., :-1]], axis=-1)
        den = D.sum(axis=-1, keepdims=True) + 2.0 * (S * before).sum(axis=-1, keepdims=True)
    degenerate = ~(den > 1e-12 * S0 * S0) | (mode == 2 and n_terms < 6)
    with np.errstate(divide="ignore", invalid="ignore"):
        plain = S / S0
        sq = np.where(degenerate, plain * plain, num / den)
    E = plain
    if mode == 2:
        assert T is not None  # checked above
        T0 = T.sum(axis=-1, keepdims=True)
        m = moments(S0, S, Q0, Q, T0, T, float(n_terms))
        # classes below 1e-30 of the row's weight keep the plain / U-statistic values
        # (their moments would underflow; the correction is irrelevant there)
        keep = degenerate | ~(S > NEGLIGIBLE * S0)
        E = np.where(keep, plain, ratio_of_means(m))
        sq = np.where(keep, sq, ratio_of_squares(m, sq))
    return E, sq, degenerate[..., 0]
