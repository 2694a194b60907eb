// kdecal: debiasing of the leave-one-out kernel ratios from the power sums S, Q, T
// (pure C++17, header-only, no Python).
//
// For one query row j, the leave-one-out sample has N = n - 1 pairs
// (X_i, Y_i) = (w_i, w_i 1[y_i = c]) with w_i the kernel weights, and
//   sum X = S0, sum Y = S_c, sum X^2 = Q0, sum XY = sum Y^2 = Q_c,
//   sum X^3 = T0, sum X^2 Y = sum Y^2 X = T_c,
// so every sample moment of the debiasing series is a function of the sums the
// engine returns (see loo.hpp).  All quantities are invariant to a common
// scale of the weights, so the sums may be relative to the row maximum.
//
// - ratio of means (Popordanoska et al. 2022, App. C, Eq. 73-75): the conditional
//   expectation E[y_c | f_j] = mu_Y / mu_X, bias O(N^-2) instead of O(N^-1);
// - ratio of squared means (App. D, Eq. 89-91): E[y_c | f_j]^2 = mu_Y^2 / mu_X^2 from the
//   ratio of the U-statistics (S_c^2 - Q_c) / (S0^2 - Q0) (the "partially debiased"
//   Eq. 7), debiased to O(N^-2).
#pragma once

#include <cmath>
#include <cstdint>

namespace kdecal {

/// Sample moments of one (row, class) leave-one-out sample, unbiased (N - 1 divisor).
struct RatioMoments {
    double N, mx, my, varx, vary, covxy, covx2y, covx2x, covy2x;
};

inline RatioMoments ratio_moments(double S0, double Sc, double Q0, double Qc, double T0,
                                  double Tc, double N) {
    RatioMoments m{};
    m.N = N;
    m.mx = S0 / N;
    m.my = Sc / N;
    const double d = N - 1.0;
    m.varx = (Q0 - S0 * S0 / N) / d;
    m.vary = (Qc - Sc * Sc / N) / d;
    m.covxy = (Qc - S0 * Sc / N) / d;
    m.covx2y = (Tc - Q0 * Sc / N) / d;
    m.covx2x = (T0 - Q0 * S0 / N) / d;
    m.covy2x = (Tc - Qc * S0 / N) / d;
    return m;
}

/// r_a^* (Eq. 74 / 96) and r_b^* (Eq. 75 / 100): the O(N^-1)-corrected ratios
/// Cov(X, Y) / (mu_X mu_Y) and Var(X) / mu_X^2.  Requires my > 0.
inline void corrected_ra_rb(const RatioMoments& m, double& ra_star, double& rb_star) {
    const double n1 = m.N - 1.0;
    const double ra = m.covxy / (m.mx * m.my);
    const double rb = m.varx / (m.mx * m.mx);
    // ra * (my Cov(X^2,Y) + mx Cov(Y^2,X)) / (Cov(X,Y) mx my) written without Cov(X,Y)
    // in a denominator
    const double cross = (m.my * m.covx2y + m.mx * m.covy2x) / (m.mx * m.mx * m.my * m.my);
    ra_star = ra + (cross - 4.0 * ra) / n1 -
              ra / n1 * (rb + m.vary / (m.my * m.my) + 2.0 * ra);
    rb_star = rb + 4.0 / n1 * (0.5 * m.covx2x / (m.mx * m.mx * m.mx) - rb) - 4.0 / n1 * rb * rb;
}

/// Ratio of means mu_Y / mu_X debiased to O(N^-2) (Eq. 73).  Returns 0 when S_c = 0.
inline double debias_ratio_of_means(const RatioMoments& m) {
    if (!(m.my > 0.0)) return 0.0;
    double ra_star, rb_star;
    corrected_ra_rb(m, ra_star, rb_star);
    const double mx2 = m.mx * m.mx, mx3 = mx2 * m.mx, mx4 = mx2 * mx2;
    const double r = m.my / m.mx;
    // r * second-order bracket, with r multiplied in to avoid 1/my
    const double second = (m.covx2y - 2.0 * m.mx * m.covxy) / mx3 -
                          r * (m.covx2x - 2.0 * m.mx * m.varx) / mx3 -
                          3.0 * m.varx * m.covxy / mx4 + r * 3.0 * m.varx * m.varx / mx4;
    return r * (1.0 - (rb_star - ra_star) / m.N) - second / (m.N * m.N);
}

/// Ratio of squared means mu_Y^2 / mu_X^2 debiased to O(N^-2) (Eq. 89), starting from
/// the U-statistic ratio r = (Sc^2 - Qc) / (S0^2 - Q0) (Eq. 7).  Returns 0 when S_c = 0.
inline double debias_ratio_of_squares(const RatioMoments& m, double r_ustat) {
    if (!(m.my > 0.0)) return 0.0;
    double ra_star, rb_star;
    corrected_ra_rb(m, ra_star, rb_star);
    const double n = m.N, n1 = n - 1.0, n2 = n - 2.0, n3 = n - 3.0, n4 = n - 4.0, n5 = n - 5.0;
    const double mx = m.mx, my = m.my, mx2 = mx * mx, mx3 = mx2 * mx, mx4 = mx2 * mx2;
    const double cxy2 = m.covxy * m.covxy / (mx2 * my * my);
    const double vx2 = m.varx * m.varx / mx4;
    const double a3 = m.covx2y / (mx2 * my);
    const double cxyv = m.covxy * (m.varx + mx2) / (mx3 * my);
    const double d3 = m.covx2x / mx3;
    const double vxv = m.varx * (m.varx + mx2) / mx4;
    const double c34 = 4.0 * n2 * n3 / (n * n1);
    const double c5 = n2 * n3 * n4 * n5 / (n * n * n1 * n1);
    const double t1 = 12.0 / (n * n1) * cxy2 + 24.0 / n * ra_star;
    const double t2 = 12.0 / (n * n1) * vx2 + 24.0 / n * rb_star;
    const double t3 = 32.0 * n2 / (n * n1 * n1) * (a3 + 2.0 * cxyv) +
                      c34 * (8.0 / n * ra_star + 12.0 / (n * n1) * cxy2);
    const double t4 = 32.0 * n2 / (n * n1 * n1) * (d3 + 2.0 * vxv) +
                      c34 * (8.0 / n * rb_star + 12.0 / (n * n1) * vx2);
    const double t5 = 24.0 * n2 * n3 * n4 / (n * n * n1 * n1 * n1) * (a3 + 4.0 * cxyv) +
                      c5 * (12.0 / n * ra_star + 30.0 / (n * n1) * cxy2);
    const double t6 = 24.0 * n2 * n3 * n4 / (n * n * n1 * n1 * n1) * (d3 + 4.0 * vxv) +
                      c5 * (12.0 / n * rb_star + 30.0 / (n * n1) * vx2);
    return r_ustat * (1.0 + t1 - t2 - t3 + t4 + t5 - t6);
}

/// Debiasing over rows.  S, Q, T: (R, C) power sums of R query rows (relative to any
/// per-row scale); n_terms = N = number of leave-one-out terms (n - 1).
/// D: (R, C) pair sums S_c^2 - Q_c from the engine (loo_reduce with pairs), or null.
/// mode 1 ("ustat"): sq[r, c] = (S_c^2 - Q_c) / (S0^2 - Q0) and E = S_c / S0;
/// mode 2 ("ratio"): E from Eq. 73, sq from Eq. 89.
/// With D, the U-statistic is formed without cancellation: numerator D_c and
/// denominator S0^2 - Q0 = sum_c D_c + 2 sum_{c' < c} S_c S_c' (every part >= 0), so its
/// relative error stays a few ulps even when one neighbour carries almost all the weight
/// (S0^2 - Q0 << S0^2, where S0^2 - Q0 from the rounded sums would lose
/// log10(S0^2 / (S0^2 - Q0)) digits and depend on the order of the engine's sums).
/// degenerate[r] = 1 where S0^2 - Q0 <= 1e-12 S0^2 (a single effective neighbour), or
/// N < 6 in mode 2 (Eq. 89 has factors n - 5);
/// there sq falls back to the plain (S_c / S0)^2 and E to S_c / S0.  Classes with
/// S_c <= 1e-30 S0 keep E = S_c / S0 and the U-statistic sq in mode 2.
constexpr double kNegligible = 1e-30;

inline void debias_rows(const double* S, const double* Q, const double* T, const double* D,
                        std::int64_t R, std::int64_t C, double n_terms, int mode, double* E,
                        double* sq, std::uint8_t* degenerate) {
    for (std::int64_t r = 0; r < R; ++r) {
        const double* s = S + r * C;
        const double* q = Q + r * C;
        const double* t = T ? T + r * C : nullptr;
        const double* dd = D ? D + r * C : nullptr;
        double S0 = 0.0, Q0 = 0.0, T0 = 0.0, D0 = 0.0, cross = 0.0;
        for (std::int64_t c = 0; c < C; ++c) {
            if (dd) {
                cross += s[c] * S0;  // S_c times the classes before c
                D0 += dd[c];
            }
            S0 += s[c];
            Q0 += q[c];
            if (t) T0 += t[c];
        }
        const double den = dd ? D0 + 2.0 * cross : S0 * S0 - Q0;
        const bool degen = !(den > 1e-12 * S0 * S0) || (mode == 2 && n_terms < 6.0);
        degenerate[r] = degen ? 1 : 0;
        for (std::int64_t c = 0; c < C; ++c) {
            const double plain = s[c] / S0;
            double e = plain, v = plain * plain;
            if (!degen) {
                v = (dd ? dd[c] : s[c] * s[c] - q[c]) / den;
                // A class whose weight is below kNegligible of the row's total has E_c <
                // 1e-30: its O(1/N) correction is irrelevant, and its moments (my^2, Q_c)
                // would underflow, so it keeps the plain and U-statistic values.
                if (mode == 2 && s[c] > kNegligible * S0) {
                    const RatioMoments m = ratio_moments(S0, s[c], Q0, q[c], T0, t[c], n_terms);
                    e = debias_ratio_of_means(m);
                    v = debias_ratio_of_squares(m, v);
                }
            }
            E[r * C + c] = e;
            sq[r * C + c] = v;
        }
    }
}

}  // namespace kdecal
