"""Shared fixtures for the kdecal test suite.

Datasets are small (n <= 400) so that tests/_reference.py can materialise the
n x n log-kernel matrix.  Real classifier outputs are looked up, in this order, in
tests/data/ (the permissively licensed files the tests need, shipped with the sources;
two of them cut to the rows the tests use), python/kdecal/data/ (the bundled example)
and ../shared/data/real next to the repository root (CI clones the repo with shared/
beside it; ``KDECAL_REAL_DATA`` names another folder).  Tests that need a file found in
none of them are marked ``realdata`` and skip with the reason, which ``pytest -ra``
lists; with ``KDECAL_REQUIRE_REAL_DATA=1`` (CI) they fail instead.

kdecal itself is only imported inside fixtures/tests that need it, so the
reference self-checks (test_reference_selfcheck.py) run even if the package is
broken.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # make `_reference` importable

import _reference as ref

DATA_DIR = Path(
    os.environ.get("KDECAL_REAL_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
)
TEST_DATA_DIR = Path(__file__).resolve().parent / "data"
PACKAGE_DATA_DIR = Path(__file__).resolve().parents[1] / "python" / "kdecal" / "data"
REAL_N_MAX = 300
REQUIRE_REAL_DATA = os.environ.get("KDECAL_REQUIRE_REAL_DATA", "") not in ("", "0")

# real files shipped whole in tests/data (all MIT; see tests/data/README.md)
SHIPPED_FULL = (
    "adrenalmnist3d_resnet50.npz",
    "agnews_gpt2_zeroshot.npz",
    "cifar10_resnet50_psrcal.npz",
    "cifar10_wideresnet164_netcal.npz",
    "pathmnist_resnet50.npz",
    "pneumoniamnist_resnet50.npz",
    "sst2_gpt2_4shot.npz",
    "sst2_gpt2_zeroshot.npz",
)
# file -> (subset in tests/data, key prefix): the REAL_N_MAX rows get_dataset uses
SHIPPED_SUBSETS = {
    "cifar100_densenetbc100_netcal.npz": ("cifar100_densenetbc100_netcal.rows300.npz", ""),
    "speaker_verification_plda.npz": ("speaker_verification_plda.test_rows300.npz", "test_"),
}
BACKENDS = ["cpp", "numba"]
# numba is optional (pip install "kdecal[numba]"; the test extra has it): the tests of the
# numba backend (marked numba, or parametrized with "numba") skip without it
HAS_NUMBA = importlib.util.find_spec("numba") is not None
NO_NUMBA = 'numba is not installed (pip install "kdecal[numba]"): the numba backend is untested'


# ----------------------------------------------------------------------------- datasets
@dataclass
class Dataset:
    """A named (probs, labels) problem, float64 and float32 copies."""

    name: str
    probs: np.ndarray  # float64, (n, K) or (n,) for the binary convention
    labels: np.ndarray  # int64, (n,)
    probs32: np.ndarray  # the same data as float32 (file dtype for real data)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.labels.shape[0]

    @property
    def K(self) -> int:
        """Number of classes (2 for the binary (n,) convention)."""
        return 2 if self.probs.ndim == 1 else self.probs.shape[1]

    @property
    def ref_bandwidth(self) -> float:
        """Reference select_bandwidth on the float64 probs (cached)."""
        if "bw" not in self._cache:
            self._cache["bw"] = ref.ref_select_bandwidth(self.probs)
        return self._cache["bw"]


def make_synthetic(
    n, K, *, alpha=1.0, temperature=0.7, seed=0, binary_vector=False, drop_class=None
):
    """Dirichlet(alpha) probs; labels ~ Categorical(probs^(1/T) renormalised).

    T < 1 sharpens the label distribution, i.e. the model is under-confident;
    T > 1 makes it over-confident.  Either way it is miscalibrated, so the
    calibration errors are clearly > 0.
    """
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(K, alpha), size=n)
    T = P ** (1.0 / temperature)
    T /= T.sum(axis=1, keepdims=True)
    u = rng.random(n)
    labels = (u[:, None] > np.cumsum(T, axis=1)).sum(axis=1).clip(0, K - 1).astype(np.int64)
    if drop_class is not None:  # class `drop_class` never appears among the labels
        labels[labels == drop_class] = (drop_class + 1) % K
    if binary_vector:
        assert K == 2
        P = P[:, 1].copy()
    return P, labels


SYNTHETIC = {
    "syn-K2-n60": {"n": 60, "K": 2, "alpha": 1.0, "temperature": 0.7, "seed": 1},
    "syn-K2vec-n80": {
        "n": 80,
        "K": 2,
        "alpha": 0.8,
        "temperature": 1.5,
        "seed": 2,
        "binary_vector": True,
    },
    "syn-K3-n150": {"n": 150, "K": 3, "alpha": 1.0, "temperature": 0.6, "seed": 3},
    "syn-K4-absentclass-n100": {
        "n": 100,
        "K": 4,
        "alpha": 0.7,
        "temperature": 1.0,
        "seed": 4,
        "drop_class": 3,
    },
    "syn-K10-n400": {"n": 400, "K": 10, "alpha": 0.3, "temperature": 1.4, "seed": 5},
}

# name -> (file, key prefix ("" / "val_" / "test_"), kind ("logits"/"probs"), K)
REAL = {
    "real-pneumonia-K2": ("pneumoniamnist_resnet50.npz", "", "logits", 2),
    "real-adrenal-K2": ("adrenalmnist3d_resnet50.npz", "", "logits", 2),
    "real-speaker-K2-imbalanced": (
        "speaker_verification_plda.npz",
        "test_",
        "logits",
        2,
    ),
    "real-vgg16-K10": ("cifar10_vgg16_keras_verifiedcal.npz", "", "probs", 10),
    "real-densenet-K100": ("cifar100_densenetbc100_netcal.npz", "", "probs", 100),
}

SYNTHETIC_NAMES = list(SYNTHETIC)
REAL_NAMES = list(REAL)
ALL_NAMES = SYNTHETIC_NAMES + REAL_NAMES


def real_data_available() -> bool:
    """Whether the whole real-data folder (../shared/data/real) is there."""
    return DATA_DIR.is_dir()


def find_real_file(fname: str) -> Path | None:
    """Path of the whole real file ``fname``: tests/data, the package data, the shared folder."""
    for folder in (TEST_DATA_DIR, PACKAGE_DATA_DIR, DATA_DIR):
        if (folder / fname).is_file():
            return folder / fname
    return None


def skip_realdata(fname: str | None) -> None:
    """Skip (fail with KDECAL_REQUIRE_REAL_DATA=1): real file ``fname`` (None: the folder)."""
    if fname is None:
        reason = f"realdata: needs the real-data folder {DATA_DIR}, which is missing"
    else:
        reason = (
            f"realdata: needs {fname}, which is not shipped in tests/data, and the real-data "
            f"folder {DATA_DIR} is missing"
        )
    if REQUIRE_REAL_DATA:
        pytest.fail(f"{reason} (KDECAL_REQUIRE_REAL_DATA is set)", pytrace=False)
    pytest.skip(reason)


def real_file(fname: str) -> Path:
    """Path of the whole real file ``fname``; skips (see skip_realdata) when there is none."""
    path = find_real_file(fname)
    if path is None:
        skip_realdata(fname)
    assert path is not None
    return path


def subsample_rows(n: int) -> np.ndarray:
    """The REAL_N_MAX sorted row indices get_dataset keeps of an n-row file (all if n is small)."""
    if n <= REAL_N_MAX:
        return np.arange(n)
    return np.sort(np.random.default_rng(12345).choice(n, REAL_N_MAX, replace=False))


@functools.cache
def load_real_file(fname: str, prefix: str = "", kind: str = "probs"):
    """Whole file: (probs float64, probs float32, labels int64).  Skips if missing."""
    with np.load(real_file(fname), allow_pickle=False) as d:
        X = d[prefix + kind]
        y = d[prefix + "labels"].astype(np.int64)
    if kind == "logits":
        P64 = ref.ref_softmax(X.astype(np.float64))
        P32 = P64.astype(np.float32)
    else:
        P32 = X.astype(np.float32)
        P64 = P32.astype(np.float64)
    return P64, P32, y


@functools.cache
def get_dataset(name: str) -> Dataset:
    """Build (and cache) a named synthetic or real dataset."""
    if name in SYNTHETIC:
        P, y = make_synthetic(**SYNTHETIC[name])
        return Dataset(name, P, y, P.astype(np.float32))
    fname, prefix, kind, _ = REAL[name]
    if find_real_file(fname) is None and fname in SHIPPED_SUBSETS:
        # the shipped rows are exactly the ones kept below (tests/report/test_data.py checks it)
        subset, prefix = SHIPPED_SUBSETS[fname]
        P64, P32, y = load_real_file(subset, prefix, kind)
    else:
        P64, P32, y = load_real_file(fname, prefix, kind)
        idx = subsample_rows(y.shape[0])
        P64, P32, y = P64[idx], P32[idx], y[idx]
    return Dataset(name, np.ascontiguousarray(P64), y.copy(), np.ascontiguousarray(P32))


def dataset_or_skip(name):
    """Return the named dataset, skipping the test when its real data is missing."""
    return get_dataset(name)


# ------------------------------------------------------------------------------ fixtures
def _numba_param(item) -> bool:
    """Whether a parametrized test runs the numba backend ("numba" among its parameters)."""
    callspec = getattr(item, "callspec", None)
    values = callspec.params.values() if callspec is not None else ()
    flat = [x for v in values for x in (v if isinstance(v, tuple) else (v,))]
    return any(isinstance(x, str) and x == "numba" for x in flat)


def pytest_collection_modifyitems(config, items):
    """Mark ``realdata`` every test that takes the whole real-data folder (``data_dir``);
    without numba, skip the tests marked ``numba`` or parametrized with it."""
    for item in items:
        if "data_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.realdata)
        if not HAS_NUMBA and (item.get_closest_marker("numba") or _numba_param(item)):
            item.add_marker(pytest.mark.skip(reason=NO_NUMBA))


@pytest.fixture(scope="session")
def data_dir():
    """The whole real-data folder; skips (see skip_realdata) when it is missing."""
    if not real_data_available():
        skip_realdata(None)
    return DATA_DIR


@pytest.fixture(scope="session", params=ALL_NAMES, ids=ALL_NAMES)
def dataset(request) -> Dataset:
    """Every synthetic and real dataset (real ones skip when data is missing)."""
    return dataset_or_skip(request.param)


@pytest.fixture(scope="session", params=SYNTHETIC_NAMES, ids=SYNTHETIC_NAMES)
def synthetic_dataset(request) -> Dataset:
    """Every synthetic dataset."""
    return get_dataset(request.param)


@pytest.fixture(scope="session", params=REAL_NAMES, ids=REAL_NAMES)
def real_dataset(request) -> Dataset:
    """Every real dataset (skips without data)."""
    return dataset_or_skip(request.param)


@pytest.fixture(scope="session")
def real_k2() -> Dataset:
    """PneumoniaMNIST ResNet-50 (K = 2, logits), 300 rows."""
    return dataset_or_skip("real-pneumonia-K2")


@pytest.fixture(scope="session")
def real_k10() -> Dataset:
    """CIFAR-10 VGG-16 (K = 10, probs), 300 rows."""
    return dataset_or_skip("real-vgg16-K10")


@pytest.fixture(scope="session")
def real_k100() -> Dataset:
    """CIFAR-100 DenseNet-BC-100 (K = 100, probs), 300 rows."""
    return dataset_or_skip("real-densenet-K100")


@pytest.fixture(scope="session")
def syn_k3() -> Dataset:
    """Synthetic K = 3, n = 150."""
    return get_dataset("syn-K3-n150")


@pytest.fixture(scope="session")
def kdecal_module():
    """Import the package under test (a failing import is a real failure)."""
    import kdecal  # the package under test; a failing import is a real failure

    return kdecal


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def backend(request, kdecal_module) -> str:
    """Each concrete backend; skipped when kdecal.available_backends() lacks it."""
    available = list(kdecal_module.available_backends())
    if request.param not in available:
        pytest.skip(f"backend {request.param!r} not available (available: {available})")
    return request.param


@pytest.fixture(scope="session")
def both_backends(kdecal_module):
    """Skip unless both cpp and numba are available (for agreement tests)."""
    available = list(kdecal_module.available_backends())
    missing = [b for b in BACKENDS if b not in available]
    if missing:
        pytest.skip(f"backends {missing} not available (available: {available})")
    return tuple(BACKENDS)


# ------------------------------------------------------------- the plug-in estimator
#: Public functions that take ``estimator`` (default "residual").
ESTIMATOR_FUNCTIONS = (
    "estimate",
    "ece_kde",
    "calibration_error",
    "refinement",
    "sharpness",
    "calibration_test",
    "evaluate",
    "compare",
)


@pytest.fixture
def plugin_estimator(monkeypatch):
    """Make ``estimator="plugin"`` the default of the public kernel estimators.

    For the test modules that check the papers' plug-in estimators (Popordanoska et al.
    2022, 2024) against the brute force of ``tests/_reference.py``, which implements
    the plug-in ratio ``sum w y / sum w``: they keep calling ``kdecal.ece_kde(...)``
    etc. as before, and a test that passes ``estimator=`` itself keeps it. The
    residual-centred default is checked against its own brute force in
    ``tests/estimators/test_residual.py``.
    """
    import kdecal
    import kdecal._compare
    import kdecal._evaluate
    import kdecal.kde

    def plugin(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            kwargs.setdefault("estimator", "plugin")
            return fn(*args, **kwargs)

        return call

    for name in ESTIMATOR_FUNCTIONS:
        fn = getattr(kdecal, name)
        monkeypatch.setattr(kdecal, name, plugin(fn))
        for mod in (kdecal.kde, kdecal._compare, kdecal._evaluate):
            if getattr(mod, name, None) is fn:
                monkeypatch.setattr(mod, name, plugin(fn))
