// kdecal: streaming leave-one-out Dirichlet-kernel reduction (pure C++17, no Python).
//
// For query rows j and centres i != j (Popordanoska et al. 2022, Eq. 3 and 10, with the
// Dirichlet kernel Dir(f_i / h + 1) evaluated at f_j; its log is a rank-K product plus a
// per-centre bias):
//
//   G_ij = sum_k logq[j,k] * p[i,k]            (a GEMM tile, in the input precision)
//   L_ij = bias[t,i] + scale[t] * G_ij        (log-kernel up to the constant lgamma(1/h+K))
//   m_j  = max_{i != j} L_ij
//   S_c(j) = sum_{i != j, label_i = c} exp(L_ij - m_j)
//   Q_c(j) = sum ... exp(2 (L_ij - m_j)),   T_c(j) = sum ... exp(3 (L_ij - m_j))
//   D_c(j) = S_c(j)^2 - Q_c(j) = sum_{i != k, both != j, label_i = label_k = c} w_ij w_kj
//            (optional; the pair sums of the U-statistic debiasing)
//
// The n x n matrix is never formed: centres are sorted by label (then by predicted class
// and confidence) once, streamed in fixed-size tiles, and every query row keeps one
// running max and running sums per class (an online log-sum-exp).  Chunks of 32 centres
// more than kDrop = 64 below the running class maximum are skipped (< 1.6e-28 of it per
// term) and exp arguments are clamped at -kClamp = -230, which keeps every exp out of the
// subnormal range.
// D is accumulated as excess sums over each class's largest term, which is exactly 1
// relative to the class maximum and never added (2 e1 + e1^2 - e2 with e1 = S_c - 1,
// e2 = Q_c - 1 in units of the class maximum), so that it keeps its full relative
// precision when one neighbour dominates; S^2 - Q formed from the rounded S and Q would
// lose about log10(1 / D) digits there and depend on the summation order.
// Residual sums (optional, requested together): over ALL centres (every label class),
// relative to the same row max m_j and with the same dropping and clamping as S,
//   A_k(j) = sum_{i != j} exp(L_ij - m_j) p[i,k]          (p converted to double)
//   U(j)   = sum_{i != j} exp(2 (L_ij - m_j)) u[i]        (u: a float64 value per centre)
// computed in the same pass (each class segment keeps its partial A, U relative to its
// running class maximum, rescaled with S and Q, combined at the end like S).  S, Q, T, D
// are bit for bit the same whether or not A, U are requested.
// Results for a row do not depend on the number of threads: each row is reduced by one thread in a fixed order.
#pragma once

#include <atomic>
#include <cstdint>

namespace kdecal {

/// Progress and cancellation of one engine call (loo_reduce, loo_grad, loo_reduce_multi),
/// shared between the threads that run it and a thread that watches it (the Python
/// binding polls it for Ctrl-C and progress).  Workers add the query rows they finished
/// to rows_done after every row block (so it grows in steps of a block, in no particular
/// order of rows) and test cancel before starting one: once cancel is set, the remaining
/// blocks are skipped (a block already started runs to its end; nothing is thrown inside
/// a parallel region) and the call returns false, its outputs only partly written.
/// rows_done is never reset by the engine: one Control can follow several calls.
struct Control {
    std::atomic<std::int64_t> rows_done{0};
    std::atomic<bool> cancel{false};
};

/// Arguments of exp are clamped at -kClamp (exp(-3 kClamp) is still a normal double,
/// so the power sums never touch subnormals).
constexpr double kClamp = 230.0;
/// Ranges of centres whose largest log-kernel is more than kDrop below the running
/// class maximum are skipped: each term is < exp(-kDrop) ~ 1.6e-28 of that maximum.
constexpr double kDrop = 64.0;

/// Inputs of one leave-one-out reduction.  All pointers are row-major, C-contiguous.
template <class Real>
struct LooProblem {
    const Real* logq = nullptr;        // (n, K)  log of the query probabilities
    const Real* p = nullptr;           // (n, K)  centre probabilities
    const std::int64_t* labels = nullptr;  // (n,)    centre labels in [0, C)
    std::int64_t n = 0;                // number of points (queries = centres)
    std::int64_t K = 0;                // simplex dimension
    std::int64_t C = 1;                // number of label classes
    const double* scale = nullptr;     // (H,)    1 / bandwidth
    const double* bias = nullptr;      // (H, n)  -sum_k lgamma(p[i,k] / h + 1)
    std::int64_t H = 1;                // number of bandwidths
    int powers = 1;                    // 1: S; 2: S, Q; 3: S, Q, T
    std::int64_t row_start = 0;        // first query row
    std::int64_t row_stop = 0;         // one past the last query row
    const double* u = nullptr;         // (n,)    per-centre values of U (finite); needed
                                       //         iff the residual sums A, U are requested
};

/// Outputs; R = row_stop - row_start.  Q, T and D may be null when not requested; D
/// needs powers >= 2.  S, Q, T do not depend on whether D is requested.  A and U (the
/// residual sums) are requested together (both null or both non-null) and need
/// LooProblem::u; they do not depend on powers, and S, Q, T, D do not depend on them.
struct LooResult {
    double* m = nullptr;  // (H, R)
    double* S = nullptr;  // (H, R, C)
    double* Q = nullptr;  // (H, R, C) or null
    double* T = nullptr;  // (H, R, C) or null
    double* D = nullptr;  // (H, R, C) or null: S^2 - Q without cancellation (powers >= 2)
    double* A = nullptr;  // (H, R, K) or null: sum_{i != j} w_ij p[i, k]
    double* U = nullptr;  // (H, R) or null: sum_{i != j} w_ij^2 u[i]
};

/// Run the reduction.  Throws std::invalid_argument on inconsistent sizes or labels, on
/// A without U (or U without A), on A, U without u and on a non-finite u (before any
/// parallel work starts); never throws from inside a parallel region.
/// n_threads <= 0 uses the OpenMP default.  control (may be null): rows_done grows by
/// row_stop - row_start in all.  Returns false when control->cancel is set by the end of
/// the call (the outputs may then be incomplete), true otherwise.
bool loo_reduce(const LooProblem<double>& prob, const LooResult& out, int n_threads,
                Control* control = nullptr);
bool loo_reduce(const LooProblem<float>& prob, const LooResult& out, int n_threads,
                Control* control = nullptr);

/// Per-centre kernel bias of one bandwidth: out[i] = -sum_k lgamma(p[i, k] * scale + 1)
/// for the rows of p (rows x D, row-major), on the SIMD path of this CPU and n_threads
/// OpenMP threads (<= 0: the default); the same bits for any thread count.  Throws
/// std::invalid_argument (before any parallel work) unless scale is finite and positive
/// and every p[i, k] lies in [0, 1].
void kernel_bias(const double* p, std::int64_t rows, std::int64_t D, double scale, double* out,
                 int n_threads);

/// Name of the SIMD code path the dispatcher picks on this CPU ("avx512", "avx2",
/// "baseline"); the environment variable KDECAL_ISA can force a lower one.
const char* simd_path();

/// Whether the library was compiled with OpenMP, and its default thread count.
bool has_openmp();
int max_threads();

}  // namespace kdecal
