"""Sphinx configuration of the kdecal documentation.

Build (from the repository root, after ``pip install ".[docs]"``)::

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# The gallery scripts and autodoc import kdecal: no progress bars in the build log.
os.environ.setdefault("KDECAL_PROGRESS", "0")
# Render the gallery's figures without a display.
os.environ.setdefault("MPLBACKEND", "Agg")

import kdecal  # after the environment above

# docs/_ext: the gallery's scraper for figures that pyplot does not manage.
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "kdecal"
author = "kdecal developers"
copyright = "kdecal developers"
version = release = kdecal.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**/README.md", "examples/GALLERY_HEADER.rst"]
templates_path = ["_templates"]
# docs/architecture.md (the layer picture) is listed in the index's "Background" toctree;
# until that file exists, the entry is dropped (see setup() below).
_HAS_ARCHITECTURE = (Path(__file__).resolve().parent / "architecture.md").is_file()

# --- MyST: the README's sections are included as pages; the math page uses $...$ ---
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# --- API reference: autosummary + autodoc + numpydoc ---
autosummary_generate = True
autosummary_ignore_module_all = False  # a module's public members are its __all__
autosummary_imported_members = True
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"  # the numpydoc "Parameters" sections carry the types
numpydoc_show_class_members = False  # the class templates list members with autodoc
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
# Fail the build on a public object without a docstring (GL08) and on a documented
# parameter that the signature does not have (PR02). Constants are skipped: numpydoc
# would validate the docstring of their type (float, ndarray, dict).
numpydoc_validation_checks = {"GL08", "PR02"}
numpydoc_validation_exclude = {r"^kdecal(\.\w+)*\.[A-Z][A-Z0-9_]*$"}

# kdecal.torch needs PyTorch (an optional dependency): document it from mocks when
# torch is not installed, so the site builds on machines without it.
if importlib.util.find_spec("torch") is None:
    autodoc_mock_imports = ["torch"]

# --- sphinx-gallery: docs/examples/plot_*.py, run at build time ---
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "image_scrapers": ("kdecal_gallery.unmanaged_figure_scraper", "matplotlib"),
    "reset_modules": ("matplotlib",),
    "matplotlib_animations": False,
    "show_memory": False,
}

# --- HTML ---
html_theme = "pydata_sphinx_theme"
html_title = f"kdecal {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}


def _drop_missing_architecture(app: object, docname: str, source: list[str]) -> None:
    """Remove the index's ``architecture`` toctree entry while the page does not exist."""
    if docname == "index" and not _HAS_ARCHITECTURE:
        source[0] = source[0].replace("\narchitecture\n", "\n")


def _constant_doc(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """Document a constant re-exported by a kdecal module with its ``#:`` comment.

    autodoc looks for the comment in the module the constant is documented under (e.g.
    ``kdecal`` for ``kdecal.PROB_EPS``), not where it is defined, and otherwise shows
    the docstring of the value's type (float, ndarray), which is dropped when no comment
    is found. Scalars get their value.
    """
    if what != "data" or not name.startswith("kdecal."):
        return
    from sphinx.errors import PycodeError
    from sphinx.pycode import ModuleAnalyzer

    attr = name.rsplit(".", 1)[1]
    doc = None
    for modname in sorted(m for m in sys.modules if m.split(".")[0] == "kdecal"):
        if getattr(sys.modules[modname], attr, None) is not obj:
            continue
        try:
            doc = ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", attr))
        except PycodeError:  # an extension module has no source to parse
            continue
        if doc:
            break
    lines[:] = [line.rstrip("\n") for line in doc or []]
    if isinstance(obj, (int, float, str)):
        lines.extend(["", f"Value: ``{obj!r}``."])


def setup(app: object) -> None:
    """Connect the hooks of this configuration."""
    app.connect("source-read", _drop_missing_architecture)  # type: ignore[attr-defined]
    app.connect("autodoc-process-docstring", _constant_doc)  # type: ignore[attr-defined]
