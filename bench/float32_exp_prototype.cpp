// Prototype behind bench/README.md, "Tried on a prototype and dropped: float32 exps for
// the search's passes".  Not part of the package, not built by CMake.
//
// Times, on one core, the two loops of the engine's 1-D fold over centres held in cache:
// the max loop, and the sum of exp(L - off) with L = b + s g formed in float64, either
// with the engine's float64 exp (degree-12 polynomial, 8 lanes with AVX-512) or with the
// argument converted to float32 and a float32 exp (degree-7 polynomial, 16 lanes).
//
//   g++ -std=c++17 -O3 -march=native -fopenmp-simd -ffp-contract=fast -Icpp/src -Icpp/include \
//       bench/float32_exp_prototype.cpp -o /tmp/f32 && /tmp/f32
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define KDECAL_ISA_NS proto
#include "loo_isa_common.hpp"  // the engine's float64 exp, exp_small

using i64 = std::int64_t;
constexpr i64 kLanes = 32;

using kdecal::proto::exp_small;
using kdecal::proto::opaque;

// float32 exp for x in [-80, 0]
static inline float exp32(float x) {
    const float kLog2e = 1.44269504f, kShift = 12582912.0f;
    const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
    const float kd = x * kLog2e + kShift;
    const float nd = kd - kShift;
    float r = x - nd * kLn2Hi;
    r = r - nd * kLn2Lo;
    float q = 1.9875691500E-4f;
    q = q * r + 1.3981999507E-3f;
    q = q * r + 8.3334519073E-3f;
    q = q * r + 4.1665795894E-2f;
    q = q * r + 1.6666665459E-1f;
    q = q * r + 5.0000001201E-1f;
    q = q * r + 1.0f;
    q = q * r + 1.0f;
    std::uint32_t bits;
    std::memcpy(&bits, &kd, 4);
    bits = (bits << 23) + (127u << 23);
    float t;
    std::memcpy(&t, &bits, 4);
    return q * t;
}

static double max_loop(const double* b, const double* g, i64 n, double s) {
    double mx = -1e300;
    for (i64 i = 0; i + kLanes <= n; i += kLanes) {
        double m = -1e300;
#pragma omp simd reduction(max : m)
        for (i64 v = 0; v < kLanes; ++v) {
            const double l = b[i + v] + s * g[i + v];
            m = l > m ? l : m;
        }
        mx = m > mx ? m : mx;
    }
    return mx;
}

static double sum64(const double* b, const double* g, i64 n, double s, double off) {
    double a[kLanes] = {0};
    const double lo = opaque(-700.0);
    for (i64 i = 0; i + kLanes <= n; i += kLanes) {
#pragma omp simd
        for (i64 v = 0; v < kLanes; ++v) {
            double x = b[i + v] + s * g[i + v] - off;
            x = x < lo ? lo : x;
            a[v] += exp_small(x);
        }
    }
    double t = 0;
    for (i64 v = 0; v < kLanes; ++v) t += a[v];
    return t;
}

static double sum32(const double* b, const double* g, i64 n, double s, double off) {
    double a[kLanes] = {0};
    float xs[kLanes], ws[kLanes];
    const double lo = opaque(-80.0);
    for (i64 i = 0; i + kLanes <= n; i += kLanes) {
#pragma omp simd
        for (i64 v = 0; v < kLanes; ++v) {
            double x = b[i + v] + s * g[i + v] - off;
            x = x < lo ? lo : x;
            xs[v] = static_cast<float>(x);
        }
#pragma omp simd
        for (i64 v = 0; v < kLanes; ++v) ws[v] = exp32(xs[v]);
#pragma omp simd
        for (i64 v = 0; v < kLanes; ++v) a[v] += static_cast<double>(ws[v]);
    }
    double t = 0;
    for (i64 v = 0; v < kLanes; ++v) t += a[v];
    return t;
}

int main() {
    const i64 n = 4096;
    const int reps = 20000;
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> U(-30.0, 0.0);
    std::vector<double> b(n), g(n);
    for (i64 i = 0; i < n; ++i) {
        b[i] = U(rng);
        g[i] = U(rng) / 10.0;
    }
    const char* names[3] = {"max loop", "sum, float64 exp", "sum, float32 exp"};
    double sums[3] = {0, 0, 0};
    for (int round = 0; round < 3; ++round) {
        for (int which = 0; which < 3; ++which) {
            double acc = 0;
            const auto t0 = std::chrono::steady_clock::now();
            for (int r = 0; r < reps; ++r) {
                const double off = r * 1e-9;
                acc += which == 0   ? max_loop(b.data(), g.data(), n, 1.0)
                       : which == 1 ? sum64(b.data(), g.data(), n, 1.0, off)
                                    : sum32(b.data(), g.data(), n, 1.0, off);
            }
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            sums[which] = acc;
            std::printf("%-18s %.3f ns per pair\n", names[which], dt / (reps * double(n)) * 1e9);
        }
    }
    std::printf("relative difference of the two sums: %.2e\n", sums[2] / sums[1] - 1.0);
}
