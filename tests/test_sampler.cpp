// Sampler suite: rng stream, greedy, penalties, filters, empirical distributions, logprobs.
#include "runtime/sampler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

using namespace tandem;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

sampling_params seeded(uint64_t seed, float temperature = 1.0f) {
    sampling_params p;
    p.seed = seed;
    p.temperature = temperature;
    return p;
}

// sample() scratches its input, so each draw gets a fresh copy.
token_id draw(sampler& s, const std::vector<float>& logits, std::span<const token_id> history = {}) {
    std::vector<float> scratch = logits;
    return s.sample(scratch, history);
}

std::vector<int> histogram(sampler& s, const std::vector<float>& logits, int n_draws) {
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < n_draws; ++i) {
        const token_id id = draw(s, logits);
        REQUIRE(id >= 0);
        REQUIRE(size_t(id) < logits.size());
        ++counts[id];
    }
    return counts;
}

// softmax(logits / t) in double, -inf as probability 0; written apart from the sampler.
std::vector<double> softmax(const std::vector<float>& logits, double t = 1.0) {
    double m = -inf;
    for (float x : logits) m = std::max(m, double(x));
    std::vector<double> p(logits.size());
    double sum = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
        p[i] = logits[i] == -inf ? 0.0 : std::exp((double(logits[i]) - m) / t);
        sum += p[i];
    }
    for (double& x : p) x /= sum;
    return p;
}

// Pearson chi-square of counts against expected probabilities (cells with p > 0).
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n_draws) {
    double chi2 = 0.0;
    for (size_t i = 0; i < counts.size(); ++i) {
        if (probs[i] <= 0.0) {
            CHECK(counts[i] == 0);
            continue;
        }
        const double e = probs[i] * n_draws;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi2;
}

// The set top_k -> top_p -> min_p allows, computed the plain way: full sort, renormalize
// after each step.
std::set<token_id> allowed_set(const std::vector<float>& logits, int top_k, float top_p, float min_p) {
    std::vector<token_id> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](token_id a, token_id b) { return logits[a] > logits[b]; });
    while (!order.empty() && logits[order.back()] == -inf) order.pop_back();
    if (top_k > 0 && size_t(top_k) < order.size()) order.resize(top_k);
    if (top_p < 1.0f) {
        double z = 0.0;
        for (token_id id : order) z += std::exp(double(logits[id]) - logits[order[0]]);
        double cum = 0.0;
        size_t keep = order.size();
        for (size_t i = 0; i < order.size(); ++i) {
            cum += std::exp(double(logits[order[i]]) - logits[order[0]]) / z;
            if (cum >= top_p) {
                keep = i + 1;
                break;
            }
        }
        order.resize(keep);
    }
    if (min_p > 0.0f) { // prob >= min_p * max prob; the normalization cancels
        const double max_logit = logits[order[0]];
        std::erase_if(order, [&](token_id id) { return std::exp(logits[id] - max_logit) < min_p; });
    }
    return {order.begin(), order.end()};
}

// Reproducible test logits from the rng under test's own stream (values in [-scale, scale)).
std::vector<float> random_logits(uint64_t seed, size_t n_vocab, float scale) {
    rng r(seed);
    std::vector<float> v(n_vocab);
    for (float& x : v) x = float((r.uniform() * 2.0 - 1.0) * scale);
    return v;
}

} // namespace

TEST_CASE("rng: xoshiro256** seeded by splitmix64 gives a pinned stream") {
    // Values from an independent implementation of the published algorithms.
    rng r0(0);
    CHECK(r0.next() == 0x99ec5f36cb75f2b4ull);
    CHECK(r0.next() == 0xbf6e1f784956452aull);
    CHECK(r0.next() == 0x1a5f849d4933e6e0ull);
    CHECK(r0.next() == 0x6aa594f1262d2d2cull);
    rng r42(42);
    CHECK(r42.next() == 0x15780b2e0c2ec716ull);
    CHECK(r42.next() == 0x6104d9866d113a7eull);

    rng u(7);
    double sum = 0.0;
    for (int i = 0; i < 100000; ++i) {
        const double x = u.uniform();
        REQUIRE(x >= 0.0);
        REQUIRE(x < 1.0);
        sum += x;
    }
    CHECK(sum / 100000 == doctest::Approx(0.5).epsilon(0.01));
}

TEST_CASE("greedy: argmax, lowest id on ties, NaN and -inf skipped") {
    sampler s(seeded(1, 0.0f));
    CHECK(draw(s, {0.1f, 3.0f, -2.0f, 2.9f}) == 1);
    CHECK(draw(s, {1.0f, 5.0f, 2.0f, 5.0f, 5.0f}) == 1);
    CHECK(draw(s, {5.0f, 5.0f}) == 0);
    CHECK(draw(s, {nan_f, 1.0f, nan_f, 2.0f}) == 3);
    CHECK(draw(s, {-inf, -inf, -3.0f, -inf}) == 2);
    CHECK(draw(s, {-inf, nan_f}) == sampler::none);
    CHECK(draw(s, {}) == sampler::none);
    CHECK(draw(s, {-1e30f}) == 0);

    // A negative temperature and a NaN one are greedy too.
    sampler neg(seeded(1, -1.0f));
    sampler nan_t(seeded(1, nan_f));
    const std::vector<float> logits = random_logits(3, 1000, 4.0f);
    const auto best = token_id(std::max_element(logits.begin(), logits.end()) - logits.begin());
    for (int i = 0; i < 20; ++i) {
        CHECK(draw(neg, logits) == best);
        CHECK(draw(nan_t, logits) == best);
    }
}

TEST_CASE("draw: one uniform per token, the first index whose running sum passes u * sum") {
    // Four equal weights: the pick is floor(4u), so the sampler's stream is visible.
    sampler s(seeded(2024));
    rng mirror(2024);
    const std::vector<float> four{1.5f, 1.5f, 1.5f, 1.5f};
    for (int i = 0; i < 300; ++i) {
        if (i % 7 == 3) { // nothing possible: still one draw, so later tokens don't shift
            CHECK(draw(s, {-inf, -inf}) == sampler::none);
            mirror.uniform();
            continue;
        }
        if (i % 5 == 1) { // a single candidate: still one draw
            CHECK(draw(s, {0.0f, -inf}) == 0);
            mirror.uniform();
            continue;
        }
        CHECK(draw(s, four) == token_id(mirror.uniform() * 4.0));
    }
}

TEST_CASE("determinism: the same seed repeats, another seed differs") {
    const std::vector<float> logits = random_logits(11, 512, 3.0f);
    auto run = [&](sampling_params p) {
        p.repetition_penalty = 1.3f;
        p.frequency_penalty = 0.1f;
        p.top_k = 100;
        p.top_p = 0.95f;
        sampler s(p);
        std::vector<token_id> history{1, 2, 3};
        for (int i = 0; i < 1000; ++i) history.push_back(draw(s, logits, history));
        return history;
    };
    const auto a = run(seeded(1234));
    const auto b = run(seeded(1234));
    const auto c = run(seeded(1235));
    CHECK(a == b);
    CHECK(a != c);
    // Sequences from different seeds should differ in most positions, not just one.
    size_t n_same = 0;
    for (size_t i = 3; i < a.size(); ++i) n_same += a[i] == c[i];
    CHECK(n_same < 200);

    // Unseeded: the seed it reports reproduces the run.
    sampler probe(sampling_params{});
    sampler again(seeded(probe.seed()));
    std::vector<token_id> x, y;
    for (int i = 0; i < 100; ++i) {
        x.push_back(draw(probe, logits));
        y.push_back(draw(again, logits));
    }
    CHECK(x == y);
    CHECK(sampler(sampling_params{}).seed() != probe.seed()); // random_device: 2^-64 to collide
    CHECK(sampler(seeded(77)).seed() == 77);
}

TEST_CASE("distribution: draws follow softmax(logits / T)") {
    const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -inf};
    constexpr int n_draws = 20000;
    // Chi-square critical value for 6 degrees of freedom at p = 0.001 is 22.46. The seed is
    // fixed, so this is deterministic; a wrong temperature or off-by-one draw blows far past it.
    for (float t : {0.5f, 1.0f, 2.0f}) {
        CAPTURE(t);
        sampler s(seeded(99, t));
        const auto counts = histogram(s, logits, n_draws);
        const auto probs = softmax(logits, t);
        CHECK(chi_square(counts, probs, n_draws) < 22.46);
        double max_diff = 0.0;
        for (size_t i = 0; i < probs.size(); ++i)
            max_diff = std::max(max_diff, std::abs(double(counts[i]) / n_draws - probs[i]));
        CHECK(max_diff < 0.015);
        // And not the distribution at another temperature.
        CHECK(chi_square(counts, softmax(logits, t * 1.5), n_draws) > 100.0);
    }
}

TEST_CASE("distribution: top_k renormalizes over the k best") {
    const std::vector<float> logits{0.3f, 1.5f, 1.0f, -0.5f, 1.2f, 0.8f};
    sampling_params p = seeded(5, 0.7f);
    p.top_k = 3;
    sampler s(p);
    constexpr int n_draws = 20000;
    const auto counts = histogram(s, logits, n_draws);
    std::vector<float> kept = logits;
    for (int id : {0, 3, 5}) kept[id] = -inf;
    CHECK(chi_square(counts, softmax(kept, 0.7), n_draws) < 13.82); // df 2, p = 0.001
}

TEST_CASE("top_k = 1 is greedy") {
    sampling_params p = seeded(3, 1.5f);
    p.top_k = 1;
    sampler s(p);
    sampler g(seeded(3, 0.0f));
    for (uint64_t seed = 0; seed < 50; ++seed) {
        std::vector<float> logits = random_logits(seed, 300, 2.0f);
        logits[seed % 300] = logits[(seed * 7 + 1) % 300] = 5.0f; // a tie at the top
        CHECK(draw(s, logits) == draw(g, logits));
    }
}

TEST_CASE("filters: top_k, top_p, min_p never choose an excluded token") {
    struct filter_case {
        int top_k;
        float top_p;
        float min_p;
    };
    const filter_case cases[] = {
        {5, 1.0f, 0.0f},   {0, 0.5f, 0.0f},  {0, 0.9f, 0.0f},   {0, 1.0f, 0.3f},
        {8, 0.8f, 0.0f},   {0, 0.7f, 0.2f},  {10, 0.9f, 0.1f},  {40, 0.95f, 0.05f},
        {3, 0.0f, 0.0f},   {0, 1e-6f, 0.0f}, {1000, 0.6f, 0.0f}, {0, 1.0f, 0.999f},
    };
    int n_case = 0;
    for (const auto& fc : cases) {
        for (uint64_t seed = 0; seed < 4; ++seed, ++n_case) {
            CAPTURE(n_case);
            std::vector<float> logits = random_logits(100 + seed, 64, 3.0f);
            logits[seed * 3] = nan_f;
            logits[seed * 5 + 1] = -inf;
            std::vector<float> clean = logits;
            for (float& x : clean) if (std::isnan(x)) x = -inf;
            const auto allowed = allowed_set(clean, fc.top_k, fc.top_p, fc.min_p);
            REQUIRE(!allowed.empty());

            sampling_params p = seeded(seed * 31 + 7, 1.2f);
            p.top_k = fc.top_k;
            p.top_p = fc.top_p;
            p.min_p = fc.min_p;
            sampler s(p);
            std::set<token_id> seen;
            for (int i = 0; i < 2000; ++i) {
                const token_id id = draw(s, logits);
                REQUIRE(allowed.count(id) == 1);
                seen.insert(id);
            }
            // Nothing allowed is over-excluded: every token with >= 2% of the kept mass shows up.
            std::vector<float> kept(clean.size(), -inf);
            for (token_id id : allowed) kept[id] = clean[id];
            const auto probs = softmax(kept, 1.2);
            for (token_id id : allowed)
                if (probs[id] >= 0.02) CHECK(seen.count(id) == 1);
        }
    }
}

TEST_CASE("filters: top_p on a large vocab without top_k matches a full sort") {
    // Flat logits make big nuclei (thousands of tokens, many buckets); quantized ones put
    // many exact ties on the boundary, where the lowest ids must win.
    constexpr size_t n_vocab = 32000;
    std::vector<float> flat = random_logits(77, n_vocab, 12.0f);
    std::vector<float> ties = random_logits(78, n_vocab, 6.0f);
    for (float& x : ties) x = std::round(x * 4.0f) / 4.0f;
    std::vector<float> peaked = random_logits(79, n_vocab, 4.0f);
    for (size_t i = 0; i < 40; ++i) peaked[i * (n_vocab / 40)] += 14.0f - float(i) * 0.25f;
    for (const auto* logits : {&flat, &ties, &peaked}) {
        for (float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
            for (float min_p : {0.0f, 0.2f}) {
                CAPTURE(top_p);
                CAPTURE(min_p);
                const auto allowed = allowed_set(*logits, 0, top_p, min_p);
                sampling_params p = seeded(8);
                p.top_p = top_p;
                p.min_p = min_p;
                sampler s(p);
                std::set<token_id> seen;
                for (int i = 0; i < 40; ++i) {
                    const token_id id = draw(s, *logits);
                    REQUIRE(allowed.count(id) == 1);
                    seen.insert(id);
                }
                if (allowed.size() > 1) CHECK(seen.size() > 1);
            }
        }
    }
    // The boundary really lands among ties: the reference keeps part of a tied run.
    const auto tied = allowed_set(ties, 0, 0.5f, 0.0f);
    const float last = ties[*std::min_element(tied.begin(), tied.end(),
                                              [&](token_id a, token_id b) { return ties[a] < ties[b]; })];
    CHECK(size_t(std::count(ties.begin(), ties.end(), last)) >
          size_t(std::count_if(tied.begin(), tied.end(), [&](token_id id) { return ties[id] == last; })));
}

TEST_CASE("filters: top_p picks the smallest set reaching p") {
    // probabilities 0.5, 0.3, 0.15, 0.05
    const std::vector<float> logits{std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
    auto seen_with = [&](float top_p) {
        sampling_params p = seeded(21);
        p.top_p = top_p;
        sampler s(p);
        std::set<token_id> seen;
        for (int i = 0; i < 2000; ++i) seen.insert(draw(s, logits));
        return seen;
    };
    CHECK(seen_with(0.4f) == std::set<token_id>{1});
    CHECK(seen_with(0.75f) == std::set<token_id>{1, 3});
    CHECK(seen_with(0.9f) == std::set<token_id>{0, 1, 3});
    CHECK(seen_with(0.99f) == std::set<token_id>{0, 1, 2, 3});
    CHECK(seen_with(0.0f) == std::set<token_id>{1});
}

TEST_CASE("filters: top_p boundaries are exact on dyadic probabilities") {
    // Equal logits: cumulative sums are exact, so "reaches p" is tested at equality.
    const std::vector<float> four{2.0f, 2.0f, 2.0f, 2.0f, -inf};
    for (int top_k : {0, 4}) { // the bucket path and the sorted path
        CAPTURE(top_k);
        auto seen_with = [&](float top_p) {
            sampling_params p = seeded(3);
            p.top_k = top_k;
            p.top_p = top_p;
            sampler s(p);
            std::set<token_id> seen;
            for (int i = 0; i < 400; ++i) seen.insert(draw(s, four));
            return seen;
        };
        CHECK(seen_with(0.25f) == std::set<token_id>{0});
        CHECK(seen_with(0.5f) == std::set<token_id>{0, 1});
        CHECK(seen_with(0.75f) == std::set<token_id>{0, 1, 2});
        CHECK(seen_with(0.5000001f) == std::set<token_id>{0, 1, 2});
    }
}

TEST_CASE("filters: probabilities are accurate enough to place top_p within 2e-6") {
    // Two tokens, logits 0 and y: token 1 survives top_p exactly when p > 1 / (1 + e^y).
    // Sweeping y over [-3.6, -0.05] moves exp's reduced argument across its whole interval.
    for (int j = 0; j < 40; ++j) {
        const float y = -0.05f - 0.09f * float(j);
        CAPTURE(y);
        const double q = 1.0 / (1.0 + std::exp(double(y)));
        const std::vector<float> logits{0.0f, y};
        for (int side : {-1, 1}) {
            sampling_params p = seeded(uint64_t(j));
            p.top_p = float(q * (1.0 + side * 2e-6));
            sampler s(p);
            std::set<token_id> seen;
            for (int i = 0; i < 300; ++i) seen.insert(draw(s, logits));
            CHECK(seen.size() == (side < 0 ? 1u : 2u));
        }
    }
}

TEST_CASE("penalties: exact processed values") {
    sampling_params p = seeded(1);
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    p.penalty_last_n = 4;
    p.logit_bias = {{4, 1.0f}, {-3, 100.0f}, {1000, 100.0f}};
    sampler s(p);

    //                             0     1     2      3     4     5     6
    const std::vector<float> base{2.0f, 1.0f, -1.0f, 3.0f, 1.0f, 0.0f, -4.0f};
    // The window is the last 4: {5, 2, 5, 4}; 3 and 6 fall outside it, 99 and -1 are ignored.
    const std::vector<token_id> history{3, 6, 99, -1, 5, 2, 5, 4};
    std::vector<float> x = base;
    s.process(x, history);
    CHECK(x[0] == 2.0f);
    CHECK(x[1] == 1.0f);
    CHECK(x[2] == -1.0f * 2.0f - 0.25f - 0.5f);      // once, negative: multiplied
    CHECK(x[3] == 3.0f);                              // outside the window
    CHECK(x[4] == (1.0f + 1.0f) / 2.0f - 0.25f - 0.5f); // bias first, then penalty
    CHECK(x[5] == 0.0f * 2.0f - 2 * 0.25f - 0.5f);   // twice: frequency counts, presence once
    CHECK(x[6] == -4.0f);

    SUBCASE("penalty_last_n = -1 covers the whole history") {
        p.penalty_last_n = -1;
        p.logit_bias.clear();
        sampler all(p);
        std::vector<float> y = base;
        all.process(y, history);
        CHECK(y[3] == 3.0f / 2.0f - 0.25f - 0.5f);
        CHECK(y[6] == -4.0f * 2.0f - 0.25f - 0.5f);
        CHECK(y[5] == 0.0f - 2 * 0.25f - 0.5f);
    }
    SUBCASE("penalty_last_n = 0 turns penalties off") {
        p.penalty_last_n = 0;
        p.logit_bias.clear();
        sampler none(p);
        std::vector<float> y = base;
        none.process(y, history);
        CHECK(y == base);
    }
    SUBCASE("a window longer than the history is the history") {
        p.penalty_last_n = 1000;
        p.logit_bias.clear();
        sampler big(p);
        std::vector<float> y = base;
        big.process(y, history);
        CHECK(y[3] == 3.0f / 2.0f - 0.25f - 0.5f);
    }
    SUBCASE("nonsense knobs (NaN, a repetition penalty <= 0) are off, not poison") {
        p.logit_bias = {{1, nan_f}};
        p.repetition_penalty = -2.0f;
        p.frequency_penalty = nan_f;
        p.presence_penalty = inf;
        sampler odd(p);
        std::vector<float> y = base;
        odd.process(y, history);
        CHECK(y == base);
    }
    SUBCASE("penalties steer greedy decoding") {
        p.temperature = 0.0f;
        p.logit_bias.clear();
        p.penalty_last_n = 64;
        p.repetition_penalty = 10.0f;
        sampler g(p);
        const std::vector<token_id> h{3};
        CHECK(draw(g, base, h) == 0);
        CHECK(draw(g, base) == 3);
    }
}

TEST_CASE("logit_bias: -inf bans, a large bias forces") {
    const std::vector<float> logits{1.0f, 4.0f, 2.0f, 0.5f};
    SUBCASE("ban") {
        sampling_params p = seeded(2, 2.0f);
        p.logit_bias = {{1, -inf}};
        sampler s(p);
        for (int i = 0; i < 2000; ++i) CHECK(draw(s, logits) != 1);
        sampling_params g = p;
        g.temperature = 0.0f;
        sampler sg(g);
        CHECK(draw(sg, logits) == 2);
    }
    SUBCASE("force") {
        sampling_params p = seeded(2, 2.0f);
        p.logit_bias = {{3, 100.0f}};
        sampler s(p);
        for (int i = 0; i < 500; ++i) CHECK(draw(s, logits) == 3);
    }
    SUBCASE("+inf forces, shared equally by the +inf tokens") {
        sampling_params p = seeded(2, 0.5f);
        p.logit_bias = {{0, inf}, {3, inf}};
        sampler s(p);
        const auto counts = histogram(s, logits, 4000);
        CHECK(counts[1] == 0);
        CHECK(counts[2] == 0);
        CHECK(counts[0] == doctest::Approx(2000).epsilon(0.06));
        CHECK(counts[3] == doctest::Approx(2000).epsilon(0.06));
    }
    SUBCASE("+inf under top_k and top_p: the lowest forced id is the best") {
        sampling_params p = seeded(2);
        p.logit_bias = {{3, inf}, {2, inf}};
        p.top_k = 1;
        sampler s(p);
        for (int i = 0; i < 50; ++i) CHECK(draw(s, logits) == 2);
        p.top_k = 0;
        p.top_p = 0.3f;
        sampler sp(p);
        for (int i = 0; i < 50; ++i) CHECK(draw(sp, logits) == 2);
    }
    SUBCASE("everything banned leaves nothing") {
        sampling_params p = seeded(2);
        p.logit_bias = {{0, -inf}, {1, -inf}, {2, -inf}, {3, -inf}};
        sampler s(p);
        CHECK(draw(s, logits) == sampler::none);
    }
}

TEST_CASE("edge cases: NaN, a single finite logit, n_vocab 1, top_k past n_vocab") {
    sampling_params p = seeded(4, 1.0f);
    p.top_k = 50;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.1f;
    sampler s(p);
    const std::vector<token_id> history{0, 1, 2};

    std::vector<float> only_one(1000, -inf);
    only_one[617] = -50.0f;
    for (int i = 0; i < 50; ++i) CHECK(draw(s, only_one, history) == 617);

    std::vector<float> with_nan = random_logits(9, 100, 2.0f);
    for (size_t i = 0; i < with_nan.size(); i += 3) with_nan[i] = nan_f;
    for (int i = 0; i < 1000; ++i) CHECK(draw(s, with_nan, history) % 3 != 0);
    std::vector<float> processed = with_nan;
    s.process(processed, history);
    CHECK(processed[0] == -inf);
    CHECK(processed[3] == -inf);
    CHECK(std::none_of(processed.begin(), processed.end(), [](float x) { return std::isnan(x); }));

    CHECK(draw(s, {nan_f, nan_f}) == sampler::none);
    CHECK(draw(s, {}) == sampler::none);
    CHECK(draw(s, {0.3f}) == 0);
    CHECK(draw(s, {-inf}) == sampler::none);

    // Temperature extremes: 1/T overflowing is greedy; T = +inf is uniform over what's finite.
    sampling_params cold = seeded(4, 1e-45f);
    sampler sc(cold);
    CHECK(draw(sc, {1.0f, 3.0f, 3.0f, 2.0f}) == 1);
    sampler hot(seeded(4, inf));
    const auto flat_counts = histogram(hot, {-30.0f, 0.0f, -inf, 30.0f}, 3000);
    CHECK(flat_counts[2] == 0);
    for (int id : {0, 1, 3}) CHECK(flat_counts[id] == doctest::Approx(1000).epsilon(0.1));

    sampling_params big_k = seeded(4);
    big_k.top_k = 1 << 30;
    sampler sk(big_k);
    const auto counts = histogram(sk, {0.0f, 0.0f, 0.0f}, 3000);
    for (int c : counts) CHECK(c > 800);
}

TEST_CASE("logprobs: log-softmax sums to 1, top_logprobs sorted and consistent") {
    // Offsets of 1e4 would overflow a naive exp; NaN and -inf have probability 0.
    std::vector<float> logits = random_logits(13, 500, 8.0f);
    for (float& x : logits) x += 10000.0f;
    logits[10] = nan_f;
    logits[20] = -inf;
    logits[30] = logits[31] = 10020.0f; // a tie at the top

    double sum = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
        const float lp = logprob_of(logits, token_id(i));
        CHECK(lp <= 0.0f);
        sum += std::exp(double(lp));
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(logprob_of(logits, 10) == -inf);
    CHECK(logprob_of(logits, 20) == -inf);
    CHECK(logprob_of(logits, -1) == -inf);
    CHECK(logprob_of(logits, 500) == -inf);
    // Differences of logprobs are differences of logits.
    CHECK(logprob_of(logits, 30) - logprob_of(logits, 0) ==
          doctest::Approx(double(logits[30]) - logits[0]).epsilon(1e-4));

    const auto top = top_logprobs(logits, 10);
    REQUIRE(top.size() == 10);
    CHECK(top[0].id == 30);
    CHECK(top[1].id == 31);
    std::vector<token_id> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::vector<float> clean = logits;
    clean[10] = -inf;
    std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) { return clean[a] > clean[b]; });
    for (size_t i = 0; i < top.size(); ++i) {
        CAPTURE(i);
        CHECK(top[i].id == order[i]);
        CHECK(top[i].logprob == logprob_of(logits, top[i].id));
        if (i > 0) CHECK(top[i].logprob <= top[i - 1].logprob);
    }

    // n past the vocab: every token of nonzero probability, none of the others.
    const auto all = top_logprobs(logits, 100000);
    CHECK(all.size() == logits.size() - 2);
    CHECK(top_logprobs(logits, 0).empty());
    CHECK(top_logprobs({}, 5).empty());

    // A single token holds all the mass; +inf tokens share it.
    CHECK(logprob_of(std::vector<float>{-inf, 3.0f, -inf}, 1) == 0.0f);
    CHECK(logprob_of(std::vector<float>{inf, 3.0f, inf}, 0) == doctest::Approx(std::log(0.5)));
    CHECK(logprob_of(std::vector<float>{inf, 3.0f, inf}, 1) == -inf);
    CHECK(logprob_of(std::vector<float>{-inf, nan_f}, 0) == -inf);
    CHECK(top_logprobs(std::vector<float>{-inf, nan_f}, 2).empty());
}

TEST_CASE("processor chain: added processors run after the parameters' own, in order; accept, rewind and clone reach each") {
    struct recording final : logits_processor {
        std::vector<token_id> accepted;
        int32_t rewound = 0;
        float add;
        explicit recording(float a) : add(a) {}
        std::string_view name() const override { return "recording"; }
        void apply(std::span<float> logits, std::span<const token_id>) override {
            logits[1] = logits[1] * 2 + add; // order matters: x*2+a then *2+b
        }
        void accept(token_id t) override { accepted.push_back(t); }
        void rewind(int32_t n) override { rewound += n; }
        std::unique_ptr<logits_processor> clone() const override { return std::make_unique<recording>(*this); }
    };
    sampling_params p;
    p.logit_bias = {{1, 1.0f}};
    sampler s(p);
    CHECK(s.processors().size() == 1); // the bias
    auto* a = new recording(1);
    auto* b2 = new recording(10);
    s.processors().add(std::unique_ptr<logits_processor>(a));
    s.processors().add(std::unique_ptr<logits_processor>(b2));
    std::vector<float> logits{0, 0.5f, 0};
    s.process(logits, {});
    CHECK(logits[1] == doctest::Approx(((0.5f + 1) * 2 + 1) * 2 + 10));
    s.accept(7);
    s.processors().rewind(2);
    CHECK(a->accepted == std::vector<token_id>{7});
    CHECK(b2->accepted == std::vector<token_id>{7});
    CHECK(a->rewound == 2);
    processor_chain c = s.processors().clone();
    c.accept(8);
    CHECK(a->accepted == std::vector<token_id>{7}); // the copy has its own state
    std::vector<float> l2{0, 0.5f, 0};
    c.apply(l2, {});
    CHECK(l2[1] == logits[1]);
}

TEST_CASE("distribution: the probabilities sample() draws from") {
    const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -inf};
    std::vector<float> probs(logits.size());
    for (float t : {0.5f, 1.0f, 2.0f}) {
        CAPTURE(t);
        sampler s(seeded(4, t));
        std::vector<float> scratch = logits;
        REQUIRE(s.distribution(scratch, {}, probs));
        const auto want = softmax(logits, t);
        for (size_t i = 0; i < probs.size(); ++i) CHECK(probs[i] == doctest::Approx(want[i]).epsilon(1e-5));
    }
    sampling_params p = seeded(5, 0.7f);
    p.top_k = 3;
    sampler k3(p);
    std::vector<float> scratch = logits;
    REQUIRE(k3.distribution(scratch, {}, probs));
    std::vector<float> kept = logits;
    for (int id : {0, 2, 3, 5, 7}) kept[id] = -inf;
    const auto want = softmax(kept, 0.7);
    for (size_t i = 0; i < probs.size(); ++i) CHECK(probs[i] == doctest::Approx(want[i]).epsilon(1e-5));
    sampler greedy(seeded(6, 0.0f));
    scratch = logits;
    REQUIRE(greedy.distribution(scratch, {}, probs));
    CHECK(probs == std::vector<float>{0, 0, 0, 0, 1, 0, 0, 0});
    std::vector<float> none(4, -inf);
    CHECK_FALSE(sampler(seeded(7)).distribution(none, {}, std::span<float>(probs).first(4)));
}

TEST_CASE("verify: drafts drawn from q, kept with min(1, p/q), else drawn from max(0, p - q): the tokens follow p") {
    // p and q far apart (q favours what p does not), so both the kept drafts and the residual
    // draws matter: a rule that kept every draft would follow q, one that never kept any would
    // follow the residual alone.
    const std::vector<float> target{1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -inf};
    const std::vector<float> draft_logits{3.0f, -1.0f, 2.0f, 1.0f, 0.0f, 2.5f, -2.0f, 1.0f};
    const auto p = softmax(target), qd = softmax(draft_logits);
    const std::vector<float> q(qd.begin(), qd.end());
    sampler proposer(seeded(11)), verifier(seeded(12));
    constexpr int n_draws = 20000;
    std::vector<int> counts(target.size(), 0), drafted(target.size(), 0);
    int kept = 0;
    for (int i = 0; i < n_draws; ++i) {
        const token_id d = proposer.draw(q);
        REQUIRE(d >= 0);
        ++drafted[size_t(d)];
        std::vector<float> scratch = target;
        const token_id t = verifier.verify(scratch, {}, d, q);
        REQUIRE(t >= 0);
        ++counts[size_t(t)];
        kept += t == d;
    }
    CHECK(chi_square(drafted, qd, n_draws) < 24.32);  // the drafts follow q: df 7, p = 0.001
    CHECK(chi_square(counts, p, n_draws) < 22.46);    // the output follows p: df 6, p = 0.001
    CHECK(chi_square(counts, qd, n_draws) > 1000.0);  // and not q
    double overlap = 0.0; // the expected acceptance: sum of min(p, q)
    for (size_t i = 0; i < p.size(); ++i) overlap += std::min(p[i], qd[i]);
    MESSAGE("kept ", kept, " of ", n_draws, ", expected ", overlap * n_draws);
    CHECK(double(kept) / n_draws == doctest::Approx(overlap).epsilon(0.05));
    // Greedy, or no q (a point mass): the sample, which keeps the draft only when it is the argmax.
    sampler greedy(seeded(13, 0.0f));
    std::vector<float> scratch = target;
    CHECK(greedy.verify(scratch, {}, 1, q) == 4);
    sampler point(seeded(14)), plain(seeded(14));
    for (int i = 0; i < 50; ++i) {
        std::vector<float> a = target, b = target;
        CHECK(point.verify(a, {}, 4, {}) == plain.sample(b, {}));
    }
}
