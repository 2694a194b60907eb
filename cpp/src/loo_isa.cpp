// SIMD kernel of the leave-one-out reduction.  This file is compiled once per
// instruction set (KDECAL_ISA_NS = avx512 | avx2 | baseline, each with its own
// -m flags); loo.cpp picks one at run time.  Everything except the two exported
// entry points has internal linkage, and no standard-library template is
// instantiated here, so no code compiled for a wider ISA can leak into another path.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "loo_isa_common.hpp"
#include "loo_prepared.hpp"

KDECAL_DECLARE_ISA(KDECAL_ISA_NS)

namespace kdecal {
namespace KDECAL_ISA_NS {
namespace {

using detail::kColBlock;
using detail::kMicroRows;
using detail::kRowBlock;
using detail::Prepared;

// Fold centres [0, len) of one class into the running state of one query row.
// b: bias of those centres, g: their K-dots with the query, s: 1/h.  First the maximum
// of every chunk of kLanes centres; a chunk entirely more than kDrop below the class's
// running maximum is skipped (common at small bandwidths, where the centres' order,
// by predicted class within each label, puts similar centres in one chunk); the others
// add their sums of exp(L - max), with
// arguments clamped at -kClamp so that no exp is subnormal.  The loops keep kLanes
// independent accumulators so that the reductions are throughput-bound.
//
// With EXC (pair sums requested) the fold also keeps the class's excess sums
// e1 = (sum of its terms) - 1 and e2 = (sum of their squares) - 1 relative to the running
// class maximum, whose own term (exactly 1) is never added: terms with L equal to the
// running maximum (x == 0 exactly; the max loop and the sum loop compute L with the same
// expression, so the maximum itself is one of them) are counted instead of summed.  (Were
// the two L ever to differ, the maximum's term would be summed as an ordinary term and
// the 1 subtracted: the plain sums' accuracy, still correct.)  Only a range that holds
// the running maximum has such terms; every other range adds its plain sums.  The
// U-statistic S^2 - Q = 2 e1 + e1^2 - e2 (in units of the class maximum) is then a sum
// of non-negative parts, free of the cancellation of forming S^2 - Q from S and Q when
// one neighbour dominates (S = 1 + R with R tiny).
constexpr i64 kLanes = 32;
constexpr i64 kChunks = kColBlock / kLanes;  // chunks of a range (at most one tile)

// Vectors of kVL doubles for the residual sums (resid_group): the ISA's native width with
// GCC and Clang (as in loo_multi_isa.cpp), an array elsewhere.
#if defined(__GNUC__) || defined(__clang__)
#if defined(__AVX512F__)
constexpr i64 kVL = 8;
#elif defined(__AVX__)
constexpr i64 kVL = 4;
#else
constexpr i64 kVL = 2;
#endif
typedef double DVec __attribute__((vector_size(kVL * sizeof(double))));
typedef float FVec __attribute__((vector_size(kVL * sizeof(float))));
inline void vzero(DVec& a) { a = DVec{}; }
inline void vload(DVec& x, const double* p) { std::memcpy(&x, p, sizeof x); }
inline void vload(DVec& x, const float* p) {
    FVec f;
    std::memcpy(&f, p, sizeof f);
    x = __builtin_convertvector(f, DVec);
}
inline void vfma(DVec& a, const DVec& x, const DVec& y) { a += x * y; }
inline void vfma2(DVec& a, const DVec& w, const DVec& y) { a += (w * w) * y; }
// The sum of a's lanes, pairwise: lane v + lane v + kVL / 2, and so on (as the array
// version below), by halves of the vector.
typedef double D4 __attribute__((vector_size(4 * sizeof(double))));
typedef double D2 __attribute__((vector_size(2 * sizeof(double))));
inline double vsum(const DVec& a) {
    D2 x;
    if constexpr (kVL == 8) {
        D4 lo, hi;
        std::memcpy(&lo, &a, sizeof lo);
        std::memcpy(&hi, reinterpret_cast<const char*>(&a) + sizeof lo, sizeof hi);
        lo += hi;
        D2 l2, h2;
        std::memcpy(&l2, &lo, sizeof l2);
        std::memcpy(&h2, reinterpret_cast<const char*>(&lo) + sizeof l2, sizeof h2);
        x = l2 + h2;
    } else if constexpr (kVL == 4) {
        D2 l2, h2;
        std::memcpy(&l2, &a, sizeof l2);
        std::memcpy(&h2, reinterpret_cast<const char*>(&a) + sizeof l2, sizeof h2);
        x = l2 + h2;
    } else {
        std::memcpy(&x, &a, sizeof x);
    }
    return x[0] + x[1];
}
#else
constexpr i64 kVL = 4;
struct DVec {
    double x[kVL];
};
inline void vzero(DVec& a) {
    for (i64 v = 0; v < kVL; ++v) a.x[v] = 0.0;
}
template <class Real>
inline void vload(DVec& a, const Real* p) {
    for (i64 v = 0; v < kVL; ++v) a.x[v] = static_cast<double>(p[v]);
}
inline void vfma(DVec& a, const DVec& x, const DVec& y) {
    for (i64 v = 0; v < kVL; ++v) a.x[v] += x.x[v] * y.x[v];
}
inline void vfma2(DVec& a, const DVec& w, const DVec& y) {
    for (i64 v = 0; v < kVL; ++v) a.x[v] += (w.x[v] * w.x[v]) * y.x[v];
}
inline double vsum(const DVec& a) {
    double t[kVL];
    for (i64 v = 0; v < kVL; ++v) t[v] = a.x[v];
    for (i64 h = kVL / 2; h >= 1; h /= 2)
        for (i64 v = 0; v < h; ++v) t[v] += t[v + h];
    return t[0];
}
#endif
static_assert(kLanes % kVL == 0, "a chunk is a whole number of vectors");

// Pairwise (tree) reduction of kLanes accumulators: vectorised, and no serial chain
// of kLanes dependent operations at the end of every range.
inline double tree_sum(double* a) {
    for (i64 w = kLanes / 2; w >= 1; w /= 2)
        for (i64 v = 0; v < w; ++v) a[v] += a[v + w];
    return a[0];
}

// a * b + c, fused where the ISA has FMA (as -ffp-contract=fast fuses it) and plain
// otherwise.  Spelled out for the sums of squares and cubes: whether the compiler
// contracts them by itself can depend on the other statements of the loop (it did for
// GCC 12 on the AVX2 path once the excess sums were added), and Q, T must not depend on
// whether the pair sums are requested.
inline double mul_add(double a, double b, double c) {
#if defined(__FMA__)
    return __builtin_fma(a, b, c);
#else
    return a * b + c;
#endif
}

// The log-kernel of centre i: one expression shared by the max loop and the sum loop,
// so that both compute bit-identical values (the same contraction to FMA in both).
template <class Real>
inline double log_kernel(const double* b, const Real* g, i64 i, double s) {
    return b[i] + s * static_cast<double>(g[i]);
}

// One lane step of the sums: w = exp(max(L - off, -kClamp)) into a1, a2, a3 (POW) and,
// with TOP, w and w^2 of the terms below off into x1, x2.
// lo = -kClamp, read through opaque().
// With RES, w is also stored in wb[i] (for the residual sums).
template <int POW, bool TOP, bool RES, class Real>
inline void sum_step(const double* b, const Real* g, i64 i, double s, double off, double lo,
                     double& a1, double& a2, double& a3, double& x1, double& x2, double* wb) {
    double x = log_kernel(b, g, i, s) - off;
    x = x < lo ? lo : x;
    const double w = exp_small(x);
    if constexpr (RES) wb[i] = w;
    a1 += w;
    if (POW >= 2) a2 = mul_add(w, w, a2);
    if (POW >= 3) a3 = mul_add(w * w, w, a3);
    if constexpr (TOP) {
        const double we = x != 0.0 ? w : 0.0;  // the running maximum's terms: left out
        x1 += we;
        x2 = mul_add(we, we, x2);
    }
}

// Everything range_sums calls is inlined (flatten): the exp of its simd loops must be, or
// they stay scalar (GCC 12 stopped inlining exp_small on its own once the residual sums'
// instantiations had grown the unit, and the forward pass ran 3.5x slower).
#if defined(__GNUC__) || defined(__clang__)
#define KDECAL_FLATTEN __attribute__((flatten))
#else
#define KDECAL_FLATTEN
#endif

// Sums over centres [0, len) relative to off: r[0..2] of w, w^2, w^3 (as POW asks) and,
// with TOP, r[3], r[4] of w, w^2 without the terms at L = off.  cmx[q] is the maximum of
// L over chunk q (centres [q kLanes, (q + 1) kLanes)); a chunk whose maximum is more than
// kDrop below off is skipped (its terms are all below exp(-kDrop) ~ 1.6e-28).  With RES,
// the terms w are also stored in wb[0, len) (zeros in the chunks skipped), and every chunk
// kept sets in *mask the bits of the blocks of kLanes entries it overlaps, counted from
// wb - base (for resid_group).
template <int POW, bool TOP, bool RES, class Real>
KDECAL_FLATTEN inline void range_sums(const double* b, const Real* g, i64 len, double s,
                                      double off, const double* cmx, double* r, double* wb,
                                      std::uint32_t* mask, i64 base) {
    double a1[kLanes], a2[kLanes], a3[kLanes], x1[kLanes], x2[kLanes];
    for (i64 v = 0; v < kLanes; ++v) {
        a1[v] = 0.0;
        a2[v] = 0.0;
        a3[v] = 0.0;
        x1[v] = 0.0;
        x2[v] = 0.0;
    }
    const double lo = opaque(-kClamp);
    const double floor = off - kDrop;
    i64 i = 0;
    for (; i + kLanes <= len; i += kLanes) {
        if (cmx[i / kLanes] < floor) {
            if constexpr (RES)
                for (i64 v = 0; v < kLanes; ++v) wb[i + v] = 0.0;
            continue;
        }
        if constexpr (RES)
            *mask |= (std::uint32_t{1} << ((base + i) / kLanes)) |
                     (std::uint32_t{1} << ((base + i + kLanes - 1) / kLanes));
#pragma omp simd
        for (i64 v = 0; v < kLanes; ++v)
            sum_step<POW, TOP, RES>(b, g, i + v, s, off, lo, a1[v], a2[v], a3[v], x1[v],
                                    x2[v], wb);
    }
    if (i < len && !(cmx[i / kLanes] < floor)) {
        if constexpr (RES)
            *mask |= (std::uint32_t{1} << ((base + i) / kLanes)) |
                     (std::uint32_t{1} << ((base + len - 1) / kLanes));
        for (i64 v = 0; i + v < len; ++v)
            sum_step<POW, TOP, RES>(b, g, i + v, s, off, lo, a1[v], a2[v], a3[v], x1[v],
                                    x2[v], wb);
    } else if (RES) {
        for (; i < len; ++i) wb[i] = 0.0;
    }
    r[0] = tree_sum(a1);
    if (POW >= 2) r[1] = tree_sum(a2);
    if (POW >= 3) r[2] = tree_sum(a3);
    if constexpr (TOP) {
        r[3] = tree_sum(x1);
        r[4] = tree_sum(x2);
    }
}

// ---------------------------------------------------------------- residual sums
// The partial sums A[k] = sum_i w_i p[i, k] and U = sum_i w_i^2 u[i] of a class range of a
// tile are formed after the range has been folded for every row of a GEMM block: the fold
// stores the row's kernel weights w (relative to the class's running maximum; zeros where
// it skips) in a row of W, and resid_group then takes kGroup rows at a time as a small
// register-blocked product, so that each vector of the tile's centre probabilities is
// loaded once for kGroup rows: per vector of kVL centres, kGroup x KB accumulators
// (KB <= kMaxKB rows of the transposed tile at a time; the dispatcher's res_kb), reduced
// once at the end of the range.  Blocks of kLanes entries of the range that no row of the
// group kept are skipped; in a block kept by some rows only, the others add exact zeros
// (w = +0, p >= 0), so a row's sums do not depend on the rows grouped with it.  The
// range's tail is read to the next multiple of kVL (W is zeroed there, and pt and u are
// zero-padded past their ends).
#if defined(__AVX512F__)
constexpr i64 kGroup = 4;  // 4 x 6 accumulators of the 32 zmm registers
#else
constexpr i64 kGroup = 2;  // 2 x 6 of the 16 ymm or xmm registers
#endif
constexpr i64 kMaxKB = detail::kResMaxKB;  // loo.cpp chooses res_kb <= it
static_assert(kLanes == detail::kPad, "pt and u are padded by a chunk");
constexpr i64 kWStride = kColBlock + 2 * kLanes;  // doubles per row of W

// Where a fold stores its kernel weights and its kept blocks (RES only), and the
// (bandwidth, row, class) partial sums it rescales when the class maximum grows.
struct Res {
    double* A;             // (K,)
    double* U;
    double* wb;            // W row, at the first centre of the folded range
    std::uint32_t* mask;   // the row's kept blocks of kLanes entries of the class range
    i64 base;              // offset of the folded range in the class range
};

// A[g][0, kb) += sum_i w[g][i] col[k][i] for the kGroup rows g (kb <= KB rows of the tile;
// the rows past kb repeat row kb - 1 and are not written)
template <int KB, class Real>
inline void group_block(double* const* w, const Real* col, i64 kb, i64 len,
                        std::uint32_t mask, double* const* A) {
    DVec acc[kGroup][KB];
    const Real* c[KB];
    for (int q = 0; q < KB; ++q) {
        for (i64 gr = 0; gr < kGroup; ++gr) vzero(acc[gr][q]);
        c[q] = col + (q < kb ? q : kb - 1) * kColBlock;
    }
    const i64 end = (len + kVL - 1) / kVL * kVL;
    for (i64 i0 = 0; i0 < end; i0 += kLanes) {
        if (!((mask >> (i0 / kLanes)) & 1u)) continue;
        const i64 i1 = (i0 + kLanes) < end ? (i0 + kLanes) : end;
        for (i64 i = i0; i < i1; i += kVL) {
            DVec wv[kGroup];
            for (i64 gr = 0; gr < kGroup; ++gr) vload(wv[gr], w[gr] + i);
            for (int q = 0; q < KB; ++q) {
                DVec x;
                vload(x, c[q] + i);
                for (i64 gr = 0; gr < kGroup; ++gr) vfma(acc[gr][q], wv[gr], x);
            }
        }
    }
    for (i64 gr = 0; gr < kGroup; ++gr)
        for (int q = 0; q < KB; ++q)
            if (q < kb) A[gr][q] += vsum(acc[gr][q]);
}

// U[g] += sum_i w[g][i]^2 u[i]
inline void group_u(double* const* w, const double* u, i64 len, std::uint32_t mask,
                    double* const* U) {
    DVec acc[kGroup];
    for (i64 gr = 0; gr < kGroup; ++gr) vzero(acc[gr]);
    const i64 end = (len + kVL - 1) / kVL * kVL;
    for (i64 i0 = 0; i0 < end; i0 += kLanes) {
        if (!((mask >> (i0 / kLanes)) & 1u)) continue;
        const i64 i1 = (i0 + kLanes) < end ? (i0 + kLanes) : end;
        for (i64 i = i0; i < i1; i += kVL) {
            DVec x;
            vload(x, u + i);
            for (i64 gr = 0; gr < kGroup; ++gr) {
                DVec wv;
                vload(wv, w[gr] + i);
                vfma2(acc[gr], wv, x);
            }
        }
    }
    for (i64 gr = 0; gr < kGroup; ++gr) *U[gr] += vsum(acc[gr]);
}

// All K rows of the tile, KB at a time, and U, for one group.  w, A, U: the group's rows
// of W (at the class range), partial sums A (K) and U.
template <int KB, class Real>
inline void group_all(double* const* w, const Real* col, const double* u, i64 K, i64 len,
                      std::uint32_t mask, double* const* A, double* const* U) {
    double* Ak[kGroup];
    for (i64 k0 = 0; k0 < K; k0 += KB) {
        for (i64 gr = 0; gr < kGroup; ++gr) Ak[gr] = A[gr] + k0;
        group_block<KB>(w, col + k0 * kColBlock, (K - k0) < KB ? (K - k0) : KB, len, mask, Ak);
    }
    group_u(w, u, len, mask, U);
}

template <class Real>
inline void resid_group(double* const* w, const Real* col, const double* u, i64 K, i64 kb,
                        i64 len, std::uint32_t mask, double* const* A, double* const* U) {
    static_assert(kMaxKB == 6, "one case per block size");
    switch (kb) {
        case 1: group_all<1>(w, col, u, K, len, mask, A, U); break;
        case 2: group_all<2>(w, col, u, K, len, mask, A, U); break;
        case 3: group_all<3>(w, col, u, K, len, mask, A, U); break;
        case 4: group_all<4>(w, col, u, K, len, mask, A, U); break;
        case 5: group_all<5>(w, col, u, K, len, mask, A, U); break;
        default: group_all<6>(w, col, u, K, len, mask, A, U); break;
    }
}

// With RES, the range's kernel weights go to rs.wb and its kept blocks to rs.mask, and the
// partial sums rs.A (K), rs.U are rescaled with s1 and s2 when the class maximum grows.
template <int POW, bool EXC, bool RES, class Real>
inline void fold(const double* b, const Real* g, i64 len, double s, double& mc,
                 double& s1, double& s2, double& s3, double& e1, double& e2, const Res& rs,
                 i64 K) {
    // The maximum of every chunk of kLanes centres, and of the range.  The chunk's
    // maximum is an OpenMP simd max-reduction, which the compiler finishes in registers
    // (a tree over an array would pass through memory at every step, at a cost per chunk
    // comparable to the chunk's exps).  A maximum is exact in any order.
    double cmx[kChunks];
    double mx = kNegInf;
    for (i64 i = 0; i < len; i += kLanes) {
        double m = kNegInf;
        if (i + kLanes <= len) {
#pragma omp simd reduction(max : m)
            for (i64 v = 0; v < kLanes; ++v) {
                const double l = log_kernel(b, g, i + v, s);
                m = l > m ? l : m;
            }
        } else {
            for (i64 v = 0; i + v < len; ++v) {
                const double l = log_kernel(b, g, i + v, s);
                m = l > m ? l : m;
            }
        }
        cmx[i / kLanes] = m;
        mx = m > mx ? m : mx;
    }
    if (!(mx > kNegInf)) {
        if constexpr (RES)
            for (i64 i = 0; i < len; ++i) rs.wb[i] = 0.0;
        return;
    }
    bool new_max = false;
    if (mx > mc) {
        const double f = std::exp(mc - mx);  // 0 when mc = -inf
        s1 *= f;
        if (POW >= 2) s2 *= f * f;
        if (POW >= 3) s3 *= f * f * f;
        if constexpr (EXC) {  // the old maximum's term (1) becomes an ordinary term, f
            e1 = e1 * f + f;
            e2 = e2 * (f * f) + f * f;
        }
        if constexpr (RES) {
            for (i64 k = 0; k < K; ++k) rs.A[k] *= f;
            *rs.U *= f * f;
        }
        mc = mx;
        new_max = true;
    } else if (mx < mc - kDrop) {
        if constexpr (RES)
            for (i64 i = 0; i < len; ++i) rs.wb[i] = 0.0;
        return;  // every term is below exp(-kDrop) ~ 1.6e-28 of this class's maximum
    }
    double r[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    bool top = false;  // whether this range holds the running maximum (EXC only)
    if constexpr (EXC) top = mx == mc;
    if (top) {
        range_sums<POW, EXC, RES>(b, g, len, s, mc, cmx, r, rs.wb, rs.mask, rs.base);
        // The terms left out are exactly 1 each (exp_small(0) = 1), so r[0] - r[3] is
        // their count up to a rounding error far below 1/2 (at most kColBlock terms
        // <= 1).  Those other than the maximum itself are ordinary terms of 1; the counts
        // are small integers, so adding them is exact.
        const double ties = static_cast<double>(static_cast<i64>(r[0] - r[3] + 0.5));
        const double extra = ties - (new_max ? 1.0 : 0.0);
        e1 += r[3] + extra;
        e2 += r[4] + extra;
    } else {
        range_sums<POW, false, RES>(b, g, len, s, mc, cmx, r, rs.wb, rs.mask, rs.base);
        if constexpr (EXC) {  // no term at the maximum: the excess is the whole sum
            e1 += r[0];
            e2 += r[1];
        }
    }
    s1 += r[0];
    if (POW >= 2) s2 += r[1];
    if (POW >= 3) s3 += r[2];
}

// rs (RES only): as for fold, for the class range [rs.base ... ) that holds [lo, hi);
// its wb and base are moved to lo here.
template <int POW, bool EXC, bool RES, class Real>
inline void fold_range(const Prepared<Real>& pr, const Real* grow, i64 cb, i64 lo, i64 hi,
                       i64 t, double& mc, double& s1, double& s2, double& s3, double& e1,
                       double& e2, Res rs = Res{}) {
    if (hi <= lo) return;
    if constexpr (RES) {
        rs.wb += lo - rs.base;
        rs.base = lo - rs.base;
    }
    fold<POW, EXC, RES>(pr.bias + t * pr.n + lo, grow + (lo - cb), hi - lo, pr.scale[t], mc, s1,
                        s2, s3, e1, e2, rs, pr.K);
}

// One task: query rows j0 .. j0 + nr (nr <= pr.task_rows).  For every tile of
// kColBlock centres, the task's rows take the tile in GEMM blocks of kRowBlock rows while
// it is in cache, so the centres are read from memory once per task rather than once per
// kRowBlock rows.
template <int POW, bool EXC, bool RES, class Real>
void run_block(const Prepared<Real>& pr, const LooResult& out, i64 j0, i64 nr, double* scratch) {
    const i64 K = pr.K, C = pr.C, H = pr.H, n = pr.n, TR = pr.task_rows;
    const i64 R = pr.row_stop - pr.row_start;
    const i64 nacc = H * TR * C;

    Real* g = reinterpret_cast<Real*>(scratch);                     // kRowBlock x kColBlock
    Real* lq = reinterpret_cast<Real*>(scratch + kRowBlock * kColBlock);  // TR x K
    double* am = scratch + kRowBlock * kColBlock + TR * K;
    double* a1 = am + nacc;
    double* a2 = a1 + nacc;
    double* a3 = a2 + nacc;
    double* x1 = a3 + nacc;  // excess sums (EXC only)
    double* x2 = x1 + nacc;
    // residual sums (RES only): partial sums A (nacc x K) and U (nacc), the kernel weights
    // W of a block's rows (kRowBlock x kWStride) and K + 1 doubles that take the sums of
    // a group's padding rows
    double* ra = x2 + nacc;
    double* ru = ra + (RES ? nacc * K : 0);
    double* W = ru + (RES ? nacc : 0);
    double* trash = W + (RES ? kRowBlock * kWStride : 0);
    std::uint32_t masks[kRowBlock];
    for (i64 i = 0; i < nacc; ++i) {
        am[i] = kNegInf;
        a1[i] = 0.0;
        a2[i] = 0.0;
        a3[i] = 0.0;
        x1[i] = 0.0;
        x2[i] = 0.0;
    }
    if constexpr (RES) {
        for (i64 i = 0; i < nacc * K; ++i) ra[i] = 0.0;
        for (i64 i = 0; i < nacc; ++i) ru[i] = 0.0;
    }
    const i64 nr_pad = (nr + kRowBlock - 1) / kRowBlock * kRowBlock;
    for (i64 r = 0; r < nr_pad; ++r)
        for (i64 k = 0; k < K; ++k)
            lq[r * K + k] = r < nr ? pr.logq[(j0 + r) * K + k] : Real(0);

    for (i64 cb = 0; cb < n; cb += kColBlock) {
        const i64 ce = (cb + kColBlock) < n ? (cb + kColBlock) : n;
        i64 bc = ce - cb;
        bc = (bc + detail::kPad - 1) / detail::kPad * detail::kPad;  // within n_pad
        // classes overlapping [cb, ce)
        i64 c_first = 0;
        while (c_first < C && pr.seg[c_first + 1] <= cb) ++c_first;
        for (i64 rb = 0; rb < nr; rb += kRowBlock) {
            const i64 nb = (nr - rb) < kRowBlock ? (nr - rb) : kRowBlock;
            for (i64 r0 = 0; r0 < nb; r0 += kMicroRows)
                gemm_micro(lq + (rb + r0) * K, K, pr.pt + cb * K, bc, g + r0 * kColBlock,
                           kColBlock);
            if constexpr (!RES) {
                for (i64 r = rb; r < rb + nb; ++r) {
                    const Real* grow = g + (r - rb) * kColBlock;
                    const i64 d = pr.inv[j0 + r];  // sorted position of the query itself
                    for (i64 c = c_first; c < C && pr.seg[c] < ce; ++c) {
                        const i64 lo = pr.seg[c] > cb ? pr.seg[c] : cb;
                        const i64 hi = pr.seg[c + 1] < ce ? pr.seg[c + 1] : ce;
                        if (hi <= lo) continue;
                        for (i64 t = 0; t < H; ++t) {
                            const i64 ai = (t * TR + r) * C + c;
                            if (d >= lo && d < hi) {  // leave one out: skip the diagonal
                                fold_range<POW, EXC, RES>(pr, grow, cb, lo, d, t, am[ai],
                                                          a1[ai], a2[ai], a3[ai], x1[ai],
                                                          x2[ai]);
                                fold_range<POW, EXC, RES>(pr, grow, cb, d + 1, hi, t, am[ai],
                                                          a1[ai], a2[ai], a3[ai], x1[ai],
                                                          x2[ai]);
                            } else {
                                fold_range<POW, EXC, RES>(pr, grow, cb, lo, hi, t, am[ai],
                                                          a1[ai], a2[ai], a3[ai], x1[ai],
                                                          x2[ai]);
                            }
                        }
                    }
                }
            } else {
                // The same folds of every (bandwidth, row, class) in the same order, taken
                // class by class so that the block's rows of W hold one class range, whose
                // residual sums are then formed kGroup rows at a time (resid_group).
                for (i64 c = c_first; c < C && pr.seg[c] < ce; ++c) {
                    const i64 lo = pr.seg[c] > cb ? pr.seg[c] : cb;
                    const i64 hi = pr.seg[c + 1] < ce ? pr.seg[c + 1] : ce;
                    if (hi <= lo) continue;
                    const i64 len = hi - lo;
                    const i64 zlen = (len + kVL - 1) / kVL * kVL;
                    for (i64 t = 0; t < H; ++t) {
                        for (i64 r = rb; r < rb + nb; ++r) {
                            const Real* grow = g + (r - rb) * kColBlock;
                            const i64 d = pr.inv[j0 + r];
                            const i64 ai = (t * TR + r) * C + c;
                            double* wr = W + (r - rb) * kWStride;
                            // (the folds write wr[0, len), zeros where they skip)
                            for (i64 i = len; i < zlen; ++i) wr[i] = 0.0;
                            masks[r - rb] = 0;
                            const Res rs{ra + ai * K, ru + ai, wr, masks + (r - rb), lo};
                            if (d >= lo && d < hi) {
                                wr[d - lo] = 0.0;
                                fold_range<POW, EXC, RES>(pr, grow, cb, lo, d, t, am[ai],
                                                          a1[ai], a2[ai], a3[ai], x1[ai],
                                                          x2[ai], rs);
                                const double before = am[ai];
                                fold_range<POW, EXC, RES>(pr, grow, cb, d + 1, hi, t, am[ai],
                                                          a1[ai], a2[ai], a3[ai], x1[ai],
                                                          x2[ai], rs);
                                if (am[ai] != before && d > lo) {
                                    // the first part's weights, to the new class maximum
                                    const double f = std::exp(before - am[ai]);
                                    for (i64 i = 0; i < d - lo; ++i) wr[i] *= f;
                                }
                            } else {
                                fold_range<POW, EXC, RES>(pr, grow, cb, lo, hi, t, am[ai],
                                                          a1[ai], a2[ai], a3[ai], x1[ai],
                                                          x2[ai], rs);
                            }
                        }
                        const Real* col = pr.pt + cb * K + (lo - cb);
                        for (i64 r0 = 0; r0 < nb; r0 += kGroup) {
                            double* wp[kGroup];
                            double* Ap[kGroup];
                            double* Up[kGroup];
                            std::uint32_t mask = 0;
                            for (i64 gr = 0; gr < kGroup; ++gr) {
                                const i64 r = r0 + gr;
                                if (r < nb) {
                                    const i64 ai = (t * TR + rb + r) * C + c;
                                    wp[gr] = W + r * kWStride;
                                    Ap[gr] = ra + ai * K;
                                    Up[gr] = ru + ai;
                                    mask |= masks[r];
                                } else {  // padding rows: any row of W, sums to trash
                                    wp[gr] = W;
                                    Ap[gr] = trash;
                                    Up[gr] = trash + K;
                                }
                            }
                            if (mask != 0)
                                resid_group(wp, col, pr.u + lo, K, pr.res_kb, len, mask, Ap,
                                            Up);
                        }
                    }
                }
            }
        }
    }

    // combine the per-class log-sum-exps and write rows j0 .. j0 + nr
    for (i64 t = 0; t < H; ++t) {
        for (i64 r = 0; r < nr; ++r) {
            const i64 row = j0 + r - pr.row_start;
            const double* mcs = am + (t * TR + r) * C;
            double mx = kNegInf;
            for (i64 c = 0; c < C; ++c) mx = mcs[c] > mx ? mcs[c] : mx;
            out.m[t * R + row] = mx;
            double* Ao = RES ? out.A + (t * R + row) * K : nullptr;
            double Uo = 0.0;
            if constexpr (RES)
                for (i64 k = 0; k < K; ++k) Ao[k] = 0.0;
            for (i64 c = 0; c < C; ++c) {
                const i64 ai = (t * TR + r) * C + c;
                const i64 oi = (t * R + row) * C + c;
                const bool empty = !(mcs[c] > kNegInf);
                const double f = empty ? 0.0 : std::exp(mcs[c] - mx);
                out.S[oi] = empty ? 0.0 : a1[ai] * f;
                if (POW >= 2) out.Q[oi] = empty ? 0.0 : a2[ai] * (f * f);
                if (POW >= 3) out.T[oi] = empty ? 0.0 : a3[ai] * (f * f * f);
                // S^2 - Q = 2 e1 + e1^2 - e2 >= e1 + e1^2 (every term is <= 1): no
                // cancellation
                if constexpr (EXC) {
                    const double e = x1[ai];
                    out.D[oi] = empty ? 0.0 : ((2.0 * e - x2[ai]) + e * e) * (f * f);
                }
                if constexpr (RES) {  // the classes' residual sums, relative to mx
                    if (!empty) {
                        const double* rai = ra + ai * K;
                        for (i64 k = 0; k < K; ++k) Ao[k] += rai[k] * f;
                        Uo += ru[ai] * (f * f);
                    }
                }
            }
            if constexpr (RES) out.U[t * R + row] = Uo;
        }
    }
}

template <int POW, bool EXC, bool RES, class Real>
void run_pow(const Prepared<Real>& pr, const LooResult& out, double* scratch, i64 per_thread,
             int n_threads) {
    const i64 TR = pr.task_rows;
    const i64 ntasks = (pr.row_stop - pr.row_start + TR - 1) / TR;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (n_threads > 1)
#endif
    for (i64 b = 0; b < ntasks; ++b) {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        if (detail::cancelled(pr.control)) continue;  // skip the remaining tasks
        const i64 j0 = pr.row_start + b * TR;
        const i64 nr = (pr.row_stop - j0) < TR ? (pr.row_stop - j0) : TR;
        run_block<POW, EXC, RES>(pr, out, j0, nr, scratch + tid * per_thread);
        detail::add_rows(pr.control, nr);
    }
    (void)n_threads;
}

template <bool RES, class Real>
void run_res(const Prepared<Real>& pr, const LooResult& out, double* scratch, i64 per_thread,
             int n_threads) {
    const bool exc = out.D != nullptr;  // the dispatcher allows D only with powers >= 2
    switch (pr.powers) {
        case 1: run_pow<1, false, RES>(pr, out, scratch, per_thread, n_threads); break;
        case 2:
            if (exc) run_pow<2, true, RES>(pr, out, scratch, per_thread, n_threads);
            else run_pow<2, false, RES>(pr, out, scratch, per_thread, n_threads);
            break;
        default:
            if (exc) run_pow<3, true, RES>(pr, out, scratch, per_thread, n_threads);
            else run_pow<3, false, RES>(pr, out, scratch, per_thread, n_threads);
            break;
    }
}

template <class Real>
void run(const Prepared<Real>& pr, const LooResult& out, double* scratch, i64 per_thread,
         int n_threads) {
    // the residual sums: a separate instantiation, so that the code without them is the
    // same as ever
    if (pr.u != nullptr) run_res<true>(pr, out, scratch, per_thread, n_threads);
    else run_res<false>(pr, out, scratch, per_thread, n_threads);
}

}  // namespace

void kernel_bias(const double* p, std::int64_t rows, std::int64_t D, double scale, double* out,
                 int n_threads) {
    // Blocks of rows whose lgamma values fit one stack buffer (a row longer than it is
    // taken in chunks); each row's sum is then a simd reduction, the same for any blocking
    // and thread count.
    constexpr i64 kBuf = 2048;
    const i64 kc = D < kBuf ? D : kBuf;  // columns per chunk
    const i64 per = kBuf / kc;           // rows per block (1 when D >= kBuf)
    const i64 nblocks = (rows + per - 1) / per;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && rows * D >= (i64{1} << 15))
#endif
    for (i64 blk = 0; blk < nblocks; ++blk) {
        double tmp[kBuf];
        const i64 r0 = blk * per;
        const i64 r1 = (r0 + per) < rows ? (r0 + per) : rows;
        if (kc == D) {  // whole rows, contiguous: one loop over the block
            const double* src = p + r0 * D;
            const i64 m = (r1 - r0) * D;
#pragma omp simd
            for (i64 j = 0; j < m; ++j) tmp[j] = lgamma_ge1(src[j] * scale + 1.0);
            for (i64 r = r0; r < r1; ++r) {
                const double* t = tmp + (r - r0) * D;
                double acc = 0.0;
#pragma omp simd reduction(+ : acc)
                for (i64 k = 0; k < D; ++k) acc += t[k];
                out[r] = -acc;
            }
        } else {  // one row (r1 = r0 + 1) in chunks of kc columns
            const double* src = p + r0 * D;
            double acc = 0.0;
            for (i64 k0 = 0; k0 < D; k0 += kc) {
                const i64 w = (D - k0) < kc ? (D - k0) : kc;
#pragma omp simd
                for (i64 k = 0; k < w; ++k) tmp[k] = lgamma_ge1(src[k0 + k] * scale + 1.0);
                double part = 0.0;
#pragma omp simd reduction(+ : part)
                for (i64 k = 0; k < w; ++k) part += tmp[k];
                acc += part;
            }
            out[r0] = -acc;
        }
    }
    (void)n_threads;
}

void run_f64(const Prepared<double>& pr, const LooResult& out, double* scratch,
             std::int64_t per_thread, int n_threads) {
    run(pr, out, scratch, per_thread, n_threads);
}

void run_f32(const Prepared<float>& pr, const LooResult& out, double* scratch,
             std::int64_t per_thread, int n_threads) {
    run(pr, out, scratch, per_thread, n_threads);
}

}  // namespace KDECAL_ISA_NS
}  // namespace kdecal
