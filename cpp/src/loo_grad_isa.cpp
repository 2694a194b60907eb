// Kernel of the backward pass (loo_grad.hpp), compiled once per instruction set like
// loo_isa.cpp (KDECAL_ISA_NS = avx512 | avx2 | baseline); loo_grad.cpp picks one at run
// time.  Internal linkage everywhere except the two entry points, and no
// standard-library template is instantiated here.
//
// One task = kRowBlock output rows.  For every tile of kColBlock columns: the K-dots of
// the rows with the tile (the register-blocked micro-GEMM of the forward pass), then per
// row the shifted log-weights, their exps, the coefficients, and K weighted sums of the
// tile's own rows (the "values").  Memory per thread: one tile of dots and a few rows.
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "loo_grad_prepared.hpp"
#include "loo_isa_common.hpp"

KDECAL_DECLARE_GRAD_ISA(KDECAL_ISA_NS)

namespace kdecal {
namespace KDECAL_ISA_NS {
namespace {

using detail::GradPass;
using detail::kColBlock;
using detail::kMicroRows;
using detail::kPad;
using detail::kRowBlock;

// out[k] += sum_c x[c] * tile[k][c] for c < len, four k at a time so that the
// reductions run as independent chains.
template <class Real>
inline void weighted_rows(const double* x, const Real* tile, i64 len, i64 K, double* out) {
    i64 k = 0;
    for (; k + 4 <= K; k += 4) {
        const Real* t0 = tile + k * kColBlock;
        const Real* t1 = t0 + kColBlock;
        const Real* t2 = t1 + kColBlock;
        const Real* t3 = t2 + kColBlock;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (i64 c = 0; c < len; ++c) {
            const double w = x[c];
            a0 += w * static_cast<double>(t0[c]);
            a1 += w * static_cast<double>(t1[c]);
            a2 += w * static_cast<double>(t2[c]);
            a3 += w * static_cast<double>(t3[c]);
        }
        out[k] += a0;
        out[k + 1] += a1;
        out[k + 2] += a2;
        out[k + 3] += a3;
    }
    for (; k < K; ++k) {
        const Real* t = tile + k * kColBlock;
        double a = 0.0;
#pragma omp simd reduction(+ : a)
        for (i64 c = 0; c < len; ++c) a += x[c] * static_cast<double>(t[c]);
        out[k] += a;
    }
}

template <int MODE, class Real>
void grad_block(const GradPass<Real>& gp, i64 r0, double* scratch) noexcept {
    const i64 K = gp.K, n = gp.n, C = gp.C;
    const i64 nr = (n - r0) < kRowBlock ? (n - r0) : kRowBlock;
    const double s = gp.scale;

    Real* g = reinterpret_cast<Real*>(scratch);                               // kRowBlock x kColBlock
    Real* rv = reinterpret_cast<Real*>(scratch + kRowBlock * kColBlock);      // kRowBlock x K
    double* x = scratch + kRowBlock * kColBlock + kRowBlock * K;              // kColBlock
    double* acc = x + kColBlock;                                              // kRowBlock x K
    double* accs = acc + kRowBlock * K;                                       // kRowBlock
    for (i64 r = 0; r < kRowBlock; ++r)
        for (i64 k = 0; k < K; ++k) rv[r * K + k] = r < nr ? gp.rows[(r0 + r) * K + k] : Real(0);
    for (i64 i = 0; i < kRowBlock * K; ++i) acc[i] = 0.0;
    for (i64 r = 0; r < kRowBlock; ++r) accs[r] = 0.0;

    i64 c_first = 0;  // mode 0: first class overlapping the tile
    for (i64 cb = 0; cb < n; cb += kColBlock) {
        const i64 ce = (cb + kColBlock) < n ? (cb + kColBlock) : n;
        const i64 len = ce - cb;
        const i64 bc = (len + kPad - 1) / kPad * kPad;  // within n_pad
        const Real* tile = gp.tiles + cb * K;
        for (i64 rr = 0; rr < nr; rr += kMicroRows)
            gemm_micro(rv + rr * K, K, tile, bc, g + rr * kColBlock, kColBlock);
        if (MODE == 0)
            while (c_first < C && gp.seg[c_first + 1] <= cb) ++c_first;
        const double* coff = gp.col_off + cb;

        for (i64 r = 0; r < nr; ++r) {
            const i64 row = r0 + r;
            const Real* grow = g + r * kColBlock;
            const double ro = gp.row_off[row];
            double mx = kNegInf;
#pragma omp simd reduction(max : mx)
            for (i64 c = 0; c < len; ++c) {
                const double v = ro + s * static_cast<double>(grow[c]) + coff[c];
                x[c] = v;
                mx = v > mx ? v : mx;
            }
            // Every weight of this tile below exp(-kDrop) ~ 1.6e-28: skip it.  (The
            // row's own point can only make this test pass more often.)
            if (!(mx >= -kDrop)) continue;
            const i64 d = (gp.diag ? gp.diag[row] : row) - cb;
            if (d >= 0 && d < len) x[d] = kNegInf;  // leave one out
            const double lo = opaque(-kClamp), hi = opaque(kClamp);
#pragma omp simd
            for (i64 c = 0; c < len; ++c) {
                const double v = x[c];
                double vc = v < lo ? lo : v;  // two selects: GCC 12 if-converts no
                vc = vc > hi ? hi : vc;       // three-way merge for AVX2
                const double w = exp_small(vc);
                // 0 below -kClamp (the diagonal's -inf included)
                x[c] = keep_or_zero(v >= lo, w);
            }
            if constexpr (MODE == 0) {
                const double* crow = gp.coef + row * C;
                for (i64 c = c_first; c < C && gp.seg[c] < ce; ++c) {
                    const i64 lo = (gp.seg[c] > cb ? gp.seg[c] : cb) - cb;
                    const i64 hi = (gp.seg[c + 1] < ce ? gp.seg[c + 1] : ce) - cb;
                    const double cf = crow[c];
#pragma omp simd
                    for (i64 t = lo; t < hi; ++t) x[t] *= cf;
                }
            } else {
                const double* cf = gp.coef + gp.row_label[row] * n + cb;
#pragma omp simd
                for (i64 c = 0; c < len; ++c) x[c] *= cf[c];
            }
            double sw = 0.0;
#pragma omp simd reduction(+ : sw)
            for (i64 c = 0; c < len; ++c) sw += x[c];
            accs[r] += sw;
            weighted_rows(x, tile, len, K, acc + r * K);
        }
    }

    for (i64 r = 0; r < nr; ++r) {
        const i64 row = r0 + r;
        for (i64 k = 0; k < K; ++k) gp.out[row * K + k] = s * acc[r * K + k];
        if (gp.out_sum) gp.out_sum[row] = accs[r];
    }
}

template <int MODE, class Real>
void run_mode(const GradPass<Real>& gp, double* scratch, i64 per_thread, int n_threads) {
    const i64 nblocks = (gp.n + kRowBlock - 1) / kRowBlock;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (n_threads > 1)
#endif
    for (i64 b = 0; b < nblocks; ++b) {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        if (detail::cancelled(gp.control)) continue;  // skip the remaining blocks
        const i64 r0 = b * kRowBlock;
        grad_block<MODE>(gp, r0, scratch + tid * per_thread);
        detail::add_rows(gp.control, (gp.n - r0) < kRowBlock ? (gp.n - r0) : kRowBlock);
    }
    (void)n_threads;
}

template <class Real>
void run(const GradPass<Real>& gp, double* scratch, i64 per_thread, int n_threads) {
    if (gp.mode == 0)
        run_mode<0>(gp, scratch, per_thread, n_threads);
    else
        run_mode<1>(gp, scratch, per_thread, n_threads);
}

}  // namespace

void grad_f64(const GradPass<double>& gp, double* scratch, std::int64_t per_thread,
              int n_threads) {
    run(gp, scratch, per_thread, n_threads);
}

void grad_f32(const GradPass<float>& gp, double* scratch, std::int64_t per_thread,
              int n_threads) {
    run(gp, scratch, per_thread, n_threads);
}

}  // namespace KDECAL_ISA_NS
}  // namespace kdecal
