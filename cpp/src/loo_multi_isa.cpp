// Kernel of the multi-label reduction (multi.hpp), compiled once per instruction set
// like loo_isa.cpp (KDECAL_ISA_NS = avx512 | avx2 | baseline); loo_multi.cpp picks one
// at run time.  Internal linkage everywhere except the two entry points, and no
// standard-library template is instantiated here.
//
// One task = one group of kMultiRows query rows.  For every tile of kColBlock centres:
// the K-dots of the rows with the tile (the micro-GEMM of the forward pass) and the
// kernel weights w = exp(L - m) (zero below exp(-kDrop), exp(-kClamp) with centre
// weights, and on the diagonal),
// transposed to (centre, row), so that a centre's weights for the group are one
// vector.  Then, per panel of tiles, for each label set b and class c, the sum over the
// panel's centres of that class (the panel's compressed rows, loo_multi_prepared.hpp)
// of weight * vector, in four register accumulators, added once into the group's
// (b, c) accumulators.  The residual sums U (UU) are the same products with the squared
// weights and weight * u, over all the entries of label set b (its classes' segments are
// consecutive), into the group's (b) accumulators.
//
// With an output W (kernel_weights), the tiles' weights are written out instead, in the
// centres' sorted order, and nothing is summed; there they are kept down to
// exp(-kClamp) instead of exp(-kDrop).
//
// Every row is computed in its own vector lane with the same operations in the same
// order, whatever the other rows of its group are (a tile skipped for the group has
// only zero terms in every row, and adding +0 changes nothing), so results depend
// neither on the grouping nor on the number of threads.
#include <cstdint>
#include <cstring>

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

// One row vector: the kMultiRows weights of a centre for the group's rows.  With GCC
// and Clang a few vectors of the ISA's native width (one zmm on AVX-512, two ymm on
// AVX2, four xmm on the baseline; wider generic vectors are lowered badly), so that
// the accumulators of a segment live in registers; elsewhere an array that the
// compiler may vectorise.  Helpers take references: no vector type crosses a function
// boundary by value, whose ABI would depend on the ISA flags.
#if defined(__GNUC__) || defined(__clang__)
#if defined(__AVX512F__)
constexpr i64 kLane = 8;
#elif defined(__AVX__)
constexpr i64 kLane = 4;
#else
constexpr i64 kLane = 2;
#endif
static_assert(RB % kLane == 0, "a group is a whole number of native vectors");
typedef double Lane __attribute__((vector_size(kLane * sizeof(double))));
constexpr i64 kParts = RB / kLane;
struct RowVec {
    Lane v[kParts];
};
inline void row_zero(RowVec& a) {
    for (i64 u = 0; u < kParts; ++u) a.v[u] = Lane{};
}
inline void row_fma(RowVec& a, double s, const double* p) {  // a += s * p[0..RB)
    for (i64 u = 0; u < kParts; ++u) {
        Lane x;
        std::memcpy(&x, p + u * kLane, sizeof x);
        a.v[u] += s * x;
    }
}
inline void row_add(RowVec& a, const double* p) {  // a += p[0..RB)
    for (i64 u = 0; u < kParts; ++u) {
        Lane x;
        std::memcpy(&x, p + u * kLane, sizeof x);
        a.v[u] += x;
    }
}
inline void row_flush(double* p, const RowVec& a0, const RowVec& a1, const RowVec& a2,
                      const RowVec& a3) {  // p[0..RB) += (a0 + a1) + (a2 + a3)
    for (i64 u = 0; u < kParts; ++u) {
        Lane d;
        std::memcpy(&d, p + u * kLane, sizeof d);
        d += (a0.v[u] + a1.v[u]) + (a2.v[u] + a3.v[u]);
        std::memcpy(p + u * kLane, &d, sizeof d);
    }
}
#else
struct RowVec {
    double x[RB];
};
inline void row_zero(RowVec& v) {
    for (i64 r = 0; r < RB; ++r) v.x[r] = 0.0;
}
inline void row_fma(RowVec& a, double s, const double* p) {
    for (i64 r = 0; r < RB; ++r) a.x[r] += s * p[r];
}
inline void row_add(RowVec& a, const double* p) {
    for (i64 r = 0; r < RB; ++r) a.x[r] += p[r];
}
inline void row_flush(double* p, const RowVec& a0, const RowVec& a1, const RowVec& a2,
                      const RowVec& a3) {
    for (i64 r = 0; r < RB; ++r) p[r] += (a0.x[r] + a1.x[r]) + (a2.x[r] + a3.x[r]);
}
#endif

// a += w * x[0..RB) (w = 1 without weights)
template <bool W>
inline void row_term(RowVec& a, const double* val, i64 e, const double* x) {
    if (W) row_fma(a, val[e], x);
    else row_add(a, x);
}

// d[0..RB) += sum_{e in [e0, e1)} val[e] * wT[idx[e]][0..RB) (and d2 the same with
// wT2), with the entries dealt to four accumulators in turn (by e - e0 mod 4) that are
// then added in a fixed order.
template <int POW, bool W>
inline void segment(const std::uint16_t* idx, const double* val, i64 e0, i64 e1,
                    const double* wT, const double* wT2, double* d, double* d2) {
    RowVec a[4], q[4];
    for (int u = 0; u < 4; ++u) {
        row_zero(a[u]);
        if (POW >= 2) row_zero(q[u]);
    }
    i64 e = e0;
    for (; e + 4 <= e1; e += 4) {
        for (int u = 0; u < 4; ++u) {
            const i64 i = idx[e + u] * RB;
            row_term<W>(a[u], val, e + u, wT + i);
            if (POW >= 2) row_term<W>(q[u], val, e + u, wT2 + i);
        }
    }
    for (int u = 0; e < e1; ++e, ++u) {  // the last one to three entries
        const i64 i = idx[e] * RB;
        row_term<W>(a[u], val, e, wT + i);
        if (POW >= 2) row_term<W>(q[u], val, e, wT2 + i);
    }
    row_flush(d, a[0], a[1], a[2], a[3]);
    if (POW >= 2) row_flush(d2, q[0], q[1], q[2], q[3]);
}

template <int POW, bool W, bool UU, class Real>
void run_group(const MultiPrepared<Real>& mp, i64 q0, double* scratch) noexcept {
    const i64 K = mp.K, B = mp.B, C = mp.C, n = mp.n;
    const i64 nr = (mp.R - q0) < RB ? (mp.R - q0) : RB;
    const i64 nacc = B * C * RB;
    const double s = mp.scale;
    const i64 PC = mp.panel_tiles * kColBlock;  // centres per panel

    double* acc = scratch;                                   // (B, C, RB), 64-byte aligned
    double* acc2 = acc + nacc;                               // (B, C, RB) when POW == 2
    double* accu = acc + (POW >= 2 ? 2 : 1) * nacc;          // (B, RB) when UU
    double* wT = accu + (UU ? B * RB : 0);                   // (PC, RB)
    double* wT2 = wT + PC * RB;                              // (PC, RB)
    double* wr = wT2 + PC * RB;                              // (RB, kColBlock)
    Real* g = reinterpret_cast<Real*>(wr + RB * kColBlock);  // (RB, kColBlock)
    Real* lq = reinterpret_cast<Real*>(wr + 2 * RB * kColBlock);  // (RB, K)

    for (i64 x = 0; x < nacc; ++x) acc[x] = 0.0;
    if (POW >= 2)
        for (i64 x = 0; x < nacc; ++x) acc2[x] = 0.0;
    if (UU)
        for (i64 x = 0; x < B * RB; ++x) accu[x] = 0.0;
    constexpr bool SQ = POW >= 2 || UU;  // the squared weights wT2 are needed
    double mr[RB];
    i64 diag[RB];
    for (i64 r = 0; r < RB; ++r) {
        const i64 j = r < nr ? mp.rows[q0 + r] : -1;
        for (i64 k = 0; k < K; ++k) lq[r * K + k] = j >= 0 ? mp.logq[j * K + k] : Real(0);
        // padding rows: m = +inf, so that every term is dropped
        mr[r] = j >= 0 ? mp.mrow[q0 + r] : -kNegInf;
        diag[r] = j >= 0 ? mp.cinv[j] : -1;
    }

    for (i64 pb = 0; pb < n; pb += PC) {
        bool any_panel = false;
        for (i64 cb = pb; cb < n && cb < pb + PC; cb += kColBlock) {
            const i64 ce = (cb + kColBlock) < n ? (cb + kColBlock) : n;
            i64 bc = ce - cb;
            bc = (bc + kPad - 1) / kPad * kPad;  // within n_pad; the padding has bias -inf
            double* wTt = wT + (cb - pb) * RB;
            double* wT2t = wT2 + (cb - pb) * RB;
            for (i64 r0 = 0; r0 < RB; r0 += kMicroRows)
                gemm_micro(lq + r0 * K, K, mp.pt + cb * K, bc, g + r0 * kColBlock, kColBlock);

            // kernel weights, row-major: 0 below exp(-kDrop), and on the diagonal; with
            // centre weights (a bootstrap replicate's multiplicities) and for
            // kernel_weights below exp(-kClamp) instead: a replicate whose draws leave
            // out a row's nearest centres has only terms far below the full sample's
            // row maximum, which must not be dropped (the dense products keep them too)
            bool any_row = false;
            for (i64 r = 0; r < RB; ++r) {
                const Real* grow = g + r * kColBlock;
                double* w = wr + r * kColBlock;
                const double* bias = mp.bias + cb;
                const double off = mr[r];
                double mx = kNegInf;
                const bool deep = W || mp.W != nullptr || mp.W32 != nullptr;
                const double lo = opaque(deep ? -kClamp : -kDrop), hi = opaque(kClamp);
#pragma omp simd reduction(max : mx)
                for (i64 i = 0; i < bc; ++i) {
                    double x = bias[i] + s * static_cast<double>(grow[i]) - off;
                    mx = x > mx ? x : mx;
                    const bool drop = !(x >= lo);
                    x = drop ? lo : x;  // two selects: see loo_grad_isa.cpp
                    x = x > hi ? hi : x;
                    const double e = exp_small(x);
                    w[i] = keep_or_zero(!drop, e);
                }
                if (diag[r] >= cb && diag[r] < cb + bc) w[diag[r] - cb] = 0.0;
                any_row = any_row || mx >= lo;
            }
            if (mp.W != nullptr) {  // kernel_weights: the tile's weights, row by row
                const i64 ncol = (n - cb) < kColBlock ? (n - cb) : kColBlock;
                for (i64 r = 0; r < nr; ++r)
                    std::memcpy(mp.W + (mp.rows[q0 + r] - mp.row_start) * n + cb,
                                wr + r * kColBlock, static_cast<std::size_t>(ncol) * sizeof(double));
                continue;
            }
            if (mp.W32 != nullptr) {  // the same, rounded to float; 0 below float's
                // smallest normal (subnormal operands would slow the products down)
                const i64 ncol = (n - cb) < kColBlock ? (n - cb) : kColBlock;
                const double tiny = 1.1754943508222875e-38;  // FLT_MIN
                for (i64 r = 0; r < nr; ++r) {
                    float* dst = mp.W32 + (mp.rows[q0 + r] - mp.row_start) * n + cb;
                    const double* src = wr + r * kColBlock;
#pragma omp simd
                    for (i64 i = 0; i < ncol; ++i)
                        dst[i] = src[i] >= tiny ? static_cast<float>(src[i]) : 0.0f;
                }
                continue;
            }
            if (!any_row) {  // every term of the tile is dropped for the whole group
                for (i64 x = 0; x < bc * RB; ++x) wTt[x] = 0.0;
                if (SQ)
                    for (i64 x = 0; x < bc * RB; ++x) wT2t[x] = 0.0;
                continue;
            }
            any_panel = true;
            // transpose to (centre, row); the tile's padding columns are never indexed
            for (i64 i = 0; i < bc; ++i) {
                double* t = wTt + i * RB;
                for (i64 r = 0; r < RB; ++r) t[r] = wr[r * kColBlock + i];
                if (SQ) {
                    double* t2 = wT2t + i * RB;
#pragma omp simd
                    for (i64 r = 0; r < RB; ++r) t2[r] = t[r] * t[r];
                }
            }
        }
        if (!any_panel) continue;

        const i64 panel = pb / PC;
        const std::uint32_t* ptr = mp.ptr + panel * (B * C + 1);
        const std::uint16_t* idx = mp.idx + mp.panel_base[panel];
        const double* val = W ? mp.val + mp.panel_base[panel] : nullptr;
        for (i64 bcix = 0; bcix < B * C; ++bcix) {
            const i64 e0 = ptr[bcix], e1 = ptr[bcix + 1];
            if (e0 == e1) continue;
            segment<POW, W>(idx, val, e0, e1, wT, wT2, acc + bcix * RB, acc2 + bcix * RB);
        }
        if constexpr (UU) {  // U: all the entries of set b, squared weights times weight * u
            for (i64 b = 0; b < B; ++b) {
                const i64 e0 = ptr[b * C], e1 = ptr[(b + 1) * C];
                if (e0 == e1) continue;
                segment<1, true>(idx, mp.uval + mp.panel_base[panel], e0, e1, wT2, nullptr,
                                 accu + b * RB, nullptr);
            }
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
            if (UU) mp.U[b * R + row] = accu[b * RB + r];
        }
    }
}

template <int POW, bool W, bool UU, class Real>
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
        if (detail::cancelled(mp.control)) continue;  // skip the remaining groups
        run_group<POW, W, UU>(mp, q * RB, scratch + tid * per_thread);
        detail::add_rows(mp.control, (mp.R - q * RB) < RB ? (mp.R - q * RB) : RB);
    }
    (void)n_threads;
}

template <bool UU, class Real>
void run_u(const MultiPrepared<Real>& mp, double* scratch, i64 per_thread, int n_threads) {
    const bool w = mp.val != nullptr;
    if (mp.powers >= 2) {
        if (w) run_all<2, true, UU>(mp, scratch, per_thread, n_threads);
        else run_all<2, false, UU>(mp, scratch, per_thread, n_threads);
    } else {
        if (w) run_all<1, true, UU>(mp, scratch, per_thread, n_threads);
        else run_all<1, false, UU>(mp, scratch, per_thread, n_threads);
    }
}

template <class Real>
void run(const MultiPrepared<Real>& mp, double* scratch, i64 per_thread, int n_threads) {
    if (mp.uval != nullptr) run_u<true>(mp, scratch, per_thread, n_threads);
    else run_u<false>(mp, scratch, per_thread, n_threads);
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
