// CUDA backend: device discovery, context, error checks, out-of-memory reporting, and the CUDA
// runner against the CPU runner (same greedy tokens, K/V pages handed over both ways).
// Without a device every case that needs one prints "skipped: no CUDA device" and passes; built
// as test_cuda_emulated, every case runs on the emulated device of tests/cuda_emu/.
#include "cpu/ref/ops_ref.hpp"
#include "cuda/blaslt.hpp"
#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/runner.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/synth.hpp"
#include "batch_checks.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace tandem;
using test::nmse;
using test::read_kv;
using test::paged_kv;
using test::seq_driver;

namespace {

// Logits of the CUDA runner against the CPU runner's (NMSE). The emulated kernels compute what
// the CPU does in another order: 1e-10 apart, or about 5e-7 where a norm's last bit flips one
// activation's rounding to int8 (the flat batch's sequence of 16 tokens); a real device's
// tensor cores and fast math may differ far more.
#if TANDEM_CUDA_EMULATED
constexpr double runner_tol = 2e-6;
#else
constexpr double runner_tol = 1e-4;
#endif
// Over many small random models the flips add up: one or two activations a step land one int8
// step apart, which moves a tiny model's logits by NMSE 1e-5 to 2e-4 (measured on the emulated
// device over the architectures below with F16 and F32 pages: which model flips where changes
// with the page type). A feature the device skipped (a norm, the RoPE table, the activation)
// moves them by far more; Gemma 2's soft-caps at 50 and 30 bend these small scores too little to
// show here, so their kernels are checked op by op (test_backend_ops, test_attention_ops).
constexpr double runner_flip_tol = std::max(runner_tol, 1e-3);

bool have_device() {
    std::string why;
    const auto devs = cuda::list_devices(&why);
    if (devs.empty()) MESSAGE("skipped: no CUDA device (", why, ")");
    return !devs.empty();
}

} // namespace

TEST_CASE("CUDA_CHECK turns an error into tandem::error naming the statement") {
    // Needs no device: the macro only formats what the runtime returns.
    try {
        CUDA_CHECK(cudaErrorInvalidValue);
        FAIL("no throw");
    } catch (const error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("cudaErrorInvalidValue") != std::string::npos);
        CHECK(msg.find("CUDA error on device") == 0);
    }
    try {
        CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
        FAIL("no throw");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("cuBLAS error") == 0);
    }
}

TEST_CASE("device query, context, allocation") {
    if (!have_device()) return;
    const auto devs = cuda::list_devices();
    for (const auto& d : devs) {
        MESSAGE("device ", d.index, ": ", d.name, " sm_", d.cc_major, d.cc_minor, ", ", d.total_mem >> 20, " MiB");
        CHECK(d.total_mem > 0);
        CHECK(d.n_sm > 0);
    }
    cuda::context ctx(0);
    void* p = ctx.alloc(1 << 20);
    CHECK(p != nullptr);
    CUDA_CHECK(cudaMemsetAsync(p, 0x5a, 1 << 20, static_cast<cudaStream_t>(ctx.stream())));
    unsigned char host[16] = {};
    CUDA_CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(ctx.stream())));
    ctx.synchronize();
    CHECK(host[0] == 0x5a);
    CHECK(host[15] == 0x5a);
    ctx.free(p);
    ctx.synchronize();
}

TEST_CASE("out of device memory is a clear error, and the context stays usable") {
    if (!have_device()) return;
    cuda::context ctx(0);
    const size_t too_much = cuda::list_devices()[0].total_mem * 4;
    try {
        ctx.alloc(too_much);
        FAIL("no throw");
    } catch (const error& e) {
        const std::string msg = e.what();
        MESSAGE(msg);
        CHECK(msg.find("out of memory") != std::string::npos);
        CHECK(msg.find("CUDA device 0") != std::string::npos);
        CHECK(msg.find(std::to_string(too_much >> 20) + " MiB") != std::string::npos); // names the size
    }
    try {
        cuda::buffer b(ctx, too_much);
        FAIL("no throw");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
    }
    void* p = ctx.alloc(4096);
    CHECK(p != nullptr);
    ctx.free(p);
    ctx.synchronize();
}

// ---- the CUDA runner against the CPU runner on stories260K (INT8 weights)

namespace {

// NMSE of each position's K/V for a failure's message (where the two runners' pages part):
// read_kv's rows are head_dim values of one position, n positions per (layer, K|V, head).
std::string kv_nmse_by_position(const std::vector<float>& a, const std::vector<float>& b, int32_t n, int hd) {
    std::string s;
    const size_t row = size_t(hd), runs = a.size() / (row * size_t(n));
    for (int32_t i = 0; i < n; ++i) {
        std::vector<float> x, y;
        for (size_t r = 0; r < runs; ++r) {
            const auto at = ptrdiff_t((r * size_t(n) + size_t(i)) * row);
            x.insert(x.end(), a.begin() + at, a.begin() + at + ptrdiff_t(row));
            y.insert(y.end(), b.begin() + at, b.begin() + at + ptrdiff_t(row));
        }
        s += fmt::format("{}:{:.1e} ", i, nmse(x, y));
    }
    return s;
}

std::string join(const std::vector<token_id>& t) {
    std::string s;
    for (auto id : t) s += std::to_string(id) + " ";
    return s;
}

constexpr int n_greedy = 32;

} // namespace

TEST_CASE("make_cuda_runner without that device is a clear error") {
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    try {
        make_cuda_runner(*b.mdl, 99);
        FAIL("no throw");
    } catch (const error& e) {
        MESSAGE(std::string(e.what()));
        CHECK(std::string(e.what()).find("no CUDA device 99") == 0);
    }
}

TEST_CASE("CUDA runner: greedy tokens on stories260K equal the CPU runner's (every KV dtype, two page sizes)") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    model& m = *b.mdl;
    const auto prompt = b.tok->encode("Once upon a time, there was a little girl named Lily.", true);
    auto gpu = make_cuda_runner(m, 0);
    auto cpu = make_cpu_runner(m, 2);
    MESSAGE(gpu->device());
    for (kv_dtype dt : {kv_dtype::f16, kv_dtype::f32, kv_dtype::i8}) {
        for (int32_t ps : {16, 5}) {
            kv_layout lay = m.make_kv_layout(ps);
            lay.dtype = dt;
            paged_kv kv_cpu(lay, 64), kv_gpu(lay, 64);
            seq_driver c(*cpu, kv_cpu, m.config().n_vocab), g(*gpu, kv_gpu, m.config().n_vocab);
            const token_id c0 = c.prefill(prompt, prompt.size());
            const token_id g0 = g.prefill(prompt, prompt.size());
            const double e = nmse(c.logits, g.logits);
            INFO("kv=", name_of(dt), " page=", ps, " prompt logits nmse=", e);
            CHECK(e < runner_tol);
            const auto want = c.decode(c0, n_greedy), got = g.decode(g0, n_greedy);
            INFO("cpu:  ", join(want));
            INFO("cuda: ", join(got));
            CHECK(got == want);
            // The pages the CUDA runner wrote hold what the CPU's hold, up to rounding and the
            // flips above (on the H200, F32 pages: NMSE 2.9e-6 over the decoded positions).
            const int32_t n = int32_t(prompt.size()) + n_greedy;
            const auto kc = read_kv(kv_cpu, c.seq.block_table(), n), kg = read_kv(kv_gpu, g.seq.block_table(), n);
            CHECK_MESSAGE(nmse(kc, kg) < runner_tol, "pages' NMSE by position: ", kv_nmse_by_position(kc, kg, n, lay.head_dim));
        }
    }
}

TEST_CASE("CUDA runner: K/V hand-off through host pages, both ways, with chunked prefill") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    model& m = *b.mdl;
    const int32_t n_vocab = m.config().n_vocab;
    const auto prompt = b.tok->encode("The cat sat on the mat and looked at the big red ball.", true);
    auto gpu = make_cuda_runner(m, 0);
    auto cpu = make_cpu_runner(m, 2);
    const kv_layout lay = m.make_kv_layout(16); // F16, the engine's default
    paged_kv kv_ref(lay, 64);
    seq_driver ref(*cpu, kv_ref, n_vocab);
    const auto want = ref.decode(ref.prefill(prompt, prompt.size()), n_greedy);

    // GPU prefill (in chunks of 7: pages half full between chunks) into registered host pages,
    // then the CPU decodes from those very pages.
    {
        paged_kv kv(lay, 64);
        cuda::register_host(kv.base(), size_t(kv.bytes()));
        seq_driver d(*gpu, kv, n_vocab);
        const token_id next = d.prefill(prompt, 7);
        const auto* st = cuda::stats_of(*gpu);
        REQUIRE(st != nullptr);
        MESSAGE("last chunk: hand-off ", st->handoff_bytes, " bytes in ", st->handoff_s * 1e6, " us, uploaded ",
                st->upload_bytes, " bytes");
        CHECK(st->handoff_bytes > 0);
        CHECK(st->upload_bytes > 0); // the chunk had past pages to bring over
        d.r = cpu.get();
        const auto got = d.decode(next, n_greedy);
        INFO("cpu only:         ", join(want));
        INFO("gpu prefill, cpu: ", join(got));
        CHECK(got == want);
        cuda::unregister_host(kv.base());
    }
    // CPU prefill, then the GPU decodes (its mirror brings the CPU's pages over every step).
    {
        paged_kv kv(lay, 64);
        seq_driver d(*cpu, kv, n_vocab);
        const token_id next = d.prefill(prompt, prompt.size());
        d.r = gpu.get();
        const auto got = d.decode(next, n_greedy);
        INFO("cpu only:         ", join(want));
        INFO("cpu prefill, gpu: ", join(got));
        CHECK(got == want);
    }
}

TEST_CASE("CUDA runner keeping its pages: decode steps upload only what the device lacks; tokens unchanged") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    model& m = *b.mdl;
    const int32_t n_vocab = m.config().n_vocab;
    const kv_layout lay = m.make_kv_layout(16);
    auto cpu = make_cpu_runner(m, 2);
    const auto p1 = b.tok->encode("The cat sat on the mat and looked at the big red ball.", true);
    const auto p2 = b.tok->encode("Once upon a time, there was a little girl named Lily.", true);
    std::vector<std::vector<token_id>> want;
    for (const auto* p : {&p1, &p2}) {
        paged_kv kv_ref(lay, 64);
        seq_driver ref(*cpu, kv_ref, n_vocab);
        want.push_back(ref.decode(ref.prefill(*p, p->size()), n_greedy));
    }
    // Device pages for the whole pool, then for two pages only (grown as batches need).
    for (int64_t mirror_bytes : {int64_t(0), 2 * lay.page_bytes()}) {
        CAPTURE(mirror_bytes);
        cuda_runner_options ro;
        ro.keep_pages = true;
        ro.mirror_bytes = mirror_bytes;
        auto gpu = make_cuda_runner(m, 0, ro);
        paged_kv kv(lay, 64);
        cuda::register_host(kv.base(), size_t(kv.bytes()));
        for (size_t k = 0; k < 2; ++k) {
            // CPU prefill; the GPU decodes the first half, the CPU the rest from the same pages.
            // The second prompt reuses the first one's pages (new generations: re-uploaded).
            const auto& prompt = k == 0 ? p1 : p2;
            seq_driver d(*cpu, kv, n_vocab);
            d.generations = true;
            token_id next = d.prefill(prompt, 5);
            d.r = gpu.get();
            std::vector<token_id> got;
            for (int i = 0; i < n_greedy; ++i) {
                if (i == n_greedy / 2) d.r = cpu.get();
                got.push_back(next);
                next = d.step(std::span(&got.back(), 1));
                const auto* st = cuda::stats_of(*gpu);
                REQUIRE(st != nullptr);
                if (i == 0) {
                    MESSAGE("first GPU step: ", st->upload_bytes, " bytes uploaded, ", st->mirror_pages,
                            " device pages");
                    CHECK(st->upload_bytes > 0);
                } else if (i < n_greedy / 2 && mirror_bytes == 0) {
                    CHECK(st->upload_bytes == 0); // every past position is on the device already
                    CHECK(st->kept_bytes > 0);
                }
            }
            INFO("prompt ", k);
            INFO("cpu only:           ", join(want[k]));
            INFO("cpu prefill, gpu+cpu: ", join(got));
            CHECK(got == want[k]);
        }
        // Without generations the same runner re-uploads every past position: still right.
        seq_driver d(*cpu, kv, n_vocab);
        const token_id next = d.prefill(p1, p1.size());
        d.r = gpu.get();
        CHECK(d.decode(next, n_greedy) == want[0]);
        const auto* st = cuda::stats_of(*gpu);
        CHECK(st->kept_bytes == 0);
        cuda::unregister_host(kv.base());
    }
}

TEST_CASE("CUDA runner: a flat batch of sequences (prefill and decode) matches the CPU runner") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    model& m = *b.mdl;
    const int32_t n_vocab = m.config().n_vocab;
    auto gpu = make_cuda_runner(m, 0);
    auto cpu = make_cpu_runner(m, 2);
    std::mt19937 rng(5);
    std::vector<std::vector<token_id>> prompts;
    for (size_t len : {20, 3, 37, 1, 16}) {
        std::vector<token_id> p(len);
        for (auto& t : p) t = token_id(rng() % uint32_t(n_vocab));
        prompts.push_back(p);
    }
    const kv_layout lay = m.make_kv_layout(16);
    paged_kv kv_c(lay, 64), kv_g(lay, 64);
    std::vector<std::unique_ptr<sequence_kv>> sc, sg;
    batch bc, bg;
    for (const auto& p : prompts) {
        sc.push_back(std::make_unique<sequence_kv>(kv_c.pages, lay.page_size));
        sg.push_back(std::make_unique<sequence_kv>(kv_g.pages, lay.page_size));
        REQUIRE(sc.back()->reserve(int32_t(p.size()) + 1));
        REQUIRE(sg.back()->reserve(int32_t(p.size()) + 1));
        const int32_t last = int32_t(p.size()) - 1;
        bc.add_seq(bc.seq_id.size(), 0, p, sc.back()->block_table(), {}, last);
        bg.add_seq(bg.seq_id.size(), 0, p, sg.back()->block_table(), {}, last);
    }
    std::vector<float> lc(prompts.size() * size_t(n_vocab)), lg(lc.size());
    cpu->forward(bc, kv_c, lc.data());
    gpu->forward(bg, kv_g, lg.data());
    for (size_t i = 0; i < prompts.size(); ++i) {
        const std::span<const float> c(&lc[i * size_t(n_vocab)], size_t(n_vocab)), g(&lg[i * size_t(n_vocab)], size_t(n_vocab));
        INFO("prefill sequence ", i);
        CHECK(nmse(c, g) < runner_tol);
        CHECK(std::max_element(c.begin(), c.end()) - c.begin() == std::max_element(g.begin(), g.end()) - g.begin());
    }
    std::vector<token_id> next(prompts.size());
    bc.clear();
    bg.clear();
    for (size_t i = 0; i < prompts.size(); ++i) {
        next[i] = token_id((i * 101 + 7) % size_t(n_vocab));
        const int32_t pos = int32_t(prompts[i].size());
        bc.add_seq(i, pos, std::span(&next[i], 1), sc[i]->block_table(), {}, pos);
        bg.add_seq(i, pos, std::span(&next[i], 1), sg[i]->block_table(), {}, pos);
    }
    cpu->forward(bc, kv_c, lc.data());
    gpu->forward(bg, kv_g, lg.data());
    for (size_t i = 0; i < prompts.size(); ++i) {
        INFO("decode sequence ", i);
        CHECK(nmse(std::span(&lc[i * size_t(n_vocab)], size_t(n_vocab)),
                   std::span(&lg[i * size_t(n_vocab)], size_t(n_vocab))) < runner_tol);
    }
}

TEST_CASE("CUDA runner: a sequence computing 5 tokens with logits for all 5 equals 5 one-token steps") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    for (bool keep : {false, true}) {
        cuda_runner_options ro;
        ro.keep_pages = keep;
        auto gpu = make_cuda_runner(*b.mdl, 0, ro);
        for (int32_t ps : {16, 3}) {
            INFO("keep_pages ", keep, ", page size ", ps);
            test::check_multi_token_step(*gpu, *b.mdl, ps, 1e-6);
        }
    }
}

TEST_CASE("CUDA runner keeping its pages: truncated drafts recomputed give the logits and pages of the final tokens") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    cuda_runner_options ro;
    ro.keep_pages = true; // the renewed page's stale device copy must not be read
    auto gpu = make_cuda_runner(*b.mdl, 0, ro);
    test::check_truncate_recompute(*gpu, *b.mdl, 1e-6);
}

TEST_CASE("CUDA runner: every architecture's synthetic file tracks the CPU") {
    // Qwen2 (biases, NeoX RoPE, tied output, GQA 4:1, scaled RoPE), Qwen 3 (wide heads, q/k
    // norms), Phi-3 (fused tensors, a window on every layer), Gemma 2 (GeGLU, scaled
    // embeddings, post norms, soft-caps, windows on even layers), Gemma 3 (local and global
    // RoPE), Llama 3.1's rope_freqs: prefill then teacher-forced decode past the windows.
    if (!have_device()) return;
    test::scratch_dir dir("cuda-archs");
    const auto tiny = [](const char* arch, auto&& set) {
        synth_params p = synth_preset("tiny");
        p.arch = arch;
        p.n_head = 8;
        p.n_head_kv = 2;
        set(p);
        return p;
    };
    const std::vector<synth_params> cases{
        tiny("qwen2", [](synth_params& p) { p.tied_output = true; p.rope_scale = 4; }),
        tiny("qwen3", [](synth_params& p) { p.head_dim = 16; }),
        tiny("phi3", [](synth_params& p) { p.sliding_window = 11; }),
        tiny("gemma2", [](synth_params& p) { p.sliding_window = 9; p.head_dim = 16; }),
        tiny("gemma3", [](synth_params& p) { p.sliding_window = 7; p.n_layer = 6; p.rope_scale = 8; }),
        tiny("llama", [](synth_params& p) { p.rope_scale = 8; p.rope_scaling = "llama3"; }),
    };
    for (const synth_params& p : cases) {
        INFO("arch ", p.arch);
        const std::string path = dir.file(p.arch + ".gguf");
        synth_write(p, path);
        model_bundle b = load_model(path);
        model& m = *b.mdl;
        const int32_t n_vocab = m.config().n_vocab;
        auto gpu = make_cuda_runner(m, 0);
        auto cpu = make_cpu_runner(m, 2);
        paged_kv kv_c(m.make_kv_layout(16), 16), kv_g(m.make_kv_layout(16), 16);
        seq_driver c(*cpu, kv_c, n_vocab), g(*gpu, kv_g, n_vocab);
        std::vector<token_id> toks;
        for (int i = 0; i < 40; ++i) toks.push_back(token_id((i * 37 + 11) % n_vocab));
        c.prefill({toks.begin(), toks.begin() + 30}, 30);
        g.prefill({toks.begin(), toks.begin() + 30}, 30);
        CHECK(nmse(c.logits, g.logits) < runner_flip_tol);
        for (int i = 30; i < 40; ++i) { // teacher-forced decode
            c.step(std::span(&toks[size_t(i)], 1));
            g.step(std::span(&toks[size_t(i)], 1));
            INFO("step ", i);
            CHECK(nmse(c.logits, g.logits) < runner_flip_tol);
        }
    }
}

TEST_CASE("CUDA runner refuses F32 weights with a clear error") {
    if (!have_device()) return;
    model_bundle b = load_model(test::model_path("stories260K.gguf"), {weight_format::f32, kv_dtype::f32});
    try {
        make_cuda_runner(*b.mdl, 0);
        FAIL("no throw");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("INT8") != std::string::npos);
    }
}

TEST_CASE("host registration round trip") {
    if (!have_device()) return;
    std::vector<uint8_t> host(size_t(1) << 20, 7);
    cuda::register_host(host.data(), host.size());
    cuda::context ctx(0);
    cuda::buffer d(ctx, host.size());
    CUDA_CHECK(cudaMemsetAsync(d.get(), 0x33, host.size(), static_cast<cudaStream_t>(ctx.stream())));
    ctx.download(host.data(), d.get(), host.size());
    ctx.synchronize();
    CHECK(host.front() == 0x33);
    CHECK(host.back() == 0x33);
    cuda::unregister_host(host.data());
    CHECK_THROWS_AS(cuda::unregister_host(host.data()), error); // not registered any more
}

TEST_CASE("cuBLASLt is loaded on first use, not at start (runs without a device)") {
    auto mapped = [] {
        std::ifstream maps("/proc/self/maps");
        std::string all((std::istreambuf_iterator<char>(maps)), {});
        return all.find("libcublasLt") != std::string::npos;
    };
#if TANDEM_CUDA_EMULATED
    MESSAGE("emulated backend: cuBLASLt is tests/cuda_emu/cublasLt.h, there is no library to map");
    CHECK(bool(cuda::blaslt().Matmul));
    CHECK(cuda::blaslt_loaded());
    return;
#endif
    if (!cuda::blaslt_loaded()) CHECK_FALSE(mapped()); // linking alone must not map it
    const cuda::blaslt_api* api = nullptr;
    try {
        api = &cuda::blaslt();
    } catch (const tandem::error& e) {
        MESSAGE("skipped: cuBLASLt cannot be loaded here: " << e.what());
        return;
    }
    CHECK(cuda::blaslt_loaded());
    CHECK(mapped());
    REQUIRE(bool(api->GetStatusString));
    CHECK_FALSE(std::string(api->GetStatusString(CUBLAS_STATUS_SUCCESS)).empty());
    CHECK(bool(api->Matmul));
}
