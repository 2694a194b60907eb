// kdecal: fast leave-one-out sums of binary (K = 2, Beta-kernel) problems.
//
// The same accumulators as kdecal::loo_reduce (loo.hpp) for problems whose points are
// p_i = (p_i0, p_i1) ~ (1 - x_i, x_i), without the O(n^2) loop:
//
//   L_ij = bias[t, i] + scale[t] * (logq[j, 0] p[i, 0] + logq[j, 1] p[i, 1])
//   m_j  = max_{i != j} L_ij,  S_c, Q_c, T_c, D_c as in loo.hpp,
//   A_k(j) = sum_{i != j} exp(L_ij - m_j) p[i, k]           (optional, k = 0, 1)
//   U(j)   = sum_{i != j} exp(2 (L_ij - m_j)) u[i]          (optional)
//
// L_ij is strictly concave in the centre's coordinate x_i (its second derivative is
// -(psi'(x_i/h + 1) + psi'((1 - x_i)/h + 1)) scale^2 < 0), so for every query and label
// class the centres within T nats of the class maximum form one contiguous run of the
// centres sorted by x, and the maximum sits next to the root of the derivative
// psi(p0/h + 1) - psi(p1/h + 1) = logq[j,0] - logq[j,1] (found by binary search).
//
// Two methods (docs/guide/binary_engine.md derives the error bounds):
//  - window: the exact terms of that run (L computed exactly as loo_reduce computes it,
//    so m is bit-identical), O(n * window).
//  - binned: centres in coarse cells of width cell_width sqrt(h)/2 in z = arcsin sqrt(x)
//    (the kernel's width is nearly uniform in z), each split into kSub = 4 fine cells; per
//    cell and class the moments sum e^{q phi_i} g_i d_i^p / p! (p <= kMaxOrder) of
//    d_i = x_i - x_ref; a query's cell sum is a Taylor series in kappa d, kappa = scale
//    times the difference of the logits of query and reference, its order chosen per
//    (query, cell) from the remainder bound (a coarse cell whose series would be too long
//    is taken as its fine cells, a fine one is summed exactly); every accumulator keeps
//    an absolute error bound (truncation, rounding, the log-kernel's rounding), and a
//    (query, class) whose bound exceeds kTolCheck of its value is recomputed by the
//    window method.  Cost O(n log n + n W P) for W cells per window and order P.
//  The window method keeps the terms within T = max(kDrop, ln n + 36) nats of the class
//  maximum, the binned one within ln n + 36 (each term left out is below e^-T of the
//  maximum's, all of them below n e^-T <= 2.4e-16 of it); the pair sums D go deeper where
//  e1 is small (docs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kdecal/loo.hpp"

namespace kdecal {

enum class BinaryMethod : int { window = 0, binned = 1, local = 2 };

/// Inputs of one binary problem (a batch of B problems sharing n, H, C).  Row-major,
/// C-contiguous; the same arrays loo_reduce takes for K = 2 (float64 only).
struct BinaryProblem {
    const double* logq = nullptr;          // (B, n, 2) log query points
    const double* p = nullptr;             // (B, n, 2) centre points (1 - x, x)
    const std::int64_t* labels = nullptr;  // (B, n)    labels in [0, C)
    const double* u = nullptr;             // (B, n)    residual weights (U), or null
    const double* v = nullptr;             // (B, n)    centre weights (>= 0), or null: every
                                           //           term of S, A times v_i, of Q times
                                           //           v_i^2 (U's: none; m ignores them);
                                           //           powers <= 2, no D
    std::int64_t B = 1;
    std::int64_t n = 0;
    std::int64_t C = 1;
    const double* scale = nullptr;         // (H,)       1 / h
    const double* bias = nullptr;          // (B, H, n)  -lgamma(p0/h + 1) - lgamma(p1/h + 1)
    std::int64_t H = 1;
    int powers = 1;                        // 1: S; 2: S, Q; 3: S, Q, T
    std::int64_t row_start = 0;
    std::int64_t row_stop = 0;
    double cell_width = 0.8;               // binned: coarse cell width, units of sqrt(h)/2
    double ref_floor = 0.0;                // with v: each weighted sum's accuracy relative
                                           //   to at least ref_floor^q times the class
                                           //   maximum's unweighted term (q: its power),
                                           //   not only to the sum itself (>= 0)
    bool weighted_rows = false;            // with v: only the rows with v_j > 0 are
                                           //   queries (a bootstrap sample's rows); the
                                           //   others' outputs are those of a row without
                                           //   centres (m = -inf, sums 0)
};

/// Outputs (R = row_stop - row_start).  Null pointers for what is not wanted; D needs
/// powers >= 2, U needs u.
struct BinaryResult {
    double* m = nullptr;  // (B, H, R)
    double* S = nullptr;  // (B, H, R, C)
    double* Q = nullptr;  // (B, H, R, C)
    double* T = nullptr;  // (B, H, R, C)
    double* D = nullptr;  // (B, H, R, C)
    double* A = nullptr;  // (B, H, R, 2)
    double* U = nullptr;  // (B, H, R)
};

/// Counters of one call (diagnostics and tests).
struct BinaryStats {
    std::int64_t pairs_direct = 0;   // (query, centre) terms summed exactly
    std::int64_t cells_taylor = 0;   // (query, cell) Taylor evaluations
    std::int64_t terms_taylor = 0;   // sum of their orders + 1
    std::int64_t fallbacks = 0;      // (query, class) recomputed by the window method
    std::int64_t pairs_long = 0;     // direct terms of fine cells whose series was too long
    std::int64_t pairs_fallback = 0; // terms of those window recomputations
    std::int64_t rows_local = 0;     // (query, class) from a group's local expansion
    std::int64_t groups_local = 0;   // (group, class) local expansions built
};

/// The sorted centres of a batch of binary problems (logq, p, labels as in
/// BinaryProblem, which must outlive the plan and not change), and a cache of the
/// per-bandwidth cells of the calls it serves (at most kPlanBytes, least recently used
/// out): a bandwidth search makes many calls on the same points.  A call uses the plan
/// when its logq, p (the same pointers), B, n, C and labels (equal values) are the
/// plan's; the results are bit-identical with and without it.  Calls may share a plan from several threads.
class BinaryPlan {
public:
    BinaryPlan(const double* logq, const double* p, const std::int64_t* labels, std::int64_t B,
               std::int64_t n, std::int64_t C);
    ~BinaryPlan();
    BinaryPlan(const BinaryPlan&) = delete;
    BinaryPlan& operator=(const BinaryPlan&) = delete;
    struct Impl;
    std::unique_ptr<Impl> impl;
};

/// Bytes of cells a plan keeps.
constexpr std::size_t kPlanBytes = std::size_t(256) << 20;

/// Run the reduction.  Throws std::invalid_argument on bad sizes, labels, powers, rows,
/// non-finite inputs or p outside [0, 1] (before any parallel work).  Every (query,
/// class) is computed by one thread in a fixed order: the bits do not depend on the
/// number of threads.  control: progress (rows_done grows by B H R in all) and
/// cancellation as in loo_reduce; returns false when cancelled.  plan: see BinaryPlan.
bool binary_reduce(const BinaryProblem& prob, const BinaryResult& out, BinaryMethod method,
                   int n_threads, Control* control = nullptr, BinaryStats* stats = nullptr,
                   BinaryPlan* plan = nullptr);

/// Highest Taylor order of the binned method.
constexpr int kMaxOrder = 24;
/// Relative truncation tolerance per cell (before the allowance of far cells).
constexpr double kTolCell = 1e-10;
/// A (query, class) whose error bound exceeds kTolCheck of a value is recomputed exactly
/// (D = 2 e1 + e1^2 - e2 then errs by at most 3 kTolCheck relative).
constexpr double kTolCheck = 3e-9;

/// The centre role of the backward pass of binary problems (kdecal::loo_grad's grad_p
/// and grad_bias for K = 2, without the O(n^2) loop).  With L_ij as in BinaryProblem
/// (one bandwidth), w_ij = exp(L_ij - lse[j]) and the label c_i of centre i:
///
///   grad_bias[i]  =         sum_{j != i} w_ij coef[j, c_i]
///   grad_p[i, k]  = scale * sum_{j != i} w_ij coef[j, c_i] logq[j, k]      (k = 0, 1)
///
/// sums over the queries j of each centre i (the transpose of binary_reduce's sums).
/// L_ij = bias_i + s (logq_j0 + x_i t_j) with x_i = p_i1, t_j = logq_j1 - logq_j0, so
/// around a cell of queries (width cell_width sqrt(h)/2 in z = arcsin sqrt(x), reference
/// t_C, x_C) the pair term factors into the centre's exp(bias_i + s x_i t_C), the query's
/// exp(s (logq_j0 + x_C (t_j - t_C)) - lse_j) coef logq, and exp(kappa d_j) with
/// kappa = s (x_i - x_C) and d_j = t_j - t_C: a Taylor series in kappa over the cell's
/// moments (docs/guide/binary_engine.md, "The backward pass").  Cells with x_C > 1/2
/// use the same factorisation of L_ij = bias_i + s (logq_j1 - (1 - x_i) t_j).  Every accumulator keeps
/// an absolute error bound (truncation, rounding, the cells left out by the envelope of
/// the concave log-kernel), and a centre whose bound exceeds kTolCheck of the sum of its
/// terms' magnitudes (a lower bound of it) is summed exactly over all queries.
struct BinaryGradProblem {
    const double* logq = nullptr;          // (B, n, 2)
    const double* p = nullptr;             // (B, n, 2)
    const std::int64_t* labels = nullptr;  // (B, n) in [0, C)
    std::int64_t B = 1;
    std::int64_t n = 0;
    std::int64_t C = 1;
    double scale = 1.0;                    // 1 / h
    const double* bias = nullptr;          // (B, n)
    const double* lse = nullptr;           // (B, n)
    const double* coef = nullptr;          // (B, n, C)
    double cell_width = 0.5;               // units of sqrt(h) / 2 in z
};

struct BinaryGradResult {
    double* grad_p = nullptr;     // (B, n, 2)
    double* grad_bias = nullptr;  // (B, n)
};

struct BinaryGradStats {
    std::int64_t cells_taylor = 0;  // (centre, cell) Taylor evaluations
    std::int64_t terms_taylor = 0;  // sum of their orders + 1
    std::int64_t pairs_direct = 0;  // (centre, query) terms summed exactly
    std::int64_t fallbacks = 0;     // centres summed exactly over all queries
};

/// Run it.  Throws std::invalid_argument on bad sizes, labels, non-finite inputs or p
/// outside [0, 1] (before any parallel work).  Each centre is computed by one thread in
/// a fixed order (bits independent of the thread count).  control: rows_done grows by
/// B n in all; returns false when cancelled.
bool binary_grad_centres(const BinaryGradProblem& prob, const BinaryGradResult& out,
                         int n_threads, Control* control = nullptr,
                         BinaryGradStats* stats = nullptr);

}  // namespace kdecal
