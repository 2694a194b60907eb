"""Smoke test of an installed kdecal (a wheel in a fresh environment).

Run it from outside the source tree, so that ``import kdecal`` finds the installed
package and not ``python/kdecal``::

    python scripts/smoke_test.py

It checks that the compiled core imports (no numba fallback), that ECE^KDE and the KL
calibration error of the bundled example (CIFAR-10 VGG-16, n = 10,000, K = 10) at the
fixed bandwidth h = 0.1 equal the values this release computes on x86-64 (baseline, AVX2
and AVX-512 paths alike) to 1e-8 relative, that the binned ECE equals the data README's
3.98 %, and that the distribution carries its version, LICENSE, ``py.typed``,
``_core.pyi`` and the ``kdecal`` command. Exits 1 with the failed checks listed.
"""

from __future__ import annotations

import importlib.metadata
import math
import sys
import warnings
from pathlib import Path

# ece_kde(p=1) and calibration_error("kl") of the bundled example at h = 0.1, float64
# input, debias="ustat" (L1 and KL are not debiased): the default residual-centred
# estimator, and the papers' plug-in (estimator="plugin")
EXPECTED = {
    "residual": (0.03492396709381471, 0.060262990460265245),
    "plugin": (0.056698970899982194, 0.07384402283122266),
}
RTOL = 1e-8


def main() -> int:
    """Run every check; print one line each and return the exit status."""
    failed: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failed.append(what)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a BackendFallbackWarning is a failure here
        import numpy as np

        import kdecal
        from kdecal import _io
        from kdecal._engine import runtime as _runtime

    check(_runtime._core is not None, f"kdecal._core imports ({_runtime._core_error})")
    check("cpp" in kdecal.available_backends(), f"backends {kdecal.available_backends()}")
    root = Path(kdecal.__file__).resolve().parent
    check(
        "site-packages" in root.parts or "dist-packages" in root.parts,
        f"kdecal imported from an installation: {root}",
    )
    check(
        kdecal.__version__ == importlib.metadata.version("kdecal"),
        f"version {kdecal.__version__} == metadata {importlib.metadata.version('kdecal')}",
    )
    for name in ("py.typed", "_core.pyi"):
        check((root / name).is_file(), f"package ships {name}")

    dist = importlib.metadata.distribution("kdecal")
    licences = [f for f in dist.files or () if f.name == "LICENSE" and ".dist-info" in str(f)]
    text = licences[0].read_text() if licences else ""
    check(bool(licences) and "MIT License" in (text or ""), "LICENSE (MIT) in the .dist-info")
    scripts = {ep.name for ep in dist.entry_points if ep.group == "console_scripts"}
    check("kdecal" in scripts, "console script kdecal")

    with np.load(_io.bundled_example_path(), allow_pickle=False) as d:
        probs, labels = d["probs"].astype(np.float64), d["labels"]
    if _runtime._core is not None:
        print(f"     SIMD path {_runtime._core.simd_path()}, OpenMP {_runtime._core.has_openmp()}")
        for estimator, (want_ece, want_kl) in EXPECTED.items():
            kw = {"bandwidth": 0.1, "backend": "cpp", "estimator": estimator}
            with warnings.catch_warnings():  # the note on canonical KL at K = 10
                warnings.simplefilter("ignore", kdecal.KdecalWarning)
                ece = kdecal.ece_kde(probs, labels, p=1, **kw)
                kl = kdecal.calibration_error(probs, labels, divergence="kl", **kw)
            check(
                math.isclose(ece, want_ece, rel_tol=RTOL),
                f"ece_kde {estimator} = {ece!r} (expected {want_ece!r})",
            )
            check(
                math.isclose(kl, want_kl, rel_tol=RTOL),
                f"calibration_error kl {estimator} = {kl!r} (expected {want_kl!r})",
            )
    binned = kdecal.binned.ece(probs, labels, n_bins=15)
    check(round(100 * binned, 2) == 3.98, f"binned ECE15 = {100 * binned:.4f} % (3.98 %)")
    if failed:
        print(f"{len(failed)} check(s) failed", file=sys.stderr)
        return 1
    print("kdecal smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
