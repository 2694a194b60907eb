// The centre role of the backward pass of binary problems (binary.hpp,
// binary_grad_centres): for each centre i the sum over the queries j of
// w_ij coef[j, c_i] (1, logq_j0, logq_j1), by Taylor series over cells of queries.  The
// derivation of the bounds is in docs/guide/binary_engine.md ("The backward pass").
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "binary_series.hpp"
#include "kdecal/binary.hpp"
#include "loo_prepared.hpp"  // detail::resolve_threads, cancelled, add_rows

namespace kdecal {
namespace {

using i64 = std::int64_t;
constexpr double kEps = std::numeric_limits<double>::epsilon();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kHalfPi = 1.5707963267948966;
using binary_series::kNP;  // moments per series
constexpr int kCh = 3;              // channels: 1, logq_j0, logq_j1
// cells of fewer queries are summed directly (a term costs about one exp)
constexpr i64 kMinMoments = 8;
// truncation per cell, relative to the centre's running lower bound of its mass
constexpr double kTolCell = 1e-11;
// a cell (or the rest of a direction) is left out when its envelope is below this
// fraction of the smallest channel's running lower bound
constexpr double kSkip = 1e-14;
constexpr i64 kCentresPerTask = 128;

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("kdecal.binary_grad_centres: " + what);
}

using binary_series::kInv;
using binary_series::order_for;
using binary_series::series;

// fine cells per coarse cell of at least kFineMin queries: equal parts of its t range
// (the Taylor argument kappa d is proportional to the t half-width)
constexpr i64 kSub = 8;
constexpr i64 kFineMin = 64;

struct QCell {                // a run of queries in the sorted order
    i64 start, end;
    i64 lo, hi;               // sorted positions of the smallest and largest x
    double tC, delta;         // reference logit, max |t_j - tC|
    bool upper;               // the form of the cell's expansion: x_C > 1/2 (see make_cell)
    double rC;                // the reference's x (lower form) or 1 - x (upper form)
    double A;                 // max over the cell of a_j
    double mag;               // max |a_j| + |s logq_j| + |s rC d_j| + |lse_j| (rounding)
    double lqmax;             // max |logq_j0| (lower form) or |logq_j1| (upper form)
    i64 off;                  // offset of the moments in Queries::mom, -1: summed directly
    i64 goff;                 // offset of the envelope's maxima in Queries::gm
    i64 fb, fe;               // coarse cells: their fine cells [fb, fe) in Queries::fine
};

struct Queries {  // one problem, sorted by x
    std::vector<i64> perm, cell_of;
    std::vector<double> p0, p1, l0, l1, t, lse, coef;  // coef (n, C) in sorted order
    std::vector<QCell> cells, fine;
    std::vector<double> mom;   // per cell with moments: (C, kCh, kNP) series, (C, kCh) masses
    std::vector<double> gm;    // per cell: (C, kCh) max_j log |coef_jc rho_j| - lse_j
    std::vector<double> gpre, gsuf;  // prefix / suffix maxima of the coarse cells' gm
};

i64 mom_stride(i64 C) { return C * kCh * kNP + C * kCh; }

// the statistics, envelope maxima and (for kMinMoments queries or more) moments of the
// sorted queries [a, e)
QCell make_cell(Queries& q, i64 C, double s, i64 a, i64 e) {
    QCell c{};
    c.start = a;
    c.end = e;
    c.fb = c.fe = 0;
    double tmin = q.t[a], tmax = tmin;
    c.lo = c.hi = a;
    c.lqmax = 0.0;
    for (i64 j = a; j < e; ++j) {
        tmin = std::min(tmin, q.t[j]);
        tmax = std::max(tmax, q.t[j]);
        if (q.p1[j] < q.p1[c.lo]) c.lo = j;
        if (q.p1[j] > q.p1[c.hi]) c.hi = j;
    }
    c.tC = 0.5 * (tmin + tmax);
    // L_ij = bias_i + s (logq_j0 + x_i t_j) = bias_i + s (logq_j1 - (1 - x_i) t_j): the
    // lower form takes the first, the upper form (cells near x = 1) the second, whose
    // terms stay small there (logq_j1 ~ 0, 1 - x_i ~ 0), and the coordinate 1 - x_i
    // keeps its precision; kappa = s (x_i - rC), resp. s (rC - (1 - x_i))
    c.upper = c.tC > 0.0;
    c.rC = 1.0 / (1.0 + std::exp(c.upper ? c.tC : -c.tC));
    for (i64 j = a; j < e; ++j)
        c.lqmax = std::max(c.lqmax, std::fabs(c.upper ? q.l1[j] : q.l0[j]));
    c.A = kNegInf;
    c.delta = 0.0;
    c.mag = 0.0;
    c.goff = static_cast<i64>(q.gm.size());
    q.gm.resize(q.gm.size() + static_cast<std::size_t>(C * kCh), kNegInf);
    std::vector<double> av(static_cast<std::size_t>(e - a));
    for (i64 j = a; j < e; ++j) {
        const double d = q.t[j] - c.tC;
        c.delta = std::max(c.delta, std::fabs(d));
        const double lq = c.upper ? q.l1[j] : q.l0[j];
        const double aj = s * (c.upper ? lq - c.rC * d : lq + c.rC * d) - q.lse[j];
        av[j - a] = aj;
        c.A = std::max(c.A, aj);
        c.mag = std::max(c.mag, std::fabs(aj) + s * std::fabs(lq) + s * std::fabs(c.rC * d) +
                                    std::fabs(q.lse[j]));
        const double rho[kCh] = {1.0, q.l0[j], q.l1[j]};
        for (i64 cl = 0; cl < C; ++cl)
            for (int ch = 0; ch < kCh; ++ch) {
                const double w = std::fabs(q.coef[j * C + cl] * rho[ch]);
                double& g = q.gm[c.goff + cl * kCh + ch];
                if (w > 0.0) g = std::max(g, std::log(w) - q.lse[j]);
            }
    }
    c.off = -1;
    if (e - a < kMinMoments) return c;
    const i64 stride = mom_stride(C);
    c.off = static_cast<i64>(q.mom.size());
    q.mom.resize(q.mom.size() + static_cast<std::size_t>(stride), 0.0);
    double* M = q.mom.data() + c.off;
    double* W = M + C * kCh * kNP;
    for (i64 j = a; j < e; ++j) {
        const double ew = std::exp(av[j - a] - c.A);
        if (ew == 0.0) continue;
        const double d = q.t[j] - c.tC;
        const double rho[kCh] = {1.0, q.l0[j], q.l1[j]};
        for (i64 cl = 0; cl < C; ++cl) {
            const double cf = q.coef[j * C + cl];
            if (cf == 0.0) continue;
            for (int ch = 0; ch < kCh; ++ch) {
                const double w = cf * rho[ch] * ew;
                W[cl * kCh + ch] += std::fabs(w);
                double* m = M + (cl * kCh + ch) * kNP;
                double pw = w;
                for (int p = 0; p < kNP; ++p) {
                    m[p] += pw;
                    pw *= d * kInv.v[p];
                }
            }
        }
    }
    return c;
}

void build(const BinaryGradProblem& pr, i64 b, Queries& q) {
    const i64 n = pr.n, C = pr.C;
    const double s = pr.scale;
    const double* P = pr.p + b * n * 2;
    const double* LQ = pr.logq + b * n * 2;
    q.perm.resize(static_cast<std::size_t>(n));
    std::iota(q.perm.begin(), q.perm.end(), i64{0});
    std::stable_sort(q.perm.begin(), q.perm.end(),
                     [&](i64 a, i64 c) { return P[2 * a + 1] < P[2 * c + 1]; });
    auto N = static_cast<std::size_t>(n);
    q.p0.resize(N), q.p1.resize(N), q.l0.resize(N), q.l1.resize(N), q.t.resize(N);
    q.lse.resize(N), q.coef.resize(N * static_cast<std::size_t>(C));
    std::vector<double> z(N);
    for (i64 k = 0; k < n; ++k) {
        const i64 j = q.perm[k];
        q.p0[k] = P[2 * j];
        q.p1[k] = P[2 * j + 1];
        q.l0[k] = LQ[2 * j];
        q.l1[k] = LQ[2 * j + 1];
        q.t[k] = q.l1[k] - q.l0[k];
        q.lse[k] = pr.lse[b * n + j];
        for (i64 c = 0; c < C; ++c) q.coef[k * C + c] = pr.coef[(b * n + j) * C + c];
        // from the nearer end, so that scores near 1 keep their resolution
        z[k] = q.p1[k] <= 0.5 ? std::asin(std::sqrt(q.p1[k]))
                              : kHalfPi - std::asin(std::sqrt(q.p0[k]));
    }
    const double width = pr.cell_width * 0.5 * std::sqrt(1.0 / s);
    q.cells.clear();
    q.fine.clear();
    q.mom.clear();
    q.gm.clear();
    q.cell_of.assign(N, 0);
    for (i64 a = 0; a < n;) {
        i64 e = a + 1;
        while (e < n && z[e] - z[a] <= width) ++e;
        QCell c = make_cell(q, C, s, a, e);
        if (e - a >= kFineMin && c.delta > 0.0) {  // fine cells: kSub equal parts of t
            c.fb = static_cast<i64>(q.fine.size());
            const double t0 = c.tC - c.delta, step = 2.0 * c.delta / kSub;
            i64 f0 = a;
            for (i64 part = 1; part <= kSub && f0 < e; ++part) {
                i64 f1 = f0;
                const double edge = part == kSub ? std::numeric_limits<double>::infinity()
                                                 : t0 + step * static_cast<double>(part);
                while (f1 < e && q.t[f1] < edge) ++f1;
                if (f1 > f0) q.fine.push_back(make_cell(q, C, s, f0, f1));
                f0 = f1;
            }
            c.fe = static_cast<i64>(q.fine.size());
        }
        q.cells.push_back(c);
        for (i64 k = a; k < e; ++k) q.cell_of[k] = static_cast<i64>(q.cells.size()) - 1;
        a = e;
    }
    const i64 nc = static_cast<i64>(q.cells.size());
    const i64 G = C * kCh;
    q.gpre.assign(static_cast<std::size_t>(nc * G), kNegInf);
    q.gsuf.assign(static_cast<std::size_t>(nc * G), kNegInf);
    for (i64 g = 0; g < G; ++g) {
        double run = kNegInf;
        for (i64 k = 0; k < nc; ++k)
            q.gpre[k * G + g] = run = std::max(run, q.gm[q.cells[k].goff + g]);
        run = kNegInf;
        for (i64 k = nc - 1; k >= 0; --k)
            q.gsuf[k * G + g] = run = std::max(run, q.gm[q.cells[k].goff + g]);
    }
}

struct Acc {
    double v[kCh] = {0, 0, 0};    // the sums
    double err[kCh] = {0, 0, 0};  // their absolute error bounds
    double lb[kCh] = {0, 0, 0};   // lower bounds of the sums of |terms|
    // whether terms below e^env[ch] (each channel's envelope of what is left out) are
    // negligible for every channel; if so, adds them to the error bounds
    bool skip(const double env[kCh]) {
        for (int ch = 0; ch < kCh; ++ch)
            if (env[ch] > kNegInf && !(env[ch] < std::log(kSkip * lb[ch]))) return false;
        for (int ch = 0; ch < kCh; ++ch) err[ch] += std::exp(env[ch]);
        return true;
    }
};

// the exact terms of sorted queries [a, e) for centre (p0, p1, bias) of class cl, but
// the centre's own position self
void direct(const Queries& q, i64 C, double s, i64 cl, double p0, double p1, double bias,
            i64 a, i64 e, i64 self, Acc& acc, BinaryGradStats& st) {
    for (i64 j = a; j < e; ++j) {
        if (j == self) continue;
        const double cf = q.coef[j * C + cl];
        if (cf == 0.0) continue;
        const double g = q.l0[j] * p0 + q.l1[j] * p1;
        const double L = bias + s * g - q.lse[j];
        const double w = std::exp(L);
        // rounding of L: the dense engine's own order of magnitude
        const double rel =
            4.0 * kEps * (std::fabs(bias) + s * (std::fabs(q.l0[j]) * p0 + std::fabs(q.l1[j]) * p1) +
                          std::fabs(q.lse[j])) +
            4.0 * kEps;
        const double rho[kCh] = {1.0, q.l0[j], q.l1[j]};
        for (int ch = 0; ch < kCh; ++ch) {
            const double t = w * cf * rho[ch];
            acc.v[ch] += t;
            acc.lb[ch] += std::fabs(t);
            acc.err[ch] += rel * std::fabs(t);
        }
    }
    st.pairs_direct += e - a;
}

// log of the largest kernel factor exp(s (p0 l0_x + p1 l1_x)) over x in [x(lo), x(hi)]:
// concave in x with its maximum at x = p1 (the centre's own logs there)
double ell_max(const Queries& q, i64 lo, i64 hi, double p0, double p1, double l0i, double l1i) {
    if (p1 < q.p1[lo]) return p0 * q.l0[lo] + p1 * q.l1[lo];
    if (p1 > q.p1[hi]) return p0 * q.l0[hi] + p1 * q.l1[hi];
    return p0 * l0i + p1 * l1i;
}

void one_centre(const Queries& q, const BinaryGradProblem& pr, i64 self, double bias, i64 cl,
                double out[kCh], BinaryGradStats& st) {
    const i64 C = pr.C, n = pr.n;
    const double s = pr.scale;
    const double p0 = q.p0[self], p1 = q.p1[self], l0i = q.l0[self], l1i = q.l1[self];
    const double slack = 1e-9 + 8.0 * kEps * (std::fabs(bias) + s * 80.0);
    const i64 nc = static_cast<i64>(q.cells.size());
    const i64 k0 = q.cell_of[self];
    const i64 stride_series = kNP;
    Acc acc;
    bool ok = true;

    // one cell: left out (its envelope), summed directly, by its series, or (a coarse
    // cell whose series would be too long) by its fine cells
    auto visit = [&](auto& rec, const QCell& c, bool coarse) -> void {
        const i64 cnt = c.end - c.start;
        // the cell's envelope per channel (each term below it)
        const double base = bias + s * ell_max(q, c.lo, c.hi, p0, p1, l0i, l1i) +
                            std::log(static_cast<double>(cnt)) + slack;
        const double* gk = q.gm.data() + c.goff + cl * kCh;
        const double env[kCh] = {base + gk[0], base + gk[1], base + gk[2]};
        if (!(env[0] > kNegInf || env[1] > kNegInf || env[2] > kNegInf)) return;  // no weight
        const bool has_self = self >= c.start && self < c.end;
        if (!has_self && acc.skip(env)) return;
        if (c.off < 0) {
            direct(q, C, s, cl, p0, p1, bias, c.start, c.end, self, acc, st);
            return;
        }
        const double* M = q.mom.data() + c.off + cl * kCh * kNP;
        const double* W = q.mom.data() + c.off + C * kCh * kNP + cl * kCh;
        const double coord = c.upper ? p0 : p1;  // the centre's coordinate in the form
        const double kappa = c.upper ? s * (c.rC - p0) : s * (p1 - c.rC);
        const double xi = std::fabs(kappa) * c.delta;
        const double logF = bias + (c.upper ? -s * p0 * c.tC : s * p1 * c.tC) + c.A;
        // the centre's own query term (its series is taken out below)
        double wself[kCh] = {0, 0, 0}, dself = 0.0;
        if (has_self) {
            dself = q.t[self] - c.tC;
            const double aself = c.upper
                                     ? s * (q.l1[self] - c.rC * dself) - q.lse[self]
                                     : s * (q.l0[self] + c.rC * dself) - q.lse[self];
            const double e = std::exp(aself - c.A);
            const double cf = q.coef[self * C + cl];
            const double rho[kCh] = {1.0, q.l0[self], q.l1[self]};
            for (int ch = 0; ch < kCh; ++ch) wself[ch] = cf * rho[ch] * e;
        }
        double F = 0.0, Fup = 0.0, Flo = 0.0;
        int P = kMaxOrder + 1;
        double rem = 0.0;
        double lbc[kCh] = {0, 0, 0};
        if (xi < 700.0 && logF + xi < 700.0) {
            F = std::exp(logF);
            Fup = F * std::exp(xi);
            Flo = F * std::exp(-xi);
            // the order: truncation below kTolCell of the running lower bound (with
            // this cell's own), for the channel that needs the most terms
            P = 0;
            for (int ch = 0; ch < kCh; ++ch) {
                if (W[ch] == 0.0) continue;
                lbc[ch] = Flo * std::max(0.0, W[ch] - std::fabs(wself[ch])) * (1.0 - 1e-12);
                const double ref = acc.lb[ch] + lbc[ch];
                double r = 0.0;
                const int Pc = ref > 0.0 ? order_for(xi, kTolCell * ref / (Fup * W[ch]), r)
                                         : kMaxOrder + 1;
                if (Pc > P) {
                    P = Pc;
                    rem = r;
                } else if (Pc == P) {
                    rem = std::max(rem, r);
                }
            }
        }
        if (P > kMaxOrder && coarse && c.fe > c.fb) {
            for (i64 f = c.fb; f < c.fe; ++f) rec(rec, q.fine[f], false);
            return;
        }
        if (P > kMaxOrder || cnt * 2 <= (P + 1) * kCh) {
            direct(q, C, s, cl, p0, p1, bias, c.start, c.end, self, acc, st);
            return;
        }
        // the exact rem of the chosen order (every channel at order P)
        {
            double term = xi;
            for (int p = 0; p < P; ++p) term *= xi * kInv.v[p + 1];
            rem = term;
        }
        ++st.cells_taylor;
        st.terms_taylor += P + 1;
        // rounding: the composite exponent (bias, s coord tC, A, a_j) and kappa d (kappa
        // from coord - rC, each within eps of its size), and the centre's p0 + p1 - 1
        // (the form's logq_j term)
        const double dsys =
            4.0 * kEps * (std::fabs(bias) + s * std::fabs(coord * c.tC) + std::fabs(c.A) + c.mag) +
            2.0 * kEps * s * (coord + c.rC) * c.delta + s * std::fabs(p0 + p1 - 1.0) * c.lqmax;
        double hs = 0.0;  // the self's series sum_{p <= P} (kappa d)^p / p!
        if (has_self) {
            const double y = kappa * dself;
            hs = kInv.f[P];
            for (int p = P - 1; p >= 0; --p) hs = hs * y + kInv.f[p];
        }
        const double cntd = static_cast<double>(cnt);
        for (int ch = 0; ch < kCh; ++ch) {
            if (W[ch] == 0.0) continue;
            double sum = series(M + ch * stride_series, P, kappa);
            if (has_self) sum -= wself[ch] * hs;
            acc.v[ch] += F * sum;
            const double ub = Fup * W[ch];
            acc.err[ch] += ub * (rem + kEps * (cntd + 2.0 * P + 8.0)) + dsys * ub;
            acc.lb[ch] += lbc[ch];
        }
    };

    auto cell = [&](i64 k) { visit(visit, q.cells[k], true); };
    cell(k0);
    // outward in both directions; the rest of a direction is left out once its envelope
    // (the concave log-kernel at the nearest query left, the largest query weight
    // beyond, times their count) is below kSkip of the smallest running lower bound
    auto rest = [&](const double* g, double base, double count) {
        double env[kCh];
        for (int ch = 0; ch < kCh; ++ch)
            env[ch] = base + g[cl * kCh + ch] + std::log(count) + slack;
        return acc.skip(env);
    };
    for (i64 k = k0 - 1; k >= 0; --k) {
        const QCell& c = q.cells[k];
        const double base = bias + s * ell_max(q, q.cells[0].lo, c.hi, p0, p1, l0i, l1i);
        if (rest(q.gpre.data() + k * C * kCh, base, static_cast<double>(c.end))) break;
        cell(k);
    }
    for (i64 k = k0 + 1; k < nc; ++k) {
        const QCell& c = q.cells[k];
        const double base = bias + s * ell_max(q, c.lo, q.cells[nc - 1].hi, p0, p1, l0i, l1i);
        if (rest(q.gsuf.data() + k * C * kCh, base, static_cast<double>(n - c.start))) break;
        cell(k);
    }
    for (int ch = 0; ch < kCh; ++ch)
        if (!(acc.err[ch] <= kTolCheck * acc.lb[ch]) && !(acc.err[ch] == 0.0)) ok = false;
    if (!ok) {
        ++st.fallbacks;
        Acc ex;
        direct(q, C, s, cl, p0, p1, bias, 0, n, self, ex, st);
        acc = ex;
    }
    for (int ch = 0; ch < kCh; ++ch) out[ch] = acc.v[ch];
}

}  // namespace

bool binary_grad_centres(const BinaryGradProblem& pr, const BinaryGradResult& out,
                         int n_threads, Control* control, BinaryGradStats* stats) {
    const i64 n = pr.n, C = pr.C, B = pr.B;
    check(n >= 1 && B >= 1, "need n >= 1 and B >= 1");
    check(C >= 1, "the number of classes must be >= 1, got " + std::to_string(C));
    check(pr.logq && pr.p && pr.labels && pr.bias && pr.lse && pr.coef, "null input pointer");
    check(out.grad_p && out.grad_bias, "null output pointer");
    check(std::isfinite(pr.scale) && pr.scale > 0,
          "scale must be finite and > 0, got " + std::to_string(pr.scale));
    check(std::isfinite(pr.cell_width) && pr.cell_width > 0 && pr.cell_width <= 4,
          "cell_width must be in (0, 4]");
    binary_series::check_points(pr.p, pr.logq, pr.labels, B * n, n, C,
                                "kdecal.binary_grad_centres");
    for (i64 i = 0; i < B * n; ++i) {
        check(std::isfinite(pr.bias[i]) && std::isfinite(pr.lse[i]), "bias and lse must be finite");
        for (i64 c2 = 0; c2 < C; ++c2)
            check(std::isfinite(pr.coef[i * C + c2]), "coef must be finite");
    }
    const int nt = detail::resolve_threads(n_threads);
    BinaryGradStats total;
    for (i64 b = 0; b < B; ++b) {
        if (detail::cancelled(control)) return false;
        Queries q;
        build(pr, b, q);
        const i64 ntasks = (n + kCentresPerTask - 1) / kCentresPerTask;
        std::vector<BinaryGradStats> tst(static_cast<std::size_t>(nt));
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
#endif
        for (i64 task = 0; task < ntasks; ++task) {
#ifdef _OPENMP
            const int tid = omp_get_thread_num();
#else
            const int tid = 0;
#endif
            if (detail::cancelled(control)) continue;
            BinaryGradStats st;
            const i64 k1 = std::min(n, (task + 1) * kCentresPerTask);
            for (i64 k = task * kCentresPerTask; k < k1; ++k) {
                const i64 i = q.perm[k];  // centre i at sorted position k
                double r[kCh];
                one_centre(q, pr, k, pr.bias[b * n + i], pr.labels[b * n + i], r, st);
                out.grad_bias[b * n + i] = r[0];
                out.grad_p[(b * n + i) * 2] = pr.scale * r[1];
                out.grad_p[(b * n + i) * 2 + 1] = pr.scale * r[2];
            }
            BinaryGradStats& t = tst[static_cast<std::size_t>(tid)];
            t.cells_taylor += st.cells_taylor;
            t.terms_taylor += st.terms_taylor;
            t.pairs_direct += st.pairs_direct;
            t.fallbacks += st.fallbacks;
            detail::add_rows(control, k1 - task * kCentresPerTask);
        }
        for (const BinaryGradStats& t : tst) {
            total.cells_taylor += t.cells_taylor;
            total.terms_taylor += t.terms_taylor;
            total.pairs_direct += t.pairs_direct;
            total.fallbacks += t.fallbacks;
        }
    }
    if (stats) *stats = total;
    return !detail::cancelled(control);
}

}  // namespace kdecal
