// Included first by every binding file, so that all of them see the same pybind11
// configuration (one definition rule).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

void bind_loo(py::module_& m);
void bind_debias(py::module_& m);
void bind_grad(py::module_& m);
void bind_multi(py::module_& m);
void bind_binary(py::module_& m);
