"""Regenerate the README figures in docs/figures/ from the real prediction files.

Usage (from the repository root, with kdecal and matplotlib installed)::

    python scripts/make_readme_figures.py [--data-dir ../shared/data/real] [--out docs/figures]

Writes:

- ``reliability_cifar10.png``: ResNet-50 on CIFAR-10 (``cifar10_resnet50_psrcal.npz``,
  test split): top-label reliability diagram with 15 bins, the top-label leave-one-out
  Beta-kernel curve (h = 0.02) and the canonical Dirichlet-KDE view (LOO-MLE bandwidth).
- ``calibration_sharpness_cifar10.png``: calibration-sharpness diagrams (Chidambaram &
  Ge 2024, Brier, Gaussian sigma = 0.05) of four CIFAR-10 models.
- ``simplex_density_k3.png``: simplex binning beside the Dirichlet KDE for K = 3. No
  real file has three classes: the top row takes the VGG-16 CIFAR-10 predictions of
  the test images whose label is airplane, automobile or bird and renormalises their
  probabilities over these three classes (the model's conditional prediction given
  that the class is one of the three); the bottom row is the seeds' synthetic K = 3
  protocol (``kdecal.datasets.make_seeds_synthetic(3000, 3, t1=0.6, t2=0.6)``).
- ``bayes_risk_binary.png``: Bayes risk curves (Ferrer & Ramos 2025, Fig. 4) of the
  real binary systems (PneumoniaMNIST and AdrenalMNIST3D ResNet-50, GPT-2 zero- and
  4-shot on SST-2, the PLDA speaker-verification test trials), uniform and Brier
  weight.
- ``evaluate_page.png``: ``kdecal evaluate --plot`` on the bundled example.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from scipy.special import softmax

import kdecal
import kdecal.plot as kp
from kdecal.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
DPI = 100


def load(data_dir: Path, name: str, split: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Probabilities (float64, softmax of logits) and labels of one real file."""
    with np.load(data_dir / name) as d:
        key = f"{split}probs" if f"{split}probs" in d.files else f"{split}logits"
        scores = d[key].astype(np.float64)
        labels = d[f"{split}labels"].astype(np.int64)
    probs = scores / scores.sum(axis=1, keepdims=True) if "probs" in key else softmax(scores, 1)
    return probs, labels


def reliability(data_dir: Path, out: Path) -> None:
    """Write reliability_cifar10.png: binned, top-label kernel and canonical views."""
    P, y = load(data_dir, "cifar10_resnet50_psrcal.npz", "test_")
    fig, axs = plt.subplots(1, 3, figsize=(16, 5.6))
    fig.subplots_adjust(left=0.05, right=0.98, top=0.84, bottom=0.1, wspace=0.25)
    kp.reliability_diagram(P, y, ax=axs[0])
    kp.reliability_diagram(P, y, kind="kernel", bandwidth=0.02, ax=axs[1])
    rc = kp.reliability_diagram(P, y, kind="kernel", calibration="canonical", ax=axs[2])
    fig.suptitle(
        "ResNet-50, CIFAR-10 test (n = 10,000): binned, top-label kernel (Beta, h = 0.02) "
        f"and canonical Dirichlet-KDE view (LOO-MLE h = {rc.bandwidth:.2g})",
        fontsize="large",
    )
    fig.savefig(out / "reliability_cifar10.png", dpi=DPI)
    plt.close(fig)


def sharpness(data_dir: Path, out: Path) -> None:
    """Write calibration_sharpness_cifar10.png: four CIFAR-10 models."""
    models = [
        ("cifar10_resnet50_psrcal.npz", "test_", "ResNet-50"),
        ("cifar10_vgg16_keras_verifiedcal.npz", "", "VGG-16"),
        ("cifar10_resnet18_undertrained.npz", "", "ResNet-18 (under-trained)"),
        ("cifar10_lenet5_netcal.npz", "", "LeNet-5"),
    ]
    fig, axs = plt.subplots(1, 4, figsize=(20, 5.2))
    fig.subplots_adjust(left=0.04, right=0.99, top=0.84, bottom=0.11, wspace=0.22)
    for a, (name, split, label) in zip(axs, models):
        P, y = load(data_dir, name, split)
        acc = np.mean(P.argmax(1) == y)
        kp.calibration_sharpness_diagram(P, y, ax=a, title=f"{label} (accuracy {acc:.1%})")
    fig.suptitle(
        "Calibration-sharpness diagrams, CIFAR-10 test, Brier score, Gaussian kernel "
        r"$\sigma$ = 0.05 (Chidambaram & Ge 2024, Fig. 1)",
        fontsize="large",
    )
    fig.savefig(out / "calibration_sharpness_cifar10.png", dpi=DPI)
    plt.close(fig)


def simplex(data_dir: Path, out: Path) -> None:
    """Write simplex_density_k3.png: 3 real CIFAR-10 classes and the seeds' K = 3."""
    P, y = load(data_dir, "cifar10_vgg16_keras_verifiedcal.npz")
    keep = y < 3
    Q = P[keep][:, :3]
    Q = Q / Q.sum(axis=1, keepdims=True)
    h_auto = kdecal.select_bandwidth(Q)
    s = kdecal.datasets.make_seeds_synthetic(3000, 3, t1=0.6, t2=0.6, seed=0)
    fig = plt.figure(figsize=(11, 10))
    top = fig.subplots(
        1, 2, gridspec_kw={"left": 0.01, "right": 0.88, "top": 0.9, "bottom": 0.52, "wspace": 0.06}
    )
    bot = fig.subplots(
        1,
        2,
        gridspec_kw={"left": 0.01, "right": 0.88, "top": 0.43, "bottom": 0.03, "wspace": 0.06},
    )
    kp.simplex_density(
        Q,
        y[keep],
        bandwidth=0.01,
        resolution=200,
        ax=top,
        class_names=["airplane", "automobile", "bird"],
    )
    sd = kp.simplex_density(s.probs, s.labels, resolution=200, ax=bot)
    fig.text(
        0.45,
        0.975,
        f"VGG-16 on CIFAR-10, test images of 3 classes (n = {keep.sum()}), "
        "probabilities renormalised over the 3 classes",
        ha="center",
        fontsize="large",
    )
    fig.text(
        0.45,
        0.94,
        f"h = 0.01 for display (the LOO-MLE choice, {h_auto:.2g}, is too "
        "narrow to see at this scale)",
        ha="center",
        fontsize="medium",
    )
    fig.text(
        0.45,
        0.475,
        "seeds' synthetic protocol, K = 3, n = 3000, t1 = t2 = 0.6 "
        f"(LOO-MLE h = {sd.bandwidth:.2g})",
        ha="center",
        fontsize="large",
    )
    fig.savefig(out / "simplex_density_k3.png", dpi=DPI)
    plt.close(fig)


def bayes(data_dir: Path, out: Path) -> None:
    """Write bayes_risk_binary.png: the real binary systems, both weights."""
    files = [
        ("pneumoniamnist_resnet50.npz", "", "PneumoniaMNIST ResNet-50"),
        ("adrenalmnist3d_resnet50.npz", "", "AdrenalMNIST3D ResNet-50"),
        ("sst2_gpt2_zeroshot.npz", "", "SST-2 GPT-2 zero-shot"),
        ("sst2_gpt2_4shot.npz", "", "SST-2 GPT-2 4-shot"),
        ("speaker_verification_plda.npz", "test_", "speaker verification PLDA"),
    ]
    probs, labels = {}, {}
    for name, split, label in files:
        probs[label], labels[label] = load(data_dir, name, split)
    fig, axs = plt.subplots(1, 2, figsize=(15, 6.6))
    fig.subplots_adjust(left=0.05, right=0.99, top=0.88, bottom=0.27, wspace=0.15)
    kp.bayes_risk_curve(probs, labels, ax=axs[0])
    kp.bayes_risk_curve(probs, labels, weight="beta22", ax=axs[1])
    for a in axs:  # legends below the panels, clear of the curves
        a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize="small")
    fig.suptitle(
        "Bayes risk against the decision threshold, real binary systems "
        "(Ferrer & Ramos 2025, Eq. 34 and Fig. 4): area = cross-entropy (left), "
        "area = 1.5 x Brier (right)",
        fontsize="large",
    )
    fig.savefig(out / "bayes_risk_binary.png", dpi=DPI)
    plt.close(fig)


def page(out: Path) -> None:
    """Write evaluate_page.png: ``kdecal evaluate --plot`` on the bundled example."""
    with contextlib.redirect_stdout(io.StringIO()):  # the report table is on the page
        code = cli_main(["evaluate", "--quiet", "--plot", str(out / "evaluate_page.png")])
    if code != 0:
        raise SystemExit(code)


def main() -> None:
    """Write every figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "real")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    reliability(args.data_dir, args.out)
    sharpness(args.data_dir, args.out)
    simplex(args.data_dir, args.out)
    bayes(args.data_dir, args.out)
    page(args.out)
    for f in sorted(args.out.glob("*.png")):
        print(f"{f.name}: {f.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
