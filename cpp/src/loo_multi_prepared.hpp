// Internal: the sorted, transposed data of one multi-label reduction (multi.hpp), handed
// from the dispatcher (loo_multi.cpp, baseline ISA) to a kernel compiled once per ISA
// (loo_multi_isa.cpp).  Plain data only (see loo_prepared.hpp for why).
//
// Centres are sorted by the arg max of p and kept in the transposed, zero-padded tiles
// of the main engine; the query rows of [row_start, row_stop) are processed in groups
// of kMultiRows, in the order of the arg max of logq, so that at small bandwidths the
// rows of a group share their near centres and a centre negligible for the whole group
// is skipped.  The accumulators of one group are laid out (b, c, r): the kMultiRows rows
// of one (b, c) are contiguous, so that adding a centre's term for label set b is one
// vector multiply-add over the rows at offset (b * C + labels[b, i]) * kMultiRows.
#pragma once

#include <cstdint>

#include "loo_prepared.hpp"

namespace kdecal {
namespace detail {

constexpr std::int64_t kMultiRows = 8;  // query rows per group (one vector of doubles)

template <class Real>
struct MultiPrepared {
    const Real* logq;           // (n, K)  queries, original order
    const Real* pt;             // (n_pad / kColBlock, K, kColBlock) sorted centres, tiles
                                // transposed, zero-padded
    const double* bias;         // (n_pad,) bias of the sorted centres, -inf in the padding
    const std::int64_t* cinv;   // (n,)    sorted position of centre (original index) i
    const std::int64_t* rows;   // (R,)    query rows (original index) in processing order
    const double* mrow;         // (R,)    m of those rows (+inf where m = -inf: no term)
    const std::int32_t* off;    // (n, B)  sorted centre s, set b: (b * C + label) * kMultiRows
    const double* wt;           // (n, B)  sorted centre s, set b: weight; null: all 1
    std::int64_t n, n_pad, K, B, C;
    double scale;
    int powers;
    std::int64_t row_start, R;
    double* S;                  // (B, R, C)
    double* Q;                  // (B, R, C) or null
};

/// Doubles of scratch one thread needs (without the 64-byte alignment slack).
inline std::int64_t multi_scratch_doubles(std::int64_t K, std::int64_t B, std::int64_t C,
                                          int powers) {
    const std::int64_t acc = B * C * kMultiRows;
    return kMultiRows * kColBlock      // dot products (Real)
           + kMultiRows * K + 8        // query rows (Real)
           + kMultiRows * kColBlock    // kernel weights, row-major
           + 2 * kColBlock * kMultiRows  // kernel weights and squares, transposed
           + kColBlock                 // active centres of the tile (int64)
           + acc * (powers >= 2 ? 2 : 1);
}

}  // namespace detail
}  // namespace kdecal

// One set of these per ISA namespace (avx512, avx2, baseline).
#define KDECAL_DECLARE_MULTI_ISA(ns)                                                   \
    namespace kdecal {                                                                 \
    namespace ns {                                                                     \
    void multi_f64(const detail::MultiPrepared<double>& mp, double* scratch,           \
                   std::int64_t scratch_per_thread, int n_threads);                    \
    void multi_f32(const detail::MultiPrepared<float>& mp, double* scratch,            \
                   std::int64_t scratch_per_thread, int n_threads);                    \
    }                                                                                  \
    }
