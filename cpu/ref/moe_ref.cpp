// Scalar reference kernels of mixture-of-experts routing.
#include "cpu/ref/moe_ref.hpp"

#include <cmath>
#include <vector>

namespace tandem::cpu::ref {

void moe_route(int32_t* ids, float* weights, const float* logits, int64_t n_tok, int n_expert, int k, bool norm) {
    std::vector<float> p(static_cast<size_t>(n_expert));
    std::vector<bool> taken(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* l = logits + t * n_expert;
        // softmax over every expert
        float max = l[0];
        for (int i = 1; i < n_expert; ++i) max = std::max(max, l[i]);
        double sum = 0;
        for (int i = 0; i < n_expert; ++i) {
            p[size_t(i)] = std::exp(l[i] - max);
            sum += p[size_t(i)];
        }
        for (int i = 0; i < n_expert; ++i) p[size_t(i)] = float(p[size_t(i)] / sum);
        // the k most probable: each pass takes the first largest not taken yet (ties: lower index)
        std::fill(taken.begin(), taken.end(), false);
        double chosen = 0;
        for (int j = 0; j < k; ++j) {
            int best = -1;
            for (int i = 0; i < n_expert; ++i)
                if (!taken[size_t(i)] && (best < 0 || p[size_t(i)] > p[size_t(best)])) best = i;
            taken[size_t(best)] = true;
            ids[t * k + j] = best;
            weights[t * k + j] = p[size_t(best)];
            chosen += p[size_t(best)];
        }
        if (norm)
            for (int j = 0; j < k; ++j) weights[t * k + j] = float(weights[t * k + j] / chosen);
    }
}

void add_rows_scaled(float* x, const float* y, const int32_t* rows, const float* w, int64_t n_rows, int64_t n) {
    for (int64_t i = 0; i < n_rows; ++i) {
        float* o = x + int64_t(rows[i]) * n;
        const float* a = y + i * n;
        for (int64_t j = 0; j < n; ++j) o[j] += w[i] * a[j];
    }
}

} // namespace tandem::cpu::ref
