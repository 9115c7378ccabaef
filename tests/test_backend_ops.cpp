// Every op on every backend and ISA level this machine runs, against the scalar reference.
#include "cpu/dnnl_matmul.hpp"
#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/ref/ops_ref.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/fp16.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/ops/attention.hpp"
#include "runtime/ops/elementwise.hpp"
#include "runtime/ops/matmul.hpp"
#include "runtime/ops/quant.hpp"
#include "runtime/weights.hpp"
#include "quant/int8.hpp"
#include "tests/backend_rows.hpp"
#include "tests/op_data.hpp"
#if TANDEM_HAVE_CUDA
#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "cuda/weight.hpp"
#endif

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace tandem;
using tandem::test::nmse;
using tandem::test::randn;
using tandem::test::scattered_pages;
using namespace tandem::test; // backend_rows.hpp: op_mem, the tolerances, the CUDA rows

// An op shaped like runtime/ops/op_defs.hpp's, whose CUDA slot the test fills and empties.
struct probe_op {
    static constexpr std::string_view name = "probe";
    static void ref(int*) {}
    static void cpu(cpu::thread_pool&, int*) {}
    using cuda_fn = void(const cuda::context&, int* calls);
    static inline cuda_fn* cuda_impl = nullptr;
};

TEST_CASE("dispatch on CUDA goes through the op's slot; an empty one is an error naming the op") {
    int calls = 0;
    // The slot's function never touches the context: any non-null pointer passes dispatch's check.
    int stand_in = 0;
    const exec_ctx on_cuda{backend::cuda, nullptr, reinterpret_cast<cuda::context*>(&stand_in)};
    CHECK_THROWS_WITH(dispatch<probe_op>(on_cuda, &calls), "op probe has no cuda implementation");
    probe_op::cuda_impl = [](const cuda::context&, int* n) { ++*n; };
    dispatch<probe_op>(on_cuda, &calls);
    CHECK(calls == 1);
    probe_op::cuda_impl = nullptr;
}

TEST_CASE("isa detection and forcing") {
    const cpu::isa hw = cpu::detect_isa();
    CHECK(cpu::force_isa(cpu::isa::scalar) == cpu::isa::scalar);
    CHECK(cpu::active_isa() == cpu::isa::scalar);
    CHECK(cpu::force_isa(cpu::isa::amx) == hw); // never above the hardware
    CHECK(cpu::force_isa(cpu::isa::avx512) == std::min(hw, cpu::isa::avx512));
    cpu::force_isa(hw);
    MESSAGE("this CPU: ", std::string(cpu::name_of(hw)));
}

TEST_CASE("matmul vs reference on odd shapes") {
    for (int64_t n_in : {1 + 1, 7, 16, 17, 33, 64, 100, 257}) {
        for (int64_t n_tok : {1, 2, 3, 4, 5, 9, 33}) {
            const int64_t n_out = 13 + n_in % 7;
            weight w{randn(size_t(n_out * n_in), uint32_t(n_in * 31 + n_tok)), n_out, n_in};
            weight b{randn(size_t(n_out), 7), n_out, 1};
            const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok));
            for (bool with_bias : {false, true}) {
                for_each_cpu_variant([&](const exec_ctx& ctx) {
                    std::vector<float> out(size_t(n_tok * n_out), NAN);
                    ops::matmul(ctx, out.data(), x.data(), n_tok, w, with_bias ? &b : nullptr);
                    return out;
                }, tol_f32, "matmul n_in=" + std::to_string(n_in) + " n_tok=" + std::to_string(n_tok), cuda_row::none);
            }
        }
    }
}

TEST_CASE("matmul vs reference on shapes large enough to split across threads") {
    for (int64_t n_tok : {1, 6}) {
        const int64_t n_in = 1031, n_out = 301;
        weight w{randn(size_t(n_out * n_in), 11), n_out, n_in};
        const auto x = randn(size_t(n_tok * n_in), 12);
        for_each_cpu_variant([&](const exec_ctx& ctx) {
            std::vector<float> out(size_t(n_tok * n_out), NAN);
            ops::matmul(ctx, out.data(), x.data(), n_tok, w);
            return out;
        }, tol_f32, "matmul large n_tok=" + std::to_string(n_tok), cuda_row::none);
    }
}

// Quantized activations and their scales, flattened to floats (dequantized) for comparison.
std::vector<float> dequant(const std::vector<int8_t>& q, const std::vector<float>& s, int64_t n) {
    std::vector<float> out(q.size());
    for (size_t t = 0; t < s.size(); ++t) dequantize_row_i8_ref(&q[t * size_t(n)], s[t], &out[t * size_t(n)], n);
    return out;
}

TEST_CASE("int8 row quantization: round trip, saturation, zero rows") {
    const auto x = randn(257, 3);
    std::vector<int8_t> q(x.size());
    const float s = quantize_row_i8_ref(x.data(), q.data(), int64_t(x.size()));
    std::vector<float> back(x.size());
    dequantize_row_i8_ref(q.data(), s, back.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) CHECK(std::abs(back[i] - x[i]) <= 0.5f * s + 1e-7f);
    CHECK(*std::max_element(q.begin(), q.end()) <= 127);
    CHECK(*std::min_element(q.begin(), q.end()) >= -127);
    const std::vector<float> z(9, 0.0f);
    std::vector<int8_t> qz(9, 1);
    CHECK(quantize_row_i8_ref(z.data(), qz.data(), 9) == 0.0f);
    CHECK(std::all_of(qz.begin(), qz.end(), [](int8_t v) { return v == 0; }));
    const std::vector<float> odd{INFINITY, -INFINITY, NAN, 1.0f};
    std::vector<int8_t> qo(4);
    CHECK(quantize_row_i8_ref(odd.data(), qo.data(), 4) == doctest::Approx(1.0f / 127.0f));
    CHECK(qo == std::vector<int8_t>{127, -127, 0, 127});
    const int8_t a[3] = {-127, 5, 127}, b[3] = {-127, -3, 127};
    CHECK(dot_i8_ref(a, b, 3) == 127 * 127 * 2 - 15);
}

TEST_CASE("int8 activation quantization of rows with inf or NaN gives the reference's bytes") {
    const int64_t n = 37, n_tok = 5; // a tail of 5 lanes after two full vectors
    auto x = randn(size_t(n * n_tok), 4, 2.0f);
    x[3] = INFINITY;                                      // row 0: inf in the first vector
    x[n + 36] = -INFINITY;                                // row 1: -inf in the tail
    x[2 * n + 20] = std::numeric_limits<float>::quiet_NaN(); // row 2: NaN in the middle
    x[3 * n + 0] = 1e30f;                                 // row 3: huge but finite; row 4 plain
    std::vector<int8_t> want_q(x.size());
    std::vector<float> want_s(static_cast<size_t>(n_tok));
    ops::quantize_rows(exec_ctx{backend::ref}, {want_q.data(), want_s.data()}, x.data(), n_tok, n);
    for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
        const cpu::isa level = cpu::force_isa(cpu::isa(lvl));
        cpu::thread_pool pool(2);
        std::vector<int8_t> q(x.size());
        std::vector<float> sc(static_cast<size_t>(n_tok));
        ops::quantize_rows(exec_ctx{backend::cpu, &pool}, {q.data(), sc.data()}, x.data(), n_tok, n);
        INFO("isa=", std::string(cpu::name_of(level)));
        CHECK(q == want_q);
        CHECK(std::memcmp(sc.data(), want_s.data(), sc.size() * sizeof(float)) == 0);
    }
    cpu::force_isa(cpu::detect_isa());
}

TEST_CASE("int8 activation quantization ops vs reference (plain, fused RMSNorm, fused SwiGLU)") {
    for (int64_t n : {1, 15, 16, 17, 64, 100, 257}) {
        for (int64_t n_tok : {1, 3, 17, 33}) {
            const auto x = randn(size_t(n * n_tok), 1, 2.0f), w = randn(size_t(n), 2), u = randn(size_t(n * n_tok), 3);
            const std::string tag = " n=" + std::to_string(n) + " n_tok=" + std::to_string(n_tok);
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                std::vector<int8_t> q(x.size());
                std::vector<float> sc(static_cast<size_t>(n_tok));
                op_mem m(ctx);
                ops::quantize_rows(ctx, {m.out(q), m.out(sc)}, m.in(x), n_tok, n);
                m.finish();
                return dequant(q, sc, n);
            }, tol_i8, "quantize_rows" + tag);
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                std::vector<int8_t> q(x.size());
                std::vector<float> sc(static_cast<size_t>(n_tok));
                op_mem m(ctx);
                ops::rms_norm_quant(ctx, {m.out(q), m.out(sc)}, m.in(x), m.in(w), n_tok, n, 1e-5f);
                m.finish();
                return dequant(q, sc, n);
            }, tol_i8, "rms_norm_quant" + tag);
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                std::vector<int8_t> q(x.size());
                std::vector<float> sc(static_cast<size_t>(n_tok));
                op_mem m(ctx);
                ops::swiglu_quant(ctx, {m.out(q), m.out(sc)}, m.in(x), m.in(u), n_tok, n);
                m.finish();
                return dequant(q, sc, n);
            }, tol_i8_fused, "swiglu_quant" + tag);
        }
    }
}

TEST_CASE("two-term int8 activation quantization vs reference, and its error") {
    for (int64_t n : {1, 8, 15, 64, 130, 257}) {
        for (int64_t n_tok : {1, 3, 33}) {
            const auto x = randn(size_t(n_tok * n), uint32_t(n * 5 + n_tok), 3.0f);
            const std::string tag = " n=" + std::to_string(n) + " n_tok=" + std::to_string(n_tok);
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                std::vector<int8_t> q(2 * x.size());
                std::vector<float> s(size_t(2 * n_tok));
                op_mem m(ctx);
                ops::quantize_rows_split(ctx, {m.out(q), m.out(s)}, {m.out(q) + x.size(), m.out(s) + n_tok}, m.in(x),
                                         n_tok, n);
                m.finish();
                return dequant(q, s, n);
            }, tol_i8, "quantize_rows_split" + tag);
            // hi + lo reproduces x far closer than one int8 term
            std::vector<int8_t> q(2 * x.size());
            std::vector<float> s(size_t(2 * n_tok));
            ops::quantize_rows_split(exec_ctx{backend::ref}, {q.data(), s.data()}, {q.data() + x.size(), s.data() + n_tok},
                                     x.data(), n_tok, n);
            const auto both = dequant(q, s, n);
            std::vector<float> sum(x.size()), hi(both.begin(), both.begin() + ptrdiff_t(x.size()));
            for (size_t i = 0; i < x.size(); ++i) sum[i] = both[i] + both[i + x.size()];
            CHECK(nmse(x, sum) < 1e-8);
            CHECK(nmse(x, sum) <= nmse(x, hi));
        }
    }
}

TEST_CASE("int8 matmul (GEMV, small GEMM, oneDNN for batches >= 64) vs reference on odd shapes") {
    for (int64_t n_in : {2, 7, 31, 64, 65, 100, 257}) {
        for (int64_t n_tok : {1, 2, 3, 4, 5, 9, 16, 31, 32, 33, 63, 64, 65}) {
            const int64_t n_out = 13 + n_in % 7;
            const auto wf = randn(size_t(n_out * n_in), uint32_t(n_in * 31 + n_tok));
            const weight w = quantize_weight(wf.data(), n_out, n_in);
            weight b{randn(size_t(n_out), 7), n_out, 1};
            const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok));
            std::vector<int8_t> qx(x.size());
            std::vector<float> sx(static_cast<size_t>(n_tok));
            ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
            for (bool with_bias : {false, true}) {
                for_each_cpu_variant([&](const exec_ctx& ctx) {
                    std::vector<float> out(size_t(n_tok * n_out), NAN);
                    op_mem m(ctx);
                    ops::matmul_i8(ctx, m.out(out), m.in(qx), m.in(sx), n_tok, m.w(w), with_bias ? &m.w(b) : nullptr);
                    m.finish();
                    return out;
                }, tol_i8,
                   "matmul_i8 n_in=" + std::to_string(n_in) + " n_tok=" + std::to_string(n_tok));
            }
        }
    }
}

TEST_CASE("int8 matmul on shapes large enough to split across threads, and close to F32") {
    for (int64_t n_tok : {1, 6, 16, 48, 70}) {
        const int64_t n_in = 1031, n_out = 301;
        const auto wf = randn(size_t(n_out * n_in), 11);
        const weight w = quantize_weight(wf.data(), n_out, n_in);
        const auto x = randn(size_t(n_tok * n_in), 12);
        std::vector<int8_t> qx(x.size());
        std::vector<float> sx(static_cast<size_t>(n_tok));
        ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
        for_each_cpu_variant([&](const exec_ctx& ctx) {
            std::vector<float> out(size_t(n_tok * n_out), NAN);
            op_mem m(ctx);
            ops::matmul_i8(ctx, m.out(out), m.in(qx), m.in(sx), n_tok, m.w(w));
            m.finish();
            return out;
        }, tol_i8, "matmul_i8 large n_tok=" + std::to_string(n_tok));
        // W8A8 against the F32 product: the quantization error itself, well under 1e-3
        std::vector<float> want(size_t(n_tok * n_out)), got(want.size());
        ops::matmul(exec_ctx{backend::ref}, want.data(), x.data(), n_tok, weight{wf, n_out, n_in});
        ops::matmul_i8(exec_ctx{backend::ref}, got.data(), qx.data(), sx.data(), n_tok, w);
        CHECK(nmse(want, got) < 1e-3);
    }
}

// Batch invariance: a token's output is the same bits whichever kernel its batch size picks
// (the VNNI GEMV up to four tokens, AMX tiles from five where the CPU has them, oneDNN from
// 64), so greedy output does not depend on what else is in the batch, and speculation's
// verify steps see plain decoding's logits.
TEST_CASE("int8 matmul: every batch size gives each token the same bits as alone") {
    const cpu::isa hw = cpu::detect_isa();
    for (int64_t n_in : {64, 100, 257, 2048}) {
        const int64_t n_out = 48 + n_in % 5;
        const auto wf = randn(size_t(n_out * n_in), uint32_t(n_in + 1));
        weight w = quantize_weight(wf.data(), n_out, n_in);
        if (cpu::matmul_i8_layout() == q_layout::blocked) pack_blocked(w); // as the loader lays it out
        weight b{randn(size_t(n_out), 4), n_out, 1};
        for (int64_t n_tok : {2, 3, 4, 5, 8, 9, 16, 17, 33, 63, 64, 65, 130}) {
            const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok * 5 + n_in));
            std::vector<int8_t> qx(x.size());
            std::vector<float> sx(static_cast<size_t>(n_tok));
            ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
            cpu::thread_pool pool(2);
            const exec_ctx ctx{backend::cpu, &pool};
            std::vector<float> batched(size_t(n_tok * n_out));
            ops::matmul_i8(ctx, batched.data(), qx.data(), sx.data(), n_tok, w, &b);
            for (int64_t t = 0; t < n_tok; ++t) {
                std::vector<float> alone(static_cast<size_t>(n_out));
                ops::matmul_i8(ctx, alone.data(), qx.data() + t * n_in, sx.data() + t, 1, w, &b);
                CAPTURE(n_in);
                CAPTURE(n_tok);
                CAPTURE(t);
                REQUIRE(std::memcmp(alone.data(), batched.data() + t * n_out, alone.size() * sizeof(float)) == 0);
            }
        }
    }
    MESSAGE("batch invariance checked at ", std::string(cpu::name_of(cpu::active_isa())), " (this CPU: ",
            std::string(cpu::name_of(hw)), ")");
}

// The AMX kernel (16-token x 64-byte activation tiles, 16-output weight tiles from the blocked
// layout, zero padding for every tail): on a scalar model of the tiles everywhere, and on the
// tiles themselves where the CPU has them. Exact: the reference's bits.
TEST_CASE("int8 matmul on AMX tiles (emulated everywhere, hardware where present) vs reference") {
    const bool hw = cpu::detect_isa() == cpu::isa::amx;
    if (!hw) MESSAGE("AMX hardware rows skipped (this CPU or OS gives the process no AMX tiles); emulated rows run");
    const auto check = [&](int64_t n_in, int64_t n_out, int64_t n_tok) {
        const auto wf = randn(size_t(n_out * n_in), uint32_t(n_in * 7 + n_out));
        const weight rows = quantize_weight(wf.data(), n_out, n_in);
        weight w = rows;
        pack_blocked(w);
        weight b{randn(size_t(n_out), 9), n_out, 1};
        const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok + 3));
        std::vector<int8_t> qx(x.size());
        std::vector<float> sx(static_cast<size_t>(n_tok));
        ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
        std::vector<float> want(size_t(n_tok * n_out));
        ops::matmul_i8(exec_ctx{backend::ref}, want.data(), qx.data(), sx.data(), n_tok, rows, &b);
        const std::string tag =
            " n_in=" + std::to_string(n_in) + " n_out=" + std::to_string(n_out) + " n_tok=" + std::to_string(n_tok);
        for (int nt : {1, 3}) {
            cpu::thread_pool pool(nt);
            std::vector<float> got(want.size(), NAN);
            cpu::matmul_i8_amx_emulated(pool, got.data(), qx.data(), sx.data(), n_tok, w, b.data.data());
            INFO("amx emulated" << tag << " threads=" << nt);
            CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
            if (hw) {
                cpu::force_isa(cpu::isa::amx);
                std::vector<float> got_hw(want.size(), NAN);
                ops::matmul_i8(exec_ctx{backend::cpu, &pool}, got_hw.data(), qx.data(), sx.data(), n_tok, w, &b);
                INFO("amx hardware" << tag << " threads=" << nt);
                CHECK(std::memcmp(got_hw.data(), want.data(), want.size() * sizeof(float)) == 0);
            }
        }
    };
    for (int64_t n_in : {7, 64, 65, 100, 128, 257})
        for (int64_t n_out : {16, 33, 50, 130})
            for (int64_t n_tok : {1, 2, 16, 17, 32, 33, 63, 64, 100}) check(n_in, n_out, n_tok);
    // Prefill sizes, whose A tiles do not fit one token block (~512 KiB): blocks of 8 tiles of
    // 4,096 inputs and a last one of one tile; of 16 tiles of 2,048 and a last one of 3.
    check(4096, 50, 130);
    check(2048, 130, 300);
}

// oneDNN builds a primitive (JIT code, 64-130 KiB) per row count and tandem keeps each: batches
// of every size from 64 to step_tokens grew the prefill worker without end in issue 19's soak.
TEST_CASE("int8 matmul: oneDNN's primitives are few whatever the batch sizes") {
    if (cpu::detect_isa() < cpu::isa::avx512) {
        MESSAGE("oneDNN primitives: skipped (the oneDNN path runs at avx512 only)");
        return;
    }
    const int64_t n_in = 64, n_out = 40;
    const weight w = quantize_weight(randn(size_t(n_out * n_in), 31).data(), n_out, n_in);
    cpu::thread_pool pool(2);
    const size_t before = cpu::dnnl_primitive_count();
    for (int64_t n_tok = 64; n_tok < 200; ++n_tok) {
        const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok));
        std::vector<int8_t> qx(x.size());
        std::vector<float> sx(static_cast<size_t>(n_tok)), out(size_t(n_tok * n_out));
        ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
        ops::matmul_i8(exec_ctx{backend::cpu, &pool}, out.data(), qx.data(), sx.data(), n_tok, w);
    }
    CHECK(cpu::dnnl_primitive_count() - before <= 3); // 64, 128 and 192 rows
}

// The one INT8 layout of the CPU kernels (runtime/weight.hpp) is oneDNN's BA16a64b4a byte for
// byte, padding included, so oneDNN reads Tandem's copy in place; rows read back as they were.
TEST_CASE("blocked INT8 layout: oneDNN's BA16a64b4a, rows read back, in place or padded") {
    cpu::thread_pool pool(2);
    for (const auto& shape : {std::pair<int64_t, int64_t>{64, 64}, {128, 2048}, {80, 96}, {13, 7}, {200, 130},
                               {64, 66}, {1, 3}}) {
        const int64_t n_out = shape.first, n_in = shape.second;
        CAPTURE(n_out);
        CAPTURE(n_in);
        const weight rows = quantize_weight(randn(size_t(n_out * n_in), uint32_t(n_out + n_in)).data(), n_out, n_in);
        weight w = rows;
        const int8_t* before = w.q();
        pack_blocked(w, &pool);
        REQUIRE(w.layout == q_layout::blocked);
        CHECK((w.q() == before) == (n_out % 64 == 0 && n_in % 64 == 0)); // in place exactly when nothing pads
        REQUIRE(size_t(w.q_bytes()) == cpu::dnnl_blocked_bytes(rows));
        std::vector<int8_t> want(cpu::dnnl_blocked_bytes(rows));
        cpu::dnnl_blocked_reference(rows, want.data());
        CHECK(std::memcmp(w.q(), want.data(), want.size()) == 0);
        std::vector<int8_t> row(static_cast<size_t>(n_in));
        std::vector<float> f(static_cast<size_t>(n_in)), g(static_cast<size_t>(n_in));
        for (int64_t o = 0; o < n_out; ++o) {
            w.q_row(o, row.data());
            REQUIRE(std::memcmp(row.data(), rows.q() + o * n_in, size_t(n_in)) == 0);
            w.row_f32(o, f.data());
            rows.row_f32(o, g.data());
            REQUIRE(std::memcmp(f.data(), g.data(), f.size() * sizeof(float)) == 0);
        }
        pack_blocked(w, &pool); // a second time changes nothing
        CHECK(std::memcmp(w.q(), want.data(), want.size()) == 0);
    }
}

// Every kernel and fallback on either layout, at every ISA level this CPU runs, gives the
// reference's bits: the blocked GEMV's passes (one to four tokens over a whole block, then
// eight at a time over half of one), oneDNN on each layout from 64 tokens, the row GEMV on
// rows at the VNNI level, and blocks read back below it.
TEST_CASE("int8 matmul: both layouts at every ISA level give the reference's bits") {
    for (int64_t n_in : {7, 64, 100, 257}) {
        for (int64_t n_out : {13, 64, 70}) {
            const weight rows = quantize_weight(randn(size_t(n_out * n_in), uint32_t(n_in * 3 + n_out)).data(), n_out, n_in);
            weight blocked = rows;
            pack_blocked(blocked);
            const auto bias = randn(size_t(n_out), 5);
            for (int64_t n_tok : {1, 3, 4, 5, 8, 9, 16, 17, 64, 65}) {
                const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok + n_in));
                std::vector<int8_t> qx(x.size());
                std::vector<float> sx(static_cast<size_t>(n_tok));
                ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
                std::vector<float> want(size_t(n_tok * n_out));
                cpu::ref::matmul_i8(want.data(), qx.data(), sx.data(), n_tok, rows.q(), rows.scale(), rows.q_sum.data(),
                                    n_out, n_in, bias.data());
                for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
                    const cpu::isa level = cpu::force_isa(cpu::isa(lvl));
                    cpu::thread_pool pool(2);
                    for (const weight* w : {&rows, static_cast<const weight*>(&blocked)}) {
                        std::vector<float> got(want.size(), NAN);
                        cpu::matmul_i8(pool, got.data(), qx.data(), sx.data(), n_tok, *w, bias.data());
                        INFO("isa=", std::string(cpu::name_of(level)), w == &rows ? " rows" : " blocked", " n_in=", n_in,
                             " n_out=", n_out, " n_tok=", n_tok);
                        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
                    }
                    std::vector<float> ref_blocked(want.size(), NAN); // the reference reads blocked weights too
                    ops::matmul_i8(exec_ctx{backend::ref}, ref_blocked.data(), qx.data(), sx.data(), n_tok, blocked);
                    std::vector<float> ref_rows(want.size(), NAN);
                    ops::matmul_i8(exec_ctx{backend::ref}, ref_rows.data(), qx.data(), sx.data(), n_tok, rows);
                    CHECK(std::memcmp(ref_blocked.data(), ref_rows.data(), want.size() * sizeof(float)) == 0);
                }
                cpu::force_isa(cpu::detect_isa());
            }
        }
    }
}

TEST_CASE("rms_norm vs reference") {
    for (int64_t n : {1, 8, 15, 64, 130}) {
        for (int64_t n_tok : {1, 3, 17}) {
            const auto x = randn(size_t(n * n_tok), 1), w = randn(size_t(n), 2);
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                std::vector<float> out(x.size(), NAN);
                op_mem m(ctx);
                ops::rms_norm(ctx, m.out(out), m.in(x), m.in(w), n_tok, n, 1e-5f);
                m.finish();
                return out;
            }, tol_f32, "rms_norm n=" + std::to_string(n));
        }
    }
}

// A RoPE frequency table: base^(-2i / n_rot), divided by uneven per-pair factors when asked (as
// Llama 3's rope_freqs and YaRN's blends make them).
std::vector<float> rope_freqs(int n_rot, bool uneven) {
    std::vector<float> t(static_cast<size_t>(n_rot / 2));
    for (int i = 0; i < n_rot / 2; ++i) t[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(n_rot)) / (uneven ? float(1 + i % 3) : 1.0f);
    return t;
}

TEST_CASE("rope vs reference, both styles, partial rotation, linear scaling, tables and mscale") {
    for (bool neox : {false, true}) {
        for (int n_rot : {4, 8}) {
            const int n_head = 3, hd = 8;
            const int64_t n_tok = 11;
            const auto x = randn(size_t(n_tok * n_head * hd), 3);
            std::vector<int32_t> pos(static_cast<size_t>(n_tok));
            for (int64_t t = 0; t < n_tok; ++t) pos[size_t(t)] = int32_t(t * 37 + 5);
            for (const bool uneven : {false, true}) {
                const auto table = rope_freqs(n_rot, uneven);
                for (const float scale : {1.0f, 0.25f}) {
                    for (const float mscale : {1.0f, 1.25f}) {
                        for_each_cpu_variant([&](const exec_ctx& ctx) {
                            auto y = x;
                            op_mem m(ctx);
                            const rope_params rp{n_rot, m.in(table), scale, mscale, neox};
                            ops::rope(ctx, m.out(y), m.in(pos), n_tok, n_head, hd, rp);
                            m.finish();
                            return y;
                        }, tol_transcendental, std::string("rope neox=") + (neox ? "1" : "0"));
                    }
                }
            }
        }
    }
}

TEST_CASE("rope rotates the expected pairs by the table's frequency, times mscale") {
    // A unit vector in the first dim of pair i at position p turns into mscale (cos a, sin a)
    // with a = p * freq_scale * inv_freq[i], in the pair it belongs to.
    for (bool neox : {false, true}) {
        const std::vector<float> table{1.0f, 0.5f, 0.25f, 0.125f};
        for (const int pair : {0, 2}) {
            std::vector<float> x(8, 0.0f);
            const int first = neox ? pair : 2 * pair, partner = neox ? pair + 4 : 2 * pair + 1;
            x[size_t(first)] = 1.0f;
            const int32_t pos = 3;
            ops::rope(exec_ctx{backend::ref}, x.data(), &pos, 1, 1, 8, {8, table.data(), 0.5f, 2.0f, neox});
            const float a = 3.0f * 0.5f * table[size_t(pair)];
            CHECK(x[size_t(first)] == doctest::Approx(2.0f * std::cos(a)));
            CHECK(x[size_t(partner)] == doctest::Approx(2.0f * std::sin(a)));
        }
    }
}

TEST_CASE("geglu, scale and softcap: values, and every backend vs reference") {
    // gelu's tanh form at 1 and -1: 0.841192 and -0.158808; soft-capping at 30 leaves small
    // values almost unchanged and never passes the cap.
    const std::vector<float> g{1.0f, -1.0f, 0.0f}, u{1.0f, 2.0f, 5.0f};
    std::vector<float> out(3);
    ops::geglu(exec_ctx{backend::ref}, out.data(), g.data(), u.data(), 3);
    CHECK(out[0] == doctest::Approx(0.841192f).epsilon(1e-5));
    CHECK(out[1] == doctest::Approx(-2.0f * 0.158808f).epsilon(1e-5));
    CHECK(out[2] == 0.0f);
    std::vector<float> z{0.3f, 300.0f, -1e6f};
    ops::softcap(exec_ctx{backend::ref}, z.data(), 30.0f, 3);
    CHECK(z[0] == doctest::Approx(30.0f * std::tanh(0.01f)));
    CHECK(z[1] == doctest::Approx(30.0f).epsilon(1e-4));
    CHECK(z[2] == -30.0f);
    std::vector<float> s{1.0f, -2.0f};
    ops::scale(exec_ctx{backend::ref}, s.data(), 1.5f, 2);
    CHECK(s == std::vector<float>{1.5f, -3.0f});

    const auto a = randn(1001, 4, 3.0f), b = randn(1001, 5);
    for_each_cpu_variant([&](const exec_ctx& ctx) {
        std::vector<float> y(a.size(), NAN);
        op_mem m(ctx);
        ops::geglu(ctx, m.out(y), m.in(a), m.in(b), int64_t(a.size()));
        m.finish();
        return y;
    }, tol_transcendental, "geglu");
    for_each_cpu_variant([&](const exec_ctx& ctx) {
        auto y = a;
        op_mem m(ctx);
        float* p = m.out(y);
        ops::scale(ctx, p, 0.75f, int64_t(y.size()));
        ops::softcap(ctx, p, 2.0f, int64_t(y.size()));
        m.finish();
        return y;
    }, tol_transcendental, "scale+softcap");
}

TEST_CASE("swiglu and add vs reference") {
    const auto g = randn(1001, 4, 3.0f), u = randn(1001, 5);
    for_each_cpu_variant([&](const exec_ctx& ctx) {
        std::vector<float> out(g.size(), NAN);
        op_mem m(ctx);
        ops::swiglu(ctx, m.out(out), m.in(g), m.in(u), int64_t(g.size()));
        m.finish();
        return out;
    }, tol_transcendental, "swiglu");
    for_each_cpu_variant([&](const exec_ctx& ctx) {
        auto x = g;
        op_mem m(ctx);
        ops::add(ctx, m.out(x), m.in(u), int64_t(x.size()));
        m.finish();
        return x;
    }, 0.0, "add");
}

TEST_CASE("CUDA int8 GEMMs (tiled dp4a and cuBLASLt) vs reference on model-like shapes") {
    if (!cuda_available("matmul_i8 cuBLASLt shapes")) return;
#if TANDEM_HAVE_CUDA
    cuda::context& c = *cuda_device();
    struct shape { int64_t n_tok, n_out, n_in; };
    // stories260K's own shapes, odd token counts, K larger than a tile, TinyLlama-like rows.
    for (const shape sh : {shape{64, 172, 64}, shape{64, 64, 172}, shape{17, 32, 64}, shape{33, 256, 128},
                           shape{128, 512, 1024}, shape{300, 96, 2048}, shape{1, 5632, 256}, shape{16, 100, 100}}) {
        const auto wf = randn(size_t(sh.n_out * sh.n_in), uint32_t(sh.n_out + sh.n_in));
        const weight w = quantize_weight(wf.data(), sh.n_out, sh.n_in);
        const auto bias = randn(size_t(sh.n_out), 5);
        const auto x = randn(size_t(sh.n_tok * sh.n_in), uint32_t(sh.n_tok), 3.0f);
        std::vector<int8_t> qx(x.size() + 16);
        std::vector<float> sx(static_cast<size_t>(sh.n_tok));
        ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), sh.n_tok, sh.n_in);
        std::vector<float> want(size_t(sh.n_tok * sh.n_out));
        cpu::ref::matmul_i8(want.data(), qx.data(), sx.data(), sh.n_tok, w.q(), w.scale(), w.q_sum.data(), sh.n_out,
                            sh.n_in, bias.data());
        const cuda::device_weight dw(c, w);
        // qx again at a 4-byte offset: cuBLASLt's 16-byte alignment fails, the tiled kernel runs it.
        std::vector<int8_t> qx_off(qx.size() + 4);
        std::memcpy(qx_off.data() + 4, qx.data(), qx.size());
        const cuda::buffer d_qx = cuda::to_device(c, qx.data(), qx.size());
        const cuda::buffer d_qx_off = cuda::to_device(c, qx_off.data(), qx_off.size());
        const cuda::buffer d_sx = cuda::to_device(c, sx.data(), sx.size() * 4);
        const cuda::buffer d_bias = cuda::to_device(c, bias.data(), bias.size() * 4);
        const cuda::buffer d_out(c, want.size() * 4);
        for (cuda::gemm_impl impl : {cuda::gemm_impl::tiled, cuda::gemm_impl::cublaslt, cuda::gemm_impl::automatic}) {
            for (bool offset : {false, true}) {
                const int8_t* a = offset ? d_qx_off.as<int8_t>() + 4 : d_qx.as<int8_t>();
                const cuda::gemm_impl ran = cuda::matmul_i8(c, d_out.as<float>(), a, d_sx.as<float>(), sh.n_tok, dw.q(),
                                                            dw.scale(), sh.n_out, sh.n_in, d_bias.as<float>(), impl);
                std::vector<float> got(want.size(), NAN);
                c.download(got.data(), d_out.get(), got.size() * 4);
                c.synchronize();
                const bool lt_shape = sh.n_out % 4 == 0 && sh.n_in % 4 == 0 && !offset;
                INFO("n_tok=", sh.n_tok, " n_out=", sh.n_out, " n_in=", sh.n_in, " impl=", int(impl),
                     " ran=", int(ran), " offset=", offset);
                CHECK(nmse(want, got) <= tol_i8);
                if (impl == cuda::gemm_impl::tiled || !lt_shape) CHECK(ran == cuda::gemm_impl::tiled);
                if (impl == cuda::gemm_impl::cublaslt && lt_shape) CHECK(ran == cuda::gemm_impl::cublaslt);
            }
        }
        // The benchmark's baseline: cuBLASLt's raw int32 dots equal the reference's.
        if (sh.n_out % 4 == 0 && sh.n_in % 4 == 0) {
            const cuda::buffer d_i32(c, want.size() * 4);
            REQUIRE(cuda::gemm_i8_i32_cublaslt(c, d_i32.as<int32_t>(), d_qx.as<int8_t>(), sh.n_tok, dw.q(), sh.n_out,
                                               sh.n_in));
            std::vector<int32_t> got(want.size());
            c.download(got.data(), d_i32.get(), got.size() * 4);
            c.synchronize();
            bool exact = true;
            for (int64_t t = 0; t < sh.n_tok && exact; ++t)
                for (int64_t o = 0; o < sh.n_out && exact; ++o)
                    exact = got[size_t(t * sh.n_out + o)] ==
                            dot_i8_ref(&qx[size_t(t * sh.n_in)], w.q() + o * sh.n_in, sh.n_in);
            CHECK(exact);
        }
    }
#endif
}

TEST_CASE("embed and gather_rows on every backend equal weight::row_f32 and the rows themselves") {
    const int64_t n_vocab = 37, n_embd = 70;
    const auto table = randn(size_t(n_vocab * n_embd), 3);
    const std::vector<int32_t> tokens{0, 36, 5, 5, 17, 1}, rows{4, 0, 4, 2};
    for (bool i8 : {true, false}) {
        const weight w = i8 ? quantize_weight(table.data(), n_vocab, n_embd) : weight{table, n_vocab, n_embd};
        std::vector<float> want(tokens.size() * size_t(n_embd));
        for (size_t t = 0; t < tokens.size(); ++t) w.row_f32(tokens[t], &want[t * size_t(n_embd)]);
        std::vector<float> want_rows;
        for (int32_t r : rows) want_rows.insert(want_rows.end(), want.begin() + r * n_embd, want.begin() + (r + 1) * n_embd);
        const std::string what = std::string("embed ") + (i8 ? "int8" : "f32");
        auto run = [&](const exec_ctx& ctx) {
            op_mem m(ctx);
            std::vector<float> got(want.size(), NAN), gathered(want_rows.size(), NAN);
            ops::embed(ctx, m.out(got), m.in(tokens), int64_t(tokens.size()), m.w(w));
            ops::gather_rows(ctx, m.out(gathered), m.out(got), m.in(rows), int64_t(rows.size()), n_embd);
            m.finish();
            INFO(what, " on ", name_of(ctx.be));
            CHECK(got == want);
            CHECK(gathered == want_rows);
            return got;
        };
        for_each_cpu_variant(run, 0.0, what);
    }
}

TEST_CASE("fp16 and bf16 conversions") {
    CHECK(fp16_to_f32(0x3c00) == 1.0f);
    CHECK(fp16_to_f32(0xc000) == -2.0f);
    CHECK(fp16_to_f32(0x7bff) == 65504.0f);
    CHECK(fp16_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(std::isinf(fp16_to_f32(0x7c00)));
    CHECK(std::isnan(fp16_to_f32(0x7e00)));
    // Every finite half survives a round trip through f32.
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7c00) == 0x7c00) continue;
        REQUIRE(f32_to_fp16(fp16_to_f32(uint16_t(h))) == uint16_t(h));
    }
    CHECK(f32_to_fp16(65520.0f) == 0x7c00);           // rounds to inf
    CHECK(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00); // tie to even
    CHECK(bf16_to_f32(f32_to_bf16(1.5f)) == 1.5f);
    CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80); // tie to even
}
