"""Vector scaling on the real files: NLL, iterations and time of the fit, and the optimum.

For each file of the real-data folder (``../shared/data/real``; multi-class, n <= 20,000,
K <= 120; the ``val_`` split where there is one) fits ``VectorScaling`` and prints its
NLL, ``converged_``, iterations and wall time; for K <= 20 also the NLL of an independent
Newton fit (scipy's trust-exact with the exact Hessian, a gauge term for the common
shift of the biases), the optimum the fit must reach.

    KDECAL_PROGRESS=0 python bench/vector_scaling_fit.py [DATA_DIR]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy.special import log_softmax

from kdecal.recalibration import VectorScaling

# the tests' independent Newton reference (tests/_reference.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _reference import ref_vector_scaling_nll


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("../shared/data/real")
    warnings.simplefilter("ignore")
    print(
        f"{'file':36s} {'n x K':>11s} {'NLL':>14s} conv {'iter':>5s} {'time':>7s} {'Newton NLL':>14s}"
    )
    for f in sorted(folder.glob("*.npz")):
        with np.load(f) as d:
            pre = "val_" if "val_labels" in d.files else ""
            kind = "logits" if pre + "logits" in d.files else "probs"
            X, y = d[pre + kind].astype(np.float64), d[pre + "labels"].astype(np.int64)
        if X.ndim != 2 or X.shape[0] > 20000 or X.shape[1] > 120:
            continue
        t = time.perf_counter()
        cal = VectorScaling(input=kind).fit(X, y)
        sec = time.perf_counter() - t
        ref = ""
        if X.shape[1] <= 20:
            L = log_softmax(X, axis=1) if kind == "logits" else np.log(np.maximum(X, 1e-300))
            ref = f"{ref_vector_scaling_nll(L, y):14.10f}"
        print(
            f"{f.name[:36]:36s} {X.shape[0]:>6d} x {X.shape[1]:<3d} {cal.nll_:14.10f} "
            f"{'yes' if cal.converged_ else 'NO ':4s} {cal.n_iter_:5d} {sec:6.2f}s {ref}"
        )


if __name__ == "__main__":
    main()
