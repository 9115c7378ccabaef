// cuda_bench: the GPU figures scripts/device-check reports. Prefill tok/s of one long prompt
// through the CUDA runner, the W8A8 GEMM on the model's shapes against cuBLASLt's own int8
// GEMM, and K/V hand-off bandwidth into registered host pages. Prints "key: value" lines.
#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/ops/ops.hpp"
#include "cuda/runner.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/synth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace tandem;

namespace {

void line(const std::string& key, const std::string& value) {
    std::printf("%s: %s\n", key.c_str(), value.c_str());
    std::fflush(stdout);
}

// Median seconds of `reps` runs of `fn` on the context's stream, timed with events.
double time_on_stream(const cuda::context& c, int reps, const std::function<void()>& fn) {
    const auto st = static_cast<cudaStream_t>(c.stream());
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    fn(); // warm-up: plans, pools, caches
    c.synchronize();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        CUDA_CHECK(cudaEventRecord(a, st));
        fn();
        CUDA_CHECK(cudaEventRecord(b, st));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / 1e3);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct gemm_shape {
    const char* name;
    int64_t n_out, n_in;
    int per_layer; // how many matmuls of this shape a layer runs
};

// W8A8 GEMMs of the model's shapes at n_tok rows: the op (cuBLASLt + scale kernel, as the runner
// calls it), the tiled dp4a kernel alone, and cuBLASLt's int32 GEMM alone (the baseline).
void bench_gemms(const cuda::context& c, const model_config& cfg, int64_t n_tok) {
    const std::vector<gemm_shape> shapes{{"wq", cfg.n_embd_q(), cfg.n_embd, 1},
                                         {"wo", cfg.n_embd, cfg.n_embd_q(), 1},
                                         {"wk/wv", cfg.n_embd_kv(), cfg.n_embd, 2},
                                         {"gate/up", cfg.n_ff, cfg.n_embd, 2},
                                         {"down", cfg.n_embd, cfg.n_ff, 1}};
    const int64_t max_in = std::max<int64_t>({cfg.n_embd, cfg.n_embd_q(), cfg.n_ff}), max_out = max_in;
    std::mt19937 rng(1);
    std::vector<int8_t> h(size_t(std::max(n_tok, max_out) * max_in));
    for (auto& v : h) v = int8_t(int(rng() % 255) - 127);
    std::vector<float> hs(size_t(std::max(n_tok, max_out)), 0.01f);
    const cuda::buffer qx = cuda::to_device(c, h.data(), size_t(n_tok * max_in));
    const cuda::buffer qw = cuda::to_device(c, h.data(), size_t(max_out * max_in));
    const cuda::buffer s = cuda::to_device(c, hs.data(), hs.size() * 4);
    const cuda::buffer out(c, size_t(n_tok * max_out) * 4);
    double t_op = 0, t_lt = 0, ops_total = 0;
    for (const auto& sh : shapes) {
        const double ops = 2.0 * double(n_tok) * double(sh.n_out) * double(sh.n_in);
        cuda::gemm_impl ran = cuda::gemm_impl::automatic;
        const double op = time_on_stream(c, 20, [&] {
            ran = cuda::matmul_i8(c, out.as<float>(), qx.as<int8_t>(), s.as<float>(), n_tok, qw.as<int8_t>(),
                                  s.as<float>(), sh.n_out, sh.n_in, nullptr);
        });
        const double tiled = time_on_stream(c, 5, [&] {
            cuda::matmul_i8(c, out.as<float>(), qx.as<int8_t>(), s.as<float>(), n_tok, qw.as<int8_t>(), s.as<float>(),
                            sh.n_out, sh.n_in, nullptr, cuda::gemm_impl::tiled);
        });
        bool lt_ok = true;
        const double lt = time_on_stream(c, 20, [&] {
            lt_ok = cuda::gemm_i8_i32_cublaslt(c, out.as<int32_t>(), qx.as<int8_t>(), n_tok, qw.as<int8_t>(),
                                               sh.n_out, sh.n_in);
        });
        line(fmt::format("gemm {} M={} N={} K={}", sh.name, n_tok, sh.n_out, sh.n_in),
             fmt::format("op {:.1f} TOPS ({}), tiled dp4a {:.1f} TOPS, cuBLASLt int8 {}", ops / op / 1e12,
                         ran == cuda::gemm_impl::cublaslt ? "cuBLASLt+scale" : "tiled", ops / tiled / 1e12,
                         lt_ok ? fmt::format("{:.1f} TOPS", ops / lt / 1e12) : std::string("refused the shape")));
        const double n = sh.per_layer; // weighted as one layer runs them
        t_op += n * op;
        t_lt += n * lt;
        ops_total += n * ops;
    }
    line("gemm layer mix", fmt::format("op {:.1f} TOPS, cuBLASLt {:.1f} TOPS, op/cuBLASLt {:.0f}% (target >= 60%)",
                                       ops_total / t_op / 1e12, ops_total / t_lt / 1e12, 100.0 * t_lt / t_op));
}

// Device-to-host copy bandwidth into registered memory: one large copy, and page-sized copies
// into scattered pages (the hand-off's pattern).
void bench_handoff_raw(const cuda::context& c, int64_t page_bytes, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    cuda::register_host(host.data(), bytes);
    const cuda::buffer d(c, bytes);
    CUDA_CHECK(cudaMemsetAsync(d.get(), 1, bytes, static_cast<cudaStream_t>(c.stream())));
    const double one = time_on_stream(c, 5, [&] { c.download(host.data(), d.get(), bytes); });
    const int64_t n_pages = int64_t(bytes) / page_bytes;
    std::vector<int64_t> order(static_cast<size_t>(n_pages));
    for (int64_t i = 0; i < n_pages; ++i) order[size_t(i)] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(3));
    const double paged = time_on_stream(c, 3, [&] {
        for (int64_t i = 0; i < n_pages; ++i)
            c.download(host.data() + order[size_t(i)] * page_bytes, d.as<uint8_t>() + i * page_bytes,
                       size_t(page_bytes));
    });
    line(fmt::format("d2h registered, one {} MiB copy", bytes >> 20),
         fmt::format("{:.1f} GB/s", double(bytes) / one / 1e9));
    line(fmt::format("d2h registered, {} KiB pages scattered", page_bytes >> 10),
         fmt::format("{:.1f} GB/s", double(n_pages * page_bytes) / paged / 1e9));
    cuda::unregister_host(host.data());
}

} // namespace

int main(int argc, char** argv) {
    std::string model_path;
    int64_t n_prompt = 2048;
    size_t handoff_bytes = size_t(1) << 30;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-m" && i + 1 < argc) model_path = argv[++i];
        else if (a == "-p" && i + 1 < argc) n_prompt = std::stoll(argv[++i]);
        else if (a == "-H" && i + 1 < argc) handoff_bytes = size_t(std::stoll(argv[++i])) << 20;
        else {
            std::fprintf(stderr,
                         "usage: cuda_bench [-m MODEL.gguf] [-p PROMPT_TOKENS] [-H HANDOFF_MIB]\n"
                         "  without -m, writes the synthetic TinyLlama-1.1B (tandem synth --preset tinyllama-1.1b)\n"
                         "  to ./tinyllama-1.1b-synth.gguf first (kept for the next run)\n"
                         "  -H: MiB of the raw device-to-host copy test (default 1024)\n");
            return 2;
        }
    }
    try {
        std::string why;
        const auto devs = cuda::list_devices(&why);
        if (devs.empty()) {
            line("cuda_bench", "skipped: no CUDA device (" + why + ")");
            return 0;
        }
        const auto& d = devs[0];
        line("device", fmt::format("{} sm_{}{} {} SMs {} MiB", d.name, d.cc_major, d.cc_minor, d.n_sm, d.total_mem >> 20));
        if (model_path.empty()) {
            model_path = "tinyllama-1.1b-synth.gguf";
            if (!std::filesystem::exists(model_path)) {
                const auto t0 = std::chrono::steady_clock::now();
                synth_write(synth_preset("tinyllama-1.1b"), model_path);
                line("synth tinyllama-1.1b",
                     fmt::format("{:.1f} s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
            }
        }
        model_bundle b = load_model(model_path); // INT8 weights, F16 KV
        model& m = *b.mdl;
        const model_config& cfg = m.config();
        line("model", fmt::format("{} ({} layers, dim {}, ff {}, {} heads / {} kv, vocab {}), load {:.1f} s", model_path,
                                  cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.n_vocab, b.load_s));

        // Prefill: one sequence of n_prompt tokens into registered host pages, as a prefill worker.
        auto r = make_cuda_runner(m, 0);
        const kv_layout lay = m.make_kv_layout(16);
        const int32_t n_pages = int32_t((n_prompt + lay.page_size - 1) / lay.page_size);
        kv_cache kv(lay, n_pages);
        block_pool pages(n_pages);
        cuda::register_host(kv.base(), size_t(kv.bytes()));
        sequence_kv seq(pages, lay.page_size);
        if (!seq.reserve(int32_t(n_prompt))) throw error("KV pool too small");
        std::vector<token_id> toks(static_cast<size_t>(n_prompt));
        std::mt19937 rng(7);
        for (auto& t : toks) t = token_id(3 + rng() % uint32_t(cfg.n_vocab - 3));
        std::vector<float> logits(static_cast<size_t>(cfg.n_vocab));
        const batch bs = one_sequence(toks, 0, seq.block_table());
        std::vector<double> fwd;
        cuda::forward_stats last{};
        for (int i = 0; i < 4; ++i) { // the first is a warm-up (plans, pools)
            r->forward(bs, kv, logits.data());
            if (i > 0) fwd.push_back(cuda::stats_of(*r)->forward_s);
            last = *cuda::stats_of(*r);
        }
        std::sort(fwd.begin(), fwd.end());
        const double t = fwd[fwd.size() / 2];
        line(fmt::format("prefill {} tokens", n_prompt),
             fmt::format("{:.0f} tok/s ({:.1f} ms; target >= 50000 tok/s)", double(n_prompt) / t, t * 1e3));
        line("hand-off into registered host pages",
             fmt::format("{:.1f} GB/s ({} MiB in {:.2f} ms; target >= 20 GB/s)",
                         double(last.handoff_bytes) / last.handoff_s / 1e9, last.handoff_bytes >> 20,
                         last.handoff_s * 1e3));
        cuda::unregister_host(kv.base());

        // Attention alone: one layer of the same prompt (pages already in a device mirror).
        {
            cuda::context c(0);
            const cuda::buffer pages(c, size_t(kv.bytes()));
            c.upload(pages.get(), kv.base(), size_t(kv.bytes()));
            const cuda::buffer table = cuda::to_device(c, seq.block_table().data(), seq.block_table().size() * 4);
            const int64_t n_q = n_prompt * cfg.n_embd_q();
            std::vector<float> hq(static_cast<size_t>(n_q));
            for (auto& v : hq) v = float(int(rng() % 2001) - 1000) / 1000.0f;
            const cuda::buffer q = cuda::to_device(c, hq.data(), hq.size() * 4);
            const cuda::buffer out(c, hq.size() * 4);
            const attn_seq one{0, int32_t(n_prompt), 0, 0};
            const attn_params ap{lay, pages.as<uint8_t>(), kv.n_pages(), table.as<int32_t>(), seq.block_table(), {&one, 1}};
            const double ta = time_on_stream(c, 5, [&] { cuda::attention(c, ap, 0, out.as<float>(), q.as<float>(), cfg.n_head, 0.125f); });
            line("attention, one layer, causal prefill",
                 fmt::format("{:.2f} ms (x {} layers = {:.1f} ms)", ta * 1e3, cfg.n_layer, ta * 1e3 * cfg.n_layer));
            bench_gemms(c, cfg, n_prompt);
            bench_handoff_raw(c, lay.page_bytes(), handoff_bytes);
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cuda_bench: %s\n", e.what());
        return 1;
    }
}
