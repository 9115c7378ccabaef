// The engine's core: one thread that admits requests, plans batches for its executors, samples
// their logits and reports token events. Its policies live in their own files: beam search
// (runtime/beam_search), speculation (runtime/speculation), prompt rows (runtime/prompt_rows);
// the in-process executor in runtime/local_engine.
#include "runtime/engine.hpp"

#include "runtime/beam_search.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/error.hpp"
#include "runtime/log.hpp"
#include "runtime/prompt_rows.hpp"
#include "runtime/speculation.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <poll.h>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <unordered_set>

namespace tandem {
namespace {

using clock_type = std::chrono::steady_clock;

} // namespace

engine_options resolve_options(engine_options o, const model_config& c) {
    if (o.n_ctx <= 0 || o.n_ctx > c.n_ctx_train) o.n_ctx = c.n_ctx_train;
    o.sched.max_running = std::max(1, o.sched.max_running);
    o.max_draft_tokens = std::clamp(o.max_draft_tokens, 0, int32_t(engine_stats::max_draft_positions));
    o.sched.decode_tokens = std::max({1, o.sched.decode_tokens, 1 + o.max_draft_tokens}); // a step verifies a draft whole
    o.sched.step_tokens = std::max(o.sched.step_tokens, o.sched.max_running * o.sched.decode_tokens + 1);
    if (o.sched.max_logits <= 0) o.sched.max_logits = o.sched.max_running * o.sched.decode_tokens;
    o.sched.max_logits = std::max(o.sched.max_logits, o.sched.decode_tokens); // any one decode step fits
    const int32_t pages_per_ctx = (o.n_ctx + o.sched.page_size - 1) / o.sched.page_size;
    if (o.sched.n_pages <= 0) o.sched.n_pages = pages_per_ctx * o.sched.max_running;
    o.sched.n_pages = std::max(o.sched.n_pages, pages_per_ctx);
    o.sched.kv_window = c.kv_window(); // every layer windowed: pages behind the window go back at once
    return o;
}

std::string flush_text(stream_decoder& dec, stop_matcher& stops) {
    if (stops.stopped()) return {};
    std::string text = stops.push(dec.flush());
    if (!stops.stopped()) text += stops.flush();
    return text;
}

namespace {

class engine_impl final : public engine, public engine_core {
public:
    engine_impl(const model_config& cfg, const tokenizer& tok, const engine_options& o, engine_parts parts)
        : tok_(tok), opts_(o), parts_(std::move(parts)), n_embd_(cfg.n_embd) {
        TANDEM_ASSERT(!parts_.executors.empty());
        opts_ = resolve_options(opts_, cfg);
        sched_ = std::make_unique<scheduler>(opts_.sched, parts_.store);
        std::unique_ptr<draft_model> drafter;
        if (opts_.draft_model && opts_.max_draft_tokens > 0)
            drafter = std::make_unique<draft_model>(*opts_.draft_model, opts_.n_threads, opts_.sched.page_size,
                                                    opts_.sched.n_pages, 2 * opts_.sched.max_running);
        spec_ = std::make_unique<speculation>(*sched_, *this, opts_, std::move(drafter));
        stats_.draft_device = spec_->draft_device();
        beams_ = std::make_unique<beam_search>(*sched_, tok_, *this);
        if (parts_.restore) parts_.restore(*sched_);
        wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        TANDEM_CHECK(wake_fd_ >= 0, "eventfd: {}", std::strerror(errno));
        log_ = logger("engine");
        std::string names;
        for (const auto& e : parts_.executors) names += (names.empty() ? "" : ", ") + e->name();
        if (spec_->has_draft_model()) names += ", draft model on " + spec_->draft_device();
        log_->info("context {}, {} KV pages of {} tokens ({} cached), batch up to {}, {} tokens a step; {}",
                   opts_.n_ctx, opts_.sched.n_pages, opts_.sched.page_size, sched_->pool().n_cached(), opts_.sched.max_running,
                   opts_.sched.step_tokens, names);
        publish();
        thread_ = std::thread([this] { loop(); });
    }

    ~engine_impl() override {
        stop();
        if (wake_fd_ >= 0) ::close(wake_fd_);
    }

    submit_result submit(engine_request req, engine_sink sink) override {
        const int32_t n_prompt = int32_t(req.prompt.size());
        TANDEM_ASSERT(req.n >= 1 && req.n < (1 << seq_bits), "n = {}", req.n);
        if (n_prompt == 0 || n_prompt >= opts_.n_ctx) return {submit_status::too_long, 0};
        TANDEM_ASSERT(!req.embed || (req.n == 1 && req.beam.width == 0 && !req.score_prompt), "an embedding generates nothing");
        if (req.embed) req.max_tokens = req.draft_tokens = 0;
        const int32_t max_tokens =
            std::clamp(req.max_tokens, req.score_prompt || req.embed ? 0 : 1, opts_.n_ctx - n_prompt);
        TANDEM_ASSERT(req.beam.width == 0 || (req.n <= req.beam.width && 2 * req.beam.width < (1 << seq_bits)),
                      "n = {}, beam width {}", req.n, req.beam.width);
        req.draft_tokens = req.draft_tokens < 0 ? opts_.max_draft_tokens : std::min(req.draft_tokens, opts_.max_draft_tokens);
        if (req.beam.width > 0) req.draft_tokens = 0; // every beam's step is one token: nothing to verify
        if (req.drafts == draft_source::automatic || (req.drafts == draft_source::model && !spec_->has_draft_model()))
            req.drafts = spec_->has_draft_model() ? draft_source::model : draft_source::ngram;
        // it must fit in the pool on its own (everything else preempted): the prompt's full
        // pages once, each sequence's own pages from there
        const int64_t own = sched_->pages_for(n_prompt + max_tokens) - n_prompt / opts_.sched.page_size;
        const int64_t n_seqs = std::max(req.n, req.beam.width);
        if (n_prompt / opts_.sched.page_size + n_seqs * own > opts_.sched.n_pages) return {submit_status::too_long, 0};
        std::lock_guard lock(mu_);
        if (stopping_) return {submit_status::stopped, 0};
        const int32_t free_slots = std::max(0, opts_.sched.max_running - n_running_.load());
        // n_pending_ counts requests not yet admitted wherever they are (incoming, or
        // handed to the scheduler but not published yet), so the bound holds without races.
        if (n_pending_.load() >= opts_.max_waiting + free_slots) return {submit_status::queue_full, 0};
        ++n_pending_;
        const uint64_t id = ++last_id_;
        auto s = std::make_unique<request_state>(id, std::move(req), std::move(sink), tok_);
        s->n_prompt = n_prompt;
        s->max_tokens = max_tokens;
        incoming_.push_back(std::move(s));
        wake();
        return {submit_status::ok, id};
    }

    void cancel(uint64_t id) override {
        std::lock_guard lock(mu_);
        cancels_.insert(id);
        wake();
    }

    engine_stats stats() const override {
        std::lock_guard lock(stats_mu_);
        engine_stats s = stats_;
        std::lock_guard lock2(mu_);
        s.n_waiting += int32_t(incoming_.size());
        return s;
    }

    bool wait_ready(std::chrono::milliseconds timeout, std::string& failure) override {
        std::unique_lock lock(ready_mu_);
        ready_cv_.wait_for(lock, timeout, [&] { return up_ || !failure_.empty(); });
        failure = failure_;
        return up_ && failure_.empty();
    }

    void stop() override {
        {
            std::lock_guard lock(mu_);
            if (stopping_ && !thread_.joinable()) return;
            stopping_ = true;
            wake();
        }
        if (thread_.joinable()) thread_.join();
    }

private:
    void wake() {
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t r = ::write(wake_fd_, &one, sizeof one);
    }

    void loop() {
        std::vector<bool> started(parts_.executors.size(), false);
        planned_.assign(parts_.executors.size(), nullptr);
        started_at_.assign(parts_.executors.size(), {});
        for (;;) {
            std::unordered_set<uint64_t> cancels;
            bool stopping = false;
            {
                std::lock_guard lock(mu_);
                stopping = stopping_;
                for (auto& s : incoming_) {
                    sched_->add(seq_id_of(s->id, 0), s->req.prompt, s->req.priority, clock_type::now());
                    if (s->req.score_prompt) {
                        sched_->set_logits_from(seq_id_of(s->id, 0), 0); // a row for every prompt token
                        s->scored.push_back({s->req.prompt[0], std::numeric_limits<float>::quiet_NaN(), {}});
                    }
                    if (s->req.embed) { // mean: one pooled row a chunk; cls: every position's; last: the last's
                        const pooling_type how = *s->req.embed;
                        sched_->set_logits_from(seq_id_of(s->id, 0),
                                                how == pooling_type::last ? std::numeric_limits<int32_t>::max() : 0,
                                                how == pooling_type::mean ? row_kind::pooled : row_kind::hidden);
                        s->pooled.assign(size_t(n_embd_), 0.0);
                    }
                    reqs_.emplace(s->id, std::move(s));
                }
                incoming_.clear();
                cancels.swap(cancels_);
            }
            if (stopping) break;
            for (uint64_t id : cancels) end_now(id);
            end_all_if_broken();

            bool progressed = false;
            for (size_t i = 0; i < parts_.executors.size(); ++i) {
                if (auto out = parts_.executors[i]->poll()) {
                    finish_batch(int(i), *out);
                    started[i] = false;
                    progressed = true;
                }
            }
            sched_->admit(clock_type::now());
            for (uint64_t sid : sched_->take_admitted())
                if (auto it = reqs_.find(request_of(sid)); it != reqs_.end() && it->second->t_admitted == steady_time{}) {
                    request_state& r = *it->second;
                    r.t_admitted = clock_type::now();
                    r.n_cached = sched_->reused_tokens(sid);
                    --n_pending_;
                    log_->debug("request {} joins: {} prompt tokens ({} from the prefix cache), up to {} more{}", r.id,
                                r.n_prompt, sched_->reused_tokens(sid), r.max_tokens,
                                r.seqs.size() > 1 ? fmt::format(" in each of {} sequences", r.seqs.size()) : "");
                }
            for (uint64_t sid : sched_->take_preempted()) {
                log_->debug("request {} (sequence {}) preempted: KV pool full, or its place taken by a higher priority",
                            request_of(sid), index_of(sid));
                if (seq_state* q = find_seq(sid)) spec_->drop(sid, *q); // it is recomputed as a prompt: no rows to verify them by
            }
            bool in_flight = false, sync_result = false;
            for (size_t i = 0; i < parts_.executors.size(); ++i) {
                executor& ex = *parts_.executors[i];
                if (!started[i] && ex.ready()) {
                    const batch& b = sched_->plan(int(i), ex.kind());
                    if (!b.empty()) {
                        started_at_[i] = clock_type::now();
                        ex.start(b);
                        planned_[i] = &b;
                        started[i] = true;
                        ++n_steps_;
                        if (ex.wait_fds().empty()) sync_result = true;
                    }
                }
                in_flight = in_flight || started[i];
            }
            publish();
            send_done();
            if (sync_result || progressed) continue; // results to take at once, or work freed up
            wait_for_news(in_flight);
        }
        // Shutting down: batches in flight end (a worker gets 30 s), then whatever is left
        // ends as cancelled.
        const auto deadline = clock_type::now() + std::chrono::seconds(30);
        for (size_t i = 0; i < parts_.executors.size(); ++i) {
            while (started[i] && clock_type::now() < deadline) {
                if (auto out = parts_.executors[i]->poll()) {
                    finish_batch(int(i), *out);
                    started[i] = false;
                    break;
                }
                wait_for_news(true);
            }
            if (started[i]) sched_->complete(int(i), false); // abandoned: its pages are freed below
            parts_.executors[i]->shutdown();
        }
        {
            std::lock_guard lock(mu_);
            for (auto& s : incoming_) reqs_.emplace(s->id, std::move(s));
            incoming_.clear();
        }
        std::vector<uint64_t> ids;
        for (const auto& [id, r] : reqs_) ids.push_back(id);
        std::sort(ids.begin(), ids.end());
        for (uint64_t id : ids) finish(id, "cancelled");
        publish();
        send_done();
    }

    void wait_for_news(bool in_flight) {
        std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
        auto timeout = std::chrono::milliseconds(in_flight ? 1000 : 5000);
        for (const auto& e : parts_.executors) {
            for (int fd : e->wait_fds()) fds.push_back({fd, POLLIN, 0});
            timeout = std::min(timeout, e->poll_interval());
        }
        const int r = ::poll(fds.data(), fds.size(), int(timeout.count()));
        if (r > 0 && (fds[0].revents & POLLIN)) {
            uint64_t v;
            [[maybe_unused]] ssize_t n = ::read(wake_fd_, &v, sizeof v);
        }
    }

    // Any of the request's sequences in a batch now.
    bool busy(const request_state& r) const {
        for (const auto& q : r.seqs) {
            if (!q) continue;
            const uint64_t sid = seq_id_of(r.id, q->index);
            if (sched_->contains(sid) && sched_->busy(sid)) return true;
        }
        return false;
    }

    // Ends a request: cancelled, or failed with `error`; after its batch when one runs it.
    void end_now(uint64_t id, std::string error = {}) {
        auto it = reqs_.find(id);
        if (it == reqs_.end()) return;
        if (busy(*it->second)) {
            it->second->cancel_pending = true; // its pages are being written: after the batch
            it->second->end_error = std::move(error);
            return;
        }
        log_->debug("request {} {}", id, error.empty() ? "cancelled" : "failed: " + error);
        finish_pending(id, std::move(error));
    }
    void finish_pending(uint64_t id, std::string error) {
        if (error.empty()) finish(id, "cancelled");
        else finish(id, "error", std::move(error));
    }

    // An executor that cannot work any more (its worker's files changed under the daemon)
    // ends every request with why: none of them would ever run.
    void end_all_if_broken() {
        for (const auto& e : parts_.executors) {
            std::string why = e->failure();
            if (why.empty()) continue;
            std::vector<uint64_t> ids;
            for (const auto& [id, r] : reqs_)
                if (!r->cancel_pending) ids.push_back(id);
            for (uint64_t id : ids) end_now(id, why);
            return;
        }
    }

    void finish_batch(int slot, const executor::outcome& out) {
        std::vector<uint64_t> members = sched_->in_batch(slot);
        for (uint64_t& m : members) m = request_of(m);
        std::sort(members.begin(), members.end());
        members.erase(std::unique(members.begin(), members.end()), members.end());
        if (!out.ok) {
            sched_->complete(slot, false);
            for (uint64_t id : members) {
                auto it = reqs_.find(id);
                if (it == reqs_.end()) continue;
                request_state& r = *it->second;
                // A worker that died may have died of something else; one that died with this
                // request in two batches in a row (it may be what kills it), or a step that
                // failed, ends it.
                if (out.crashed && ++r.n_failures < 2 && !r.cancel_pending) continue;
                log_->warn("request {} failed: {}", id, out.error);
                if (r.cancel_pending) finish_pending(id, r.end_error);
                else finish(id, "error", out.error);
            }
            return;
        }
        const std::vector<uint64_t> due = sched_->complete(slot, true);
        const batch& b = *planned_[size_t(slot)];
        bool decode_only = true; // a decode step: what it took tells what drafts cost
        for (int32_t i = 0; i < b.n_seqs(); ++i) decode_only = decode_only && b.n_new(i) <= opts_.sched.decode_tokens;
        if (decode_only)
            spec_->record_step(b.n_tokens(),
                               std::chrono::duration<double>(clock_type::now() - started_at_[size_t(slot)]).count());
        std::unordered_map<uint64_t, int32_t> index; // scheduler sequence -> its place in the batch
        for (int32_t i = 0; i < b.n_seqs(); ++i) index.emplace(b.seq_id[size_t(i)], i);
        for (uint64_t id : members) {
            auto it = reqs_.find(id);
            if (it == reqs_.end()) continue;
            it->second->n_failures = 0; // crashes far apart are not this request's doing
            if (it->second->cancel_pending) finish_pending(id, it->second->end_error);
        }
        executor& ex = *parts_.executors[size_t(slot)];
        for (int32_t i = 0; i < b.n_seqs(); ++i) {
            auto it = reqs_.find(request_of(b.seq_id[size_t(i)]));
            if (it == reqs_.end()) continue;
            if (it->second->req.score_prompt && !it->second->prompt_sent) score_prompt(*it->second, b, i, ex);
            if (it->second->req.embed) pool_rows(*it->second, b, i, ex, n_embd_);
        }
        for (uint64_t sid : due) {
            auto it = reqs_.find(request_of(sid));
            if (it == reqs_.end()) continue;
            request_state& r = *it->second;
            const int32_t i = index.at(sid), row_end = b.logits_begin[size_t(i) + 1];
            if (r.req.embed) { // the prompt is computed: its embedding is the request's answer
                finish_embedding(r);
                finish(r.id, "stop");
                continue;
            }
            if (r.req.score_prompt && !r.prompt_sent) { // the prompt is computed: its scores go first
                send_prompt_scores(r, sid, *sched_);
                if (r.max_tokens == 0) {
                    finish(r.id, "length");
                    continue;
                }
            }
            if (r.beam()) { // (may end the request: r is not used after it)
                // An earlier row of this batch may have stepped the search (beams recomputed
                // after a preemption had their rows already): a beam it removed, or one it gave
                // a new token, has no row here any more.
                const size_t k = size_t(index_of(sid));
                if (k < r.seqs.size() && r.seqs[k] && sched_->contains(sid) &&
                    sched_->n_computed(sid) == int32_t(sched_->tokens(sid).size()) &&
                    beams_->on_row(r, *r.seqs[k], ex.logits(row_end - 1), busy(r)))
                    finish(r.id, "stop");
                continue;
            }
            if (!r.forked) { // the prompt is computed: the group shares its pages from here
                for (size_t k = 1; k < r.seqs.size(); ++k) sched_->fork(sid, seq_id_of(r.id, int32_t(k)));
                r.forked = true;
                const auto row = ex.logits(row_end - 1); // the row of the prompt's last token
                for (auto& q : r.seqs) {
                    sample_next(r, *q, row);
                    if (!q->done) spec_->propose(r, *q, n_running_);
                }
            } else {
                seq_state& q = *r.seqs[size_t(index_of(sid))];
                TANDEM_ASSERT(b.n_seq_logits(i) >= q.n_drafts + 1, "{} rows for {} drafts", b.n_seq_logits(i),
                              q.n_drafts);
                spec_->verify(r, q, ex, row_end - 1 - q.n_drafts, n_running_);
            }
            if (r.n_live == 0) finish(r.id, "stop");
        }
        spec_->run_draft_jobs([this](uint64_t sid) { return find_seq(sid); });
    }

    // The state of sequence `sid`, when its request is still here.
    seq_state* find_seq(uint64_t sid) {
        auto it = reqs_.find(request_of(sid));
        if (it == reqs_.end() || size_t(index_of(sid)) >= it->second->seqs.size()) return nullptr;
        return it->second->seqs[size_t(index_of(sid))].get();
    }

    // A sequence's next token sampled from `logits` with all its tokens as history.
    void sample_next(request_state& r, seq_state& q, std::span<const float> logits) {
        sample_next(r, q, logits, -1, sampler::none, {});
    }

    // engine_core: samples one token of sequence q; a finished sequence sends its done event.
    bool sample_next(request_state& r, seq_state& q, std::span<const float> logits, int32_t n_history, token_id draft,
                     std::span<const float> draft_q) override {
        const uint64_t sid = seq_id_of(r.id, q.index);
        const auto tokens = sched_->tokens(sid);
        if (n_history < 0) n_history = int32_t(tokens.size());
        row_.assign(logits.begin(), logits.end());
        engine_event ev;
        ev.index = q.index;
        if (r.req.n_top_logprobs > 0) ev.top = top_logprobs(logits, r.req.n_top_logprobs);
        const auto history = tokens.first(size_t(n_history));
        const token_id id = draft == sampler::none ? q.smp.sample(row_, history) : q.smp.verify(row_, history, draft, draft_q);
        if (id == sampler::none) { // every token banned: nothing can follow
            finish_seq(r, q, "stop");
            return false;
        }
        ++n_generated_tokens_;
        ++q.n_generated;
        ev.logprob = logprob_of(logits, id);
        q.sum_logprob += ev.logprob;
        if (!r.req.ignore_eos && tok_.is_eog(id)) {
            q.final_token = id;
            finish_seq(r, q, "stop");
            return false;
        }
        const bool kept = draft != sampler::none && id == draft;
        if (kept) {
            ++n_accepted_tokens_;
            ++q.n_accepted;
        } else {
            if (draft != sampler::none) sched_->truncate(sid, n_history);
            sched_->append(sid, id);
        }
        q.smp.accept(id);
        ev.id = id;
        ev.text = q.stops.push(q.dec.push(id));
        ev.t = clock_type::now();
        const bool stopped = (r.req.observer && !r.req.observer->on_token(ev)) || q.stops.stopped();
        const bool full = q.n_generated >= r.max_tokens;
        r.sink(std::move(ev));
        if (stopped) finish_seq(r, q, "stop");
        else if (full) finish_seq(r, q, "length");
        return kept && !q.done;
    }

    // engine_core: a sequence's done event, completed with the request's counts, is sent once
    // the stats are published (so a caller that sees it sees the pages free).
    void queue_done(const request_state& r, engine_event&& ev) override {
        ev.n_prompt = r.n_prompt;
        ev.n_cached = r.n_cached;
        ev.t = clock_type::now();
        ev.t_admitted = r.t_admitted;
        if (r.req.observer) r.req.observer->on_done(ev);
        done_.push_back({r.sink, std::move(ev)});
    }

    // Sequence q ends: its pages go, and its done event is queued.
    void finish_seq(request_state& r, seq_state& q, const char* reason, const std::string& error = {}) {
        if (q.done) return;
        q.done = true;
        --r.n_live;
        engine_event ev;
        ev.done = true;
        ev.index = q.index;
        ev.text = flush_text(q.dec, q.stops);
        ev.finish_reason = reason;
        ev.error = error;
        ev.n_generated = q.n_generated;
        ev.final_token = q.final_token;
        ev.stop_string = q.stops.matched();
        ev.n_draft_tokens = q.n_drafted;
        ev.n_accepted_tokens = q.n_accepted;
        ev.cumulative_logprob = q.sum_logprob;
        if (q.index == 0) ev.embedding = std::move(r.embedding); // empty unless an embedding ended well
        const uint64_t sid = seq_id_of(r.id, q.index);
        if (sched_->contains(sid)) sched_->remove(sid);
        spec_->forget(sid);
        queue_done(r, std::move(ev));
    }

    // Ends every sequence of the request still live, and the request.
    void finish(uint64_t id, const char* reason, std::string error = {}) {
        auto it = reqs_.find(id);
        if (it == reqs_.end()) return;
        request_state& r = *it->second;
        if (r.t_admitted == steady_time{}) --n_pending_; // it leaves without having been admitted
        if (r.beam()) beams_->end(r, reason, error);
        else
            for (auto& q : r.seqs) finish_seq(r, *q, reason, error);
        reqs_.erase(it);
    }

    void send_done() {
        for (auto& [sink, ev] : done_) sink(std::move(ev));
        done_.clear();
    }

    void publish() {
        {
            bool up = true;
            std::string failure;
            for (const auto& e : parts_.executors) {
                up = up && e->up();
                if (failure.empty()) failure = e->failure();
            }
            std::lock_guard lock(ready_mu_);
            if (up != up_ || failure != failure_) {
                up_ = up;
                failure_ = failure;
                ready_cv_.notify_all();
            }
        }
        const scheduler_stats ss = sched_->stats();
        uint64_t restarts = 0, uploaded = 0, kept = 0;
        for (const auto& e : parts_.executors) {
            restarts += e->n_restarts();
            const auto dk = e->device_kv();
            uploaded += dk.uploaded;
            kept += dk.kept;
        }
        std::lock_guard lock(stats_mu_);
        n_running_ = ss.n_running;
        stats_.n_running = ss.n_running;
        stats_.n_waiting = ss.n_waiting;
        stats_.n_pages_used = ss.n_pages_used;
        stats_.n_pages_peak = ss.n_pages_peak;
        stats_.n_pages_total = opts_.sched.n_pages;
        stats_.n_pages_cached = ss.n_pages_cached;
        stats_.n_kv_tokens = ss.n_kv_tokens;
        stats_.page_size = opts_.sched.page_size;
        stats_.n_ctx = opts_.n_ctx;
        stats_.n_steps = n_steps_;
        stats_.n_prompt_tokens = ss.n_prompt_tokens;
        stats_.n_prefix_hits = ss.n_prefix_hit_tokens;
        stats_.n_generated_tokens = n_generated_tokens_ + beams_->n_generated();
        stats_.n_preemptions = ss.n_preemptions;
        stats_.n_worker_restarts = restarts;
        stats_.n_kv_upload_bytes = uploaded;
        stats_.n_kv_kept_bytes = kept;
        stats_.n_drafts = spec_->n_drafts();
        stats_.n_draft_tokens = spec_->n_draft_tokens();
        stats_.n_accepted_at = spec_->n_accepted_at();
        stats_.n_accepted_tokens = n_accepted_tokens_;
    }

    const tokenizer& tok_;
    engine_options opts_;
    engine_parts parts_;
    int32_t n_embd_ = 0; // the width of a hidden-state row
    std::unique_ptr<scheduler> sched_;
    std::shared_ptr<spdlog::logger> log_;
    int wake_fd_ = -1;

    mutable std::mutex mu_;
    std::deque<std::unique_ptr<request_state>> incoming_; // guarded by mu_
    std::unordered_set<uint64_t> cancels_;                // guarded by mu_
    bool stopping_ = false;                               // guarded by mu_
    uint64_t last_id_ = 0;                                // guarded by mu_

    std::mutex ready_mu_;
    std::condition_variable ready_cv_;
    bool up_ = false;                                     // guarded by ready_mu_
    std::string failure_;                                 // guarded by ready_mu_

    mutable std::mutex stats_mu_;
    engine_stats stats_;                                  // guarded by stats_mu_
    std::atomic<int32_t> n_running_{0};
    std::atomic<int32_t> n_pending_{0};                   // submitted, not admitted (nor finished) yet

    // engine thread only
    std::unordered_map<uint64_t, std::unique_ptr<request_state>> reqs_;
    std::vector<float> row_;                              // [n_vocab] logits being sampled
    std::vector<std::pair<engine_sink, engine_event>> done_;
    std::vector<const batch*> planned_;                  // [executor] the batch it ran last
    std::vector<steady_time> started_at_;                 // [executor] when it started it
    uint64_t n_steps_ = 0, n_generated_tokens_ = 0, n_accepted_tokens_ = 0;
    std::unique_ptr<speculation> spec_;                   // drafts: proposed, verified, their cost
    std::unique_ptr<beam_search> beams_;
    std::thread thread_;
};

} // namespace

std::unique_ptr<engine> make_engine(const model_config& cfg, const tokenizer& tok, const engine_options& opts,
                                    engine_parts parts) {
    return std::make_unique<engine_impl>(cfg, tok, opts, std::move(parts));
}

} // namespace tandem
