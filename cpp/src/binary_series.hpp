// Helpers shared by the fast engine of binary problems (binary.cpp) and its backward
// pass (binary_grad.cpp): the Taylor series' tables, evaluation and order, and the
// check of the points.  Internal header (not installed).
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kdecal/binary.hpp"  // kMaxOrder

namespace kdecal {
namespace binary_series {

constexpr int kNP = kMaxOrder + 1;  // moments per series

// v[p] = 1 / (p + 1) for p = 0 .. kMaxOrder + 2, f[p] = 1 / p! for p = 0 .. kMaxOrder
struct InvTable {
    double v[kMaxOrder + 3];
    double f[kNP];
    InvTable() {
        for (int p = 0; p < kMaxOrder + 3; ++p) v[p] = 1.0 / (p + 1);
        f[0] = 1.0;
        for (int p = 1; p < kNP; ++p) f[p] = f[p - 1] / p;
    }
};
inline const InvTable kInv;

// sum_{p <= P} m[p] k^p in blocks of four terms: one dependent FMA per block (a plain
// Horner chain of P + 1 dependent FMAs was a quarter of the binned method's time).
inline double series(const double* m, int P, double k) {
    const double k2 = k * k, k4 = k2 * k2;
    const int r = (P + 1) & 3;
    const int base = P + 1 - r;  // terms [base, P] lead, then blocks of four below
    double s = 0.0;
    for (int i = r - 1; i >= 0; --i) s = s * k + m[base + i];
    for (int b = base - 4; b >= 0; b -= 4)
        s = s * k4 + ((m[b] + m[b + 1] * k) + (m[b + 2] + m[b + 3] * k) * k2);
    return s;
}

// Smallest order P with rem = xi^(P+1)/(P+1)! <= tgt, or kMaxOrder + 1 if none.
inline int order_for(double xi, double tgt, double& rem) {
    rem = 0.0;
    if (xi == 0.0) return 0;
    double term = xi;  // xi^(P+1)/(P+1)! for P = 0
    for (int P = 0; P <= kMaxOrder; ++P) {
        if (term <= tgt) {
            rem = term;
            return P;
        }
        term *= xi * kInv.v[P + 1];
    }
    rem = term;
    return kMaxOrder + 1;
}

// Labels in [0, C), p in [0, 1] and logq finite and <= 0 for the B * n points of a batch
// (p, logq (B n, 2), labels (B n)); throws std::invalid_argument("<who>: ...") naming the
// first bad value (the messages are built only on failure).
inline void check_points(const double* p, const double* logq, const std::int64_t* labels,
                         std::int64_t count, std::int64_t n, std::int64_t C, const char* who) {
    auto fail = [&](const std::string& what) {
        throw std::invalid_argument(std::string(who) + ": " + what);
    };
    for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t c = labels[i];
        if (c < 0 || c >= C)
            fail("label " + std::to_string(c) + " at index " + std::to_string(i % n) +
                 " is outside [0, " + std::to_string(C) + ")");
        for (int k = 0; k < 2; ++k) {
            const double v = p[2 * i + k], l = logq[2 * i + k];
            if (!(v >= 0.0 && v <= 1.0))  // also NaN
                fail("p must lie in [0, 1]; p[" + std::to_string(i % n) + ", " +
                     std::to_string(k) + "] = " + std::to_string(v));
            if (!(std::isfinite(l) && l <= 0.0))
                fail("logq must be finite and <= 0; logq[" + std::to_string(i % n) + ", " +
                     std::to_string(k) + "] = " + std::to_string(l));
        }
    }
}

}  // namespace binary_series
}  // namespace kdecal
