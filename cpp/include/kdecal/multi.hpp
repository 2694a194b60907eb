// kdecal: leave-one-out class sums of many label vectors at once, for ONE bandwidth
// (pure C++17, no Python).
//
// The kernel weights of the leave-one-out reduction (loo.hpp) do not depend on the
// labels, so the class sums of B label vectors (consistency resampling: labels redrawn
// from the predicted probabilities) and of B centre weightings (the bootstrap:
// multinomial resampling counts) can share one pass over the n x n kernel.  For query
// rows j in [row_start, row_stop), centres i != j (by index), b in [0, B), c in [0, C):
//
//   L_ij      = bias[i] + scale * sum_k logq[j,k] p[i,k]     (the K-dot in the input
//                                                           precision, then double)
//   w_ij      = exp(L_ij - m_j)        m_j GIVEN: the row max over i != j of L_ij, as
//                                      returned in `m` by loo_reduce at this bandwidth
//   S[b,j,c]  = sum_{i != j, labels[b,i] = c} weights[b,i] * w_ij
//   Q[b,j,c]  = sum_{i != j, labels[b,i] = c} weights[b,i] * w_ij^2   (powers == 2)
//   U[b,j]    = sum_{i != j} weights[b,i] * w_ij^2 * u[b,i]   (optional, any powers: the
//               residual sums of label set b, over every class)
//
// Terms with L_ij - m_j < -kDrop are dropped (exactly zero), i.e. every kept w_ij is in
// [exp(-kDrop), 1] (up to rounding) and no exp argument is ever clamped.  Relative to
// the row's largest term a dropped term is < 1.6e-28.  With centre weights the terms
// are kept down to exp(-kClamp) instead, as kernel_weights keeps them: a bootstrap
// replicate that draws none of a row's nearest centres has only terms far below the
// full sample's maximum m_j, and dropping them at kDrop emptied such rows (or kept a
// few of their terms).  A (b, j) whose every kept centre has weight 0 gets S[b,j,:] = 0
// even when centres beyond exp(-kClamp) carry weight (extreme bandwidths only): the
// caller must treat a row total that small as undefined.  A row with m_j = -inf (no
// centre at all, n == 1) gets zeros.
//
// Results do not depend on the number of threads, nor on how the rows are split into
// [row_start, row_stop) ranges: every row is reduced by one thread, over the centres in
// a fixed order.
#pragma once

#include <cstdint>

#include "kdecal/loo.hpp"

namespace kdecal {

/// Inputs of one multi-label reduction.  All pointers are row-major, C-contiguous.
template <class Real>
struct MultiProblem {
    const Real* logq = nullptr;            // (n, K)  log of the query probabilities
    const Real* p = nullptr;               // (n, K)  centre probabilities
    std::int64_t n = 0;                    // number of points (queries = centres)
    std::int64_t K = 0;                    // simplex dimension
    double scale = 1.0;                    // 1 / bandwidth (finite, > 0)
    const double* bias = nullptr;          // (n,)    -sum_k lgamma(p[i,k] / h + 1)
    const double* m = nullptr;             // (n,)    row max of L_ij over i != j
    const std::int64_t* labels = nullptr;  // (B, n)  label sets, values in [0, C)
    const double* weights = nullptr;       // (B, n)  centre weights (finite, >= 0) or null (all 1)
    const double* u = nullptr;             // (B, n)  values of the residual sums U (finite),
                                           //         or null (no U)
    std::int64_t B = 1;                    // number of label sets
    std::int64_t C = 1;                    // number of label classes
    int powers = 1;                        // 1: S; 2: S and Q
    std::int64_t row_start = 0;            // first query row
    std::int64_t row_stop = 0;             // one past the last query row
};

/// Run the reduction.  S (and Q when powers == 2; Q may be null otherwise) have shape
/// (B, R, C) with R = row_stop - row_start; U (B, R) is written when prob.u is given (U
/// must then be non-null, and null otherwise); S and Q do not depend on it.  Throws
/// std::invalid_argument naming the bad argument (sizes, labels outside [0, C), negative
/// or non-finite weights, m = NaN or +inf, scale, a non-finite u) before any parallel
/// work starts; never throws from inside a parallel region.  n_threads <= 0 uses the
/// OpenMP default.  control (may be null): rows_done grows by row_stop - row_start in
/// all.  Returns false when control->cancel is set by the end of the call (the outputs
/// may then be incomplete), true otherwise.
bool loo_reduce_multi(const MultiProblem<double>& prob, double* S, double* Q, int n_threads,
                      Control* control = nullptr, double* U = nullptr);
bool loo_reduce_multi(const MultiProblem<float>& prob, double* S, double* Q, int n_threads,
                      Control* control = nullptr, double* U = nullptr);

/// The kernel weights themselves, for dense products with many value vectors (the
/// resampling of residual estimates: W @ M is a BLAS GEMM).  Writes W (R, n) with
/// W[r, s] = w_{j, order[s]} for query j = row_start + r: the w_ij of loo_reduce_multi
/// (0 on the diagonal), kept down to exp(-kClamp) of the row maximum (as
/// loo_reduce_multi keeps them with centre weights; without, it drops those below
/// exp(-kDrop)), 0 below, the
/// centres in the engine's sorted order
/// `order` (n,), written too (a permutation of 0..n-1: the caller permutes its value
/// vectors instead of the n x n weights).  The labels, weights, u, B, C and powers of
/// prob are ignored.  Throws std::invalid_argument as loo_reduce_multi; cancellation
/// and threads as there.
bool kernel_weights(const MultiProblem<double>& prob, double* W, std::int64_t* order,
                    int n_threads, Control* control = nullptr);
bool kernel_weights(const MultiProblem<float>& prob, double* W, std::int64_t* order,
                    int n_threads, Control* control = nullptr);
/// The same weights rounded to float (W (R, n) float): for products in single precision
/// (the resampling of a float32 problem); 0 below float's smallest normal number.
bool kernel_weights(const MultiProblem<double>& prob, float* W, std::int64_t* order,
                    int n_threads, Control* control = nullptr);
bool kernel_weights(const MultiProblem<float>& prob, float* W, std::int64_t* order,
                    int n_threads, Control* control = nullptr);

}  // namespace kdecal
