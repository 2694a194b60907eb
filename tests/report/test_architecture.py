"""The package's layers (docs/architecture.md): no import cycle, no import of kdecal's
own modules inside a function, and no import from a higher layer; the public namespace
(deprecated aliases) and the one table of quantities.

The imports are read from the source with ``ast`` (nothing is imported), so a test
that fails names the module, the line and the import.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import kdecal
from kdecal._estimation import quantities as q

ROOT = Path(kdecal.__file__).resolve().parent

#: The layers of docs/architecture.md, from the bottom: a module may import modules of
#: its own layer or of the layers below (never above).
LAYERS: list[set[str]] = [
    {
        "warnings",
        "tolerances",
        "_validation",
        "_formulas",
        "_debias",
        "_numerics",
        "_io",
        "datasets",
    },
    {"_engine", "_engine.runtime"},
    {"_engine.cpp", "_engine.numba", "_engine.numba_binary", "_engine.cuda", "_engine.dask"},
    {"_engine.engines"},
    {"_engine.binary"},
    {"_engine.backends"},
    {"_estimation", "_estimation.problem"},
    {"_estimation.search"},
    {"_estimation.regression"},
    {"_estimation.generators"},
    {"_estimation.quantities"},
    {"_estimation.replicates", "_report"},
    {"_calibration_estimate"},
    {"binned", "recalibration", "scores", "resampling", "smooth", "skce"},
    {"kde", "_row_metrics"},
    {"_evaluate"},
    {"curves", "_compare", "torch"},
    {"plot"},
    {"cli"},
    {""},  # the package itself (kdecal/__init__.py)
]


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _layer(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"module kdecal.{name} is on no layer of LAYERS (add it)")


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """Kdecal modules imported by a module: (module, line, inside a function)."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [p for p in package if p]
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(fn) if n is not fn)
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "kdecal":
                base, node_module = [], node.module.split(".", 1)[1:]
                targets = [".".join(node_module)] if node_module else []
                if not node_module:
                    targets = [a.name for a in node.names]
                found += [(t, node.lineno, id(node) in inside) for t in targets]
                continue
            else:
                continue
            mod = ".".join([*base, *([node.module] if node.module else [])])
            for a in node.names:
                cand = f"{mod}.{a.name}" if mod else a.name
                if (ROOT / (cand.replace(".", "/") + ".pyi")).exists():
                    continue  # the compiled core (kdecal._core, typed by its stub)
                targets.append(cand if cand in MODULES else mod)
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".", 1)[1] for a in node.names if a.name.startswith("kdecal.")]
        found += [(t, node.lineno, id(node) in inside) for t in targets if t in MODULES]
    return [f for f in found if f[0] != name]


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_is_on_a_layer():
    for name in MODULES:
        _layer(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_down_and_at_module_level(name):
    for target, line, in_function in GRAPH[name]:
        where = f"kdecal.{name or '__init__'} line {line}: import of kdecal.{target}"
        assert not in_function, f"{where} inside a function (move it to the top)"
        assert _layer(target) <= _layer(name), f"{where} runs up a layer"


def test_no_import_cycle():
    edges = {n: {t for t, _, _ in GRAPH[n]} for n in MODULES}
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for t in sorted(edges[n]):
            if state.get(t) == 1:
                cycle = [*path[path.index(t) :], t] if t in path else [n, t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t, [*path, t])
        state[n] = 2

    for n in sorted(MODULES):
        if n not in state:
            visit(n, [n])


# ------------------------------------------------------------------ the public namespace


@pytest.mark.parametrize(
    "name",
    ["INFER_ROW_SUM_ATOL", "MIN_BANDWIDTH", "PROBS_ROW_SUM_ATOL", "PROB_EPS", "ROW_SUM_ATOL"],
)
def test_tolerances_moved_with_deprecated_aliases(name):
    """The tolerance constants live in kdecal.tolerances; the old names warn for a release."""
    assert name not in kdecal.__all__ and name not in dir(kdecal)
    with pytest.warns(DeprecationWarning, match=f"kdecal.tolerances.{name}"):
        value = getattr(kdecal, name)
    assert value == getattr(kdecal.tolerances, name)


def test_ece_alias_is_deprecated():
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(3), 200)
    y = rng.integers(0, 3, 200)
    est = kdecal.estimate(P, y, bandwidth=0.1)
    with pytest.warns(DeprecationWarning, match="ece_kde"):
        old = est.ece(1)
    assert old == est.ece_kde(1) == est.value("ece_kde_l1")


def test_quantity_table_routes_every_quantity():
    """Each quantity of the table reads the estimate its divergence names (one table)."""
    assert list(kdecal.QUANTITIES) == [
        f.name for f in dataclasses.fields(kdecal.CalibrationReport) if f.name in q.QUANTITIES
    ]
    for name, quantity in q.QUANTITIES.items():
        assert quantity.name == name
        assert quantity.squares == name.endswith("_l2")
        assert quantity.fit == {"l1": "main", "l2": "sq", "kl": "kl"}[quantity.divergence]
        assert quantity.criterion == ("log" if name.endswith("_kl") else "brier")
    assert q.divergence_of("kl") is q.DIVERGENCES["kl"]
    custom = q.divergence_of(kdecal.Bregman(lambda P: (P * P).sum(1), lambda P: 2 * P, "sq"))
    assert (custom.fit, custom.criterion, custom.residual_kind) == ("main", "brier", "lp")
    with pytest.raises(ValueError, match="divergence must be"):
        q.divergence_of("l1")
