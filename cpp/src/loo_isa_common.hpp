// Internal: helpers shared by the kernels that are compiled once per instruction set
// (loo_isa.cpp, loo_grad_isa.cpp, loo_multi_isa.cpp, binary_isa.cpp).  Include it only
// from such a file: everything here lives in kdecal::KDECAL_ISA_NS::(anonymous
// namespace), so every ISA object gets its own copy, compiled with its own -m flags, and
// the linker can never substitute the AVX-512 version of a helper into the baseline path.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "loo_prepared.hpp"

#ifndef KDECAL_ISA_NS
#error "KDECAL_ISA_NS must name the instruction-set namespace"
#endif

namespace kdecal {
namespace KDECAL_ISA_NS {
namespace {

using i64 = std::int64_t;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// v, as a value the optimiser cannot see through.  For clamp bounds: with a literal bound,
// GCC 12 duplicates the clamped path of `x < -kClamp ? -kClamp : x` so as to fold
// exp_small(-kClamp) to a constant, and the branch this leaves in the loop is if-converted
// only with AVX-512 masks: the AVX2 and baseline exp loops stayed scalar (the AVX2 path
// ran 3.2x slower than the AVX-512 one instead of about 2x).  Read the bound through
// opaque() once, before the loop.
inline double opaque(double v) {
#if defined(__GNUC__) || defined(__clang__)
    __asm__("" : "+m"(v));
#endif
    return v;
}

// w where keep, else +0, by masking the bits: a select or a product would be turned into a
// conditional floating-point operation, which -ftrapping-math forbids if-converting
// without AVX-512 masks, and the loop would stay scalar on AVX2.
inline double keep_or_zero(bool keep, double w) {
    std::uint64_t bits;
    std::memcpy(&bits, &w, sizeof bits);
    bits &= keep ? ~std::uint64_t{0} : std::uint64_t{0};
    std::memcpy(&w, &bits, sizeof w);
    return w;
}

// exp(x) for x in [-kClamp, 0] (valid for |x| < 700), relative error < 3e-16.
// Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, degree-12 Taylor
// polynomial, and 2^n built from the bits of the rounded multiple.  Written so that
// the compiler vectorises it inside the reduction loops.
inline double exp_small(double x) {
    const double kLog2e = 1.4426950408889634074;
    const double kShift = 6755399441055744.0;  // 1.5 * 2^52: rounds to an integer
    const double kLn2Hi = 6.93147180369123816490e-01;
    const double kLn2Lo = 1.90821492927058770002e-10;
    const double kd = x * kLog2e + kShift;
    const double nd = kd - kShift;
    double r = x - nd * kLn2Hi;
    r = r - nd * kLn2Lo;
    double q = 2.08767569878680989792e-09;          // 1/12!
    q = q * r + 2.50521083854417187751e-08;         // 1/11!
    q = q * r + 2.75573192239858906526e-07;         // 1/10!
    q = q * r + 2.75573192239858906526e-06;         // 1/9!
    q = q * r + 2.48015873015873015873e-05;         // 1/8!
    q = q * r + 1.98412698412698412698e-04;         // 1/7!
    q = q * r + 1.38888888888888888889e-03;         // 1/6!
    q = q * r + 8.33333333333333333333e-03;         // 1/5!
    q = q * r + 4.16666666666666666667e-02;         // 1/4!
    q = q * r + 1.66666666666666666667e-01;         // 1/3!
    q = q * r + 0.5;
    q = q * r + 1.0;
    q = q * r + 1.0;
    std::uint64_t bits;
    std::memcpy(&bits, &kd, sizeof bits);
    bits = (bits << 52) + (std::uint64_t{1023} << 52);
    double two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return q * two_n;
}

// log(v) for a positive normal v, error about 1 ulp: v = 2^e m with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(f), f = (m - 1) / (m + 1), |f| <= 0.1716, as an odd series to f^21
// (truncation below 1e-18).  Branch-free so that it vectorises: the exponent is turned into
// a double through the bits of 2^52 + e, not an int64 conversion (none on AVX2).
inline double log_pos(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const std::uint64_t ebits = (bits >> 52) & 0x7ff;
    const std::uint64_t mbits = (bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
    double m;
    std::memcpy(&m, &mbits, sizeof m);
    const std::uint64_t magic = 0x4330000000000000ULL | ebits;  // 2^52 + biased exponent
    double e;
    std::memcpy(&e, &magic, sizeof e);
    e -= 4503599627370496.0 + 1023.0;
    const bool big = m > 1.4142135623730951;  // selects by bit masks (keep_or_zero)
    m *= 1.0 - keep_or_zero(big, 0.5);
    e += keep_or_zero(big, 1.0);
    const double f = (m - 1.0) / (m + 1.0);
    const double f2 = f * f;
    double q = 1.0 / 21.0;
    q = q * f2 + 1.0 / 19.0;
    q = q * f2 + 1.0 / 17.0;
    q = q * f2 + 1.0 / 15.0;
    q = q * f2 + 1.0 / 13.0;
    q = q * f2 + 1.0 / 11.0;
    q = q * f2 + 1.0 / 9.0;
    q = q * f2 + 1.0 / 7.0;
    q = q * f2 + 1.0 / 5.0;
    q = q * f2 + 1.0 / 3.0;
    const double kLn2Hi = 6.93147180369123816490e-01;
    const double kLn2Lo = 1.90821492927058770002e-10;
    return e * kLn2Hi + ((2.0 * f) * (q * f2) + (2.0 * f + e * kLn2Lo));
}

// lgamma(x) for 1 <= x <= 1e300 (the kernel biases' arguments p / h + 1, h >= 1e-300).
// Stirling's series to the z^-13 term for z = x (x >= 8), or z = x + 8 with
// lgamma(x) = lgamma(x + 8) - log(x (x + 1) ... (x + 7)) (x < 8); the truncation is below
// 8.4e-16 for z >= 8 (half an ulp of lgamma(8)).  Absolute error against mpmath: 1 ulp
// for x >= 100, up to 26 ulp of max(1, |lgamma(x)|) for x < 8, where the shift cancels
// (bounded at 64 in tests/test_backends.py).  Branch-free for the vectoriser.
inline double lgamma_ge1(double x) {
    const bool small = x < 8.0;  // selects by bit masks (keep_or_zero)
    const double z = x + keep_or_zero(small, 8.0);
    double prod = x * (x + 1.0);
    prod *= (x + 2.0) * (x + 3.0);
    prod *= ((x + 4.0) * (x + 5.0)) * ((x + 6.0) * (x + 7.0));
    prod = keep_or_zero(small, prod) + keep_or_zero(!small, 1.0);
    const double r = 1.0 / z;
    const double r2 = r * r;
    double c = 1.0 / 156.0;                    // B_14 / (14 * 13)
    c = c * r2 - 691.0 / 360360.0;             // B_12 / (12 * 11)
    c = c * r2 + 1.0 / 1188.0;                 // B_10 / (10 * 9)
    c = c * r2 - 1.0 / 1680.0;                 // B_8 / (8 * 7)
    c = c * r2 + 1.0 / 1260.0;                 // B_6 / (6 * 5)
    c = c * r2 - 1.0 / 360.0;                  // B_4 / (4 * 3)
    c = c * r2 + 1.0 / 12.0;                   // B_2 / (2 * 1)
    const double half_log_2pi = 0.91893853320467274178;
    return ((z - 0.5) * log_pos(z) - z) + (half_log_2pi + c * r - log_pos(prod));
}

// G[r][0..bc) = sum_k lq[r][k] * tile[k][0..bc) for detail::kMicroRows rows at once,
// accumulators held in registers across k.
template <class Real>
inline void gemm_micro(const Real* lq, i64 K, const Real* tile, i64 bc, Real* g, i64 ldg) {
    constexpr i64 V = 128 / static_cast<i64>(sizeof(Real));
    for (i64 c0 = 0; c0 < bc; c0 += V) {
        Real acc[detail::kMicroRows][V];
        for (i64 r = 0; r < detail::kMicroRows; ++r)
            for (i64 v = 0; v < V; ++v) acc[r][v] = Real(0);
        for (i64 k = 0; k < K; ++k) {
            const Real* col = tile + k * detail::kColBlock + c0;
            for (i64 r = 0; r < detail::kMicroRows; ++r) {
                const Real a = lq[r * K + k];
#pragma omp simd
                for (i64 v = 0; v < V; ++v) acc[r][v] += a * col[v];
            }
        }
        for (i64 r = 0; r < detail::kMicroRows; ++r)
            for (i64 v = 0; v < V; ++v) g[r * ldg + c0 + v] = acc[r][v];
    }
}

}  // namespace
}  // namespace KDECAL_ISA_NS
}  // namespace kdecal
