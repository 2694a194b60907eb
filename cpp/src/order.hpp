// Internal: the order in which the dispatchers (loo.cpp, loo_multi.cpp) lay out the
// centres.  Include it from those baseline translation units only, never from a file
// compiled for a wider instruction set (loo_prepared.hpp explains why).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kdecal {
namespace detail {

/// Rows ``idx[0..len)`` of ``x`` (K values each) sorted by ``group`` (in [0, n_groups);
/// null: one group), then by the arg max of the row (ties: the lowest coordinate), then
/// by its largest value (a NaN as -inf), then by the row index: a total order, so the
/// result does not depend on the sort or on the order of ``idx``.  Rows that predict the
/// same class with similar confidence sit together, so at small bandwidths whole chunks
/// of centres fall below exp(-kDrop) of a query's running maximum and the kernels skip
/// them.  The groups (or, with one group, the arg-max classes) are counted into place in
/// one pass and sorted on up to ``n_threads`` threads; nothing here throws inside the
/// parallel region (all memory is allocated before it).
template <class Real>
std::vector<std::int64_t> prediction_order(const Real* x, std::int64_t K,
                                           const std::int64_t* group, std::int64_t n_groups,
                                           const std::int64_t* idx, std::int64_t len,
                                           int n_threads) {
    using i64 = std::int64_t;
    struct Key {
        i64 top;
        Real value;
        i64 index;
    };
    std::vector<Key> keys(static_cast<std::size_t>(len));
    for (i64 s = 0; s < len; ++s) {
        const Real* row = x + idx[s] * K;
        i64 top = 0;
        for (i64 k = 1; k < K; ++k) top = row[k] > row[top] ? k : top;
        const Real v = row[top] == row[top] ? row[top] : -std::numeric_limits<Real>::infinity();
        keys[static_cast<std::size_t>(s)] = Key{top, v, idx[s]};
    }
    // bucket b of a row: its group, or its arg max when there is one group
    const bool by_top = group == nullptr;
    const i64 nb = by_top ? K : n_groups;
    auto bucket = [&](const Key& k) { return by_top ? k.top : group[k.index]; };
    std::vector<i64> start(static_cast<std::size_t>(nb + 1), 0);
    for (const Key& k : keys) ++start[static_cast<std::size_t>(bucket(k) + 1)];
    for (i64 b = 0; b < nb; ++b) start[b + 1] += start[b];
    std::vector<Key> sorted(keys.size());
    {
        std::vector<i64> fill(start.begin(), start.end() - 1);
        for (const Key& k : keys) sorted[static_cast<std::size_t>(fill[bucket(k)]++)] = k;
    }
    keys = std::vector<Key>();
    const auto less = [](const Key& a, const Key& b) {
        if (a.top != b.top) return a.top < b.top;
        if (a.value != b.value) return a.value < b.value;
        return a.index < b.index;
    };
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) \
    if (n_threads > 1 && len > 20000)
#endif
    for (i64 b = 0; b < nb; ++b)
        std::sort(sorted.begin() + start[b], sorted.begin() + start[b + 1], less);
    (void)n_threads;
    std::vector<i64> out(sorted.size());
    for (std::size_t s = 0; s < sorted.size(); ++s) out[s] = sorted[s].index;
    return out;
}

}  // namespace detail
}  // namespace kdecal
