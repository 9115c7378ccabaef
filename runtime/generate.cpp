// Offline single-sequence generation loop.
#include "runtime/generate.hpp"

#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/draft_model.hpp"
#include "runtime/engine.hpp"
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"
#include "runtime/runner.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
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

generate_result generate(const exec_ctx& ctx, model& mdl, const tokenizer& tok, std::vector<token_id> prompt,
                         const generate_params& p, const std::function<bool(std::string_view)>& on_text) {
    const model_config& c = mdl.config();
    generate_result r;
    r.prompt_tokens = std::move(prompt);
    const int32_t n_prompt = int32_t(r.prompt_tokens.size());
    TANDEM_CHECK(n_prompt > 0, "the prompt is empty");
    const int32_t n_ctx = p.n_ctx > 0 ? std::min(p.n_ctx, c.n_ctx_train) : c.n_ctx_train;
    TANDEM_CHECK(n_prompt < n_ctx, "the prompt has {} tokens but the context holds {}", n_prompt, n_ctx);
    const int32_t n_predict = p.n_predict < 0 ? n_ctx - n_prompt : std::min(p.n_predict, n_ctx - n_prompt);
    r.finish_reason = "length";
    if (n_predict == 0) return r;

    // The in-process engine with this one request: the daemon's decode loop, on the caller's
    // execution context. One full context of pages, so it never stalls half-way.
    engine_options eo;
    eo.n_ctx = n_ctx;
    eo.page_size = p.page_size;
    eo.max_running = std::max(1, p.beam.width); // a full context for each beam
    eo.max_waiting = 1;
    eo.step_tokens = p.prefill_chunk;
    eo.prefix_cache = false;
    eo.max_draft_tokens = p.draft_tokens;
    eo.draft_model = p.draft_model;
    eo.n_threads = p.draft_threads;
    auto eng = make_local_engine(mdl, tok, eo, make_runner(mdl, ctx));
    engine_request req;
    req.prompt = r.prompt_tokens;
    req.max_tokens = n_predict;
    req.sampling = p.sampling;
    req.stop = p.stop;
    req.ignore_eos = p.ignore_eos;
    req.draft_tokens = p.draft_tokens;
    req.drafts = p.drafts;
    req.make_processor = p.make_processor;
    req.beam = p.beam;
    if (p.beam.width > 0) req.n = std::clamp(p.n_beams, 1, p.beam.width);
    const int32_t n_seqs = req.n;

    // Events come on the engine thread; the caller's thread takes them (on_text runs here).
    std::mutex mu;
    std::condition_variable cv;
    std::deque<engine_event> events;
    const auto t0 = std::chrono::steady_clock::now();
    const submit_result sr = eng->submit(std::move(req), [&](engine_event&& ev) {
        std::lock_guard lock(mu);
        events.push_back(std::move(ev));
        cv.notify_one();
    });
    TANDEM_CHECK(sr.status == submit_status::ok, "the engine refused the request");
    bool cancelled = false;
    std::optional<std::chrono::steady_clock::time_point> t_first; // the first token sampled
    if (p.beam.width > 0) r.beams.resize(size_t(n_seqs));
    for (int32_t n_done = 0;;) {
        engine_event ev;
        {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return !events.empty(); });
            ev = std::move(events.front());
            events.pop_front();
        }
        if (p.beam.width > 0) { // the beams, best first, as the search ends
            beam_result& b = r.beams[size_t(ev.index)];
            b.text += ev.text;
            if (!ev.done) {
                b.tokens.push_back(ev.id);
                continue;
            }
            TANDEM_CHECK(ev.finish_reason != "error", "generation failed: {}", ev.error);
            if (ev.final_token >= 0) b.tokens.push_back(ev.final_token);
            b.finish_reason = ev.finish_reason;
            b.score = ev.score;
            b.cumulative_logprob = ev.cumulative_logprob;
            if (++n_done < n_seqs) continue;
            r.tokens = r.beams[0].tokens;
            r.text = r.beams[0].text;
            r.finish_reason = r.beams[0].finish_reason;
            if (on_text && !r.text.empty()) on_text(r.text);
            // The search's steps are one token of every beam: all of it counts as decode.
            r.decode_s = std::chrono::duration<double>(ev.t - t0).count();
            r.n_decode_steps = int32_t(r.tokens.size());
            return r;
        }
        if (!ev.text.empty()) {
            r.text += ev.text;
            if (on_text && !cancelled && !on_text(ev.text)) {
                cancelled = true;
                eng->cancel(sr.id);
            }
        }
        if (!ev.done) {
            r.tokens.push_back(ev.id);
            if (!t_first) t_first = ev.t;
            continue;
        }
        TANDEM_CHECK(ev.finish_reason != "error", "generation failed: {}", ev.error);
        if (ev.final_token >= 0) r.tokens.push_back(ev.final_token);
        r.finish_reason = ev.finish_reason;
        if (!t_first) t_first = ev.t; // it ended at its first token
        // Every token after the first took one decode step; the last one ended at the done event.
        r.prefill_s = std::chrono::duration<double>(*t_first - t0).count();
        r.decode_s = std::chrono::duration<double>(ev.t - *t_first).count();
        r.n_decode_steps = std::max(0, int32_t(r.tokens.size()) - 1);
        r.n_draft_tokens = ev.n_draft_tokens;
        r.n_accepted_tokens = ev.n_accepted_tokens;
        return r;
    }
}

} // namespace tandem
