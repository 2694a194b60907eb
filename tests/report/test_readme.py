"""The README's Python examples run as written (on the bundled example data)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_has_examples():
    assert len(_python_blocks()) >= 5


@pytest.mark.slow
def test_readme_examples_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KDECAL_PROGRESS", "0")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    import kdecal

    # names the later snippets take from the earlier ones or from the reader's context
    with np.load(ROOT / "python/kdecal/data/cifar10_vgg16_keras_verifiedcal.npz") as d:
        p, y = d["probs"].astype(np.float64), d["labels"]
    logits = np.log(np.maximum(p, 1e-12))
    ns = {
        "kdecal": kdecal,
        "np": np,
        "logits": logits,
        "val_logits": logits[:5000],
        "val_labels": y[:5000],
        "test_logits": logits[5000:],
    }
    for block in _python_blocks():
        if "kdecal.torch" in block:  # needs the reader's model and data
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kdecal.KdecalWarning)
            exec(compile(block, "README.md", "exec"), ns)  # noqa: S102
    plt.close("all")
    assert 0 < ns["h"] < 10  # the regression bandwidth of the bundled example: 1.78
    assert isinstance(ns["report"], kdecal.CalibrationReport)
    assert ns["calibrated"].shape == (5000, 10)
