"""Image scraper for the gallery: figures built outside pyplot.

:func:`kdecal.plot.evaluation_page` returns a ``matplotlib.figure.Figure`` that pyplot
does not manage (so that a script or server can build many without leaking them), and
sphinx-gallery's matplotlib scraper only sees pyplot's figures. This scraper saves every
such figure that an example's code block leaves in the example's namespace, once.
"""

from __future__ import annotations

from typing import Any


def unmanaged_figure_scraper(block: Any, block_vars: dict[str, Any], gallery_conf: Any) -> str:
    """Save the figures that pyplot does not manage, once each; return their reST.

    Runs before the matplotlib scraper, which closes pyplot's figures (their manager is
    then None too): every figure is recorded the first time it is seen, managed or not,
    and only those unmanaged at that time are saved.
    """
    from matplotlib.figure import Figure
    from sphinx_gallery.scrapers import figure_rst

    seen = block_vars.setdefault("kdecal_seen_figures", [])
    paths = []
    for value in list(block_vars["example_globals"].values()):
        if not isinstance(value, Figure) or any(value is s for s in seen):
            continue
        seen.append(value)
        if value.canvas.manager is None:
            path = block_vars["image_path_iterator"].next()
            value.savefig(path, dpi=value.dpi)
            paths.append(path)
    return figure_rst(paths, gallery_conf["src_dir"])
