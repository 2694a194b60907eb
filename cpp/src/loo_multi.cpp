// Dispatcher of the multi-label reduction (multi.hpp): checks the problem, sorts the
// centres (by the arg max of p) into the transposed tiles of the main engine, orders
// the query rows (by the arg max of logq), lays the label sets and weights out centre by
// centre, allocates the per-thread scratch and calls the kernel of the SIMD path that
// loo_reduce uses on this CPU.
#include "kdecal/multi.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "loo_multi_prepared.hpp"
#include "loo_prepared.hpp"

#if defined(KDECAL_HAVE_AVX512)
KDECAL_DECLARE_MULTI_ISA(avx512)
#endif
#if defined(KDECAL_HAVE_AVX2)
KDECAL_DECLARE_MULTI_ISA(avx2)
#endif
KDECAL_DECLARE_MULTI_ISA(baseline)

namespace kdecal {
namespace {

using i64 = std::int64_t;

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("kdecal.loo_reduce_multi: " + what);
}

std::string num(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return std::to_string(x);
}

template <class Real>
i64 argmax(const Real* row, i64 K) {
    i64 best = 0;
    for (i64 k = 1; k < K; ++k)
        if (row[k] > row[best]) best = k;
    return best;
}

// Stable counting sort of idx[0..len) by key[idx[.]] in [0, n_keys).
std::vector<i64> sort_by_key(const std::vector<i64>& key, const i64* idx, i64 len, i64 n_keys) {
    std::vector<i64> start(static_cast<std::size_t>(n_keys + 1), 0);
    for (i64 s = 0; s < len; ++s) ++start[static_cast<std::size_t>(key[idx[s]] + 1)];
    for (i64 k = 0; k < n_keys; ++k) start[k + 1] += start[k];
    std::vector<i64> out(static_cast<std::size_t>(len));
    for (i64 s = 0; s < len; ++s) out[start[static_cast<std::size_t>(key[idx[s]])]++] = idx[s];
    return out;
}

template <class Real>
void dispatch(const detail::MultiPrepared<Real>& mp, double* scratch, i64 per_thread, int nt) {
    const int isa = detail::isa_level();
    if constexpr (std::is_same_v<Real, double>) {
#if defined(KDECAL_HAVE_AVX512)
        if (isa == 2) return avx512::multi_f64(mp, scratch, per_thread, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
        if (isa == 1) return avx2::multi_f64(mp, scratch, per_thread, nt);
#endif
        baseline::multi_f64(mp, scratch, per_thread, nt);
    } else {
#if defined(KDECAL_HAVE_AVX512)
        if (isa == 2) return avx512::multi_f32(mp, scratch, per_thread, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
        if (isa == 1) return avx2::multi_f32(mp, scratch, per_thread, nt);
#endif
        baseline::multi_f32(mp, scratch, per_thread, nt);
    }
    (void)isa;
}

template <class Real>
void multi_impl(const MultiProblem<Real>& prob, double* S, double* Q, int n_threads) {
    const i64 n = prob.n, K = prob.K, B = prob.B, C = prob.C;
    constexpr i64 RB = detail::kMultiRows;
    check(n >= 1, "n must be >= 1, got " + std::to_string(n));
    check(K >= 1, "K must be >= 1, got " + std::to_string(K));
    check(B >= 0, "the number of label sets B must be >= 0, got " + std::to_string(B));
    check(C >= 1, "n_classes must be >= 1, got " + std::to_string(C));
    check(prob.powers == 1 || prob.powers == 2,
          "powers must be 1 or 2, got " + std::to_string(prob.powers));
    check(std::isfinite(prob.scale) && prob.scale > 0.0,
          "scale (1 / bandwidth) must be finite and > 0, got " + num(prob.scale));
    check(prob.row_start >= 0 && prob.row_start <= prob.row_stop && prob.row_stop <= n,
          "need 0 <= row_start <= row_stop <= n, got row_start = " +
              std::to_string(prob.row_start) + ", row_stop = " + std::to_string(prob.row_stop) +
              ", n = " + std::to_string(n));
    check(prob.logq && prob.p && prob.bias && prob.m && (prob.labels || B == 0),
          "null input pointer");
    check(S && (prob.powers < 2 || Q), "null output pointer (S, or Q with powers == 2)");
    check(B * C <= static_cast<i64>(std::numeric_limits<std::int32_t>::max()) / RB,
          "the label sets times n_classes (" + std::to_string(B) + " x " + std::to_string(C) +
              ") are too many for one call; split the label sets");
    for (i64 i = 0; i < n; ++i)
        if (std::isnan(prob.bias[i]) || prob.bias[i] == std::numeric_limits<double>::infinity())
            check(false, "bias[" + std::to_string(i) + "] = " + num(prob.bias[i]) +
                             " must be finite (or -inf)");
    for (i64 j = prob.row_start; j < prob.row_stop; ++j)
        if (std::isnan(prob.m[j]) || prob.m[j] == std::numeric_limits<double>::infinity())
            check(false, "m[" + std::to_string(j) + "] = " + num(prob.m[j]) +
                             " must be finite (or -inf for a row without centres)");
    for (i64 b = 0; b < B; ++b)
        for (i64 i = 0; i < n; ++i) {
            const i64 c = prob.labels[b * n + i];
            if (c < 0 || c >= C)
                check(false, "labels[" + std::to_string(b) + ", " + std::to_string(i) +
                                 "] = " + std::to_string(c) + " is outside [0, n_classes = " +
                                 std::to_string(C) + ")");
        }
    if (prob.weights)
        for (i64 b = 0; b < B; ++b)
            for (i64 i = 0; i < n; ++i) {
                const double w = prob.weights[b * n + i];
                if (!(std::isfinite(w) && w >= 0.0))
                    check(false, "weights[" + std::to_string(b) + ", " + std::to_string(i) +
                                     "] = " + num(w) + " must be finite and >= 0");
            }
    const i64 R = prob.row_stop - prob.row_start;
    if (R == 0 || B == 0) return;

    // centres sorted by the arg max of p; query rows of the range by that of logq
    std::vector<i64> key(static_cast<std::size_t>(n)), ident(static_cast<std::size_t>(n));
    for (i64 i = 0; i < n; ++i) {
        key[i] = argmax(prob.p + i * K, K);
        ident[i] = i;
    }
    const std::vector<i64> perm = sort_by_key(key, ident.data(), n, K);
    std::vector<i64> cinv(static_cast<std::size_t>(n));
    for (i64 s = 0; s < n; ++s) cinv[perm[s]] = s;
    for (i64 j = prob.row_start; j < prob.row_stop; ++j) key[j] = argmax(prob.logq + j * K, K);
    const std::vector<i64> rows = sort_by_key(key, ident.data() + prob.row_start, R, K);
    std::vector<double> mrow(static_cast<std::size_t>(R));
    for (i64 q = 0; q < R; ++q) {
        const double mj = prob.m[rows[q]];
        mrow[q] = mj == -std::numeric_limits<double>::infinity()
                      ? std::numeric_limits<double>::infinity()  // no term at all
                      : mj;
    }

    const i64 BC = detail::kColBlock;
    const i64 n_pad = (n + BC - 1) / BC * BC;
    std::vector<Real> pt(static_cast<std::size_t>(K * n_pad), Real(0));
    std::vector<double> bias(static_cast<std::size_t>(n_pad),
                             -std::numeric_limits<double>::infinity());
    for (i64 s = 0; s < n; ++s) {
        const Real* row = prob.p + perm[s] * K;
        Real* tile = pt.data() + (s / BC) * K * BC + (s % BC);
        for (i64 k = 0; k < K; ++k) tile[k * BC] = row[k];
        bias[s] = prob.bias[perm[s]];
    }

    int nt = n_threads;
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#else
    nt = 1;
#endif
    if (nt < 1) nt = 1;

    // label sets and weights centre by centre (sorted order): (n, B)
    std::vector<std::int32_t> off(static_cast<std::size_t>(n * B));
    std::vector<double> wt(prob.weights ? static_cast<std::size_t>(n * B) : 0);
    const std::int64_t* labels = prob.labels;
    const double* weights = prob.weights;
    const i64 nblk = (n + 63) / 64;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && n * B > 100000)
#endif
    for (i64 blk = 0; blk < nblk; ++blk) {
        const i64 s0 = blk * 64, s1 = (s0 + 64) < n ? (s0 + 64) : n;
        for (i64 b = 0; b < B; ++b) {
            const std::int64_t* lab = labels + b * n;
            for (i64 s = s0; s < s1; ++s)
                off[s * B + b] = static_cast<std::int32_t>((b * C + lab[perm[s]]) * RB);
            if (weights) {
                const double* w = weights + b * n;
                for (i64 s = s0; s < s1; ++s) wt[s * B + b] = w[perm[s]];
            }
        }
    }

    const i64 per_thread =
        (detail::multi_scratch_doubles(K, B, C, prob.powers) + 7) / 8 * 8;
    std::vector<double> scratch_buf(static_cast<std::size_t>(per_thread * nt + 8));
    double* scratch = scratch_buf.data();
    while (reinterpret_cast<std::uintptr_t>(scratch) % 64 != 0) ++scratch;

    const detail::MultiPrepared<Real> mp{prob.logq, pt.data(), bias.data(), cinv.data(),
                                         rows.data(), mrow.data(), off.data(),
                                         prob.weights ? wt.data() : nullptr,
                                         n, n_pad, K, B, C, prob.scale, prob.powers,
                                         prob.row_start, R, S, prob.powers >= 2 ? Q : nullptr};
    dispatch(mp, scratch, per_thread, nt);
}

}  // namespace

void loo_reduce_multi(const MultiProblem<double>& prob, double* S, double* Q, int n_threads) {
    multi_impl(prob, S, Q, n_threads);
}

void loo_reduce_multi(const MultiProblem<float>& prob, double* S, double* Q, int n_threads) {
    multi_impl(prob, S, Q, n_threads);
}

}  // namespace kdecal
