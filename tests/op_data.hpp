// Test data and error measures shared by the op suites (test_backend_ops, test_cuda_emu).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace tandem::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

// n distinct pages out of a pool of n_pool, in a scattered, non-monotonic order as a real pool
// hands them out (distinct: two positions of one call never share a slot).
inline std::vector<int32_t> scattered_pages(int32_t n, int32_t n_pool, uint32_t seed) {
    std::vector<int32_t> all(static_cast<size_t>(n_pool));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), std::mt19937(seed));
    all.resize(size_t(n));
    return all;
}

// Normalized mean squared error of `got` against `want`; +inf if any value is not finite.
inline double nmse(const std::vector<float>& want, const std::vector<float>& got) {
    REQUIRE(want.size() == got.size());
    double err = 0, ref = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
        err += double(want[i] - got[i]) * double(want[i] - got[i]);
        ref += double(want[i]) * double(want[i]);
    }
    return ref > 0 ? err / ref : err;
}

} // namespace tandem::test
