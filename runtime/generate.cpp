// Offline single-sequence generation loop.
#include "runtime/generate.hpp"

#include "cpu/thread_pool.hpp"
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <chrono>
#include <sys/mman.h>
#include <optional>

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
    b.file = std::make_unique<gguf::file>(gguf::file::open(path));
    model_config cfg = model_config::from_gguf(*b.file);
    b.tok = std::make_unique<tokenizer>(tokenizer::from_gguf(*b.file));
    std::optional<cpu::thread_pool> pool;
    if (opt.n_threads > 0) pool.emplace(opt.n_threads);
    model_weights w = model_weights::load(*b.file, cfg, {opt.weights, pool ? &*pool : nullptr});
    TANDEM_CHECK(b.tok->n_vocab() == cfg.n_vocab, "{}: the tokenizer has {} tokens but the model {}", path,
                 b.tok->n_vocab(), cfg.n_vocab);
    b.cfg = cfg;
    b.mdl = std::make_unique<model>(std::move(cfg), std::move(w), opt.kv);
    // Weights converted at load hold nothing in the mapping: give its pages back, so RSS is
    // the engine's copy alone. (A pre-quantized file is used in place and stays.)
    const bool in_place = opt.weights == weight_format::int8 &&
                          std::any_of(b.file->tensors().begin(), b.file->tensors().end(),
                                      [](const gguf::tensor_info& t) { return t.type == dtype::i8; });
    if (!in_place && !b.file->bytes().empty())
        ::madvise(const_cast<uint8_t*>(b.file->bytes().data()), b.file->bytes().size(), MADV_DONTNEED);
    b.load_s = seconds_since(t0);
    const auto& c = b.mdl->config();
    logger("model")->info("loaded {} ({}): {} layers, n_embd {}, heads {}/{}, vocab {}, weights {} ({:.0f} MB), kv {}, "
                          "in {:.2f} s", path, c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_vocab,
                          opt.weights == weight_format::int8 ? "int8" : "f32", double(b.mdl->weights().bytes()) / 1e6,
                          name_of(opt.kv), b.load_s);
    return b;
}

model_bundle open_model_metadata(const std::string& path) {
    model_bundle b;
    b.file = std::make_unique<gguf::file>(gguf::file::open(path));
    b.cfg = model_config::from_gguf(*b.file);
    b.tok = std::make_unique<tokenizer>(tokenizer::from_gguf(*b.file));
    TANDEM_CHECK(b.tok->n_vocab() == b.cfg.n_vocab, "{}: the tokenizer has {} tokens but the model {}", path,
                 b.tok->n_vocab(), b.cfg.n_vocab);
    return b;
}

stop_matcher::stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string stop_matcher::push(std::string_view text) {
    if (stopped_) return {};
    held_ += text;
    size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // Keep the longest tail of held_ that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stops_) {
        for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
            if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
                keep = n;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string stop_matcher::flush() {
    std::string out;
    if (!stopped_) out.swap(held_);
    return out;
}

generate_result generate(const exec_ctx& ctx, model& mdl, const tokenizer& tok, std::vector<token_id> prompt,
                         const generate_params& p, const std::function<bool(std::string_view)>& on_text) {
    const model_config& c = mdl.config();
    generate_result r;
    r.prompt_tokens = std::move(prompt);
    const int32_t n_prompt = int32_t(r.prompt_tokens.size());
    TANDEM_CHECK(n_prompt > 0, "the prompt is empty");
    const int32_t n_ctx = p.n_ctx > 0 ? p.n_ctx : c.n_ctx_train;
    TANDEM_CHECK(n_prompt < n_ctx, "the prompt has {} tokens but the context holds {}", n_prompt, n_ctx);
    const int32_t n_predict = p.n_predict < 0 ? n_ctx - n_prompt : std::min(p.n_predict, n_ctx - n_prompt);

    // Enough pages for the whole run, so it can never stall half-way.
    const int32_t n_total = n_prompt + std::max(n_predict, 1);
    kv_cache kv(mdl.make_kv_layout(p.page_size), (n_total + p.page_size - 1) / p.page_size);
    sequence_kv seq(kv);
    TANDEM_ASSERT(seq.reserve(n_total));

    sampler smp(p.sampling);
    stream_decoder dec(tok);
    stop_matcher stops(p.stop);
    std::vector<float> logits(static_cast<size_t>(c.n_vocab));
    std::vector<token_id> history = r.prompt_tokens;

    bool cancelled = false;
    auto emit = [&](const std::string& text) {
        if (text.empty()) return;
        r.text += text;
        if (on_text && !on_text(text)) cancelled = true;
    };

    // prefill in chunks; the last chunk's logits give the first token
    auto t0 = std::chrono::steady_clock::now();
    for (int32_t done = 0; done < n_prompt;) {
        const int32_t n = std::min(p.prefill_chunk, n_prompt - done);
        batch_seq s{std::span(r.prompt_tokens).subspan(size_t(done), size_t(n)), done, seq.block_table()};
        mdl.forward(ctx, std::span(&s, 1), kv, logits.data());
        done += n;
    }
    r.prefill_s = seconds_since(t0);

    r.finish_reason = "length";
    t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < n_predict; ++i) {
        if (i > 0) { // feed back the previous token
            batch_seq s{std::span(&history.back(), 1), int32_t(history.size()) - 1, seq.block_table()};
            mdl.forward(ctx, std::span(&s, 1), kv, logits.data());
            ++r.n_decode_steps;
        }
        const token_id id = smp.sample(logits, history);
        if (id == sampler::none) { // every token was banned (logit_bias): nothing can follow
            r.finish_reason = "stop";
            break;
        }
        r.tokens.push_back(id);
        history.push_back(id);
        if (!p.ignore_eos && tok.is_eog(id)) {
            r.finish_reason = "stop";
            break;
        }
        emit(stops.push(dec.push(id)));
        if (stops.stopped()) {
            r.finish_reason = "stop";
            break;
        }
        if (cancelled) {
            r.finish_reason = "cancelled";
            break;
        }
    }
    r.decode_s = seconds_since(t0);
    if (!stops.stopped()) {
        emit(stops.push(dec.flush()));
        if (!stops.stopped()) emit(stops.flush());
    }
    return r;
}

} // namespace tandem
