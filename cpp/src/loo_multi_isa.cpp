// Kernel of the multi-label reduction (multi.hpp), compiled once per instruction set
// like loo_isa.cpp (KDECAL_ISA_NS = avx512 | avx2 | baseline); loo_multi.cpp picks one
// at run time.  Internal linkage everywhere except the two entry points, and no
// standard-library template is instantiated here.
//
// One task = one group of kMultiRows query rows.  For every tile of kColBlock centres:
// the K-dots of the rows with the tile (the micro-GEMM of the forward pass), the kernel
// weights w = exp(L - m) (zero below exp(-kDrop) and on the diagonal), transposed to
// (centre, row), and the list of centres with a non-zero weight for some row of the
// group.  Then the scatter: for each active centre i and label set b, one vector
// multiply-add of the group's weights into the kMultiRows contiguous accumulators of
// (b, labels[b, i]).  The label sets are visited in chunks whose accumulators fit in
// L1, each chunk sweeping the active centres of the tile.
//
// Every row is computed in its own vector lane with the same operations in the same
// order, whatever the other rows of its group are (a centre skipped for the group has
// a zero term in every row, and adding +0 changes nothing), so results depend neither
// on the grouping nor on the number of threads.
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "loo_isa_common.hpp"
#include "loo_multi_prepared.hpp"

KDECAL_DECLARE_MULTI_ISA(KDECAL_ISA_NS)

namespace kdecal {
namespace KDECAL_ISA_NS {
namespace {

using detail::kColBlock;
using detail::kMicroRows;
using detail::kMultiRows;
using detail::kPad;
using detail::MultiPrepared;

constexpr i64 RB = kMultiRows;
static_assert(RB % kMicroRows == 0, "a group is a whole number of micro-GEMM steps");

// Bytes of accumulators one chunk of label sets may occupy (about half of L1).
constexpr i64 kAccChunkBytes = 16 * 1024;

template <int POW, bool W>
inline void scatter_chunk(const i64* act, i64 na, const double* wT, const double* wT2,
                          const std::int32_t* off, const double* wt, i64 B, i64 b0, i64 b1,
                          double* __restrict acc, double* __restrict acc2) {
    for (i64 a = 0; a < na; ++a) {
        const i64 i = act[a];
        double wv[RB], wv2[RB];
        for (i64 r = 0; r < RB; ++r) {
            wv[r] = wT[i * RB + r];
            if (POW >= 2) wv2[r] = wT2[i * RB + r];
        }
        const std::int32_t* o = off + i * B;
        const double* v = W ? wt + i * B : nullptr;
        for (i64 b = b0; b < b1; ++b) {
            double* __restrict d = acc + o[b];
            if (W) {
                const double vb = v[b];
#pragma omp simd
                for (i64 r = 0; r < RB; ++r) d[r] += vb * wv[r];
                if (POW >= 2) {
                    double* __restrict d2 = acc2 + o[b];
#pragma omp simd
                    for (i64 r = 0; r < RB; ++r) d2[r] += vb * wv2[r];
                }
            } else {
#pragma omp simd
                for (i64 r = 0; r < RB; ++r) d[r] += wv[r];
                if (POW >= 2) {
                    double* __restrict d2 = acc2 + o[b];
#pragma omp simd
                    for (i64 r = 0; r < RB; ++r) d2[r] += wv2[r];
                }
            }
        }
    }
}

template <int POW, bool W, class Real>
void run_group(const MultiPrepared<Real>& mp, i64 q0, double* scratch) noexcept {
    const i64 K = mp.K, B = mp.B, C = mp.C, n = mp.n;
    const i64 nr = (mp.R - q0) < RB ? (mp.R - q0) : RB;
    const i64 nacc = B * C * RB;
    const double s = mp.scale;

    double* acc = scratch;                                  // (B, C, RB), 64-byte aligned
    double* acc2 = acc + nacc;                              // (B, C, RB) when POW == 2
    double* wT = acc + (POW >= 2 ? 2 : 1) * nacc;           // (kColBlock, RB)
    double* wT2 = wT + kColBlock * RB;                      // (kColBlock, RB)
    double* wr = wT2 + kColBlock * RB;                      // (RB, kColBlock)
    Real* g = reinterpret_cast<Real*>(wr + RB * kColBlock);  // (RB, kColBlock)
    i64* act = reinterpret_cast<i64*>(wr + 2 * RB * kColBlock);  // (kColBlock,)
    Real* lq = reinterpret_cast<Real*>(wr + 2 * RB * kColBlock + kColBlock);  // (RB, K)

    for (i64 x = 0; x < nacc; ++x) acc[x] = 0.0;
    if (POW >= 2)
        for (i64 x = 0; x < nacc; ++x) acc2[x] = 0.0;
    double mr[RB];
    i64 diag[RB];
    for (i64 r = 0; r < RB; ++r) {
        const i64 j = r < nr ? mp.rows[q0 + r] : -1;
        for (i64 k = 0; k < K; ++k) lq[r * K + k] = j >= 0 ? mp.logq[j * K + k] : Real(0);
        // padding rows: m = +inf, so that every term is dropped
        mr[r] = j >= 0 ? mp.mrow[q0 + r] : -kNegInf;
        diag[r] = j >= 0 ? mp.cinv[j] : -1;
    }
    // label sets per chunk: the chunk's accumulators take about kAccChunkBytes
    i64 bchunk = kAccChunkBytes / (C * RB * static_cast<i64>(sizeof(double)) * (POW >= 2 ? 2 : 1));
    if (bchunk < 1) bchunk = 1;

    for (i64 cb = 0; cb < n; cb += kColBlock) {
        const i64 ce = (cb + kColBlock) < n ? (cb + kColBlock) : n;
        i64 bc = ce - cb;
        bc = (bc + kPad - 1) / kPad * kPad;  // within n_pad; the padding has bias -inf
        for (i64 r0 = 0; r0 < RB; r0 += kMicroRows)
            gemm_micro(lq + r0 * K, K, mp.pt + cb * K, bc, g + r0 * kColBlock, kColBlock);

        // kernel weights, row-major: 0 below exp(-kDrop), and on the diagonal
        bool any_row = false;
        for (i64 r = 0; r < RB; ++r) {
            const Real* grow = g + r * kColBlock;
            double* w = wr + r * kColBlock;
            const double* bias = mp.bias + cb;
            const double off = mr[r];
            double mx = kNegInf;
#pragma omp simd reduction(max : mx)
            for (i64 i = 0; i < bc; ++i) {
                double x = bias[i] + s * static_cast<double>(grow[i]) - off;
                mx = x > mx ? x : mx;
                const bool drop = !(x >= -kDrop);
                x = drop ? -kDrop : (x > kClamp ? kClamp : x);
                const double e = exp_small(x);
                w[i] = drop ? 0.0 : e;
            }
            if (diag[r] >= cb && diag[r] < cb + bc) w[diag[r] - cb] = 0.0;
            any_row = any_row || mx >= -kDrop;
        }
        if (!any_row) continue;  // every term of the tile is dropped for the whole group

        // transpose to (centre, row); the centres with a term for some row
        i64 na = 0;
        for (i64 i = 0; i < bc; ++i) {
            double* t = wT + i * RB;
            double* t2 = wT2 + i * RB;
            bool any = false;
            for (i64 r = 0; r < RB; ++r) {
                const double v = wr[r * kColBlock + i];
                t[r] = v;
                if (POW >= 2) t2[r] = v * v;
                any = any || v != 0.0;
            }
            if (any) act[na++] = i;
        }
        if (na == 0) continue;

        const std::int32_t* off = mp.off + cb * B;
        const double* wt = W ? mp.wt + cb * B : nullptr;
        for (i64 b0 = 0; b0 < B; b0 += bchunk) {
            const i64 b1 = (b0 + bchunk) < B ? (b0 + bchunk) : B;
            scatter_chunk<POW, W>(act, na, wT, wT2, off, wt, B, b0, b1, acc, acc2);
        }
    }

    // write rows: S[b, row, c] = acc[(b * C + c) * RB + r]
    const i64 R = mp.R;
    for (i64 r = 0; r < nr; ++r) {
        const i64 row = mp.rows[q0 + r] - mp.row_start;
        for (i64 b = 0; b < B; ++b) {
            double* so = mp.S + (b * R + row) * C;
            const double* a = acc + b * C * RB + r;
            for (i64 c = 0; c < C; ++c) so[c] = a[c * RB];
            if (POW >= 2) {
                double* qo = mp.Q + (b * R + row) * C;
                const double* a2 = acc2 + b * C * RB + r;
                for (i64 c = 0; c < C; ++c) qo[c] = a2[c * RB];
            }
        }
    }
}

template <int POW, bool W, class Real>
void run_all(const MultiPrepared<Real>& mp, double* scratch, i64 per_thread, int n_threads) {
    const i64 ngroups = (mp.R + RB - 1) / RB;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (n_threads > 1)
#endif
    for (i64 q = 0; q < ngroups; ++q) {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        run_group<POW, W>(mp, q * RB, scratch + tid * per_thread);
    }
    (void)n_threads;
}

template <class Real>
void run(const MultiPrepared<Real>& mp, double* scratch, i64 per_thread, int n_threads) {
    const bool w = mp.wt != nullptr;
    if (mp.powers >= 2) {
        if (w) run_all<2, true>(mp, scratch, per_thread, n_threads);
        else run_all<2, false>(mp, scratch, per_thread, n_threads);
    } else {
        if (w) run_all<1, true>(mp, scratch, per_thread, n_threads);
        else run_all<1, false>(mp, scratch, per_thread, n_threads);
    }
}

}  // namespace

void multi_f64(const MultiPrepared<double>& mp, double* scratch, std::int64_t per_thread,
               int n_threads) {
    run(mp, scratch, per_thread, n_threads);
}

void multi_f32(const MultiPrepared<float>& mp, double* scratch, std::int64_t per_thread,
               int n_threads) {
    run(mp, scratch, per_thread, n_threads);
}

}  // namespace KDECAL_ISA_NS
}  // namespace kdecal
