// Binding of kdecal::loo_reduce.  Arrays arrive already validated and normalised by
// kdecal._validation (exact dtype, C-contiguous); noconvert() forbids hidden copies.
#include "pybind11.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kdecal/loo.hpp"
#include "watch.hpp"

namespace {

template <class Real>
using carray = py::array_t<Real, py::array::c_style>;

template <class Real>
py::tuple loo_reduce_py(const carray<Real>& logq, const carray<Real>& p,
                        const carray<std::int64_t>& labels, std::int64_t n_classes,
                        const carray<double>& scale, const carray<double>& bias, int powers,
                        std::int64_t row_start, std::int64_t row_stop, int n_threads,
                        const py::object& progress, bool pairs,
                        const std::optional<carray<double>>& resid) {
    // A 2-D problem (n, K) or a batch of B independent problems (B, n, K) sharing n, K,
    // the bandwidths and C (e.g. the K one-vs-rest problems of class-wise calibration).
    const bool batched = p.ndim() == 3;
    if (!(p.ndim() == 2 || batched) || logq.ndim() != p.ndim())
        throw std::invalid_argument("logq and p must both be (n, K) or both (B, n, K) arrays");
    const std::int64_t B = batched ? p.shape(0) : 1;
    const std::int64_t n = p.shape(batched ? 1 : 0), K = p.shape(batched ? 2 : 1);
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
    if (resid) {
        if (resid->ndim() != (batched ? 2 : 1) || (batched && resid->shape(0) != B) ||
            resid->shape(resid->ndim() - 1) != n) {
            std::string got = "(";
            for (py::ssize_t d = 0; d < resid->ndim(); ++d)
                got += (d ? ", " : "") + std::to_string(resid->shape(d));
            got += resid->ndim() == 1 ? ",)" : ")";
            throw std::invalid_argument(
                (batched ? "resid must have shape (B, n) = (" + std::to_string(B) + ", " +
                               std::to_string(n) + ")"
                         : "resid must have shape (n,) = (" + std::to_string(n) + ",)") +
                ", got " + got);
        }
        const double* pu = resid->data();
        for (std::int64_t i = 0; i < B * n; ++i)
            if (!std::isfinite(pu[i]))
                throw std::invalid_argument(
                    "resid must be finite; resid[" +
                    (batched ? std::to_string(i / n) + ", " : std::string()) +
                    std::to_string(i % n) + "] = " + std::to_string(pu[i]));
    }

    const std::int64_t R = row_stop - row_start;
    auto shape = [&](std::vector<py::ssize_t> dims) {
        if (batched) dims.insert(dims.begin(), static_cast<py::ssize_t>(B));
        return dims;
    };
    const auto Hs = static_cast<py::ssize_t>(H), Rs = static_cast<py::ssize_t>(R),
               Cs = static_cast<py::ssize_t>(n_classes);
    py::array_t<double> m(shape({Hs, Rs}));
    py::array_t<double> S(shape({Hs, Rs, Cs}));
    py::array_t<double> Q(powers >= 2 ? shape({Hs, Rs, Cs}) : std::vector<py::ssize_t>{0, 0, 0});
    py::array_t<double> T(powers >= 3 ? shape({Hs, Rs, Cs}) : std::vector<py::ssize_t>{0, 0, 0});
    py::array_t<double> D(pairs ? shape({Hs, Rs, Cs}) : std::vector<py::ssize_t>{0, 0, 0});
    const auto Ks = static_cast<py::ssize_t>(K);
    py::array_t<double> A(resid ? shape({Hs, Rs, Ks}) : std::vector<py::ssize_t>{0, 0, 0});
    py::array_t<double> U(resid ? shape({Hs, Rs}) : std::vector<py::ssize_t>{0, 0});

    const std::int64_t in_stride = n * K, out_m = H * R, out_s = H * R * n_classes;
    double* pm = m.mutable_data();
    double* pS = S.mutable_data();
    double* pQ = powers >= 2 ? Q.mutable_data() : nullptr;
    double* pT = powers >= 3 ? T.mutable_data() : nullptr;
    double* pD = pairs ? D.mutable_data() : nullptr;
    double* pA = resid ? A.mutable_data() : nullptr;
    double* pU = resid ? U.mutable_data() : nullptr;
    const double* pu = resid ? resid->data() : nullptr;
    const Real* plq = logq.data();
    const Real* pp = p.data();
    const std::int64_t* pl = labels.data();
    const double* psc = scale.data();
    const double* pb = bias.data();
    auto work = [&](kdecal::Control* control) {
        for (std::int64_t b = 0; b < B; ++b) {
            kdecal::LooProblem<Real> prob;
            prob.logq = plq + b * in_stride;
            prob.p = pp + b * in_stride;
            prob.labels = pl + b * n;
            prob.n = n;
            prob.K = K;
            prob.C = n_classes;
            prob.scale = psc;
            prob.bias = pb + b * H * n;
            prob.H = H;
            prob.powers = powers;
            prob.row_start = row_start;
            prob.row_stop = row_stop;
            prob.u = pu ? pu + b * n : nullptr;
            kdecal::LooResult out;
            out.m = pm + b * out_m;
            out.S = pS + b * out_s;
            out.Q = pQ ? pQ + b * out_s : nullptr;
            out.T = pT ? pT + b * out_s : nullptr;
            out.D = pD ? pD + b * out_s : nullptr;
            out.A = pA ? pA + b * out_m * K : nullptr;
            out.U = pU ? pU + b * out_m : nullptr;
            if (!kdecal::loo_reduce(prob, out, n_threads, control)) return;  // cancelled
        }
    };
    // work: kernel evaluations (pairs x bandwidths) plus the K-dots (and the residual
    // sums' K-vectors)
    kdecal_bind::run_watched(
        work, progress,
        static_cast<double>(B) * static_cast<double>(R) * static_cast<double>(n) *
            static_cast<double>(H + K + (resid ? H * K : 0)));
    if (pairs && resid) return py::make_tuple(m, S, Q, T, D, A, U);
    if (resid) return py::make_tuple(m, S, Q, T, A, U);
    if (pairs) return py::make_tuple(m, S, Q, T, D);
    return py::make_tuple(m, S, Q, T);
}

py::array_t<double> kernel_bias_py(const carray<double>& p, double scale, int n_threads) {
    if (p.ndim() != 2) throw std::invalid_argument("p must be a 2-D (rows, D) array");
    const std::int64_t rows = p.shape(0), D = p.shape(1);
    py::array_t<double> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(rows)});
    const double* pp = p.data();
    double* po = out.mutable_data();
    {
        py::gil_scoped_release release;
        kdecal::kernel_bias(pp, rows, D, scale, po, n_threads);
    }
    return out;
}

}  // namespace

void bind_loo(py::module_& m) {
    const char* doc = R"doc(
Leave-one-out Dirichlet-kernel reduction (one streaming pass, O(n K) memory).

For query rows j in [row_start, row_stop) and centres i != j (logq, p of shape (n, K), or
(B, n, K) for a batch of independent problems; outputs then gain a leading B axis):
L_ij = bias[t, i] + scale[t] * sum_k logq[j, k] * p[i, k]; returns (m, S, Q, T) with
m[t, j] = max_i L_ij and S[t, j, c] = sum_{i != j, labels_i = c} exp(L_ij - m[t, j])
(Q, T: the same with exp(2 (.)), exp(3 (.)); empty arrays unless powers >= 2, 3).
pairs=True (needs powers >= 2) appends D of the shape of S: D[t, j, c] = S^2 - Q, the
sum over ordered pairs of distinct centres of class c of their weight products,
accumulated without cancellation (full relative precision when one neighbour dominates;
S, Q, T are the same either way).
resid (None, or float64 u of shape (n,), or (B, n) for a batch; finite) appends the
residual sums A and U after D (or after T without pairs): over ALL centres, whatever
their label, A[t, j, k] = sum_{i != j} exp(L_ij - m[t, j]) * p[i, k] (shape (H, R, K))
and U[t, j] = sum_{i != j} exp(2 (L_ij - m[t, j])) * u[i] (shape (H, R)), with the
same dropping of negligible terms as S; m, S, Q, T, D are bit for bit the same with or
without resid.
Arrays must already have the exact dtype (float64 or float32 for logq and p, int64
labels, float64 scale and bias) and be C-contiguous. Releases the GIL.
progress: None or a callable, called from the calling thread (about every 50 ms, and
once at the end) with the number of query rows done so far, counted over the batch
(B (row_stop - row_start) in all). Ctrl-C (or an exception from progress) stops the
computation within about one block of rows per thread and propagates.
)doc";
    m.def("loo_reduce", &loo_reduce_py<double>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale").noconvert(), py::arg("bias").noconvert(), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), py::arg("pairs") = false,
          py::arg("resid").noconvert() = py::none(), doc);
    m.def("loo_reduce", &loo_reduce_py<float>, py::arg("logq").noconvert(),
          py::arg("p").noconvert(), py::arg("labels").noconvert(), py::arg("n_classes"),
          py::arg("scale").noconvert(), py::arg("bias").noconvert(), py::arg("powers") = 1,
          py::arg("row_start") = 0, py::arg("row_stop") = 0, py::arg("n_threads") = 0,
          py::arg("progress") = py::none(), py::arg("pairs") = false,
          py::arg("resid").noconvert() = py::none(), doc);
    m.def("kernel_bias", &kernel_bias_py, py::arg("p").noconvert(), py::arg("scale"),
          py::arg("n_threads") = 0, R"doc(
Per-centre kernel bias of one bandwidth: -sum_k lgamma(p[i, k] * scale + 1), shape (rows,).

p: (rows, D) float64, C-contiguous, every value in [0, 1]; scale = 1 / h, finite and > 0.
The log-gamma function is the engine's own: Stirling's series, vectorised on this CPU's
SIMD path. Per value it is within 1 ulp of the exact value for arguments >= 100 and
within 26 ulp of max(1, |lgamma|) below 8. The same bits for any n_threads (<= 0: the
OpenMP default). Releases the GIL. Raises ValueError for a bad scale or a p value
outside [0, 1] (naming the first one).
)doc");
    m.def("simd_path", &kdecal::simd_path, "SIMD code path chosen for this CPU.");
    m.def("has_openmp", &kdecal::has_openmp, "Whether the engine was built with OpenMP.");
    m.def("max_threads", &kdecal::max_threads, "OpenMP's default number of threads.");
    // calls whose work (the binding's estimate) is below this run unwatched (watch.hpp)
    m.attr("WATCH_MIN_WORK") = kdecal_bind::kWatchMinWork;
}
