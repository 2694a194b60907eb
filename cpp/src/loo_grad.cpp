// Dispatcher of the backward pass (loo_grad.hpp): checks the problem, lays out the two
// passes (centres sorted by label, then by prediction, in transposed tiles for the query
// pass; queries sorted by prediction in transposed tiles for the centre pass),
// allocates the per-thread scratch and calls the kernel of the SIMD path that
// loo_reduce uses on this CPU.
#include "kdecal/loo_grad.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "loo_grad_prepared.hpp"
#include "loo_prepared.hpp"
#include "order.hpp"

#if defined(KDECAL_HAVE_AVX512)
KDECAL_DECLARE_GRAD_ISA(avx512)
#endif
#if defined(KDECAL_HAVE_AVX2)
KDECAL_DECLARE_GRAD_ISA(avx2)
#endif
KDECAL_DECLARE_GRAD_ISA(baseline)

namespace kdecal {
namespace {

using i64 = std::int64_t;

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("kdecal.loo_grad: " + what);
}

// rows (n, K) in the order given by `order` (null: identity) -> tiles of kColBlock
// columns, each a contiguous transposed (K, kColBlock) block, zero-padded to n_pad.
template <class Real>
std::vector<Real> transposed_tiles(const Real* rows, const i64* order, i64 n, i64 K, i64 n_pad) {
    const i64 BC = detail::kColBlock;
    std::vector<Real> t(static_cast<std::size_t>(K * n_pad), Real(0));
    for (i64 s = 0; s < n; ++s) {
        const Real* row = rows + (order ? order[s] : s) * K;
        Real* tile = t.data() + (s / BC) * K * BC + (s % BC);
        for (i64 k = 0; k < K; ++k) tile[k * BC] = row[k];
    }
    return t;
}

template <class Real>
void dispatch(const detail::GradPass<Real>& gp, double* scratch, i64 per_thread, int nt) {
    const int isa = detail::isa_level();
    if constexpr (std::is_same_v<Real, double>) {
#if defined(KDECAL_HAVE_AVX512)
        if (isa == 2) return avx512::grad_f64(gp, scratch, per_thread, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
        if (isa == 1) return avx2::grad_f64(gp, scratch, per_thread, nt);
#endif
        baseline::grad_f64(gp, scratch, per_thread, nt);
    } else {
#if defined(KDECAL_HAVE_AVX512)
        if (isa == 2) return avx512::grad_f32(gp, scratch, per_thread, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
        if (isa == 1) return avx2::grad_f32(gp, scratch, per_thread, nt);
#endif
        baseline::grad_f32(gp, scratch, per_thread, nt);
    }
    (void)isa;
}

template <class Real>
bool loo_grad_impl(const LooGradProblem<Real>& prob, const LooGradResult& out, int n_threads,
                   Control* control) {
    const i64 n = prob.n, K = prob.K, C = prob.C;
    check(n >= 1, "n must be >= 1, got " + std::to_string(n));
    check(K >= 1, "K must be >= 1, got " + std::to_string(K));
    check(C >= 1, "the number of classes must be >= 1, got " + std::to_string(C));
    check(std::isfinite(prob.scale) && prob.scale > 0.0,
          "scale (1 / bandwidth) must be finite and > 0, got " + std::to_string(prob.scale));
    check(prob.logq && prob.p && prob.labels && prob.bias && prob.lse && prob.coef,
          "null input pointer");
    const bool query = out.grad_logq != nullptr, centre = out.grad_p != nullptr;
    if (!query && !centre) return !detail::cancelled(control);
    if (detail::cancelled(control)) return false;

    // Column orders (order.hpp).  Query pass: centres sorted by label (the class
    // segments), and within a label by their prediction; centre pass: queries sorted by
    // their prediction.  Points that predict the same class with similar confidence sit
    // together, so at small bandwidths whole tiles fall below exp(-kDrop) for a row and
    // are skipped.
    for (i64 i = 0; i < n; ++i) {
        const i64 c = prob.labels[i];
        if (c < 0 || c >= C)
            throw std::invalid_argument("kdecal.loo_grad: label " + std::to_string(c) +
                                        " at index " + std::to_string(i) + " is outside [0, " +
                                        std::to_string(C) + ")");
    }
    const int nt = detail::resolve_threads(n_threads);
    std::vector<i64> inv(static_cast<std::size_t>(n)), inv_q(static_cast<std::size_t>(n));
    for (i64 i = 0; i < n; ++i) inv[i] = i;
    const std::vector<i64> perm =
        detail::prediction_order(prob.p, K, prob.labels, C, inv.data(), n, nt);
    const std::vector<i64> perm_q =
        detail::prediction_order(prob.logq, K, nullptr, 1, inv.data(), n, nt);
    for (i64 s = 0; s < n; ++s) {
        inv[perm[s]] = s;
        inv_q[perm_q[s]] = s;
    }
    std::vector<i64> seg(static_cast<std::size_t>(C + 1), 0);
    for (i64 i = 0; i < n; ++i) ++seg[static_cast<std::size_t>(prob.labels[i] + 1)];
    for (i64 c = 0; c < C; ++c) seg[c + 1] += seg[c];

    const i64 BC = detail::kColBlock;
    const i64 n_pad = (n + BC - 1) / BC * BC;
    std::vector<double> neg_lse(static_cast<std::size_t>(n));  // query pass rows
    for (i64 j = 0; j < n; ++j) neg_lse[j] = -prob.lse[j];

    const i64 per_thread = detail::grad_scratch_doubles(K);
    std::vector<double> scratch(static_cast<std::size_t>(per_thread * nt));

    if (query) {
        const std::vector<Real> pt = transposed_tiles(prob.p, perm.data(), n, K, n_pad);
        std::vector<double> bias_sorted(static_cast<std::size_t>(n));
        for (i64 s = 0; s < n; ++s) bias_sorted[s] = prob.bias[perm[s]];
        const detail::GradPass<Real> gp{prob.logq, neg_lse.data(), pt.data(), bias_sorted.data(),
                                        prob.coef, seg.data(), nullptr, inv.data(),
                                        n, n_pad, K, C, prob.scale, 0,
                                        out.grad_logq, out.row_sum, control};
        dispatch(gp, scratch.data(), per_thread, nt);
    }
    if (centre && !detail::cancelled(control)) {
        // columns: the queries in the order perm_q
        const std::vector<Real> qt = transposed_tiles(prob.logq, perm_q.data(), n, K, n_pad);
        std::vector<double> col_off(static_cast<std::size_t>(n));
        std::vector<double> coef_t(static_cast<std::size_t>(C * n));
        for (i64 s = 0; s < n; ++s) {
            col_off[s] = -prob.lse[perm_q[s]];
            for (i64 c = 0; c < C; ++c) coef_t[c * n + s] = prob.coef[perm_q[s] * C + c];
        }
        const detail::GradPass<Real> gp{prob.p, prob.bias, qt.data(), col_off.data(),
                                        coef_t.data(), nullptr, prob.labels, inv_q.data(),
                                        n, n_pad, K, C, prob.scale, 1,
                                        out.grad_p, out.grad_bias, control};
        dispatch(gp, scratch.data(), per_thread, nt);
    }
    return !detail::cancelled(control);
}

}  // namespace

bool loo_grad(const LooGradProblem<double>& prob, const LooGradResult& out, int n_threads,
              Control* control) {
    return loo_grad_impl(prob, out, n_threads, control);
}

bool loo_grad(const LooGradProblem<float>& prob, const LooGradResult& out, int n_threads,
              Control* control) {
    return loo_grad_impl(prob, out, n_threads, control);
}

}  // namespace kdecal
