// kdecal: streaming backward pass of the leave-one-out kernel conditional expectation
// (pure C++17, no Python).
//
// The forward pass (loo.hpp) reduces, for query rows j and centres i != j,
//
//   L_ij = bias[i] + scale * sum_k logq[j,k] * p[i,k],
//   w_ij = exp(L_ij - lse[j]),   lse[j] = m_j + log S_0(j)   (so sum_{i != j} w_ij = 1),
//   E[j,c] = sum_{i != j, label_i = c} w_ij                  (Popordanoska et al. 2022, Eq. 3).
//
// For a loss that depends on E, with g[j,c] = dloss/dE[j,c], the chain rule through the
// softmax gives dloss/dL_ij = w_ij * coef[j, label_i] with
//
//   coef[j,c] = g[j,c] - sum_c' g[j,c'] E[j,c'].
//
// loo_grad returns the vector-Jacobian products of the loss with respect to the three
// inputs of L, each a streaming reduction over all pairs with O(n K) memory (the n x n
// matrix is never formed; w_ij is recomputed from the saved lse):
//
//   grad_logq[j,k] = scale * sum_{i != j} w_ij coef[j, label_i] p[i,k]      (query role)
//   grad_p[i,k]    = scale * sum_{j != i} w_ij coef[j, label_i] logq[j,k]   (centre role)
//   grad_bias[i]   =         sum_{j != i} w_ij coef[j, label_i]            (centre role)
//   row_sum[j]     =         sum_{i != j} w_ij coef[j, label_i]            (0 up to rounding
//                                                                           for a true coef;
//                                                                           1 for coef = 1)
//
// The caller chains them to its own parametrisation (kdecal.torch: logq = log p and
// bias = -sum_k lgamma(p_k / h + 1), whose derivative is -scale * digamma(p / h + 1)).
// The K-dots are computed in the input precision, as in the forward pass (so that the
// recomputed weights match the forward's), every sum in float64.  Weights below
// exp(-kClamp) are taken as 0, and a tile of columns whose largest weight for a row is
// below exp(-kDrop) is skipped for that row (< 1.6e-28 per term; loo.hpp).  Each output row
// is reduced by one thread in a fixed order, so results do not depend on the number of
// threads.
#pragma once

#include <cstdint>

#include "kdecal/loo.hpp"  // Control

namespace kdecal {

/// Inputs of one backward pass.  All pointers are row-major, C-contiguous.
template <class Real>
struct LooGradProblem {
    const Real* logq = nullptr;            // (n, K)  log of the query probabilities
    const Real* p = nullptr;               // (n, K)  centre probabilities
    const std::int64_t* labels = nullptr;  // (n,)    centre labels in [0, C)
    std::int64_t n = 0;                    // number of points (queries = centres)
    std::int64_t K = 0;                    // simplex dimension
    std::int64_t C = 1;                    // number of label classes
    double scale = 1.0;                    // 1 / bandwidth
    const double* bias = nullptr;          // (n,)    bias of each centre
    const double* lse = nullptr;           // (n,)    log normaliser of each query row
    const double* coef = nullptr;          // (n, C)  dloss/dE - sum_c E dloss/dE, per query
};

/// Outputs.  A null grad_logq skips the query pass (row_sum is then ignored); a null
/// grad_p skips the centre pass (grad_bias is then ignored).  row_sum and grad_bias may
/// be null on their own.
struct LooGradResult {
    double* grad_logq = nullptr;  // (n, K)
    double* grad_p = nullptr;     // (n, K)
    double* grad_bias = nullptr;  // (n,)
    double* row_sum = nullptr;    // (n,)
};

/// Run the backward pass.  Throws std::invalid_argument on inconsistent sizes, labels or
/// a non-positive scale (before any parallel work starts); nothing inside the parallel
/// region can throw.  n_threads <= 0 uses the OpenMP default.  control (may be null):
/// rows_done grows by n per pass that runs (2 n for both).  Returns false when
/// control->cancel is set by the end of the call (the outputs may then be incomplete),
/// true otherwise.
bool loo_grad(const LooGradProblem<double>& prob, const LooGradResult& out, int n_threads,
              Control* control = nullptr);
bool loo_grad(const LooGradProblem<float>& prob, const LooGradResult& out, int n_threads,
              Control* control = nullptr);

}  // namespace kdecal
