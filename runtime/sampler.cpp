// Token sampling: xoshiro256** rng, logit processing, top-k/top-p/min-p filtering, the draw.
#include "runtime/sampler.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

namespace tandem {

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t random_seed() {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

// Total order for candidates: higher logit first, lower id on ties. Total, so the order
// after any sort is the same with every standard library.
bool better(const token_logprob& a, const token_logprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
}

// The loops over the whole vocab below are written so the compiler vectorizes them: plain
// float arithmetic, independent lanes, no libm calls (so no libm differences between
// platforms either).

// Max over x, NaN skipped; -inf when empty. Eight lanes break the compare chain.
float max_of(std::span<const float> x) {
    float lane[8];
    for (float& l : lane) l = -inf;
    size_t i = 0;
    for (; i + 8 <= x.size(); i += 8)
        for (size_t j = 0; j < 8; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    float m = -inf;
    for (; i < x.size(); ++i) m = x[i] > m ? x[i] : m;
    for (float l : lane) m = l > m ? l : m;
    return m;
}

// Sum in double, in a fixed order (eight lanes, then the tail).
double sum_of(std::span<const float> x) {
    double lane[8] = {};
    size_t i = 0;
    for (; i + 8 <= x.size(); i += 8)
        for (size_t j = 0; j < 8; ++j) lane[j] += double(x[i + j]);
    double s = 0.0;
    for (; i < x.size(); ++i) s += double(x[i]);
    for (double l : lane) s += l;
    return s;
}

// c ? a : b by bit masks. With a float select GCC (trapping math on) makes the loop's
// arithmetic conditional and then stops vectorizing it.
float blend(bool c, float a, float b) {
    const uint32_t mask = uint32_t(0) - uint32_t(c);
    return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                                (std::bit_cast<uint32_t>(b) & ~mask));
}

// exp(x) for x <= 0 (-inf included, NaN not), relative error about 1e-7, 0 below -87
// (under FLT_MIN). Cody-Waite reduction to r in [-ln2/2, ln2/2], degree-7 Taylor polynomial, 2^n
// by bits.
float exp_le0(float x) {
    constexpr float log2e = 1.44269504088896341f;
    constexpr float ln2_hi = 0.693359375f; // 9 bits: n * ln2_hi is exact for |n| <= 126
    constexpr float ln2_lo = -2.12194440e-4f;
    constexpr float round_magic = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
    constexpr uint32_t floor_bits = std::bit_cast<uint32_t>(-87.0f);
    // For x <= 0 the bits grow with |x|, so an integer compare tells x >= -87.
    const bool in_range = std::bit_cast<uint32_t>(x) <= floor_bits;
    const float xc = blend(in_range, x, -87.0f);
    const float t = xc * log2e + round_magic;
    const float n = t - round_magic;
    const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(round_magic);
    const float r = (xc - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float scale = std::bit_cast<float>((ni + 127) << 23); // ni in [-126, 0]
    return blend(in_range, p * scale, 0.0f);
}

// min_p as a logit threshold relative to the max: the same test in every path.
float min_p_offset(float min_p) { return float(std::log(std::min(double(min_p), 1.0))); }

// top_p without a sort of the vocab: tokens go into buckets by distance below the max
// logit (monotone, so bucket order agrees with `better`); whole buckets are in or out and
// only the bucket where the cumulative probability crosses top_p is sorted.
constexpr size_t n_buckets = 1024;
constexpr float buckets_per_nat = 16.0f; // 64 nats deep; the last bucket takes the rest

// The top_p set of the finite logits (max `m`) into `cand`, in id order then `better`
// order: the smallest set of the best tokens whose probability reaches top_p, at least one.
void nucleus_of(std::span<const float> logits, float m, double top_p,
                std::vector<token_logprob>& cand, std::vector<token_logprob>& edge,
                std::vector<float>& w, std::vector<uint16_t>& bucket) {
    const size_t n_vocab = logits.size();
    w.resize(n_vocab);
    bucket.resize(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) { // vectorized; -inf lands in the last bucket, w 0
        w[i] = exp_le0(logits[i] - m);
        bucket[i] = uint16_t(std::min((m - logits[i]) * buckets_per_nat, float(n_buckets - 1)));
    }
    const double target = top_p * sum_of(w);

    std::array<double, n_buckets> mass{};
    for (size_t i = 0; i < n_vocab; ++i) mass[bucket[i]] += w[i];
    size_t edge_bucket = n_buckets - 1; // rounding left the total short of the target: keep all
    double before = 0.0;
    for (size_t b = 0; b < n_buckets; ++b) {
        if (before + mass[b] >= target) {
            edge_bucket = b;
            break;
        }
        before += mass[b];
    }

    // Most of a real vocab sits far below the nucleus: skip blocks with nothing in it.
    cand.clear();
    edge.clear();
    constexpr size_t n_block = 32;
    for (size_t i0 = 0; i0 < n_vocab; i0 += n_block) {
        const size_t i1 = std::min(i0 + n_block, n_vocab);
        uint16_t lowest = uint16_t(n_buckets);
        for (size_t i = i0; i < i1; ++i) lowest = std::min(lowest, bucket[i]);
        if (lowest > edge_bucket) continue;
        for (size_t i = i0; i < i1; ++i) {
            if (bucket[i] < edge_bucket) cand.push_back({token_id(i), logits[i]});
            else if (bucket[i] == edge_bucket && logits[i] > -inf) edge.push_back({token_id(i), logits[i]});
        }
    }
    std::sort(edge.begin(), edge.end(), better);
    double cum = before;
    for (const auto& c : edge) {
        cand.push_back(c);
        cum += exp_le0(c.logprob - m);
        if (cum >= target) break;
    }
}

// top_p over candidates already in `better` order.
void keep_top_p_sorted(std::vector<token_logprob>& cand, float m, double top_p) {
    double z = 0.0;
    for (const auto& c : cand) z += exp_le0(c.logprob - m);
    const double target = top_p * z;
    double cum = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
        cum += exp_le0(cand[i].logprob - m);
        if (cum >= target) {
            cand.resize(i + 1);
            return;
        }
    }
}

// The k best finite logits, best first. A bounded heap whose front is the worst kept entry;
// once it is full, a block whose max can't beat the front costs one vectorized pass.
void top_k_of(std::span<const float> logits, size_t k, std::vector<token_logprob>& cand) {
    cand.clear();
    constexpr size_t n_block = 32;
    for (size_t i0 = 0; i0 < logits.size(); i0 += n_block) {
        const auto block = logits.subspan(i0, std::min(n_block, logits.size() - i0));
        if (cand.size() == k && !(max_of(block) > cand.front().logprob)) continue;
        for (size_t j = 0; j < block.size(); ++j) {
            const float x = block[j];
            if (cand.size() < k) {
                if (x == -inf) continue;
                cand.push_back({token_id(i0 + j), x});
                std::push_heap(cand.begin(), cand.end(), better);
            } else if (x > cand.front().logprob) { // a tie loses: its id is higher
                std::pop_heap(cand.begin(), cand.end(), better);
                cand.back() = {token_id(i0 + j), x};
                std::push_heap(cand.begin(), cand.end(), better);
            }
        }
    }
    std::sort_heap(cand.begin(), cand.end(), better);
}

// Index of the first weight whose running sum passes u * sum; the last positive one when
// rounding leaves the running sum short.
size_t pick(std::span<const float> w, double u) {
    const double target = u * sum_of(w);
    double cum = 0.0;
    size_t last_positive = 0;
    for (size_t i = 0; i < w.size(); ++i) {
        if (w[i] <= 0.0f) continue;
        cum += w[i];
        last_positive = i;
        if (cum > target) return i;
    }
    return last_positive;
}

// What log-softmax needs of the logits: the max and log-sum-exp, NaN read as -inf.
struct log_norm {
    float max = -inf;
    double lse = -inf;    // log sum exp(x), valid when max is finite
    size_t n_pos_inf = 0; // when max is +inf, the +inf tokens share all the mass
};

log_norm log_norm_of(std::span<const float> logits) {
    log_norm n;
    n.max = max_of(logits);
    if (n.max == -inf) return n;
    if (n.max == inf) {
        n.n_pos_inf = size_t(std::count(logits.begin(), logits.end(), inf));
        return n;
    }
    const double m = n.max;
    double sum = 0.0;
    for (float x : logits)
        if (x > -inf) sum += std::exp(double(x) - m);
    n.lse = m + std::log(sum);
    return n;
}

double logprob_from(const log_norm& n, float x) {
    if (std::isnan(x) || x == -inf || n.max == -inf) return -inf;
    if (n.max == inf) return x == inf ? -std::log(double(n.n_pos_inf)) : -inf;
    return double(x) - n.lse;
}

} // namespace

rng::rng(uint64_t seed) {
    for (uint64_t& s : s_) s = splitmix64(seed);
}

uint64_t rng::next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

sampler::sampler(sampling_params p)
    : p_(std::move(p)), seed_(p_.seed ? *p_.seed : random_seed()), rng_(seed_), chain_(make_processors(p_)) {}

sampler sampler::clone() const {
    sampler c(p_);
    c.seed_ = seed_;
    c.rng_ = rng_;
    c.chain_ = chain_.clone();
    return c;
}

void sampler::process(std::span<float> logits, std::span<const token_id> history) {
    chain_.apply(logits, history);
    for (float& x : logits) x = x == x ? x : -inf; // NaN -> -inf; a blend, so it vectorizes
}

token_id sampler::sample(std::span<float> logits, std::span<const token_id> history) {
    switch (weigh(logits, history)) {
    case weighed::none: return none;
    case weighed::greedy: return greedy_;
    case weighed::sampled: return cand_.empty() ? token_id(pick(weight_, u_)) : cand_[pick(weight_, u_)].id;
    }
    return none;
}

// The weights sample() draws from, without the draw: weight_ over the whole vocab (cand_
// empty) or over cand_; greedy_ for a greedy choice. Takes sample()'s one rng draw (u_).
sampler::weighed sampler::weigh(std::span<float> logits, std::span<const token_id> history) {
    process(logits, history);
    float m = max_of(logits);

    // NaN temperature too, and one so small that 1/T overflows: greedy.
    float inv_t = 1.0f / p_.temperature;
    if (!(p_.temperature > 0.0f) || inv_t == inf) {
        if (m == -inf) return weighed::none;
        greedy_ = token_id(std::find(logits.begin(), logits.end(), m) - logits.begin()); // lowest id
        return weighed::greedy;
    }

    u_ = rng_.uniform(); // drawn first: one draw per token whatever is left
    if (m == -inf) return weighed::none;
    if (m == inf) { // forcing biases: the +inf tokens share the mass equally
        for (float& x : logits) x = x == inf ? 0.0f : -inf;
        m = 0.0f;
    }

    inv_t = std::max(inv_t, std::numeric_limits<float>::min()); // T = +inf: -inf * 0 is NaN
    const bool use_top_k = p_.top_k > 0 && size_t(p_.top_k) < logits.size();
    const bool use_top_p = p_.top_p < 1.0f; // NaN: off
    const bool use_min_p = p_.min_p > 0.0f;
    const float min_rel = use_min_p ? min_p_offset(p_.min_p) : -inf;

    if (!use_top_k && !use_top_p) {
        // No set to build: weigh the whole vocab in place; min_p (relative to the max, which
        // stays) and -inf give weight 0.
        cand_.clear();
        weight_.resize(logits.size());
        for (size_t i = 0; i < logits.size(); ++i) {
            const float d = logits[i] - m;
            weight_[i] = blend(d >= min_rel, exp_le0(d * inv_t), 0.0f);
        }
        return weighed::sampled;
    }

    // The chain's order: top_k, then top_p over what top_k left, then min_p.
    if (use_top_k) {
        top_k_of(logits, size_t(p_.top_k), cand_);
        if (use_top_p) keep_top_p_sorted(cand_, m, p_.top_p);
    } else {
        nucleus_of(logits, m, p_.top_p, cand_, edge_, weight_, bucket_);
    }
    // min_p only compares with the max, which every filter keeps.
    if (use_min_p) std::erase_if(cand_, [&](const token_logprob& c) { return c.logprob - m < min_rel; });

    weight_.resize(cand_.size());
    for (size_t i = 0; i < cand_.size(); ++i) weight_[i] = exp_le0((cand_[i].logprob - m) * inv_t);
    return weighed::sampled;
}

bool sampler::distribution(std::span<float> logits, std::span<const token_id> history, std::span<float> probs) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    switch (weigh(logits, history)) {
    case weighed::none: return false;
    case weighed::greedy: probs[size_t(greedy_)] = 1.0f; return true;
    case weighed::sampled: break;
    }
    const double z = sum_of(weight_);
    if (!(z > 0.0)) return false;
    for (size_t i = 0; i < weight_.size(); ++i)
        probs[cand_.empty() ? i : size_t(cand_[i].id)] = float(double(weight_[i]) / z);
    return true;
}

token_id sampler::draw(std::span<const float> probs) {
    const double u = rng_.uniform();
    if (!(sum_of(probs) > 0.0)) return none;
    return token_id(pick(probs, u));
}

token_id sampler::verify(std::span<float> logits, std::span<const token_id> history, token_id draft,
                         std::span<const float> q) {
    if (q.empty() || !(p_.temperature > 0.0f)) return sample(logits, history); // a point mass
    p_row_.resize(logits.size());
    if (!distribution(logits, history, p_row_)) return none;
    const double px = p_row_[size_t(draft)], qx = q[size_t(draft)];
    // u_ is the distribution's draw: the acceptance test, then (rejected) the residual's.
    if (qx > 0.0 && u_ * qx < px) return draft;
    for (size_t i = 0; i < p_row_.size(); ++i) p_row_[i] = std::max(0.0f, p_row_[i] - q[i]);
    if (!(sum_of(p_row_) > 0.0)) { // p <= q everywhere yet rejected: rounding; draw from p
        p_row_.assign(logits.size(), 0.0f);
        distribution(logits, history, p_row_);
    }
    return token_id(pick(p_row_, rng_.uniform()));
}

float logprob_of(std::span<const float> logits, token_id id) {
    if (id < 0 || size_t(id) >= logits.size()) return -inf;
    return float(logprob_from(log_norm_of(logits), logits[id]));
}

std::vector<token_logprob> top_logprobs(std::span<const float> logits, int n) {
    std::vector<token_logprob> top;
    if (n <= 0 || logits.empty()) return top;
    const log_norm norm = log_norm_of(logits);
    const size_t n_top = std::min(size_t(n), logits.size());
    top.reserve(n_top);

    // A bounded heap whose front is the worst kept entry: O(V log n), no vocab-sized buffer.
    for (size_t i = 0; i < logits.size(); ++i) {
        const float x = logits[i];
        if (logprob_from(norm, x) == -inf) continue; // probability 0, NaN included
        const token_logprob c{token_id(i), x};
        if (top.size() < n_top) {
            top.push_back(c);
            std::push_heap(top.begin(), top.end(), better);
        } else if (better(c, top.front())) {
            std::pop_heap(top.begin(), top.end(), better);
            top.back() = c;
            std::push_heap(top.begin(), top.end(), better);
        }
    }
    std::sort_heap(top.begin(), top.end(), better);
    for (auto& c : top) c.logprob = float(logprob_from(norm, c.logprob));
    return top;
}

} // namespace tandem
