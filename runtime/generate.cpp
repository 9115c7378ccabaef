// Offline single-sequence generation: the in-process engine with one request.
#include "runtime/generate.hpp"

#include "runtime/engine.hpp"
#include "runtime/error.hpp"
#include "runtime/runner.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace tandem {

generate_result generate(const exec_ctx& ctx, model& mdl, const tokenizer& tok, std::vector<token_id> prompt,
                         const generate_params& p, const std::function<bool(std::string_view)>& on_text) {
    const model_config& c = mdl.config();
    generate_result r;
    r.prompt_tokens = std::move(prompt);
    const int32_t n_prompt = int32_t(r.prompt_tokens.size());
    TANDEM_CHECK(n_prompt > 0, "the prompt is empty");
    const int32_t n_ctx = p.n_ctx > 0 ? std::min(p.n_ctx, c.n_ctx_train) : c.n_ctx_train;
    TANDEM_CHECK(n_prompt < n_ctx, "the prompt has {} tokens but the context holds {}", n_prompt, n_ctx);
    const engine_request& want = p.request;
    const int32_t n_predict = want.max_tokens < 0 ? n_ctx - n_prompt : std::min(want.max_tokens, n_ctx - n_prompt);
    r.finish_reason = "length";
    if (n_predict == 0) return r;

    // The in-process engine with this one request: the daemon's decode loop, on the caller's
    // execution context. One full context of pages, so it never stalls half-way.
    engine_options eo;
    eo.n_ctx = n_ctx;
    eo.sched.page_size = p.page_size;
    eo.sched.max_running = std::max(1, want.beam.width); // a full context for each beam
    eo.max_waiting = 1;
    eo.sched.step_tokens = p.prefill_chunk;
    eo.sched.prefix_cache = false;
    eo.max_draft_tokens = want.draft_tokens;
    eo.draft_model = p.draft_model;
    eo.n_threads = p.draft_threads;
    auto eng = make_local_engine(mdl, tok, eo, make_runner(mdl, ctx));
    engine_request req = want;
    req.prompt = r.prompt_tokens;
    req.max_tokens = n_predict;
    req.n = want.beam.width > 0 ? std::clamp(want.n, 1, want.beam.width) : 1;
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
    if (want.beam.width > 0) r.beams.resize(size_t(n_seqs));
    for (int32_t n_done = 0;;) {
        engine_event ev;
        {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return !events.empty(); });
            ev = std::move(events.front());
            events.pop_front();
        }
        if (want.beam.width > 0) { // the beams, best first, as the search ends
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
