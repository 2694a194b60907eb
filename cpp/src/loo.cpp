// Dispatcher of the leave-one-out reduction: checks the problem, sorts the centres by
// label and prediction, transposes them into tiles, allocates the per-thread scratch and
// calls the SIMD kernel that matches this CPU.
#include "kdecal/loo.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "loo_prepared.hpp"
#include "order.hpp"

#if defined(KDECAL_HAVE_AVX512)
KDECAL_DECLARE_ISA(avx512)
#endif
#if defined(KDECAL_HAVE_AVX2)
KDECAL_DECLARE_ISA(avx2)
#endif
KDECAL_DECLARE_ISA(baseline)

namespace kdecal {
namespace {

enum class Isa { baseline = 0, avx2 = 1, avx512 = 2 };

Isa cpu_isa() {
    Isa best = Isa::baseline;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
#if defined(KDECAL_HAVE_AVX2)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::avx2;
#endif
#if defined(KDECAL_HAVE_AVX512)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        best = Isa::avx512;
#endif
#endif
    // KDECAL_ISA may lower (never raise) the choice, e.g. to test every path.
    if (const char* env = std::getenv("KDECAL_ISA")) {
        const std::string want(env);
        Isa forced = best;
        if (want == "baseline") forced = Isa::baseline;
        else if (want == "avx2") forced = Isa::avx2;
        else if (want == "avx512") forced = Isa::avx512;
        if (static_cast<int>(forced) < static_cast<int>(best)) best = forced;
    }
    return best;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        default: return "baseline";
    }
}

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("kdecal.loo_reduce: " + what);
}

template <class Real>
void dispatch(const detail::Prepared<Real>& pr, const LooResult& out, double* scratch,
              std::int64_t per_thread, int nt) {
    const Isa isa = cpu_isa();
    if constexpr (std::is_same_v<Real, double>) {
#if defined(KDECAL_HAVE_AVX512)
        if (isa == Isa::avx512) return avx512::run_f64(pr, out, scratch, per_thread, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
        if (isa == Isa::avx2) return avx2::run_f64(pr, out, scratch, per_thread, nt);
#endif
        baseline::run_f64(pr, out, scratch, per_thread, nt);
    } else {
#if defined(KDECAL_HAVE_AVX512)
        if (isa == Isa::avx512) return avx512::run_f32(pr, out, scratch, per_thread, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
        if (isa == Isa::avx2) return avx2::run_f32(pr, out, scratch, per_thread, nt);
#endif
        baseline::run_f32(pr, out, scratch, per_thread, nt);
    }
    (void)isa;
}

template <class Real>
bool loo_reduce_impl(const LooProblem<Real>& prob, const LooResult& out, int n_threads,
                     Control* control) {
    const std::int64_t n = prob.n, K = prob.K, C = prob.C, H = prob.H;
    check(n >= 1, "n must be >= 1, got " + std::to_string(n));
    check(K >= 1, "K must be >= 1, got " + std::to_string(K));
    check(C >= 1, "the number of classes must be >= 1, got " + std::to_string(C));
    check(H >= 1, "at least one bandwidth is needed, got " + std::to_string(H));
    check(prob.powers >= 1 && prob.powers <= 3,
          "powers must be 1, 2 or 3, got " + std::to_string(prob.powers));
    check(prob.row_start >= 0 && prob.row_start <= prob.row_stop && prob.row_stop <= n,
          "need 0 <= row_start <= row_stop <= n");
    check(prob.logq && prob.p && prob.labels && prob.scale && prob.bias, "null input pointer");
    check(out.m && out.S, "null output pointer");
    check(prob.powers < 2 || out.Q, "powers >= 2 needs a Q output");
    check(prob.powers < 3 || out.T, "powers == 3 needs a T output");
    check(!out.D || prob.powers >= 2, "the pair sums D need powers >= 2");
    const bool res = out.A != nullptr;
    check(res == (out.U != nullptr), "the residual sums A and U are requested together");
    check(!res || prob.u, "the residual sums A, U need the per-centre values u (resid)");
    if (res) {
        std::int64_t n_bad = 0;  // a reduction first (vectorised), the position only on failure
        for (std::int64_t i = 0; i < n; ++i) n_bad += !std::isfinite(prob.u[i]);
        for (std::int64_t i = 0; n_bad > 0 && i < n; ++i)
            check(std::isfinite(prob.u[i]), "u (resid) must be finite; u[" + std::to_string(i) +
                                                "] = " + std::to_string(prob.u[i]));
    }
    if (prob.row_stop == prob.row_start) return !detail::cancelled(control);
    if (detail::cancelled(control)) return false;

    std::vector<std::int64_t> seg(static_cast<std::size_t>(C + 1), 0);
    for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t c = prob.labels[i];
        if (c < 0 || c >= C)
            throw std::invalid_argument("kdecal.loo_reduce: label " + std::to_string(c) +
                                        " at index " + std::to_string(i) + " is outside [0, " +
                                        std::to_string(C) + ")");
        ++seg[static_cast<std::size_t>(c + 1)];
    }
    for (std::int64_t c = 0; c < C; ++c) seg[c + 1] += seg[c];
    const int nt = detail::resolve_threads(n_threads);

    // Centres sorted by label (the class segments), then by prediction (order.hpp): at
    // small bandwidths the kernel then skips whole chunks of kLanes centres (at h = 0.05
    // on CIFAR-10 predictions, K = 10, that leaves about 45 % of the exps).
    std::vector<std::int64_t> inv(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) inv[i] = i;
    const std::vector<std::int64_t> perm =
        detail::prediction_order(prob.p, K, prob.labels, C, inv.data(), n, nt);
    for (std::int64_t s = 0; s < n; ++s) inv[perm[s]] = s;

    // centre tiles, each a contiguous (K, kColBlock) block, zero-padded at the end
    const std::int64_t BC = detail::kColBlock;
    const std::int64_t n_pad = (n + BC - 1) / BC * BC;
    // (kPad zeros more: the residual sums read up to a vector past a range's end)
    std::vector<Real> pt(static_cast<std::size_t>(K * n_pad + detail::kPad), Real(0));
    for (std::int64_t s = 0; s < n; ++s) {
        const Real* row = prob.p + perm[s] * K;
        Real* tile = pt.data() + (s / BC) * K * BC + (s % BC);
        for (std::int64_t k = 0; k < K; ++k) tile[k * BC] = row[k];
    }
    std::vector<double> bias(static_cast<std::size_t>(H * n));
    for (std::int64_t t = 0; t < H; ++t)
        for (std::int64_t s = 0; s < n; ++s) bias[t * n + s] = prob.bias[t * n + perm[s]];

    // the residual sums' u in the centres' sorted order, zero-padded like pt
    std::vector<double> u_sorted(res ? static_cast<std::size_t>(n + detail::kPad) : 0, 0.0);
    for (std::int64_t s = 0; res && s < n; ++s) u_sorted[s] = prob.u[perm[s]];
    // rows of pt per register block of the residual sums: at most kResMaxKB, as even as
    // possible
    const std::int64_t kblocks = (K + detail::kResMaxKB - 1) / detail::kResMaxKB;
    const std::int64_t res_kb = (K + kblocks - 1) / kblocks;

    const std::int64_t rows = detail::task_rows(prob.row_stop - prob.row_start, C, H, nt,
                                                res ? 6 + K + 1 : 6);
    // whole cache lines per thread, so that no two threads write to one line
    const std::int64_t per_thread =
        (detail::scratch_doubles(K, C, H, rows, res) + 7) / 8 * 8;
    std::vector<double> scratch(static_cast<std::size_t>(per_thread * nt));

    detail::Prepared<Real> pr{prob.logq, pt.data(), bias.data(), prob.scale, inv.data(),
                              seg.data(), n, n_pad, K, C, H, prob.powers,
                              prob.row_start, prob.row_stop, control, rows,
                              res ? u_sorted.data() : nullptr, res_kb};
    dispatch(pr, out, scratch.data(), per_thread, nt);
    return !detail::cancelled(control);
}

}  // namespace

int detail::isa_level() { return static_cast<int>(cpu_isa()); }

std::int64_t detail::task_rows(std::int64_t rows, std::int64_t C, std::int64_t H,
                               int n_threads, std::int64_t per_class) {
    if (const char* env = std::getenv("KDECAL_TASK_ROWS")) {
        const std::int64_t want = std::atoll(env);
        if (want >= kRowBlock && want <= 16 * kRowBlock && want % kRowBlock == 0)
            return want;
    }
    constexpr std::int64_t kAccBytes = 256 * 1024;  // per-task accumulators: stay in L2
    std::int64_t blocks = kMaxTaskBlocks;
    while (blocks > 1 && (per_class * H * C * blocks * kRowBlock * 8 > kAccBytes ||
                          rows < 16 * static_cast<std::int64_t>(n_threads) * blocks * kRowBlock))
        blocks /= 2;
    return blocks * kRowBlock;
}

int detail::resolve_threads(int n_threads) {
    int nt = n_threads;
#ifdef _OPENMP
    if (nt <= 0) nt = omp_get_max_threads();
#else
    nt = 1;
#endif
    return nt < 1 ? 1 : nt;
}

bool detail::cancelled(const Control* control) {
    return control != nullptr && control->cancel.load(std::memory_order_relaxed);
}

void detail::add_rows(Control* control, std::int64_t rows) {
    if (control != nullptr) control->rows_done.fetch_add(rows, std::memory_order_relaxed);
}

bool loo_reduce(const LooProblem<double>& prob, const LooResult& out, int n_threads,
                Control* control) {
    return loo_reduce_impl(prob, out, n_threads, control);
}

bool loo_reduce(const LooProblem<float>& prob, const LooResult& out, int n_threads,
                Control* control) {
    return loo_reduce_impl(prob, out, n_threads, control);
}

void kernel_bias(const double* p, std::int64_t rows, std::int64_t D, double scale, double* out,
                 int n_threads) {
    if (!(std::isfinite(scale) && scale > 0.0))
        throw std::invalid_argument("kdecal.kernel_bias: scale must be finite and > 0, got " +
                                    std::to_string(scale));
    std::int64_t n_bad = 0;  // a reduction first (vectorised), the position only on failure
    for (std::int64_t j = 0; j < rows * D; ++j) n_bad += !(p[j] >= 0.0 && p[j] <= 1.0);
    for (std::int64_t j = 0; n_bad > 0 && j < rows * D; ++j)
        if (!(p[j] >= 0.0 && p[j] <= 1.0))  // also NaN
            throw std::invalid_argument(
                "kdecal.kernel_bias: p must lie in [0, 1]; p[" + std::to_string(j / D) + ", " +
                std::to_string(j % D) + "] = " + std::to_string(p[j]));
    const int nt = detail::resolve_threads(n_threads);
    const Isa isa = cpu_isa();
#if defined(KDECAL_HAVE_AVX512)
    if (isa == Isa::avx512) return avx512::kernel_bias(p, rows, D, scale, out, nt);
#endif
#if defined(KDECAL_HAVE_AVX2)
    if (isa == Isa::avx2) return avx2::kernel_bias(p, rows, D, scale, out, nt);
#endif
    (void)isa;
    baseline::kernel_bias(p, rows, D, scale, out, nt);
}

const char* simd_path() { return isa_name(cpu_isa()); }

bool has_openmp() {
#ifdef _OPENMP
    return true;
#else
    return false;
#endif
}

int max_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

}  // namespace kdecal
