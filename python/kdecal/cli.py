"""Command-line interface: ``kdecal evaluate [FILE] ...``.

Examples
--------
Evaluate the bundled CIFAR-10 example::

    kdecal evaluate

Evaluate the test split of a file holding ``val_logits``/``test_logits`` and
print JSON::

    kdecal evaluate preds.npz --split test --json

Also write a one-page figure (reliability and calibration-sharpness diagrams and the
metrics table; needs ``pip install 'kdecal[plot]'``)::

    kdecal evaluate preds.npz --plot page.png

Exit status: 0 on success, 2 on a usage error or a problem with the input
(reported as one line ``kdecal: error: ...`` on stderr), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Sequence

import numpy as np

from ._io import InputFileError, bundled_example_path, load_predictions

__all__ = ["main"]

_PROG = "kdecal"


class _ArgumentParser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{_PROG}: error: {' '.join(message.split())}\n")


def _bandwidth(text: str) -> float | str:
    """Parse ``--bandwidth``: ``auto`` or a positive finite number."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bandwidth must be 'auto' or a positive number, got {text!r}"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"bandwidth must be 'auto' or a positive number, got {text!r}"
        )
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kdecal")
    except PackageNotFoundError:  # not installed (e.g. running from a source tree)
        import kdecal

        return str(getattr(kdecal, "__version__", "unknown"))


def _build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog=_PROG,
        description=(
            "Kernel-density (Dirichlet KDE) estimates of calibration errors of "
            "classifier predictions."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    ev = sub.add_parser(
        "evaluate",
        help="compute all calibration metrics of a predictions file",
        description=(
            "Compute ECE^KDE (L1, L2), proper calibration errors (KL, L2), refinement, "
            "sharpness, accuracy, log loss, Brier score and binned ECE for a file of "
            "scores and labels. Without FILE, the bundled CIFAR-10 example "
            "(VGG-16, 10,000 test images) is evaluated."
        ),
        epilog=(
            "File formats: .npz (probs or logits, and labels; or val_/test_ prefixed "
            "keys), .npy (X.npy with X_labels.npy or labels.npy in the same folder), "
            ".csv and .parquet (a 'label' or 'labels' column; the other numeric columns "
            "are the scores, one per class; a single score column is binary P(y=1)). "
            "Errors are reported as fractions, not percent."
        ),
    )
    ev.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="predictions file (.npz, .npy, .csv, .parquet); default: the bundled example",
    )
    ev.add_argument(
        "--split",
        choices=("val", "test"),
        help="split to read from a .npz file with val_/test_ keys (default: test)",
    )
    kind = ev.add_mutually_exclusive_group()
    kind.add_argument(
        "--logits",
        dest="logits",
        action="store_const",
        const=True,
        default=None,
        help="the scores are logits (softmax is applied; sigmoid for one binary column)",
    )
    kind.add_argument(
        "--probs",
        dest="logits",
        action="store_const",
        const=False,
        help="the scores are probabilities (default: inferred from the key name or values)",
    )
    ev.add_argument(
        "--bandwidth",
        type=_bandwidth,
        default="auto",
        metavar="auto|FLOAT",
        help="Dirichlet kernel bandwidth, or 'auto' for leave-one-out likelihood selection "
        "(default: auto)",
    )
    ev.add_argument(
        "--backend",
        choices=("auto", "cpp", "numba"),
        default="auto",
        help="computation engine (default: auto)",
    )
    ev.add_argument(
        "--calibration",
        choices=("canonical", "classwise", "top_label"),
        default="canonical",
        help="notion of calibration of the kernel estimators (default: canonical)",
    )
    ev.add_argument(
        "--debias",
        choices=("none", "ustat", "ratio"),
        default="none",
        help="debiasing of the kernel ratios: Eq. 7 U-statistics or the O(n^-2) "
        "geometric-series correction (default: none)",
    )
    ev.add_argument("--json", action="store_true", help="print the report as JSON")
    ev.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also write a one-page figure: top-label and canonical-KDE reliability "
        "diagrams, the calibration-sharpness diagram and the metrics table (any format "
        "matplotlib writes, by extension; needs pip install 'kdecal[plot]')",
    )
    ev.add_argument("--quiet", action="store_true", help="do not show a progress bar")
    return parser


def _to_probs(scores: np.ndarray, is_logits: bool) -> np.ndarray:
    """Turn logits into probabilities (softmax, or sigmoid for one binary column)."""
    if not is_logits:
        return scores
    if scores.ndim == 1:
        from scipy.special import expit

        return expit(scores)
    import kdecal

    return kdecal.softmax(scores, axis=-1)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Print a warning as one line ``kdecal: warning: ...`` on stderr."""
    print(f"{_PROG}: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _run_evaluate(args: argparse.Namespace) -> int:
    if args.file is None:
        path = bundled_example_path()
        prefix = "bundled example "
    else:
        path = args.file
        prefix = ""
    scores, labels, is_logits, description = load_predictions(
        path, split=args.split, logits=args.logits
    )
    probs = _to_probs(scores, is_logits)
    if args.plot is not None:  # fail before the long computation, not after it
        _check_plot_target(args.plot)
    with warnings.catch_warnings():
        # Show each warning once, as one line, as soon as it is raised.
        warnings.simplefilter("default")
        warnings.showwarning = _show_warning
        import kdecal

        report = kdecal.evaluate(
            probs,
            labels,
            bandwidth=args.bandwidth,
            calibration=args.calibration,
            debias=args.debias,
            backend=args.backend,
            progress=False if args.quiet else None,  # None: a bar for long work only
            source=f"{prefix}{description}",
        )
        if args.plot is not None:
            from .plot import evaluation_page

            fig = evaluation_page(probs, labels, report=report, backend=args.backend)
            fig.savefig(args.plot)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(str(report))
    return 0


def _check_plot_target(path: str) -> None:
    """Check that ``--plot`` can be honoured: matplotlib, the folder, the file type."""
    try:
        from .plot import require_matplotlib

        require_matplotlib()
    except ImportError as exc:
        raise ValueError(f"--plot: {exc}") from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--plot: folder {folder!r} does not exist")
    from matplotlib.figure import Figure

    ext = os.path.splitext(path)[1][1:].lower()
    supported = Figure().canvas.get_supported_filetypes()
    if ext and ext not in supported:
        raise ValueError(
            f"--plot: unsupported file type {ext!r} (supported: {', '.join(sorted(supported))})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kdecal`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success, 2 for a usage error or bad input (one line
        ``kdecal: error: <message>`` on stderr), 130 if interrupted. The
        console script ``kdecal`` calls ``sys.exit(main())``.
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            f"{_PROG}: error: a command is required (available: evaluate)",
            file=sys.stderr,
        )
        return 2
    try:
        return _run_evaluate(args)
    except (
        InputFileError,
        ValueError,
        TypeError,
        NotImplementedError,
        FileNotFoundError,
    ) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{_PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
