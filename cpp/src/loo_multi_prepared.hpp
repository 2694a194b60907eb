// Internal: the sorted, transposed data of one multi-label reduction (multi.hpp), handed
// from the dispatcher (loo_multi.cpp, baseline ISA) to a kernel compiled once per ISA
// (loo_multi_isa.cpp).  Plain data only (see loo_prepared.hpp for why).
//
// Centres are sorted by the arg max of p, then the largest p (order.hpp), and kept in the
// transposed, zero-padded tiles of the main engine; the query rows of [row_start,
// row_stop) are processed in groups of kMultiRows, in the same order of logq, so that at
// small bandwidths the rows of a group share their near centres and a tile negligible for
// the whole group is skipped.
//
// The label sets are stored per panel of panel_tiles consecutive tiles as a sparse
// (label set b, class c) x (centre) matrix in compressed rows: for panel t, set b and
// class c, the entries [panel_base[t] + ptr[t][b C + c], panel_base[t] +
// ptr[t][b C + c + 1]) list the centres of the panel (idx, the offset inside the panel)
// with labels[b, i] = c, in increasing order, and their weights (val; entries of weight
// 0 are left out).  A group's class sums for one panel are then sparse-times-dense
// products: per (b, c), the sum over the entries of val * (the kMultiRows weights of the
// group's rows for that centre), accumulated in registers, and one read-modify-write of
// the group's (b, c) accumulators.  Panels grow with the number of classes so that the
// segments stay long (each costs a loop exit and a read-modify-write).
#pragma once

#include <cstdint>

#include "loo_prepared.hpp"

namespace kdecal {
namespace detail {

constexpr std::int64_t kMultiRows = 8;  // query rows per group (one vector of doubles)

template <class Real>
struct MultiPrepared {
    const Real* logq;             // (n, K)  queries, original order
    const Real* pt;               // (n_pad / kColBlock, K, kColBlock) sorted centres, tiles
                                  // transposed, zero-padded
    const double* bias;           // (n_pad,) bias of the sorted centres, -inf in the padding
    const std::int64_t* cinv;     // (n,)    sorted position of centre (original index) i
    const std::int64_t* rows;     // (R,)    query rows (original index) in processing order
    const double* mrow;           // (R,)    m of those rows (+inf where m = -inf: no term)
    const std::int64_t* panel_base;  // (n_panels,) first entry of each panel
    const std::uint32_t* ptr;     // (n_panels, B C + 1) entries of (panel, b, c), from panel_base
    const std::uint16_t* idx;     // (entries,) centre inside the panel
    const double* val;            // (entries,) weight; null: all 1
    const double* uval;           // (entries,) weight * u (u without weights), or null: no U
    std::int64_t n, n_pad, K, B, C;
    std::int64_t panel_tiles;     // tiles per panel
    double scale;
    int powers;
    std::int64_t row_start, R;
    double* S;                    // (B, R, C)
    double* Q;                    // (B, R, C) or null
    Control* control;             // progress and cancellation, or null
    double* U;                    // (B, R) or null (with uval)
    double* W;                    // (R, n) kernel weights of the rows, centres in sorted
                                  // order (kernel_weights), or null: the sums above
    float* W32;                   // the same weights rounded to float (kernel_weights
                                  // with float output), or null
};

/// Doubles of scratch one thread needs (without the 64-byte alignment slack).
inline std::int64_t multi_scratch_doubles(std::int64_t K, std::int64_t B, std::int64_t C,
                                          int powers, std::int64_t panel_tiles,
                                          bool u = false) {
    const std::int64_t acc = B * C * kMultiRows;
    return acc * (powers >= 2 ? 2 : 1)  // accumulators (b, c, row)
           + (u ? B * kMultiRows : 0)   // accumulators of U (b, row)
           + 2 * panel_tiles * kColBlock * kMultiRows  // weights and squares, (centre, row)
           + kMultiRows * kColBlock       // kernel weights, (row, centre)
           + kMultiRows * kColBlock       // dot products (Real)
           + kMultiRows * K + 8;          // query rows (Real)
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
