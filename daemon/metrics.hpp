// Prometheus metrics of the daemon: counters, latency histograms, and engine gauges.
#pragma once

#include "runtime/engine.hpp"
#include "runtime/grammar/guide.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::daemon {

// Cumulative buckets with fixed upper bounds, in seconds.
class histogram {
public:
    explicit histogram(std::vector<double> bounds);
    void observe(double seconds);
    // Prometheus text lines for `name` (bucket, sum, count).
    void render(std::string& out, const std::string& name) const;

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_; // [bounds_.size() + 1], the last is +Inf
    double sum_ = 0;
    uint64_t n_ = 0;
};

// Thread-safe; updated from the io thread, read by GET /metrics.
class metrics {
public:
    metrics();

    void request_done(const std::string& route, int status);
    void tokens(int64_t n_prompt, int64_t n_completion);
    void finished(const std::string& reason); // stop, length, cancelled
    void ttft(double s);
    void inter_token(double s);
    void queue_time(double s);

    struct summary {
        uint64_t n_requests = 0;
        uint64_t n_prompt_tokens = 0;
        uint64_t n_completion_tokens = 0;
    };
    summary totals() const;

    std::string render(const engine_stats* engine) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    std::map<std::string, uint64_t> finished_;
    uint64_t n_prompt_ = 0, n_completion_ = 0;
    histogram ttft_, itl_, queue_;
};

// Guided generation's histograms (compile and mask times) and cache hits, appended to /metrics.
void render_guide_metrics(std::string& out, const grammar::guide_stats& gs);

} // namespace tandem::daemon
