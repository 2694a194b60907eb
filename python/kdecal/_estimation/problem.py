"""The kernel problems of a notion of calibration, and the engine pass over them.

A notion of calibration turns ``(probs, labels)`` into a batch of B kernel problems on
the simplex of dimension D (Popordanoska et al. 2024, Eq. 24-25 and App. D):

- ``"canonical"``: one problem, the full vectors ``f_j`` (D = K) and the labels;
- ``"top_label"``: one binary problem, ``(1 - max_k f_jk, max_k f_jk)`` with the label
  ``1[argmax_k f_jk = y_j]`` (the Beta kernel, i.e. the K = 2 Dirichlet kernel);
- ``"classwise"``: K binary problems ``(1 - f_jc, f_jc)`` with labels ``1[y_j = c]``,
  all in one batched engine call.

The per-row formulas are those of :mod:`kdecal._formulas`, shared with
:mod:`kdecal.torch`. Every estimator is a plug-in of the leave-one-out conditional
expectation ``E`` (and,
with debiasing, of the estimate ``sq`` of its square) into a Bregman generator F.  For
binary problems built from a multiclass output (top-label and class-wise) the "l2"
generator is the scalar ``F(q) = q^2`` of App. D (so that the class-wise L2 calibration
error is the square of the class-wise ECE^KDE with p = 2; the one-vs-rest Brier
generator ``q^2 + (1 - q)^2`` would give exactly twice that), and the L_p errors use the
positive coordinate only.  "kl" is ``q log q + (1 - q) log(1 - q)`` there, the same
formula as the canonical negative entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from .. import _formulas as _f
from .._engine import backends as _backends
from .._engine import runtime as _runtime
from .._validation import Probs

CALIBRATIONS = ("canonical", "classwise", "top_label")
DEBIAS_MODES = ("none", "ustat", "ratio")
_POWERS = {"none": 1, "ustat": 2, "ratio": 3}


@dataclass(frozen=True)
class Problem:
    """A batch of leave-one-out kernel problems.

    Attributes
    ----------
    calibration : str
        The notion it was built for.
    p : ndarray, shape (B, n, D), float64
        Clipped, renormalised points on the simplex.
    labels : ndarray, shape (B, n), int64
        Labels in ``0..D-1``.
    dtype : numpy dtype
        Kernel dtype (float32 or float64).
    """

    calibration: str
    p: np.ndarray
    labels: np.ndarray
    dtype: np.dtype

    @property
    def binary(self) -> bool:
        return self.calibration != "canonical"

    @property
    def n(self) -> int:
        return int(self.p.shape[1])

    @property
    def dim(self) -> int:
        return int(self.p.shape[2])

    @property
    def coords(self) -> slice:
        """Coordinates that enter L_p and L2 quantities (the positive one when binary)."""
        return _f.coords(self.binary)

    def one_hot(self) -> np.ndarray:
        """Labels as one-hot vectors, shape (B, n, D)."""
        return np.asarray(_f.one_hot(self.labels, self.dim))

    def frequencies(self) -> np.ndarray:
        """Label frequencies per problem, shape (B, 1, D)."""
        return self.one_hot().mean(axis=1, keepdims=True)


#: Batches of problems (class-wise: K one-vs-rest problems) whose transient work would
#: take more than this many bytes at once are processed a chunk of problems at a time
#: (:func:`problem_chunks`): the class-wise estimate of an ImageNet-sized validation set
#: (n = 50,000, K = 1,000) held about 310 bytes per (row, class) at its peak, of which
#: about 120 were the engine's outputs and inputs of the whole batch at once.
PROBLEM_CHUNK_MIN_BYTES = 1e9

#: The transient bytes of one chunk of problems, where batches are chunked.
PROBLEM_CHUNK_BYTES = 256e6


def problem_chunks(problem: Problem, point_bytes: float) -> list[slice]:
    """Slices of the batch's problems, each one chunk of transient work.

    ``point_bytes``: the transient bytes per (problem, point) of the work. One slice of
    all B problems unless ``B n point_bytes`` exceeds :data:`PROBLEM_CHUNK_MIN_BYTES`;
    then chunks of :data:`PROBLEM_CHUNK_BYTES` (at least one problem each).
    """
    B, n = problem.p.shape[0], problem.n
    if B * n * point_bytes <= PROBLEM_CHUNK_MIN_BYTES:
        return [slice(0, B)]
    step = int(max(1, PROBLEM_CHUNK_BYTES // (n * point_bytes)))
    return [slice(b0, min(B, b0 + step)) for b0 in range(0, B, step)]


def subproblem(problem: Problem, problems: slice) -> Problem:
    """Return the problems ``problems`` of the batch (views of its arrays)."""
    return Problem(
        problem.calibration, problem.p[problems], problem.labels[problems], problem.dtype
    )


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on uint64 values: nearby keys land far apart."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


#: The bits of a float64 that :func:`content_order`'s symmetric key reads: sign, exponent
#: and the top 24 bits of the mantissa (a relative resolution of 6e-8), so that the few
#: ulps by which a row renormalised in another column order differs rarely change it.
_SYM_MASK = np.uint64(0xFFFF_FFFF_F000_0000)


def content_order(problem: Problem) -> np.ndarray:
    """Return a permutation of the rows that depends only on their contents, shape (n,).

    The rows are sorted by a 64-bit hash of their points and labels (mixed bit patterns):
    the order looks random, so that its first ``r`` rows are a random subset of ``r``
    rows, yet it is the same whatever order the caller's rows came in, and whatever
    order the classes came in. The primary key is a sum over the batch's problems and
    each point's coordinates of hashed values, plus the hashed value of the labelled
    coordinate: symmetric in the coordinates and in the problems, so relabelling the
    classes (a permutation of the columns of ``probs`` and of the label values) leaves
    it unchanged (it changed the search's subsets, and with them, on risk curves with
    two modes, the chosen bandwidth); it reads each value to a relative 6e-8
    (:data:`_SYM_MASK`), as renormalising the columns in another order moves their
    last bits. Rows whose primary keys tie (equal rows, or rows
    that are permutations of each other) are ordered by a second hash, a random linear
    combination of the bit patterns in coordinate order, so rows equal in every problem
    tie and are interchangeable: the permuted problem, and what a search computes on
    it, is the same for every ordering of the same rows. O(n B D) time, O(n) memory
    besides the result.
    """
    B, n, D = problem.p.shape
    mult = np.random.default_rng(0x6B646563).integers(1, 2**63, size=(B, D + 1), dtype=np.uint64)
    mult |= np.uint64(1)
    key = np.zeros(n, dtype=np.uint64)  # coordinate order: the tie-break
    sym = np.zeros(n, dtype=np.uint64)  # symmetric in the coordinates and the problems
    salt = np.uint64(0x9E3779B97F4A7C15)
    rows = np.arange(n)
    for b in range(B):
        bits = np.ascontiguousarray(problem.p[b], dtype=np.float64).view(np.uint64)
        key += bits @ mult[b, :D]
        key += problem.labels[b].astype(np.uint64) * mult[b, D]
        coarse = bits & _SYM_MASK  # the renormalised rows' last bits depend on column order
        sym += _mix64(coarse.copy()).sum(axis=1, dtype=np.uint64)
        sym += _mix64(coarse[rows, problem.labels[b]] ^ salt)
    return np.lexsort((_mix64(key), _mix64(sym)))


def make_problem(
    probs: Probs, labels: np.ndarray | None, calibration: str, backend: str = "cpp"
) -> Problem:
    """Build the kernel problems of one notion of calibration (labels None: unlabelled).

    The kernel runs in the input's dtype, except that the binary problems (top-label,
    class-wise) that the fast binary engine serves (``backend`` "cpp" or "dask", n >= 2,048) run in
    float64, the only dtype it has: faster than the float32 dense loop and more exact.
    """
    y = np.zeros(probs.n, dtype=np.int64) if labels is None else labels
    points, lab = _f.problem_arrays(probs.p, y, calibration)
    dtype = probs.dtype
    if calibration != "canonical" and _backends.binary_engine_serves(backend, probs.n):
        dtype = np.dtype(np.float64)
    return Problem(calibration, points, lab, dtype)


def kernel_inputs(problem: Problem, hs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the engine's inputs: ``log p``, ``p`` in the kernel dtype, and the bias.

    Returns ``logq``, ``pk`` (B, n, D), C-contiguous in ``problem.dtype``, and the
    per-centre bias ``-sum_k lgamma(p_ik / h + 1)`` (B, H, n), float64.
    """
    logq, pk = kernel_points(problem)
    bias = np.stack([kernel_bias(problem, h) for h in hs], axis=1)
    return logq, pk, np.ascontiguousarray(bias)


def kernel_points(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """``log p`` and ``p`` (B, n, D), C-contiguous in ``problem.dtype``."""
    p = problem.p
    return (
        np.ascontiguousarray(np.log(p), dtype=problem.dtype),
        np.ascontiguousarray(p, dtype=problem.dtype),
    )


def kernel_bias(problem: Problem, h: float) -> np.ndarray:
    """Per-centre bias ``-sum_k lgamma(p_ik / h + 1)`` of one bandwidth, (B, n) float64.

    With the compiled core, its vectorised lgamma (``kdecal._core.kernel_bias``, about 6x
    ``scipy.special.gammaln`` per value: a bandwidth search needs n K values per bandwidth
    tried); without it, ``gammaln`` on row blocks. Either way in the engine's threads,
    bitwise the same for any number of them.
    """
    core = _runtime._core
    if core is not None:
        p = np.ascontiguousarray(problem.p, dtype=np.float64)
        flat = p.reshape(-1, p.shape[-1])
        bias = core.kernel_bias(flat, 1.0 / h, _runtime.get_num_threads())
        return np.asarray(bias).reshape(p.shape[:-1])
    return _runtime.map_row_blocks(lambda p: -gammaln(p / h + 1.0).sum(axis=-1), problem.p)


def engine(
    problem: Problem,
    hs: np.ndarray,
    *,
    labelled: bool,
    powers: int,
    backend: str,
    progress: bool | None = None,
    rows: tuple[int, int] | None = None,
    pairs: bool = False,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    resid: bool = False,
) -> tuple[np.ndarray, ...]:
    """One batched leave-one-out pass: m (B, H, R) and S, Q, T (B, H, R, C).

    ``rows`` restricts the query rows to ``[start, stop)`` (R of them; default all n),
    always against all n centres; ``pairs`` appends the pair sums D (B, H, R, C);
    ``resid`` appends the residual sums A (B, H, R, D) and U (B, H, R) of
    :func:`residual_weights`.
    ``inputs``: :func:`kernel_inputs` of ``problem`` and ``hs``, when the caller has them.
    """
    logq, pk, bias = kernel_inputs(problem, hs) if inputs is None else inputs
    if labelled:
        lab, n_groups = problem.labels, problem.dim
    else:
        lab, n_groups = np.zeros_like(problem.labels), 1
    return _backends.loo_reduce(
        logq,
        pk,
        np.ascontiguousarray(lab),
        n_groups,
        np.ascontiguousarray(1.0 / hs),
        bias,
        powers=powers,
        backend=backend,
        progress=progress,
        rows=rows,
        pairs=pairs,
        resid=residual_weights(problem) if resid else None,
    )


def residual_weights(problem: Problem) -> np.ndarray:
    """``||y_i - f_i||^2`` over the coordinates of the squared quantities, (B, n) float64.

    The per-centre weights of the engine's residual sum ``U = sum_i w_ij^2 u_i`` (the
    diagonal of the residual U-statistic); binary problems use the positive coordinate.
    """
    c = problem.coords
    r = (problem.one_hot() - centre_values(problem))[..., c]
    return np.ascontiguousarray(np.sum(r * r, axis=-1), dtype=np.float64)


def centre_values(problem: Problem) -> np.ndarray:
    """Return the centres' ``p`` as the engine's residual sums ``A = sum_i w_ij f_i`` read it.

    (B, n, D) float64: ``problem.p`` rounded to the kernel dtype. The sums that meet ``A``
    in a residual estimate (``U`` of the U-statistic, the bootstrap's ``A`` columns) take
    these values: the float64 ``p`` of a float32 problem lies between float32 numbers
    (clipped and renormalised in float64), and a 6e-8 mismatch between ``A`` and ``U``
    decides the sign of the rows whose U-statistic cancels (squared L2 errors of float32
    input were off by up to 11 %). The kernel's own logs keep the float64 ``p``.
    """
    if problem.dtype == np.float64:
        return problem.p
    return problem.p.astype(problem.dtype).astype(np.float64)
