// Internal: the sorted, transposed data handed from the dispatcher (loo.cpp, compiled
// for the baseline ISA) to one of the SIMD kernels (loo_isa.cpp, compiled once per ISA).
// Plain data only: nothing here may instantiate a template shared across the two kinds
// of translation unit (an inline function compiled with AVX-512 flags could otherwise
// be picked by the linker for the baseline path).
#pragma once

#include <cstdint>

#include "kdecal/loo.hpp"

namespace kdecal {
namespace detail {

constexpr std::int64_t kRowBlock = 16;    // query rows per GEMM tile (and per task of the
                                          // backward and multi-label kernels)
constexpr std::int64_t kMaxTaskBlocks = 4;  // forward pass: up to 4 x kRowBlock rows per task
constexpr std::int64_t kMicroRows = 4;    // query rows per register-blocked GEMM step
constexpr std::int64_t kColBlock = 256;   // centres per tile
constexpr std::int64_t kPad = 32;         // GEMM columns are computed in multiples of this
constexpr std::int64_t kResMaxKB = 6;     // residual sums: rows of the centre tile per
                                          // register block (loo_isa.cpp, resid_group)

template <class Real>
struct Prepared {
    const Real* logq;          // (n, K)   queries, original order
    const Real* pt;            // (n_pad / kColBlock, K, kColBlock) centres sorted by label,
                               // in tiles of kColBlock, each tile transposed; zero-padded
                               // (and kPad more zeros at the end, read by the residual sums)
    const double* bias;        // (H, n)   bias of the sorted centres
    const double* scale;       // (H,)
    const std::int64_t* inv;   // (n,)     sorted position of original row j
    const std::int64_t* seg;   // (C + 1,) class c occupies sorted positions [seg[c], seg[c+1])
    std::int64_t n, n_pad, K, C, H;
    int powers;
    std::int64_t row_start, row_stop;
    Control* control;          // progress and cancellation, or null
    std::int64_t task_rows;    // query rows per task: a multiple of kRowBlock (task_rows())
    const double* u;           // (n + kPad) u of the sorted centres, zero-padded, or null:
                               // the residual sums A, U requested
    std::int64_t res_kb;       // residual sums: rows of pt per register block (1 .. kResMaxKB)
};

/// Progress and cancellation, for the kernels: whether the call was cancelled, and
/// count finished rows.  Both accept a null control.  Defined out of line in loo.cpp
/// (baseline ISA) so that no std::atomic member is instantiated in an ISA translation
/// unit; one call per row block costs nothing next to the block's work.
bool cancelled(const Control* control);
void add_rows(Control* control, std::int64_t rows);

/// SIMD path the dispatchers use on this CPU: 0 baseline, 1 avx2, 2 avx512 (after
/// the KDECAL_ISA override; defined in loo.cpp).
int isa_level();

/// Threads an engine call uses: ``n_threads`` if positive, else the OpenMP default (1
/// without OpenMP); defined in loo.cpp.
int resolve_threads(int n_threads);

/// Query rows per task of the forward pass.  Every task streams all the centre tiles
/// once (n (K + H) doubles: 88 MB at n = 10^6, K = 10), and its rows share each tile
/// while it is in cache, so tasks of 64 rows read a quarter of the tile traffic of tasks
/// of kRowBlock rows.  (On a 16-core Xeon whose 300 MB L3 holds the tiles, the difference
/// was within the machine's run-to-run noise; bench/README.md.)  Tasks take up to
/// kMaxTaskBlocks GEMM tiles of rows, fewer where the per-task accumulators (6 H C
/// doubles per row) would leave the L2 cache or where there would be fewer than 16
/// tasks per thread to balance.  ``KDECAL_TASK_ROWS`` (a multiple of kRowBlock, at most
/// 16 of them; benchmarks only) overrides the choice.
/// ``per_class``: accumulator doubles per (bandwidth, row, class): 6, plus K + 1 with the
/// residual sums.
std::int64_t task_rows(std::int64_t rows, std::int64_t C, std::int64_t H, int n_threads,
                       std::int64_t per_class = 6);

/// Doubles of scratch one thread needs (the GEMM tile and the task's queries, then the
/// running max, the three power sums and the two excess sums of every (bandwidth, row,
/// class) of a task of ``rows`` query rows; with the residual sums (``res``) also their
/// K + 1 partial sums per (bandwidth, row, class), the kernel weights of a GEMM block's
/// rows, kRowBlock x (kColBlock + 2 kPad), and K + 1 doubles for padding rows).
inline std::int64_t scratch_doubles(std::int64_t K, std::int64_t C, std::int64_t H,
                                    std::int64_t rows, bool res = false) {
    return kRowBlock * kColBlock + rows * K + 6 * H * rows * C + 64 +
           (res ? (K + 1) * H * rows * C + kRowBlock * (kColBlock + 2 * kPad) + K + 1 : 0);
}

}  // namespace detail
}  // namespace kdecal

// One set of these per ISA namespace (avx512, avx2, baseline).
#define KDECAL_DECLARE_ISA(ns)                                                         \
    namespace kdecal {                                                                 \
    namespace ns {                                                                     \
    void run_f64(const detail::Prepared<double>& pr, const LooResult& out,             \
                 double* scratch, std::int64_t scratch_per_thread, int n_threads);      \
    void run_f32(const detail::Prepared<float>& pr, const LooResult& out,              \
                 double* scratch, std::int64_t scratch_per_thread, int n_threads);      \
    void kernel_bias(const double* p, std::int64_t rows, std::int64_t D, double scale, \
                     double* out, int n_threads);                                       \
    }                                                                                  \
    }
