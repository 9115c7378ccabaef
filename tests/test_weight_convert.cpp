// Load-time weight conversion (cpu/weight_convert): at every ISA level this machine runs, the
// fast paths give the reference's bytes (INT8 codes, scales and row sums; F32 rows), for rows
// from the reference quantizers, random block bytes and hand-made edge cases, and the loader
// gives the same model at each level.
#include "cpu/isa.hpp"
#include "cpu/thread_pool.hpp"
#include "cpu/weight_convert.hpp"
#include "quant/blocks.hpp"
#include "quant/int8.hpp"
#include "quant/q8_0.hpp"
#include "runtime/fp16.hpp"
#include "runtime/gguf.hpp"
#include "runtime/model_config.hpp"
#include "runtime/synth.hpp"
#include "runtime/weights.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace tandem;

namespace {

constexpr dtype block_types[] = {dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q8_0, dtype::q2_k,
                                 dtype::q3_k, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_nl, dtype::iq4_xs};

int64_t block_of(dtype t) { return traits_of(uint32_t(t))->block; }

std::string level_name() { return std::string(cpu::name_of(cpu::active_isa())); }

// Runs fn() at every ISA level from scalar up to the CPU's, then restores the CPU's level.
// Says so when only the scalar level runs here (the fast paths are then untested).
template <class F> void at_each_level(F fn) {
    if (cpu::detect_isa() < cpu::isa::avx2) MESSAGE("no AVX2 on this CPU: only the scalar level is compared");
    for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
        cpu::force_isa(cpu::isa(lvl));
        fn();
    }
    cpu::force_isa(cpu::detect_isa());
}

std::vector<float> randn(int64_t n, uint32_t seed, float sigma) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = d(rng);
    return x;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> b(n);
    for (uint8_t& v : b) v = uint8_t(rng());
    return b;
}

void put_half(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// Offsets of the f16 scales in one block of the types with a fast kernel.
std::vector<size_t> scale_offsets(dtype t) {
    switch (t) {
    case dtype::q8_0: return {0};
    case dtype::q4_k: return {0, 2};
    case dtype::q6_k: return {208};
    default: return {};
    }
}

// Random block bytes whose f16 scales are finite (bit 14 clear: exponent below 16), so the fast
// kernels run on every block instead of handing the block or row to the reference.
std::vector<uint8_t> random_finite_blocks(dtype t, int64_t n, uint32_t seed) {
    const size_t bb = traits_of(uint32_t(t))->block_bytes;
    std::vector<uint8_t> b = random_bytes(block_bytes_of(t, n), seed);
    for (size_t k = 0; k < b.size() / bb; ++k)
        for (size_t off : scale_offsets(t)) b[k * bb + off + 1] &= 0xBF;
    return b;
}

std::vector<uint8_t> quantized(dtype t, const std::vector<float>& x) {
    std::vector<uint8_t> b(block_bytes_of(t, int64_t(x.size())));
    quantize_blocks_ref(t, x.data(), b.data(), int64_t(x.size()));
    return b;
}

// Floats are the same when their bits are, or when both are NaN: which NaN an operation on two
// NaNs returns (and its sign) is not fixed by IEEE 754 or C++, and clang's optimizer does not
// keep it (it reorders the operands of a multiply or a subtract-as-add), so the reference built
// by clang and a SIMD path can return different NaNs for one block with NaN scales.
bool same_float(float a, float b) {
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), same_float);
}

// The first index where two float rows differ (as same_float compares), -1 if none (for the message).
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i)
        if (!same_float(a[i], b[i])) return int64_t(i);
    return -1;
}

// blocks_to_f32 and blocks_to_i8 against the reference at the active level.
void check_row(dtype t, const uint8_t* blocks, int64_t n) {
    CAPTURE(n);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
    dequantize_blocks_ref(t, blocks, want.data(), n);
    cpu::blocks_to_f32(t, blocks, got.data(), n);
    CHECK_MESSAGE(same_floats(got, want), "F32 differs first at ", first_difference(got, want));

    std::vector<float> tmp(static_cast<size_t>(n));
    std::vector<int8_t> want_q(static_cast<size_t>(n)), got_q(static_cast<size_t>(n), 99);
    int32_t want_sum = 0, got_sum = -1;
    const float want_s = cpu::blocks_to_i8_ref(t, blocks, want_q.data(), &want_sum, tmp.data(), n);
    const float got_s = cpu::blocks_to_i8(t, blocks, got_q.data(), &got_sum, tmp.data(), n);
    CHECK(got_q == want_q);
    CHECK(same_float(got_s, want_s));
    CHECK(got_sum == want_sum);
}

// row_to_i8 against quantize_row_i8_ref and sum_i8_ref at the active level.
void check_f32_row(const std::vector<float>& x) {
    const int64_t n = int64_t(x.size());
    CAPTURE(n);
    std::vector<int8_t> want(x.size()), got(x.size(), 99);
    const float want_s = quantize_row_i8_ref(x.data(), want.data(), n);
    int32_t got_sum = -1;
    const float got_s = cpu::row_to_i8(x.data(), got.data(), &got_sum, n);
    CHECK(got == want);
    CHECK(same_float(got_s, want_s));
    CHECK(got_sum == sum_i8_ref(want.data(), n));
}

// A Q8_0 row of nb blocks, all with scale d (f16 bits) and codes from fill(block, i).
template <class F> std::vector<uint8_t> q8_0_row(int nb, uint16_t d, F fill) {
    std::vector<uint8_t> b(size_t(nb) * q8_0_block_bytes, 0);
    for (int k = 0; k < nb; ++k) {
        put_half(&b[size_t(k) * q8_0_block_bytes], d);
        for (int i = 0; i < 32; ++i) b[size_t(k) * q8_0_block_bytes + 2 + size_t(i)] = uint8_t(int8_t(fill(k, i)));
    }
    return b;
}

void set_block_scale(std::vector<uint8_t>& row, int block, uint16_t d) {
    put_half(&row[size_t(block) * q8_0_block_bytes], d);
}

} // namespace

TEST_CASE("the composition the loader's reference path computes is blocks_to_i8_ref") {
    const int64_t n = 512;
    for (dtype t : block_types) {
        CAPTURE(name_of(t));
        const std::vector<uint8_t> b = quantized(t, randn(n, 7, 1.0f));
        std::vector<float> x(static_cast<size_t>(n)), tmp(static_cast<size_t>(n));
        dequantize_blocks_ref(t, b.data(), x.data(), n);
        std::vector<int8_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        const float want_s = quantize_row_i8_ref(x.data(), want.data(), n);
        int32_t sum = 0;
        const float got_s = cpu::blocks_to_i8_ref(t, b.data(), got.data(), &sum, tmp.data(), n);
        CHECK(got == want);
        CHECK(got_s == want_s);
        CHECK(sum == sum_i8_ref(want.data(), n));
    }
}

TEST_CASE("block rows from the reference quantizers: fast F32 and INT8 equal the reference, every type") {
    at_each_level([] {
        INFO("isa=", level_name());
        for (dtype t : block_types) {
            CAPTURE(name_of(t));
            const int64_t blk = block_of(t);
            uint32_t seed = 1;
            // one block, an odd number of blocks, and the widths of real rows
            for (int64_t n : {blk, 3 * blk, 2048 / blk * blk, 5632 / blk * blk})
                for (float sigma : {1e-3f, 1.0f, 300.0f}) check_row(t, quantized(t, randn(n, seed++, sigma)).data(), n);
        }
    });
}

TEST_CASE("random block bytes (every bit pattern: inf and NaN scales, code -128): fast equals reference") {
    at_each_level([] {
        INFO("isa=", level_name());
        for (dtype t : block_types) {
            CAPTURE(name_of(t));
            const int64_t blk = block_of(t);
            for (uint32_t seed = 1; seed <= 40; ++seed) {
                const int64_t n = blk * (1 + seed % 9);
                check_row(t, random_bytes(block_bytes_of(t, n), seed).data(), n);
                check_row(t, random_finite_blocks(t, n, 1000 + seed).data(), n);
            }
        }
    });
}

TEST_CASE("Q8_0 rows at the edges: zeros, the max in the last block, ties, odd scales") {
    const uint16_t one = 0x3c00, two = 0x4000, three = 0x4200, minus_one = 0xbc00;
    const uint16_t inf = 0x7c00, minus_inf = 0xfc00, nan = 0x7e00, sub = 0x0001, big = 0x7bff; // 65504
    struct edge {
        const char* name;
        std::vector<uint8_t> row;
    };
    std::vector<edge> edges;
    edges.push_back({"all bytes zero", q8_0_row(3, 0, [](int, int) { return 0; })});
    edges.push_back({"scale 1, codes zero", q8_0_row(3, one, [](int, int) { return 0; })});
    edges.push_back({"codes set, scale 0", q8_0_row(3, 0, [](int, int i) { return i - 16; })});
    auto last = q8_0_row(5, one, [](int, int i) { return i % 7 - 3; });
    set_block_scale(last, 4, three);
    last[4 * q8_0_block_bytes + 2 + 31] = uint8_t(int8_t(-128)); // the row's max |x|, its last value
    edges.push_back({"max in the last value of the last block", last});
    // Block 0 holds the max 2 * 127, so inv = 0.5 and block 1's odd codes land on halves.
    auto ties = q8_0_row(2, one, [](int k, int i) { return k == 0 ? 127 : 2 * i - 31; });
    set_block_scale(ties, 0, two);
    edges.push_back({"ties x * inv = k + 1/2 round to even", ties});
    edges.push_back({"negative scale, code -128", q8_0_row(2, minus_one, [](int, int i) { return i == 5 ? -128 : i; })});
    edges.push_back({"largest f16 scale, codes +-127 and -128",
                     q8_0_row(2, big, [](int, int i) { return i % 3 == 0 ? 127 : i % 3 == 1 ? -127 : -128; })});
    edges.push_back({"subnormal f16 scale alone", q8_0_row(3, sub, [](int k, int i) { return (k + 1) * (i - 15); })});
    auto mixed = q8_0_row(3, sub, [](int, int i) { return i * 4 - 64; });
    set_block_scale(mixed, 1, one);
    edges.push_back({"subnormal and normal scales", mixed});
    for (uint16_t odd : {inf, minus_inf, nan}) {
        auto r = q8_0_row(3, one, [](int, int i) { return i - 16; });
        set_block_scale(r, 1, odd);
        edges.push_back({"an inf or NaN scale in the middle block", r});
        auto e = q8_0_row(3, one, [](int, int i) { return i - 16; });
        set_block_scale(e, 2, odd);
        edges.push_back({"an inf or NaN scale in the last block", e});
    }
    // The ties case rounds as nearbyint does (to even), not as lround (away from zero).
    {
        std::vector<int8_t> q(64);
        std::vector<float> tmp(64);
        int32_t sum = 0;
        cpu::blocks_to_i8_ref(dtype::q8_0, ties.data(), q.data(), &sum, tmp.data(), 64);
        CHECK(q[32 + 15] == 0); // x = -1: -0.5
        CHECK(q[32 + 16] == 0); // x = 1: 0.5
        CHECK(q[32 + 17] == 2); // x = 3: 1.5
        CHECK(q[32 + 18] == 2); // x = 5: 2.5
    }
    at_each_level([&] {
        INFO("isa=", level_name());
        for (const edge& e : edges) {
            CAPTURE(e.name);
            check_row(dtype::q8_0, e.row.data(), int64_t(e.row.size() / q8_0_block_bytes) * q8_0_block);
        }
    });
}

TEST_CASE("Q8_0, Q4_K and Q6_K blocks with inf and NaN scales give the reference's bits (NaN where it has NaN)") {
    const uint16_t odd[] = {0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7d01, 0x3c00}; // inf, -inf, NaNs, a signaling one, 1
    std::vector<std::pair<dtype, std::vector<uint8_t>>> rows;
    for (dtype t : {dtype::q8_0, dtype::q4_k, dtype::q6_k}) {
        const std::vector<size_t> offs = scale_offsets(t);
        for (uint16_t a : odd)
            for (uint16_t b : odd) {
                if (offs.size() == 1 && b != odd[0]) continue; // one scale: each value once
                std::vector<uint8_t> r = quantized(t, randn(2 * block_of(t), a ^ b, 1.0f));
                put_half(&r[offs[0]], a); // the first block's scales; the second stays as quantized
                if (offs.size() == 2) put_half(&r[offs[1]], b);
                rows.emplace_back(t, std::move(r));
            }
    }
    at_each_level([&] {
        INFO("isa=", level_name());
        for (const auto& tr : rows) {
            CAPTURE(name_of(tr.first));
            check_row(tr.first, tr.second.data(), 2 * block_of(tr.first));
        }
    });
}

TEST_CASE("F32 rows to INT8: fast equals quantize_row_i8_ref at every length, with inf, NaN and tiny rows") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    at_each_level([&] {
        INFO("isa=", level_name());
        uint32_t seed = 1;
        for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 63, 64, 100, 257, 2048, 5632}) {
            CAPTURE(n);
            for (float sigma : {1e-30f, 1e-3f, 1.0f, 1e30f}) check_f32_row(randn(n, seed++, sigma));
            check_f32_row(std::vector<float>(size_t(n), 0.0f));
            check_f32_row(std::vector<float>(size_t(n), -0.0f));
            std::vector<float> ties(static_cast<size_t>(n)); // max 127 (inv = 1), the rest on halves
            for (int64_t i = 0; i < n; ++i) ties[size_t(i)] = float(i % 9) - 4.5f;
            ties[size_t(n - 1)] = -127.0f; // the max last (in the tail for most lengths)
            check_f32_row(ties);
            for (int64_t at : {int64_t(0), n / 2, n - 1}) { // first vector, middle, tail
                CAPTURE(at);
                for (float odd : {inf, -inf, nan}) {
                    auto x = randn(n, seed++, 2.0f);
                    x[size_t(at)] = odd;
                    check_f32_row(x);
                }
            }
            // max |x| so small that 127 / max overflows (the reference's own rule decides), and
            // small enough that its subnormal arithmetic is exercised without overflowing.
            for (float tiny : {1e-40f, 3e-38f, 1e-36f}) {
                auto x = randn(n, seed++, 1.0f);
                for (float& v : x) v = std::clamp(v, -3.0f, 3.0f) * tiny;
                check_f32_row(x);
            }
            auto huge = randn(n, seed++, 1.0f);
            huge[size_t(n / 3)] = 3e38f;
            check_f32_row(huge);
        }
    });
}

TEST_CASE("F16 and BF16 rows: every 16-bit pattern (NaNs, signaling ones included) and every tail") {
    std::vector<uint8_t> all(size_t(2) << 16);
    for (uint32_t v = 0; v < (1u << 16); ++v) put_half(&all[2 * size_t(v)], uint16_t(v));
    // NaNs among ordinary values, so that a group of 8 with one NaN meets the others
    std::vector<uint8_t> mixed = random_bytes(2 * 999, 5);
    for (size_t k = 0; k < 999; k += 37) put_half(&mixed[2 * k], uint16_t(0x7c01 + k)); // signaling NaNs
    at_each_level([&] {
        INFO("isa=", level_name());
        for (dtype t : {dtype::f16, dtype::bf16}) {
            CAPTURE(name_of(t));
            const auto reference = [t](const uint8_t* p, int64_t n) {
                std::vector<float> y(static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i) {
                    uint16_t h;
                    std::memcpy(&h, p + 2 * i, 2);
                    y[size_t(i)] = t == dtype::f16 ? fp16_to_f32(h) : bf16_to_f32(h);
                }
                return y;
            };
            std::vector<float> got(size_t(1) << 16, -1.0f);
            cpu::halves_to_f32(t, all.data(), got.data(), int64_t(got.size()));
            const std::vector<float> want = reference(all.data(), int64_t(got.size()));
            CHECK_MESSAGE(same_floats(got, want), "differs first at pattern ", first_difference(got, want));
            for (int64_t n = 1; n <= 40; ++n) { // every tail length, from an odd (unaligned) start
                CAPTURE(n);
                std::vector<float> g(static_cast<size_t>(n), -1.0f);
                cpu::halves_to_f32(t, mixed.data() + 2 * 3, g.data(), n);
                CHECK(same_floats(g, reference(mixed.data() + 2 * 3, n)));
            }
            std::vector<float> g(999);
            cpu::halves_to_f32(t, mixed.data(), g.data(), 999);
            CHECK(same_floats(g, reference(mixed.data(), 999)));
        }
    });
}

TEST_CASE("the loader gives the same INT8 and F32 weights at every ISA level") {
    test::scratch_dir dir("weight-convert");
    synth_params p = synth_preset("tiny");
    p.n_vocab = 300;
    p.n_embd = 256; // whole super-blocks
    p.n_ff = 512;
    cpu::thread_pool pool(2);
    for (dtype t : {dtype::q8_0, dtype::q4_k, dtype::q6_k, dtype::q5_0, dtype::iq4_xs, dtype::f16, dtype::bf16,
                    dtype::f32}) {
        CAPTURE(name_of(t));
        p.type = t;
        const std::string path = dir.file(std::string(name_of(t)) + ".gguf");
        synth_write(p, path);
        const gguf::file f = gguf::file::open(path);
        for (weight_format fmt : {weight_format::int8, weight_format::f32}) {
            CAPTURE(fmt == weight_format::int8 ? "int8" : "f32");
            // Every matrix of the model, in a fixed order.
            const auto matrices = [](const model_weights& w) {
                std::vector<const weight*> m = {&w.tok_embd, &w.output};
                for (const layer_weights& l : w.layers)
                    for (const auto field : layer_weight_fields)
                        if ((l.*field).n_in > 1) m.push_back(&(l.*field));
                return m;
            };
            cpu::force_isa(cpu::isa::scalar);
            model_config c0 = model_config::from_gguf(f);
            const model_weights want = model_weights::load(f, c0, {fmt, &pool});
            const std::vector<const weight*> wm = matrices(want);
            REQUIRE(wm.size() == 2 + 7 * size_t(p.n_layer));
            if (fmt == weight_format::int8)
                for (const weight* w : wm) // the row sums are sum_i8_ref's
                    for (int64_t r = 0; r < w->n_out; ++r) REQUIRE(w->q_sum[size_t(r)] == sum_i8_ref(w->q() + r * w->n_in, w->n_in));
            at_each_level([&] {
                INFO("isa=", level_name());
                model_config c = model_config::from_gguf(f);
                const model_weights got = model_weights::load(f, c, {fmt, &pool});
                const std::vector<const weight*> gm = matrices(got);
                REQUIRE(gm.size() == wm.size());
                for (size_t k = 0; k < gm.size(); ++k) {
                    CAPTURE(k);
                    const weight& a = *gm[k];
                    const weight& b = *wm[k];
                    REQUIRE(a.n_out == b.n_out);
                    REQUIRE(a.n_in == b.n_in);
                    if (fmt == weight_format::int8) {
                        CHECK(a.layout == q_layout::rows); // model_weights::load lays out rows unless asked
                        CHECK(std::equal(a.q(), a.q() + a.n_out * a.n_in, b.q()));
                        CHECK(std::memcmp(a.scale(), b.scale(), size_t(a.n_out) * sizeof(float)) == 0);
                        CHECK(a.q_sum == b.q_sum);
                    } else {
                        CHECK(same_floats(a.data, b.data));
                    }
                }
            });
        }
    }
}
