// The in-process engine: one thread, continuous batching over model::forward.
#include "runtime/engine.hpp"

#include "cpu/thread_pool.hpp"
#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/log.hpp"
#include "runtime/model.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace tandem {
namespace {

using clock_type = std::chrono::steady_clock;

// A request inside the engine: its sequence state from submission to its done event.
struct sequence {
    uint64_t id = 0;
    engine_request req;
    engine_sink sink;
    std::vector<token_id> history;    // prompt + generated
    int32_t n_prompt = 0;
    int32_t n_computed = 0;           // positions already in the KV cache
    int32_t n_generated = 0;
    int32_t max_tokens = 0;           // after cutting to the context
    std::unique_ptr<sequence_kv> kv;
    std::unique_ptr<sampler> smp;
    std::unique_ptr<stream_decoder> dec;
    std::unique_ptr<stop_matcher> stops;
    steady_time t_admitted{};
};

class local_engine final : public engine {
public:
    local_engine(model& mdl, const tokenizer& tok, const engine_options& o)
        : mdl_(mdl), tok_(tok), opts_(o), pool_(std::max(1, o.n_threads)) {
        const auto& c = mdl_.config();
        if (opts_.n_ctx <= 0 || opts_.n_ctx > c.n_ctx_train) opts_.n_ctx = c.n_ctx_train;
        opts_.max_running = std::max(1, opts_.max_running);
        opts_.step_tokens = std::max(opts_.step_tokens, opts_.max_running + 1);
        const int32_t pages_per_ctx = (opts_.n_ctx + opts_.page_size - 1) / opts_.page_size;
        if (opts_.n_pages <= 0) opts_.n_pages = pages_per_ctx * opts_.max_running;
        // at least one full context, so any request the context allows can run
        opts_.n_pages = std::max(opts_.n_pages, pages_per_ctx);
        kv_ = std::make_unique<kv_cache>(mdl_.make_kv_layout(opts_.page_size), opts_.n_pages);
        n_pages_total_ = opts_.n_pages;
        log_ = logger("engine");
        log_->info("{} threads, context {}, {} KV pages of {} tokens, batch up to {}, {} tokens a step",
                   pool_.n_threads(), opts_.n_ctx, opts_.n_pages, opts_.page_size, opts_.max_running,
                   opts_.step_tokens);
        thread_ = std::thread([this] { loop(); });
    }

    ~local_engine() override { stop(); }

    submit_result submit(engine_request req, engine_sink sink) override {
        const int32_t n_prompt = int32_t(req.prompt.size());
        if (n_prompt == 0 || n_prompt >= opts_.n_ctx) return {submit_status::too_long, 0};
        const int32_t max_tokens = std::clamp(req.max_tokens, 1, opts_.n_ctx - n_prompt);
        if (pages_for(n_prompt + max_tokens) > n_pages_total_) return {submit_status::too_long, 0};
        std::lock_guard lock(mu_);
        if (stopping_) return {submit_status::stopped, 0};
        // free batch slots take requests at once; beyond them, up to max_waiting may queue
        const int32_t free_slots = std::max(0, opts_.max_running - n_running_.load());
        if (int32_t(incoming_.size()) + n_waiting_.load() >= opts_.max_waiting + free_slots)
            return {submit_status::queue_full, 0};
        auto s = std::make_unique<sequence>();
        s->id = ++last_id_;
        s->n_prompt = n_prompt;
        s->max_tokens = max_tokens;
        s->history = req.prompt;
        s->req = std::move(req);
        s->sink = std::move(sink);
        incoming_.push_back(std::move(s));
        cv_.notify_one();
        return {submit_status::ok, last_id_};
    }

    void cancel(uint64_t id) override {
        std::lock_guard lock(mu_);
        cancels_.insert(id);
        cv_.notify_one();
    }

    engine_stats stats() const override {
        engine_stats s;
        s.n_running = n_running_.load();
        {
            std::lock_guard lock(mu_);
            s.n_waiting = n_waiting_.load() + int32_t(incoming_.size());
        }
        s.n_pages_total = n_pages_total_;
        s.n_pages_used = n_pages_used_.load();
        s.n_kv_tokens = n_kv_tokens_.load();
        s.page_size = opts_.page_size;
        s.n_ctx = opts_.n_ctx;
        s.n_steps = n_steps_.load();
        s.n_prompt_tokens = n_prompt_tokens_.load();
        s.n_generated_tokens = n_generated_tokens_.load();
        return s;
    }

    void stop() override {
        {
            std::lock_guard lock(mu_);
            if (stopping_ && !thread_.joinable()) return;
            stopping_ = true;
            cv_.notify_one();
        }
        if (thread_.joinable()) thread_.join();
    }

private:
    int32_t pages_for(int32_t n_tokens) const { return (n_tokens + opts_.page_size - 1) / opts_.page_size; }

    void loop() {
        for (;;) {
            std::unordered_set<uint64_t> cancels;
            bool stopping = false;
            {
                std::unique_lock lock(mu_);
                cv_.wait(lock, [&] {
                    return stopping_ || !incoming_.empty() || !cancels_.empty() || !running_.empty();
                });
                stopping = stopping_;
                for (auto& s : incoming_) waiting_.push_back(std::move(s));
                incoming_.clear();
                cancels.swap(cancels_);
                n_waiting_ = int32_t(waiting_.size());
            }
            if (stopping) break;
            if (!cancels.empty()) drop(cancels);
            admit();
            publish(); // the batch as it runs this step
            if (!running_.empty()) {
                try {
                    step();
                } catch (const std::exception& e) { // a failed step ends its batch, not the daemon
                    log_->error("engine step failed: {}", e.what());
                    for (auto& s : running_) finish(*s, "error", {});
                    running_.clear();
                }
            }
            publish();
            send_done();
        }
        // Shutting down: whatever is left ends as cancelled.
        std::deque<std::unique_ptr<sequence>> rest;
        {
            std::lock_guard lock(mu_);
            for (auto& s : incoming_) rest.push_back(std::move(s));
            incoming_.clear();
        }
        for (auto& s : running_) finish(*s, "cancelled", {});
        for (auto& s : waiting_) finish(*s, "cancelled", {});
        for (auto& s : rest) finish(*s, "cancelled", {});
        running_.clear();
        waiting_.clear();
        publish();
        send_done();
    }

    void publish() {
        n_running_ = int32_t(running_.size());
        n_waiting_ = int32_t(waiting_.size());
        n_pages_used_ = kv_->pool().n_pages() - kv_->pool().n_free();
        int64_t stored = 0;
        for (const auto& q : running_) stored += q->n_computed;
        n_kv_tokens_ = stored;
    }

    void drop(const std::unordered_set<uint64_t>& ids) {
        auto gone = [&](std::unique_ptr<sequence>& s) {
            if (!ids.contains(s->id)) return false;
            log_->debug("request {} cancelled after {} tokens", s->id, s->n_generated);
            finish(*s, "cancelled", {});
            return true;
        };
        std::erase_if(running_, gone);
        std::erase_if(waiting_, gone);
    }

    // Joins waiting requests in order while the batch and the pool have room.
    void admit() {
        while (!waiting_.empty() && int32_t(running_.size()) < opts_.max_running) {
            sequence& s = *waiting_.front();
            s.kv = std::make_unique<sequence_kv>(*kv_);
            if (!s.kv->reserve(s.n_prompt + s.max_tokens)) {
                s.kv.reset();
                break; // head of line waits for pages; order is kept
            }
            s.smp = std::make_unique<sampler>(s.req.sampling);
            s.dec = std::make_unique<stream_decoder>(tok_);
            s.stops = std::make_unique<stop_matcher>(s.req.stop);
            s.t_admitted = clock_type::now();
            log_->debug("request {} joins: {} prompt tokens, up to {} more", s.id, s.n_prompt, s.max_tokens);
            running_.push_back(std::move(waiting_.front()));
            waiting_.pop_front();
        }
    }

    void step() {
        const int32_t n_vocab = mdl_.config().n_vocab;
        // Decodes first (one token each, they keep the inter-token latency low), then
        // prefill chunks from what is left of the token budget.
        batch_.clear();
        members_.clear();
        int32_t budget = opts_.step_tokens;
        for (int pass = 0; pass < 2; ++pass) {
            for (size_t i = 0; i < running_.size(); ++i) {
                sequence& s = *running_[i];
                const int32_t pending = int32_t(s.history.size()) - s.n_computed;
                TANDEM_ASSERT(pending >= 1);
                const bool decoding = s.n_computed >= s.n_prompt;
                if ((pass == 0) != decoding || budget <= 0) continue;
                const int32_t n = std::min(pending, budget);
                budget -= n;
                batch_.push_back({std::span(s.history).subspan(size_t(s.n_computed), size_t(n)), s.n_computed,
                                  s.kv->block_table()});
                members_.push_back(i);
            }
        }
        if (batch_.empty()) return;
        logits_.resize(batch_.size() * size_t(n_vocab));
        mdl_.forward(exec_ctx{backend::cpu, &pool_}, batch_, *kv_, logits_.data());
        ++n_steps_;

        std::vector<size_t> finished;
        for (size_t b = 0; b < batch_.size(); ++b) {
            sequence& s = *running_[members_[b]];
            const int32_t n = int32_t(batch_[b].tokens.size());
            if (s.n_computed < s.n_prompt) n_prompt_tokens_ += uint64_t(std::min(n, s.n_prompt - s.n_computed));
            s.n_computed += n;
            if (s.n_computed < int32_t(s.history.size())) continue; // prefill goes on next step
            if (sample_next(s, std::span(&logits_[b * size_t(n_vocab)], size_t(n_vocab))))
                finished.push_back(members_[b]);
        }
        // erase from the back so earlier indices stay valid
        for (auto it = finished.rbegin(); it != finished.rend(); ++it)
            running_.erase(running_.begin() + std::ptrdiff_t(*it));
    }

    // Samples one token for `s`; returns true when the request is finished (event sent).
    bool sample_next(sequence& s, std::span<float> row) {
        engine_event ev;
        const bool want_lp = s.req.n_top_logprobs >= 0;
        if (want_lp) {
            raw_.assign(row.begin(), row.end());
            if (s.req.n_top_logprobs > 0) ev.top = top_logprobs(raw_, s.req.n_top_logprobs);
        }
        const token_id id = s.smp->sample(row, s.history);
        if (id == sampler::none) { // every token banned: nothing can follow
            finish(s, "stop", {});
            return true;
        }
        ++n_generated_tokens_;
        ++s.n_generated;
        s.history.push_back(id);
        if (!s.req.ignore_eos && tok_.is_eog(id)) {
            finish(s, "stop", {});
            return true;
        }
        ev.id = id;
        if (want_lp) ev.logprob = logprob_of(raw_, id);
        ev.text = s.stops->push(s.dec->push(id));
        ev.t = clock_type::now();
        const bool stopped = s.stops->stopped();
        const bool full = s.n_generated >= s.max_tokens;
        s.sink(std::move(ev));
        if (stopped) finish(s, "stop", {});
        else if (full) finish(s, "length", {});
        return stopped || full;
    }

    void finish(sequence& s, const char* reason, std::string text) {
        if (s.stops && !s.stops->stopped()) {
            text += s.stops->push(s.dec->flush());
            if (!s.stops->stopped()) text += s.stops->flush();
        }
        engine_event ev;
        ev.done = true;
        ev.text = std::move(text);
        ev.finish_reason = reason;
        ev.n_prompt = s.n_prompt;
        ev.n_generated = s.n_generated;
        ev.t = clock_type::now();
        ev.t_admitted = s.t_admitted;
        if (s.kv) s.kv->clear();
        // Sent after the sequence has left and the stats are published, so a caller that
        // sees the done event sees its pages free.
        done_.emplace_back(std::move(s.sink), std::move(ev));
    }

    void send_done() {
        for (auto& [sink, ev] : done_) sink(std::move(ev));
        done_.clear();
    }

    model& mdl_;
    const tokenizer& tok_;
    engine_options opts_;
    cpu::thread_pool pool_;
    std::unique_ptr<kv_cache> kv_;
    int32_t n_pages_total_ = 0;
    std::shared_ptr<spdlog::logger> log_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<sequence>> incoming_; // guarded by mu_
    std::unordered_set<uint64_t> cancels_;           // guarded by mu_
    bool stopping_ = false;                          // guarded by mu_
    uint64_t last_id_ = 0;                           // guarded by mu_

    // engine thread only
    std::deque<std::unique_ptr<sequence>> waiting_;
    std::vector<std::unique_ptr<sequence>> running_;
    std::vector<batch_seq> batch_;
    std::vector<size_t> members_;                    // running_ index of each batch entry
    std::vector<float> logits_;                      // [batch, n_vocab]
    std::vector<float> raw_;                         // [n_vocab] logits before sampling
    std::vector<std::pair<engine_sink, engine_event>> done_; // done events of this iteration

    std::atomic<int32_t> n_running_{0}, n_waiting_{0}, n_pages_used_{0};
    std::atomic<int64_t> n_kv_tokens_{0};
    std::atomic<uint64_t> n_steps_{0}, n_prompt_tokens_{0}, n_generated_tokens_{0};
    std::thread thread_;
};

} // namespace

std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts) {
    return std::make_unique<local_engine>(mdl, tok, opts);
}

} // namespace tandem
