// Binding of kdecal::loo_reduce.  Arrays arrive already validated and normalised by
// kdecal._validation (exact dtype, C-contiguous); noconvert() forbids hidden copies.
#include "pybind11.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kdecal/loo.hpp"

namespace {

template <class Real>
using carray = py::array_t<Real, py::array::c_style>;

template <class Real>
py::tuple loo_reduce_py(const carray<Real>& logq, const carray<Real>& p,
                        const carray<std::int64_t>& labels, std::int64_t n_classes,
                        const carray<double>& scale, const carray<double>& bias, int powers,
                        std::int64_t row_start, std::int64_t row_stop, int n_threads) {
    if (logq.ndim() != 2 || p.ndim() != 2)
        throw std::invalid_argument("logq and p must be 2-D (n, K) arrays");
    const std::int64_t n = p.shape(0), K = p.shape(1);
    if (logq.shape(0) != n || logq.shape(1) != K)
        throw std::invalid_argument("logq and p must have the same shape");
    if (labels.ndim() != 1 || labels.shape(0) != n)
        throw std::invalid_argument("labels must have shape (n,) with n = " + std::to_string(n));
    if (scale.ndim() != 1) throw std::invalid_argument("scale must be 1-D");
    const std::int64_t H = scale.shape(0);
    if (bias.ndim() != 2 || bias.shape(0) != H || bias.shape(1) != n)
        throw std::invalid_argument("bias must have shape (H, n)");
    if (row_start < 0 || row_stop < row_start || row_stop > n)
        throw std::invalid_argument("need 0 <= row_start <= row_stop <= n");
    if (powers < 1 || powers > 3) throw std::invalid_argument("powers must be 1, 2 or 3");
    if (n_classes < 1) throw std::invalid_argument("n_classes must be >= 1");

    const std::int64_t R = row_stop - row_start;
    py::array_t<double> m({H, R});
    py::array_t<double> S({H, R, n_classes});
    const std::int64_t qr = powers >= 2 ? R : 0, qh = powers >= 2 ? H : 0,
                       qc = powers >= 2 ? n_classes : 0;
    const std::int64_t tr = powers >= 3 ? R : 0, th = powers >= 3 ? H : 0,
                       tc = powers >= 3 ? n_classes : 0;
    py::array_t<double> Q({qh, qr, qc});
    py::array_t<double> T({th, tr, tc});

    kdecal::LooProblem<Real> prob;
    prob.logq = logq.data();
    prob.p = p.data();
    prob.labels = labels.data();
    prob.n = n;
    prob.K = K;
    prob.C = n_classes;
    prob.scale = scale.data();
    prob.bias = bias.data();
    prob.H = H;
    prob.powers = powers;
    prob.row_start = row_start;
    prob.row_stop = row_stop;
    kdecal::LooResult out;
    out.m = m.mutable_data();
    out.S = S.mutable_data();
    out.Q = powers >= 2 ? Q.mutable_data() : nullptr;
    out.T = powers >= 3 ? T.mutable_data() : nullptr;
    {
        py::gil_scoped_release release;
        kdecal::loo_reduce(prob, out, n_threads);
    }
    return py::make_tuple(m, S, Q, T);
}

}  // namespace

void bind_loo(py::module_& m) {
    const char* doc = R"doc(
Leave-one-out Dirichlet-kernel reduction (one streaming pass, O(n K) memory).

For query rows j in [row_start, row_stop) and centres i != j:
L_ij = bias[t, i] + scale[t] * sum_k logq[j, k] * p[i, k]; returns (m, S, Q, T) with
m[t, j] = max_i L_ij and S[t, j, c] = sum_{i != j, labels_i = c} exp(L_ij - m[t, j])
(Q, T: the same with exp(2 (.)), exp(3 (.)); empty arrays unless powers >= 2, 3).
Arrays must already have the exact dtype (float64 or float32 for logq and p, int64
labels, float64 scale and bias) and be C-contiguous. Releases the GIL.
)doc";
    m.def("loo_reduce", &loo_reduce_py<double>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale").noconvert(), py::arg("bias").noconvert(), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0, doc);
    m.def("loo_reduce", &loo_reduce_py<float>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale").noconvert(), py::arg("bias").noconvert(), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0, doc);
    m.def("simd_path", &kdecal::simd_path, "SIMD code path chosen for this CPU.");
    m.def("has_openmp", &kdecal::has_openmp, "Whether the engine was built with OpenMP.");
    m.def("max_threads", &kdecal::max_threads, "OpenMP's default number of threads.");
}
