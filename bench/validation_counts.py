"""How often the input checks run in one ``kdecal.evaluate`` (issue 24, "validate once").

Counts the calls of the four input readers of ``kdecal._validation`` --
``check_probs``, ``check_labels``, ``log_probs`` and ``as_array`` -- during

- one ``kdecal.evaluate(probs, labels)`` on the bundled example (the command line's
  default input: 10,000 CIFAR-10 rows, K = 10; the defaults of ``evaluate``, so three
  notions, 100 resamples and the calibration loss), and
- one ``kdecal.scores.calibration_loss(probs, labels)`` alone (defaults: log loss,
  affine calibrator, 5-fold cross-validation).

Every kdecal module that imported one of them holds its own reference, so each is
wrapped in every module namespace where it appears (``unittest.mock.patch.object`` on
the module attribute), ``kdecal._validation`` included: its internal calls
(``log_probs`` -> ``check_probs`` -> ``as_array``) count too.  The calls of
``check_probs`` given a ``Probs`` (validated already, returned as it is) are also
counted apart, as ``check_probs(Probs)``.  Nothing is timed.

    KDECAL_PROGRESS=0 python bench/validation_counts.py [--resamples N] [--json OUT]

Public functions validate their input once and hand the validated object (``Probs``,
an int64 label array) to private implementations; see bench/README.md, "Validate once",
for the counts before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np

import kdecal
import kdecal.scores
from kdecal import _validation
from kdecal._io import bundled_example_path

#: The functions counted (all defined in kdecal._validation).
COUNTED = ("check_probs", "check_labels", "log_probs", "as_array")
#: The calls of ``check_probs`` given a ``Probs``, which it returns unchanged (counted
#: among ``check_probs`` too).
PASSED = "check_probs(Probs)"
COLUMNS = ("check_probs", PASSED, "check_labels", "log_probs", "as_array")


@contextlib.contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count the calls of :data:`COUNTED` in every kdecal module that holds them."""
    counts: Counter[str] = Counter()
    originals = {name: getattr(_validation, name) for name in COUNTED}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            if name == "check_probs" and args and isinstance(args[0], _validation.Probs):
                counts[PASSED] += 1  # validated already: returned as it is
            return fn(*args, **kwargs)

        return counted

    wrappers = {name: wrap(name, fn) for name, fn in originals.items()}
    with contextlib.ExitStack() as stack:
        for modname, module in list(sys.modules.items()):
            if module is None or not (modname == "kdecal" or modname.startswith("kdecal.")):
                continue
            for name, fn in originals.items():
                if getattr(module, name, None) is fn:
                    stack.enter_context(mock.patch.object(module, name, wrappers[name]))
        yield counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--resamples", type=int, default=100, help="n_resamples of evaluate")
    ap.add_argument("--json", default=None, help="write the counts here")
    args = ap.parse_args()
    with np.load(bundled_example_path()) as d:
        P, y = d["probs"], d["labels"]
    warnings.simplefilter("ignore")
    out: dict[str, dict[str, int]] = {}
    with counting() as c:
        kdecal.evaluate(P, y, n_resamples=args.resamples, progress=False)
    out["evaluate"] = {name: c[name] for name in COLUMNS}
    with counting() as c:
        kdecal.scores.calibration_loss(P, y)
    out["calibration_loss"] = {name: c[name] for name in COLUMNS}
    print(f"{'':18s}" + "".join(f"{name:>20s}" for name in COLUMNS))
    for what, row in out.items():
        print(f"{what:18s}" + "".join(f"{row[name]:20d}" for name in COLUMNS))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
