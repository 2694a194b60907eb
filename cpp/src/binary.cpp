// Fast leave-one-out sums of binary problems (binary.hpp): exact windows and binned
// Taylor sums in z = arcsin sqrt(x).  The derivation of every bound used here is in
// docs/guide/binary_engine.md; the names below follow it.
#include "kdecal/binary.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "binary_kernels.hpp"
#include "binary_series.hpp"
#include "loo_prepared.hpp"  // detail::isa_level, resolve_threads, cancelled, add_rows

#if defined(KDECAL_HAVE_AVX512)
KDECAL_DECLARE_BINARY_ISA(avx512)
#endif
#if defined(KDECAL_HAVE_AVX2)
KDECAL_DECLARE_BINARY_ISA(avx2)
#endif
KDECAL_DECLARE_BINARY_ISA(baseline)

namespace kdecal {
namespace {

using i64 = std::int64_t;
constexpr double kEps = std::numeric_limits<double>::epsilon();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
using binary_series::kNP;  // moments per array
// moment arrays of a cell: e^phi, e^phi p0, e^phi p1, e^2phi, e^2phi u, e^3phi
enum { kM1 = 0, kA0 = 1, kA1 = 2, kM2 = 3, kU2 = 4, kM3 = 5, kNMom = 6 };
constexpr i64 kRowsPerTask = 64;

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("kdecal.binary_reduce: " + what);
}

// A check's reference with the centre weights' floor (Sorted::floor): unchanged where
// there is none, so that calls without it decide exactly as before.
inline double floored(double ref, double f) { return f > 0.0 ? std::max(ref, f) : ref; }

// digamma for x >= 1 (recurrence to x >= 8, then the asymptotic series; about 1e-15
// relative, more than the search needs: its result is only a starting point).
double digamma(double x) {
    double acc = 0.0;
    while (x < 8.0) {
        acc -= 1.0 / x;
        x += 1.0;
    }
    const double r = 1.0 / x, r2 = r * r;
    const double series =
        r2 * (1.0 / 12 - r2 * (1.0 / 120 - r2 * (1.0 / 252 - r2 * (1.0 / 240 - r2 / 132))));
    return acc + std::log(x) - 0.5 * r - series;
}

// The log-kernel exactly as loo_reduce computes it on this CPU's SIMD path (the GEMM
// accumulates logq[j, 0] p[i, 0] then adds logq[j, 1] p[i, 1], contracted to FMA where the
// ISA has it; then bias + scale * G, also contracted), so that m and every window term
// carry the same bits.
using RangeFn = double (*)(const double*, const double*, const double*, const double*,
                           const double*, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, double, double, double, double, double, double*);

RangeFn pick_range(int isa) {
#if defined(KDECAL_HAVE_AVX512)
    if (isa >= 2) return avx512::binary_range;
#endif
#if defined(KDECAL_HAVE_AVX2)
    if (isa >= 1) return avx2::binary_range;
#endif
    (void)isa;
    return baseline::binary_range;
}

struct ExactL {
    bool fma;
    RangeFn range;  // exact terms of a range (binary_isa.cpp)
    double operator()(double b, double s, double q0, double q1, double c0, double c1) const {
        if (fma) {
            const double g = std::fma(q1, c1, q0 * c0);
            return std::fma(s, g, b);
        }
        const double g = q0 * c0 + q1 * c1;
        return b + s * g;
    }
};

struct Cell {
    i64 start, end;   // sorted positions [start, end) (one class)
    i64 ref;          // sorted position of the reference centre
    double Lrr;       // L of the reference centre at itself
    double phi_max;   // Phi: max over the cell of L(centre i; query ref)
    double dmax;      // max |p1_i - p1_ref|
    double esum;      // max |p0_i + p1_i - 1| over the cell and the reference
    double absu;      // sum e^{2 phi} |u|
    bool exact_only;  // a single centre: always summed directly
    i64 fb, fe;       // coarse cells: their fine cells [fb, fe)
    i64 off;          // offset of its moments in mom / fmom (-1: none, exact_only)
    double inv0[6];   // 1 / M_0 of each moment array (0 where M_0 = 0)
};

// Fine cells per coarse cell: a coarse cell whose series would need more than kMaxOrder
// terms is taken as its kSub fine cells (kSub times smaller Taylor arguments).
constexpr i64 kSub = 4;

// One problem of the batch, sorted: class segments, each by x ascending.
struct Sorted {
    std::vector<i64> seg, perm, inv;  // perm[s] = original index, inv[orig] = s
    std::vector<double> p0, p1, lq0, lq1, u, ua;  // ua = |u|
    std::vector<double> z;                        // arcsin sqrt(p1), from the nearer end
    std::vector<i64> run_lo, run_hi;  // the run of identical points (and label) of s
    double umax = 0.0;
    // centre weights (multiplicities of a bootstrap sample) in sorted order, empty for
    // unit weights; every term of S, Q, T and A is multiplied by v_i (Q by v_i^2, T by
    // v_i^3), U's by nothing (its u carries them); the class maxima m ignore them
    std::vector<double> v;
    double vmax = 1.0;
    // with centre weights: the accuracy of each weighted sum of power q is relative to at
    // least floor^q (units of the class maximum's unweighted term), not only to the sum
    // itself (BinaryProblem::ref_floor; the label sums of a consistency replicate need
    // theirs next to the row's whole kernel sum only)
    double floor = 0.0;
    const double* vp() const { return v.empty() ? nullptr : v.data(); }
    double wt(i64 s) const { return v.empty() ? 1.0 : v[static_cast<std::size_t>(s)]; }
};

struct LocalCache;  // a context's groups and their local expansions (below)

struct Context {  // one (problem, bandwidth)
    const Sorted* so;
    double s;                          // 1 / h
    std::vector<double> bias, g;       // per sorted position
    std::vector<Cell> cells, fine;     // binned only: coarse and fine cells
    std::vector<i64> cell_of;          // sorted position -> coarse cell
    std::vector<double> mom, fmom;     // (cells, kNMom, kNP), (fine, kNMom, kNP)
    double T;                          // window depth in nats
    bool need[kNMom];                  // binned: the moment arrays this call uses
    i64 n;
    std::shared_ptr<LocalCache> lcache;  // a plan's contexts: the groups' expansions
};

struct RowSums {  // one (query, class), in units of the class maximum's term
    double mc = kNegInf;
    double vb = 1.0;          // the maximum's centre weight (its terms are vb, vb^2, vb^3)
    double e[3] = {0, 0, 0};  // sums of w, w^2, w^3 without the maximum's term
    double a[2] = {0, 0};     // sums of w p0, w p1 (with it)
    double uu = 0.0;          // sum of w^2 u (with it)
};

struct Flags {
    int powers;
    bool pairs, want_a, want_u;
};

// Sorted position of the class-c centre maximising L for the query (excluding the
// query's own position self), or -1 if the class has no other centre.
i64 class_argmax(const Context& cx, const ExactL& Lx, i64 lo, i64 hi, i64 self, double q0,
                 double q1, double& mc) {
    const Sorted& so = *cx.so;
    if (hi - lo <= 0 || (hi - lo == 1 && self == lo)) return -1;
    // derivative of L in the centre's x is s (g_i + q1 - q0); g decreases along the class
    const double thr = q0 - q1;
    const double* g = cx.g.data();
    i64 a = lo, b = hi;  // first position with g <= thr
    while (a < b) {
        const i64 mid = a + (b - a) / 2;
        if (g[mid] > thr) a = mid + 1;
        else b = mid;
    }
    auto L = [&](i64 s) { return Lx(cx.bias[s], cx.s, q0, q1, so.p0[s], so.p1[s]); };
    i64 best = -1;
    double bv = kNegInf;
    auto scan = [&](i64 from, i64 to) {
        for (i64 s = from; s < to; ++s) {
            if (s == self) continue;
            const double v = L(s);
            if (best < 0 || v > bv) {  // first of equal values: lowest position
                bv = v;
                best = s;
            }
        }
    };
    i64 wl = std::max(lo, a - 8), wr = std::min(hi, a + 8);
    scan(wl, wr);
    // hill-climb past the window while the best sits next to one of its edges (rounding
    // noise of g near the root, or long runs of near-ties); unimodality ends it
    auto rank = [&](i64 from, i64 to) { return (to - from) - (from <= self && self < to); };
    for (;;) {
        bool ext = false;
        if (best >= 0 && wl > lo && rank(wl, best) < 2) {
            const i64 nl = std::max(lo, wl - 16);
            scan(nl, wl);
            wl = nl;
            ext = true;
        }
        if (best >= 0 && wr < hi && rank(best + 1, wr) < 2) {
            const i64 nr = std::min(hi, wr + 16);
            scan(wr, nr);
            wr = nr;
            ext = true;
        }
        if (!ext) break;
    }
    if (best < 0) {  // the window held only the query itself
        scan(lo, hi);
    }
    // Rounding makes the sequence unimodal only up to a few ulps: centres beyond the
    // window whose L is within rounding noise of the best may still exceed it by an ulp.
    // Their exact L lies within 2 delta of the maximum, a contiguous run (concavity):
    // walk outward over runs of identical points until L drops below best - delta.
    if (best >= 0) {
        const double delta =
            8.0 * kEps *
            (std::fabs(bv) + std::fabs(cx.bias[best]) +
             cx.s * (std::fabs(q0) * so.p0[best] + std::fabs(q1) * so.p1[best]));
        for (i64 t = wl - 1; t >= lo;) {  // t: the last position of a run
            const i64 r0 = so.run_lo[t];
            if (!(t == r0 && t == self)) {
                const double v = L(t);
                if (v < bv - delta) break;
                if (v > bv) {
                    bv = v;
                    best = t == self ? t - 1 : t;
                }
            }
            t = r0 - 1;
        }
        for (i64 t = wr; t < hi;) {  // t: the first position of a run
            const i64 r1 = so.run_hi[t];
            if (!(t + 1 == r1 && t == self)) {
                const double v = L(t);
                if (v < bv - delta) break;
                if (v > bv) {
                    bv = v;
                    best = t == self ? t + 1 : t;
                }
            }
            t = r1;
        }
    }
    // scanning keeps the lowest position among ties; ties to the left of the window
    // (equal x) give the same value, so mc is right either way
    mc = bv;
    return best;
}

// Exact sums of class c over sorted positions outward from the maximum best, terms
// within cx.T nats (the window method); also used as the fallback of the binned method.
void window_sums(const Context& cx, double T, const ExactL& Lx, const Flags& fl, i64 lo,
                 i64 hi, i64 self, i64 best, double q0, double q1, RowSums& r,
                 i64& n_direct) {
    const Sorted& so = *cx.so;
    const double mc = r.mc;
    constexpr i64 kChunk = 64;
    double acc[6];
    // chunks of kChunk centres outward from the maximum; the walk stops after a chunk
    // whose every term is below e^-T (concavity: so is everything beyond it)
    auto pass = [&]() {
        for (double& v : acc) v = 0.0;
        i64 cnt = 0;
        for (i64 e = best; e > lo;) {
            const i64 a = std::max(lo, e - kChunk);
            const double mx = Lx.range(cx.bias.data(), so.p0.data(), so.p1.data(), so.u.data(),
                                       so.vp(), a, e, self, best, cx.s, q0, q1, mc, T, acc);
            cnt += e - a;
            e = a;
            if (mx < -T) break;
        }
        for (i64 a = best + 1; a < hi;) {
            const i64 e = std::min(hi, a + kChunk);
            const double mx = Lx.range(cx.bias.data(), so.p0.data(), so.p1.data(), so.u.data(),
                                       so.vp(), a, e, self, best, cx.s, q0, q1, mc, T, acc);
            cnt += e - a;
            a = e;
            if (mx < -T) break;
        }
        n_direct += cnt;
    };
    pass();
    // The pair sums D ~ 2 e1 need e1 to its own relative precision: when the terms left
    // out (each below e^-T, n of them at most) are not negligible next to e1, go deeper,
    // to ln n + 36 nats below e1 (at most kClamp, where the dense engine clamps).
    const double Tn = std::log(static_cast<double>(cx.n)) + 36.0;
    const double e1 = acc[0];
    if (fl.pairs && T < kClamp && !(e1 > 0 && std::log(e1) > Tn - T)) {
        T = e1 > 0 ? std::min(kClamp, Tn - std::log(e1)) : kClamp;
        pass();
    } else if (!so.v.empty() && T < kClamp) {
        // Centre weights: the weighted sum S = vb + e1 can be far below the maximum's
        // term (the centres near it drawn 0 times), and the terms left out (each below
        // vmax e^-T of it) must stay negligible next to S: as deep as that needs.
        const double lv = std::log(so.vmax);
        const double sv = floored(r.vb + e1, so.floor);
        if (!(sv > 0 && std::log(sv) > Tn - T + lv)) {
            T = sv > 0 ? std::min(kClamp, Tn + lv - std::log(sv)) : kClamp;
            pass();
        }
    }
    r.e[0] = acc[0];
    r.e[1] = acc[1];
    r.e[2] = acc[2];
    r.a[0] = r.vb * so.p0[best] + acc[3];
    r.a[1] = r.vb * so.p1[best] + acc[4];
    r.uu = so.u[best] + acc[5];
}

using binary_series::kInv;
using binary_series::order_for;
using binary_series::series;

// Binned sums of class c for one query: cells outward from the maximum's cell; returns
// false if an error bound exceeds kTolCheck of its value (the caller then uses the
// window method).
bool binned_sums(const Context& cx, const ExactL& Lx, const Flags& fl, i64 lo, i64 hi,
                 i64 self, i64 best,
                 double q0, double q1, RowSums& r, BinaryStats& st) {
    const Sorted& so = *cx.so;
    const double mc = r.mc, s = cx.s;
    // accumulators (without the maximum's term) and their absolute error bounds
    double acc[6] = {0, 0, 0, 0, 0, 0};  // e1, e2, e3, a0, a1, u
    double err[6] = {0, 0, 0, 0, 0, 0};
    double uabs = std::fabs(so.u[best]);  // scale of U: sum of w^2 |u|, bounded above
    // running totals with the maximum's term (for the allowance of far cells)
    const double vb = r.vb;
    const double base[6] = {vb, vb * vb, vb * vb * vb, vb * so.p0[best], vb * so.p1[best], uabs};
    const int qof[6] = {1, 2, 3, 1, 1, 2};
    const int mof[6] = {kM1, kM2, kM3, kA0, kA1, kU2};
    bool want[6] = {true, fl.powers >= 2, fl.powers >= 3, fl.want_a, fl.want_a, fl.want_u};
    const i64 k0 = cx.cell_of[best];
    const int qmax = std::max(fl.powers, fl.want_u ? 2 : 1);
    const Cell* cells = cx.cells.data();

    // 0: every term of the cell is below e^-T (nothing added); 1: added; 2: a coarse
    // cell whose series would be too long: take its fine cells instead
    double drop[3] = {0, 0, 0};  // bounds of the mass of the cells left unvisited
    auto do_cell = [&](const Cell& c, const double* cmom, bool coarse, bool first,
                       double stop, double remaining) -> int {
        const i64 rs = c.ref;
        const double Lrj = Lx(cx.bias[rs], s, q0, q1, so.p0[rs], so.p1[rs]);
        const double E = (Lrj - c.Lrr) + c.phi_max - mc;
        const double d0q = q0 - so.lq0[rs], d1q = q1 - so.lq1[rs];
        const double kappa = s * (d1q - d0q);
        const double xi1 = std::fabs(kappa) * c.dmax;
        const double F1 = std::exp(E), ex1 = std::exp(xi1);
        const double w = F1 * ex1;  // bounds every term of the cell
        if (!first && (E + xi1 < -cx.T || remaining * w < stop)) {  // this cell and beyond
            const double wv = w * so.vmax;  // the heaviest centre's term
            drop[0] += remaining * wv;
            drop[1] += remaining * wv * wv;
            drop[2] += remaining * wv * wv * wv;
            return 0;
        }
        // systematic error of a term's log (docs/guide/binary_engine.md, "rounding"):
        // each computed L (one FMA from the shared bias) is within eps |L| plus
        // 2 eps s (|logq0| p0 + |logq1| p1) of its exact value; the composite
        // E + phi_i + kappa d_i uses L_rj, L_rr, L(i; ref), Phi and mc and four sums, and
        // kappa d carries 2 eps s (|dlogq0| + |dlogq1|) dmax; the neglected term
        // s (q0 - q0_ref)(d0 + d1) is below s |q0 - q0_ref| esum.  The dense engine's own
        // L_ij errs by eps |mc| and the same dot-product term.  The factor 4 covers
        // these with a margin of about 2.
        const double pr0 = so.p0[rs], pr1 = so.p1[rs];
        const double mag =
            std::fabs(Lrj) + std::fabs(c.Lrr) + 2.0 * std::fabs(c.phi_max) +
            2.0 * std::fabs(mc) +
            s * (std::fabs(q0) * pr0 + std::fabs(q1) * pr1 + std::fabs(so.lq0[rs]) * pr0 +
                 std::fabs(so.lq1[rs]) * pr1) +
            s * (std::fabs(d0q) + std::fabs(d1q)) * c.dmax;
        const double dsys = 4.0 * kEps * mag + s * std::fabs(d0q) * c.esum;
        const bool has_self = self >= c.start && self < c.end;
        const bool has_best = best >= c.start && best < c.end;
        const i64 count = c.end - c.start - has_self - has_best;
        if (count <= 0) return 1;
        // orders per power
        int P[4] = {0, 0, 0, 0};
        double rem[4] = {0, 0, 0, 0};
        bool direct = c.exact_only;
        const double Fq[4] = {0.0, F1, F1 * F1, F1 * F1 * F1};
        const double exq[4] = {1.0, ex1, ex1 * ex1, ex1 * ex1 * ex1};
        double cost_t = 0;
        for (int q = 1; q <= qmax && !direct; ++q) {
            const double xi = q * xi1, ex = exq[q];
            // ub = Fq M0 e^xi bounds the cell's sum: tgt = tau (e^-2xi + R / (100 ub)),
            // the smallest over this power's accumulators
            double rmin = std::numeric_limits<double>::infinity();
            bool any = false;
            for (int a = 0; a < 6; ++a) {
                if (!want[a] || qof[a] != q || c.inv0[mof[a]] == 0.0) continue;
                rmin = std::min(rmin, (base[a] + acc[a]) * c.inv0[mof[a]]);
                any = true;
            }
            if (!any) continue;
            const double inv_ex = 1.0 / ex;
            const double tgt =
                kTolCell * (inv_ex * inv_ex + rmin * inv_ex / (10.0 * Fq[q]));
            P[q] = order_for(xi, tgt, rem[q]);
            if (P[q] > kMaxOrder) direct = true;
            cost_t += (P[q] + 1) * 3.0;
        }
        const bool too_long = direct && !c.exact_only;
        if (!direct && static_cast<double>(count) * 4.0 <= cost_t) direct = true;
        if (direct && coarse && count > 64 && c.fe - c.fb > 1) return 2;
        if (direct) {
            if (too_long) st.pairs_long += count;
            Lx.range(cx.bias.data(), so.p0.data(), so.p1.data(), so.u.data(), so.vp(), c.start,
                     c.end, self, best, s, q0, q1, mc, cx.T, acc);
            if (fl.want_u) {  // the same sum over |u|: the scale of U
                double tmp[6] = {0, 0, 0, 0, 0, 0};
                Lx.range(cx.bias.data(), so.p0.data(), so.p1.data(), so.ua.data(), nullptr,
                         c.start, c.end, self, best, s, q0, q1, mc, cx.T, tmp);
                uabs += tmp[5];
            }
            st.pairs_direct += count;
            return 1;
        }
        ++st.cells_taylor;
        // phi and d of the excluded centres, exactly as the moments were built
        double ephi[2] = {0, 0}, dex[2] = {0, 0};
        i64 exi[2] = {-1, -1};
        int nex = 0;
        for (i64 t : {self, best}) {
            if (t < c.start || t >= c.end) continue;
            const double Li = Lx(cx.bias[t], s, so.lq0[rs], so.lq1[rs], so.p0[t], so.p1[t]);
            ephi[nex] = Li - c.phi_max;
            dex[nex] = so.p1[t] - so.p1[rs];
            exi[nex] = t;
            ++nex;
        }
        // the moments are stored divided by p!: each series is a Horner chain in q kappa
        const double cnt = static_cast<double>(c.end - c.start);
        for (int a = 0; a < 6; ++a) {
            if (!want[a]) continue;
            const int q = qof[a];
            const int Pq = P[q];
            const double kq = q * kappa;
            const double* mm = cmom + mof[a] * kNP;
            double sum = series(mm, Pq, kq);
            for (int e = 0; e < nex; ++e) {  // the excluded centres' own series
                const i64 t = exi[e];
                double wgt = std::exp(q * ephi[e]);
                if (mof[a] == kA0) wgt *= so.p0[t];
                else if (mof[a] == kA1) wgt *= so.p1[t];
                else if (mof[a] == kU2) wgt *= so.u[t];
                if (mof[a] != kU2 && !so.v.empty()) {  // the moments' weight v^q
                    const double vt = so.v[static_cast<std::size_t>(t)];
                    wgt *= q == 1 ? vt : (q == 2 ? vt * vt : vt * vt * vt);
                }
                const double y = kq * dex[e];
                double hs = kInv.f[Pq];
                for (int p = Pq - 1; p >= 0; --p) hs = hs * y + kInv.f[p];
                sum -= wgt * hs;
            }
            const double m0 = a == 5 ? c.absu : mm[0];
            const double bound = Fq[q] * m0 * exq[q];
            // truncation and rounding of the series against the bound of the cell's sum;
            // the systematic error is relative to each term: against the sum itself
            const double trunc = bound * (rem[q] + kEps * (cnt + 2 * Pq + 8));
            const double val = Fq[q] * sum;
            const double mass = a == 5 ? bound : std::fabs(val);
            err[a] += trunc + q * dsys * (mass + trunc);
            acc[a] += val;
            if (a == 5) uabs += bound;
        }
        st.terms_taylor += P[1] + 1;
        return 1;
    };
    // A direction's walk stops at the first cell whose terms are all below e^-T, or
    // below 1e-12 of the smallest running total divided by the centres left (the mass
    // left out, bounded in drop[], is then below 1e-12 of every accumulator).
    auto stop_level = [&]() {  // 1e-12 of the smallest running total
        double rmin = std::numeric_limits<double>::infinity();
        for (int a = 0; a < 6; ++a) {
            if (!want[a]) continue;
            const double v = a == 5 ? uabs : (fl.pairs && a < 2 ? acc[a] : base[a] + acc[a]);
            rmin = std::min(rmin, v);
        }
        return 1e-12 * rmin;
    };
    auto visit = [&](i64 k, double remaining) -> bool {  // false: stop this direction
        const Cell& ck = cells[k];
        const int res = do_cell(ck, ck.off >= 0 ? cx.mom.data() + ck.off : nullptr, true,
                                k == k0, stop_level(), remaining);
        if (res == 0) return false;
        if (res == 2)
            for (i64 f = cells[k].fb; f < cells[k].fe; ++f)
                do_cell(cx.fine[f], cx.fine[f].off >= 0 ? cx.fmom.data() + cx.fine[f].off : nullptr,
                        false, false, 0.0, 0.0);
        return true;
    };

    // the class's cells are contiguous in cx.cells: [first, last]
    visit(k0, 0.0);
    for (i64 k = k0 - 1; k >= 0 && cells[k].start >= lo; --k)
        if (!visit(k, static_cast<double>(cells[k].end - lo))) break;
    for (i64 k = k0 + 1; k < static_cast<i64>(cx.cells.size()) && cells[k].end <= hi; ++k)
        if (!visit(k, static_cast<double>(hi - cells[k].start))) break;
    // truncation: the cells left out (concavity: every term below its cell's bound), and
    // the terms below e^-T that direct sums skip
    const double tr = static_cast<double>(cx.n) * std::exp(-cx.T) * so.vmax;
    err[0] += drop[0] + tr;
    err[1] += drop[1] + tr * tr;
    err[2] += drop[2] + tr * tr * tr;
    err[3] += drop[0] + tr;
    err[4] += drop[0] + tr;
    err[5] += (drop[1] + tr * tr) * so.umax;
    // the check: e1 relative to itself when D is wanted (D >= e1), else to S = 1 + e1
    const double f1 = so.floor, f2 = f1 * f1;
    const double ref1 = fl.pairs ? acc[0] : floored(base[0] + acc[0], f1);
    const double ref2 = fl.pairs ? acc[1] : floored(base[1] + acc[1], f2);
    const double refs[6] = {ref1,
                            ref2,
                            floored(base[2] + acc[2], f2 * f1),
                            floored(base[3] + acc[3], f1),
                            floored(base[4] + acc[4], f1),
                            floored(uabs, f2 * so.umax)};
    for (int a = 0; a < 6; ++a)
        if (want[a] && !(err[a] <= kTolCheck * refs[a])) return false;
    r.e[0] = acc[0];
    r.e[1] = acc[1];
    r.e[2] = acc[2];
    r.a[0] = base[3] + acc[3];
    r.a[1] = base[4] + acc[4];
    r.uu = so.u[best] + acc[5];
    return true;
}

// ------------------------------------------------ query-group local expansions
// (docs/guide/binary_engine.md, "local expansions").  The queries of a group (a run of
// sorted positions spanning at most kGroupWidth kernel widths in z) share one series in
// t_j = s ((q1_j - q1_Q) - (q0_j - q0_Q)) around the group's reference query Q:
//
//   sum_i g_i e^{q (L_ij - m_j)} = e^{q D_j} sum_k (q t_j)^k lam_k,
//   D_j = M + s (q0_j - q0_Q) + t_j xbar - m_j,
//   lam_k = sum_i g_i e^{q (L_iQ - M)} (x_i - xbar)^k / k!,
//
// (M: Q's class maximum, xbar = x_Q), and lam is assembled from the cells' moments
// (each cell's kappa series translated to xbar) or, for small cells, from their exact
// terms.  The bounds are uniform over the group (|t_j| <= tmax); a (query, class) whose
// bound fails the check falls back to binned_sums, then to the window method.

constexpr int kPt = 12;                     // order of the series in t
constexpr double kGroupWidth = 0.3;         // z-span of a group, units of sqrt(h)/2 (docs)
constexpr i64 kGroupMax = 256;              // queries per group
constexpr i64 kGroupMin = 4;                // smaller groups: the binned method per query

struct BinomTable {  // c[a][b] = C(a, b); t[p][l] = C(p + l, p) (p + l <= kMaxOrder)
    double c[kNP][kNP];
    double t[kNP][kNP];
    BinomTable() {
        for (int a = 0; a < kNP; ++a)
            for (int b = 0; b < kNP; ++b)
                c[a][b] = b == 0 ? 1.0 : (a == 0 ? 0.0 : c[a - 1][b - 1] + c[a - 1][b]);
        for (int p = 0; p < kNP; ++p)
            for (int l = 0; l < kNP; ++l) t[p][l] = p + l < kNP ? c[p + l][p] : 0.0;
    }
};
const BinomTable kBinom;

struct LocalExp {  // one (group, class)
    bool ok = false;
    double M = 0, xbar = 0, q0 = 0, q1 = 0;
    double lam[kNMom][kPt + 1];
    double err[kNMom];   // absolute error bound of the series, units of e^{q M}
    double mag[kNMom];   // bound of the series' terms' magnitudes (same units)
    double delta = 0;    // systematic log error of the cells' part
    double esum = 0;     // max |p0 + p1 - 1| of the cells used
    i64 kl = -1, kr = -1;  // the walk's stopping cells (every used cell lies between)
    int key = -1;          // the accumulators it was built for (local_key)
};

// The groups of a context's sorted positions (all n, so that a row's group does not
// depend on the rows asked for), and, in a plan's contexts, each (group, class)'s
// expansion once built: a search evaluates a bandwidth on several row ranges, and an
// expansion depends only on the context, the group, the class and the accumulators.
struct LocalCache {
    std::vector<i64> gstart;  // group g: sorted positions [gstart[g], gstart[g + 1])
    std::vector<i64> slot;    // group g's first slot in exp, -1 for groups never expanded
    std::vector<LocalExp> exp;  // (group, class) of the groups of kGroupMin points or more
    std::unique_ptr<std::atomic<std::uint8_t>[]> state;  // 0 empty, 1 being built, 2 ready
};

int local_key(const Flags& fl) { return fl.powers + 4 * fl.want_a + 8 * fl.want_u; }

void make_groups(const Sorted& so, double s, std::vector<i64>& gstart) {
    const i64 n = static_cast<i64>(so.perm.size());
    const double wz = kGroupWidth * std::sqrt(1.0 / s) * 0.5;
    gstart.clear();
    for (i64 sp = 0; sp < n;) {
        gstart.push_back(sp);
        const i64 g0 = sp;
        ++sp;
        while (sp < n && sp - g0 < kGroupMax && std::fabs(so.z[sp] - so.z[g0]) <= wz) ++sp;
    }
    gstart.push_back(n);
}

// Build the local expansion of class c [lo, hi) for the group with reference Q (sorted
// position), whose queries have |t_j| <= tmax and D_j <= dmax_q.  bestQ, mQ: Q's class
// maximum.
void build_local(const Context& cx, const ExactL& Lx, const Flags& fl, i64 lo, i64 hi, i64 Q,
                 i64 bestQ, double mQ, double tmax, double dmax_q, LocalExp& le) {
    const Sorted& so = *cx.so;
    const double s = cx.s;
    le.ok = false;
    le.M = mQ;
    le.xbar = so.p1[Q];
    le.q0 = so.lq0[Q];
    le.q1 = so.lq1[Q];
    le.delta = 0.0;
    le.esum = 4 * kEps;
    const double M = le.M, xbar = le.xbar, q0 = le.q0, q1 = le.q1;
    for (int a = 0; a < kNMom; ++a) {
        le.err[a] = le.mag[a] = 0.0;
        for (int k = 0; k <= kPt; ++k) le.lam[a][k] = 0.0;
    }
    const bool need[kNMom] = {true, fl.want_a, fl.want_a, fl.powers >= 2, fl.want_u,
                              fl.powers >= 3};
    const int qarr[kNMom] = {1, 1, 1, 2, 2, 3};
    const double vm = so.vmax;
    const double gmax[kNMom] = {vm, vm, vm, vm * vm, so.umax, vm * vm * vm};
    const int qmax = std::max(fl.powers, fl.want_u ? 2 : 1);
    const double rem_t_unit = kInv.f[kPt] / (kPt + 1);  // 1 / (kPt + 1)!
    const Cell* cells = cx.cells.data();
    double drop[4] = {0, 0, 0, 0};
    bool bad = false;

    // exact terms of sorted positions [a, b) (small cells, cells whose series is too long)
    auto direct = [&](i64 a, i64 b) {
        for (i64 i = a; i < b; ++i) {
            const double Li = Lx(cx.bias[i], s, q0, q1, so.p0[i], so.p1[i]);
            const double lw = Li - M;
            const double y = so.p1[i] - xbar;
            le.delta = std::max(le.delta, 4.0 * kEps * (std::fabs(Li) + 2.0 * std::fabs(M) +
                                                        s * (std::fabs(q0) * so.p0[i] +
                                                             std::fabs(q1) * so.p1[i])));
            le.esum = std::max(le.esum, 2.0 * std::fabs((so.p0[i] + so.p1[i]) - 1.0) + 4 * kEps);
            if (lw > 600.0) {
                bad = true;
                return;
            }
            if (lw < -700.0) continue;  // below e^-700 of the maximum: counted in drop
            const double w1 = std::exp(lw);
            const double wq[4] = {0.0, w1, w1 * w1, w1 * w1 * w1};
            const double vi = so.wt(i);
            const double gv[kNMom] = {vi, vi * so.p0[i], vi * so.p1[i], vi * vi, so.u[i],
                                      vi * vi * vi};
            // per power: e^eta and the remainder factor eta^(kPt+1) / (kPt+1)!
            double eeq[4] = {0, 0, 0, 0}, trq[4] = {0, 0, 0, 0};
            for (int q = 1; q <= qmax; ++q) {
                const double eta = q * tmax * std::fabs(y);
                eeq[q] = std::exp(eta);
                double tr = rem_t_unit;
                for (int k = 0; k <= kPt; ++k) tr *= eta;
                trq[q] = tr;
            }
            double yk[kPt + 1];  // y^k / k!
            yk[0] = 1.0;
            for (int k = 1; k <= kPt; ++k) yk[k] = yk[k - 1] * y * kInv.v[k - 1];
            for (int a = 0; a < kNMom; ++a) {
                if (!need[a]) continue;
                const int q = qarr[a];
                const double w = wq[q] * gv[a];
                for (int k = 0; k <= kPt; ++k) le.lam[a][k] += w * yk[k];
                const double wa = a == kU2 ? wq[q] * std::fabs(so.u[i]) : w;
                le.err[a] += wa * eeq[q] * (trq[q] + kEps * (kPt + 8));
                le.mag[a] += wa * eeq[q];
            }
        }
    };

    // 0: stop this direction; 1: used; 2: take the fine cells
    auto use_cell = [&](const Cell& c, const double* cmom, bool coarse, bool first,
                        double remaining) -> int {
        const i64 rs = c.ref;
        const double Lrq = Lx(cx.bias[rs], s, q0, q1, so.p0[rs], so.p1[rs]);
        const double E = (Lrq - c.Lrr) + c.phi_max - M;
        const double dq0 = q0 - so.lq0[rs], dq1 = q1 - so.lq1[rs];
        const double kappa = s * (dq1 - dq0);
        const double xi1 = std::fabs(kappa) * c.dmax;
        const double dC = so.p1[rs] - xbar;
        const double rho = std::fabs(dC) + c.dmax;
        const double eta1 = tmax * rho;
        const double top = E + xi1 + eta1;  // every term of the cell, every query: <= e^{top + D_j}
        if (!first && (top + dmax_q < -cx.T ||
                       top + dmax_q + std::log(std::max(remaining, 1.0)) < -36.0)) {
            for (int q = 1; q <= 3; ++q) drop[q] += remaining * std::exp(q * top);
            return 0;
        }
        if (E > 600.0) {
            bad = true;
            return 1;
        }
        const i64 count = c.end - c.start;
        if (c.off < 0 || cmom == nullptr) {
            direct(c.start, c.end);
            return 1;
        }
        // kappa orders per power (the target as binned_sums': relative to the cell and,
        // for far cells, to the smallest total a query of the group can have)
        int P[4] = {0, 0, 0, 0};
        double rem[4] = {0, 0, 0, 0};
        bool too_long = false;
        double cost_t = 0.0;
        for (int q = 1; q <= qmax; ++q) {
            const double xi = q * xi1;
            double m0 = 0.0;  // the largest cell mass of this power's arrays
            for (int a = 0; a < kNMom; ++a)
                if (need[a] && qarr[a] == q)
                    m0 = std::max(m0, a == kU2 ? c.absu : cmom[a * kNP]);
            const double ub = std::exp(q * E + xi + q * eta1) * std::max(m0, 1e-300);
            const double rmin = std::exp(-q * dmax_q);
            const double tgt = kTolCell * (std::exp(-2.0 * xi) + rmin / (10.0 * ub));
            P[q] = order_for(xi, tgt, rem[q]);
            if (P[q] > kMaxOrder) too_long = true;
            cost_t += (kPt + 1.0) * (std::min(P[q], kMaxOrder - kPt / 2) + 1.0) +
                      0.5 * (kPt + 1.0) * (kPt + 2.0);
        }
        const double cost_d = static_cast<double>(count) * (kPt + 12.0) * qmax;
        if (too_long && coarse && count > 64 && c.fe - c.fb > 1) return 2;
        if (too_long || cost_d <= cost_t) {
            direct(c.start, c.end);
            return 1;
        }
        le.esum = std::max(le.esum, c.esum);
        const double pr0 = so.p0[rs], pr1 = so.p1[rs];
        const double mag =
            std::fabs(Lrq) + std::fabs(c.Lrr) + 2.0 * std::fabs(c.phi_max) + 2.0 * std::fabs(M) +
            s * (std::fabs(q0) * pr0 + std::fabs(q1) * pr1 + std::fabs(so.lq0[rs]) * pr0 +
                 std::fabs(so.lq1[rs]) * pr1) +
            s * (std::fabs(dq0) + std::fabs(dq1)) * c.dmax;
        le.delta = std::max(le.delta, 4.0 * kEps * mag + s * std::fabs(dq0) * c.esum);
        // (Delta_C)^j / j!
        double dpow[kPt + 1];
        dpow[0] = 1.0;
        for (int j = 1; j <= kPt; ++j) dpow[j] = dpow[j - 1] * dC * kInv.v[j - 1];
        const double cnt = static_cast<double>(count);
        // per power q, what its arrays share (computed once per power, each array's
        // arithmetic as before: the same bits)
        for (int q = 1; q <= qmax; ++q) {
            int arr[kNMom];
            int na = 0;
            for (int a = 0; a < kNMom; ++a)
                if (need[a] && qarr[a] == q) arr[na++] = a;
            if (na == 0) continue;
            const int Pk = P[q];
            const double kq = q * kappa;
            double kp[kNP];
            kp[0] = 1.0;
            for (int p = 1; p <= Pk; ++p) kp[p] = kp[p - 1] * kq;
            // N_l / l! = sum_p (q kappa)^p C(p + l, p) m_{p + l}, p <= P_l = min(P, 24 - l)
            // (the moments stop at order 24); the truncation of each N_l enters the sum
            // weighted by (q tmax dmax)^l / l! (docs)
            const double xi = q * xi1, etad = q * tmax * c.dmax;
            double N[kNMom][kPt + 1];
            for (int ia = 0; ia < na; ++ia)
                for (int l = 0; l <= kPt; ++l) N[ia][l] = 0.0;
            for (int p = 0; p <= Pk; ++p) {  // p <= P_l  <=>  l <= 24 - p
                const int lmax = std::min(kPt, kMaxOrder - p);
                const double kpp = kp[p];
                const double* bc = kBinom.t[p];
                double kb[kPt + 1];
                for (int l = 0; l <= lmax; ++l) kb[l] = kpp * bc[l];
                for (int ia = 0; ia < na; ++ia) {
                    double* Na = N[ia];
                    const double* mm = cmom + arr[ia] * kNP + p;
                    for (int l = 0; l <= lmax; ++l) Na[l] += kb[l] * mm[l];
                }
            }
            double rx[kNP + 1];  // xi^j / j!, j <= P + 1 (the remainders' orders)
            rx[0] = 1.0;
            for (int j = 1; j <= Pk + 1; ++j) rx[j] = rx[j - 1] * xi * kInv.v[j - 1];
            double trunc_k = 0.0, etal = 1.0;
            for (int l = 0; l <= kPt; ++l) {
                trunc_k += rx[std::min(Pk, kMaxOrder - l) + 1] * etal;
                etal *= etad * kInv.v[l];
            }
            const double fac = std::exp(q * E);
            const double eta = q * eta1;
            double trunc_t = rem_t_unit;
            for (int k = 0; k <= kPt; ++k) trunc_t *= eta;
            const double exi = std::exp(xi), eeta = std::exp(eta);
            const double edc = std::exp(q * tmax * std::fabs(dC));
            const double slack = trunc_t + kEps * (cnt + 2 * Pk + 2 * kPt + 16);
            for (int ia = 0; ia < na; ++ia) {
                const int a = arr[ia];
                const double* Na = N[ia];
                for (int k = 0; k <= kPt; ++k) {
                    double acc = 0.0;
                    for (int l = 0; l <= k; ++l) acc += dpow[k - l] * Na[l];
                    le.lam[a][k] += fac * acc;
                }
                const double m0 = a == kU2 ? c.absu : cmom[a * kNP];
                const double b1 = fac * m0 * exi;
                const double b0 = b1 * eeta;
                le.err[a] += b1 * edc * trunc_k + b0 * slack;
                le.mag[a] += b0;
            }
        }
        return 1;
    };

    const i64 k0 = cx.cell_of[bestQ];
    auto visit = [&](i64 k, double remaining) -> bool {
        const Cell& ck = cells[k];
        const int res = use_cell(ck, ck.off >= 0 ? cx.mom.data() + ck.off : nullptr, true,
                                 k == k0, remaining);
        if (res == 0) return false;
        if (res == 2)
            for (i64 f = ck.fb; f < ck.fe; ++f)
                use_cell(cx.fine[f], cx.fine[f].off >= 0 ? cx.fmom.data() + cx.fine[f].off
                                                         : nullptr,
                         false, true, 0.0);
        return true;
    };
    visit(k0, 0.0);
    le.kl = -1;
    le.kr = static_cast<i64>(cx.cells.size());
    for (i64 k = k0 - 1; k >= 0 && cells[k].start >= lo; --k)
        if (!visit(k, static_cast<double>(cells[k].end - lo))) {
            le.kl = k;
            break;
        }
    for (i64 k = k0 + 1; k < static_cast<i64>(cx.cells.size()) && cells[k].end <= hi; ++k)
        if (!visit(k, static_cast<double>(hi - cells[k].start))) {
            le.kr = k;
            break;
        }
    if (bad) return;
    // the cells left out, and the terms below e^-700 of M that direct sums skipped
    const double tiny = static_cast<double>(cx.n) * std::exp(-700.0);
    for (int a = 0; a < kNMom; ++a) {
        const int q = qarr[a];
        le.err[a] += (drop[q] + tiny) * gmax[a];
    }
    le.ok = true;
}

// Evaluate the group's expansion for one (query, class); false if a bound fails the
// check (the caller then uses binned_sums or the window method).
bool local_eval(const Context& cx, const ExactL& Lx, const Flags& fl, const LocalExp& le,
                i64 self, bool self_in, i64 best, RowSums& r) {
    const Sorted& so = *cx.so;
    const double s = cx.s, mc = r.mc;
    const i64 kb = cx.cell_of[best];
    if (!(kb > le.kl && kb < le.kr)) return false;
    if (self_in) {
        const i64 ks = cx.cell_of[self];
        if (!(ks > le.kl && ks < le.kr)) return false;
    }
    const double q0 = so.lq0[self], q1 = so.lq1[self];
    const double sd0 = s * (q0 - le.q0);
    const double t = s * ((q1 - le.q1) - (q0 - le.q0));
    const double D = ((le.M - mc) + sd0) + t * le.xbar;
    if (!(D < 600.0)) return false;
    // systematic log error: the cells' part, D's own rounding, the dense engine's error
    // in L_ij, and the neglected s (q0_j - q0_Q)(p0 + p1 - 1)
    const double delta = le.delta +
                         4.0 * kEps *
                             (std::fabs(le.M) + std::fabs(sd0) + std::fabs(t) + 2.0 * std::fabs(mc) +
                              s * (std::fabs(q0) + std::fabs(q1))) +
                         std::fabs(sd0) * le.esum;
    const double F1 = std::exp(D);
    const double Fq[4] = {0.0, F1, F1 * F1, F1 * F1 * F1};
    // the query's own term (excluded) and the class maximum's (exactly 1, added apart)
    double wself = 0.0;
    if (self_in) wself = std::exp(Lx(cx.bias[self], s, q0, q1, so.p0[self], so.p1[self]) - mc);
    const int qarr[kNMom] = {1, 1, 1, 2, 2, 3};
    const bool want[kNMom] = {true, fl.want_a, fl.want_a, fl.powers >= 2, fl.want_u,
                              fl.powers >= 3};
    double val[kNMom] = {0, 0, 0, 0, 0, 0}, err[kNMom] = {0, 0, 0, 0, 0, 0};
    double magv[kNMom] = {0, 0, 0, 0, 0, 0};
    for (int a = 0; a < kNMom; ++a) {
        if (!want[a]) continue;
        const int q = qarr[a];
        const double y = q * t;
        const double* lam = le.lam[a];
        double acc = lam[kPt];
        for (int k = kPt - 1; k >= 0; --k) acc = acc * y + lam[k];
        val[a] = Fq[q] * acc;
        magv[a] = Fq[q] * le.mag[a];
        err[a] = Fq[q] * (le.err[a] + (q * delta + kEps * (kPt + 4)) * (le.mag[a] + le.err[a]));
    }
    // the excluded terms with their centre weights (the query's own: v_self w_self), the
    // maximum's v_best^q
    const double wsv = wself * so.wt(self);
    const double ws[4] = {0.0, wsv, wsv * wsv, wsv * wsv * wsv};
    const double vb = r.vb;
    const double vq[4] = {0.0, vb, vb * vb, vb * vb * vb};
    // subtract the excluded terms (their exact values; the series' own representation of
    // them differs by at most the truncation counted above)
    const double e1 = val[kM1] - vq[1] - ws[1];
    const double e2 = fl.powers >= 2 ? val[kM2] - vq[2] - ws[2] : 0.0;
    const double e3 = fl.powers >= 3 ? val[kM3] - vq[3] - ws[3] : 0.0;
    // rounding of the subtractions (and of the excluded terms' own values)
    auto xerr = [](double v, double sub) { return 8.0 * kEps * (std::fabs(v) + std::fabs(sub)); };
    err[kM1] += xerr(val[kM1], vq[1] + ws[1]);
    if (fl.powers >= 2) err[kM2] += xerr(val[kM2], vq[2] + ws[2]);
    if (fl.powers >= 3) err[kM3] += xerr(val[kM3], vq[3] + ws[3]);
    const double f1 = so.floor, f2 = f1 * f1;
    const double ref1 = fl.pairs ? e1 : floored(vq[1] + e1, f1);
    if (!(e1 >= 0.0) || !(err[kM1] <= kTolCheck * ref1)) return false;
    if (fl.powers >= 2) {
        const double ref2 = fl.pairs ? e2 : floored(vq[2] + e2, f2);
        if (!(e2 >= 0.0) || !(err[kM2] <= kTolCheck * ref2)) return false;
    }
    if (fl.powers >= 3 &&
        (!(e3 >= 0.0) || !(err[kM3] <= kTolCheck * floored(vq[3] + e3, f2 * f1))))
        return false;
    double a0 = 0, a1 = 0, uu = 0;
    if (fl.want_a) {
        const double s0 = self_in ? ws[1] * so.p0[self] : 0.0;
        const double s1 = self_in ? ws[1] * so.p1[self] : 0.0;
        a0 = val[kA0] - s0;
        a1 = val[kA1] - s1;
        if (!(err[kA0] + xerr(val[kA0], s0) <= kTolCheck * floored(a0, f1)) ||
            !(err[kA1] + xerr(val[kA1], s1) <= kTolCheck * floored(a1, f1)))
            return false;
    }
    if (fl.want_u) {
        const double su = self_in ? (wself * wself) * so.u[self] : 0.0;
        uu = val[kU2] - su;
        const double uref = floored(std::fabs(so.u[best]) + magv[kU2], f2 * so.umax);
        if (!(err[kU2] + xerr(magv[kU2], su) <= kTolCheck * uref)) return false;
    }
    r.e[0] = e1;
    r.e[1] = e2;
    r.e[2] = e3;
    r.a[0] = a0;
    r.a[1] = a1;
    r.uu = uu;
    return true;
}

Sorted sort_problem(const double* p, const double* logq, const std::int64_t* labels,
                    const double* u, i64 n, i64 C) {
    Sorted so;
    so.seg.assign(static_cast<std::size_t>(C + 1), 0);
    for (i64 i = 0; i < n; ++i) ++so.seg[static_cast<std::size_t>(labels[i] + 1)];
    for (i64 c = 0; c < C; ++c) so.seg[c + 1] += so.seg[c];
    // by label, then x = p1 increasing, then p0 decreasing, then the row (the order of
    // a stable sort), on contiguous keys rather than through the rows' points
    struct Key {
        std::int64_t label;
        double p1, p0;
        i64 row;
    };
    std::vector<Key> keys(static_cast<std::size_t>(n));
    for (i64 i = 0; i < n; ++i) keys[i] = Key{labels[i], p[2 * i + 1], p[2 * i], i};
    std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
        if (a.label != b.label) return a.label < b.label;
        if (a.p1 != b.p1) return a.p1 < b.p1;
        if (a.p0 != b.p0) return a.p0 > b.p0;
        return a.row < b.row;
    });
    so.perm.resize(static_cast<std::size_t>(n));
    for (i64 s = 0; s < n; ++s) so.perm[s] = keys[s].row;
    so.inv.resize(static_cast<std::size_t>(n));
    so.p0.resize(n);
    so.p1.resize(n);
    so.lq0.resize(n);
    so.lq1.resize(n);
    so.u.assign(static_cast<std::size_t>(n), 0.0);
    so.ua.assign(static_cast<std::size_t>(n), 0.0);
    so.z.resize(n);
    const double half_pi = std::acos(0.0);
    for (i64 s = 0; s < n; ++s) {
        const i64 i = so.perm[s];
        so.inv[i] = s;
        so.p0[s] = p[2 * i];
        so.p1[s] = p[2 * i + 1];
        so.lq0[s] = logq[2 * i];
        so.lq1[s] = logq[2 * i + 1];
        if (u) so.u[s] = u[i];
        so.umax = std::max(so.umax, std::fabs(so.u[s]));
        so.ua[s] = std::fabs(so.u[s]);
        so.z[s] = so.p1[s] < 0.5 ? std::asin(std::sqrt(so.p1[s]))
                                 : half_pi - std::asin(std::sqrt(so.p0[s]));
    }
    so.run_lo.resize(static_cast<std::size_t>(n));
    so.run_hi.resize(static_cast<std::size_t>(n));
    for (i64 s = 0; s < n; ++s) {
        const bool same = s > 0 && labels[so.perm[s]] == labels[so.perm[s - 1]] &&
                          so.p0[s] == so.p0[s - 1] && so.p1[s] == so.p1[s - 1];
        so.run_lo[s] = same ? so.run_lo[s - 1] : s;
    }
    for (i64 s = n - 1; s >= 0; --s) {
        const bool same = s + 1 < n && so.run_lo[s + 1] == so.run_lo[s];
        so.run_hi[s] = same ? so.run_hi[s + 1] : s + 1;
    }
    return so;
}

// Reference, Phi, dmax, esum and the moments of one cell (docs: "cells").
void cell_moments(const Context& cx, const ExactL& Lx, Cell& c, double* mm) {
    const Sorted& so = *cx.so;
    const double s = cx.s;
    const i64 rs = (c.start + c.end) / 2;
    c.ref = rs;
    const double q0 = so.lq0[rs], q1 = so.lq1[rs];
    c.Lrr = Lx(cx.bias[rs], s, q0, q1, so.p0[rs], so.p1[rs]);
    double phimax = kNegInf, dmax = 0.0, emax = 0.0;
    for (i64 t = c.start; t < c.end; ++t) {
        phimax = std::max(phimax, Lx(cx.bias[t], s, q0, q1, so.p0[t], so.p1[t]));
        dmax = std::max(dmax, std::fabs(so.p1[t] - so.p1[rs]));
        emax = std::max(emax, std::fabs((so.p0[t] + so.p1[t]) - 1.0));
    }
    c.phi_max = phimax;
    c.dmax = dmax;
    c.esum = 2.0 * emax + 4 * kEps;  // |(p0 + p1) - 1| itself is rounded
    double absu = 0.0;
    for (i64 t = c.start; t < c.end; ++t) {
        const double phi = Lx(cx.bias[t], s, q0, q1, so.p0[t], so.p1[t]) - phimax;
        // A centre more than 200 nats below the cell's largest (at the reference query)
        // stays below e^{-200 + 2 xi} of it for every query the cell's series serves
        // (xi <= 3): left out of the moments (no underflow), a relative error below
        // n e^-194 (docs, "cells").
        const double w1 = phi < -200.0 ? 0.0 : std::exp(phi), w2 = w1 * w1, w3 = w2 * w1;
        const double d = so.p1[t] - so.p1[rs];
        double ww[kNMom] = {w1, w1 * so.p0[t], w1 * so.p1[t], w2, w2 * so.u[t], w3};
        if (!so.v.empty()) {  // centre weights: v on S and A, v^2 on Q, v^3 on T
            const double vt = so.v[static_cast<std::size_t>(t)];
            ww[kM1] *= vt;
            ww[kA0] *= vt;
            ww[kA1] *= vt;
            ww[kM2] *= vt * vt;
            ww[kM3] *= vt * vt * vt;
        }
        absu += w2 * std::fabs(so.u[t]);
        double dpow[kNP];
        dpow[0] = 1.0;
        for (int p = 1; p < kNP; ++p) dpow[p] = dpow[p - 1] * d;
        for (int a = 0; a < kNMom; ++a) {
            if (!cx.need[a]) continue;  // arrays no accumulator of this call uses stay 0
            double* row = mm + a * kNP;
            const double wa = ww[a];
            for (int p = 0; p < kNP; ++p) row[p] += wa * dpow[p];
        }
    }
    for (int a = 0; a < kNMom; ++a)
        for (int p = 0; p < kNP; ++p) mm[a * kNP + p] *= kInv.f[p];
    for (int a = 0; a < kNMom; ++a) {
        const double m0 = a == kU2 ? absu : mm[a * kNP];
        c.inv0[a] = m0 > 0 ? 1.0 / m0 : 0.0;
    }
    c.absu = absu;
    c.exact_only = false;
}

void build_cells(Context& cx, const ExactL& Lx, double cell_width, i64 C, int nt,
                 bool fine_moments) {
    const Sorted& so = *cx.so;
    const i64 n = cx.n;
    const double wf = cell_width * std::sqrt(1.0 / cx.s) * 0.5 / kSub;  // fine width in z
    cx.cell_of.assign(static_cast<std::size_t>(n), 0);
    cx.cells.clear();
    cx.fine.clear();
    for (i64 c = 0; c < C; ++c) {
        i64 prev_f = -1, prev_c = -1;
        bool fresh = true;  // a class starts new cells
        for (i64 t = so.seg[c]; t < so.seg[c + 1]; ++t) {
            const double z = so.z[t];
            const i64 fid = static_cast<i64>(std::floor(z / wf));
            const i64 cid = fid / kSub;  // z >= 0
            if (fresh || cid != prev_c) {
                const i64 nf = static_cast<i64>(cx.fine.size());
                cx.cells.push_back(Cell{t, t + 1, t, 0, 0, 0, 0, 0, true, nf, nf, -1, {0, 0, 0, 0, 0, 0}});
                prev_c = cid;
            } else {
                cx.cells.back().end = t + 1;
            }
            if (fresh || fid != prev_f) {
                cx.fine.push_back(Cell{t, t + 1, t, 0, 0, 0, 0, 0, true, 0, 0, -1, {0, 0, 0, 0, 0, 0}});
                prev_f = fid;
            } else {
                cx.fine.back().end = t + 1;
            }
            cx.cells.back().fe = static_cast<i64>(cx.fine.size());
            fresh = false;
            cx.cell_of[t] = static_cast<i64>(cx.cells.size()) - 1;
        }
    }
    // moments only for cells of two or more centres (a single centre is always summed
    // directly): memory O(n) even when every centre has its own cell (tiny h)
    const i64 nc = static_cast<i64>(cx.cells.size()), nf = static_cast<i64>(cx.fine.size());
    i64 mc = 0, mf = 0;
    for (Cell& c : cx.cells)
        if (c.end - c.start > 1) c.off = (mc++) * kNMom * kNP;
    // (the local method rarely needs fine cells: without their moments it sums them
    // directly)
    if (fine_moments)
        for (Cell& c : cx.fine)
            if (c.end - c.start > 1) c.off = (mf++) * kNMom * kNP;
    cx.mom.assign(static_cast<std::size_t>(mc * kNMom * kNP), 0.0);
    cx.fmom.assign(static_cast<std::size_t>(mf * kNMom * kNP), 0.0);
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && n > 4096)
#endif
    {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 16) nowait
#endif
        for (i64 k = 0; k < nc; ++k)
            if (cx.cells[k].off >= 0)
                cell_moments(cx, Lx, cx.cells[k], cx.mom.data() + cx.cells[k].off);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 16)
#endif
        for (i64 k = 0; k < nf; ++k)
            if (cx.fine[k].off >= 0)
                cell_moments(cx, Lx, cx.fine[k], cx.fmom.data() + cx.fine[k].off);
    }
    (void)nt;
}

// One bandwidth's context: the centres' bias and digamma differences in sorted order,
// and (binned, local) the cells with the moment arrays of need (the fine cells' too
// with fine).
std::shared_ptr<const Context> make_context(const Sorted& so, double scale, const double* bsrc,
                                            const bool need[kNMom], bool binned, bool fine,
                                            double cell_width, i64 C, const ExactL& Lx,
                                            int nt, bool keep_local = false) {
    auto cx = std::make_shared<Context>();
    const i64 n = static_cast<i64>(so.perm.size());
    cx->so = &so;
    cx->s = scale;
    cx->n = n;
    cx->bias.resize(static_cast<std::size_t>(n));
    cx->g.resize(static_cast<std::size_t>(n));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && n > 4096)
#endif
    for (i64 s = 0; s < n; ++s) {
        cx->bias[s] = bsrc[so.perm[s]];
        cx->g[s] = digamma(so.p0[s] * scale + 1.0) - digamma(so.p1[s] * scale + 1.0);
    }
    const double Tn = std::log(static_cast<double>(n)) + 36.0;
    cx->T = binned ? Tn : std::max(kDrop, Tn);
    for (int a = 0; a < kNMom; ++a) cx->need[a] = need[a];
    if (binned) build_cells(*cx, Lx, cell_width, C, nt, fine);
    if (binned && keep_local) {
        auto lc = std::make_shared<LocalCache>();
        make_groups(so, scale, lc->gstart);
        const std::size_t ng = lc->gstart.size() - 1;
        lc->slot.assign(ng, -1);
        std::size_t slots = 0;
        for (std::size_t g = 0; g < ng; ++g)
            if (lc->gstart[g + 1] - lc->gstart[g] >= kGroupMin) {
                lc->slot[g] = static_cast<i64>(slots);
                slots += static_cast<std::size_t>(C);
            }
        lc->exp.resize(slots);
        lc->state = std::make_unique<std::atomic<std::uint8_t>[]>(slots);
        for (std::size_t k = 0; k < slots; ++k) lc->state[k].store(0, std::memory_order_relaxed);
        cx->lcache = std::move(lc);
    }
    return cx;
}

// The centre weights v of a sorted problem (by its permutation; null: unit weights).
void set_centre_weights(Sorted& so, const double* v) {
    so.v.clear();
    so.vmax = 1.0;
    if (!v) return;
    const i64 n = static_cast<i64>(so.perm.size());
    so.v.resize(static_cast<std::size_t>(n));
    double vm = 0.0;
    for (i64 s = 0; s < n; ++s) {
        so.v[s] = v[so.perm[s]];
        vm = std::max(vm, so.v[s]);
    }
    so.vmax = vm;
}

// The residual weights u of a sorted problem (by its permutation).
void set_residual_weights(Sorted& so, const double* u) {
    const i64 n = static_cast<i64>(so.perm.size());
    so.umax = 0.0;
    for (i64 s = 0; s < n; ++s) {
        so.u[s] = u[so.perm[s]];
        so.ua[s] = std::fabs(so.u[s]);
        so.umax = std::max(so.umax, so.ua[s]);
    }
}

void accumulate(BinaryStats& to, const BinaryStats& from) {
    to.pairs_direct += from.pairs_direct;
    to.cells_taylor += from.cells_taylor;
    to.terms_taylor += from.terms_taylor;
    to.fallbacks += from.fallbacks;
    to.pairs_long += from.pairs_long;
    to.pairs_fallback += from.pairs_fallback;
    to.rows_local += from.rows_local;
    to.groups_local += from.groups_local;
}

std::size_t context_bytes(const Context& cx) {
    std::size_t b =
        sizeof(double) * (cx.bias.size() + cx.g.size() + cx.mom.size() + cx.fmom.size()) +
        sizeof(i64) * cx.cell_of.size() + sizeof(Cell) * (cx.cells.size() + cx.fine.size());
    if (cx.lcache)
        b += sizeof(i64) * (cx.lcache->gstart.size() + cx.lcache->slot.size()) +
             (sizeof(LocalExp) + 1) * cx.lcache->exp.size();
    return b;
}

}  // namespace

// A plan: the batch's problems sorted once, and the contexts of the bandwidths used,
// least recently used first out beyond kPlanBytes.
struct BinaryPlan::Impl {
    const double* logq;
    const double* p;
    const std::int64_t* labels;
    i64 B, n, C;
    std::vector<Sorted> sorted;
    struct Entry {
        i64 b;
        double scale;
        bool need[kNMom];
        bool cells, fine;
        double cell_width;
        std::shared_ptr<const Context> cx;
        std::size_t bytes;
        std::uint64_t used;
    };
    std::mutex mu;
    std::vector<Entry> entries;
    std::uint64_t clock = 0;
    std::size_t bytes = 0;

    // the same points (the very arrays) and the same labels (those arrays, or equal ones:
    // a search may rebuild its label array between calls)
    bool matches(const BinaryProblem& prob) const {
        if (prob.logq != logq || prob.p != p || prob.B != B || prob.n != n || prob.C != C)
            return false;
        return prob.labels == labels || std::equal(labels, labels + B * n, prob.labels);
    }

    std::shared_ptr<const Context> context(i64 b, double scale, const double* bias,
                                           const bool need[kNMom], bool binned, bool fine,
                                           double cell_width, const ExactL& Lx, int nt) {
        {
            std::lock_guard<std::mutex> lock(mu);
            for (Entry& e : entries) {
                if (e.b != b || e.scale != scale) continue;
                if (binned && (!e.cells || e.cell_width != cell_width)) continue;
                if (e.fine != fine) continue;  // which cells are summed directly
                // the same bias (the kernel's, for these points and this scale): checked
                const std::vector<i64>& perm = sorted[b].perm;
                bool same = true;
                for (std::size_t s = 0; s < perm.size() && same; ++s)
                    same = e.cx->bias[s] == bias[perm[s]];
                if (!same) continue;
                bool covers = true;
                for (int a = 0; a < kNMom; ++a) covers = covers && (!need[a] || e.need[a]);
                if (binned && !covers) continue;
                e.used = ++clock;
                return e.cx;
            }
        }
        auto cx = make_context(sorted[b], scale, bias, need, binned, fine, cell_width, C, Lx,
                               nt, true);
        std::lock_guard<std::mutex> lock(mu);
        Entry e{b, scale, {}, binned, fine, cell_width, cx, context_bytes(*cx), ++clock};
        for (int a = 0; a < kNMom; ++a) e.need[a] = need[a];
        bytes += e.bytes;
        entries.push_back(e);
        while (bytes > kPlanBytes && entries.size() > 1) {
            auto old = std::min_element(entries.begin(), entries.end(),
                                        [](const Entry& x, const Entry& y) { return x.used < y.used; });
            bytes -= old->bytes;
            entries.erase(old);
        }
        return cx;
    }
};

BinaryPlan::BinaryPlan(const double* logq, const double* p, const std::int64_t* labels,
                       std::int64_t B, std::int64_t n, std::int64_t C)
    : impl(std::make_unique<Impl>()) {
    check(n >= 1 && B >= 1 && C >= 1, "a plan needs n, B, C >= 1");
    for (i64 i = 0; i < B * n; ++i)
        if (labels[i] < 0 || labels[i] >= C)
            throw std::invalid_argument("kdecal.BinaryPlan: label " + std::to_string(labels[i]) +
                                        " is outside [0, " + std::to_string(C) + ")");
    impl->logq = logq;
    impl->p = p;
    impl->labels = labels;
    impl->B = B;
    impl->n = n;
    impl->C = C;
    impl->sorted.reserve(static_cast<std::size_t>(B));
    for (i64 b = 0; b < B; ++b)
        impl->sorted.push_back(
            sort_problem(p + b * n * 2, logq + b * n * 2, labels + b * n, nullptr, n, C));
}

BinaryPlan::~BinaryPlan() = default;

bool binary_reduce(const BinaryProblem& prob, const BinaryResult& out, BinaryMethod method,
                   int n_threads, Control* control, BinaryStats* stats, BinaryPlan* plan) {
    const i64 n = prob.n, C = prob.C, H = prob.H, B = prob.B;
    check(n >= 1, "n must be >= 1, got " + std::to_string(n));
    check(B >= 1, "B must be >= 1");
    check(C >= 1, "the number of classes must be >= 1, got " + std::to_string(C));
    check(H >= 1, "at least one bandwidth is needed");
    check(prob.powers >= 1 && prob.powers <= 3, "powers must be 1, 2 or 3");
    check(prob.row_start >= 0 && prob.row_start <= prob.row_stop && prob.row_stop <= n,
          "need 0 <= row_start <= row_stop <= n");
    check(prob.logq && prob.p && prob.labels && prob.scale && prob.bias, "null input pointer");
    check(out.m && out.S, "null output pointer");
    check(prob.powers < 2 || out.Q, "powers >= 2 needs a Q output");
    check(prob.powers < 3 || out.T, "powers == 3 needs a T output");
    check(!out.D || prob.powers >= 2, "the pair sums D need powers >= 2");
    check(!out.U || prob.u, "U needs the residual weights u");
    check(!prob.v || (prob.powers <= 2 && !out.D),
          "centre weights v support powers <= 2 without the pair sums D");
    check(std::isfinite(prob.cell_width) && prob.cell_width > 0 && prob.cell_width <= 4,
          "cell_width must be in (0, 4]");
    check(std::isfinite(prob.ref_floor) && prob.ref_floor >= 0.0,
          "ref_floor must be finite and >= 0");
    check(!prob.weighted_rows || prob.v, "weighted_rows needs the centre weights v");
    for (i64 t = 0; t < H; ++t)
        if (!(std::isfinite(prob.scale[t]) && prob.scale[t] > 0))
            check(false, "scale must be finite and > 0, got " + std::to_string(prob.scale[t]));
    binary_series::check_points(prob.p, prob.logq, prob.labels, B * n, n, C,
                                "kdecal.binary_reduce");
    for (i64 i = 0; i < B * n; ++i) {
        if (prob.u) check(std::isfinite(prob.u[i]), "u must be finite");
        if (prob.v && !(std::isfinite(prob.v[i]) && prob.v[i] >= 0.0))
            check(false, "centre weights v must be finite and >= 0; v[" + std::to_string(i % n) +
                             "] = " + std::to_string(prob.v[i]));
    }
    for (i64 i = 0; i < B * H * n; ++i)
        check(std::isfinite(prob.bias[i]), "bias must be finite");

    const int nt = detail::resolve_threads(n_threads);
    const int isa = detail::isa_level();
    // the dense engine's kernels are compiled with -ffp-contract=fast: fused wherever the
    // target has FMA (x86: the avx2 and avx512 paths; AArch64: always)
#if defined(__ARM_FEATURE_FMA)
    const bool fused = true;
#else
    const bool fused = isa >= 1;
#endif
    const ExactL Lx{fused, pick_range(isa)};
    const i64 R = prob.row_stop - prob.row_start;
    const Flags fl{prob.powers, out.D != nullptr, out.A != nullptr, out.U != nullptr};
    BinaryStats total;
    if (R == 0) return !detail::cancelled(control);

    const bool local = method == BinaryMethod::local;
    const bool binned = method == BinaryMethod::binned || local;
    const double Tn = std::log(static_cast<double>(n)) + 36.0;
    bool need[kNMom];
    need[kM1] = true;
    need[kA0] = need[kA1] = fl.want_a;
    need[kM2] = prob.powers >= 2;
    need[kU2] = fl.want_u;
    need[kM3] = prob.powers >= 3;
    // a plan of the same arrays serves its sorted centres and, for calls without
    // residual weights (u enters the cells' moments), its per-bandwidth cells
    BinaryPlan::Impl* pl = plan && plan->impl && plan->impl->matches(prob) ? plan->impl.get()
                                                                           : nullptr;
    for (i64 b = 0; b < B; ++b) {
        if (detail::cancelled(control)) return false;
        Sorted own;
        const Sorted* sop = nullptr;
        if (pl && !prob.u && !prob.v) {
            sop = &pl->sorted[b];
        } else if (pl) {
            own = pl->sorted[b];
            if (prob.u) set_residual_weights(own, prob.u + b * n);
            sop = &own;
        } else {
            own = sort_problem(prob.p + b * n * 2, prob.logq + b * n * 2, prob.labels + b * n,
                               prob.u ? prob.u + b * n : nullptr, n, C);
            sop = &own;
        }
        if (prob.v) {
            set_centre_weights(own, prob.v + b * n);
            own.floor = prob.ref_floor;
        }
        const Sorted& so = *sop;
        // the queries in the centres' sorted order (by label, then x): neighbouring queries
        // share their searches' and cells' cache lines, and each query's own data is
        // read in order (each row's result does not depend on the order)
        std::vector<i64> qorder;
        qorder.reserve(static_cast<std::size_t>(R));
        std::vector<char> in_range(static_cast<std::size_t>(n), 0);
        // with weighted_rows, a row of weight 0 is no query: its outputs are those of a
        // row without centres (each row's sums depend on that row alone, so the others'
        // bits are unchanged)
        const double* vrow = prob.weighted_rows ? prob.v + b * n : nullptr;
        for (i64 sp = 0; sp < n; ++sp) {
            const i64 j = so.perm[sp];
            if (j < prob.row_start || j >= prob.row_stop) continue;
            if (vrow && !(vrow[j] > 0.0)) {
                for (i64 t = 0; t < H; ++t) {
                    const i64 row = (b * H + t) * R + (j - prob.row_start);
                    out.m[row] = kNegInf;
                    for (i64 c = 0; c < C; ++c) {
                        out.S[row * C + c] = 0.0;
                        if (out.Q) out.Q[row * C + c] = 0.0;
                        if (out.T) out.T[row * C + c] = 0.0;
                        if (out.D) out.D[row * C + c] = 0.0;
                    }
                    if (out.A) out.A[row * 2] = out.A[row * 2 + 1] = 0.0;
                    if (out.U) out.U[row] = 0.0;
                }
                continue;
            }
            qorder.push_back(sp);
            in_range[sp] = 1;
        }
        const i64 RQ = static_cast<i64>(qorder.size());
        for (i64 t = 0; t < H; ++t) {
            if (detail::cancelled(control)) return false;
            const double* bsrc = prob.bias + (b * H + t) * n;
            std::shared_ptr<const Context> held;
            // the fine cells' moments serve the binned method and the local method's
            // fallbacks, frequent only with the pair sums (e1 to its own precision)
            const bool fine = method == BinaryMethod::binned || fl.pairs || fl.want_u;
            if (pl && !prob.u && !prob.v)
                held = pl->context(b, prob.scale[t], bsrc, need, binned, fine, prob.cell_width,
                                   Lx, nt);
            else
                held = make_context(so, prob.scale[t], bsrc, need, binned, fine, prob.cell_width,
                                    C, Lx, nt);
            const Context& cx = *held;
            const double Tw = std::max(kDrop, Tn);  // the window method's depth

            const i64 out_m = (b * H + t) * R;
            // the outputs of one query from its classes' sums
            auto emit = [&](i64 self, const RowSums* rsum) {
                const i64 j = so.perm[self];
                double mx = kNegInf;
                for (i64 c = 0; c < C; ++c) mx = std::max(mx, rsum[c].mc);
                const i64 row = j - prob.row_start;
                out.m[out_m + row] = mx;
                double a0 = 0, a1 = 0, uu = 0;
                for (i64 c = 0; c < C; ++c) {
                    const RowSums& r = rsum[c];
                    const i64 oi = (out_m + row) * C + c;
                    const bool empty = !(r.mc > kNegInf);
                    const double f = empty ? 0.0 : std::exp(r.mc - mx);
                    const double vb = r.vb;
                    out.S[oi] = empty ? 0.0 : (vb + r.e[0]) * f;
                    if (fl.powers >= 2) out.Q[oi] = empty ? 0.0 : (vb * vb + r.e[1]) * (f * f);
                    if (fl.powers >= 3)
                        out.T[oi] = empty ? 0.0 : (vb * vb * vb + r.e[2]) * (f * f * f);
                    if (fl.pairs) {
                        const double e = r.e[0];
                        out.D[oi] = empty ? 0.0 : ((2.0 * e - r.e[1]) + e * e) * (f * f);
                    }
                    if (!empty) {
                        a0 += r.a[0] * f;
                        a1 += r.a[1] * f;
                        uu += r.uu * (f * f);
                    }
                }
                if (fl.want_a) {
                    out.A[(out_m + row) * 2] = a0;
                    out.A[(out_m + row) * 2 + 1] = a1;
                }
                if (fl.want_u) out.U[out_m + row] = uu;
            };
            // one (query, class) by the binned method, else the window method
            auto per_query = [&](i64 self, i64 lo, i64 hi, i64 best, RowSums& r,
                                 BinaryStats& st) {
                const double q0 = so.lq0[self], q1 = so.lq1[self];
                bool ok = false;
                if (binned) ok = binned_sums(cx, Lx, fl, lo, hi, self, best, q0, q1, r, st);
                if (!ok) {
                    if (binned) ++st.fallbacks;
                    window_sums(cx, Tw, Lx, fl, lo, hi, self, best, q0, q1, r,
                                binned ? st.pairs_fallback : st.pairs_direct);
                }
            };
            std::vector<BinaryStats> tst(static_cast<std::size_t>(nt));
            auto add_stats = [&](int tid, const BinaryStats& st) { accumulate(tst[tid], st); };
            if (local) {
                // groups over all n sorted positions (independent of the rows asked for,
                // so that a row's bits do not depend on the row range); the tasks are the
                // groups holding at least one query row
                LocalCache* lc = cx.lcache.get();
                std::vector<i64> own_groups;
                if (!lc) make_groups(so, cx.s, own_groups);
                const std::vector<i64>& gstart = lc ? lc->gstart : own_groups;
                const int key = local_key(fl);
                std::vector<i64> tasks;
                for (std::size_t g = 0; g + 1 < gstart.size(); ++g) {
                    bool any = false;
                    for (i64 sp = gstart[g]; sp < gstart[g + 1] && !any; ++sp)
                        any = in_range[sp] != 0;
                    if (any) tasks.push_back(static_cast<i64>(g));
                }
                const i64 ntasks = static_cast<i64>(tasks.size());
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
                    BinaryStats st;
                    const i64 g0 = gstart[tasks[task]], g1 = gstart[tasks[task] + 1];
                    std::vector<i64> qs;
                    for (i64 sp = g0; sp < g1; ++sp)
                        if (in_range[sp]) qs.push_back(sp);
                    const i64 nq = static_cast<i64>(qs.size());
                    const i64 Q = g0 + (g1 - g0) / 2;
                    // |t_j| over the whole group (row-range independent)
                    double tmax = 0.0;
                    for (i64 sp = g0; sp < g1; ++sp)
                        tmax = std::max(tmax, std::fabs(cx.s * ((so.lq1[sp] - so.lq1[Q]) -
                                                                (so.lq0[sp] - so.lq0[Q]))));
                    std::vector<RowSums> rs(static_cast<std::size_t>(nq * C));
                    std::vector<i64> bests(static_cast<std::size_t>(nq));
                    LocalExp own;
                    for (i64 c = 0; c < C; ++c) {
                        const i64 lo = so.seg[c], hi = so.seg[c + 1];
                        const i64 first = lc ? lc->slot[tasks[task]] : -1;
                        const bool kept = first >= 0;
                        const std::size_t slot = kept ? static_cast<std::size_t>(first + c) : 0;
                        const LocalExp* lep = nullptr;
                        if (kept && lc->state[slot].load(std::memory_order_acquire) == 2 &&
                            lc->exp[slot].key == key) {
                            lep = &lc->exp[slot];
                        } else {
                            LocalExp& le = own;
                            le.ok = false;
                            le.key = key;
                            double mQ = kNegInf;
                            // (a group of a few points, where the kernel is narrow against
                            // the points' spacing, costs more to expand than to sum per query)
                            const i64 bQ = g1 - g0 < kGroupMin
                                               ? -1
                                               : class_argmax(cx, Lx, lo, hi, Q, so.lq0[Q],
                                                              so.lq1[Q], mQ);
                            if (bQ >= 0 && std::isfinite(mQ) && std::isfinite(tmax)) {
                                // D_j <= t_j (xbar - x_bQ): L at bQ bounds m_j from below
                                const double dq = tmax * std::fabs(so.p1[Q] - so.p1[bQ]) + 1.0;
                                build_local(cx, Lx, fl, lo, hi, Q, bQ, mQ, tmax, dq, le);
                                ++st.groups_local;
                            }
                            std::uint8_t empty = 0;
                            if (kept && lc->state[slot].compare_exchange_strong(empty, 1)) {
                                lc->exp[slot] = le;
                                lc->state[slot].store(2, std::memory_order_release);
                            }
                            lep = &le;
                        }
                        const LocalExp& le = *lep;
                        for (i64 k = 0; k < nq; ++k) {
                            const i64 self = qs[k];
                            RowSums& r = rs[k * C + c];
                            r = RowSums{};
                            const i64 best =
                                class_argmax(cx, Lx, lo, hi, self, so.lq0[self], so.lq1[self], r.mc);
                            if (best < 0) {
                                r.mc = kNegInf;
                                continue;
                            }
                            r.vb = so.wt(best);
                            const bool self_in = self >= lo && self < hi;
                            if (le.ok && local_eval(cx, Lx, fl, le, self, self_in, best, r)) {
                                ++st.rows_local;
                                continue;
                            }
                            per_query(self, lo, hi, best, r, st);
                        }
                    }
                    for (i64 k = 0; k < nq; ++k) emit(qs[k], rs.data() + k * C);
                    add_stats(tid, st);
                    detail::add_rows(control, nq);
                }
            } else {
                const i64 ntasks = (RQ + kRowsPerTask - 1) / kRowsPerTask;
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
                    BinaryStats st;  // local: the per-thread slots share cache lines
                    const i64 k0 = task * kRowsPerTask;
                    const i64 k1 = std::min(RQ, k0 + kRowsPerTask);
                    std::vector<RowSums> rs(static_cast<std::size_t>(C));
                    for (i64 kq = k0; kq < k1; ++kq) {
                        const i64 self = qorder[kq];
                        for (i64 c = 0; c < C; ++c) {
                            RowSums& r = rs[c];
                            r = RowSums{};
                            const i64 lo = so.seg[c], hi = so.seg[c + 1];
                            const i64 best = class_argmax(cx, Lx, lo, hi, self, so.lq0[self],
                                                          so.lq1[self], r.mc);
                            if (best < 0) {
                                r.mc = kNegInf;
                                continue;
                            }
                            r.vb = so.wt(best);
                            per_query(self, lo, hi, best, r, st);
                        }
                        emit(self, rs.data());
                    }
                    add_stats(tid, st);
                    detail::add_rows(control, k1 - k0);
                }
            }
            for (const BinaryStats& st : tst) accumulate(total, st);
        }
    }
    if (stats) *stats = total;
    return !detail::cancelled(control);
}

}  // namespace kdecal
