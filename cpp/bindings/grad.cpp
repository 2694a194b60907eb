// Binding of kdecal::loo_grad (the streaming backward pass).  Arrays arrive already
// normalised by kdecal.torch (exact dtype, C-contiguous); noconvert() forbids hidden copies.
#include "pybind11.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kdecal/loo_grad.hpp"
#include "watch.hpp"

namespace {

template <class Real>
using carray = py::array_t<Real, py::array::c_style>;

template <class Real>
py::tuple loo_grad_py(const carray<Real>& logq, const carray<Real>& p,
                      const carray<std::int64_t>& labels, std::int64_t n_classes, double scale,
                      const carray<double>& bias, const carray<double>& lse,
                      const carray<double>& coef, int n_threads, const py::object& progress) {
    // One problem (n, K) or a batch of B independent problems (B, n, K) sharing n, K, C
    // and the bandwidth, as in loo_reduce.
    const bool batched = p.ndim() == 3;
    if (!(p.ndim() == 2 || batched) || logq.ndim() != p.ndim())
        throw std::invalid_argument("logq and p must both be (n, K) or both (B, n, K) arrays");
    for (py::ssize_t d = 0; d < p.ndim(); ++d)
        if (logq.shape(d) != p.shape(d))
            throw std::invalid_argument("logq and p must have the same shape");
    const std::int64_t B = batched ? p.shape(0) : 1;
    const std::int64_t n = p.shape(batched ? 1 : 0), K = p.shape(batched ? 2 : 1);
    if (n_classes < 1) throw std::invalid_argument("n_classes must be >= 1");
    const int vec_ndim = batched ? 2 : 1;
    auto check_vec = [&](const carray<double>& a, const char* name) {
        if (a.ndim() != vec_ndim || (batched && a.shape(0) != B) || a.shape(vec_ndim - 1) != n)
            throw std::invalid_argument(std::string(name) +
                                        (batched ? " must have shape (B, n)" : " must have shape (n,)"));
    };
    if (labels.ndim() != vec_ndim || (batched && labels.shape(0) != B) ||
        labels.shape(vec_ndim - 1) != n)
        throw std::invalid_argument(batched ? "labels must have shape (B, n)"
                                            : "labels must have shape (n,)");
    check_vec(bias, "bias");
    check_vec(lse, "lse");
    if (coef.ndim() != vec_ndim + 1 || (batched && coef.shape(0) != B) ||
        coef.shape(vec_ndim - 1) != n || coef.shape(vec_ndim) != n_classes)
        throw std::invalid_argument(batched ? "coef must have shape (B, n, n_classes)"
                                            : "coef must have shape (n, n_classes)");

    auto shape = [&](std::vector<py::ssize_t> dims) {
        if (batched) dims.insert(dims.begin(), static_cast<py::ssize_t>(B));
        return dims;
    };
    const auto ns = static_cast<py::ssize_t>(n), Ks = static_cast<py::ssize_t>(K);
    py::array_t<double> grad_logq(shape({ns, Ks})), grad_p(shape({ns, Ks}));
    py::array_t<double> grad_bias(shape({ns})), row_sum(shape({ns}));
    double* pgl = grad_logq.mutable_data();
    double* pgp = grad_p.mutable_data();
    double* pgb = grad_bias.mutable_data();
    double* prs = row_sum.mutable_data();
    const Real* plq = logq.data();
    const Real* pp = p.data();
    const std::int64_t* pl = labels.data();
    const double* pb = bias.data();
    const double* pls = lse.data();
    const double* pc = coef.data();
    auto work = [&](kdecal::Control* control) {
        for (std::int64_t b = 0; b < B; ++b) {
            kdecal::LooGradProblem<Real> prob;
            prob.logq = plq + b * n * K;
            prob.p = pp + b * n * K;
            prob.labels = pl + b * n;
            prob.n = n;
            prob.K = K;
            prob.C = n_classes;
            prob.scale = scale;
            prob.bias = pb + b * n;
            prob.lse = pls + b * n;
            prob.coef = pc + b * n * n_classes;
            kdecal::LooGradResult out;
            out.grad_logq = pgl + b * n * K;
            out.grad_p = pgp + b * n * K;
            out.grad_bias = pgb + b * n;
            out.row_sum = prs + b * n;
            if (!kdecal::loo_grad(prob, out, n_threads, control)) return;  // cancelled
        }
    };
    // work: two passes of pairs, each with a K-dot and K weighted sums
    kdecal_bind::run_watched(work, progress,
                             2.0 * static_cast<double>(B) * static_cast<double>(n) *
                                 static_cast<double>(n) * static_cast<double>(2 * K + 2));
    return py::make_tuple(grad_logq, grad_p, grad_bias, row_sum);
}

}  // namespace

void bind_grad(py::module_& m) {
    const char* doc = R"doc(
Streaming backward pass of the leave-one-out conditional expectation (O(n K) memory).

With L_ij = bias[i] + scale * sum_k logq[j, k] p[i, k], w_ij = exp(L_ij - lse[j]) for
i != j (lse[j] = m_j + log S_0(j) from loo_reduce, so the weights of a query sum to 1)
and coef[j, c] = dloss/dE[j, c] - sum_c' E[j, c'] dloss/dE[j, c'], returns
(grad_logq, grad_p, grad_bias, row_sum):
grad_logq[j, k] = scale * sum_{i != j} w_ij coef[j, labels_i] p[i, k],
grad_p[i, k] = scale * sum_{j != i} w_ij coef[j, labels_i] logq[j, k],
grad_bias[i] = sum_{j != i} w_ij coef[j, labels_i],
row_sum[j] = sum_{i != j} w_ij coef[j, labels_i].
Shapes: logq, p (n, K) or (B, n, K) float32/float64 (same dtype); labels (n,) / (B, n)
int64; bias, lse (n,) / (B, n) float64; coef (n, C) / (B, n, C) float64; outputs float64
with the matching leading axis. Arrays must be C-contiguous with these exact dtypes.
Releases the GIL. progress: None or a callable, called from the calling thread (about
every 50 ms, and once at the end) with the number of rows done so far, counted over both
passes and the batch (2 B n in all). Ctrl-C (or an exception from progress) stops the
computation within about one block of rows per thread and propagates.
)doc";
    m.def("loo_grad", &loo_grad_py<double>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale"), py::arg("bias").noconvert(), py::arg("lse").noconvert(),
          py::arg("coef").noconvert(), py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), doc);
    m.def("loo_grad", &loo_grad_py<float>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale"), py::arg("bias").noconvert(), py::arg("lse").noconvert(),
          py::arg("coef").noconvert(), py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), doc);
}
