// Binding of kdecal::binary_reduce (the fast engine of binary problems).  Arrays arrive
// already normalised by kdecal._binary (float64, C-contiguous); noconvert() forbids
// hidden copies.
#include "pybind11.hpp"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kdecal/binary.hpp"
#include "watch.hpp"

namespace {

template <class Real>
using carray = py::array_t<Real, py::array::c_style>;

// A kdecal::BinaryPlan and the arrays it points into (kept alive with it).
struct PyBinaryPlan {
    carray<double> logq, p;
    carray<std::int64_t> labels;
    std::unique_ptr<kdecal::BinaryPlan> plan;
};

PyBinaryPlan make_plan(const carray<double>& logq, const carray<double>& p,
                       const carray<std::int64_t>& labels, std::int64_t n_classes) {
    if (p.ndim() != 3 || logq.ndim() != 3 || labels.ndim() != 2 || p.shape(2) != 2)
        throw std::invalid_argument("a BinaryPlan needs logq, p of shape (B, n, 2), labels (B, n)");
    for (py::ssize_t d = 0; d < 3; ++d)
        if (logq.shape(d) != p.shape(d))
            throw std::invalid_argument("logq and p must have the same shape");
    if (labels.shape(0) != p.shape(0) || labels.shape(1) != p.shape(1))
        throw std::invalid_argument("labels must have shape (B, n)");
    if (n_classes < 1) throw std::invalid_argument("n_classes must be >= 1");
    PyBinaryPlan out{logq, p, labels, nullptr};
    py::gil_scoped_release release;
    out.plan = std::make_unique<kdecal::BinaryPlan>(logq.data(), p.data(), labels.data(),
                                                    p.shape(0), p.shape(1), n_classes);
    return out;
}

py::tuple binary_reduce_py(const carray<double>& logq, const carray<double>& p,
                           const carray<std::int64_t>& labels, std::int64_t n_classes,
                           const carray<double>& scale, const carray<double>& bias, int powers,
                           std::int64_t row_start, std::int64_t row_stop, int n_threads,
                           const py::object& progress, bool pairs, const std::string& method,
                           bool residuals, const py::object& u, double cell_width,
                           const py::object& plan, const py::object& v, double ref_floor,
                           bool weighted_rows) {
    const bool batched = p.ndim() == 3;
    if (!(p.ndim() == 2 || batched) || logq.ndim() != p.ndim())
        throw std::invalid_argument("logq and p must both be (n, 2) or both (B, n, 2) arrays");
    const std::int64_t B = batched ? p.shape(0) : 1;
    const std::int64_t n = p.shape(batched ? 1 : 0), K = p.shape(batched ? 2 : 1);
    if (K != 2) throw std::invalid_argument("binary problems need K = 2, got " + std::to_string(K));
    for (py::ssize_t d = 0; d < p.ndim(); ++d)
        if (logq.shape(d) != p.shape(d))
            throw std::invalid_argument("logq and p must have the same shape");
    if (labels.ndim() != (batched ? 2 : 1) || (batched && labels.shape(0) != B) ||
        labels.shape(labels.ndim() - 1) != n)
        throw std::invalid_argument(batched ? "labels must have shape (B, n)"
                                            : "labels must have shape (n,)");
    if (scale.ndim() != 1) throw std::invalid_argument("scale must be 1-D");
    const std::int64_t H = scale.shape(0);
    if (bias.ndim() != (batched ? 3 : 2) || (batched && bias.shape(0) != B) ||
        bias.shape(bias.ndim() - 2) != H || bias.shape(bias.ndim() - 1) != n)
        throw std::invalid_argument(batched ? "bias must have shape (B, H, n)"
                                            : "bias must have shape (H, n)");
    if (row_start < 0 || row_stop < row_start || row_stop > n)
        throw std::invalid_argument("need 0 <= row_start <= row_stop <= n");
    if (powers < 1 || powers > 3) throw std::invalid_argument("powers must be 1, 2 or 3");
    if (pairs && powers < 2)
        throw std::invalid_argument("pairs=True needs powers >= 2, got powers = " +
                                    std::to_string(powers));
    if (n_classes < 1) throw std::invalid_argument("n_classes must be >= 1");
    kdecal::BinaryMethod meth;
    if (method == "window") meth = kdecal::BinaryMethod::window;
    else if (method == "binned") meth = kdecal::BinaryMethod::binned;
    else if (method == "local") meth = kdecal::BinaryMethod::local;
    else
        throw std::invalid_argument("method must be 'window', 'binned' or 'local', got '" +
                                    method + "'");
    // optional per-centre arrays (n,) or (B, n), kept alive in `keep` for the call
    auto per_centre = [&](const py::object& obj, const char* name,
                          carray<double>& keep) -> const double* {
        if (obj.is_none()) return nullptr;
        keep = obj.cast<carray<double>>();
        if (keep.ndim() != (batched ? 2 : 1) || (batched && keep.shape(0) != B) ||
            keep.shape(keep.ndim() - 1) != n)
            throw std::invalid_argument(std::string(name) +
                                        (batched ? " must have shape (B, n)"
                                                 : " must have shape (n,)"));
        return keep.data();
    };
    carray<double> ua, va;
    const double* pu = per_centre(u, "u", ua);
    const double* pv = per_centre(v, "v", va);
    if (pv && (powers > 2 || pairs))
        throw std::invalid_argument("centre weights v support powers <= 2 without the pair sums");
    if (weighted_rows && !pv) throw std::invalid_argument("weighted_rows=True needs v");

    const std::int64_t R = row_stop - row_start;
    auto shape = [&](std::vector<py::ssize_t> dims) {
        if (batched) dims.insert(dims.begin(), static_cast<py::ssize_t>(B));
        return dims;
    };
    const auto Hs = static_cast<py::ssize_t>(H), Rs = static_cast<py::ssize_t>(R),
               Cs = static_cast<py::ssize_t>(n_classes);
    const std::vector<py::ssize_t> none{0, 0, 0};
    py::array_t<double> m(shape({Hs, Rs}));
    py::array_t<double> S(shape({Hs, Rs, Cs}));
    py::array_t<double> Q(powers >= 2 ? shape({Hs, Rs, Cs}) : none);
    py::array_t<double> T(powers >= 3 ? shape({Hs, Rs, Cs}) : none);
    py::array_t<double> D(pairs ? shape({Hs, Rs, Cs}) : none);
    py::array_t<double> A(residuals ? shape({Hs, Rs, 2}) : none);
    py::array_t<double> U(residuals && pu ? shape({Hs, Rs}) : none);

    kdecal::BinaryProblem prob;
    prob.logq = logq.data();
    prob.p = p.data();
    prob.labels = labels.data();
    prob.u = pu;
    prob.v = pv;
    prob.ref_floor = ref_floor;
    prob.weighted_rows = weighted_rows;
    prob.B = B;
    prob.n = n;
    prob.C = n_classes;
    prob.scale = scale.data();
    prob.bias = bias.data();
    prob.H = H;
    prob.powers = powers;
    prob.row_start = row_start;
    prob.row_stop = row_stop;
    prob.cell_width = cell_width;
    kdecal::BinaryResult out;
    out.m = m.mutable_data();
    out.S = S.mutable_data();
    out.Q = powers >= 2 ? Q.mutable_data() : nullptr;
    out.T = powers >= 3 ? T.mutable_data() : nullptr;
    out.D = pairs ? D.mutable_data() : nullptr;
    out.A = residuals ? A.mutable_data() : nullptr;
    out.U = residuals && pu ? U.mutable_data() : nullptr;
    kdecal::BinaryStats stats;
    kdecal::BinaryPlan* pl = nullptr;
    py::object plan_ref;  // held for the call
    if (!plan.is_none()) {
        plan_ref = plan;
        pl = plan.cast<PyBinaryPlan&>().plan.get();
    }
    auto work = [&](kdecal::Control* control) {
        kdecal::binary_reduce(prob, out, meth, n_threads, control, &stats, pl);
    };
    // work, in dense kernel evaluations (about 1 ns each): a (query, class) costs about
    // 1 us on either method at n = 1e5 (docs/guide/binary_engine.md)
    kdecal_bind::run_watched(work, progress,
                             1000.0 * static_cast<double>(B) * static_cast<double>(R) *
                                 static_cast<double>(H) * static_cast<double>(n_classes));
    py::dict st;
    st["pairs_direct"] = stats.pairs_direct;
    st["cells_taylor"] = stats.cells_taylor;
    st["terms_taylor"] = stats.terms_taylor;
    st["fallbacks"] = stats.fallbacks;
    st["pairs_long"] = stats.pairs_long;
    st["pairs_fallback"] = stats.pairs_fallback;
    st["rows_local"] = stats.rows_local;
    st["groups_local"] = stats.groups_local;
    return py::make_tuple(m, S, Q, T, D, A, U, st);
}

py::tuple binary_grad_centres_py(const carray<double>& logq, const carray<double>& p,
                                 const carray<std::int64_t>& labels, std::int64_t n_classes,
                                 double scale, const carray<double>& bias,
                                 const carray<double>& lse, const carray<double>& coef,
                                 int n_threads, const py::object& progress, double cell_width) {
    const bool batched = p.ndim() == 3;
    if (!(p.ndim() == 2 || batched) || logq.ndim() != p.ndim())
        throw std::invalid_argument("logq and p must both be (n, 2) or both (B, n, 2) arrays");
    for (py::ssize_t d = 0; d < p.ndim(); ++d)
        if (logq.shape(d) != p.shape(d))
            throw std::invalid_argument("logq and p must have the same shape");
    const std::int64_t B = batched ? p.shape(0) : 1;
    const std::int64_t n = p.shape(batched ? 1 : 0), K = p.shape(batched ? 2 : 1);
    if (K != 2) throw std::invalid_argument("binary problems need K = 2, got " + std::to_string(K));
    if (n_classes < 1) throw std::invalid_argument("n_classes must be >= 1");
    const int vd = batched ? 2 : 1;
    auto check_vec = [&](py::ssize_t nd, const py::array& a, const char* name) {
        if (a.ndim() != nd || (batched && a.shape(0) != B) || a.shape(vd - 1) != n)
            throw std::invalid_argument(std::string(name) + " has the wrong shape");
    };
    check_vec(vd, labels, "labels");
    check_vec(vd, bias, "bias");
    check_vec(vd, lse, "lse");
    check_vec(vd + 1, coef, "coef");
    if (coef.shape(vd) != n_classes)
        throw std::invalid_argument("coef must have n_classes columns");
    auto shape = [&](std::vector<py::ssize_t> dims) {
        if (batched) dims.insert(dims.begin(), static_cast<py::ssize_t>(B));
        return dims;
    };
    const auto ns = static_cast<py::ssize_t>(n);
    py::array_t<double> grad_p(shape({ns, 2})), grad_bias(shape({ns}));
    kdecal::BinaryGradProblem prob;
    prob.logq = logq.data();
    prob.p = p.data();
    prob.labels = labels.data();
    prob.B = B;
    prob.n = n;
    prob.C = n_classes;
    prob.scale = scale;
    prob.bias = bias.data();
    prob.lse = lse.data();
    prob.coef = coef.data();
    prob.cell_width = cell_width;
    kdecal::BinaryGradResult out;
    out.grad_p = grad_p.mutable_data();
    out.grad_bias = grad_bias.mutable_data();
    kdecal::BinaryGradStats stats;
    auto work = [&](kdecal::Control* control) {
        kdecal::binary_grad_centres(prob, out, n_threads, control, &stats);
    };
    kdecal_bind::run_watched(work, progress,
                             1000.0 * static_cast<double>(B) * static_cast<double>(n));
    py::dict st;
    st["cells_taylor"] = stats.cells_taylor;
    st["terms_taylor"] = stats.terms_taylor;
    st["pairs_direct"] = stats.pairs_direct;
    st["fallbacks"] = stats.fallbacks;
    return py::make_tuple(grad_p, grad_bias, st);
}

}  // namespace

void bind_binary(py::module_& m) {
    m.def("binary_grad_centres", &binary_grad_centres_py, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale"), py::arg("bias").noconvert(), py::arg("lse").noconvert(),
          py::arg("coef").noconvert(), py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), py::arg("cell_width") = 0.5, R"doc(
The centre role of loo_grad for binary (K = 2, Beta-kernel) problems without the O(n^2)
loop: grad_p[i, k] = scale * sum_{j != i} w_ij coef[j, labels_i] logq[j, k] and
grad_bias[i] = sum_{j != i} w_ij coef[j, labels_i], w_ij = exp(L_ij - lse[j]), as
loo_grad returns them.  Taylor series in the centre's coordinate over cells of queries
(width cell_width * sqrt(h) / 2 in arcsin sqrt(x)), each sum within 3e-9 of the sum of
its terms' magnitudes (a centre whose bound fails is summed exactly;
docs/guide/binary_engine.md).  logq, p (n, 2) or (B, n, 2) float64; labels (n,) /
(B, n) int64; bias, lse (n,) / (B, n) float64; coef (n, C) / (B, n, C) float64.  Returns
(grad_p, grad_bias, stats).  Releases the GIL; progress and Ctrl-C as in loo_grad (B n
rows in all).
)doc");
    py::class_<PyBinaryPlan>(m, "BinaryPlan", R"doc(
The sorted centres of a batch of binary problems and a cache of their per-bandwidth
cells, for many binary_reduce calls on the same arrays (a bandwidth search).

BinaryPlan(logq, p, labels, n_classes): logq, p (B, n, 2) float64, labels (B, n) int64,
the arrays the calls pass (a call uses the plan only when it passes these very arrays;
their contents must not change while the plan lives).  Results are bit-identical with and
without a plan.
)doc")
        .def(py::init(&make_plan), py::arg("logq").noconvert(), py::arg("p").noconvert(),
             py::arg("labels").noconvert(), py::arg("n_classes"));
    m.def("binary_reduce", &binary_reduce_py, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale").noconvert(), py::arg("bias").noconvert(), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), py::arg("pairs") = false,
          py::arg("method") = "binned", py::arg("residuals") = false,
          py::arg("u") = py::none(), py::arg("cell_width") = 0.8,
          py::arg("plan") = py::none(), py::arg("v") = py::none(),
          py::arg("ref_floor") = 0.0, py::arg("weighted_rows") = false, R"doc(
Fast leave-one-out sums of binary (K = 2) problems: the accumulators of loo_reduce.

logq, p: (n, 2) or (B, n, 2) float64 (the same arrays loo_reduce takes); labels (n,) or
(B, n) int64; scale (H,); bias (H, n) or (B, H, n).  method: "window" (exact terms within
max(64, ln n + 36) nats of each class maximum, with loo_reduce's own log-kernel),
"binned" (Taylor sums over cells of width cell_width * sqrt(h) / 2 in arcsin sqrt(x),
with an error bound per (query, class) and the window method where it is not met) or
"local" (those cells' sums translated once per group of neighbouring queries into one
series in the query's coordinate, with the same bound, and "binned" where it is not met;
docs/guide/binary_engine.md).  plan: a BinaryPlan of these logq, p, labels, or None.  residuals=True also returns A (H, R, 2) = sum_{i != j}
w_ij p[i, k] and, with u ((n,) or (B, n) float64), U (H, R) = sum_{i != j} w_ij^2 u[i],
w_ij = exp(L_ij - m_j).  v ((n,) or (B, n) float64 >= 0, powers <= 2, no pairs): centre
weights (the multiplicities of a bootstrap sample): S_c = sum_{i != j} v_i w_ij [y_i = c],
Q_c with v_i^2 w_ij^2, A with v_i w_ij; U and m unweighted.  ref_floor (>= 0, with v):
each weighted sum of power q accurate relative to at least ref_floor^q (units of the class
maximum's unweighted term), not only to itself: 1 for label weights, whose sums are only
needed next to the row's whole kernel sum.  weighted_rows (with v): only the rows with
v_j > 0 are queries (a bootstrap sample's rows; the others' weight in its mean is 0); the
others get the outputs of a row without centres (m = -inf, every sum 0), the queries'
are bit-identical.  Returns (m, S, Q, T, D, A, U, stats): arrays not requested have
shape (0, 0, 0); stats counts the direct terms, Taylor cells and fallbacks.  Releases the
GIL; progress and Ctrl-C as in loo_reduce (B H (row_stop - row_start) rows in all).
)doc");
}
