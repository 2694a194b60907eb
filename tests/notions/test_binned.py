"""Tests of kdecal.binned: binned ECE (top-label / class-wise) and simplex binning.

Small examples are computed by hand in the comments; larger ones are checked against
straightforward loop implementations written here, independent of the module.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import skew

import kdecal
from conftest import real_file
from kdecal import binned


# ------------------------------------------------------------------------ references
def ref_ce_pp(conf, outcome, n_bins, p):
    """Loop reference of sum_b (n_b/n)|mean conf - freq|^p, bins [0,1/B], (b/B,(b+1)/B]."""
    conf = np.asarray(conf, dtype=np.float64)
    outcome = np.asarray(outcome, dtype=np.float64)
    n = conf.shape[0]
    total = 0.0
    seen = 0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        mask = (conf > lo) & (conf <= hi)
        if b == 0:
            mask |= conf <= lo
        if b == n_bins - 1:
            mask |= conf > hi
        seen += int(mask.sum())
        if mask.any():
            total += mask.sum() / n * abs(conf[mask].mean() - outcome[mask].mean()) ** p
    assert seen == n
    return total


def sample_problem(n, K, seed, temperature=1.0):
    """Dirichlet(1) probabilities, labels ~ Cat(probs^(1/T)) (T = 1: calibrated)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(K), size=n)
    Q = P ** (1.0 / temperature)
    Q /= Q.sum(axis=1, keepdims=True)
    y = (rng.random(n)[:, None] > np.cumsum(Q, axis=1)).sum(axis=1).clip(0, K - 1)
    return P, y


# ----------------------------------------------------------- top-label, hand example
# K = 3, n = 8, n_bins = 5: bins [0, .2], (.2, .4], (.4, .6], (.6, .8], (.8, 1]
HAND_P = np.array(
    [
        [0.9, 0.05, 0.05],  # y=0: conf .9,  correct -> bin 4
        [0.1, 0.85, 0.05],  # y=1: conf .85, correct -> bin 4
        [0.3, 0.3, 0.4],  # y=0: conf .4 (on an edge), pred 2 wrong -> bin 1
        [0.5, 0.25, 0.25],  # y=1: conf .5, wrong -> bin 2
        [0.2, 0.6, 0.2],  # y=1: conf .6 (on an edge), correct -> bin 2
        [0.0, 0.0, 1.0],  # y=2: conf 1.0, correct -> bin 4 (last bin)
        [0.7, 0.2, 0.1],  # y=0: conf .7, correct -> bin 3
        [0.45, 0.45, 0.1],  # y=1: tie -> pred 0 (lowest index), wrong; conf .45 -> bin 2
    ]
)
HAND_Y = np.array([0, 1, 0, 1, 1, 2, 0, 1])


def test_top_label_hand_example_statistics():
    s = binned.binned_statistics(HAND_P, HAND_Y, n_bins=5)
    np.testing.assert_array_equal(s.edges, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_array_equal(s.counts, [0, 1, 3, 1, 3])
    np.testing.assert_allclose(
        s.mean_confidence[1:], [0.4, 1.55 / 3, 0.7, 2.75 / 3], rtol=0, atol=1e-15
    )
    np.testing.assert_allclose(s.frequency[1:], [0.0, 1 / 3, 1.0, 1.0], rtol=0, atol=1e-15)
    assert np.isnan(s.mean_confidence[0]) and np.isnan(s.frequency[0]) and np.isnan(s.gap[0])
    np.testing.assert_allclose(s.gap[1:], [0.4, 0.55 / 3, -0.3, -0.25 / 3], atol=1e-15)
    assert s.n_samples == 8
    np.testing.assert_allclose(s.weights, [0, 1 / 8, 3 / 8, 1 / 8, 3 / 8])
    with pytest.raises(ValueError):
        s.counts[0] = 1  # read-only


def test_top_label_hand_example_ece():
    # L1: (1*.4 + 3*(.55/3) + 1*.3 + 3*(.25/3)) / 8 = 1.5 / 8
    assert binned.ece(HAND_P, HAND_Y, n_bins=5) == pytest.approx(0.1875, abs=1e-15)
    l2 = math.sqrt((0.4**2 + 3 * (0.55 / 3) ** 2 + 0.3**2 + 3 * (0.25 / 3) ** 2) / 8)
    assert binned.ece(HAND_P, HAND_Y, n_bins=5, p=2) == pytest.approx(l2, abs=1e-15)
    # one bin: |mean conf - accuracy| = |(.9+.85+.4+.5+.6+1+.7+.45)/8 - 5/8| = .05
    assert binned.ece(HAND_P, HAND_Y, n_bins=1) == pytest.approx(0.05, abs=1e-15)


# ------------------------------------------------------------------- edges and 0 / 1
def test_confidence_zero_one_and_edges():
    # class-wise, class 1 of a binary (n,) input: the confidence is p itself
    p = np.array([0.0, 1.0, 0.5, 0.1, 0.9, 0.35])
    y = np.array([0, 1, 1, 0, 1, 0])
    s = binned.binned_statistics(p, y, n_bins=10, calibration="classwise", class_index=1)
    # 0.0 -> first bin; 0.1 = edge -> [0, .1]; 0.35 -> (.3, .4]; 0.5 = edge -> (.4, .5];
    # 0.9 = edge -> (.8, .9]; 1.0 -> last bin (.9, 1]
    np.testing.assert_array_equal(s.counts, [2, 0, 0, 1, 1, 0, 0, 0, 1, 1])
    assert s.counts.sum() == 6 and s.counts.shape == (10,)
    np.testing.assert_allclose(s.mean_confidence[[0, 3, 4, 8, 9]], [0.05, 0.35, 0.5, 0.9, 1.0])
    np.testing.assert_allclose(s.frequency[[0, 3, 4, 8, 9]], [0.0, 0.0, 1.0, 1.0, 1.0])


def test_confidence_one_in_last_bin_torchmetrics_3510():
    # torchmetrics #3510: a confidence of 1.0 went to a phantom (n_bins + 1)-th bin
    p = np.array([0.95, 1.0])
    y = np.array([1, 0])
    s = binned.binned_statistics(p, y, n_bins=15)
    assert s.counts.shape == (15,) and s.counts[-1] == 2 and s.counts.sum() == 2
    assert s.mean_confidence[-1] == pytest.approx(0.975)
    assert s.frequency[-1] == pytest.approx(0.5)
    assert binned.ece(p, y, n_bins=15) == pytest.approx(0.475)
    # a one-hot K = 10 row: conf exactly 1.0, not clipped to 1 - 9e-12
    P = np.eye(10)[[3, 3, 7]]
    s = binned.binned_statistics(P, np.array([3, 2, 7]), n_bins=15)
    assert s.counts[-1] == 3 and s.mean_confidence[-1] == 1.0
    assert binned.ece(P, np.array([3, 2, 7])) == pytest.approx(1 / 3, abs=1e-15)


def test_uniform_bins_agree_with_ceil_rule_and_edges():
    rng = np.random.default_rng(0)
    for n_bins in (1, 2, 7, 10, 15, 49):
        conf = np.concatenate([rng.random(500), np.arange(n_bins + 1) / n_bins, [0.0, 1.0]])
        s_edges, idx = binned._uniform_bins(conf, n_bins)
        # README convention: bin = ceil(conf * B) - 1, clipped
        ceil_idx = np.clip(np.ceil(conf * n_bins) - 1, 0, n_bins - 1).astype(int)
        np.testing.assert_array_equal(idx[:500], ceil_idx[:500])
        # consistency with the reported edges: (e_b, e_b+1], first bin also holds e_0
        lo, hi = s_edges[idx], s_edges[idx + 1]
        assert np.all((conf <= hi) & ((conf > lo) | ((idx == 0) & (conf == lo))))
        # a decimal edge b/B lands in bin b - 1 (right-closed)
        np.testing.assert_array_equal(
            idx[500 : 500 + n_bins + 1], np.maximum(np.arange(n_bins + 1) - 1, 0)
        )


def test_empty_bins_contribute_nothing():
    # everything in (.9, 1]: 99 empty bins of 100
    P = np.array([[0.95, 0.05], [0.93, 0.07], [0.05, 0.95], [0.99, 0.01]])
    y = np.array([0, 1, 1, 0])
    s = binned.binned_statistics(P, y, n_bins=100)
    assert np.count_nonzero(s.counts) == 3  # (.92,.93], (.94,.95], (.98,.99]
    assert np.isnan(s.mean_confidence[s.counts == 0]).all()
    assert np.isnan(s.frequency[s.counts == 0]).all()
    # per point here: |.95 - 1|, |.93 - 0|, |.95 - 1| (bin .95 has both), |.99 - 1|
    expected = (2 * abs(0.95 - 1) + abs(0.93 - 0) + abs(0.99 - 1)) / 4
    assert binned.ece(P, y, n_bins=100) == pytest.approx(expected, abs=1e-14)
    # one bin holds all four: |mean conf - acc| = |(.95+.93+.95+.99)/4 - 3/4|
    assert binned.ece(P, y, n_bins=1) == pytest.approx(abs(3.82 / 4 - 0.75), abs=1e-14)


# ------------------------------------------------------------------------- quantile
def test_quantile_bins_with_ties_hand_example():
    p = np.array([0.2, 0.2, 0.6, 0.2, 0.9, 0.6, 0.5, 0.2])
    y = np.array([0, 1, 1, 0, 1, 0, 1, 0])
    # class 1: sorted conf .2 .2 .2 .2 .5 .6 .6 .9; n = 8, B = 4: ranks ceil(2j) = 2,4,6,8
    # candidate edges x1, x2, x4, x6, x8 = .2 .2 .2 .6 .9 -> merged to [.2, .6, .9]
    s1 = binned.binned_statistics(
        p, y, n_bins=4, binning="quantile", calibration="classwise", class_index=1
    )
    np.testing.assert_array_equal(s1.edges, [0.2, 0.6, 0.9])
    np.testing.assert_array_equal(s1.counts, [7, 1])  # [.2, .6] and (.6, .9]
    np.testing.assert_allclose(s1.mean_confidence, [2.5 / 7, 0.9])
    np.testing.assert_allclose(s1.frequency, [3 / 7, 1.0])
    # class-1 CE_1 = 7/8 * |2.5/7 - 3/7| + 1/8 * |.9 - 1| = .0625 + .0125 = .075
    # class 0: conf 1 - p sorted .1 .4 .4 .5 .8 .8 .8 .8; edges x1,x2,x4,x6,x8 =
    # .1 .4 .5 .8 .8 -> [.1, .4, .5, .8]; bins {.1,.4,.4} {.5} {.8 x4}
    s0 = binned.binned_statistics(
        p, y, n_bins=4, binning="quantile", calibration="classwise", class_index=0
    )
    np.testing.assert_allclose(s0.edges, [0.1, 0.4, 0.5, 0.8])
    np.testing.assert_array_equal(s0.counts, [3, 1, 4])
    # class-0 CE_1 = 3/8 |.3 - 1/3| + 1/8 |.5 - 0| + 4/8 |.8 - .75| = .0125+.0625+.025 = .1
    got = binned.ece(p, y, n_bins=4, binning="quantile", calibration="classwise")
    assert got == pytest.approx((0.075 + 0.1) / 2, abs=1e-14)
    # stacked form: padded to n_bins with count 0 and NaN edges
    s = binned.binned_statistics(p, y, n_bins=4, binning="quantile", calibration="classwise")
    assert s.counts.shape == (2, 4) and s.edges.shape == (2, 5)
    np.testing.assert_array_equal(s.counts, [[3, 1, 4, 0], [7, 1, 0, 0]])
    assert np.isnan(s.edges[1, 3:]).all() and np.isnan(s.edges[0, 4])
    assert np.isnan(s.mean_confidence[1, 2:]).all()


def test_quantile_bins_equal_mass_without_ties():
    conf = np.linspace(0.05, 0.95, 10)  # n = 10, B = 3: ranks 4, 7, 10 -> sizes 4, 3, 3
    edges, idx = binned._quantile_bins(conf, 3)
    np.testing.assert_allclose(edges, conf[[0, 3, 6, 9]])
    np.testing.assert_array_equal(np.bincount(idx), [4, 3, 3])
    # all equal -> one degenerate bin [c, c]
    edges, idx = binned._quantile_bins(np.full(5, 0.3), 4)
    np.testing.assert_array_equal(edges, [0.3, 0.3])
    np.testing.assert_array_equal(idx, 0)
    # fewer samples than bins: one bin per distinct value, the first [x_(1), x_(1)]
    # (the first two shared [.1, .4] when x_(1) was merged with the left end)
    edges, idx = binned._quantile_bins(np.array([0.7, 0.1, 0.4]), 15)
    np.testing.assert_array_equal(edges, [0.1, 0.1, 0.4, 0.7])
    np.testing.assert_array_equal(idx, [2, 0, 1])
    # n bins of n distinct values: one row per bin, so the binned L2 ECE is the root
    # mean square of conf - outcome over the rows
    rng = np.random.default_rng(0)
    p = rng.uniform(0.5, 1, 10)
    y = (rng.uniform(size=10) < p).astype(int)
    P = np.column_stack([1 - p, p])
    st = binned.binned_statistics(P, y, n_bins=10, binning="quantile")
    np.testing.assert_array_equal(st.counts, np.ones(10))
    got = binned.ece(P, y, n_bins=10, binning="quantile", p=2)
    np.testing.assert_allclose(
        got, np.sqrt(np.mean((np.maximum(p, 1 - p) - (P.argmax(1) == y)) ** 2))
    )


def test_quantile_bins_properties_random_ties():
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(1, 60))
        n_bins = int(rng.integers(1, 20))
        conf = np.round(rng.random(n), int(rng.integers(0, 3)))  # heavy ties
        edges, idx = binned._quantile_bins(conf, n_bins)
        nb = edges.shape[0] - 1
        assert 1 <= nb <= min(n_bins, max(1, np.unique(conf).size))
        counts = np.bincount(idx, minlength=nb)
        assert counts.shape == (nb,) and counts.sum() == n
        assert np.all(counts > 0), (trial, conf, edges)  # never empty by construction
        for v in np.unique(conf):  # ties stay together
            assert np.unique(idx[conf == v]).size == 1
        # increasing; the first bin [x_(1), x_(1)] has width 0 when n_bins >= n
        assert np.all(np.diff(edges[1:]) > 0) or nb == 1
        assert edges[1] > edges[0] or n_bins >= n or nb == 1
        lo, hi = edges[idx], edges[idx + 1]
        assert np.all((conf <= hi) & ((conf > lo) | ((idx == 0) & (conf == lo))))


# ----------------------------------------------------------------------- class-wise
@pytest.mark.parametrize("p", [1, 2, 1.5])
def test_classwise_is_mean_of_binary_problems(p):
    P, y = sample_problem(300, 4, seed=2, temperature=0.7)
    got = binned.ece(P, y, n_bins=10, calibration="classwise", p=p)
    per_class = [ref_ce_pp(P[:, c], y == c, 10, p) for c in range(4)]
    assert got == pytest.approx(np.mean(per_class) ** (1 / p), rel=1e-12)
    # the same through K separate binary (n,) calls: class 1 of (p_c, 1[y == c])
    sep = [
        binned.ece(P[:, c], (y == c).astype(int), n_bins=10, calibration="classwise", p=p)
        for c in range(4)
    ]
    # each binary call averages its two columns, p_c and 1 - p_c (mirror bins)
    mirror = [ref_ce_pp(1 - P[:, c], y != c, 10, p) for c in range(4)]
    for c in range(4):
        assert sep[c] == pytest.approx(((per_class[c] + mirror[c]) / 2) ** (1 / p), rel=1e-12)
    # stacked statistics row c == class_index=c
    s = binned.binned_statistics(P, y, n_bins=10, calibration="classwise")
    assert s.counts.shape == (4, 10) and s.edges.shape == (4, 11)
    for c in range(4):
        sc = binned.binned_statistics(P, y, n_bins=10, calibration="classwise", class_index=c)
        np.testing.assert_array_equal(s.counts[c], sc.counts)
        np.testing.assert_array_equal(s.mean_confidence[c], sc.mean_confidence)


@pytest.mark.parametrize("p", [1, 2])
def test_top_label_matches_reference(p):
    P, y = sample_problem(400, 5, seed=3, temperature=1.5)
    conf = P.max(axis=1)
    correct = P.argmax(axis=1) == y
    for n_bins in (1, 5, 15):
        ref = ref_ce_pp(conf, correct, n_bins, p) ** (1 / p)
        assert binned.ece(P, y, n_bins=n_bins, p=p) == pytest.approx(ref, rel=1e-12)


def test_binary_vector_equals_two_columns_and_float32():
    rng = np.random.default_rng(4)
    p = rng.random(200)
    y = (rng.random(200) < p**0.7).astype(np.int64)
    P2 = np.stack([1 - p, p], axis=1)
    for kw in (
        {},
        {"calibration": "classwise"},
        {"binning": "quantile", "p": 2},
        {"binning": "quantile", "calibration": "classwise"},
    ):
        assert binned.ece(p, y, **kw) == binned.ece(P2, y, **kw)
    assert binned.simplex_ece(p, y, n_bins_per_side=4) == binned.simplex_ece(
        P2, y, n_bins_per_side=4
    )
    P32 = P2.astype(np.float32)
    assert binned.ece(P32, y) == pytest.approx(binned.ece(P32.astype(np.float64), y))
    before = P32.copy()
    binned.ece(P32, y)
    np.testing.assert_array_equal(P32, before)  # input not modified


def test_permutation_invariance():
    P, y = sample_problem(500, 3, seed=5, temperature=0.8)
    perm = np.random.default_rng(0).permutation(500)
    for kw in ({}, {"binning": "quantile", "calibration": "classwise"}):
        assert binned.ece(P[perm], y[perm], **kw) == pytest.approx(binned.ece(P, y, **kw))
    assert binned.simplex_ece(P[perm], y[perm], n_bins_per_side=6) == pytest.approx(
        binned.simplex_ece(P, y, n_bins_per_side=6), rel=1e-13
    )


def test_real_vgg16_top_label_ece15():
    with np.load(real_file("cifar10_vgg16_keras_verifiedcal.npz"), allow_pickle=False) as d:
        P, y = d["probs"], d["labels"]
    got = binned.ece(P, y, n_bins=15)
    assert round(100 * got, 2) == 3.98  # data README, ECE15 column
    assert got == pytest.approx(0.0398, abs=5e-5)
    s = binned.binned_statistics(P, y)
    assert s.counts.sum() == 10000
    assert s.counts[-1] == 9168  # most predictions are in (14/15, 1]


# ------------------------------------------------------------------ simplex binning
def grid_triangles(m):
    """The m^2 triangles of the standard triangular grid, vertices in (p1, p2) / m."""
    tris = []
    for i in range(m):
        for j in range(m - i):
            tris.append(np.array([[i, j], [i + 1, j], [i, j + 1]], float) / m)  # upward
            if i + j <= m - 2:
                tris.append(np.array([[i + 1, j], [i, j + 1], [i + 1, j + 1]], float) / m)
    assert len(tris) == m * m
    return tris


def barycentric(V, x):
    """Barycentric coordinates of x (K,) w.r.t. simplex vertices V (K, K) (rows)."""
    return np.linalg.solve(V.T, x)


def cell_vertices(P, m):
    a, perm = binned._simplex_cell_keys(P, m)
    return [binned._kuhn_vertices(a[i], perm[i], m) for i in range(P.shape[0])]


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_simplex_k3_cells_match_brute_force_triangles(m):
    rng = np.random.default_rng(10 + m)
    P = rng.dirichlet(np.ones(3), size=400)
    tris = grid_triangles(m)
    for x, V in zip(P, cell_vertices(P, m)):
        # brute force: the grid triangle whose barycentric coordinates are all >= 0
        hits = []
        for T in tris:
            V3 = np.column_stack([T, 1 - T.sum(axis=1)])
            if np.all(barycentric(V3, x) >= -1e-12):
                hits.append(V3)
        assert len(hits) == 1  # interior points (probability 1)
        key = {tuple(np.round(v * m).astype(int)) for v in V}
        assert key == {tuple(np.round(v * m).astype(int)) for v in hits[0]}


def test_simplex_k3_rule_integer_parts_and_parity():
    # i = floor(m p1), j = floor(m p2), up iff frac(m p1) + frac(m p2) < 1
    rng = np.random.default_rng(11)
    m = 6
    P = rng.dirichlet(np.ones(3), size=2000)
    a, perm = binned._simplex_cell_keys(P, m)
    i, j = np.floor(m * P[:, 0]), np.floor(m * P[:, 1])
    up = (m * P[:, 0] - i) + (m * P[:, 1] - j) < 1
    np.testing.assert_array_equal(a[:, 0], i)
    np.testing.assert_array_equal(a[:, 1], i + j + ~up)
    np.testing.assert_array_equal(perm[:, 0], np.where(up, 1, 0))  # up: t_2 >= t_1


def test_simplex_boundary_points_get_a_valid_cell():
    # vertices, edges, grid lines and grid nodes: the cell must contain the point and lie
    # inside the simplex (the tie-breaking rule)
    m = 4
    pts = []
    for K in (2, 3, 4, 5):
        grid = [
            np.array(c) / m for c in itertools.product(range(m + 1), repeat=K - 1) if sum(c) <= m
        ]
        nodes = [np.append(g, 1 - g.sum()) for g in grid]
        rng = np.random.default_rng(K)
        mids = [(u + v) / 2 for u, v in zip(nodes, rng.permutation(nodes))]
        face = rng.dirichlet(np.ones(K), size=50)
        face[:, 0] = 0.0
        face /= face.sum(axis=1, keepdims=True)
        pts.append(np.array(nodes + mids + list(face)))
    for P in pts:
        for x, V in zip(P, cell_vertices(P, m)):
            assert np.all(V >= -1e-12), (x, V)  # a cell of the simplex
            np.testing.assert_allclose(V.sum(axis=1), 1.0)
            lam = barycentric(V, x)
            assert np.all(lam >= -1e-9), (x, V, lam)


@pytest.mark.parametrize("K", [3, 4, 5])
def test_simplex_points_in_their_cells(K):
    rng = np.random.default_rng(20 + K)
    P = rng.dirichlet(np.full(K, 0.7), size=300)
    for x, V in zip(P, cell_vertices(P, 3)):
        assert np.all(barycentric(V, x) >= -1e-12)


@pytest.mark.parametrize(("K", "m"), [(3, 4), (4, 3), (5, 2)])
def test_simplex_cells_equal_volume(K, m):
    rng = np.random.default_rng(30 + K)
    N = 2000 * m ** (K - 1)
    P = rng.dirichlet(np.ones(K), size=N)  # uniform on the simplex
    cell = binned._simplex_cells(P, m)
    counts = np.bincount(cell)
    assert counts.shape[0] == m ** (K - 1)  # exactly m^(K-1) cells
    # Monte Carlo: every cell gets N / m^(K-1) = 2000 points, sd ~ 45
    assert np.all(np.abs(counts / 2000 - 1) < 0.12), counts
    # exactly: every cell's volume is vol(simplex) / m^(K-1) in the (p_1..p_{K-1}) chart
    a, perm = binned._simplex_cell_keys(P, m)
    key = np.concatenate([a, perm], axis=1)
    _, first = np.unique(key, axis=0, return_index=True)
    assert first.shape[0] == m ** (K - 1)
    vols = []
    for i in first:
        V = binned._kuhn_vertices(a[i], perm[i], m)[:, : K - 1]
        vols.append(abs(np.linalg.det(V[1:] - V[0])) / math.factorial(K - 1))
    np.testing.assert_allclose(vols, 1 / (math.factorial(K - 1) * m ** (K - 1)), rtol=1e-10)


def test_simplex_ece_hand_example():
    # m = 2: four triangles. (i, j) = floor(2 p1), floor(2 p2), up iff fractions sum < 1
    P = np.array(
        [
            [0.7, 0.1, 0.2],  # A y=0: i=1 (.4), j=0 (.2): up(1,0)
            [0.8, 0.15, 0.05],  # B y=1: i=1 (.6), j=0 (.3): up(1,0)
            [0.1, 0.1, 0.8],  # C y=2: up(0,0)
            [0.4, 0.4, 0.2],  # D y=0: .8 + .8 >= 1: down(0,0)
            [0.3, 0.3, 0.4],  # E y=1: .6 + .6 >= 1: down(0,0)
            [0.2, 0.7, 0.1],  # F y=1: i=0 (.4), j=1 (.4): up(0,1)
        ]
    )
    y = np.array([0, 1, 2, 0, 1, 1])
    # H: {A,B} -> (.5,.5,0); {C} -> (0,0,1); {D,E} -> (.5,.5,0); {F} -> (0,1,0)
    # L1 per point: A .2+.4+.2=.8, B .3+.35+.05=.7, C .1+.1+.2=.4, D .1+.1+.2=.4,
    #               E .2+.2+.4=.8, F .2+.3+.1=.6
    assert binned.simplex_ece(P, y, n_bins_per_side=2) == pytest.approx(3.7 / 6, abs=1e-14)
    # squares: A .24, B .215, C .06, D .06, E .24, F .14
    got = binned.simplex_ece(P, y, n_bins_per_side=2, p=2)
    assert got == pytest.approx(math.sqrt(0.955 / 6), abs=1e-14)
    # m = 1: one cell, H = label frequencies (2/6, 3/6, 1/6) for every point
    H = np.array([2, 3, 1]) / 6
    ref = np.mean(np.abs(H - P).sum(axis=1))
    assert binned.simplex_ece(P, y, n_bins_per_side=1) == pytest.approx(ref, abs=1e-14)


def test_simplex_ece_binary_intervals():
    rng = np.random.default_rng(6)
    p = rng.random(300)
    y = (rng.random(300) < p).astype(int)
    m = 7
    cell = np.minimum(np.floor(m * (1 - p)), m - 1)  # intervals of width 1/m in p_0
    H1 = np.array([y[cell == c].mean() for c in cell])
    # ||H - f||_1 = 2 |H_1 - p| for two classes
    got = binned.simplex_ece(p, y, n_bins_per_side=m)
    assert got == pytest.approx(2 * np.mean(np.abs(H1 - p)), rel=1e-12)


def test_simplex_ece_calibrated_small_and_decreasing():
    vals = []
    for n in (1000, 10000, 100000):
        P, y = sample_problem(n, 3, seed=n, temperature=1.0)
        vals.append(binned.simplex_ece(P, y))
    assert vals[0] > vals[1] > vals[2]
    assert vals[2] < 0.1
    # a miscalibrated model (temperature 0.5) is clearly larger at the same n
    P, y = sample_problem(100000, 3, seed=1, temperature=0.5)
    assert binned.simplex_ece(P, y) > 2 * vals[2]
    # fixed m: decreases with n towards the within-cell spread
    fixed = [
        binned.simplex_ece(*sample_problem(n, 3, seed=7 + n), n_bins_per_side=5)
        for n in (500, 5000, 50000)
    ]
    assert fixed[0] > fixed[1] > fixed[2]


def test_simplex_default_bins_per_side_is_doane():
    P, y = sample_problem(500, 3, seed=8)
    n = 500
    sg1 = math.sqrt(6 * (n - 2) / ((n + 1) * (n + 3)))
    k = [1 + math.log2(n) + math.log2(1 + abs(skew(P[:, c])) / sg1) for c in range(3)]
    m = math.ceil(np.mean(k))
    assert binned._default_bins_per_side(P) == m
    assert binned.simplex_ece(P, y) == binned.simplex_ece(P, y, n_bins_per_side=m)
    # tiny inputs
    assert binned._default_bins_per_side(np.array([[0.5, 0.5]])) == 1
    assert binned.simplex_ece(np.array([[0.2, 0.8]]), [1]) == pytest.approx(0.4)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "bad,exc",
    [
        (0, ValueError),
        (-3, ValueError),
        (2.5, TypeError),
        (15.0, TypeError),
        (True, TypeError),
        ("15", TypeError),
        (None, TypeError),
    ],
)
def test_bad_n_bins(bad, exc):
    with pytest.raises(exc, match="n_bins"):
        binned.ece(HAND_P, HAND_Y, n_bins=bad)
    with pytest.raises(exc, match="n_bins"):
        binned.binned_statistics(HAND_P, HAND_Y, n_bins=bad)
    if bad is not None:
        with pytest.raises(exc, match="n_bins_per_side"):
            binned.simplex_ece(HAND_P, HAND_Y, n_bins_per_side=bad)


def test_bad_options_and_p():
    with pytest.raises(ValueError, match="binning"):
        binned.ece(HAND_P, HAND_Y, binning="equal")
    with pytest.raises(ValueError, match="calibration"):
        binned.ece(HAND_P, HAND_Y, calibration="canonical")
    with pytest.raises(ValueError, match="calibration"):
        binned.binned_statistics(HAND_P, HAND_Y, calibration="marginal")
    for p in (0.5, 0, -1, float("nan"), -float("inf")):
        with pytest.raises(ValueError, match="p must"):
            binned.ece(HAND_P, HAND_Y, p=p)
        with pytest.raises(ValueError, match="p must"):
            binned.simplex_ece(HAND_P, HAND_Y, p=p)
    with pytest.raises(TypeError):
        binned.ece(HAND_P, HAND_Y, p="2")
    with pytest.raises(ValueError, match="class_index"):
        binned.binned_statistics(HAND_P, HAND_Y, class_index=0)
    for ci in (3, -1, 1.0):
        with pytest.raises(ValueError, match="class_index"):
            binned.binned_statistics(HAND_P, HAND_Y, calibration="classwise", class_index=ci)


@pytest.mark.parametrize(
    ("probs", "labels", "exc"),
    [
        (np.array([[0.5, 0.6], [0.5, 0.5]]), [0, 1], ValueError),  # row sum
        (np.array([[1.2, -0.2], [0.5, 0.5]]), [0, 1], ValueError),  # negative
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), [0, 1], ValueError),  # non-finite
        (np.array([0.5, 1.5]), [0, 1], ValueError),  # binary > 1
        (np.ones((2, 1)), [0, 0], ValueError),  # K = 1
        (np.full((2, 2, 2), 0.5), [0, 1], ValueError),  # 3-D
        (np.zeros((0, 3)), [], ValueError),  # empty
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, 2], ValueError),  # label out of range
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0], ValueError),  # length mismatch
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0.5, 1], ValueError),  # fractional label
        (np.array([["a", "b"]]), [0], TypeError),  # non-numeric
    ],
)
def test_bad_inputs(probs, labels, exc):
    for fn in (binned.ece, binned.binned_statistics, binned.simplex_ece):
        with pytest.raises(exc):
            fn(probs, labels)


# -------------------------------------------- issue 28: MCE, debiased, sweep binning
def ref_bins(conf, outcome, n_bins, binning):
    """(count, mean confidence, frequency) of every non-empty bin, in order, by loops."""
    conf = np.asarray(conf, dtype=np.float64)
    outcome = np.asarray(outcome, dtype=np.float64)
    n = conf.shape[0]
    if binning == "uniform":
        edges = [b / n_bins for b in range(n_bins + 1)]
    else:  # order statistics x_(1), x_(ceil(j n / B)), ties merged
        xs = sorted(conf)
        quantiles = {xs[-(-j * n // n_bins) - 1] for j in range(1, n_bins + 1)}
        if n_bins >= n:  # ceil(n / B) = 1: the first bin is [x_(1), x_(1)]
            edges = [xs[0]] + sorted(quantiles)
        else:
            edges = sorted({xs[0]} | quantiles)
        if len(edges) == 1:
            edges = edges * 2
    out = []
    B = len(edges) - 1
    for b in range(B):
        mask = (conf > edges[b]) & (conf <= edges[b + 1])
        if b == 0:
            mask |= conf <= edges[0]
        if b == B - 1:
            mask |= conf > edges[-1]
        if mask.any():
            out.append((int(mask.sum()), conf[mask].mean(), outcome[mask].mean()))
    assert sum(c for c, _, _ in out) == n
    return out


def ref_problems(P, y, calibration):
    if calibration == "top_label":
        pred = P.argmax(axis=1)
        return [(P.max(axis=1), (pred == y).astype(float))]
    return [(P[:, c], (y == c).astype(float)) for c in range(P.shape[1])]


def ref_sweep(conf, outcome, binning, limit=None):
    """The sweep's number of bins by its definition, with at most ``limit`` bins."""
    best = 1
    for b in range(2, (max(len(conf), 1000) if limit is None else limit) + 1):
        freq = [f for _, _, f in ref_bins(conf, outcome, b, binning)]
        if any(f1 < f0 for f0, f1 in zip(freq[:-1], freq[1:])):
            break
        best = b
    return best


@pytest.mark.parametrize("calibration", ["top_label", "classwise"])
@pytest.mark.parametrize("binning", ["uniform", "quantile"])
def test_mce_matches_definition(calibration, binning):
    P, y = sample_problem(300, 4, seed=21, temperature=2.0)
    ref = max(
        abs(mc - fr)
        for conf, out in ref_problems(P, y, calibration)
        for _, mc, fr in ref_bins(conf, out, 10, binning)
    )
    got = binned.ece(P, y, n_bins=10, binning=binning, calibration=calibration, p=np.inf)
    assert got == pytest.approx(ref, abs=1e-15)
    # the limit of the L_p error as p grows
    big = binned.ece(P, y, n_bins=10, binning=binning, calibration=calibration, p=400)
    assert got >= big > 0.97 * got


def test_simplex_ece_inf_is_max_norm():
    P, y = sample_problem(200, 3, seed=22, temperature=2.0)
    got = binned.simplex_ece(P, y, n_bins_per_side=4, p=np.inf)
    cell = binned._simplex_cells(P, 4)
    H = np.array([np.eye(3)[y[cell == cell[i]]].mean(axis=0) for i in range(200)])
    assert got == pytest.approx(float(np.max(np.abs(H - P))), abs=1e-15)
    assert got >= binned.simplex_ece(P, y, n_bins_per_side=4, p=200) > 0.95 * got


def ref_debiased_sq(conf, outcome, n_bins, binning):
    n = len(conf)
    return sum(
        c / n * ((mc - fr) ** 2 - fr * (1 - fr) / (c - 1))
        for c, mc, fr in ref_bins(conf, outcome, n_bins, binning)
        if c >= 2
    )


@pytest.mark.parametrize("calibration", ["top_label", "classwise"])
@pytest.mark.parametrize("binning", ["uniform", "quantile"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_debiased_matches_definition(calibration, binning, temperature):
    # T = 1: calibrated, the estimate is often negative (reported as the signed root)
    P, y = sample_problem(150, 3, seed=23, temperature=temperature)
    v = np.mean([ref_debiased_sq(c, o, 12, binning) for c, o in ref_problems(P, y, calibration)])
    got = binned.ece(P, y, n_bins=12, binning=binning, calibration=calibration, p=2, debias=True)
    assert got == pytest.approx(math.copysign(math.sqrt(abs(v)), v), abs=1e-12)


def test_debiased_is_unbiased_for_the_binned_error():
    # given the bins (one bin here: n_b = n), E[(conf - acc)^2 - acc(1 - acc)/(n - 1)] over
    # Bernoulli(q) labels equals (conf - q)^2 exactly: enumerate all 2^n outcomes
    conf = np.array([0.55, 0.6, 0.62, 0.7, 0.8, 0.66])
    q = 0.5
    total = 0.0
    for bits in itertools.product((0, 1), repeat=6):
        w = q ** sum(bits) * (1 - q) ** (6 - sum(bits))
        v = binned.ece(conf, np.array(bits), n_bins=1, calibration="classwise", p=2, debias=True)
        total += w * math.copysign(v * v, v)
    # class-wise averages the two columns, which have the same squared gap
    assert total == pytest.approx((conf.mean() - q) ** 2, abs=1e-15)


@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_matches_uncertainty_calibration(mode):
    cal = pytest.importorskip("calibration")
    P, y = sample_problem(2000, 4, seed=24, temperature=2.5)
    ref = cal.utils.lower_bound_scaling_ce(
        P,
        y,
        p=2,
        debias=True,
        num_bins=15,
        binning_scheme=cal.utils.get_equal_prob_bins,
        mode=mode,
    )
    kw = {"calibration": "top_label" if mode == "top-label" else "classwise"}
    assert ref > 0.01  # where its clip at 0 does not act
    assert binned.ece(P, y, n_bins=15, p=2, debias=True, **kw) == pytest.approx(ref, abs=1e-12)
    plug = cal.utils.lower_bound_scaling_ce(
        P,
        y,
        p=2,
        debias=False,
        num_bins=15,
        binning_scheme=cal.utils.get_equal_prob_bins,
        mode=mode,
    )
    assert binned.ece(P, y, n_bins=15, p=2, **kw) == pytest.approx(plug, abs=1e-12)


@pytest.mark.parametrize("calibration", ["top_label", "classwise"])
@pytest.mark.parametrize("binning", ["uniform", "quantile"])
def test_sweep_matches_definition(calibration, binning):
    P, y = sample_problem(400, 3, seed=25, temperature=1.5)
    terms, chosen = [], []
    for conf, out in ref_problems(P, y, calibration):
        b = ref_sweep(conf, out, binning)
        chosen.append(b)
        terms.append(
            sum(c / 400 * (mc - fr) ** 2 for c, mc, fr in ref_bins(conf, out, b, binning))
        )
    assert max(chosen) > 1  # the sweep does something here
    got = binned.ece(P, y, n_bins="sweep", binning=binning, calibration=calibration, p=2)
    assert got == pytest.approx(math.sqrt(np.mean(terms)), abs=1e-12)
    # with one problem, it is the ECE with the chosen number of bins
    if calibration == "top_label":
        fixed = binned.ece(P, y, n_bins=chosen[0], binning=binning, p=2)
        assert got == pytest.approx(fixed, abs=1e-15)
    # the sweep also combines with the debiased and the max estimators
    for kw in ({"p": 2, "debias": True}, {"p": np.inf}, {"p": 1}):
        assert np.isfinite(binned.ece(P, y, n_bins="sweep", binning=binning, **kw))


@pytest.mark.parametrize("binning", ["uniform", "quantile"])
def test_sweep_on_tied_confidences_matches_definition(binning):
    # the sweep works on the distinct confidences: ties, values on bin edges, few values
    rng = np.random.default_rng(31)
    chosen = []
    for case in range(24):
        n = int(rng.integers(5, 120))
        if case % 4 == 0:
            conf = np.round(rng.random(n), 1)
        elif case % 4 == 1:  # on the uniform edges of 7 and 10 bins
            conf = rng.choice(np.r_[np.arange(8) / 7, np.arange(11) / 10], n)
        elif case % 4 == 2:
            conf = rng.choice(rng.random(3), n)
        else:
            conf = rng.random(n)
        truth = np.clip(conf + rng.normal(0.0, 0.15, n), 0.0, 1.0)
        out = (rng.random(n) < truth).astype(np.float64)
        got = binned._sweep_bins(conf, out, binning, 60)
        assert got == ref_sweep(conf, out, binning, 60), case
        chosen.append(got)
    assert 60 in chosen and any(1 < b < 60 for b in chosen)


def test_sweep_with_monotone_frequencies_takes_every_bin():
    # no number of bins breaks the monotony when the distinct confidences' frequencies
    # are non-decreasing: the most bins, max(n, 1000), at once (this took minutes)
    n = 50_000
    rng = np.random.default_rng(32)
    for conf in (np.full(n, 0.7), rng.choice([0.2, 0.5, 0.9], n)):
        P = np.column_stack([1.0 - conf, conf])
        y = (rng.random(n) < conf).astype(np.int64)
        out = (y == 1).astype(np.float64)
        u = np.unique(conf)
        freq = [out[conf == v].mean() for v in u]
        assert np.all(np.diff(freq) >= 0.0)
        for binning in ("uniform", "quantile"):
            assert binned._sweep_bins(conf, out, binning, n) == n
            assert binned.ece(
                P, y, n_bins="sweep", binning=binning, calibration="classwise"
            ) == binned.ece(P, y, n_bins=n, binning=binning, calibration="classwise")


def test_new_options_bad_input():
    with pytest.raises(ValueError, match="debias"):
        binned.ece(HAND_P, HAND_Y, debias=True)  # p = 1
    with pytest.raises(ValueError, match="debias"):
        binned.ece(HAND_P, HAND_Y, p=np.inf, debias=True)
    with pytest.raises(TypeError, match="debias"):
        binned.ece(HAND_P, HAND_Y, p=2, debias="yes")
    with pytest.raises(TypeError, match="sweep"):
        binned.ece(HAND_P, HAND_Y, n_bins="auto")
    with pytest.raises(ValueError, match="p must"):
        binned.ece(HAND_P, HAND_Y, p=-np.inf)


def test_stray_entries_are_clipped_as_the_warning_says():
    """Entries outside [0, 1] by at most 0.01 are accepted "clipped to [0, 1]": the binned,
    smooth and SKCE metrics used the unclipped values (a mean confidence of 1.005)."""
    stray = np.array([[1.005, -0.005], [0.5, 0.5], [0.3, 0.7]])
    clean = np.array([[1.0, 0.0], [0.5, 0.5], [0.3, 0.7]])
    y = [0, 1, 1]
    with pytest.warns(kdecal.RenormalizationWarning, match="clipped to"):
        st = binned.binned_statistics(stray, y)
    assert np.nanmax(st.mean_confidence) == 1.0
    for fn in (binned.ece, kdecal.smooth_ece):
        with pytest.warns(kdecal.RenormalizationWarning):
            got = fn(stray, y)
        assert got == fn(clean, y)
    assert binned.ece(clean, y) == pytest.approx((0.0 + 0.5 + 0.3) / 3)
