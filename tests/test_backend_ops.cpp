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

namespace {

// Named tolerances: f32 kernels differ from the reference only in summation order.
constexpr double tol_f32 = 1e-10;
constexpr double tol_transcendental = 1e-9; // exp/sin/cos in float vs the reference's
// INT8 kernels: integer dots are exact (GEMV and oneDNN alike) and the scaling is the
// reference's own expression, so results match bit for bit; a fused op may round an
// activation to the neighbouring int8 step where its vector exp differs in the last bits.
constexpr double tol_i8 = 1e-10;
constexpr double tol_i8_fused = 1e-5;
// F16/INT8 KV: pages hold the same bytes on every backend, so only summation order differs.
constexpr double tol_kv = 1e-9;

#if TANDEM_HAVE_CUDA
// The CUDA device the CUDA rows run on (device 0), or null: then each row prints as skipped.
cuda::context* cuda_device() {
    static std::string why;
    static const std::unique_ptr<cuda::context> ctx = []() -> std::unique_ptr<cuda::context> {
        if (cuda::list_devices(&why).empty()) return nullptr;
        return std::make_unique<cuda::context>(0);
    }();
    return ctx.get();
}
#endif

// Memory for one run of an op. On ref/cpu it hands back the host vectors themselves; on CUDA
// device copies of them (one per vector, made on first use), a device view of a weight, or a
// kv_cache over a device copy of the pages; finish() reads outputs (and pages) back.
class op_mem {
public:
    explicit op_mem(const exec_ctx& ctx) : ctx_(ctx) {}
    op_mem(const op_mem&) = delete;
    op_mem& operator=(const op_mem&) = delete;

    template <class T> const T* in(const std::vector<T>& v) { return dev(v.data(), v.size() * sizeof(T), nullptr); }
    // Read and written by the op: uploaded, and read back by finish().
    template <class T> T* out(std::vector<T>& v) { return dev(v.data(), v.size() * sizeof(T), v.data()); }

    const weight& w(const weight& host) {
#if TANDEM_HAVE_CUDA
        if (ctx_.be == backend::cuda) return weights_.emplace_back(*ctx_.cuda, host).view();
#endif
        return host;
    }

    kv_cache& kv(kv_cache& host) {
#if TANDEM_HAVE_CUDA
        if (ctx_.be == backend::cuda) {
            uint8_t* d = dev(host.base(), size_t(host.bytes()), host.base());
            return caches_.emplace_back(host.layout(), host.n_pages(), d);
        }
#endif
        return host;
    }

    void finish() {
#if TANDEM_HAVE_CUDA
        if (ctx_.be != backend::cuda) return;
        for (const auto& [host, d] : reads_) ctx_.cuda->download(host, d.first, d.second);
        ctx_.cuda->synchronize();
#endif
    }

private:
    template <class T> T* dev(T* host, size_t bytes, void* read_back) {
#if TANDEM_HAVE_CUDA
        if (ctx_.be == backend::cuda) {
            auto it = copies_.find(host);
            if (it == copies_.end())
                it = copies_.emplace(host, cuda::to_device(*ctx_.cuda, host, std::max<size_t>(bytes, 1))).first;
            // Copies are found by address: another array at a dead one's address would get its
            // stale copy. Arrays an op reads must live as long as the op_mem.
            REQUIRE_MESSAGE(it->second.bytes() == std::max<size_t>(bytes, 1),
                            "op_mem: a different array at an address already copied (keep inputs alive)");
            if (read_back) reads_[read_back] = {it->second.get(), bytes};
            return static_cast<T*>(it->second.get());
        }
#endif
        (void)bytes;
        (void)read_back;
        return host;
    }

    const exec_ctx& ctx_;
#if TANDEM_HAVE_CUDA
    std::map<const void*, cuda::buffer> copies_;
    std::map<void*, std::pair<void*, size_t>> reads_;
    std::list<cuda::device_weight> weights_;
    std::list<kv_cache> caches_;
#endif
};

// Whether an op has a CUDA twin to compare; one without prints as skipped.
enum class cuda_row { compare, none };

// Runs `op` on CUDA (device 0) and compares with `want`, or says why it cannot.
void run_cuda_row(const std::function<std::vector<float>(const exec_ctx&)>& op, const std::vector<float>& want,
                  double tol, const std::string& what) {
#if TANDEM_HAVE_CUDA
    cuda::context* c = cuda_device();
    if (!c) {
        MESSAGE(what, ": cuda skipped: no CUDA device");
        return;
    }
    const std::vector<float> got = op(exec_ctx{backend::cuda, nullptr, c});
    const double e = nmse(want, got);
    INFO(what, " backend=cuda nmse=", e);
    CHECK(e <= tol);
#else
    (void)op;
    (void)want;
    (void)tol;
    MESSAGE(what, ": cuda skipped: this build has no CUDA backend");
#endif
}

// Whether CUDA rows can run here; prints why not under `what` when they cannot.
bool cuda_available(const std::string& what) {
#if TANDEM_HAVE_CUDA
    if (cuda_device()) return true;
    MESSAGE(what, ": cuda skipped: no CUDA device");
#else
    MESSAGE(what, ": cuda skipped: this build has no CUDA backend");
#endif
    return false;
}

// Runs `op` once on the reference backend and then on the CPU at every ISA level this
// machine supports and with 1 and 3 threads, and on CUDA, comparing each result with the
// reference's.
void for_each_cpu_variant(const std::function<std::vector<float>(const exec_ctx&)>& op, double tol,
                          const std::string& what, cuda_row cuda = cuda_row::compare) {
    const std::vector<float> want = op(exec_ctx{backend::ref, nullptr});
    for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
        const cpu::isa level = cpu::force_isa(cpu::isa(lvl));
        for (int nt : {1, 3}) {
            cpu::thread_pool pool(nt);
            const std::vector<float> got = op(exec_ctx{backend::cpu, &pool});
            const double e = nmse(want, got);
            INFO(what, " isa=", std::string(cpu::name_of(level)), " threads=", nt, " nmse=", e);
            CHECK(e <= tol);
        }
    }
    cpu::force_isa(cpu::detect_isa());
    if (cpu::detect_isa() < cpu::isa::amx)
        MESSAGE(what, ": isa=amx skipped (this CPU or OS gives the process no AMX tiles)");
    if (cuda == cuda_row::none) {
        // No CUDA twin (the CUDA forward is INT8-only); say so rather than pass silently.
        MESSAGE(what, ": cuda skipped (no CUDA implementation of this op)");
        return;
    }
    run_cuda_row(op, want, tol, what);
}

} // namespace

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
                    ops::matmul_i8(ctx, m.out(out), m.in(qx), m.in(sx), n_tok, m.w(w), with_bias ? &b : nullptr);
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

// The AMX kernel (16-row x 64-byte weight tiles, 16-token activation tiles, K tail shifted back,
// rows past the last 16-row block on the GEMV): on a scalar model of the tiles everywhere, and
// on the tiles themselves where the CPU has them.
TEST_CASE("int8 matmul on AMX tiles (emulated everywhere, hardware where present) vs reference") {
    const bool hw = cpu::detect_isa() == cpu::isa::amx;
    if (!hw) MESSAGE("AMX hardware rows skipped (this CPU or OS gives the process no AMX tiles); emulated rows run");
    for (int64_t n_in : {64, 65, 100, 128, 257}) {
        for (int64_t n_out : {16, 33, 50}) {
            for (int64_t n_tok : {1, 2, 16, 17, 32, 33, 63}) {
                const auto wf = randn(size_t(n_out * n_in), uint32_t(n_in * 7 + n_out));
                const weight w = quantize_weight(wf.data(), n_out, n_in);
                weight b{randn(size_t(n_out), 9), n_out, 1};
                const auto x = randn(size_t(n_tok * n_in), uint32_t(n_tok + 3));
                std::vector<int8_t> qx(x.size());
                std::vector<float> sx(static_cast<size_t>(n_tok));
                ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
                std::vector<float> want(size_t(n_tok * n_out));
                ops::matmul_i8(exec_ctx{backend::ref}, want.data(), qx.data(), sx.data(), n_tok, w, &b);
                const std::string tag =
                    " n_in=" + std::to_string(n_in) + " n_out=" + std::to_string(n_out) + " n_tok=" + std::to_string(n_tok);
                for (int nt : {1, 3}) {
                    cpu::thread_pool pool(nt);
                    std::vector<float> got(want.size(), NAN);
                    cpu::matmul_i8_amx_emulated(pool, got.data(), qx.data(), sx.data(), n_tok, w, b.data.data());
                    INFO("amx emulated" << tag << " threads=" << nt);
                    CHECK(nmse(want, got) <= tol_i8);
                    if (hw) {
                        cpu::force_isa(cpu::isa::amx);
                        std::vector<float> got_hw(want.size(), NAN);
                        ops::matmul_i8(exec_ctx{backend::cpu, &pool}, got_hw.data(), qx.data(), sx.data(), n_tok, w, &b);
                        INFO("amx hardware" << tag << " threads=" << nt);
                        CHECK(nmse(want, got_hw) <= tol_i8);
                    }
                }
            }
        }
    }
}

TEST_CASE("int8 matmul with the weights reordered into oneDNN's blocked layout") {
    if (cpu::detect_isa() < cpu::isa::avx512) {
        MESSAGE("oneDNN blocked weights: skipped (the oneDNN path runs at avx512 only)");
        return;
    }
    const int64_t n_in = 96, n_out = 80, n_tok = 512; // dnnl_pack picks the layout for 512 tokens
    const auto wf = randn(size_t(n_out * n_in), 21);
    weight w = quantize_weight(wf.data(), n_out, n_in);
    const auto x = randn(size_t(n_tok * n_in), 22);
    std::vector<int8_t> qx(x.size());
    std::vector<float> sx(static_cast<size_t>(n_tok));
    ops::quantize_rows(exec_ctx{backend::ref}, {qx.data(), sx.data()}, x.data(), n_tok, n_in);
    std::vector<float> want(size_t(n_tok * n_out)), got(want.size());
    ops::matmul_i8(exec_ctx{backend::ref}, want.data(), qx.data(), sx.data(), n_tok, w);
    cpu::dnnl_pack(w);
    REQUIRE(w.packed != nullptr);
    cpu::thread_pool pool(2);
    ops::matmul_i8(exec_ctx{backend::cpu, &pool}, got.data(), qx.data(), sx.data(), n_tok, w);
    CHECK(nmse(want, got) <= tol_i8);
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

TEST_CASE("rope vs reference, both styles, partial rotation, linear scaling") {
    for (bool neox : {false, true}) {
        for (int n_rot : {4, 8}) {
            const int n_head = 3, hd = 8;
            const int64_t n_tok = 11;
            const auto x = randn(size_t(n_tok * n_head * hd), 3);
            std::vector<int32_t> pos(static_cast<size_t>(n_tok));
            for (int64_t t = 0; t < n_tok; ++t) pos[size_t(t)] = int32_t(t * 37 + 5);
            for (float scale : {1.0f, 0.25f}) {
                for_each_cpu_variant([&](const exec_ctx& ctx) {
                    auto y = x;
                    op_mem m(ctx);
                    ops::rope(ctx, m.out(y), m.in(pos), n_tok, n_head, hd, n_rot, 10000.0f, scale, neox);
                    m.finish();
                    return y;
                }, tol_transcendental, std::string("rope neox=") + (neox ? "1" : "0"));
            }
        }
    }
}

TEST_CASE("rope rotates the expected pairs") {
    // A unit vector in dim 0 at position p turns into (cos p, sin p) in the pair it belongs to.
    for (bool neox : {false, true}) {
        std::vector<float> x(8, 0.0f);
        x[0] = 1.0f;
        const int32_t pos = 3;
        ops::rope(exec_ctx{backend::ref}, x.data(), &pos, 1, 1, 8, 8, 10000.0f, 1.0f, neox);
        const int partner = neox ? 4 : 1;
        CHECK(x[0] == doctest::Approx(std::cos(3.0f)));
        CHECK(x[size_t(partner)] == doctest::Approx(std::sin(3.0f)));
    }
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

TEST_CASE("paged attention vs reference: KV dtypes, GQA ratios, page sizes, prefill and decode shapes") {
  for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
   for (int hd : {8, 32, 64, 80, 96, 128, 256}) { // 80 (and 8): the per-row block path; the rest: each register-blocked width
    for (int n_gqa : {1, 2, 4, 8}) {
        for (int page_size : {1, 4, 16}) {
            for (int64_t n_tok : {1, 5, 33, 70}) {
                const int n_kv = 2, n_head = n_kv * n_gqa;
                const int32_t n_past = n_tok == 70 ? 0 : 19; // a whole prompt at once, and a chunk after 19
                kv_layout lay{2, n_kv, hd, page_size, dt};
                const int32_t n_pos = n_past + int32_t(n_tok);
                const int32_t n_pages = (n_pos + page_size - 1) / page_size;
                const std::vector<int32_t> table = scattered_pages(n_pages, n_pages + 5, uint32_t(n_pos));
                kv_cache cache(lay, n_pages + 5);
                const auto k = randn(size_t(n_pos * n_kv * hd), 8), v = randn(size_t(n_pos * n_kv * hd), 9);
                const auto q = randn(size_t(n_tok * n_head * hd), 10);
                const int il = 1;
                for_each_cpu_variant([&](const exec_ctx& ctx) {
                    op_mem m(ctx);
                    kv_cache& kc = m.kv(cache);
                    ops::kv_store(ctx, kc, il, table, 0, m.in(k), m.in(v), n_pos);
                    std::vector<float> out(q.size(), NAN);
                    ops::attention(ctx, m.out(out), m.in(q), n_tok, n_past, n_head, kc, il, table,
                                   1.0f / std::sqrt(float(hd)));
                    m.finish();
                    return out;
                }, tol_kv,
                   "attention kv=" + std::string(name_of(dt)) + " hd=" + std::to_string(hd) + " gqa=" +
                       std::to_string(n_gqa) + " page=" + std::to_string(page_size) + " n_tok=" + std::to_string(n_tok));
            }
        }
    }
   }
  }
}

TEST_CASE("F16 and INT8 KV pages hold the values within their precision") {
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8}) {
        kv_layout lay{1, 2, 16, 4, dt};
        kv_cache cache(lay, 2);
        std::vector<int32_t> table{1, 0};
        const auto k = randn(size_t(5 * 2 * 16), 4), v = randn(size_t(5 * 2 * 16), 5);
        ops::kv_store(exec_ctx{backend::ref}, cache, 0, table, 0, k.data(), v.data(), 5);
        // one query head per kv head with a huge score on position 3 reads back V at 3
        std::vector<float> out(2 * 16);
        std::vector<float> q(2 * 16, 0.0f);
        for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 16; ++i) q[size_t(h * 16 + i)] = 1000.0f * k[size_t((3 * 2 + h) * 16 + i)];
        ops::attention(exec_ctx{backend::ref}, out.data(), q.data(), 1, 4, 2, cache, 0, table, 1.0f);
        const std::vector<float> want(v.begin() + 3 * 32, v.begin() + 4 * 32);
        INFO(name_of(dt));
        CHECK(nmse(want, out) < (dt == kv_dtype::f16 ? 1e-6 : 1e-3));
    }
}

TEST_CASE("a token's attention output does not depend on how the prompt was split into calls") {
    // Prefix-cache hits, preemption and chunked prefill compute the same positions in calls of
    // other sizes; the text stays byte-identical only if each row comes out bit for bit the same.
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::i8}) {
        for (int hd : {32, 64, 80, 96, 128, 256}) {
            const int n_kv = 2, n_gqa = 4, n_head = n_kv * n_gqa, page_size = 16;
            kv_layout lay{1, n_kv, hd, page_size, dt};
            const int32_t n_pos = 75;
            std::vector<int32_t> table(size_t((n_pos + page_size - 1) / page_size));
            for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(table.size() - 1 - i);
            const auto k = randn(size_t(n_pos * n_kv * hd), 51), v = randn(k.size(), 52);
            const auto q = randn(size_t(n_pos * n_head * hd), 53);
            const size_t row = size_t(n_head * hd);
            for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
                cpu::force_isa(cpu::isa(lvl));
                cpu::thread_pool pool(2);
                const exec_ctx ctx{backend::cpu, &pool};
                kv_cache cache(lay, int32_t(table.size()));
                ops::kv_store(ctx, cache, 0, table, 0, k.data(), v.data(), n_pos);
                // the whole prompt in one call, then in pieces of 40, 1, 33 and 1 tokens
                std::vector<float> whole(q.size()), pieces(q.size());
                ops::attention(ctx, whole.data(), q.data(), n_pos, 0, n_head, cache, 0, table, 0.125f);
                int32_t at = 0;
                for (int32_t n : {40, 1, 33, 1}) {
                    ops::attention(ctx, pieces.data() + at * row, q.data() + at * row, n, at, n_head, cache, 0, table,
                                   0.125f);
                    at += n;
                }
                REQUIRE(at == n_pos);
                // and the last token as a decode step among others
                std::vector<float> dec(q.size());
                const std::vector<ops::decode_seq> seqs{{n_pos - 1, n_pos - 1, table}};
                ops::attention_decode(ctx, dec.data(), q.data(), seqs, n_head, cache, 0, 0.125f);
                INFO("kv=", std::string(name_of(dt)), " hd=", hd, " isa=", std::string(cpu::name_of(cpu::isa(lvl))));
                CHECK(std::memcmp(whole.data(), pieces.data(), q.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(whole.data() + (n_pos - 1) * row, dec.data() + (n_pos - 1) * row, row * sizeof(float)) == 0);
            }
            cpu::force_isa(cpu::detect_isa());
        }
    }
}

TEST_CASE("decode attention of several sequences in one op equals one call per sequence") {
  for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
    for (int hd : {8, 64}) {
        for (int n_gqa : {1, 4}) {
            const int n_kv = 2, n_head = n_kv * n_gqa, page_size = 4;
            kv_layout lay{2, n_kv, hd, page_size, dt};
            // Four sequences with their own pages and lengths; their queries are rows 3, 0, 4 and 1
            // of q (row 2 belongs to none and must stay untouched).
            const std::vector<int32_t> n_past{0, 9, 2, 30};
            const std::vector<int64_t> rows{3, 0, 4, 1};
            std::vector<std::vector<int32_t>> tables;
            int32_t next_page = 0;
            for (int32_t np : n_past) {
                std::vector<int32_t> t(size_t((np + 1 + page_size - 1) / page_size));
                for (auto& pg : t) pg = next_page++;
                std::reverse(t.begin(), t.end()); // not in page order
                tables.push_back(t);
            }
            const auto q = randn(size_t(5 * n_head * hd), 21);
            const int il = 1;
            const std::string what = "attention_decode kv=" + std::string(name_of(dt)) + " hd=" + std::to_string(hd) +
                                     " gqa=" + std::to_string(n_gqa);
            // Each sequence's K and V live as long as the op: op_mem keeps one device copy per host
            // array, found by its address, which a dead vector's successor may reuse.
            std::vector<std::vector<float>> ks, vs;
            for (size_t i = 0; i < n_past.size(); ++i) {
                ks.push_back(randn(size_t((n_past[i] + 1) * n_kv * hd), uint32_t(30 + i)));
                vs.push_back(randn(ks.back().size(), uint32_t(40 + i)));
            }
            auto fill = [&](const exec_ctx& ctx, kv_cache& cache, op_mem& m) -> kv_cache& {
                kv_cache& kc = m.kv(cache);
                for (size_t i = 0; i < n_past.size(); ++i)
                    ops::kv_store(ctx, kc, il, tables[i], 0, m.in(ks[i]), m.in(vs[i]), n_past[i] + 1);
                return kc;
            };
            for_each_cpu_variant([&](const exec_ctx& ctx) {
                kv_cache cache(lay, next_page);
                op_mem m(ctx);
                kv_cache& kc = fill(ctx, cache, m);
                std::vector<ops::decode_seq> seqs;
                for (size_t i = 0; i < n_past.size(); ++i) seqs.push_back({rows[i], n_past[i], tables[i]});
                std::vector<float> out(q.size(), -7.0f);
                ops::attention_decode(ctx, m.out(out), m.in(q), seqs, n_head, kc, il, 0.125f);
                m.finish();
                return out;
            }, tol_kv, what);
            // On the CPU, bit for bit what one attention() call per sequence gives, at every ISA level.
            for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
                cpu::force_isa(cpu::isa(lvl));
                cpu::thread_pool pool(2);
                const exec_ctx ctx{backend::cpu, &pool};
                kv_cache cache(lay, next_page);
                op_mem m(ctx);
                kv_cache& kc = fill(ctx, cache, m);
                std::vector<float> one_op(q.size(), -7.0f), per_seq(q.size(), -7.0f);
                std::vector<ops::decode_seq> seqs;
                for (size_t i = 0; i < n_past.size(); ++i) seqs.push_back({rows[i], n_past[i], tables[i]});
                ops::attention_decode(ctx, one_op.data(), q.data(), seqs, n_head, kc, il, 0.125f);
                const size_t stride = size_t(n_head * hd);
                for (size_t i = 0; i < n_past.size(); ++i)
                    ops::attention(ctx, per_seq.data() + rows[i] * stride, q.data() + rows[i] * stride, 1, n_past[i],
                                   n_head, kc, il, tables[i], 0.125f);
                INFO(what, " isa=", std::string(cpu::name_of(cpu::isa(lvl))));
                CHECK(std::memcmp(one_op.data(), per_seq.data(), q.size() * sizeof(float)) == 0);
                CHECK(std::all_of(one_op.begin() + 2 * stride, one_op.begin() + 3 * stride,
                                  [](float x) { return x == -7.0f; }));
            }
            cpu::force_isa(cpu::detect_isa());
        }
    }
  }
}

TEST_CASE("attention with one position equals that position's value") {
    kv_layout lay{1, 1, 4, 4};
    kv_cache cache(lay, 1);
    std::vector<int32_t> table{0};
    const std::vector<float> k{1, 2, 3, 4}, v{5, 6, 7, 8}, q{0.3f, -1, 2, 0.5f};
    cpu::thread_pool pool(1);
    for (backend be : {backend::ref, backend::cpu, backend::cuda}) {
        exec_ctx ctx{be, &pool};
        if (be == backend::cuda) {
            if (!cuda_available("attention one position")) continue;
#if TANDEM_HAVE_CUDA
            ctx.cuda = cuda_device();
#endif
        }
        op_mem m(ctx);
        kv_cache& kc = m.kv(cache);
        ops::kv_store(ctx, kc, 0, table, 0, m.in(k), m.in(v), 1);
        std::vector<float> out(4);
        ops::attention(ctx, m.out(out), m.in(q), 1, 0, 1, kc, 0, table, 0.5f);
        m.finish();
        INFO(name_of(be));
        CHECK(out == v);
    }
}

TEST_CASE("kv_store writes the reference's page bytes on every backend (f32, f16, i8; split writes)") {
    for (kv_dtype dt : {kv_dtype::f32, kv_dtype::f16, kv_dtype::i8}) {
        for (int hd : {8, 64, 80}) {
            for (int page_size : {1, 4, 16}) {
                const int n_kv = 3;
                kv_layout lay{2, n_kv, hd, page_size, dt};
                const int32_t n_pos = 29;
                const int32_t n_pages = (n_pos + page_size - 1) / page_size;
                const std::vector<int32_t> table = scattered_pages(n_pages, n_pages + 3, uint32_t(page_size));
                auto k = randn(size_t(n_pos * n_kv * hd), 18, 2.0f), v = randn(size_t(n_pos * n_kv * hd), 19);
                k[7] = INFINITY; // saturates in i8, overflows to inf in f16
                v[3] = 1e6f;
                k[hd + 2] = std::bit_cast<float>(0xffe00001u); // a NaN with a payload: f16 keeps only the sign
                v[2 * hd + 1] = 3e-8f;                                // an f16 subnormal
                const std::string what = "kv_store kv=" + std::string(name_of(dt)) + " hd=" + std::to_string(hd) +
                                         " page=" + std::to_string(page_size);
                // Positions 0..10 and then 11..28: the second write starts inside a page.
                auto write = [&](const exec_ctx& ctx, kv_cache& cache) {
                    op_mem m(ctx);
                    kv_cache& kc = m.kv(cache);
                    ops::kv_store(ctx, kc, 1, table, 0, m.in(k), m.in(v), 11);
                    const std::vector<float> k2(k.begin() + 11 * n_kv * hd, k.end()),
                        v2(v.begin() + 11 * n_kv * hd, v.end());
                    ops::kv_store(ctx, kc, 1, table, 11, m.in(k2), m.in(v2), n_pos - 11);
                    m.finish();
                };
                kv_cache want(lay, n_pages + 3);
                write(exec_ctx{backend::ref}, want);
                auto same_bytes = [&](const kv_cache& got) {
                    return std::memcmp(want.base(), got.base(), size_t(want.bytes())) == 0;
                };
                cpu::thread_pool pool(2);
                kv_cache on_cpu(lay, n_pages + 3);
                write(exec_ctx{backend::cpu, &pool}, on_cpu);
                INFO(what);
                CHECK(same_bytes(on_cpu));
                if (!cuda_available(what)) continue;
#if TANDEM_HAVE_CUDA
                kv_cache on_cuda(lay, n_pages + 3);
                write(exec_ctx{backend::cuda, nullptr, cuda_device()}, on_cuda);
                CHECK(same_bytes(on_cuda));
#endif
            }
        }
    }
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

TEST_CASE("CUDA embedding rows equal weight::row_f32 (INT8 and F32 tables)") {
    if (!cuda_available("embed")) return;
#if TANDEM_HAVE_CUDA
    cuda::context& c = *cuda_device();
    const int64_t n_vocab = 37, n_embd = 70;
    const auto table = randn(size_t(n_vocab * n_embd), 3);
    const std::vector<int32_t> tokens{0, 36, 5, 5, 17, 1};
    for (bool i8 : {true, false}) {
        const weight w = i8 ? quantize_weight(table.data(), n_vocab, n_embd) : weight{table, n_vocab, n_embd};
        std::vector<float> want(tokens.size() * size_t(n_embd)), got(want.size(), NAN);
        for (size_t t = 0; t < tokens.size(); ++t) w.row_f32(tokens[t], &want[t * size_t(n_embd)]);
        const cuda::device_weight dw(c, w);
        const cuda::buffer d_tok = cuda::to_device(c, tokens.data(), tokens.size() * 4);
        const cuda::buffer d_out(c, got.size() * 4);
        cuda::embed(c, d_out.as<float>(), d_tok.as<int32_t>(), int64_t(tokens.size()), dw.q(), dw.scale(), dw.f32(),
                    n_embd);
        c.download(got.data(), d_out.get(), got.size() * 4);
        c.synchronize();
        INFO("i8=", i8);
        CHECK(got == want);
    }
#endif
}

TEST_CASE("CUDA attention on long contexts, large heads and odd page sizes vs reference") {
    if (!cuda_available("attention long")) return;
    struct config { kv_dtype dt; int hd, n_kv, n_gqa, page_size; int64_t n_tok; int32_t n_past; };
    for (const config cf : {config{kv_dtype::f16, 128, 2, 4, 16, 300, 0},     // prefill over many tiles
                            config{kv_dtype::i8, 256, 1, 2, 16, 20, 100},      // head_dim 256: > 48 KiB smem
                            config{kv_dtype::f32, 64, 4, 1, 16, 1, 1500},      // decode, long context
                            config{kv_dtype::f16, 64, 2, 8, 7, 70, 33},        // page size not a power of 2
                            config{kv_dtype::i8, 96, 2, 3, 32, 41, 64}}) {     // GQA 3, head_dim 96
        const int n_head = cf.n_kv * cf.n_gqa;
        kv_layout lay{3, cf.n_kv, cf.hd, cf.page_size, cf.dt};
        const int32_t n_pos = cf.n_past + int32_t(cf.n_tok);
        const int32_t n_pages = (n_pos + cf.page_size - 1) / cf.page_size;
        std::vector<int32_t> table(static_cast<size_t>(n_pages));
        for (int32_t i = 0; i < n_pages; ++i) table[size_t(i)] = n_pages - 1 - i; // reversed
        kv_cache cache(lay, n_pages);
        const auto k = randn(size_t(n_pos) * size_t(cf.n_kv * cf.hd), 81, 1.5f);
        const auto v = randn(size_t(n_pos) * size_t(cf.n_kv * cf.hd), 82);
        const auto q = randn(size_t(cf.n_tok) * size_t(n_head * cf.hd), 83, 1.5f);
        const std::string what = "attention kv=" + std::string(name_of(cf.dt)) + " hd=" + std::to_string(cf.hd) +
                                 " n_tok=" + std::to_string(cf.n_tok) + " n_past=" + std::to_string(cf.n_past);
        auto run = [&](const exec_ctx& ctx) {
            op_mem m(ctx);
            kv_cache& kc = m.kv(cache);
            ops::kv_store(ctx, kc, 2, table, 0, m.in(k), m.in(v), n_pos);
            std::vector<float> out(q.size(), NAN);
            ops::attention(ctx, m.out(out), m.in(q), cf.n_tok, cf.n_past, n_head, kc, 2, table,
                           1.0f / std::sqrt(float(cf.hd)));
            m.finish();
            return out;
        };
        run_cuda_row(run, run(exec_ctx{backend::ref}), tol_kv, what);
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
