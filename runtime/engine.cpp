// The engine: one thread that admits requests, plans batches for its executors, samples
// their logits and reports token events; and the in-process executor.
#include "runtime/engine.hpp"

#include "runtime/draft.hpp"
#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/log.hpp"
#include "runtime/runner.hpp"

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
    o.max_running = std::max(1, o.max_running);
    o.max_draft_tokens = std::clamp(o.max_draft_tokens, 0, int32_t(engine_stats::max_draft_positions));
    o.decode_tokens = std::max({1, o.decode_tokens, 1 + o.max_draft_tokens}); // a step verifies a draft whole
    o.step_tokens = std::max(o.step_tokens, o.max_running * o.decode_tokens + 1);
    if (o.max_logits <= 0) o.max_logits = o.max_running * o.decode_tokens;
    o.max_logits = std::max(o.max_logits, o.decode_tokens); // any one decode step fits
    const int32_t pages_per_ctx = (o.n_ctx + o.page_size - 1) / o.page_size;
    if (o.n_pages <= 0) o.n_pages = pages_per_ctx * o.max_running;
    o.n_pages = std::max(o.n_pages, pages_per_ctx);
    return o;
}

namespace {

// One sequence of a request's group: its sampler, text decoding and stop strings.
struct seq_state {
    int32_t index = 0;
    int32_t n_generated = 0;
    int32_t n_drafts = 0;             // drafts after its last sampled token, not verified yet
    std::vector<float> draft_q;       // [n_drafts, n_vocab] what the draft model drew them from; empty: point masses
    int32_t n_drafted = 0, n_accepted = 0;
    // The speculation policy (propose_drafts, adapt_drafts): how often its drafts stood
    // (counts that fade, for the rate a draft stands given the one before it did), and a pause
    // of `skip` tokens without drafts after a step that kept none (`backoff`: 4, doubling up
    // to 64 while that goes on).
    double n_stood = 0, n_fell = 0;
    int32_t skip = 0, backoff = 0;
    token_id final_token = -1;        // the EOS that ended it
    bool done = false;
    sampler smp;
    stream_decoder dec;
    stop_matcher stops;
    // A beam (beam search): its generated tokens' logprobs (and top alternatives) and their
    // sum; once its row is due, its best continuations, until the group's step takes them.
    double sum_logprob = 0;
    std::vector<float> lps;
    std::vector<std::vector<token_logprob>> tops;
    std::vector<token_logprob> cand;
    bool has_cand = false;

    seq_state(int32_t i, sampling_params p, const tokenizer& tok, std::vector<std::string> stop)
        : index(i), smp(std::move(p)), dec(tok), stops(std::move(stop)) {}

    // The state of a beam forked from this one, as sequence `i`.
    std::unique_ptr<seq_state> fork(int32_t i) const { return std::make_unique<seq_state>(*this, i); }
    seq_state(const seq_state& o, int32_t i)
        : index(i), n_generated(o.n_generated), smp(o.smp.clone()), dec(o.dec), stops(o.stops),
          sum_logprob(o.sum_logprob), lps(o.lps), tops(o.tops) {}
};

// A finished beam: its generated tokens (without the EOS that ended it) and their logprobs.
struct beam_hypothesis {
    double score = 0, sum_logprob = 0;
    std::vector<token_id> tokens;
    std::vector<float> lps;
    std::vector<std::vector<token_logprob>> tops;
    token_id final_token = -1;
    const char* finish_reason = "stop";
};

// A request inside the engine, from submission to its last done event. Sequence 0 computes
// the prompt; once its logits are due, n > 1 forks it (the prompt is computed once, its
// pages shared) and every sequence samples its first token from that row.
struct request_state {
    uint64_t id = 0;
    engine_request req;
    engine_sink sink;
    int32_t n_prompt = 0;
    int32_t n_cached = 0;             // prompt tokens the prefix cache gave it at admission
    int32_t max_tokens = 0;           // after cutting to the context
    int32_t n_failures = 0;           // batches in a row lost with it to a crashed worker
    int32_t n_live = 0;               // sequences not done
    bool forked = false;
    bool cancel_pending = false;      // cancelled (or failed, with end_error) while a batch ran it
    std::string end_error;            // why it fails once that batch is done ("": cancelled)
    steady_time t_admitted{};
    std::vector<std::unique_ptr<seq_state>> seqs; // [n]; beam search: [slot] its live beams, null when free
    std::vector<beam_hypothesis> finished;        // beam search: the best finished beams, at most width
    std::vector<prompt_token> scored;             // score_prompt: the prompt's tokens scored so far
    bool prompt_sent = false;                     // score_prompt: its event is sent
    std::vector<double> pooled;                   // embed: the hidden states pooled so far [n_embd]
    int32_t n_pooled = 0;                         // embed (mean): the prompt positions in `pooled`
    std::vector<float> embedding;                 // embed: the result, for sequence 0's done event

    bool beam() const { return req.beam.width > 0; }

    request_state(uint64_t i, engine_request&& r, engine_sink&& s, const tokenizer& tok)
        : id(i), req(std::move(r)), sink(std::move(s)) {
        const int32_t n = beam() ? 1 : std::max(1, req.n); // beams fork from the first as the search goes
        for (int32_t k = 0; k < n; ++k) {
            sampling_params p = req.sampling;
            if (p.seed) p.seed = *p.seed + uint64_t(k); // sequence k: seed + k
            seqs.push_back(std::make_unique<seq_state>(k, std::move(p), tok, req.stop));
            if (req.make_processor) seqs.back()->smp.processors().add(req.make_processor());
        }
        n_live = n;
        forked = n == 1;
    }
};

class engine_impl final : public engine {
public:
    engine_impl(const model_config& cfg, const tokenizer& tok, const engine_options& o, engine_parts parts)
        : tok_(tok), opts_(o), parts_(std::move(parts)), n_embd_(cfg.n_embd) {
        TANDEM_ASSERT(!parts_.executors.empty());
        opts_ = resolve_options(opts_, cfg);
        scheduler_options so;
        so.page_size = opts_.page_size;
        so.n_pages = opts_.n_pages;
        so.max_running = opts_.max_running;
        so.step_tokens = opts_.step_tokens;
        so.decode_tokens = opts_.decode_tokens;
        so.max_logits = opts_.max_logits;
        so.prefix_cache = opts_.prefix_cache;
        so.prefix_seed = opts_.prefix_seed;
        so.priority_aging_s = opts_.priority_aging_s;
        so.background_step_tokens = opts_.background_step_tokens;
        so.kv_window = cfg.kv_window(); // every layer windowed: pages behind the window go back at once
        sched_ = std::make_unique<scheduler>(so, parts_.store);
        if (opts_.draft_model && opts_.max_draft_tokens > 0) {
            drafter_ = std::make_unique<draft_model>(*opts_.draft_model, opts_.n_threads, opts_.page_size,
                                                     opts_.n_pages, 2 * opts_.max_running);
            stats_.draft_device = drafter_->device();
        }
        if (parts_.restore) parts_.restore(*sched_);
        wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        TANDEM_CHECK(wake_fd_ >= 0, "eventfd: {}", std::strerror(errno));
        log_ = logger("engine");
        std::string names;
        for (const auto& e : parts_.executors) names += (names.empty() ? "" : ", ") + e->name();
        if (drafter_) names += ", draft model on " + drafter_->device();
        log_->info("context {}, {} KV pages of {} tokens ({} cached), batch up to {}, {} tokens a step; {}",
                   opts_.n_ctx, opts_.n_pages, opts_.page_size, sched_->pool().n_cached(), opts_.max_running,
                   opts_.step_tokens, names);
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
        if (req.drafts == draft_source::automatic || (req.drafts == draft_source::model && !drafter_))
            req.drafts = drafter_ ? draft_source::model : draft_source::ngram;
        // it must fit in the pool on its own (everything else preempted): the prompt's full
        // pages once, each sequence's own pages from there
        const int64_t own = sched_->pages_for(n_prompt + max_tokens) - n_prompt / opts_.page_size;
        const int64_t n_seqs = std::max(req.n, req.beam.width);
        if (n_prompt / opts_.page_size + n_seqs * own > opts_.n_pages) return {submit_status::too_long, 0};
        std::lock_guard lock(mu_);
        if (stopping_) return {submit_status::stopped, 0};
        const int32_t free_slots = std::max(0, opts_.max_running - n_running_.load());
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
                drop_drafts(sid); // it is recomputed as a prompt: no rows to verify them by
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
        for (int32_t i = 0; i < b.n_seqs(); ++i) decode_only = decode_only && b.n_new(i) <= opts_.decode_tokens;
        if (decode_only)
            step_cost_.add(b.n_tokens(),
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
            if (it->second->req.embed) pool_rows(*it->second, b, i, ex);
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
                send_prompt_scores(r, sid);
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
                    sched_->n_computed(sid) == int32_t(sched_->tokens(sid).size()))
                    beam_row(r, *r.seqs[k], ex.logits(row_end - 1));
                continue;
            }
            if (!r.forked) { // the prompt is computed: the group shares its pages from here
                for (size_t k = 1; k < r.seqs.size(); ++k) sched_->fork(sid, seq_id_of(r.id, int32_t(k)));
                r.forked = true;
                const auto row = ex.logits(row_end - 1); // the row of the prompt's last token
                for (auto& q : r.seqs) {
                    sample_next(r, *q, row);
                    if (!q->done) propose_drafts(r, *q);
                }
            } else {
                seq_state& q = *r.seqs[size_t(index_of(sid))];
                TANDEM_ASSERT(b.n_seq_logits(i) >= q.n_drafts + 1, "{} rows for {} drafts", b.n_seq_logits(i),
                              q.n_drafts);
                verify(r, q, ex, row_end - 1 - q.n_drafts);
            }
            if (r.n_live == 0) finish(r.id, "stop");
        }
        run_draft_jobs();
    }

    // Sequence q's last sampled token and its drafts after it were computed, with logits rows
    // from `first_row` on: row j is sampled as plain decoding would sample it, with the tokens
    // up to draft j as history. While the token sampled from row j is draft j, the draft
    // stands; the first one it is not replaces that draft and cuts the rest. So every token
    // comes from the distribution plain decoding gives (a draft is a point mass: sampling p and
    // keeping the draft when they agree is the rejection rule of speculative sampling).
    void verify(request_state& r, seq_state& q, executor& ex, int32_t first_row) {
        const uint64_t sid = seq_id_of(r.id, q.index);
        const int32_t k = q.n_drafts, base = int32_t(sched_->tokens(sid).size()) - k; // tokens through the sampled one
        q.n_drafts = 0;
        if (k > 0) sched_->set_logits_from(sid, std::numeric_limits<int32_t>::max()); // the last token's row only
        int32_t accepted = 0;
        const std::vector<float> draft_q = std::move(q.draft_q);
        q.draft_q.clear();
        const size_t n_vocab = ex.logits(first_row).size();
        const auto q_of = [&](int32_t j) {
            return draft_q.empty() ? std::span<const float>{}
                                   : std::span<const float>(draft_q).subspan(size_t(j) * n_vocab, n_vocab);
        };
        while (accepted < k && sample_next(r, q, ex.logits(first_row + accepted), base + accepted,
                                           sched_->tokens(sid)[size_t(base + accepted)], q_of(accepted))) {
            ++n_accepted_at_[size_t(accepted)];
            ++accepted;
        }
        if (k > 0) ++n_drafts_;
        if (accepted == k) sample_next(r, q, ex.logits(first_row + k), base + k); // every draft stood: one more
        if (q.done) return;
        if (k > 0) adapt_drafts(q, k, accepted);
        propose_drafts(r, q);
    }

    // After a step verified k drafts of q and kept `accepted`: the counts fade and grow; none
    // kept starts (or doubles) a pause, so a task where drafts fail costs a lone draft now and
    // then.
    void adapt_drafts(seq_state& q, int32_t k, int32_t accepted) {
        constexpr double fade = 0.8;
        q.n_stood = q.n_stood * fade + accepted;
        q.n_fell = q.n_fell * fade + (accepted < k ? 1 : 0);
        if (accepted > 0) {
            q.backoff = 0;
        } else { // (a probe after a pause that was not worth drafting: a longer one)
            q.backoff = std::clamp(q.backoff * 2, 4, 64);
            q.skip = q.backoff;
        }
    }

    // The drafts of a sequence that will not be verified go (its tokens end at the sampled one).
    void drop_drafts(uint64_t sid) {
        auto it = reqs_.find(request_of(sid));
        if (it == reqs_.end()) return;
        seq_state& q = *it->second->seqs[size_t(index_of(sid))];
        if (q.n_drafts == 0) return;
        sched_->truncate(sid, int32_t(sched_->tokens(sid).size()) - q.n_drafts);
        sched_->set_logits_from(sid, std::numeric_limits<int32_t>::max());
        q.n_drafts = 0;
        q.draft_q.clear();
    }

    // After a newly sampled token: the request's drafts for the next step, as many as its
    // remaining tokens allow, computed with it and verified by verify(). Prompt lookup's at
    // once; the draft model's once every sequence of the batch is sampled (run_draft_jobs).
    void propose_drafts(request_state& r, seq_state& q) {
        if (r.req.draft_tokens <= 0) return;
        if (q.skip > 0) {
            --q.skip;
            return;
        }
        // A step of many sequences is compute-bound: each draft costs about what a token does.
        if (n_running_ > opts_.max_draft_batch) return;
        // As many drafts as gain most: the rate this sequence's drafts stood at (0.4 before any
        // stood or fell), against what a token costs in the decode steps measured so far.
        const double alpha = (q.n_stood + 0.8) / (q.n_stood + q.n_fell + 2.0);
        // The draft model's time for a draft counts too.
        const double step_s = step_cost_.seconds(n_running_);
        const double cost = opts_.draft_cost > 0 ? opts_.draft_cost
                            : step_cost_.relative(n_running_) +
                                  (r.req.drafts == draft_source::model && step_s > 0 ? draft_s_per_token_ / step_s : 0.0);
        int32_t k = drafts_worth(alpha, cost, r.req.draft_tokens);
        if (k == 0 && q.backoff == 0) { // not worth it at this cost: a pause, then a probe
            q.backoff = q.skip = 32;
            return;
        }
        k = std::max(k, 1); // after a pause, one draft to see whether they stand again
        const int32_t want = std::min({k, opts_.max_draft_tokens, r.max_tokens - q.n_generated - 1});
        if (want <= 0) return;
        const uint64_t sid = seq_id_of(r.id, q.index);
        if (r.req.drafts == draft_source::model) {
            draft_job j;
            j.id = sid;
            j.k = want;
            j.sampling = &q.smp.params();
            draft_jobs_.push_back(std::move(j));
            return;
        }
        if (r.req.drafts == draft_source::replay) {
            const auto& rp = r.req.replay;
            const size_t from = std::min(rp.size(), size_t(q.n_generated));
            add_drafts(q, sid, std::span(rp).subspan(from, std::min(rp.size() - from, size_t(want))));
            return;
        }
        add_drafts(q, sid, ngram_draft(sched_->tokens(sid), want));
    }

    // The draft model's drafts for the sequences that asked for them in this batch, computed
    // together.
    void run_draft_jobs() {
        std::erase_if(draft_jobs_, [&](const draft_job& j) { return !sched_->contains(j.id); });
        if (draft_jobs_.empty()) return;
        for (draft_job& j : draft_jobs_) j.tokens = sched_->tokens(j.id);
        const auto t0 = clock_type::now();
        drafter_->propose(draft_jobs_);
        size_t n_drafted = 0;
        for (const draft_job& j : draft_jobs_) n_drafted += j.drafts.size();
        if (n_drafted > 0) { // a moving mean of the draft model's time a draft
            const double s = std::chrono::duration<double>(clock_type::now() - t0).count() / double(n_drafted);
            draft_s_per_token_ = draft_s_per_token_ == 0 ? s : 0.9 * draft_s_per_token_ + 0.1 * s;
        }
        for (draft_job& j : draft_jobs_) {
            auto it = reqs_.find(request_of(j.id));
            if (it == reqs_.end()) continue;
            seq_state& q = *it->second->seqs[size_t(index_of(j.id))];
            if (q.done) continue;
            q.draft_q = std::move(j.q);
            add_drafts(q, j.id, j.drafts);
        }
        draft_jobs_.clear();
    }

    void add_drafts(seq_state& q, uint64_t sid, std::span<const token_id> d) {
        if (d.empty()) return;
        sched_->set_logits_from(sid, int32_t(sched_->tokens(sid).size()) - 1);
        sched_->append(sid, d);
        q.n_drafts = int32_t(d.size());
        q.n_drafted += q.n_drafts;
        n_draft_tokens_ += d.size();
    }

    // Samples one token of sequence q from `logits`, the tokens before position n_history as
    // its history (all of them by default); a finished sequence sends its done event. `draft`:
    // the token at n_history already (sampler::none: none), kept when the sample is that token,
    // else cut with what follows it. True when the draft stands and the sequence goes on.
    bool sample_next(request_state& r, seq_state& q, std::span<const float> logits, int32_t n_history = -1,
                     token_id draft = sampler::none, std::span<const float> draft_q = {}) {
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

    // Batch row i (sequence 0 of r, computing its prompt) has rows for prompt positions: each
    // scores the next prompt token. Positions scored before (recomputed after a preemption)
    // are passed over.
    void score_prompt(request_state& r, const batch& b, int32_t i, executor& ex) {
        int32_t row = b.logits_begin[size_t(i)];
        for (int32_t t = b.tok_begin[size_t(i)]; t < b.tok_begin[size_t(i) + 1]; ++t) {
            if (!b.wants_row[size_t(t)]) continue;
            const int32_t next = b.pos[size_t(t)] + 1; // the prompt token this row predicts
            const auto logits = ex.logits(row++);
            if (next != int32_t(r.scored.size()) || next >= r.n_prompt) continue;
            const token_id id = r.req.prompt[size_t(next)];
            r.scored.push_back({id, logprob_of(logits, id),
                                r.req.n_top_logprobs > 0 ? top_logprobs(logits, r.req.n_top_logprobs)
                                                         : std::vector<token_logprob>{}});
        }
    }

    // Batch sequence i computed a chunk of embedding request r's prompt. Mean pooling has one
    // row for it, the sum of its positions' hidden states, added on in order (a preempted
    // prompt is computed again from position 0: the sum starts again); cls and last take the
    // hidden-state row of the first or last position.
    void pool_rows(request_state& r, const batch& b, int32_t i, executor& ex) {
        const pooling_type how = *r.req.embed;
        const int32_t first = b.n_past(i), row = b.logits_begin[size_t(i)];
        if (how == pooling_type::mean) {
            if (first == 0) {
                std::fill(r.pooled.begin(), r.pooled.end(), 0.0);
                r.n_pooled = 0;
            }
            TANDEM_ASSERT(first == r.n_pooled && b.n_seq_logits(i) == 1, "a chunk from {} after {} pooled", first,
                          r.n_pooled);
            const auto h = ex.logits(row).first(size_t(n_embd_));
            for (size_t j = 0; j < h.size(); ++j) r.pooled[j] += double(h[j]);
            r.n_pooled += b.n_new(i);
            return;
        }
        const int32_t want = how == pooling_type::cls ? 0 : r.n_prompt - 1, k = want - first;
        if (k < 0 || k >= b.n_new(i)) return;
        int32_t at = row; // the wanted position's row: rows are the chunk's tokens from logits_from on
        for (int32_t t = b.tok_begin[size_t(i)]; t < b.tok_begin[size_t(i)] + k; ++t) at += b.wants_row[size_t(t)] != 0;
        const auto h = ex.logits(at).first(size_t(n_embd_));
        std::copy(h.begin(), h.end(), r.pooled.begin());
        r.n_pooled = r.n_prompt;
    }

    // r's prompt is computed: its pooled hidden state, L2-normalised, is its embedding.
    void finish_embedding(request_state& r) {
        TANDEM_ASSERT(r.n_pooled == r.n_prompt, "{} of {} prompt positions pooled", r.n_pooled, r.n_prompt);
        const double n = *r.req.embed == pooling_type::mean ? double(r.n_prompt) : 1.0;
        double norm = 0;
        for (double& v : r.pooled) {
            v /= n;
            norm += v * v;
        }
        norm = std::sqrt(norm);
        r.embedding.resize(r.pooled.size());
        for (size_t j = 0; j < r.pooled.size(); ++j) r.embedding[j] = float(norm > 0 ? r.pooled[j] / norm : 0.0);
    }

    // r's prompt is computed and scored: the event with its scores, and from here only the
    // last token of sequence `sid` wants a row.
    void send_prompt_scores(request_state& r, uint64_t sid) {
        TANDEM_ASSERT(int32_t(r.scored.size()) == r.n_prompt, "{} of {} prompt tokens scored", r.scored.size(),
                      r.n_prompt);
        sched_->set_logits_from(sid, std::numeric_limits<int32_t>::max());
        engine_event ev;
        ev.index = 0;
        ev.id = -1;
        ev.prompt = std::move(r.scored);
        ev.t = clock_type::now();
        r.prompt_sent = true;
        r.sink(std::move(ev));
    }

    // Beam q of r has its row: its best continuations (the processed logits' log-softmax: the
    // bias, penalties and grammar apply), twice the width of them, as Hugging Face's search
    // takes (so width of them remain whatever ends). The group steps once every live beam has
    // them and none is in a batch.
    void beam_row(request_state& r, seq_state& q, std::span<const float> logits) {
        const auto history = sched_->tokens(seq_id_of(r.id, q.index));
        row_.assign(logits.begin(), logits.end());
        q.smp.process(row_, history);
        q.cand = top_logprobs(row_, std::max(2 * r.req.beam.width, r.req.n_top_logprobs));
        std::erase_if(q.cand, [](const token_logprob& t) { return !std::isfinite(t.logprob); }); // banned (a grammar)
        q.has_cand = true;
        for (const auto& b : r.seqs)
            if (b && !b->has_cand) return;
        // A beam preempted after its row came is recomputed, perhaps in the other executor's
        // batch now: it cannot grow or fork until that batch is done (its row comes again).
        if (busy(r)) return;
        beam_step(r);
    }

    // The score of a beam of `length` tokens (an EOS that ended it not counted).
    static double beam_score(const request_state& r, double sum_logprob, size_t length) {
        return sum_logprob / std::pow(double(std::max<size_t>(length, 1)), double(r.req.beam.length_penalty));
    }

    // A finished beam joins the best `width` ones (a worse one than all of them when they are
    // full is dropped).
    void add_hypothesis(request_state& r, beam_hypothesis h) {
        const size_t width = size_t(r.req.beam.width);
        h.score = beam_score(r, h.sum_logprob, h.tokens.size());
        auto& f = r.finished;
        const auto worse = [](const beam_hypothesis& a, const beam_hypothesis& b) { return a.score > b.score; };
        if (f.size() == width && !worse(h, f.back())) return;
        f.insert(std::upper_bound(f.begin(), f.end(), h, worse), std::move(h));
        if (f.size() > width) f.pop_back();
    }

    // Beam q as a finished beam.
    beam_hypothesis hypothesis_of(const request_state& r, const seq_state& q, const char* reason) const {
        beam_hypothesis h;
        const auto tokens = sched_->tokens(seq_id_of(r.id, q.index));
        h.tokens.assign(tokens.begin() + r.n_prompt, tokens.end());
        h.lps = q.lps;
        h.tops = q.tops;
        h.sum_logprob = q.sum_logprob;
        h.finish_reason = reason;
        return h;
    }

    // Beam q ended by token t: an EOS (kept apart, as the final token) or a stop string's.
    beam_hypothesis hypothesis_of(const request_state& r, const seq_state& q, const token_logprob& t, bool eos) const {
        beam_hypothesis h = hypothesis_of(r, q, "stop");
        h.sum_logprob += t.logprob;
        if (eos) {
            h.final_token = t.id;
            return h;
        }
        h.tokens.push_back(t.id);
        h.lps.push_back(t.logprob);
        if (r.req.n_top_logprobs > 0) h.tops.push_back(top_of(r, q));
        return h;
    }

    // The top alternatives the request asked for, from beam q's candidates.
    static std::vector<token_logprob> top_of(const request_state& r, const seq_state& q) {
        const size_t n = std::min(q.cand.size(), size_t(std::max(0, r.req.n_top_logprobs)));
        return {q.cand.begin(), q.cand.begin() + ptrdiff_t(n)};
    }

    // Whether token t after beam q completes one of the request's stop strings.
    static bool stops_beam(const request_state& r, const seq_state& q, token_id t) {
        if (r.req.stop.empty()) return false;
        stream_decoder dec = q.dec;
        stop_matcher stops = q.stops;
        stops.push(dec.push(t));
        return stops.stopped();
    }

    // Every live beam of r has its continuations: the best `width` extensions over all of them
    // go on (ranked by their sums; ties to the earlier beam, then the likelier token). One that
    // ends (EOS, a stop string) among the first `width` is finished instead; the search ends
    // when max_tokens is reached or early_stopping says no live beam can do better.
    void beam_step(request_state& r) {
        struct extension {
            int32_t parent;
            token_logprob t;
            double sum;
        };
        std::vector<extension> all;
        for (const auto& b : r.seqs)
            if (b)
                for (size_t j = 0; j < b->cand.size() && j < size_t(2 * r.req.beam.width); ++j)
                    all.push_back({b->index, b->cand[j], b->sum_logprob + b->cand[j].logprob});
        std::stable_sort(all.begin(), all.end(), [](const extension& a, const extension& b) { return a.sum > b.sum; });
        const size_t width = size_t(r.req.beam.width);
        std::vector<extension> next;
        for (size_t rank = 0; rank < all.size() && next.size() < width; ++rank) {
            const extension& e = all[rank];
            const seq_state& p = *r.seqs[size_t(e.parent)];
            const bool eos = !r.req.ignore_eos && tok_.is_eog(e.t.id);
            if (eos || stops_beam(r, p, e.t.id)) {
                if (rank < width) add_hypothesis(r, hypothesis_of(r, p, e.t, eos));
                continue;
            }
            next.push_back(e);
        }
        // Forks first (a parent's pages and state as they were), then the new tokens; beams no
        // extension came from release their pages.
        std::vector<seq_state*> beams; // [next] the beam each extension continues in
        for (const extension& e : next) {
            seq_state* parent = r.seqs[size_t(e.parent)].get();
            if (std::find(beams.begin(), beams.end(), parent) == beams.end()) {
                beams.push_back(parent);
                continue;
            }
            auto free_slot = std::find(r.seqs.begin(), r.seqs.end(), nullptr);
            if (free_slot == r.seqs.end()) free_slot = r.seqs.insert(r.seqs.end(), nullptr);
            const int32_t slot = int32_t(free_slot - r.seqs.begin());
            sched_->fork(seq_id_of(r.id, e.parent), seq_id_of(r.id, slot));
            r.seqs[size_t(slot)] = r.seqs[size_t(e.parent)]->fork(slot);
            beams.push_back(r.seqs[size_t(slot)].get());
        }
        for (size_t k = 0; k < next.size(); ++k) {
            seq_state& q = *beams[k];
            const extension& e = next[k];
            if (r.req.n_top_logprobs > 0) q.tops.push_back(top_of(r, *r.seqs[size_t(e.parent)]));
            sched_->append(seq_id_of(r.id, q.index), e.t.id);
            q.smp.accept(e.t.id);
            q.stops.push(q.dec.push(e.t.id));
            q.sum_logprob = e.sum;
            q.lps.push_back(e.t.logprob);
            ++q.n_generated;
            ++n_generated_tokens_;
        }
        for (auto& b : r.seqs)
            if (b && std::find(beams.begin(), beams.end(), b.get()) == beams.end()) {
                sched_->remove(seq_id_of(r.id, b->index));
                b.reset();
            }
        for (seq_state* q : beams) q->has_cand = false;
        if (beams.empty()) return finish(r.id, "stop");
        const int32_t length = beams.front()->n_generated;
        if (length >= r.max_tokens) {
            for (seq_state* q : beams) add_hypothesis(r, hypothesis_of(r, *q, "length"));
            return finish(r.id, "stop");
        }
        if (search_done(r, next.front().sum, length)) finish(r.id, "stop");
    }

    // Whether no live beam can beat the finished ones (Hugging Face's is_done): `best` is the
    // best live beam's sum, `length` the live beams' length.
    static bool search_done(const request_state& r, double best, int32_t length) {
        const beam_params& bp = r.req.beam;
        if (r.finished.size() < size_t(bp.width)) return false;
        const double worst = r.finished.back().score;
        switch (bp.early_stopping) {
        case beam_params::stopping::early: return true;
        case beam_params::stopping::heuristic: return worst >= beam_score(r, best, size_t(length));
        case beam_params::stopping::never:
            return worst >= beam_score(r, best, size_t(bp.length_penalty > 0 ? r.max_tokens : length));
        }
        return false;
    }

    // The search of r ends: its live beams go, and its best n finished beams are sent, best
    // first, as sequences 0..n-1 (tokens and text as plain decoding would send them). Ended
    // otherwise (cancelled, an error), each of the n gets a done event with the reason.
    void end_beams(request_state& r, const char* reason, const std::string& error) {
        for (auto& b : r.seqs)
            if (b && sched_->contains(seq_id_of(r.id, b->index))) sched_->remove(seq_id_of(r.id, b->index));
        r.seqs.clear();
        const bool searched = error.empty() && std::string_view(reason) == "stop";
        for (int32_t k = 0; k < r.req.n; ++k) {
            engine_event done;
            done.done = true;
            done.index = k;
            done.finish_reason = reason;
            done.error = error;
            if (searched && size_t(k) < r.finished.size()) {
                const beam_hypothesis& h = r.finished[size_t(k)];
                stream_decoder dec(tok_);
                stop_matcher stops(r.req.stop);
                bool cut = false;
                for (size_t j = 0; j < h.tokens.size() && !cut; ++j) {
                    engine_event ev;
                    ev.index = k;
                    ev.id = h.tokens[j];
                    ev.logprob = h.lps[j];
                    if (j < h.tops.size()) ev.top = h.tops[j];
                    ev.text = stops.push(dec.push(ev.id));
                    ev.t = clock_type::now();
                    cut = (r.req.observer && !r.req.observer->on_token(ev)) || stops.stopped();
                    r.sink(std::move(ev));
                }
                done.text = flush_text(dec, stops);
                done.finish_reason = h.finish_reason;
                done.n_generated = int32_t(h.tokens.size()) + (h.final_token >= 0 ? 1 : 0);
                done.final_token = h.final_token;
                done.score = h.score;
                done.cumulative_logprob = h.sum_logprob;
            }
            queue_done(r, std::move(done));
        }
    }

    // What a sequence's decoder and stop matcher still hold, unless a stop string ended it.
    static std::string flush_text(stream_decoder& dec, stop_matcher& stops) {
        if (stops.stopped()) return {};
        std::string text = stops.push(dec.flush());
        if (!stops.stopped()) text += stops.flush();
        return text;
    }

    // A sequence's done event, completed with the request's counts, is sent once the stats
    // are published (so a caller that sees it sees the pages free).
    void queue_done(const request_state& r, engine_event&& ev) {
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
        ev.n_draft_tokens = q.n_drafted;
        ev.n_accepted_tokens = q.n_accepted;
        ev.cumulative_logprob = q.sum_logprob;
        if (q.index == 0) ev.embedding = std::move(r.embedding); // empty unless an embedding ended well
        const uint64_t sid = seq_id_of(r.id, q.index);
        if (sched_->contains(sid)) sched_->remove(sid);
        if (drafter_) drafter_->forget(sid);
        queue_done(r, std::move(ev));
    }

    // Ends every sequence of the request still live, and the request.
    void finish(uint64_t id, const char* reason, std::string error = {}) {
        auto it = reqs_.find(id);
        if (it == reqs_.end()) return;
        request_state& r = *it->second;
        if (r.t_admitted == steady_time{}) --n_pending_; // it leaves without having been admitted
        if (r.beam()) end_beams(r, reason, error);
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
        stats_.n_pages_total = opts_.n_pages;
        stats_.n_pages_cached = ss.n_pages_cached;
        stats_.n_kv_tokens = ss.n_kv_tokens;
        stats_.page_size = opts_.page_size;
        stats_.n_ctx = opts_.n_ctx;
        stats_.n_steps = n_steps_;
        stats_.n_prompt_tokens = ss.n_prompt_tokens;
        stats_.n_prefix_hits = ss.n_prefix_hit_tokens;
        stats_.n_generated_tokens = n_generated_tokens_;
        stats_.n_preemptions = ss.n_preemptions;
        stats_.n_worker_restarts = restarts;
        stats_.n_kv_upload_bytes = uploaded;
        stats_.n_kv_kept_bytes = kept;
        stats_.n_drafts = n_drafts_;
        stats_.n_draft_tokens = n_draft_tokens_;
        stats_.n_accepted_at = n_accepted_at_;
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
    step_cost step_cost_;                                 // decode steps' time by their token count
    double draft_s_per_token_ = 0;                        // the draft model's time a draft (a moving mean)
    uint64_t n_steps_ = 0, n_generated_tokens_ = 0, n_drafts_ = 0, n_draft_tokens_ = 0, n_accepted_tokens_ = 0;
    std::array<uint64_t, engine_stats::max_draft_positions> n_accepted_at_{};
    std::unique_ptr<draft_model> drafter_;               // the draft model's runner, with engine_options::draft_model
    std::vector<draft_job> draft_jobs_;                   // calls for its drafts while a batch is taken
    std::thread thread_;
};

// The in-process executor: runs each batch on the engine thread through a runner.
class inproc_executor final : public executor {
public:
    inproc_executor(std::unique_ptr<runner> r, kv_cache& kv, int32_t n_vocab)
        : runner_(std::move(r)), kv_(kv), n_vocab_(n_vocab) {}
    std::string name() const override { return "in-process " + runner_->device(); }
    work_kind kind() const override { return work_kind::both; }
    bool ready() override { return !result_; }
    void start(const batch& b) override {
        logits_.resize(size_t(b.n_logits()) * size_t(n_vocab_));
        result_ = outcome{};
        try {
            runner_->forward(b, kv_, logits_.data());
        } catch (const std::exception& e) { // a failed step ends its batch, not the daemon
            result_ = outcome{false, false, e.what()};
        }
    }
    std::optional<outcome> poll() override {
        auto r = result_;
        result_.reset();
        return r;
    }
    std::span<const float> logits(int32_t row) override {
        return std::span<const float>(logits_).subspan(size_t(row) * size_t(n_vocab_), size_t(n_vocab_));
    }
    std::vector<int> wait_fds() override { return {}; }

private:
    std::unique_ptr<runner> runner_;
    kv_cache& kv_;
    int32_t n_vocab_;
    std::vector<float> logits_;                           // [n_logits, n_vocab]
    std::optional<outcome> result_;
};

// Pages of a private kv_cache: copy-on-write is a memcpy, nothing is persisted.
class local_store final : public page_store {
public:
    explicit local_store(kv_cache& kv) : kv_(kv) {}
    void published(int32_t, uint64_t, uint64_t, std::span<const int32_t>) override {}
    void cleared(int32_t) override {}
    void copy_page(int32_t src, int32_t dst) override {
        const int64_t pb = kv_.layout().page_bytes();
        std::memcpy(kv_.base() + dst * pb, kv_.base() + src * pb, size_t(pb));
    }

private:
    kv_cache& kv_;
};

} // namespace

std::unique_ptr<page_store> make_local_store(kv_cache& kv) { return std::make_unique<local_store>(kv); }

namespace {

// The local engine owns its page pool, store and runner alongside the engine.
class local_engine final : public engine {
public:
    local_engine(model& mdl, const tokenizer& tok, const engine_options& opts, std::unique_ptr<runner> r) {
        const auto& c = mdl.config();
        const engine_options o = resolve_options(opts, c);
        kv_ = std::make_unique<kv_cache>(mdl.make_kv_layout(o.page_size), o.n_pages);
        store_ = make_local_store(*kv_);
        r->prepare(o.step_tokens, o.max_logits); // a resident engine's memory stops growing once it is up
        engine_parts parts;
        parts.executors.push_back(std::make_unique<inproc_executor>(std::move(r), *kv_, c.n_vocab));
        parts.store = store_.get();
        impl_ = make_engine(c, tok, o, std::move(parts));
    }
    ~local_engine() override { impl_.reset(); }
    submit_result submit(engine_request req, engine_sink sink) override { return impl_->submit(std::move(req), std::move(sink)); }
    void cancel(uint64_t id) override { impl_->cancel(id); }
    engine_stats stats() const override { return impl_->stats(); }
    void stop() override { impl_->stop(); }

private:
    std::unique_ptr<kv_cache> kv_;
    std::unique_ptr<page_store> store_;
    std::unique_ptr<engine> impl_;
};

} // namespace

std::unique_ptr<engine> make_engine(const model_config& cfg, const tokenizer& tok, const engine_options& opts,
                                    engine_parts parts) {
    return std::make_unique<engine_impl>(cfg, tok, opts, std::move(parts));
}

std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts) {
    return make_local_engine(mdl, tok, opts, make_cpu_runner(mdl, std::max(1, opts.n_threads)));
}

std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts,
                                          std::unique_ptr<runner> r) {
    return std::make_unique<local_engine>(mdl, tok, opts, std::move(r));
}

} // namespace tandem
