"""Command-line interface: ``kdecal evaluate [FILE] ...`` and ``kdecal compare FILE ...``.

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

Compare two models' calibration on the same labels (paired bootstrap)::

    kdecal compare model_a.npz model_b.npz --json

Exit status: 0 on success; 2 on a usage error, a problem with the input or an
output that cannot be written (a closed or full standard output), reported as one line
``kdecal: error: ...`` on stderr; 1, also as one line, for an internal error (a defect
of kdecal; never a traceback); 130 when interrupted; 141 (quietly, like other Unix
tools) when the reader of a pipe goes away (``kdecal evaluate | head``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ._compare import ROW_METRICS, compare
from ._estimation.problem import CALIBRATIONS as _NOTIONS
from ._estimation.quantities import QUANTITIES
from ._io import bundled_example_path, load_predictions
from ._validation import SOFTMAX_ADVICE, Probs, check_labels, check_probs
from .plot import evaluation_page, require_matplotlib
from .warnings import UnreliableEstimateWarning

__all__ = ["main"]

_PROG = "kdecal"


class _ArgumentParser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{_PROG}: error: {' '.join(message.split())}\n")


def _plain_number(text: str) -> str:
    """``text`` if it is written in ASCII without digit separators, else a ValueError.

    Python's ``float`` and ``int`` also read ``1_0`` as 10 and full-width or other
    non-ASCII digits; an option value such as ``--seed 1_0`` is refused instead.
    """
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return text


def _bandwidth(text: str) -> float | str:
    """Parse ``--bandwidth``: ``auto``, ``loo-mle`` or a positive finite number."""
    if text.strip().lower() in ("auto", "loo-mle"):
        return text.strip().lower()
    try:
        value = float(_plain_number(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bandwidth must be 'auto', 'loo-mle' or a positive number, got {text!r}"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"bandwidth must be 'auto', 'loo-mle' or a positive number, got {text!r}"
        )
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(_plain_number(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _metric_list(text: str) -> tuple[str, ...]:
    """Parse ``--metrics``: comma-separated kernel quantities and row metrics."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    known = (*QUANTITIES, *ROW_METRICS)
    bad = [t for t in names if t not in known]
    if not names or bad:
        what = f"unknown {', '.join(map(repr, bad))} in {text!r}" if bad else f"got {text!r}"
        raise argparse.ArgumentTypeError(
            f"expected comma-separated metrics of {', '.join(known)}; {what}"
        )
    return names


def _notion_list(text: str) -> tuple[str, ...]:
    """Parse ``--notions``: comma-separated notions of calibration, or ``none``."""
    if text.strip() == "none":
        return ()
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in _NOTIONS]
    if not names or bad:
        what = f"unknown {', '.join(map(repr, bad))} in {text!r}" if bad else f"got {text!r}"
        raise argparse.ArgumentTypeError(
            f"expected comma-separated notions of {', '.join(_NOTIONS)}, or none; {what}"
        )
    return tuple(dict.fromkeys(names))


def _resample_list(text: str) -> tuple[str, ...] | str:
    """Parse ``--resample-notions``: ``auto``, ``none`` or comma-separated notions."""
    return "auto" if text.strip() == "auto" else _notion_list(text)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kdecal")
    except PackageNotFoundError:  # not installed (e.g. running from a source tree)
        import kdecal

        return str(getattr(kdecal, "__version__", "unknown"))


def _add_input_and_kernel_args(p: argparse.ArgumentParser) -> None:
    """Add the options of ``evaluate`` and ``compare``: reading a file, the kernel."""
    p.add_argument(
        "--split",
        metavar="NAME",
        help="split to read from a .npz file with NAME_probs / NAME_logits and NAME_labels "
        "keys, e.g. val or test (default: test, or the file's only split)",
    )
    kind = p.add_mutually_exclusive_group()
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
    p.add_argument(
        "--bandwidth",
        type=_bandwidth,
        default="auto",
        metavar="auto|loo-mle|FLOAT",
        help="Dirichlet kernel bandwidth; 'auto': minimise the leave-one-out Brier risk "
        "of the kernel regression of the labels (residual estimator: the L2 and KL "
        "quantities at half of it; plugin: the log risk for the KL quantities); "
        "'loo-mle': the papers' leave-one-out likelihood of the predictions' density; "
        "compare evaluates every model at one bandwidth, the models' own choice with the "
        "best pooled criterion (default: auto)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "cpp", "numba", "cuda", "dask"),
        default="auto",
        help="computation engine; 'cuda' runs the kernel passes on an NVIDIA GPU "
        "(pip install 'kdecal[cuda]'); 'dask' on a Dask cluster, see --scheduler "
        "(default: auto)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="with --backend dask: address of an existing Dask scheduler (e.g. "
        "tcp://head:8786); default: a local cluster with one worker process per core",
    )
    p.add_argument(
        "--calibration",
        choices=("auto", "canonical", "classwise", "top_label"),
        default="auto",
        help="notion of calibration of the kernel estimators; auto: canonical up to 10 "
        "classes, top_label beyond, where no canonical kernel estimate can tell a "
        "calibrated model from a miscalibrated one (default: auto)",
    )
    p.add_argument(
        "--estimator",
        choices=("residual", "plugin"),
        default="residual",
        help="regression of E[y|f]: 'residual' smooths the residuals y - f (unbiased "
        "squared L2 under calibration); 'plugin' the papers' ratio of the smoothed labels "
        "(default: residual)",
    )


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
            "sharpness, accuracy, log loss, Brier score, the calibration loss, the binned "
            "(plain, debiased, maximum) and smooth ECE for a file of scores and labels, "
            "and a table of the kernel estimates per notion (canonical, top-label, "
            "class-wise) with bootstrap intervals and a calibration test. Without FILE, "
            "the bundled CIFAR-10 example (VGG-16, 10,000 test images) is evaluated."
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
    _add_input_and_kernel_args(ev)
    ev.add_argument(
        "--debias",
        choices=("none", "ustat", "ratio"),
        default="ustat",
        help="debiasing of the squared errors: U-statistics (of the residuals; Eq. 7 "
        "with --estimator plugin), none, or the O(n^-2) geometric-series correction "
        "(ratio: with --estimator plugin only) (default: ustat)",
    )
    ev.add_argument(
        "--n-resamples",
        type=_nonneg_int,
        default=100,
        metavar="N",
        help="bootstrap replicates and resampled label sets for the intervals and the "
        "calibration test of each notion; 0 skips them, else at least 2 (default: 100)",
    )
    ev.add_argument(
        "--seed", type=_nonneg_int, default=0, help="seed of the resampling (default: 0)"
    )
    ev.add_argument(
        "--metrics",
        type=_metric_list,
        default=None,
        metavar="M[,M...]",
        help="report only these, comma-separated, in this order: kernel quantities ("
        + ", ".join(QUANTITIES)
        + ") and top-label metrics without a kernel ("
        + ", ".join(ROW_METRICS)
        + "), the names of compare --metrics; the notion table (and its resampling) "
        "only with ece_kde_l1 or ce_l2 (default: the full report)",
    )
    ev.add_argument(
        "--notions",
        type=_notion_list,
        default=None,
        metavar="N[,N...]",
        help="notions summarised in the notion table (estimate, bandwidth), comma-separated "
        "of canonical, top_label, classwise, or none; auto: all three up to 10 classes, "
        "top_label and classwise beyond, and the --calibration notion if it is not "
        "among them (default: auto)",
    )
    ev.add_argument(
        "--resample-notions",
        type=_resample_list,
        default="auto",
        metavar="N[,N...]",
        help="notions that also get bootstrap intervals and the calibration test, "
        "comma-separated, or none, each one of --notions (the --calibration notion "
        "always does when it is one of them); auto: "
        "canonical and top_label, canonical only where its dense resampling stays "
        "small (n <= 20,000 and n^2 (K + 3) <= 1.1e10), else a note says what it "
        "would cost (default: auto)",
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

    cp = sub.add_parser(
        "compare",
        help="compare several models' calibration on the same labels",
        description=(
            "Estimate the calibration errors of several prediction files that share their "
            "labels, with bootstrap intervals and paired bootstrap differences between "
            "every pair of models (is the difference significant?)."
        ),
    )
    cp.add_argument("files", nargs="+", metavar="FILE", help="prediction files (see evaluate)")
    _add_input_and_kernel_args(cp)
    cp.add_argument(
        "--n-resamples",
        type=_nonneg_int,
        default=200,
        metavar="N",
        help="paired bootstrap samples, at least 2 (default: 200)",
    )
    cp.add_argument(
        "--seed", type=_nonneg_int, default=0, help="seed of the bootstrap (default: 0)"
    )
    cp.add_argument(
        "--metrics",
        type=_metric_list,
        default=("ece_kde_l1", "ce_l2"),
        metavar="M[,M...]",
        help="what to compare, comma-separated: kernel quantities ("
        + ", ".join(QUANTITIES)
        + ") and metrics without a kernel (top-label: "
        + ", ".join(ROW_METRICS)
        + "); default: ece_kde_l1,ce_l2",
    )
    cp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cp.add_argument(
        "--quiet", action="store_true", help="do not show a progress bar (as KDECAL_PROGRESS=0)"
    )
    return parser


def _to_probs(scores: np.ndarray, is_logits: bool, path: object) -> Probs:
    """Turn scores into validated probabilities (logits: softmax, or sigmoid for one column).

    Validated here, once, as the Python API validates an array (entries just outside
    [0, 1] clipped and rows that do not quite sum to 1, rounded files, renormalised,
    each with a warning that says by how much), and passed on as the validated object,
    which the public functions take as it is: the report of a file is that of
    ``kdecal.evaluate`` on its array, bit for bit (clipping at ``PROB_EPS`` before the
    renormalisation included). Errors name the file, and say what to do if the scores
    are logits after all (a ``probs`` key holding logits): ``--logits``.
    """
    if is_logits:
        if scores.ndim == 1:
            from scipy.special import expit

            return check_probs(expit(scores), "probs", min_n=1)
        import kdecal

        return check_probs(kdecal.softmax(scores, axis=-1), "probs", min_n=1)
    try:  # raises, or warns when clipping or renormalising
        return check_probs(scores, "probs", min_n=1)
    except ValueError as exc:
        # every value error of check_probs here (a negative entry, one above 1, rows far
        # from summing to 1) is what logits read as probabilities look like; its advice
        # is the Python API's (kdecal.softmax)
        text = _one_line(exc).replace(SOFTMAX_ADVICE, "").rstrip(". ")
        raise ValueError(f"{path}: {text}; if the scores are logits, pass --logits") from None


#: Keywords of the Python API that messages of the library name, and the options of
#: the command line that the errors and warnings it prints name instead.
_CLI_ADVICE = ((SOFTMAX_ADVICE, "If the scores are logits, pass --logits."),)


def _cli_words(text: str) -> str:
    """Put a library message in the words of the command line (options, not keywords)."""
    for api, cli in _CLI_ADVICE:
        text = text.replace(api, cli)
    if text.startswith("n_resamples "):  # kdecal.evaluate's and compare's own checks
        text = "--n-resamples" + text[len("n_resamples") :]
    if text.startswith(f"{_PROG}: "):  # the library's own prefix, after the command's
        text = text[len(_PROG) + 2 :]
    return text


def _check_rows(probs: Probs, labels: np.ndarray, path: object) -> None:
    """Check the file's labels against its classes and its row count, naming the file.

    (The same checks in :func:`kdecal.evaluate` and :func:`kdecal.compare` named no file.)
    """
    try:
        check_labels(labels, probs.n, probs.n_classes)
        if probs.n < 3:
            raise ValueError(f"probs needs at least 3 samples, got n = {probs.n}")
    except ValueError as exc:
        raise ValueError(f"{path}: {_one_line(exc)}") from None


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Print a warning as one line ``kdecal: warning: ...`` on stderr."""
    print(f"{_PROG}: warning: {_cli_words(' '.join(str(message).split()))}", file=sys.stderr)


def _once(show: Callable[..., None]) -> Callable[..., None]:
    """Wrap a ``warnings.showwarning``: a text shown already is not shown again.

    The "default" filter shows a warning once per text, category and line of the
    caller, but Python clears that record whenever the filters change, as kdecal's own
    ``warnings.catch_warnings()`` blocks do: ``kdecal evaluate`` printed "the bandwidth
    search (brier criterion) chose h = 10, ..." once per notion, word for word.
    """
    seen: set[tuple[str, type[Warning]]] = set()

    def shown_once(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        key = (" ".join(str(message).split()), category)
        if key not in seen:
            seen.add(key)
            show(message, category, *rest, **kw)

    return shown_once


@contextlib.contextmanager
def _naming_file(path: object) -> Iterator[None]:
    """Prefix the warnings shown meanwhile, about the contents of ``path``, with its name.

    ``compare`` reads several files: "probs: 32 of 300 rows do not sum to 1" must say
    which. Used inside a ``warnings.catch_warnings()`` block, which restores the
    original ``warnings.showwarning`` at its end.
    """
    show = warnings.showwarning

    def named(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        show(f"{path}: {' '.join(str(message).split())}", category, *rest, **kw)

    warnings.showwarning = named
    try:
        yield
    finally:
        warnings.showwarning = show


def _run_evaluate(args: argparse.Namespace) -> int:
    if args.file is None:
        path = bundled_example_path()
        prefix = "bundled example "
    else:
        path = args.file
        prefix = ""
    if args.plot is not None:  # fail before the long computation, not after it
        _check_plot_target(args.plot, Path(path).stem)
    # the unreliable-estimate warnings are notes of the report too: held back, and shown
    # on stderr only if the report does not print them (not twice)
    held: list[str] = []

    def show(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        if issubclass(category, UnreliableEstimateWarning):
            held.append(" ".join(str(message).split()))
        else:
            _show_warning(message, category, *rest, **kw)

    with warnings.catch_warnings():
        # Show each warning once, as one line, as soon as it is raised.
        warnings.simplefilter("default")
        warnings.showwarning = _once(show)
        with _naming_file(path):
            scores, labels, is_logits, description = load_predictions(
                path, split=args.split, logits=args.logits
            )
            probs = _to_probs(scores, is_logits, path)
            _check_rows(probs, labels, path)
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
            n_resamples=args.n_resamples,
            seed=args.seed,
            estimator=args.estimator,
            metrics=args.metrics,
            resample_notions=args.resample_notions,
            **({} if args.notions is None else {"notions": args.notions}),
        )
        if args.plot is not None:
            page_probs = probs.p[:, 1] if probs.binary else probs.p  # the file's form
            fig = evaluation_page(page_probs, labels, report=report, backend=args.backend)
            fig.savefig(args.plot)
    notes = " ".join(" ".join(report.notes).split()).lower()
    for text in held:
        why = text.split(": ", 1)[1] if text.startswith("kdecal.") else text
        if why.rstrip(".").lower() not in notes:
            print(f"{_PROG}: warning: {_cli_words(text)}", file=sys.stderr)
    if args.json:  # with --metrics, what the table prints, not every field of the report
        _emit(json.dumps(report._selection_dict(), indent=2, allow_nan=False))
    else:
        _emit(str(report))
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    models: dict[str, Probs] = {}
    labels = None
    for path, name in zip(args.files, _model_names(args.files)):
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            with _naming_file(path):
                scores, y, is_logits, _ = load_predictions(
                    path, split=args.split, logits=args.logits
                )
                probs = _to_probs(scores, is_logits, path)
                _check_rows(probs, y, path)
        if labels is None:
            labels = y
        elif y.shape != labels.shape or not np.array_equal(y, labels):
            raise ValueError(
                f"{path}: its labels differ from those of {args.files[0]}; compare needs "
                "every model's predictions on the same labels"
            )
        models[name] = probs
    with warnings.catch_warnings(), _progress_off(args.quiet):
        warnings.simplefilter("default")
        warnings.showwarning = _once(_show_warning)
        result = compare(
            models,
            labels,
            calibration=args.calibration,
            bandwidth=args.bandwidth,
            n_resamples=args.n_resamples,
            seed=args.seed,
            backend=args.backend,
            estimator=args.estimator,
            quantities=args.metrics,
        )
    _emit(json.dumps(result.to_dict(), indent=2, allow_nan=False) if args.json else str(result))
    return 0


@contextlib.contextmanager
def _progress_off(quiet: bool) -> Iterator[None]:
    """With ``quiet``, no progress bar while the block runs (``KDECAL_PROGRESS=0``)."""
    if not quiet:
        yield
        return
    before = os.environ.get("KDECAL_PROGRESS")
    os.environ["KDECAL_PROGRESS"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["KDECAL_PROGRESS"]
        else:
            os.environ["KDECAL_PROGRESS"] = before


def _model_names(paths: Sequence[str]) -> list[str]:
    """Name each model by its file name, with as many parent folders as tell it apart.

    ``dir1/preds.npz`` and ``dir2/preds.npz`` become ``dir1/preds.npz`` and
    ``dir2/preds.npz`` (the shortest suffixes of their absolute paths that differ), where
    ``a.npz`` and ``b.npz`` stay ``a.npz`` and ``b.npz``; a file named twice gets a
    prime (``a.npz'``) the second time.
    """
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    names: list[str] = []
    for own in parts:
        others = [p for p in parts if p != own]
        depth = 1
        while depth < len(own) and any(p[-depth:] == own[-depth:] for p in others):
            depth += 1
        name = "/".join(own[-depth:])
        while name in names:
            name += "'"
        names.append(name)
    return names


class _OutputError(Exception):
    """Standard output could not be written (closed, full, or a failing device)."""


def _emit(text: str) -> None:
    """Write the result to standard output and flush it, so that write errors surface here."""
    if sys.stdout is None:
        raise _OutputError("standard output is closed")
    try:
        try:
            sys.stdout.write(text + "\n")
        except UnicodeEncodeError:
            # a terminal or PYTHONIOENCODING that cannot show a character (a file name,
            # a class name): print it escaped rather than nothing
            enc = getattr(sys.stdout, "encoding", None) or "ascii"
            sys.stdout.write((text + "\n").encode(enc, "backslashreplace").decode(enc, "replace"))
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ENOSPC, EIO, EBADF; ValueError: closed file
        raise _OutputError(f"cannot write standard output ({_one_line(exc)})") from None


def _check_plot_target(path: str, stem: str = "evaluation") -> None:
    """Check that ``--plot`` can be honoured: matplotlib, the folder, the file type.

    ``stem``: the input file's name without its extension, for the file name suggested
    when ``path`` is a folder (``--plot .``: ``./preds.png``).
    """
    try:
        require_matplotlib()
    except ImportError as exc:
        raise ValueError(f"--plot: {exc}") from None
    if os.path.isdir(path):
        # os.path.splitext('.') has no extension: '..png' was suggested
        raise ValueError(
            f"--plot: {path!r} is a folder; name the file to write in it, e.g. "
            f"{os.path.join(path, stem + '.png')}"
        )
    if path.endswith(("/", os.sep)):
        raise ValueError(f"--plot: folder {path!r} does not exist")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--plot: folder {folder!r} does not exist")
    from matplotlib.figure import Figure

    ext = os.path.splitext(path)[1][1:].lower()
    supported = Figure().canvas.get_supported_filetypes()
    if not ext:
        # matplotlib would write another file than the one named (x -> x.png)
        raise ValueError(
            f"--plot: {path!r} has no file extension; name the format, e.g. {path}.png "
            f"(supported: {', '.join(sorted(supported))})"
        )
    if ext not in supported:
        raise ValueError(
            f"--plot: unsupported file type {ext!r} (supported: {', '.join(sorted(supported))})"
        )
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"--plot: {path!r} exists and is not a regular file")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--plot: folder {folder!r} is not writable")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kdecal`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success; 2 for a usage error, bad input or an output that
        cannot be written (one line ``kdecal: error: <message>`` on stderr); 1 for an
        internal error (one line ``kdecal: error: internal error ...``); 130 if
        interrupted; 141, silently, when standard output is a pipe whose reader has
        gone (``kdecal evaluate | head``), as for other Unix tools. The console
        script ``kdecal`` calls ``sys.exit(main())``.
    """
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return _error("a command is required (available: evaluate, compare)")
    if sys.stdout is None or sys.stdout.closed:
        return _error("standard output is closed; redirect it to a file or to /dev/null")
    try:
        with _dask_client(args):
            if args.command == "compare":
                return _run_compare(args)
            return _run_evaluate(args)
    except BrokenPipeError:
        # The reader went away: stop quietly, and keep Python's own flush at exit from
        # reporting the same broken pipe again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # pragma: no cover - no usable descriptor
            pass
        return 141
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        return _error("out of memory (the input is too large for this machine)")
    except (
        _OutputError,
        ValueError,
        TypeError,
        NotImplementedError,
        OSError,
        ImportError,
    ) as exc:
        # InputFileError is a ValueError; OSError covers names the system refuses
        # (too long, permissions) before a file is even opened.
        return _error(_one_line(exc))
    except Exception as exc:  # noqa: BLE001 - a defect of kdecal: one line, no traceback
        _error(
            f"internal error ({type(exc).__name__}: {_one_line(exc)}); please report it "
            "with the command that caused it"
        )
        return 1


@contextlib.contextmanager
def _dask_client(args: argparse.Namespace) -> Iterator[None]:
    """With ``--backend dask``, connect to ``--scheduler`` or start a local cluster."""
    if args.backend != "dask":
        if args.scheduler is not None:
            raise ValueError("--scheduler applies only with --backend dask")
        yield
        return
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise ImportError(
            'the dask backend needs dask.distributed: pip install "kdecal[dask]"'
        ) from exc
    if args.scheduler is not None:
        with Client(args.scheduler, timeout="30s") as client, client.as_current():
            yield
        return
    with contextlib.ExitStack() as stack:
        # The worker processes ignore Ctrl-C (SIG_IGN is inherited by the processes they
        # spawn): only this process is interrupted, and it shuts the cluster down, instead
        # of every worker printing its own traceback (67-116 lines, issue 26).
        main_thread = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
        try:
            cluster = stack.enter_context(
                LocalCluster(
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,  # no warnings about cancelled tasks
                )
            )
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
        client = stack.enter_context(Client(cluster))
        stack.enter_context(client.as_current())
        # an interrupt cancels the client's pending gathers, which asyncio would log one
        # by one ("Task exception was never retrieved"): the line "interrupted" instead
        aio = logging.getLogger("asyncio")
        level = aio.level
        aio.setLevel(logging.CRITICAL + 1)
        try:
            yield
        except KeyboardInterrupt:
            for name in ("distributed", "tornado"):
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
            raise
        finally:
            aio.setLevel(level)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _error(message: str) -> int:
    try:
        print(f"{_PROG}: error: {_cli_words(message)}", file=sys.stderr)
    except (OSError, ValueError, AttributeError):  # pragma: no cover - stderr is gone too
        pass
    return 2


if __name__ == "__main__":
    sys.exit(main())
