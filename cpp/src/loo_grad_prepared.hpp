// Internal: one pass of the backward reduction, as handed from the dispatcher
// (loo_grad.cpp, baseline ISA) to a kernel compiled once per ISA (loo_grad_isa.cpp).
// Plain data only (see loo_prepared.hpp for why).
//
// Both passes of loo_grad have the same shape: output rows r (original order) against
// tiles of columns c, with
//
//   x_rc = row_off[r] + scale * <rows[r], column c> + col_off[c],   w_rc = exp(x_rc),
//   out[r, k] += w_rc coef_rc column_c[k],   out_sum[r] += w_rc coef_rc,
//
// the column's own vector doubling as the value that is summed.
//
//   query pass (mode 0): rows = queries j (logq), columns = centres sorted by label
//     (p), row_off = -lse, col_off = bias, coef_rc = coef[j, class of the column's
//     segment];
//   centre pass (mode 1): rows = centres i (p), columns = the queries in the
//     dispatcher's order (logq), row_off = bias, col_off = -lse,
//     coef_rc = coefT[label_i, column].
#pragma once

#include <cstdint>

#include "loo_prepared.hpp"

namespace kdecal {
namespace detail {

template <class Real>
struct GradPass {
    const Real* rows;               // (n, K) row vectors, original order
    const double* row_off;          // (n,)
    const Real* tiles;              // (n_pad / kColBlock, K, kColBlock) column vectors,
                                    // each tile transposed; zero-padded
    const double* col_off;          // (n,) in column order
    const double* coef;             // mode 0: (n, C) [row][class]; mode 1: (C, n) [class][column]
    const std::int64_t* seg;        // mode 0: (C + 1,) columns of class c are [seg[c], seg[c+1])
    const std::int64_t* row_label;  // mode 1: (n,) class of each row
    const std::int64_t* diag;       // (n,) column of each row's own point
    std::int64_t n, n_pad, K, C;
    double scale;
    int mode;
    double* out;      // (n, K), scaled by `scale`
    double* out_sum;  // (n,) or null
    Control* control;  // progress and cancellation, or null
};

/// Doubles of scratch one thread needs for a backward pass.
inline std::int64_t grad_scratch_doubles(std::int64_t K) {
    return kRowBlock * kColBlock + kRowBlock * K + kColBlock + kRowBlock * K + kRowBlock + 64;
}

}  // namespace detail
}  // namespace kdecal

// One set of these per ISA namespace (avx512, avx2, baseline).
#define KDECAL_DECLARE_GRAD_ISA(ns)                                                    \
    namespace kdecal {                                                                 \
    namespace ns {                                                                     \
    void grad_f64(const detail::GradPass<double>& gp, double* scratch,                 \
                  std::int64_t scratch_per_thread, int n_threads);                     \
    void grad_f32(const detail::GradPass<float>& gp, double* scratch,                  \
                  std::int64_t scratch_per_thread, int n_threads);                     \
    }                                                                                  \
    }
