// Quantization and model-quality subcommands of `tandem`: quantize, perplexity, eval-drift.
#include "daemon/cli.hpp"

#include "quant/int8.hpp"
#include "runtime/error.hpp"
#include "runtime/evaluate.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/host.hpp"
#include "runtime/quantize_file.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

namespace tandem::cli {
namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    TANDEM_CHECK(in.good(), "cannot read {}", path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

struct eval_opts {
    std::string model, text;
    load_options load;
    int32_t ctx = 512, batch = 128;
    int threads = default_threads();
    bool json = false;
};

std::vector<token_id> text_tokens(const model_bundle& b, const std::string& path) {
    const std::string text = path == "-" ? read_stdin() : read_file(path);
    return b.tok->encode(text, /*add_special=*/true);
}

int cmd_perplexity(const eval_opts& o) {
    prepare_inference_process();
    model_bundle b = load_model(resolve_model(o.model), o.load);
    const auto toks = text_tokens(b, o.text);
    const host_threads threads(o.threads);
    const perplexity_result r = perplexity(threads.ctx(), *b.mdl, toks, {o.ctx, o.batch});
    if (o.json)
        std::cout << nlohmann::json{{"ppl", r.ppl}, {"n_tokens", r.n_tokens}}.dump() << "\n";
    else
        std::cout << fmt::format("perplexity {:.4f} over {} tokens (weights {}, kv {})\n", r.ppl, r.n_tokens,
                                 name_of(o.load.weights), name_of(o.load.kv));
    return 0;
}

int cmd_eval_drift(const eval_opts& o) {
    prepare_inference_process();
    const std::string path = resolve_model(o.model);
    model_bundle base = load_model(path, {weight_format::f32, kv_dtype::f32});
    model_bundle test = load_model(path, o.load);
    const auto toks = text_tokens(base, o.text);
    const host_threads threads(o.threads);
    const drift_result r = eval_drift(threads.ctx(), *base.mdl, *test.mdl, toks, {o.ctx, o.batch});
    if (o.json)
        std::cout << nlohmann::json{{"top1", r.top1}, {"mean_kl", r.mean_kl}, {"ppl_f32", r.ppl_base},
                                    {"ppl_test", r.ppl_test}, {"n_tokens", r.n_tokens}}
                         .dump()
                  << "\n";
    else
        std::cout << fmt::format("top-1 agreement {:.4f}, mean KL {:.6f} nats over {} tokens; ppl f32 {:.4f}, "
                                 "int8 (kv {}) {:.4f}\n",
                                 r.top1, r.mean_kl, r.n_tokens, r.ppl_base, name_of(o.load.kv), r.ppl_test);
    return 0;
}

struct quantize_opts {
    std::string in, out;
    int threads = default_threads();
};

int cmd_quantize(const quantize_opts& o) {
    const host_threads threads(o.threads);
    const auto t0 = clock_type::now();
    const quantize_stats st = quantize_gguf(o.in, o.out, threads.pool());
    std::cout << fmt::format("{}: {} matrices as INT8 ({} v{}), {} tensors copied, {:.1f} MB, {:.2f} s\n", o.out,
                             st.n_quantized, int8_scheme, int8_scheme_version, st.n_copied, double(st.out_bytes) / 1e6,
                             since(t0));
    return 0;
}

} // namespace

void add_precision_flags(CLI::App* sub, load_options& o) {
    auto value = [](auto e) { return std::to_string(int(e)); }; // the enum as CLI11 reads one
    sub->add_option("--weights", o.weights,
                    "weights in memory: auto (default: low-bit files such as Q4_K keep their bits, others INT8), "
                    "int8 (every matrix INT8) or f32 (unquantized)")
        ->transform(named({{"f32", value(weight_format::f32)}, {"int8", value(weight_format::int8)},
                           {"auto", value(weight_format::native)}}));
    sub->add_option("--kv", o.kv, "KV cache: f16 (default), int8 or f32")
        ->transform(named({{"f32", value(kv_dtype::f32)}, {"f16", value(kv_dtype::f16)}, {"int8", value(kv_dtype::i8)}}));
}

void register_eval(CLI::App& app, registry& reg) {
    auto q = std::make_shared<quantize_opts>();
    auto* qz = app.add_subcommand("quantize", "write a GGUF with INT8 weights (loads by mmap, no re-quantizing)");
    qz->add_option("input", q->in, "input GGUF (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL or IQ4_XS weights)")->required();
    qz->add_option("output", q->out, "output GGUF")->required();
    qz->add_option("-t,--threads", q->threads, "threads")->check(at_least(1));
    reg.push_back({qz, [q] { return cmd_quantize(*q); }});

    for (const bool drift : {false, true}) {
        auto e = std::make_shared<eval_opts>();
        auto* sub = drift ? app.add_subcommand("eval-drift", "top-1 agreement and mean KL of INT8 vs F32 over a text")
                          : app.add_subcommand("perplexity", "perplexity of a model over a text");
        sub->add_option("-m,--model", e->model, "GGUF model (default: $TANDEM_MODEL)");
        sub->add_option("-f,--file", e->text, "text file, or - for stdin")->required();
        add_precision_flags(sub, e->load);
        sub->add_option("-c,--ctx", e->ctx, "tokens per window")->check(between(2, 1 << 20));
        sub->add_option("-b,--batch", e->batch, "tokens per forward step")->check(at_least(1));
        sub->add_option("-t,--threads", e->threads, "CPU threads")->check(at_least(1));
        sub->add_flag("--json", e->json, "print one JSON object");
        reg.push_back({sub, [e, drift] { return drift ? cmd_eval_drift(*e) : cmd_perplexity(*e); }});
    }

}

} // namespace tandem::cli
