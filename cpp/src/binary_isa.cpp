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

double binary_range(const double* bias, const double* p0, const double* p1, const double* u,
                    std::int64_t a, std::int64_t b, std::int64_t skip1, std::int64_t skip2,
                    double s, double q0, double q1, double mc, double T, double* r) {
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
        s1 += w;
        s2 += w2;
        s3 += w2 * w;
        sa0 += w * p0[i];
        sa1 += w * p1[i];
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

}  // namespace KDECAL_ISA_NS
}  // namespace kdecal
