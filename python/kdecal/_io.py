"""Reading classifier predictions (scores and labels) from files.

Supported formats
-----------------
``.npz``
    Arrays ``probs`` or ``logits`` (``(n, K)``, or ``(n,)`` for binary) and
    ``labels`` (``(n,)``). Files holding several splits use prefixed keys
    instead, ``<split>_probs`` / ``<split>_logits`` and ``<split>_labels``
    (for example ``val_logits``, ``val_labels``, ``test_logits``,
    ``test_labels``). Other keys (such as ``note``) are ignored.
``.npy``
    One file holds the scores, another the labels. For a scores file
    ``DIR/X.npy`` the labels are read from ``DIR/X_labels.npy`` if it exists,
    otherwise from ``DIR/labels.npy``.
``.csv``
    Comma-separated with a header row. One column named ``label`` or
    ``labels`` (any case) holds the integer class; every other numeric column
    is a score column, taken in file order as classes ``0..K-1``. A single
    score column is binary ``P(y=1)`` (or a binary logit). Columns with
    non-numeric values, an empty header, a ``Unnamed: ...`` header (a pandas
    index) or the name ``id`` / ``index`` are ignored.
``.parquet``
    Same column rules as ``.csv`` (numeric columns are scores, in file order);
    a single list-typed column holding one ``K``-vector per row is accepted
    too. Needs pyarrow (``pip install 'kdecal[parquet]'``).

Scores that are logits are returned as they are, with ``is_logits=True``; the
caller applies :func:`kdecal.softmax` (``(n, K)``) or the logistic sigmoid
(binary ``(n,)`` log-odds).
"""

from __future__ import annotations

import csv
import math
import os
import re
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._validation import resolve_input

__all__ = [
    "BUNDLED_EXAMPLE",
    "InputFileError",
    "bundled_example_path",
    "load_predictions",
]

#: File name of the bundled example inside ``kdecal/data``.
BUNDLED_EXAMPLE = "cifar10_vgg16_keras_verifiedcal.npz"

_EXTENSIONS = (".npz", ".npy", ".csv", ".parquet")
_SPLIT_KEY = re.compile(r"^(?P<split>[A-Za-z0-9]+)_(?P<kind>probs|logits|labels)$")
_LABEL_COLUMNS = ("label", "labels")
_IGNORED_COLUMNS = ("", "id", "index", "__index_level_0__")
# How resolve_input names the two choices: the command-line flags and the keyword.
_FLAGS = {"probs": "--probs (logits=False)", "logits": "--logits (logits=True)"}


class InputFileError(ValueError):
    """A predictions file is missing, unreadable or has the wrong content.

    The message is one sentence that names the file and the problem.
    """


def _fail(path: str | os.PathLike[str], problem: str) -> InputFileError:
    return InputFileError(f"{os.fspath(path)}: {problem}")


def bundled_example_path() -> Path:
    """Return the path of the bundled example predictions file.

    The file is ``kdecal/data/cifar10_vgg16_keras_verifiedcal.npz``: softmax
    probabilities of a VGG-16-style CNN on the 10,000 CIFAR-10 test images and
    their labels (from p-lambda/verified_calibration, MIT licence; see
    ``kdecal/data/README.md``).

    Returns
    -------
    pathlib.Path
        Path of the ``.npz`` file.

    Raises
    ------
    FileNotFoundError
        If the package was installed without its data files.
    """
    candidates: list[Path] = []
    try:
        from importlib.resources import files

        resource = files("kdecal").joinpath("data").joinpath(BUNDLED_EXAMPLE)
        candidates.append(Path(os.fspath(resource)))  # type: ignore[call-overload]
    except (ImportError, TypeError, ValueError, NotImplementedError):
        pass  # not a plain directory install: fall back to the module's folder
    candidates.append(Path(__file__).resolve().parent / "data" / BUNDLED_EXAMPLE)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"the bundled example {BUNDLED_EXAMPLE} is missing from the kdecal installation"
    )


def load_predictions(
    path: str | os.PathLike[str],
    *,
    split: str | None = None,
    logits: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, bool, str]:
    """Read classifier scores and true labels from a file.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npz``, ``.npy``, ``.csv`` or ``.parquet`` file (see the module
        docstring for the layout of each format).
    split : str, optional
        For ``.npz`` files with split-prefixed keys (``val_logits``,
        ``test_labels``, ...): which split to read. Default: ``"test"`` if the
        file has it, else its only split; unprefixed ``probs``/``logits`` keys
        take precedence when ``split`` is None. Giving a split for a file
        without prefixed keys, or for another format, is an error.
    logits : bool, optional
        True: the scores are logits (binary single column: log-odds). False:
        the scores are probabilities (rows within ``PROBS_ROW_SUM_ATOL`` = 0.1 of
        summing to 1 are renormalised later, with a warning). None (default): for
        ``.npz`` files, decided by the key name (``logits`` or ``probs``); for the
        other formats, by :func:`kdecal._validation.resolve_input`: scores with a
        value outside [0, 1] are logits, scores in [0, 1] whose rows sum to 1 within
        ``INFER_ROW_SUM_ATOL`` = 0.02 are probabilities (files rounded to 3 decimals
        pass), and anything in between is refused as ambiguous.

    Returns
    -------
    scores : numpy.ndarray
        Float array ``(n, K)`` with ``K >= 2``, or ``(n,)`` for a single
        binary score column. float32 and float64 inputs keep their dtype,
        other numeric types become float64.
    labels : numpy.ndarray
        int64 array ``(n,)``.
    is_logits : bool
        Whether ``scores`` are logits (to be passed through softmax, or the
        sigmoid for ``(n,)``) rather than probabilities.
    description : str
        Short human-readable description: the file name, what was read from
        it and how the scores were interpreted, e.g.
        ``"preds.npz [test_logits, test_labels], logits (from key name)"``.

    Raises
    ------
    InputFileError
        (a ValueError) for a missing file, an unknown extension, a missing
        key or column, bad shapes, non-integer labels, NaN scores, mismatched
        lengths, scores that cannot be told apart as probabilities or logits, or
        probabilities given as logits. The message names the file and the problem in one sentence.
    """
    p = Path(os.fspath(path))
    if not p.exists():
        raise _fail(path, "file not found")
    if p.is_dir():
        raise _fail(path, "is a directory, not a predictions file")
    if not p.is_file():
        raise _fail(path, "is not a regular file (a device, pipe or socket cannot be read)")
    ext = p.suffix.lower()
    if ext not in _EXTENSIONS:
        problem = f"unknown file extension '{p.suffix}'" if p.suffix else "has no file extension"
        raise _fail(path, f"{problem} (expected .npz, .npy, .csv or .parquet)")
    if split is not None and ext != ".npz":
        raise _fail(path, f"split={split!r} applies only to .npz files with val_/test_ keys")
    columns: list[str] | None = None
    try:
        if ext == ".npz":
            scores, labels, key_logits, desc = _read_npz(p, path, split, logits)
        elif ext == ".npy":
            scores, labels, desc = _read_npy(p, path)
            key_logits = None
        elif ext == ".csv":
            scores, labels, desc, columns = _read_csv(p, path)
            key_logits = None
        else:
            scores, labels, desc, columns = _read_parquet(p, path)
            key_logits = None
    except InputFileError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise _fail(path, f"cannot be read ({_one_line(exc)})") from exc
    except UnicodeDecodeError as exc:
        raise _fail(path, "is not a UTF-8 text file") from exc

    scores, labels = _check_arrays(scores, labels, path)
    if logits is not None:
        requested = "logits" if logits else "probs"
    elif key_logits is not None:
        requested = "logits" if key_logits else "probs"
    else:
        requested = "auto"
    try:
        kind, how = resolve_input(scores, requested, "the scores", _FLAGS, columns)
    except ValueError as exc:
        raise _fail(path, str(exc)) from None
    if logits is None and key_logits is not None:
        how = "from key name"
    is_logits = kind == "logits"
    desc = f"{desc}, {'logits' if is_logits else 'probabilities'} ({how})"
    if scores.ndim == 1:  # (one score column, or an (n, 1) array, read as binary)
        desc += f", one column: {'the logit of ' if is_logits else ''}P(y = 1) of a binary problem"
    return scores, labels, is_logits, desc


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _check_arrays(
    scores: Any, labels: Any, path: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Validate shapes and types; return (float scores, int64 labels)."""
    scores = np.asarray(scores)
    labels = np.asarray(labels)
    if scores.dtype == object or not (
        np.issubdtype(scores.dtype, np.number) or scores.dtype == np.bool_
    ):
        raise _fail(path, f"scores are not numeric (dtype {scores.dtype})")
    if np.issubdtype(scores.dtype, np.complexfloating):
        raise _fail(path, "scores are complex numbers")
    if scores.dtype not in (np.float32, np.float64):
        scores = scores.astype(np.float64)
    if scores.ndim == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if scores.ndim not in (1, 2):
        raise _fail(
            path,
            f"scores must have shape (n, K) or (n,), got shape {scores.shape}",
        )
    if scores.ndim == 2 and scores.shape[1] == 0:
        raise _fail(path, "scores have no columns")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise _fail(path, f"labels must have shape (n,), got shape {labels.shape}")
    if scores.shape[0] != labels.shape[0]:
        raise _fail(
            path,
            f"scores have {scores.shape[0]} rows but labels have {labels.shape[0]} entries",
        )
    if scores.shape[0] == 0:
        raise _fail(path, "holds no samples")
    finite = np.isfinite(scores)
    if not finite.all():
        # NaN and +-inf alike, probabilities or logits (a one-column logit of +inf read
        # as P = 1, several columns refused by the softmax without the file's name)
        at = tuple(int(i) for i in np.argwhere(~finite)[0])
        where = f"row {at[0]}" + (f", column {at[1]}" if len(at) == 2 else "")
        raise _fail(
            path,
            f"scores contain {float(scores[at])} (first at {where}); every score must be finite",
        )
    labels = _as_int_labels(labels, path)
    return np.ascontiguousarray(scores), labels


def _as_int_labels(labels: np.ndarray, path: str | os.PathLike[str]) -> np.ndarray:
    if labels.dtype == np.bool_:
        # kept boolean: the labels' check takes them as classes 0/1 of a binary problem
        # only, and refuses a mask such as argmax == y beside K > 2 columns
        return labels
    if np.issubdtype(labels.dtype, np.integer):
        if labels.dtype == np.uint64 and labels.size and labels.max() > np.iinfo(np.int64).max:
            bad = labels[np.argmax(labels > np.iinfo(np.int64).max)]
            raise _fail(path, f"labels must be class indices 0..K-1, found {int(bad)}")
        return labels.astype(np.int64, copy=False)
    if np.issubdtype(labels.dtype, np.floating):
        # beyond 2**53 a float is an integer that int64 may not hold (1e300 became
        # -9223372036854775808 with numpy's cast warning)
        ok = np.isfinite(labels) & (labels == np.round(labels)) & (np.abs(labels) <= 2.0**53)
        if not ok.all():
            bad = labels[~ok][0]
            raise _fail(path, f"labels must be integer class indices, found {float(bad):g}")
        return labels.astype(np.int64)
    raise _fail(path, f"labels must be integer class indices, got dtype {labels.dtype}")


def _available_memory() -> int | None:
    """Bytes of memory available to this process (Linux ``MemAvailable``), if known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def _check_memory(path: str | os.PathLike[str], need: float, what: str) -> None:
    """Refuse, before allocating, to read something that needs more than the free memory."""
    avail = _available_memory()
    if avail is not None and need > avail:
        raise _fail(
            path,
            f"{what} needs about {need / 2**30:.3g} GiB of memory but only "
            f"{avail / 2**30:.3g} GiB is available",
        )


def _npy_header(fh: Any, shown: str | os.PathLike[str]) -> tuple[tuple[int, ...], np.dtype]:
    """Read a ``.npy`` header: the declared shape and dtype, without the data."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, _fortran, dtype = fmt.read_array_header_1_0(fh)
        else:
            shape, _fortran, dtype = fmt.read_array_header_2_0(fh)
    except (ValueError, OSError, EOFError) as exc:
        raise _fail(shown, f"is not a valid .npy array ({_one_line(exc)})") from exc
    return tuple(int(s) for s in shape), np.dtype(dtype)


def _declared_bytes(
    shape: tuple[int, ...], dtype: np.dtype, stored: int, shown: str | os.PathLike[str]
) -> int:
    """Bytes an array header declares; refused when the file cannot hold them."""
    if dtype.hasobject:
        raise _fail(shown, "holds an object array, which needs pickle (refused)")
    need = math.prod(shape) * dtype.itemsize
    if need > stored:
        raise _fail(
            shown,
            f"declares an array of shape {shape} ({need:,} bytes of {dtype}) but holds only "
            f"{stored:,} bytes of data (truncated or corrupt)",
        )
    return need


# ------------------------------- npz ------------------------------------- #


def _read_npz(
    p: Path, path: str | os.PathLike[str], split: str | None, logits: bool | None
) -> tuple[np.ndarray, np.ndarray, bool, str]:
    with open(p, "rb") as fh:
        magic = fh.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise _fail(
            path, "is not a .npz archive (it holds a single array; use the .npy extension)"
        )
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        raise _fail(path, "is not a .npz file (not a zip archive: no 'PK' signature)")
    try:
        archive = np.load(p, allow_pickle=False)
    except ValueError as exc:
        raise _fail(path, f"is not a valid .npz file ({_one_line(exc)})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise _fail(
            path,
            "is not a .npz archive (it holds a single array; use the .npy extension)",
        )
    with archive:
        keys = list(archive.files)
        shown = ", ".join(keys) if keys else "none"
        splits = sorted(
            {m["split"] for k in keys if (m := _SPLIT_KEY.match(k)) and m["kind"] != "labels"}
        )
        plain = [k for k in ("probs", "logits") if k in keys]

        if split is not None:
            if not splits:
                raise _fail(
                    path,
                    f"has no split-prefixed keys such as test_probs or test_logits, so split "
                    f"{split!r} cannot be chosen (keys: {shown})",
                )
            if split not in splits:
                raise _fail(
                    path,
                    f"has no split {split!r}; splits present: {', '.join(splits)}",
                )
            prefix = f"{split}_"
        elif plain:
            prefix = ""
        elif "test" in splits:
            prefix = "test_"
        elif len(splits) == 1:
            prefix = f"{splits[0]}_"
        elif splits:
            raise _fail(
                path,
                f"holds several splits ({', '.join(splits)}) and none is 'test'; choose one with "
                "split (--split on the command line)",
            )
        else:
            raise _fail(path, f"has no 'probs' or 'logits' array (keys: {shown})")

        have_probs = f"{prefix}probs" in keys
        have_logits = f"{prefix}logits" in keys
        if have_probs and have_logits:
            score_key = f"{prefix}logits" if logits else f"{prefix}probs"
        elif have_logits:
            score_key = f"{prefix}logits"
        elif have_probs:
            score_key = f"{prefix}probs"
        else:
            raise _fail(
                path,
                f"has no '{prefix}probs' or '{prefix}logits' array (keys: {shown})",
            )

        label_key = next((k for k in (f"{prefix}labels", f"{prefix}label") if k in keys), None)
        if label_key is None:
            raise _fail(path, f"has no '{prefix}labels' array (keys: {shown})")

        _check_npz_members(archive, (score_key, label_key), path)
        try:
            scores = archive[score_key]
            labels = archive[label_key]
        except ValueError as exc:  # object arrays need pickle, which is refused
            raise _fail(path, f"array cannot be loaded without pickle ({_one_line(exc)})") from exc
    key_logits = score_key.endswith("logits")
    return scores, labels, key_logits, f"{p.name} [{score_key}, {label_key}]"


def _check_npz_members(archive: Any, keys: tuple[str, str], path: str | os.PathLike[str]) -> None:
    """Check the declared sizes of the arrays to be read against the archive and memory."""
    zf = archive.zip
    total = 0
    lengths = []
    for key in keys:
        info = zf.getinfo(f"{key}.npy")
        with zf.open(info) as fh:
            shape, dtype = _npy_header(fh, f"{os.fspath(path)} [{key}]")
            header = fh.tell()
        total += _declared_bytes(
            shape, dtype, info.file_size - header, f"{os.fspath(path)} [{key}]"
        )
        lengths.append(shape[0] if shape else None)
    if lengths[0] != lengths[1]:
        raise _fail(
            path,
            f"{keys[0]} has {lengths[0]} rows but {keys[1]} has {lengths[1]} entries",
        )
    _check_memory(path, total, "reading it")


# ------------------------------- npy ------------------------------------- #


def _load_npy(p: Path, shown_path: str | os.PathLike[str]) -> np.ndarray:
    with open(p, "rb") as fh:
        if fh.read(6) == b"\x93NUMPY":
            fh.seek(0)
            shape, dtype = _npy_header(fh, shown_path)
            stored = p.stat().st_size - fh.tell()
            _check_memory(
                shown_path, _declared_bytes(shape, dtype, stored, shown_path), "reading it"
            )
    try:
        arr = np.load(p, allow_pickle=False)
    except ValueError as exc:
        raise _fail(shown_path, f"is not a valid .npy file ({_one_line(exc)})") from exc
    if not isinstance(arr, np.ndarray):
        raise _fail(shown_path, "is a .npz archive, not a single array; use the .npz extension")
    return arr


def _read_npy(p: Path, path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, str]:
    if p.stem == "labels" or p.stem.endswith("_labels"):
        raise _fail(path, "is a labels file; pass the scores file (X.npy next to X_labels.npy)")
    candidates = [
        p.with_name(f"{p.stem}_labels{p.suffix}"),
        p.with_name(f"labels{p.suffix}"),
    ]
    label_path = next((c for c in candidates if c.is_file()), None)
    if label_path is None:
        raise _fail(
            path,
            f"no labels file found next to it (looked for {candidates[0].name} and "
            f"{candidates[1].name} in the same folder)",
        )
    scores = _load_npy(p, path)
    labels = _load_npy(label_path, label_path)
    return scores, labels, f"{p.name} + {label_path.name}"


# ------------------------------- csv ------------------------------------- #


def _parse_float(text: str) -> float | None:
    """One CSV cell as a number, or None if it is not one.

    Python's ``float`` also reads digit separators (``1_0`` is 10.0) and non-ASCII
    digits (full-width ``１``, Arabic-Indic ``١``), which no CSV writer produces and
    numpy or pandas do not read: here such a cell is not a number.
    """
    if not text.isascii() or "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _not_a_number(text: str) -> str:
    """Why a cell of a column of numbers is not one, and what to do, for a message."""
    try:
        float(text)
    except ValueError:
        return "(a missing value?); fill it in or drop the column"
    return (
        "(not a plain number: digit separators '_' and non-ASCII digits are not read); "
        "write it as a plain number or drop the column"
    )


def _split_columns(names: list[str], path: str | os.PathLike[str]) -> tuple[int, list[int]]:
    """Return (label column index, candidate score column indices)."""
    lowered = [n.strip().lower() for n in names]
    label_idx = [i for i, n in enumerate(lowered) if n in _LABEL_COLUMNS]
    if not label_idx:
        raise _fail(
            path,
            f"has no 'label' or 'labels' column (columns: {', '.join(names) or 'none'})",
        )
    if len(label_idx) > 1:
        raise _fail(path, "has more than one label column ('label'/'labels')")
    candidates = [
        i
        for i, n in enumerate(lowered)
        if i != label_idx[0] and n not in _IGNORED_COLUMNS and not n.startswith("unnamed:")
    ]
    return label_idx[0], candidates


#: Longest line accepted in a CSV file (characters); a row of K = 10,000 scores fits.
MAX_CSV_LINE = 1 << 20
#: Memory needed to parse a CSV file, per byte of file (Python lists of str and float).
_CSV_BYTES_PER_BYTE = 12


def _bounded_lines(fh: Any, path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield the lines of a text file, refusing any longer than :data:`MAX_CSV_LINE`."""
    lineno = 0
    while True:
        line = fh.readline(MAX_CSV_LINE + 1)
        if not line:
            return
        lineno += 1
        if len(line) > MAX_CSV_LINE:
            raise _fail(
                path,
                f"line {lineno} is longer than {MAX_CSV_LINE:,} characters (not a CSV of "
                "predictions?)",
            )
        yield line


def _read_csv(
    p: Path, path: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray, str, list[str] | None]:
    _check_memory(path, p.stat().st_size * _CSV_BYTES_PER_BYTE, "parsing it")
    old_limit = csv.field_size_limit()
    try:
        csv.field_size_limit(MAX_CSV_LINE)
        with open(p, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(_bounded_lines(fh, path))
            numbered: list[tuple[int, list[str]]] = []
            start = 1
            for r in reader:
                if any(cell.strip() for cell in r):  # skip blank lines
                    numbered.append((start, r))
                start = reader.line_num + 1
    except csv.Error as exc:
        raise _fail(path, f"is not a valid CSV file ({_one_line(exc)})") from None
    finally:
        csv.field_size_limit(old_limit)
    if not numbered:
        raise _fail(path, "is empty")
    header = [c.strip() for c in numbered[0][1]]
    body = [r for _, r in numbered[1:]]
    linenos = [k for k, _ in numbered[1:]]
    if not body:
        raise _fail(path, "has a header but no data rows")
    label_col, candidates = _split_columns(header, path)
    ncol = len(header)
    for lineno, r in zip(linenos, body):
        if len(r) != ncol:
            raise _fail(path, f"line {lineno} has {len(r)} fields but the header has {ncol}")

    labels_text = [r[label_col].strip() for r in body]
    # True/False text (a boolean column as pandas writes it): classes 1/0 of a binary
    # file, as a boolean label array of the other formats
    boolean = all(t.lower() in ("true", "false") for t in labels_text)
    label_vals = [float(t.lower() == "true") if boolean else _parse_float(t) for t in labels_text]
    for lineno, t, v in zip(linenos, labels_text, label_vals):
        if v is None or not math.isfinite(v) or v != round(v):
            raise _fail(
                path,
                f"label column '{header[label_col]}' must hold integer class indices, "
                f"found {t!r} on line {lineno}",
            )

    score_cols: list[int] = []
    ignored: list[str] = [header[i] for i in range(ncol) if i != label_col and i not in candidates]
    columns: list[list[float]] = []
    for i in candidates:
        cells = [r[i].strip() for r in body]
        parsed = [_parse_float(c) if c else None for c in cells]
        text = [k for k, (v, c) in enumerate(zip(parsed, cells)) if v is None and c]
        if text:
            if len(text) < len(cells) and any(v is not None for v in parsed):
                # numbers with a stray word ("NA", "n/a", "-"): a score column with a
                # missing value, never a text column to drop silently
                k = text[0]
                raise _fail(
                    path,
                    f"column '{header[i]}' holds numbers but {cells[k]!r} on line "
                    f"{linenos[k]} {_not_a_number(cells[k])}",
                )
            ignored.append(header[i])  # a non-numeric column
            continue
        if any(v is None for v in parsed):
            lineno = linenos[next(k for k, v in enumerate(parsed) if v is None)]
            raise _fail(path, f"score column '{header[i]}' has an empty value on line {lineno}")
        bad = next((k for k, v in enumerate(parsed) if not math.isfinite(v)), None)  # type: ignore[arg-type]
        if bad is not None:  # nan, inf: named by the file's line and the column's header
            raise _fail(
                path,
                f"score column '{header[i]}' holds {cells[bad]!r} on line {linenos[bad]}; "
                "every score must be finite",
            )
        score_cols.append(i)
        columns.append(parsed)  # type: ignore[arg-type]
    if not score_cols:
        raise _fail(path, "has no numeric score columns besides the label column")
    # the classes' range is checked here, where the file's line numbers are known (the
    # same check of kdecal.evaluate names the 0-based row of the array)
    labels = np.array(label_vals, dtype=np.float64)
    if boolean:  # the labels' check takes them as classes 0/1 of a binary problem only
        labels = labels.astype(bool)
    n_classes = max(len(score_cols), 2)
    outside = (labels < 0) | (labels >= n_classes)
    if outside.any():
        k = int(np.argmax(outside))
        what = f"{n_classes} score columns" if len(score_cols) > 1 else "one binary score column"
        raise _fail(
            path,
            f"label column '{header[label_col]}' must hold class indices 0..{n_classes - 1} "
            f"({what}), found {labels_text[k]!r} on line {linenos[k]}",
        )
    scores = np.array(columns, dtype=np.float64).T
    names = [header[i] for i in score_cols]
    return scores, labels, _table_description(p, header, score_cols, label_col, ignored), names


def _table_description(
    p: Path, names: list[str], score_cols: list[int], label_col: int, ignored: list[str]
) -> str:
    if len(score_cols) == 1:
        cols = f"binary score column '{names[score_cols[0]]}'"
    elif len(score_cols) <= 4:
        cols = f"{len(score_cols)} score columns ({', '.join(names[i] for i in score_cols)})"
    else:
        cols = (
            f"{len(score_cols)} score columns ({names[score_cols[0]]} .. {names[score_cols[-1]]})"
        )
    desc = f"{p.name} [{cols}, label column '{names[label_col]}'"
    if ignored:
        desc += f"; ignored: {', '.join(repr(n) for n in ignored)}"
    return desc + "]"


# ----------------------------- parquet ----------------------------------- #


def _read_parquet(
    p: Path, path: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray, str, list[str] | None]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise _fail(path, "reading .parquet needs pyarrow: pip install 'kdecal[parquet]'") from exc
    try:
        pfile = pq.ParquetFile(p)
        meta = pfile.metadata
        need = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        schema_names = list(pfile.schema_arrow.names)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise _fail(path, f"is not a readable Parquet file ({_one_line(exc)})") from exc
    # pyarrow cannot read a table whose columns share a name ("Multiple matches for
    # FieldRef.Name(p) ..."): name them, as a readable file with a content problem
    counts = Counter(schema_names)
    dups = [f"'{n}' ({c} times)" for n, c in counts.items() if c > 1]
    if dups:
        raise _fail(
            path,
            f"has duplicate column names: {', '.join(dups)}; give each column a unique name",
        )
    _check_memory(path, 2 * need, "reading it")
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, ValueError) as exc:
        raise _fail(path, f"is not a readable Parquet file ({_one_line(exc)})") from exc
    if table.num_rows == 0:
        raise _fail(path, "holds no rows")
    names = list(table.column_names)
    label_col, candidates = _split_columns(names, path)

    label_arr = table.column(label_col)
    if not (
        pa.types.is_integer(label_arr.type)
        or pa.types.is_floating(label_arr.type)
        or pa.types.is_boolean(label_arr.type)
    ):
        raise _fail(
            path,
            f"label column '{names[label_col]}' must hold integer class indices, "
            f"got type {label_arr.type}",
        )
    if label_arr.null_count:
        raise _fail(path, f"label column '{names[label_col]}' has missing values")
    labels = label_arr.to_numpy()

    def numeric(t: Any) -> bool:
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)

    ignored = [names[i] for i in range(len(names)) if i != label_col and i not in candidates]
    score_cols: list[int] = []
    list_cols: list[int] = []
    for i in candidates:
        t = table.column(i).type
        if numeric(t):
            score_cols.append(i)
        elif (
            pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        ) and numeric(t.value_type):
            list_cols.append(i)
        else:
            ignored.append(names[i])
    if list_cols and (score_cols or len(list_cols) > 1):
        raise _fail(
            path,
            "mixes list-valued score columns with other score columns; use either one "
            "list column or one numeric column per class",
        )
    if list_cols:
        col = table.column(list_cols[0])
        if col.null_count:
            raise _fail(path, f"score column '{names[list_cols[0]]}' has missing values")
        rows = col.to_pylist()
        widths = {len(r) for r in rows}
        if len(widths) != 1 or None in (v for r in rows for v in r):
            raise _fail(
                path,
                f"list column '{names[list_cols[0]]}' must hold one complete vector of the "
                "same length per row",
            )
        scores = np.array(rows, dtype=np.float64)
        desc = (
            f"{p.name} [list score column '{names[list_cols[0]]}', "
            f"label column '{names[label_col]}'"
            + (f"; ignored: {', '.join(repr(n) for n in ignored)}" if ignored else "")
            + "]"
        )
        return scores, labels, desc, None
    if not score_cols:
        raise _fail(path, "has no numeric score columns besides the label column")
    columns = []
    for i in score_cols:
        col = table.column(i)
        if col.null_count:
            raise _fail(path, f"score column '{names[i]}' has missing values")
        columns.append(col.to_numpy().astype(np.float64))
    scores = np.column_stack(columns)
    desc = _table_description(p, names, score_cols, label_col, ignored)
    return scores, labels, desc, [names[i] for i in score_cols]
