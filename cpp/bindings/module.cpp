// kdecal._core: the compiled engine.  One bind_<topic>() per file.
#include "pybind11.hpp"

PYBIND11_MODULE(_core, m) {
    m.doc() = "kdecal compiled core: streaming leave-one-out Dirichlet-kernel reduction and its backward pass";
    bind_loo(m);
    bind_debias(m);
    bind_grad(m);
    bind_multi(m);
    bind_binary(m);
}
