// Loading a model for inference (runtime/model_loader.hpp).
#include "runtime/model_loader.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/draft_model.hpp"
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"

#include <chrono>
#include <optional>
#include <sys/mman.h>

namespace tandem {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

model_bundle load_model(const std::string& path) { return load_model(path, load_options{}); }

model_bundle load_model(const std::string& path, const load_options& opt) {
    const auto t0 = std::chrono::steady_clock::now();
    model_bundle b;
    b.file = std::make_unique<gguf::file>(gguf::file::open(path, opt.fd));
    model_config cfg = model_config::from_gguf(*b.file);
    b.tok = std::make_unique<tokenizer>(tokenizer::from_gguf(*b.file));
    std::optional<cpu::thread_pool> pool;
    if (opt.n_threads > 0) pool.emplace(opt.n_threads);
    const q_layout layout = opt.cpu_layout ? cpu::matmul_i8_layout() : q_layout::rows;
    // A process that uploads weights to a GPU holds INT8 matrices: the low-bit family has CPU
    // kernels only (the CUDA runner refuses it by name).
    const weight_format wf = !opt.cpu_layout && opt.weights == weight_format::native ? weight_format::int8 : opt.weights;
    // A model that cannot fit is refused before any of it is converted, with what it needs.
    check_weights_fit(path, estimate_weight_bytes(*b.file, wf), wf);
    model_weights w = model_weights::load(*b.file, cfg, {wf, pool ? &*pool : nullptr, layout});
    TANDEM_CHECK(b.tok->n_vocab() == cfg.n_vocab, "{}: the tokenizer has {} tokens but the model {}", path,
                 b.tok->n_vocab(), cfg.n_vocab);
    b.cfg = cfg;
    b.mdl = std::make_unique<model>(std::move(cfg), std::move(w), opt.kv);
    // Every weight is in memory of its own after load (converted, or copied from a pre-quantized
    // file): give the mapping's pages back, so RSS is the engine's copy alone.
    if (!b.file->bytes().empty())
        ::madvise(const_cast<uint8_t*>(b.file->bytes().data()), b.file->bytes().size(), MADV_DONTNEED);
    b.load_s = seconds_since(t0);
    const auto& c = b.mdl->config();
    logger("model")->info("loaded {} ({}): {} layers, n_embd {}, heads {}/{}, vocab {}, weights {} ({:.0f} MB), kv {}, "
                          "in {:.2f} s", path, c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_vocab,
                          b.mdl->weights().family(), double(b.mdl->weights().bytes()) / 1e6,
                          name_of(opt.kv), b.load_s);
    if (c.is_moe())
        logger("model")->info("experts: {} a layer, {} a token ({:.0f} MB in all); a decode token reads {:.0f} MB of weights",
                              c.n_expert, c.n_expert_used, double(b.mdl->weights().expert_bytes()) / 1e6,
                              double(b.mdl->weights().decode_bytes(c)) / 1e6);
    return b;
}

model_bundle load_draft_model(const std::string& path, const tokenizer& target, const load_options& opt) {
    model_bundle b = load_model(path, opt);
    const std::string why = draft_vocab_mismatch(target, *b.tok);
    TANDEM_CHECK(why.empty(), "draft model {} cannot draft for the model ({}): a draft model needs the same vocabulary",
                 path, why);
    return b;
}

model_bundle open_model_metadata(const std::string& path, int fd) {
    model_bundle b;
    b.file = std::make_unique<gguf::file>(gguf::file::open(path, fd));
    b.cfg = model_config::from_gguf(*b.file);
    b.tok = std::make_unique<tokenizer>(tokenizer::from_gguf(*b.file));
    TANDEM_CHECK(b.tok->n_vocab() == b.cfg.n_vocab, "{}: the tokenizer has {} tokens but the model {}", path,
                 b.tok->n_vocab(), b.cfg.n_vocab);
    return b;
}

} // namespace tandem
