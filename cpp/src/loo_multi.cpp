// Dispatcher of the multi-label reduction (multi.hpp): checks the problem, sorts the
// centres (by the arg max of p, then the largest p) into the transposed tiles of the main
// engine, orders the query rows (the same, by logq), lays the label sets and weights out
// centre by centre, allocates the per-thread scratch and calls the kernel of the SIMD
// path that loo_reduce uses on this CPU.
#include "kdecal/multi.hpp"

#include <algorithm>
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
#include "order.hpp"

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
bool multi_impl(const MultiProblem<Real>& prob, double* S, double* Q, int n_threads,
                Control* control, double* U, double* Wout = nullptr,
                std::int64_t* order_out = nullptr, float* W32out = nullptr) {
    const i64 n = prob.n, K = prob.K, B = prob.B, C = prob.C;
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
    const bool weights_out = Wout != nullptr || W32out != nullptr;
    check(weights_out ? (order_out != nullptr) : (S && (prob.powers < 2 || Q)),
          "null output pointer (S, or Q with powers == 2; W and order)");
    check((prob.u == nullptr) == (U == nullptr),
          "the residual sums need both u (resid) and the output U, or neither");
    check(B * detail::kColBlock <= static_cast<i64>(std::numeric_limits<std::uint32_t>::max()),
          "too many label sets for one call (" + std::to_string(B) + "); split them");
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
    if (prob.u)
        for (i64 b = 0; b < B; ++b)
            for (i64 i = 0; i < n; ++i) {
                const double v = prob.u[b * n + i];
                if (!std::isfinite(v))
                    check(false, "u (resid)[" + std::to_string(b) + ", " + std::to_string(i) +
                                     "] = " + num(v) + " must be finite");
            }
    const i64 R = prob.row_stop - prob.row_start;
    if (R == 0 || (B == 0 && !weights_out)) {
        detail::add_rows(control, R);  // nothing to compute
        return !detail::cancelled(control);
    }
    if (detail::cancelled(control)) return false;

    // centres sorted by the prediction of p (order.hpp); query rows of the range by that
    // of logq (the same order: log is increasing)
    const int nt = detail::resolve_threads(n_threads);
    std::vector<i64> ident(static_cast<std::size_t>(n));
    for (i64 i = 0; i < n; ++i) ident[i] = i;
    const std::vector<i64> perm = detail::prediction_order(prob.p, K, nullptr, 1, ident.data(),
                                                           n, nt);
    if (order_out)
        for (i64 s = 0; s < n; ++s) order_out[s] = perm[s];
    std::vector<i64> cinv(static_cast<std::size_t>(n));
    for (i64 s = 0; s < n; ++s) cinv[perm[s]] = s;
    const std::vector<i64> rows = detail::prediction_order(
        prob.logq, K, nullptr, 1, ident.data() + prob.row_start, R, nt);
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


    // Label sets per panel of T tiles, in compressed rows (panel, b, c) of the panel's
    // centres with label c in set b and a non-zero weight (loo_multi_prepared.hpp).
    // Segments average T * kColBlock / C entries: T grows with C so that they stay long.
    // (Measured on Zen 4 with B = 200, n = 5000: T = 1 is best for C = 2, T ~ 8 for
    // C = 10, T = 16..32 for C >= 100; the panel's weights, 16 KiB per tile and power,
    // then live in L2.)
    // The entries of a panel (at most T kColBlock B) are counted in 32 bits.
    const i64 T_fit =
        static_cast<i64>(std::numeric_limits<std::uint32_t>::max()) / (std::max<i64>(B, 1) * BC);
    const i64 T_max = std::min<i64>(prob.powers >= 2 || prob.u ? 16 : 32, T_fit);
    const i64 T = std::max<i64>(1, std::min<i64>((C + 1) / 2, T_max));
    const i64 PC = T * BC;
    const i64 n_panels = (n + PC - 1) / PC;
    const std::int64_t* labels = prob.labels;
    const double* weights = prob.weights;
    std::vector<std::int64_t> panel_base(static_cast<std::size_t>(n_panels + 1), 0);
    for (i64 t = 0; t < n_panels; ++t) {
        const i64 s0 = t * PC, s1 = (s0 + PC) < n ? (s0 + PC) : n;
        i64 cnt = (s1 - s0) * B;
        if (weights) {
            cnt = 0;
            for (i64 b = 0; b < B; ++b)
                for (i64 s = s0; s < s1; ++s) cnt += weights[b * n + perm[s]] != 0.0;
        }
        panel_base[t + 1] = panel_base[t] + cnt;
    }
    const i64 n_entries = panel_base[n_panels];
    std::vector<std::uint32_t> ptr(static_cast<std::size_t>(n_panels * (B * C + 1)));
    std::vector<std::uint16_t> idx(static_cast<std::size_t>(n_entries));
    std::vector<double> val(weights ? static_cast<std::size_t>(n_entries) : 0);
    const double* u = prob.u;  // U: the entries' weight * u (u without weights)
    std::vector<double> uval(u ? static_cast<std::size_t>(n_entries) : 0);
    std::vector<std::uint32_t> counts(static_cast<std::size_t>(nt * (C + 1)));
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && n * B > 100000)
#endif
    for (i64 t = 0; t < n_panels; ++t) {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        std::uint32_t* cnt = counts.data() + tid * (C + 1);
        std::uint32_t* pt_row = ptr.data() + t * (B * C + 1);
        std::uint16_t* ix = idx.data() + panel_base[t];
        double* vl = weights ? val.data() + panel_base[t] : nullptr;
        double* uv = u ? uval.data() + panel_base[t] : nullptr;
        const i64 s0 = t * PC, s1 = (s0 + PC) < n ? (s0 + PC) : n;
        std::uint32_t start = 0;
        for (i64 b = 0; b < B; ++b) {
            const std::int64_t* lab = labels + b * n;
            const double* w = weights ? weights + b * n : nullptr;
            const double* ub = u ? u + b * n : nullptr;
            for (i64 c = 0; c <= C; ++c) cnt[c] = 0;
            for (i64 s = s0; s < s1; ++s)
                if (!w || w[perm[s]] != 0.0) ++cnt[lab[perm[s]] + 1];
            cnt[0] = start;
            for (i64 c = 0; c < C; ++c) {
                pt_row[b * C + c] = cnt[c];
                cnt[c + 1] += cnt[c];
            }
            start = cnt[C];
            for (i64 s = s0; s < s1; ++s) {
                const i64 i = perm[s];
                if (w && w[i] == 0.0) continue;
                const std::uint32_t pos = cnt[lab[i]]++;
                ix[pos] = static_cast<std::uint16_t>(s - s0);
                if (vl) vl[pos] = w[i];
                if (uv) uv[pos] = w ? w[i] * ub[i] : ub[i];
            }
        }
        pt_row[B * C] = start;
    }

    const i64 per_thread =
        (detail::multi_scratch_doubles(K, B, C, prob.powers, T, u != nullptr) + 7) / 8 * 8;
    std::vector<double> scratch_buf(static_cast<std::size_t>(per_thread * nt + 8));
    double* scratch = scratch_buf.data();
    while (reinterpret_cast<std::uintptr_t>(scratch) % 64 != 0) ++scratch;

    const detail::MultiPrepared<Real> mp{prob.logq, pt.data(), bias.data(), cinv.data(),
                                         rows.data(), mrow.data(), panel_base.data(),
                                         ptr.data(), idx.data(),
                                         weights ? val.data() : nullptr,
                                         u ? uval.data() : nullptr,
                                         n, n_pad, K, B, C, T, prob.scale, prob.powers,
                                         prob.row_start, R, S, prob.powers >= 2 ? Q : nullptr,
                                         control, u ? U : nullptr, Wout, W32out};
    if (detail::cancelled(control)) return false;  // (laying out the labels takes a while)
    dispatch(mp, scratch, per_thread, nt);
    return !detail::cancelled(control);
}

}  // namespace

bool loo_reduce_multi(const MultiProblem<double>& prob, double* S, double* Q, int n_threads,
                      Control* control, double* U) {
    return multi_impl(prob, S, Q, n_threads, control, U);
}

bool loo_reduce_multi(const MultiProblem<float>& prob, double* S, double* Q, int n_threads,
                      Control* control, double* U) {
    return multi_impl(prob, S, Q, n_threads, control, U);
}

namespace {
template <class Real, class Out>
bool weights_impl(const MultiProblem<Real>& prob, Out* W, std::int64_t* order, int n_threads,
                  Control* control) {
    MultiProblem<Real> bare = prob;  // no label sets: the weights only
    bare.labels = nullptr;
    bare.weights = nullptr;
    bare.u = nullptr;
    bare.B = 0;
    bare.C = 1;
    bare.powers = 1;
    check(W != nullptr && order != nullptr, "null output pointer (W, order)");
    // a small block is not worth waking the other threads (callers ask for many)
    const double pairs = static_cast<double>(prob.row_stop - prob.row_start) *
                         static_cast<double>(prob.n);
    if (pairs < 1048576.0) n_threads = 1;
    if constexpr (std::is_same_v<Out, float>)
        return multi_impl(bare, nullptr, nullptr, n_threads, control, nullptr, nullptr, order,
                          W);
    else
        return multi_impl(bare, nullptr, nullptr, n_threads, control, nullptr, W, order);
}
}  // namespace

bool kernel_weights(const MultiProblem<double>& prob, double* W, std::int64_t* order,
                    int n_threads, Control* control) {
    return weights_impl(prob, W, order, n_threads, control);
}

bool kernel_weights(const MultiProblem<float>& prob, double* W, std::int64_t* order,
                    int n_threads, Control* control) {
    return weights_impl(prob, W, order, n_threads, control);
}

bool kernel_weights(const MultiProblem<double>& prob, float* W, std::int64_t* order,
                    int n_threads, Control* control) {
    return weights_impl(prob, W, order, n_threads, control);
}

bool kernel_weights(const MultiProblem<float>& prob, float* W, std::int64_t* order,
                    int n_threads, Control* control) {
    return weights_impl(prob, W, order, n_threads, control);
}

}  // namespace kdecal
