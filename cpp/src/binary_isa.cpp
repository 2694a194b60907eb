// SIMD kernel of the binary engine (binary.cpp): the exact terms of a range of sorted
// centres, compiled once per instruction set like loo_isa.cpp (KDECAL_ISA_NS = avx512 |
// avx2 | baseline).  The log-kernel is the one loo_reduce computes on the same path: the
// K = 2 dot product logq0 p0 + logq1 p1 accumulated as the GEMM does (fused where the ISA
// has FMA), then bias + scale * G (fused likewise), so that both engines see the same
// bits of every L.
#include <cmath>
#include <cstdint>

#include "binary_kernels.hpp"
#include "loo_isa_common.hpp"

namespace kdecal {
namespace KDECAL_ISA_NS {

namespace {

// Weighted: the centres' weights v multiply each term (binary_kernels.hpp); the
// unweighted loop is the same code with v = 1 removed, bit for bit.
template <bool Weighted>
double range_impl(const double* bias, const double* p0, const double* p1, const double* u,
                  const double* v, std::int64_t a, std::int64_t b, std::int64_t skip1,
                  std::int64_t skip2, double s, double q0, double q1, double mc, double T,
                  double* r) {
    double s1 = 0, s2 = 0, s3 = 0, sa0 = 0, sa1 = 0, su = 0, mx = kNegInf;
    const double lo = opaque(-kClamp);
    const double floor = -T;
#pragma omp simd reduction(+ : s1, s2, s3, sa0, sa1, su) reduction(max : mx)
    for (i64 i = a; i < b; ++i) {
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
        const double g = __builtin_fma(q1, p1[i], q0 * p0[i]);
        const double L = __builtin_fma(s, g, bias[i]);
#else
        const double g = q0 * p0[i] + q1 * p1[i];
        const double L = bias[i] + s * g;
#endif
        const double x = L - mc;
        // bitwise, not short-circuit: no control flow in the loop (it would stay scalar)
        const bool other = static_cast<bool>(static_cast<int>(i != skip1) & static_cast<int>(i != skip2));
        const bool keep = static_cast<bool>(static_cast<int>(other) & static_cast<int>(x >= floor));
        const double xc = x < lo ? lo : x;
        const double w = keep_or_zero(keep, exp_small(xc));
        const double w2 = w * w;
        if constexpr (Weighted) {
            const double wv = w * v[i];
            const double wv2 = wv * wv;
            s1 += wv;
            s2 += wv2;
            s3 += wv2 * wv;
            sa0 += wv * p0[i];
            sa1 += wv * p1[i];
        } else {
            s1 += w;
            s2 += w2;
            s3 += w2 * w;
            sa0 += w * p0[i];
            sa1 += w * p1[i];
        }
        su += w2 * u[i];
        const double xm = x + keep_or_zero(!other, kNegInf);  // -inf for the skipped ones
        mx = xm > mx ? xm : mx;
    }
    r[0] += s1;
    r[1] += s2;
    r[2] += s3;
    r[3] += sa0;
    r[4] += sa1;
    r[5] += su;
    return mx;
}

}  // namespace

double binary_range(const double* bias, const double* p0, const double* p1, const double* u,
                    const double* v, std::int64_t a, std::int64_t b, std::int64_t skip1,
                    std::int64_t skip2, double s, double q0, double q1, double mc, double T,
                    double* r) {
    if (v) return range_impl<true>(bias, p0, p1, u, v, a, b, skip1, skip2, s, q0, q1, mc, T, r);
    return range_impl<false>(bias, p0, p1, u, v, a, b, skip1, skip2, s, q0, q1, mc, T, r);
}

}  // namespace KDECAL_ISA_NS
}  // namespace kdecal
