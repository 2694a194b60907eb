// Internal: the SIMD kernel of the binary engine, one per instruction-set namespace
// (binary_isa.cpp); binary.cpp picks the one of detail::isa_level().
#pragma once

#include <cstdint>

#include "loo_prepared.hpp"

// Sums over sorted centres [a, b) other than skip1, skip2 of w = exp(L - mc) for the
// terms with L - mc >= -T: r[0..5] += w, w^2, w^3, w p0, w p1, w^2 u; with centre weights
// v (null: all 1), r[0..5] += v w, (v w)^2, (v w)^3, v w p0, v w p1, w^2 u.  Returns the
// largest L - mc of those centres (-inf if none), whatever their weights.
#define KDECAL_DECLARE_BINARY_ISA(ns)                                                     \
    namespace kdecal {                                                                     \
    namespace ns {                                                                         \
    double binary_range(const double* bias, const double* p0, const double* p1,            \
                        const double* u, const double* v, std::int64_t a, std::int64_t b,  \
                        std::int64_t skip1, std::int64_t skip2, double s, double q0,       \
                        double q1, double mc, double T, double* r);                        \
    }                                                                                      \
    }

#ifdef KDECAL_ISA_NS
KDECAL_DECLARE_BINARY_ISA(KDECAL_ISA_NS)
#endif
