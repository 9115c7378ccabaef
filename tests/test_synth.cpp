// Synthetic models (runtime/synth): presets, names and shapes, determinism by seed; the block-format references they use.
#include "quant/blocks.hpp"
#include "quant/q8_0.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/fp16.hpp"
#include "runtime/gguf.hpp"
#include "runtime/model_config.hpp"
#include "runtime/synth.hpp"
#include "tests/test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

using namespace tandem;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- Q8_0

TEST_CASE("q8_0 quantize/dequantize: layout and error bound") {
    // A known block: x = i - 16, so max|x| = 16 and d = 16/127.
    float x[32], y[32];
    for (int i = 0; i < 32; ++i) x[i] = float(i - 16);
    uint8_t block[34];
    quantize_q8_0_ref(x, block, 32);
    uint16_t dh;
    std::memcpy(&dh, block, 2);
    CHECK(dh == f32_to_fp16(16.0f / 127.0f));
    CHECK(int8_t(block[2 + 0]) == -127);
    CHECK(int8_t(block[2 + 16]) == 0);
    CHECK(int8_t(block[2 + 31]) == 119); // round(15 * 127 / 16)
    dequantize_q8_0_ref(block, y, 32);
    CHECK(y[0] == doctest::Approx(-16.0).epsilon(1e-3));

    // Random data at many scales: |x - deq(q(x))| <= d/2 plus the f16 rounding of d.
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal;
    const int64_t n = 32 * 512;
    std::vector<float> in(n), out(n);
    std::vector<uint8_t> q(size_t(n / 32 * 34));
    // Scales from 1e-2 to 1e4 keep d a normal f16; tinier blocks lose precision in d (as in GGML).
    for (int64_t i = 0; i < n; ++i) in[size_t(i)] = normal(rng) * std::pow(10.0f, float(i / 32 % 7) - 2.0f);
    quantize_q8_0_ref(in.data(), q.data(), n);
    dequantize_q8_0_ref(q.data(), out.data(), n);
    double max_rel = 0;
    for (int64_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(in[size_t(b * 32 + i)]));
        for (int i = 0; i < 32; ++i) {
            const float err = std::fabs(in[size_t(b * 32 + i)] - out[size_t(b * 32 + i)]);
            REQUIRE(err <= amax / 127.0f * 0.57f);
            max_rel = std::max(max_rel, double(err / amax));
        }
    }
    CHECK(max_rel > 0.001); // the bound is tight enough to matter

    // Zeros, NaN and infinities stay finite and sane.
    float special[32] = {};
    uint8_t sb[34];
    quantize_q8_0_ref(special, sb, 32);
    dequantize_q8_0_ref(sb, y, 32);
    CHECK(std::all_of(y, y + 32, [](float v) { return v == 0.0f; }));
    special[0] = NAN;
    special[1] = INFINITY;
    special[2] = -INFINITY;
    special[3] = 2.0f;
    quantize_q8_0_ref(special, sb, 32);
    dequantize_q8_0_ref(sb, y, 32);
    CHECK(y[0] == 0.0f);
    CHECK(y[1] == doctest::Approx(2.0).epsilon(1e-3));
    CHECK(y[2] == doctest::Approx(-2.0).epsilon(1e-3));
    CHECK(y[3] == doctest::Approx(2.0).epsilon(1e-3));
}

// ---------------------------------------------------------------- synthetic models

// ---------------------------------------------------------------- Q4_0, Q4_1, Q5_0, Q5_1

TEST_CASE("4- and 5-bit blocks decode as their layouts say, and the reference quantizer stays within half a step") {
    // Hand-built blocks: d = 0.5, m = -1; qs[j] = j | (15 - j) << 4; Q5's qh sets the fifth bit of
    // values 1 and 17 only.
    auto block = [](bool has_min, bool five) {
        std::vector<uint8_t> b;
        auto put16 = [&](uint16_t v) { b.insert(b.end(), {uint8_t(v & 0xff), uint8_t(v >> 8)}); };
        put16(f32_to_fp16(0.5f));
        if (has_min) put16(f32_to_fp16(-1.0f));
        if (five) {
            const uint32_t qh = (1u << 1) | (1u << 17);
            for (int i = 0; i < 4; ++i) b.push_back(uint8_t(qh >> (8 * i)));
        }
        for (int j = 0; j < 16; ++j) b.push_back(uint8_t(j | (15 - j) << 4));
        return b;
    };
    struct want { dtype t; bool has_min, five; float v0, v1, v16, v17; };
    for (const want w : {want{dtype::q4_0, false, false, 0.5f * (0 - 8), 0.5f * (1 - 8), 0.5f * (15 - 8), 0.5f * (14 - 8)},
                         want{dtype::q4_1, true, false, -1.0f, 0.5f - 1, 0.5f * 15 - 1, 0.5f * 14 - 1},
                         want{dtype::q5_0, false, true, 0.5f * (0 - 16), 0.5f * (17 - 16), 0.5f * (15 - 16),
                              0.5f * (30 - 16)},
                         want{dtype::q5_1, true, true, -1.0f, 0.5f * 17 - 1, 0.5f * 15 - 1, 0.5f * 30 - 1}}) {
        CAPTURE(name_of(w.t));
        const auto b = block(w.has_min, w.five);
        REQUIRE(b.size() == traits_of(uint32_t(w.t))->block_bytes);
        float y[32];
        dequantize_blocks_ref(w.t, b.data(), y, 32);
        CHECK(y[0] == w.v0);
        CHECK(y[1] == w.v1);
        CHECK(y[16] == w.v16);
        CHECK(y[17] == w.v17);
        // The rest follow the nibbles alone: value 5 is code 5, value 21 code 10.
        CHECK(y[5] == (w.has_min ? 0.5f * 5 - 1 : 0.5f * float(5 - (w.five ? 16 : 8))));
        CHECK(y[21] == (w.has_min ? 0.5f * 10 - 1 : 0.5f * float(10 - (w.five ? 16 : 8))));
    }
    // Random blocks at many scales: every value within half a step (plus d's f16 rounding) of
    // its input; for the symmetric types a whole step for values opposite the largest one (the
    // codes reach -2^(bits-1) on its side, only 2^(bits-1) - 1 on the other).
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal;
    const int64_t n = 32 * 256;
    std::vector<float> in(n), out(n);
    for (int64_t i = 0; i < n; ++i) in[size_t(i)] = normal(rng) * std::pow(10.0f, float(i / 32 % 5) - 2.0f) + (i / 32 % 3 == 0 ? 0.3f : 0.0f);
    for (dtype t : {dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1}) {
        CAPTURE(name_of(t));
        std::vector<uint8_t> q(size_t(n / 32) * traits_of(uint32_t(t))->block_bytes);
        quantize_blocks_ref(t, in.data(), q.data(), n);
        dequantize_blocks_ref(t, q.data(), out.data(), n);
        const bool has_min = t == dtype::q4_1 || t == dtype::q5_1;
        const int levels = t == dtype::q4_0 || t == dtype::q4_1 ? 16 : 32;
        for (int64_t b = 0; b < n / 32; ++b) {
            const float* x = &in[size_t(b * 32)];
            const auto [lo, hi] = std::minmax_element(x, x + 32);
            const float span = has_min ? *hi - *lo : 2 * std::max(std::fabs(*lo), std::fabs(*hi));
            const float step = span / float(has_min ? levels - 1 : levels);
            const float big = std::fabs(*lo) > std::fabs(*hi) ? *lo : *hi;
            for (int i = 0; i < 32; ++i) {
                const float bound = has_min || x[i] * big >= 0 ? 0.5f * step : step;
                REQUIRE(std::fabs(out[size_t(b * 32 + i)] - x[i]) <= bound * 1.01f + 2e-3f * std::fabs(x[i]) + 1e-3f * step);
            }
        }
    }
}

// ---------------------------------------------------------------- Q4_K, Q5_K, Q6_K

TEST_CASE("K-quant super-blocks decode as their layouts say, and the reference quantizers keep their precision") {
    // Q4_K / Q5_K: d = 0.5, dmin = 0.25; sub-block scales 1 2 3 4 17 18 33 50 and mins 0 1 2 3 20
    // 40 63 5, packed by hand (6 bits each in 12 bytes); qs[32 p + l] = l % 16 | (15 - l % 16) << 4.
    std::vector<uint8_t> q4;
    q4.insert(q4.end(), {uint8_t(f32_to_fp16(0.5f) & 0xff), uint8_t(f32_to_fp16(0.5f) >> 8),
                         uint8_t(f32_to_fp16(0.25f) & 0xff), uint8_t(f32_to_fp16(0.25f) >> 8)});
    q4.insert(q4.end(), {65, 66, 131, 196, 64, 129, 194, 3, 65, 130, 241, 82});
    std::vector<uint8_t> qs;
    for (int p = 0; p < 4; ++p)
        for (int l = 0; l < 32; ++l) qs.push_back(uint8_t(l % 16 | (15 - l % 16) << 4));
    std::vector<uint8_t> q5 = q4;
    for (int l = 0; l < 32; ++l) q5.push_back(uint8_t(1 << (l % 8))); // qh: value l of sub-block l % 8 gets 16
    q4.insert(q4.end(), qs.begin(), qs.end());
    q5.insert(q5.end(), qs.begin(), qs.end());
    REQUIRE(q4.size() == 144);
    REQUIRE(q5.size() == 176);
    float y[256];
    dequantize_blocks_ref(dtype::q4_k, q4.data(), y, 256);
    CHECK(y[0] == 0.0f);                      // sub-block 0, code 0, min 0
    CHECK(y[33] == 0.5f * 2 * 14 - 0.25f * 1);  // sub-block 1 (high nibbles of the first 32 bytes)
    CHECK(y[200] == 0.5f * 33 * 8 - 0.25f * 63); // sub-block 6: scale and min from the split bits
    CHECK(y[255] == -0.25f * 5);                 // sub-block 7, code 0
    dequantize_blocks_ref(dtype::q5_k, q5.data(), y, 256);
    CHECK(y[33] == 0.5f * 2 * (14 + 16) - 0.25f * 1);
    CHECK(y[198] == 0.5f * 33 * (6 + 16) - 0.25f * 63);
    CHECK(y[200] == 0.5f * 33 * 8 - 0.25f * 63); // bit 6 of qh[8] is clear
    // Q6_K: ql[i] = i, qh[i] = 37 i mod 256, scales s - 8, d = 0.5.
    std::vector<uint8_t> q6(210);
    for (int i = 0; i < 128; ++i) q6[size_t(i)] = uint8_t(i);
    for (int i = 0; i < 64; ++i) q6[size_t(128 + i)] = uint8_t(37 * i);
    for (int s = 0; s < 16; ++s) q6[size_t(192 + s)] = uint8_t(int8_t(s - 8));
    const uint16_t dh = f32_to_fp16(0.5f);
    std::memcpy(&q6[208], &dh, 2);
    dequantize_blocks_ref(dtype::q6_k, q6.data(), y, 256);
    CHECK(y[0] == 0.5f * -8 * (0 - 32));   // low nibble of ql[0], bits 0-1 of qh[0]
    CHECK(y[45] == 0.5f * -6 * (13 - 32)); // low nibble of ql[45], bits 2-3 of qh[13], scale 2
    CHECK(y[127] == 0.5f * -1 * (19 - 32)); // high nibble of ql[63], bits 6-7 of qh[31], scale 7
    CHECK(y[200] == 0.5f * 4 * (4 - 32));  // second half: high nibble of ql[72], qh[40], scale 12

    // Normal data at several scales: the quantized values' error against the input's power (the
    // other 256-multiple formats too: Q2_K's four levels keep the least).
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal;
    const int64_t n = 256 * 64;
    std::vector<float> in(n), out(n);
    for (int64_t i = 0; i < n; ++i) in[size_t(i)] = normal(rng) * std::pow(10.0f, float(i / 256 % 4) - 2.0f);
    for (const auto& tb : {std::pair{dtype::q4_k, 0.012}, std::pair{dtype::q5_k, 0.003}, std::pair{dtype::q6_k, 0.001},
                           std::pair{dtype::q2_k, 0.18}, std::pair{dtype::q3_k, 0.04},
                           std::pair{dtype::iq4_nl, 0.011}, std::pair{dtype::iq4_xs, 0.011}}) {
        const dtype t = tb.first; // not a structured binding: clang 14 cannot capture those
        const double bound = tb.second;
        CAPTURE(name_of(t));
        std::vector<uint8_t> q(block_bytes_of(t, n));
        quantize_blocks_ref(t, in.data(), q.data(), n);
        dequantize_blocks_ref(t, q.data(), out.data(), n);
        for (int64_t b = 0; b < n / 256; ++b) { // per super-block (their scales differ by 1000x)
            double err = 0, pow = 0;
            for (int64_t i = b * 256; i < (b + 1) * 256; ++i) {
                err += double(out[size_t(i)] - in[size_t(i)]) * double(out[size_t(i)] - in[size_t(i)]);
                pow += double(in[size_t(i)]) * double(in[size_t(i)]);
            }
            REQUIRE(err / pow < bound);
        }
    }
}

// ---------------------------------------------------------------- Q2_K, Q3_K, IQ4_NL, IQ4_XS

namespace {
void put_half_le(std::vector<uint8_t>& b, float v) {
    const uint16_t h = f32_to_fp16(v);
    b.insert(b.end(), {uint8_t(h & 0xff), uint8_t(h >> 8)});
}
} // namespace

TEST_CASE("Q2_K and Q3_K super-blocks decode as their layouts say") {
    // Q2_K {scales[16]; qs[64]; d, dmin}: scales[s] = sc | m << 4; d = 0.5, dmin = 0.25. qs bytes
    // are 0xE4 (two-bit fields 0, 1, 2, 3 from bit 0 up) but for qs[5] = 0x1B (3, 2, 1, 0) and
    // qs[63] = 0x40 (0, 0, 0, 1).
    std::vector<uint8_t> q2 = {0x21, 0x32, 0x03, 0xF4, 0x15, 0x26, 0x37, 0x08,
                               0x19, 0x2A, 0x3B, 0x0C, 0x1D, 0x2E, 0x3F, 0xA1};
    for (int i = 0; i < 64; ++i) q2.push_back(i == 5 ? 0x1B : i == 63 ? 0x40 : 0xE4);
    put_half_le(q2, 0.5f);
    put_half_le(q2, 0.25f);
    REQUIRE(q2.size() == 84);
    float y[256];
    dequantize_blocks_ref(dtype::q2_k, q2.data(), y, 256);
    CHECK(y[5] == 0.5f * 1 * 3 - 0.25f * 2);    // qs[5] bits 0-1, sub-block 0 (0x21)
    CHECK(y[21] == 0.5f * 2 * 0 - 0.25f * 3);   // qs[21] bits 0-1, sub-block 1 (0x32)
    CHECK(y[37] == 0.5f * 3 * 2 - 0.25f * 0);   // value 32 + 5: qs[5] bits 2-3, sub-block 2
    CHECK(y[84] == 0.5f * 6 * 2 - 0.25f * 2);   // value 64 + 20: qs[20] bits 4-5, sub-block 5
    CHECK(y[101] == 0.5f * 7 * 0 - 0.25f * 3);  // value 96 + 5: qs[5] bits 6-7, sub-block 6
    CHECK(y[131] == 0.5f * 9 * 0 - 0.25f * 1);  // second 128: qs[32 + 3] bits 0-1, sub-block 8
    CHECK(y[177] == 0.5f * 12 * 1 - 0.25f * 0); // 128 + 32 + 17: qs[32 + 17] bits 2-3, sub-block 11
    CHECK(y[255] == 0.5f * 1 * 1 - 0.25f * 10); // 128 + 96 + 31: qs[63] bits 6-7, sub-block 15 (0xA1)

    // Q3_K {hmask[32]; qs[64]; scales[12]; d}, d = 0.5. The 16 scales (stored + 32, 6 bits) are
    // 1 2 3 4 8 -12 31 -32 | -31 15 0 -1 16 -16 -27 28, i.e. u = 33 34 35 36 40 20 63 0 | 1 47 32
    // 31 48 16 5 60: bytes 0-7 hold the low nibbles of u0-u7 (low) and u8-u15 (high), bytes 8-11
    // the top two bits of u[j], u[j + 4], u[j + 8], u[j + 12] from bit 0 up.
    std::vector<uint8_t> q3;
    for (int l = 0; l < 32; ++l) q3.push_back(l == 5 ? 0x05 : l % 2 == 0 ? 0x0F : 0xF0); // hmask
    for (int i = 0; i < 64; ++i) q3.push_back(i == 5 ? 0x1B : 0xE4);                     // qs
    q3.insert(q3.end(), {0x11, 0xF2, 0x03, 0xF4, 0x08, 0x04, 0x5F, 0xC0, 0xCA, 0x66, 0x2E, 0xD2});
    put_half_le(q3, 0.5f);
    REQUIRE(q3.size() == 110);
    dequantize_blocks_ref(dtype::q3_k, q3.data(), y, 256);
    CHECK(y[32] == 0.5f * 3 * 1);      // qs[0] bits 2-3 = 1, hmask[0] bit 1 set: q = 1; scale 3
    CHECK(y[1] == 0.5f * 1 * -4);      // qs[1] bits 0-1 = 0, hmask[1] bit 0 clear: 0 - 4
    CHECK(y[53] == 0.5f * 4 * -3);     // 32 + 21: 1 - 4, sub-block 3
    CHECK(y[69] == 0.5f * 8 * 1);      // 64 + 5: qs[5] bits 4-5 = 1, hmask[5] = 0x05 bit 2 set
    CHECK(y[80] == 0.5f * -12 * 2);    // 64 + 16: sub-block 5, hmask[16] bit 2 set
    CHECK(y[101] == 0.5f * 31 * -4);   // 96 + 5: qs[5] bits 6-7 = 0, hmask[5] bit 3 clear
    CHECK(y[113] == 0.5f * -32 * -1);  // 96 + 17: 3 - 4, sub-block 7
    CHECK(y[130] == 0.5f * -31 * -4);  // second half: hmask[2] bit 4 clear; sub-block 8
    CHECK(y[144] == 0.5f * 15 * -4);   // 128 + 16: hmask[16] = 0x0F, bit 4 clear; sub-block 9
    CHECK(y[179] == 0.5f * -1 * 1);    // 128 + 32 + 19: hmask[19] = 0xF0, bit 5 set; sub-block 11
    CHECK(y[160] == 0.0f);             // sub-block 10: scale 0
    CHECK(y[192] == 0.5f * 16 * -2);   // 128 + 64: qs[32] bits 4-5 = 2, hmask[0] bit 6 clear
    CHECK(y[208] == 0.5f * -16 * -2);  // 128 + 64 + 16: sub-block 13
    CHECK(y[224] == 0.5f * -27 * -1);  // 128 + 96: qs[32] bits 6-7 = 3, hmask[0] bit 7 clear
    CHECK(y[255] == 0.5f * 28 * 3);    // 128 + 96 + 31: hmask[31] = 0xF0, bit 7 set
}

TEST_CASE("IQ4_NL and IQ4_XS blocks decode through the non-linear table as their layouts say") {
    // The table, from the format's definition: code k -> this value.
    const float kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    // IQ4_NL {d; qs[16]}: block 0 d = 0.5, qs[j] = j | (15 - j) << 4; block 1 d = -0.25, qs 0x7C.
    std::vector<uint8_t> nl;
    put_half_le(nl, 0.5f);
    for (int j = 0; j < 16; ++j) nl.push_back(uint8_t(j | (15 - j) << 4));
    put_half_le(nl, -0.25f);
    for (int j = 0; j < 16; ++j) nl.push_back(0x7C);
    REQUIRE(nl.size() == 2 * 18);
    float y[256];
    dequantize_blocks_ref(dtype::iq4_nl, nl.data(), y, 64);
    CHECK(y[0] == 0.5f * -127); // low nibble of qs[0]: code 0
    CHECK(y[3] == 0.5f * -65);
    CHECK(y[8] == 0.5f * 1);
    CHECK(y[16] == 0.5f * 113); // high nibble of qs[0]: code 15
    CHECK(y[21] == 0.5f * 25);  // high nibble of qs[5]: code 10
    CHECK(y[31] == 0.5f * -127);
    CHECK(y[32] == -0.25f * 53); // block 1 (18 bytes on): low nibble 12
    CHECK(y[63] == -0.25f * -10); // high nibble 7

    // IQ4_XS {d; u16 scales_h; scales_l[4]; qs[128]}, d = 0.5; the sub-block scales ls = 33 31 0 63
    // 40 17 50 32 (ls - 32 = 1 -1 -32 31 8 -15 18 0): scales_l holds their low nibbles (even
    // sub-blocks low), scales_h = 0xB6C6 their top two bits from bit 0 up; qs as IQ4_NL's block 0
    // in each sub-block.
    std::vector<uint8_t> xs;
    put_half_le(xs, 0.5f);
    xs.insert(xs.end(), {0xC6, 0xB6, 0xF1, 0xF0, 0x18, 0x02});
    for (int sb = 0; sb < 8; ++sb)
        for (int j = 0; j < 16; ++j) xs.push_back(uint8_t(j | (15 - j) << 4));
    REQUIRE(xs.size() == 136);
    dequantize_blocks_ref(dtype::iq4_xs, xs.data(), y, 256);
    CHECK(y[0] == 0.5f * 1 * -127);      // sub-block 0, code 0
    CHECK(y[48] == 0.5f * -1 * 113);     // sub-block 1, high nibble of its qs[0]: code 15
    CHECK(y[69] == 0.5f * -32 * -35);    // sub-block 2, code 5
    CHECK(y[127] == 0.5f * 31 * -127);   // sub-block 3, high nibble of its qs[15]: code 0
    CHECK(y[136] == 0.5f * 8 * 1);       // sub-block 4, code 8
    CHECK(y[180] == 0.5f * -15 * 38);    // sub-block 5, high nibble of its qs[4]: code 11
    CHECK(y[194] == 0.5f * 18 * -83);    // sub-block 6, code 2
    CHECK(y[230] == 0.0f);               // sub-block 7: ls = 32
    for (int i = 0; i < 16; ++i) CHECK(y[i] == 0.5f * kv[i]); // the whole table, in order

    // The reference quantizers keep zeros zero (no scale to divide by); their error bounds are
    // with the other K-quants' above.
    for (dtype t : {dtype::q2_k, dtype::q3_k, dtype::iq4_nl, dtype::iq4_xs}) {
        CAPTURE(name_of(t));
        const float zeros[256] = {};
        std::vector<uint8_t> q(block_bytes_of(t, 256));
        quantize_blocks_ref(t, zeros, q.data(), 256);
        std::fill(y, y + 256, 1.0f);
        dequantize_blocks_ref(t, q.data(), y, 256);
        CHECK(std::all_of(y, y + 256, [](float v) { return v == 0.0f; }));
    }
}

TEST_CASE("synth presets") {
    const synth_params tiny = synth_preset("tiny");
    CHECK(tiny.n_layer == 2);
    CHECK(tiny.n_embd == 64);
    CHECK(tiny.n_vocab == 512);
    const synth_params big = synth_preset("tinyllama-1.1b");
    CHECK(big.n_layer == 22);
    CHECK(big.n_embd == 2048);
    CHECK(big.n_head == 32);
    CHECK(big.n_head_kv == 4);
    CHECK(big.n_ff == 5632);
    CHECK(big.n_vocab == 32000);
    CHECK(big.n_ctx == 2048);
    CHECK(big.type == dtype::q8_0);
    CHECK_THROWS_WITH_AS(synth_preset("huge"), doctest::Contains("unknown preset 'huge'"), tandem::error);
}

TEST_CASE("synth writes a llama GGUF with llama.cpp's names and shapes") {
    test::scratch_dir dir("gguf-synth");
    synth_params p = synth_preset("tiny");
    p.n_layer = 3;
    p.n_vocab = 1000;
    const std::string path = dir.file("tiny.gguf");
    synth_write(p, path);
    const gguf::file f = gguf::file::open(path);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_string("general.name") == p.name);
    CHECK(f.get_int("general.file_type") == 0);
    CHECK(f.get_int("llama.context_length") == 256);
    CHECK(f.get_int("llama.embedding_length") == 64);
    CHECK(f.get_int("llama.block_count") == 3);
    CHECK(f.get_int("llama.feed_forward_length") == 160);
    CHECK(f.get_int("llama.attention.head_count") == 4);
    CHECK(f.get_int("llama.attention.head_count_kv") == 2);
    CHECK(f.get_int("llama.rope.dimension_count") == 16);
    CHECK(f.get_float("llama.rope.freq_base") == 10000.0);
    CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon").value() == doctest::Approx(1e-5));
    CHECK(f.get_int("llama.vocab_size") == 1000);
    CHECK(f.get_string("tokenizer.ggml.model") == "llama");
    CHECK(f.get_string("tokenizer.ggml.pre") == "default");
    CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
    CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
    CHECK(f.get_int("tokenizer.ggml.unknown_token_id") == 0);
    CHECK(f.get_bool("tokenizer.ggml.add_bos_token") == true);

    const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    const auto scores = f.get_f32_array("tokenizer.ggml.scores");
    const auto types = f.get_i32_array("tokenizer.ggml.token_type");
    REQUIRE(tokens.size() == 1000);
    REQUIRE(scores.size() == 1000);
    REQUIRE(types.size() == 1000);
    CHECK(std::set<std::string>(tokens.begin(), tokens.end()).size() == 1000);
    CHECK(tokens[0] == "<unk>");
    CHECK(types[0] == 2);
    CHECK(tokens[1] == "<s>");
    CHECK(tokens[2] == "</s>");
    CHECK(types[1] == 3);
    CHECK(types[2] == 3);
    CHECK(tokens[3] == "<0x00>");
    CHECK(tokens[3 + 0x41] == "<0x41>");
    CHECK(tokens[258] == "<0xFF>");
    for (int i = 3; i < 259; ++i) CHECK(types[size_t(i)] == 6);
    CHECK(tokens[259] == "\xe2\x96\x81");
    for (size_t i = 259; i < tokens.size(); ++i) {
        CHECK(types[i] == 1);
        CHECK(!tokens[i].empty());
        if (i > 259) CHECK(scores[i] < scores[i - 1]);
    }
    CHECK(std::find(tokens.begin(), tokens.end(), "\xe2\x96\x81the") != tokens.end());

    const int64_t e = 64, kv = 32, ff = 160, V = 1000;
    CHECK(f.tensors().size() == 3 + 9 * 3);
    auto check = [&](const std::string& name, std::vector<int64_t> ne, dtype t) {
        CAPTURE(name);
        const auto* ti = f.find_tensor(name);
        REQUIRE(ti);
        CHECK(ti->ne == ne);
        CHECK(ti->type == t);
    };
    check("token_embd.weight", {e, V}, dtype::f32);
    check("output_norm.weight", {e}, dtype::f32);
    check("output.weight", {e, V}, dtype::f32);
    for (int il = 0; il < 3; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        check(b + "attn_norm.weight", {e}, dtype::f32);
        check(b + "attn_q.weight", {e, e}, dtype::f32);
        check(b + "attn_k.weight", {e, kv}, dtype::f32);
        check(b + "attn_v.weight", {e, kv}, dtype::f32);
        check(b + "attn_output.weight", {e, e}, dtype::f32);
        check(b + "ffn_norm.weight", {e}, dtype::f32);
        check(b + "ffn_gate.weight", {e, ff}, dtype::f32);
        check(b + "ffn_up.weight", {e, ff}, dtype::f32);
        check(b + "ffn_down.weight", {ff, e}, dtype::f32);
    }

    // Values: norms near 1, matrices near N(0, 1/fan_in), no two tensors alike.
    auto stats = [&](const char* name) {
        const auto* t = f.find_tensor(name);
        const float* v = reinterpret_cast<const float*>(t->data);
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < t->n_elements(); ++i) s += v[i], s2 += double(v[i]) * v[i];
        const double mean = s / double(t->n_elements());
        return std::pair{mean, std::sqrt(s2 / double(t->n_elements()) - mean * mean)};
    };
    auto [norm_mean, norm_std] = stats("blk.1.ffn_norm.weight");
    CHECK(norm_mean == doctest::Approx(1.0).epsilon(0.05));
    CHECK(norm_std < 0.1);
    auto [q_mean, q_std] = stats("blk.0.attn_q.weight");
    CHECK(std::fabs(q_mean) < 0.01);
    CHECK(q_std == doctest::Approx(1.0 / 8.0).epsilon(0.05));
    auto [d_mean, d_std] = stats("blk.2.ffn_down.weight");
    CHECK(d_std == doctest::Approx(1.0 / std::sqrt(160.0)).epsilon(0.05));
    CHECK(std::memcmp(f.find_tensor("blk.0.attn_q.weight")->data, f.find_tensor("blk.1.attn_q.weight")->data, 256) != 0);
}

TEST_CASE("synth is deterministic by seed, for every type") {
    test::scratch_dir dir("gguf-synth-seed");
    synth_params p = synth_preset("tiny");
    p.n_layer = 1;
    p.n_vocab = 300;
    p.n_embd = 256; // rows of whole super-blocks for the K-quants and IQ4_XS
    p.n_ff = 512;
    const std::pair<dtype, int64_t> types[] = {
        {dtype::f32, 0},   {dtype::f16, 1},   {dtype::bf16, 32},   {dtype::q8_0, 7},    {dtype::q4_0, 2},
        {dtype::q4_1, 3},  {dtype::q5_0, 8},  {dtype::q5_1, 9},    {dtype::q2_k, 10},   {dtype::q3_k, 11},
        {dtype::q4_k, 14}, {dtype::q5_k, 16}, {dtype::q6_k, 18},   {dtype::iq4_nl, 25}, {dtype::iq4_xs, 30}};
    std::vector<float> ref; // attn_q as F32, from the first pass
    for (const auto& tf : types) {
        const dtype type = tf.first; // not a structured binding: clang 14 cannot capture those
        const int64_t file_type = tf.second;
        CAPTURE(name_of(type));
        p.type = type;
        p.seed = 11;
        synth_write(p, dir.file("a.gguf"));
        synth_write(p, dir.file("b.gguf"));
        p.seed = 12;
        synth_write(p, dir.file("c.gguf"));
        const auto a = test::read_bytes(dir.file("a.gguf"));
        CHECK(a == test::read_bytes(dir.file("b.gguf")));
        CHECK(a != test::read_bytes(dir.file("c.gguf")));

        const gguf::file f = gguf::file::open(dir.file("a.gguf"));
        CHECK(f.get_int("general.file_type") == file_type);
        CHECK(f.find_tensor("blk.0.ffn_norm.weight")->type == dtype::f32);
        const auto* t = f.find_tensor("blk.0.attn_q.weight");
        CHECK(t->type == type);
        CHECK(f.find_tensor("token_embd.weight")->type == type);
        // Every type decodes to the same seeded values, within the type's precision.
        std::vector<float> v(size_t(t->n_elements()));
        for (size_t i = 0; i < v.size(); ++i) {
            uint16_t h;
            switch (type) {
            case dtype::f32: std::memcpy(&v[i], t->data + 4 * i, 4); break;
            case dtype::f16: std::memcpy(&h, t->data + 2 * i, 2), v[i] = fp16_to_f32(h); break;
            case dtype::bf16: std::memcpy(&h, t->data + 2 * i, 2), v[i] = bf16_to_f32(h); break;
            default: break;
            }
        }
        if (is_block_format(type)) dequantize_blocks_ref(type, t->data, v.data(), t->n_elements());
        if (type == dtype::f32) ref = v;
        REQUIRE(ref.size() == v.size());
        const bool four = type == dtype::q4_0 || type == dtype::q4_1 || type == dtype::q4_k ||
                          type == dtype::iq4_nl || type == dtype::iq4_xs,
                   five = type == dtype::q5_0 || type == dtype::q5_1 || type == dtype::q5_k;
        const float tol = type == dtype::f32    ? 0.0f
                          : type == dtype::f16  ? 1e-3f
                          : type == dtype::bf16 ? 8e-3f
                          : type == dtype::q2_k ? 0.1f
                          : type == dtype::q3_k ? 0.05f
                          : four                ? 0.05f
                          : five                ? 0.025f
                                                : 0.02f;
        for (size_t i = 0; i < v.size(); ++i) REQUIRE(std::fabs(v[i] - ref[i]) <= tol * std::max(1.0f, 8.0f * std::fabs(ref[i])));
    }
}

TEST_CASE("synth presets at real models' shapes name their architectures") {
    // Each preset resolves to a consistent shape in a supported architecture (writing them
    // takes hundreds of MB each: the tiny files below cover each architecture's tensors).
    CHECK(synth_preset_names.size() == 12);
    for (const std::string_view name : synth_preset_names) {
        INFO(name);
        const synth_params p = synth_preset(name);
        CHECK((p.arch == "mixtral" || std::find(supported_archs.begin(), supported_archs.end(), p.arch) != supported_archs.end()));
        CHECK(p.n_head % p.n_head_kv == 0);
        const int32_t hd = p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
        CHECK(hd % 2 == 0);
        CHECK((p.head_dim > 0 || p.n_embd % p.n_head == 0));
    }
    CHECK(synth_preset("gemma3-1b").arch == "gemma3");
    CHECK(synth_preset("gemma3-1b").sliding_window == 512);
    CHECK(synth_preset("qwen3-0.6b").head_dim == 128);
    CHECK(synth_preset("llama3.2-1b").rope_scaling == "llama3");
    // the mixtures of experts at their published shapes
    const synth_params q3 = synth_preset("qwen3-30b-a3b");
    CHECK(q3.arch == "qwen3moe");
    CHECK(q3.n_expert == 128);
    CHECK(q3.n_expert_used == 8);
    CHECK(q3.n_ff_exp == 768);
    const synth_params q2 = synth_preset("qwen1.5-moe-a2.7b");
    CHECK(q2.n_expert == 60);
    CHECK(q2.n_ff_shexp == 5632);
    CHECK(synth_preset("mixtral-8x7b").n_expert_used == 2);
}

TEST_CASE("synth writes each architecture's tensors and keys under llama.cpp's names") {
    test::scratch_dir dir("gguf-synth-archs");
    struct want {
        const char* arch;
        std::vector<std::string> present, absent; // tensor names
        std::vector<std::string> keys;            // metadata keys after "<arch>."
    };
    const std::vector<want> cases{
        {"qwen2", {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias", "output.weight"}, {"blk.0.attn_qkv.weight"}, {}},
        {"qwen3", {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"}, {"blk.0.attn_q.bias"}, {"attention.key_length"}},
        {"phi3", {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"}, {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"},
         {"attention.sliding_window"}},
        {"gemma", {"blk.0.ffn_gate.weight"}, {"output.weight"}, {}},
        {"gemma2", {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"}, {"output.weight"},
         {"attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"}},
        {"gemma3", {"blk.1.attn_q_norm.weight", "blk.1.post_ffw_norm.weight"}, {"output.weight"},
         {"attention.sliding_window", "attention.key_length"}},
        {"qwen3moe",
         {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
          "blk.1.ffn_down_exps.weight", "blk.1.attn_q_norm.weight"},
         {"blk.0.ffn_gate.weight", "blk.0.ffn_gate_shexp.weight", "blk.0.ffn_gate_inp_shexp.weight"},
         {"expert_count", "expert_used_count", "expert_feed_forward_length"}},
        {"qwen2moe",
         {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_inp_shexp.weight",
          "blk.0.ffn_gate_shexp.weight", "blk.0.ffn_up_shexp.weight", "blk.1.ffn_down_shexp.weight",
          "blk.0.attn_q.bias"},
         {"blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"},
         {"expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"}},
    };
    for (const want& w : cases) {
        INFO(w.arch);
        synth_params p = synth_preset("tiny");
        p.arch = w.arch;
        if (std::string(w.arch) != "qwen2" && std::string(w.arch) != "gemma") p.sliding_window = 8;
        if (std::string(w.arch) == "qwen3" || std::string(w.arch) == "gemma3") p.head_dim = 32;
        const std::string path = dir.file(std::string(w.arch) + ".gguf");
        synth_write(p, path);
        const gguf::file f = gguf::file::open(path);
        CHECK(f.get_string("general.architecture") == std::string(w.arch));
        for (const std::string& t : w.present) CHECK_MESSAGE(f.find_tensor(t) != nullptr, t);
        for (const std::string& t : w.absent) CHECK_MESSAGE(f.find_tensor(t) == nullptr, t);
        for (const std::string& k : w.keys) CHECK_MESSAGE(f.find(std::string(w.arch) + "." + k), k);
    }
    {
        // Mixtral: llama with experts (3-D, n_ff wide) and no expert_feed_forward_length key
        synth_params m = synth_preset("tiny");
        m.arch = "mixtral";
        const std::string path = dir.file("mixtral.gguf");
        synth_write(m, path);
        const gguf::file f = gguf::file::open(path);
        CHECK(f.get_string("general.architecture") == std::string("llama"));
        CHECK(f.get_int("llama.expert_count") == 8);
        CHECK(f.get_int("llama.expert_used_count") == 2);
        CHECK_FALSE(f.find("llama.expert_feed_forward_length"));
        const gguf::tensor_info* up = f.find_tensor("blk.1.ffn_up_exps.weight");
        REQUIRE(up);
        CHECK(up->ne == std::vector<int64_t>{64, 160, 8});
        const gguf::tensor_info* down = f.find_tensor("blk.1.ffn_down_exps.weight");
        REQUIRE(down);
        CHECK(down->ne == std::vector<int64_t>{160, 64, 8});
        CHECK(f.find_tensor("blk.0.ffn_gate_inp.weight")->type == dtype::f32);
    }
    // Llama 3.1's rope_freqs: one factor per rotated pair.
    synth_params p = synth_preset("tiny");
    p.rope_scale = 8;
    p.rope_scaling = "llama3";
    synth_write(p, dir.file("llama3.gguf"));
    const gguf::file f = gguf::file::open(dir.file("llama3.gguf"));
    const gguf::tensor_info* rf = f.find_tensor("rope_freqs.weight");
    REQUIRE(rf);
    CHECK(rf->ne == std::vector<int64_t>{8});
    CHECK_FALSE(f.find("llama.rope.scaling.type")); // the factors say it all, as Llama 3.1's files
}

TEST_CASE("synth rejects inconsistent shapes") {
    test::scratch_dir dir("gguf-synth-bad");
    synth_params p = synth_preset("tiny");
    p.n_head = 5;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    p = synth_preset("tiny");
    p.n_head_kv = 3;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    p = synth_preset("tiny");
    p.n_vocab = 100;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    p = synth_preset("tiny");
    p.type = dtype::q8_0;
    p.n_ff = 100;
    CHECK_THROWS_WITH_AS(synth_write(p, dir.file("x.gguf")), doctest::Contains("multiples of 32"), tandem::error);
    p = synth_preset("tiny");
    p.type = dtype::i8;
    CHECK_THROWS_AS(synth_write(p, dir.file("x.gguf")), tandem::error);
    CHECK_FALSE(fs::exists(dir.file("x.gguf")));
}

TEST_CASE("a model in each 2- to 6-bit block format loads as the layout says, in F32 and INT8, and generates") {
    test::scratch_dir dir("gguf-synth-blocks");
    synth_params p = synth_preset("tiny");
    p.n_vocab = 300;
    for (dtype t : {dtype::q4_0, dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::iq4_nl, dtype::q2_k, dtype::q3_k,
                    dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_xs}) {
        CAPTURE(name_of(t));
        p.type = t;
        if (traits_of(uint32_t(t))->block == 256) { // rows of K-quants and IQ4_XS are whole super-blocks
            p.n_embd = 256;
            p.n_ff = 512;
        }
        const std::string path = dir.file(std::string(name_of(t)) + ".gguf");
        synth_write(p, path);
        const gguf::file f = gguf::file::open(path);
        const auto* q = f.find_tensor("blk.1.ffn_down.weight"); // [n_embd rows of n_ff]
        REQUIRE(q->type == t);
        std::vector<float> row(size_t(p.n_ff));
        const dtype_traits tr = *traits_of(uint32_t(t));
        const int64_t r = 5;
        dequantize_blocks_ref(t, q->data + r * (p.n_ff / tr.block) * int64_t(tr.block_bytes), row.data(), p.n_ff);
        for (const weight_format wf : {weight_format::f32, weight_format::int8}) {
            load_options lo;
            lo.weights = wf;
            model_bundle b = load_model(path, lo);
            std::vector<float> got(row.size());
            b.mdl->weights().layers[1].w_down.row_f32(r, got.data());
            // F32 holds the decoded values; INT8 re-quantizes them per row (within half its step).
            float amax = 0;
            for (float v : row) amax = std::max(amax, std::fabs(v));
            for (size_t i = 0; i < row.size(); ++i)
                REQUIRE(std::fabs(got[i] - row[i]) <= (wf == weight_format::f32 ? 0.0f : 0.51f * amax / 127));
            cpu::thread_pool pool(1);
            generate_params gp;
            gp.request.max_tokens = 6;
            gp.request.sampling.temperature = 0;
            gp.request.ignore_eos = true;
            CHECK(generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, {1}, gp).tokens.size() == 6);
        }
    }
}
