// Binding of the ratio debiasing (kdecal/debias.hpp).
#include "pybind11.hpp"

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kdecal/debias.hpp"

namespace {

using carray = py::array_t<double, py::array::c_style>;

py::tuple debias_py(const carray& S, const carray& Q, const py::object& T_obj, double n_terms,
                    int mode, const py::object& D_obj) {
    if (mode != 1 && mode != 2) throw std::invalid_argument("mode must be 1 (ustat) or 2 (ratio)");
    if (S.ndim() < 1 || Q.ndim() != S.ndim())
        throw std::invalid_argument("S and Q must have the same shape (..., C)");
    for (py::ssize_t d = 0; d < S.ndim(); ++d)
        if (S.shape(d) != Q.shape(d)) throw std::invalid_argument("S and Q must have the same shape");
    carray T;
    if (mode == 2) {
        if (T_obj.is_none()) throw std::invalid_argument("mode 2 (ratio) needs T");
        T = T_obj.cast<carray>();
        if (T.ndim() != S.ndim()) throw std::invalid_argument("T must have the shape of S");
        for (py::ssize_t d = 0; d < S.ndim(); ++d)
            if (S.shape(d) != T.shape(d)) throw std::invalid_argument("T must have the shape of S");
    }
    carray D;
    if (!D_obj.is_none()) {
        D = D_obj.cast<carray>();
        if (D.ndim() != S.ndim()) throw std::invalid_argument("D must have the shape of S");
        for (py::ssize_t d = 0; d < S.ndim(); ++d)
            if (S.shape(d) != D.shape(d)) throw std::invalid_argument("D must have the shape of S");
    }
    if (!(n_terms >= 1.0)) throw std::invalid_argument("n_terms must be >= 1");
    const std::int64_t C = S.shape(S.ndim() - 1);
    const std::int64_t R = C > 0 ? S.size() / C : 0;
    std::vector<py::ssize_t> shape(S.shape(), S.shape() + S.ndim());
    py::array_t<double> E(shape), sq(shape);
    std::vector<py::ssize_t> rows(S.shape(), S.shape() + S.ndim() - 1);
    py::array_t<std::uint8_t> degenerate(rows);
    const double* pS = S.data();
    const double* pQ = Q.data();
    const double* pT = mode == 2 ? T.data() : nullptr;
    const double* pD = D_obj.is_none() ? nullptr : D.data();
    double* pE = E.mutable_data();
    double* psq = sq.mutable_data();
    std::uint8_t* pd = degenerate.mutable_data();
    {
        py::gil_scoped_release release;
        kdecal::debias_rows(pS, pQ, pT, pD, R, C, n_terms, mode, pE, psq, pd);
    }
    return py::make_tuple(E, sq, degenerate.attr("astype")("bool"));
}

}  // namespace

void bind_debias(py::module_& m) {
    m.def("debias", &debias_py, py::arg("S").noconvert(), py::arg("Q").noconvert(),
          py::arg("T") = py::none(), py::arg("n_terms"), py::arg("mode"), py::arg("D") = py::none(),
          R"doc(
Debiased conditional expectations and squared conditional expectations per query row.

S, Q (and T for mode 2): (..., C) float64 power sums from loo_reduce. n_terms: the
number of leave-one-out terms, n - 1. mode 1 ("ustat", Popordanoska et al. 2022 Eq. 7)
or 2 ("ratio", App. C Eq. 73 and App. D Eq. 89). Returns (E, sq, degenerate): E and sq
of shape (..., C), degenerate (...,) bool where a row has a single effective neighbour
(there the plain ratio is used). D (optional, (..., C) float64): the pair sums S^2 - Q
from loo_reduce(..., pairs=True); with them the U-statistic ratio is formed without
cancellation (see kdecal/debias.hpp), otherwise from S and Q.
)doc");
}
