// Binding of kdecal::loo_reduce_multi.  noconvert() forbids hidden copies: arrays must
// arrive with the exact dtype, C-contiguous.  Shapes are checked here, values (labels,
// weights, m, scale) by the engine; both raise ValueError naming the argument.
#include "pybind11.hpp"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kdecal/multi.hpp"
#include "watch.hpp"

namespace {

template <class Real>
using carray = py::array_t<Real, py::array::c_style>;

std::string shape_str(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t d = 0; d < a.ndim(); ++d) {
        if (d) s += ", ";
        s += std::to_string(a.shape(d));
    }
    return s + (a.ndim() == 1 ? ",)" : ")");
}

// The shapes of the points and of the per-point m and bias; returns n and K.
template <class Real>
std::pair<std::int64_t, std::int64_t> check_points(const carray<Real>& logq,
                                                   const carray<Real>& p,
                                                   const carray<double>& m,
                                                   const carray<double>& bias) {
    if (p.ndim() != 2) throw std::invalid_argument("p must have shape (n, K), got " + shape_str(p));
    const std::int64_t n = p.shape(0), K = p.shape(1);
    if (logq.ndim() != 2 || logq.shape(0) != n || logq.shape(1) != K)
        throw std::invalid_argument("logq must have the shape of p (" + std::to_string(n) +
                                    ", " + std::to_string(K) + "), got " + shape_str(logq));
    if (m.ndim() != 1 || m.shape(0) != n)
        throw std::invalid_argument("m must have shape (n,) = (" + std::to_string(n) +
                                    ",), got " + shape_str(m));
    if (bias.ndim() != 1 || bias.shape(0) != n)
        throw std::invalid_argument("bias must have shape (n,) = (" + std::to_string(n) +
                                    ",), got " + shape_str(bias));
    return {n, K};
}

template <class Real>
py::tuple loo_reduce_multi_py(const carray<Real>& logq, const carray<Real>& p,
                              const carray<double>& m, const carray<std::int64_t>& labels,
                              std::int64_t n_classes, double scale, const carray<double>& bias,
                              const std::optional<carray<double>>& weights, int powers,
                              std::int64_t row_start, std::int64_t row_stop, int n_threads,
                              const py::object& progress,
                              const std::optional<carray<double>>& resid) {
    const auto nk = check_points(logq, p, m, bias);
    const std::int64_t n = nk.first, K = nk.second;
    if (labels.ndim() != 2 || labels.shape(1) != n)
        throw std::invalid_argument("labels must have shape (B, n) with n = " +
                                    std::to_string(n) + ", got " + shape_str(labels));
    const std::int64_t B = labels.shape(0);
    if (weights && (weights->ndim() != 2 || weights->shape(0) != B || weights->shape(1) != n))
        throw std::invalid_argument("weights must have the shape of labels (" +
                                    std::to_string(B) + ", " + std::to_string(n) + "), got " +
                                    shape_str(*weights));
    if (resid && (resid->ndim() != 2 || resid->shape(0) != B || resid->shape(1) != n))
        throw std::invalid_argument("resid must have the shape of labels (" +
                                    std::to_string(B) + ", " + std::to_string(n) + "), got " +
                                    shape_str(*resid));
    if (n_classes < 1)
        throw std::invalid_argument("n_classes must be >= 1, got " + std::to_string(n_classes));
    if (powers != 1 && powers != 2)
        throw std::invalid_argument("powers must be 1 or 2, got " + std::to_string(powers));
    if (row_stop == 0) row_stop = n;
    if (row_start < 0 || row_stop < row_start || row_stop > n)
        throw std::invalid_argument("need 0 <= row_start <= row_stop <= n (row_stop = 0: n), "
                                    "got row_start = " + std::to_string(row_start) +
                                    ", row_stop = " + std::to_string(row_stop) +
                                    ", n = " + std::to_string(n));

    const auto Bs = static_cast<py::ssize_t>(B), Rs = static_cast<py::ssize_t>(row_stop - row_start),
               Cs = static_cast<py::ssize_t>(n_classes);
    py::array_t<double> S({Bs, Rs, Cs});
    py::array_t<double> Q(powers >= 2 ? std::vector<py::ssize_t>{Bs, Rs, Cs}
                                      : std::vector<py::ssize_t>{0, 0, 0});
    py::array_t<double> U(resid ? std::vector<py::ssize_t>{Bs, Rs}
                                : std::vector<py::ssize_t>{0, 0});
    kdecal::MultiProblem<Real> prob;
    prob.logq = logq.data();
    prob.p = p.data();
    prob.n = n;
    prob.K = K;
    prob.scale = scale;
    prob.bias = bias.data();
    prob.m = m.data();
    prob.labels = labels.data();
    prob.weights = weights ? weights->data() : nullptr;
    prob.u = resid ? resid->data() : nullptr;
    prob.B = B;
    prob.C = n_classes;
    prob.powers = powers;
    prob.row_start = row_start;
    prob.row_stop = row_stop;
    double* pS = S.mutable_data();
    double* pQ = powers >= 2 ? Q.mutable_data() : nullptr;
    double* pU = resid ? U.mutable_data() : nullptr;
    auto work = [&](kdecal::Control* control) {
        kdecal::loo_reduce_multi(prob, pS, pQ, n_threads, control, pU);
    };
    // work: pairs, each with a K-dot and B / 8 vector additions (more than the label
    // sets' layout, O(n B))
    kdecal_bind::run_watched(work, progress,
                             static_cast<double>(row_stop - row_start) * static_cast<double>(n) *
                                 (static_cast<double>(K) +
                                  static_cast<double>(B) / (resid ? 4.0 : 8.0)));
    if (resid) return py::make_tuple(S, Q, U);
    return py::make_tuple(S, Q);
}

template <class Real>
py::tuple kernel_weights_py(const carray<Real>& logq, const carray<Real>& p,
                            const carray<double>& m, double scale, const carray<double>& bias,
                            std::int64_t row_start, std::int64_t row_stop, int n_threads,
                            const py::object& progress, bool single) {
    const auto nk = check_points(logq, p, m, bias);
    const std::int64_t n = nk.first, K = nk.second;
    if (row_stop == 0) row_stop = n;
    if (row_start < 0 || row_stop < row_start || row_stop > n)
        throw std::invalid_argument("need 0 <= row_start <= row_stop <= n (row_stop = 0: n), "
                                    "got row_start = " + std::to_string(row_start) +
                                    ", row_stop = " + std::to_string(row_stop) +
                                    ", n = " + std::to_string(n));
    const auto Rs = static_cast<py::ssize_t>(row_stop - row_start),
               Ns = static_cast<py::ssize_t>(n);
    py::array_t<std::int64_t> order(Ns);
    kdecal::MultiProblem<Real> prob;
    prob.logq = logq.data();
    prob.p = p.data();
    prob.n = n;
    prob.K = K;
    prob.scale = scale;
    prob.bias = bias.data();
    prob.m = m.data();
    prob.B = 0;
    prob.row_start = row_start;
    prob.row_stop = row_stop;
    std::int64_t* po = order.mutable_data();
    const double size = static_cast<double>(row_stop - row_start) * static_cast<double>(n) *
                        (static_cast<double>(K) + 2.0);
    auto weights = [&](auto zero) -> py::tuple {  // W of zero's type (float or double)
        py::array_t<decltype(zero)> W({Rs, Ns});
        auto* pW = W.mutable_data();
        auto work = [&](kdecal::Control* control) {
            kdecal::kernel_weights(prob, pW, po, n_threads, control);
        };
        kdecal_bind::run_watched(work, progress, size);
        return py::make_tuple(W, order);
    };
    return single ? weights(0.0f) : weights(0.0);
}

}  // namespace

void bind_multi(py::module_& m) {
    const char* doc = R"doc(
Leave-one-out class sums of B label sets at once, for one bandwidth.

For query rows j in [row_start, row_stop) (row_stop = 0: n) and centres i != j, with
L_ij = bias[i] + scale * sum_k logq[j, k] p[i, k] and m[j] = max_{i != j} L_ij (the `m`
of loo_reduce at this bandwidth), w_ij = exp(L_ij - m[j]); returns (S, Q) with
S[b, j, c] = sum_{i != j, labels[b, i] = c} weights[b, i] * w_ij and Q the same with
w_ij^2 (shape (0, 0, 0) unless powers == 2); S and Q have shape (B, R, n_classes).
Terms with L_ij - m[j] < -64 are dropped.  weights None means all 1.
resid (None, or float64 u of the shape of labels, finite) appends U of shape (B, R):
U[b, j] = sum_{i != j} weights[b, i] * w_ij^2 * u[b, i] over every class (the residual
sums; S and Q are the same with or without it).
Arrays must have the exact dtype (float64 or float32 for logq and p, float64 m, bias,
weights and resid, int64 labels) and be C-contiguous. Releases the GIL. progress: None
or a callable, called from the calling thread (about every 50 ms, and once at the end)
with the number of query rows done so far (R in all). Ctrl-C (or an exception from progress)
stops the computation within about one group of rows per thread and propagates.
)doc";
    m.def("loo_reduce_multi", &loo_reduce_multi_py<double>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("m").noconvert(), py::arg("labels").noconvert(),
          py::arg("n_classes"), py::arg("scale"), py::arg("bias").noconvert(),
          py::arg("weights").noconvert().none(true), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), py::arg("resid").noconvert() = py::none(), doc);
    m.def("loo_reduce_multi", &loo_reduce_multi_py<float>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("m").noconvert(), py::arg("labels").noconvert(),
          py::arg("n_classes"), py::arg("scale"), py::arg("bias").noconvert(),
          py::arg("weights").noconvert().none(true), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), py::arg("resid").noconvert() = py::none(), doc);
    const char* wdoc = R"doc(
The leave-one-out kernel weights of loo_reduce_multi, for dense products.

Returns (W, order): W of shape (R, n) float64, R = row_stop - row_start (row_stop = 0:
n), with W[r, s] = w_{j, order[s]} = exp(L_{j,order[s]} - m[j]) for query j =
row_start + r, exactly the weights loo_reduce_multi sums (0 on the diagonal and for
terms with L_ij - m[j] < -64), and order (n,) int64, the engine's order of the centres
(a permutation of 0..n-1). single=True returns W as float32, the same weights rounded,
and 0 below float32's smallest normal number (1.2e-38), for products in single
precision.
Arrays as loo_reduce_multi (no hidden copies). Releases the GIL; progress and Ctrl-C as
loo_reduce_multi.
)doc";
    m.def("kernel_weights", &kernel_weights_py<double>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("m").noconvert(), py::arg("scale"),
          py::arg("bias").noconvert(), py::arg("row_start") = 0, py::arg("row_stop") = 0,
          py::arg("n_threads") = 0, py::arg("progress") = py::none(), py::arg("single") = false,
          wdoc);
    m.def("kernel_weights", &kernel_weights_py<float>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("m").noconvert(), py::arg("scale"),
          py::arg("bias").noconvert(), py::arg("row_start") = 0, py::arg("row_stop") = 0,
          py::arg("n_threads") = 0, py::arg("progress") = py::none(), py::arg("single") = false,
          wdoc);
}
