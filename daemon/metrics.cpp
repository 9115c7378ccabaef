// Prometheus text exposition (format 0.0.4) of the daemon's metrics.
#include "daemon/metrics.hpp"

#include <span>

#include <fmt/format.h>

namespace tandem::daemon {

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void histogram::observe(double s) {
    size_t i = 0;
    while (i < bounds_.size() && s > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += s;
    ++n_;
}

namespace {

// Prometheus histogram lines from per-bucket counts (not cumulative; one past the bounds: +Inf).
void render_buckets(std::string& out, const std::string& name, std::span<const double> bounds,
                    std::span<const uint64_t> counts, double sum, uint64_t n) {
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
        cum += counts[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds[i], cum);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, n, name, sum, name, n);
}

void render_guide_hist(std::string& out, const std::string& name, const char* help, const grammar::guide_stats::hist& h) {
    std::vector<double> bounds;
    for (const double us : grammar::guide_stats::bounds_us) bounds.push_back(us / 1e6);
    std::vector<uint64_t> counts;
    for (const auto& c : h.counts) counts.push_back(c.load(std::memory_order_relaxed));
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    render_buckets(out, name, bounds, counts, double(h.sum_us.load(std::memory_order_relaxed)) / 1e6,
                   h.n.load(std::memory_order_relaxed));
}

} // namespace

void histogram::render(std::string& out, const std::string& name) const {
    render_buckets(out, name, bounds_, counts_, sum_, n_);
}

void render_guide_metrics(std::string& out, const grammar::guide_stats& gs) {
    render_guide_hist(out, "tandem_grammar_compile_seconds", "Time to compile a new output constraint.",
                      gs.compile_us);
    render_guide_hist(out, "tandem_grammar_mask_seconds", "Time to compute one token's grammar mask.", gs.mask_us);
    out += fmt::format("# HELP tandem_grammar_cache_hits_total Constraints found compiled in the cache.\n"
                       "# TYPE tandem_grammar_cache_hits_total counter\ntandem_grammar_cache_hits_total {}\n",
                       gs.n_compile_cache_hits.load(std::memory_order_relaxed));
}

metrics::metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      queue_({0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60}) {}

void metrics::request_done(const std::string& route, int status) {
    std::lock_guard lock(mu_);
    ++requests_[{route, status}];
}

void metrics::tokens(int64_t n_prompt, int64_t n_completion) {
    std::lock_guard lock(mu_);
    n_prompt_ += uint64_t(n_prompt);
    n_completion_ += uint64_t(n_completion);
}

void metrics::finished(const std::string& reason) {
    std::lock_guard lock(mu_);
    ++finished_[reason];
}

void metrics::ttft(double s) {
    std::lock_guard lock(mu_);
    ttft_.observe(s);
}

void metrics::inter_token(double s) {
    std::lock_guard lock(mu_);
    itl_.observe(s);
}

void metrics::queue_time(double s) {
    std::lock_guard lock(mu_);
    queue_.observe(s);
}

metrics::summary metrics::totals() const {
    std::lock_guard lock(mu_);
    summary s;
    for (const auto& [k, n] : requests_) s.n_requests += n;
    s.n_prompt_tokens = n_prompt_;
    s.n_completion_tokens = n_completion_;
    return s;
}

std::string metrics::render(const engine_stats* e) const {
    std::lock_guard lock(mu_);
    std::string out;
    out += "# HELP tandem_requests_total HTTP requests answered, by route and status.\n"
           "# TYPE tandem_requests_total counter\n";
    for (const auto& [k, n] : requests_)
        out += fmt::format("tandem_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
    out += "# HELP tandem_generations_finished_total Generations (choices) ended, by finish reason.\n"
           "# TYPE tandem_generations_finished_total counter\n";
    for (const auto& [k, n] : finished_) out += fmt::format("tandem_generations_finished_total{{reason=\"{}\"}} {}\n", k, n);
    out += fmt::format("# HELP tandem_prompt_tokens_total Prompt tokens of answered requests.\n"
                       "# TYPE tandem_prompt_tokens_total counter\ntandem_prompt_tokens_total {}\n"
                       "# HELP tandem_generation_tokens_total Tokens generated for answered requests.\n"
                       "# TYPE tandem_generation_tokens_total counter\ntandem_generation_tokens_total {}\n",
                       n_prompt_, n_completion_);
    out += "# HELP tandem_time_to_first_token_seconds From request received to first token.\n"
           "# TYPE tandem_time_to_first_token_seconds histogram\n";
    ttft_.render(out, "tandem_time_to_first_token_seconds");
    out += "# HELP tandem_inter_token_latency_seconds Between consecutive tokens of one generation.\n"
           "# TYPE tandem_inter_token_latency_seconds histogram\n";
    itl_.render(out, "tandem_inter_token_latency_seconds");
    out += "# HELP tandem_queue_time_seconds From request received to joining the batch.\n"
           "# TYPE tandem_queue_time_seconds histogram\n";
    queue_.render(out, "tandem_queue_time_seconds");
    if (e) {
        out += fmt::format(
            "# HELP tandem_requests_running Sequences in the running batch.\n"
            "# TYPE tandem_requests_running gauge\ntandem_requests_running {}\n"
            "# HELP tandem_requests_waiting Sequences queued for the batch.\n"
            "# TYPE tandem_requests_waiting gauge\ntandem_requests_waiting {}\n"
            "# HELP tandem_kv_pages_used KV cache pages in use.\n"
            "# TYPE tandem_kv_pages_used gauge\ntandem_kv_pages_used {}\n"
            "# HELP tandem_kv_pages_peak The most KV cache pages in use at once since the model was loaded.\n"
            "# TYPE tandem_kv_pages_peak gauge\ntandem_kv_pages_peak {}\n"
            "# HELP tandem_kv_pages_total KV cache pages in the pool.\n"
            "# TYPE tandem_kv_pages_total gauge\ntandem_kv_pages_total {}\n"
            "# HELP tandem_engine_steps_total Engine steps (one batched forward each).\n"
            "# TYPE tandem_engine_steps_total counter\ntandem_engine_steps_total {}\n"
            "# HELP tandem_engine_prompt_tokens_total Prompt tokens of requests the engine admitted (prefix-cache hits included).\n"
            "# TYPE tandem_engine_prompt_tokens_total counter\ntandem_engine_prompt_tokens_total {}\n"
            "# HELP tandem_engine_generated_tokens_total Tokens sampled by the engine (cancelled work included).\n"
            "# TYPE tandem_engine_generated_tokens_total counter\ntandem_engine_generated_tokens_total {}\n"
            "# HELP tandem_prefix_cache_hits_total Prompt tokens reused from the prefix cache instead of computed.\n"
            "# TYPE tandem_prefix_cache_hits_total counter\ntandem_prefix_cache_hits_total {}\n"
            "# HELP tandem_kv_tokens_stored Token positions stored in referenced KV pages (shared pages once).\n"
            "# TYPE tandem_kv_tokens_stored gauge\ntandem_kv_tokens_stored {}\n"
            "# HELP tandem_kv_pages_cached Free KV pages still holding a cached prefix (evicted on demand).\n"
            "# TYPE tandem_kv_pages_cached gauge\ntandem_kv_pages_cached {}\n"
            "# HELP tandem_preemptions_total Sequences sent back to wait, their pages freed, to be recomputed.\n"
            "# TYPE tandem_preemptions_total counter\ntandem_preemptions_total {}\n"
            "# HELP tandem_worker_restarts_total Worker processes restarted after a crash.\n"
            "# TYPE tandem_worker_restarts_total counter\ntandem_worker_restarts_total {}\n"
            "# HELP tandem_kv_device_upload_bytes_total Past K/V bytes GPU workers copied from the pool to the device.\n"
            "# TYPE tandem_kv_device_upload_bytes_total counter\ntandem_kv_device_upload_bytes_total {}\n"
            "# HELP tandem_kv_device_kept_bytes_total Past K/V bytes GPU workers read from device pages they kept.\n"
            "# TYPE tandem_kv_device_kept_bytes_total counter\ntandem_kv_device_kept_bytes_total {}\n"
            "# HELP tandem_speculative_drafts_total Speculative steps: one sequence's drafts verified together.\n"
            "# TYPE tandem_speculative_drafts_total counter\ntandem_speculative_drafts_total {}\n"
            "# HELP tandem_speculative_draft_tokens_total Draft tokens computed for verification (prompt lookup or the draft model).\n"
            "# TYPE tandem_speculative_draft_tokens_total counter\ntandem_speculative_draft_tokens_total {}\n"
            "# HELP tandem_speculative_accepted_tokens_total Draft tokens the verification kept.\n"
            "# TYPE tandem_speculative_accepted_tokens_total counter\ntandem_speculative_accepted_tokens_total {}\n",
            e->n_running, e->n_waiting, e->n_pages_used, e->n_pages_peak, e->n_pages_total, e->n_steps, e->n_prompt_tokens,
            e->n_generated_tokens, e->n_prefix_hits, e->n_kv_tokens, e->n_pages_cached, e->n_preemptions,
            e->n_worker_restarts, e->n_kv_upload_bytes, e->n_kv_kept_bytes, e->n_drafts, e->n_draft_tokens,
            e->n_accepted_tokens);
        // Accepted drafts by their place in the step, as far as any draft got (vLLM's per-position counter).
        size_t n_pos = e->n_accepted_at.size();
        while (n_pos > 0 && e->n_accepted_at[n_pos - 1] == 0) --n_pos;
        out += "# HELP tandem_speculative_accepted_tokens_per_position_total Accepted drafts by position in their step (0: the first).\n"
               "# TYPE tandem_speculative_accepted_tokens_per_position_total counter\n";
        for (size_t k = 0; k < std::max<size_t>(n_pos, 1); ++k)
            out += fmt::format("tandem_speculative_accepted_tokens_per_position_total{{position=\"{}\"}} {}\n", k,
                               e->n_accepted_at[k]);
    }
    return out;
}

} // namespace tandem::daemon
