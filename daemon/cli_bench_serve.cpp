// `tandem bench --serve`: a running tandemd under concurrent streaming load, measured over its socket.
#include "daemon/cli.hpp"

#include "ipc/client.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace tandem::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

struct serve_opts {
    std::string socket;
    std::vector<int> concurrency{1, 4, 16, 64};
    std::vector<int> requests;   // per level: one value for all, or one per level; empty: the default
    double duration_s = 0;       // > 0: each level runs this long instead of a request count
    int prompt_tokens = 128, max_tokens = 64;
    int shared_prefix = 1000, suffix_tokens = 16;
    int kv_interval_ms = 20;     // status polls while a level runs
    uint32_t seed = 1;
    bool serve = false;
};

// Exit codes shared with the client commands (README "Using the daemon").
constexpr int exit_error = 1, exit_unreachable = 3;

// Nearest-rank percentile of unsorted samples (q in (0, 1]); NaN when there are none.
double percentile(std::vector<double> v, double q) {
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    const size_t rank = size_t(std::ceil(q * double(v.size())));
    return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json latency_json(const std::vector<double>& ms) {
    double sum = 0;
    for (double v : ms) sum += v;
    return {{"p50", number_or_null(percentile(ms, 0.50))},
            {"p99", number_or_null(percentile(ms, 0.99))},
            {"mean", number_or_null(ms.empty() ? std::nan("") : sum / double(ms.size()))},
            {"n", ms.size()}};
}

// What the daemon told us about itself before the run.
struct daemon_info {
    std::string model;
    int64_t n_vocab = 0, n_ctx = 0, max_prompt_tokens = 0, max_running = 0, page_size = 0, threads = 0;
    json placement;
    std::vector<int32_t> bos; // what "" encodes to with special tokens: the BOS, if the model has one
};

std::optional<json> get_json(const ipc::client& c, const std::string& target, std::string& err) {
    const ipc::response r = c.get(target);
    if (!r.reached()) {
        err = "no daemon is listening on " + c.socket_path() + " (" + r.net_error + ")";
        return std::nullopt;
    }
    if (!r.ok()) {
        err = fmt::format("GET {}: HTTP {} {}", target, r.status, r.body.substr(0, 200));
        return std::nullopt;
    }
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded()) {
        err = "GET " + target + ": the reply is not JSON";
        return std::nullopt;
    }
    return j;
}

// Random token ids: distinct text per request, so no prompt shares a page with another
// (the prefix cache cannot help unless the prefix test asks it to). Ids 0..2 are left out:
// the special tokens of Llama vocabularies.
std::vector<int32_t> random_prompt(std::mt19937_64& g, const daemon_info& d, int n) {
    std::vector<int32_t> v(d.bos);
    const uint64_t lo = std::min<int64_t>(3, d.n_vocab - 1);
    for (int i = int(v.size()); i < n; ++i) v.push_back(int32_t(lo + g() % uint64_t(d.n_vocab - int64_t(lo))));
    return v;
}

// One streamed completion, timed from just before the request is sent.
struct request_result {
    bool ok = false;
    std::string error;
    double ttft_ms = std::nan("");
    std::vector<double> itl_ms; // gaps between this stream's token events
    int64_t n_tokens = 0;       // usage.completion_tokens, else the token events seen
    clock_type::time_point t_end;
};

request_result stream_one(const ipc::client& c, const std::vector<int32_t>& prompt, int max_tokens,
                          const std::function<void()>& on_first_token = {}) {
    // logprobs 0: every sampled token is an event of its own, even one whose text is held
    // back (an incomplete UTF-8 sequence), so token events time the tokens exactly.
    const json body{{"prompt", prompt},
                    {"max_tokens", max_tokens},
                    {"temperature", 0},
                    {"ignore_eos", true},
                    {"logprobs", 0},
                    {"stream", true},
                    {"stream_options", {{"include_usage", true}}}};
    request_result out;
    int64_t n_events = 0, n_usage = -1;
    bool done = false;
    clock_type::time_point last{};
    const auto t0 = clock_type::now();
    const ipc::response r = c.post_stream("/v1/completions", body.dump(), [&](std::string_view data) {
        const auto now = clock_type::now();
        if (data == "[DONE]") {
            done = true;
            return true;
        }
        // A token chunk (finish_reason still null) is told apart without parsing it: the
        // pattern cannot occur inside a JSON string, where its quotes would be escaped.
        if (data.find("\"finish_reason\":null") != std::string_view::npos) {
            if (n_events++ == 0) {
                out.ttft_ms = ms_between(t0, now);
                if (on_first_token) on_first_token();
            } else {
                out.itl_ms.push_back(ms_between(last, now));
            }
            last = now;
            return true;
        }
        const json j = json::parse(data, nullptr, false);
        if (j.is_discarded()) {
            out.error = "an event that is not JSON: " + std::string(data.substr(0, 80));
            return false;
        }
        if (j.contains("error")) {
            out.error = "the daemon stopped the stream: " + j["error"].dump();
            return false;
        }
        if (j.contains("usage") && j["usage"].is_object()) n_usage = j["usage"].value("completion_tokens", int64_t(-1));
        return true;
    });
    out.t_end = clock_type::now();
    if (!r.reached())
        out.error = r.net_error;
    else if (!r.ok())
        out.error = fmt::format("HTTP {}: {}", r.status, r.body.substr(0, 200));
    else if (out.error.empty() && !done)
        out.error = "the stream ended without [DONE]";
    out.n_tokens = n_usage >= 0 ? n_usage : n_events;
    out.ok = out.error.empty();
    return out;
}

// Samples /v1/tandem/status while a level runs: KV waste is the share of allocated page
// slots that hold no token (reserved for tokens not generated yet, or the unused tail of a
// page; all of it while a prompt is being computed). Polls every `interval_ms`, and also
// whenever a request gets its first token.
class kv_sampler {
public:
    kv_sampler(const ipc::client& c, int64_t page_size, int interval_ms)
        : c_(c), page_size_(page_size), interval_(interval_ms) {
        thread_ = std::thread([this] { loop(); });
    }
    ~kv_sampler() { stop(); }

    void poke() {
        {
            std::lock_guard lock(mu_);
            poked_ = true;
        }
        cv_.notify_one();
    }

    void stop() {
        if (!thread_.joinable()) return;
        {
            std::lock_guard lock(mu_);
            stop_ = true;
        }
        cv_.notify_one();
        thread_.join();
    }

    json result() const {
        json j{{"kv_samples", n_samples_}, {"kv_pages_used_max", used_max_}};
        // slot-weighted over the samples: busy moments count by how much they allocate
        j["kv_waste"] = slots_ > 0 ? json(double(slots_ - stored_) / double(slots_)) : json(nullptr);
        j["kv_waste_max"] = n_samples_ > 0 ? json(waste_max_) : json(nullptr);
        return j;
    }

private:
    void loop() {
        std::unique_lock lock(mu_);
        while (!stop_) {
            cv_.wait_for(lock, interval_, [this] { return stop_ || poked_; });
            if (stop_) break;
            poked_ = false;
            lock.unlock();
            sample();
            lock.lock();
        }
    }

    void sample() {
        const ipc::response r = c_.get("/v1/tandem/status");
        if (!r.ok()) return;
        const json j = json::parse(r.body, nullptr, false);
        if (j.is_discarded() || !j.contains("kv_pages_used") || !j.contains("kv_tokens_stored")) return;
        const int64_t used = j["kv_pages_used"].get<int64_t>(), stored = j["kv_tokens_stored"].get<int64_t>();
        if (used <= 0) return; // nothing allocated: no ratio to take
        const int64_t slots = used * page_size_;
        const int64_t kept = std::clamp<int64_t>(stored, 0, slots);
        slots_ += slots;
        stored_ += kept;
        ++n_samples_;
        used_max_ = std::max(used_max_, used);
        waste_max_ = std::max(waste_max_, double(slots - kept) / double(slots));
    }

    const ipc::client& c_;
    const int64_t page_size_;
    const std::chrono::milliseconds interval_;
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false, poked_ = false;
    int64_t slots_ = 0, stored_ = 0, n_samples_ = 0, used_max_ = 0;
    double waste_max_ = 0;
};

// One concurrency level: `conc` client threads issue requests back to back until `n_requests`
// were sent (or, with a duration, until it has passed).
json run_level(const ipc::client& c, const serve_opts& o, const daemon_info& d, int conc, int n_requests,
               uint64_t seed_base) {
    std::atomic<int> next{0};
    std::mutex mu;
    std::vector<double> ttft, itl;
    int64_t n_tokens = 0, n_ok = 0, n_failed = 0;
    std::string first_error;
    kv_sampler kv(c, d.page_size, o.kv_interval_ms);
    const auto t0 = clock_type::now();
    const auto deadline = t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(o.duration_s));
    clock_type::time_point t_last = t0;
    std::vector<std::thread> clients;
    for (int t = 0; t < conc; ++t)
        clients.emplace_back([&] {
            for (;;) {
                const int i = next++;
                if (o.duration_s > 0 ? clock_type::now() >= deadline : i >= n_requests) break;
                std::mt19937_64 g(seed_base + uint64_t(i));
                const auto prompt = random_prompt(g, d, o.prompt_tokens);
                request_result r = stream_one(c, prompt, o.max_tokens, [&] { kv.poke(); });
                std::lock_guard lock(mu);
                t_last = std::max(t_last, r.t_end);
                if (!r.ok) {
                    ++n_failed;
                    if (first_error.empty()) first_error = r.error;
                    continue;
                }
                ++n_ok;
                n_tokens += r.n_tokens;
                ttft.push_back(r.ttft_ms);
                itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
            }
        });
    for (auto& th : clients) th.join();
    kv.stop();
    const double wall_s = std::chrono::duration<double>(t_last - t0).count();
    json j{{"concurrency", conc},
           {"requests", n_ok + n_failed},
           {"errors", n_failed},
           {"wall_s", wall_s},
           {"generated_tokens", n_tokens},
           {"tok_s", wall_s > 0 ? double(n_tokens) / wall_s : 0.0},
           {"requests_per_s", wall_s > 0 ? double(n_ok) / wall_s : 0.0},
           {"ttft_ms", latency_json(ttft)},
           {"itl_ms", latency_json(itl)}};
    j.update(kv.result());
    if (!first_error.empty()) j["first_error"] = first_error;
    return j;
}

std::string fmt_ms(const json& v) {
    if (!v.is_number()) return "-";
    const double x = v.get<double>();
    return x < 10 ? fmt::format("{:.2f}", x) : fmt::format("{:.1f}", x);
}

int run(const serve_opts& o, bool as_json) {
    const ipc::client c(ipc::default_socket_path(o.socket));
    std::string err;
    auto fail = [&](int rc, const std::string& what) {
        std::fprintf(stderr, "tandem: %s\n", what.c_str());
        return rc;
    };
    const auto health = c.get("/health");
    if (!health.reached())
        return fail(exit_unreachable, "no daemon is listening on " + c.socket_path() + " (" + health.net_error + ")");
    if (health.status != 200) return fail(exit_error, fmt::format("the daemon is not ready (HTTP {})", health.status));
    const auto models = get_json(c, "/v1/models", err);
    if (!models) return fail(exit_error, err);
    const auto status = get_json(c, "/v1/tandem/status", err);
    if (!status) return fail(exit_error, err);

    daemon_info d;
    try {
        const json& card = (*models)["data"].at(0);
        d.model = card.at("id").get<std::string>();
        d.n_vocab = card.at("meta").at("n_vocab").get<int64_t>();
        d.n_ctx = card.at("meta").at("n_ctx").get<int64_t>();
        d.page_size = status->at("kv_page_size").get<int64_t>();
        d.max_prompt_tokens = status->at("limits").at("max_prompt_tokens").get<int64_t>();
        d.max_running = status->at("limits").at("max_running").get<int64_t>();
        d.threads = status->value("threads", int64_t(0));
        d.placement = status->value("placement", json());
    } catch (const json::exception& e) {
        return fail(exit_error, std::string("the daemon's /v1/models or /v1/tandem/status lacks a field: ") + e.what());
    }
    if (!status->contains("kv_tokens_stored"))
        std::fprintf(stderr, "tandem: this daemon's status has no kv_tokens_stored; KV waste is not measured\n");
    if (const auto r = c.post("/tokenize", R"({"content": "", "add_special": true})"); r.ok()) {
        const json t = json::parse(r.body, nullptr, false);
        if (!t.is_discarded() && t.contains("tokens")) d.bos = t["tokens"].get<std::vector<int32_t>>();
    }
    if (o.prompt_tokens > d.max_prompt_tokens)
        return fail(2, fmt::format("--prompt-tokens {} is over the daemon's limit of {}", o.prompt_tokens,
                                   d.max_prompt_tokens));
    if (!o.requests.empty() && o.requests.size() != 1 && o.requests.size() != o.concurrency.size())
        return fail(2, "--requests takes one count, or one per concurrency level");

    json out{{"socket", c.socket_path()},
             {"model", d.model},
             {"n_vocab", d.n_vocab},
             {"n_ctx", d.n_ctx},
             {"threads", d.threads},
             {"placement", d.placement},
             {"max_running", d.max_running},
             {"kv_page_size", d.page_size},
             {"prompt_tokens", o.prompt_tokens},
             {"max_tokens", o.max_tokens},
             {"duration_s", o.duration_s > 0 ? json(o.duration_s) : json(nullptr)},
             {"levels", json::array()}};

    // One untimed request first: the daemon's first forward pays one-time setup costs.
    {
        std::mt19937_64 g(o.seed * 7919);
        const request_result w = stream_one(c, random_prompt(g, d, o.prompt_tokens), std::min(o.max_tokens, 4));
        if (!w.ok) return fail(exit_error, "the warm-up request failed: " + w.error);
    }

    int64_t n_failed = 0;
    for (size_t li = 0; li < o.concurrency.size(); ++li) {
        const int conc = o.concurrency[li];
        int n = o.requests.empty() ? std::max(8, 2 * conc) : o.requests[o.requests.size() == 1 ? 0 : li];
        n = std::max(n, conc); // every client sends at least one
        const json level = run_level(c, o, d, conc, n, (uint64_t(o.seed) << 32) + (uint64_t(li + 1) << 24));
        n_failed += level["errors"].get<int64_t>();
        std::fprintf(stderr, "tandem: concurrency %d: %lld requests, %.1f tok/s\n", conc,
                     (long long)level["requests"].get<int64_t>(), level["tok_s"].get<double>());
        out["levels"].push_back(level);
    }

    // Prefix test: the TTFT of a long prompt cold, then of the same prefix with another suffix.
    if (o.shared_prefix > 0) {
        const int suffix = o.suffix_tokens;
        const int prefix = int(std::min<int64_t>(o.shared_prefix, d.max_prompt_tokens - suffix));
        std::mt19937_64 g((uint64_t(o.seed) << 32) + 0xffffff);
        const auto shared = random_prompt(g, d, prefix);
        auto with_suffix = [&](uint64_t s) {
            std::vector<int32_t> p = shared;
            std::mt19937_64 gs(s);
            for (int i = 0; i < suffix; ++i) p.push_back(int32_t(3 + gs() % uint64_t(d.n_vocab - 3)));
            return p;
        };
        auto hits = [&]() -> int64_t {
            std::string e;
            const auto s = get_json(c, "/v1/tandem/status", e);
            return s ? s->value("prefix_cache_hit_tokens", int64_t(0)) : 0;
        };
        const int64_t hits0 = hits();
        const request_result cold = stream_one(c, with_suffix(1), 1);
        const int64_t hits1 = hits();
        const request_result warm = stream_one(c, with_suffix(2), 1);
        const int64_t hits2 = hits();
        if (!cold.ok || !warm.ok) {
            ++n_failed;
            out["prefix"] = {{"error", !cold.ok ? cold.error : warm.error}};
        } else {
            out["prefix"] = {{"prefix_tokens", prefix},
                             {"suffix_tokens", suffix},
                             {"cold_ttft_ms", cold.ttft_ms},
                             {"warm_ttft_ms", warm.ttft_ms},
                             {"speedup", warm.ttft_ms > 0 ? cold.ttft_ms / warm.ttft_ms : 0.0},
                             {"cold_hit_tokens", hits1 - hits0},
                             {"warm_hit_tokens", hits2 - hits1}};
        }
    }

    if (as_json) {
        std::cout << out.dump() << "\n";
    } else {
        std::cout << fmt::format("tandemd on {}: {} (n_ctx {}), {} threads, max_running {}; prompts of {} tokens, "
                                 "{} generated (greedy, ignore_eos)\n",
                                 c.socket_path(), d.model, d.n_ctx, d.threads, d.max_running, o.prompt_tokens,
                                 o.max_tokens);
        std::cout << "concurrency  requests  errors     tok/s   TTFT p50 / p99 ms    ITL p50 / p99 ms   KV waste\n";
        for (const auto& l : out["levels"]) {
            const json& w = l["kv_waste"];
            std::cout << fmt::format("{:>11}  {:>8}  {:>6}  {:>8.1f}  {:>8} / {:<8}  {:>7} / {:<7}  {}\n",
                                     l["concurrency"].get<int>(), l["requests"].get<int64_t>(),
                                     l["errors"].get<int64_t>(), l["tok_s"].get<double>(), fmt_ms(l["ttft_ms"]["p50"]),
                                     fmt_ms(l["ttft_ms"]["p99"]), fmt_ms(l["itl_ms"]["p50"]),
                                     fmt_ms(l["itl_ms"]["p99"]),
                                     w.is_number() ? fmt::format("{:.1f}%", 100 * w.get<double>()) : "-");
        }
        if (out.contains("prefix")) {
            const json& p = out["prefix"];
            if (p.contains("error"))
                std::cout << "prefix test failed: " << p["error"].get<std::string>() << "\n";
            else
                std::cout << fmt::format("prefix       {} + {} tokens: TTFT cold {:.1f} ms, warm {:.1f} ms "
                                         "({} prompt tokens reused)\n",
                                         p["prefix_tokens"].get<int>(), p["suffix_tokens"].get<int>(),
                                         p["cold_ttft_ms"].get<double>(), p["warm_ttft_ms"].get<double>(),
                                         p["warm_hit_tokens"].get<int64_t>());
        }
    }
    for (const auto& l : out["levels"])
        if (l.contains("first_error"))
            std::fprintf(stderr, "tandem: %lld requests failed at concurrency %d; first: %s\n",
                         (long long)l["errors"].get<int64_t>(), l["concurrency"].get<int>(),
                         l["first_error"].get<std::string>().c_str());
    return n_failed > 0 ? exit_error : 0;
}

} // namespace

bench_mode add_bench_serve(CLI::App* bench, const bool& json) {
    auto o = std::make_shared<serve_opts>();
    auto* serve = bench->add_flag("--serve", o->serve, "measure a running tandemd over its socket instead of loading a model: "
                                             "throughput, TTFT, inter-token latency and KV waste per concurrency "
                                             "level, then prefix-cache TTFT");
    auto needs = [&](CLI::Option* opt) { opt->needs(serve); };
    needs(bench->add_option("--socket", o->socket, "daemon socket (default: as for `tandem`)"));
    needs(bench->add_option("--concurrency", o->concurrency, "client counts, one level each (default 1,4,16,64)")
              ->delimiter(',')
              ->check(between(1, 1024)));
    auto* req = bench->add_option("--requests", o->requests,
                                  "requests per level: one count, or one per level (each level sends at least its "
                                  "concurrency; default: 2 per client, at least 8)")
                    ->delimiter(',')
                    ->check(between(1, 1 << 20));
    auto* dur = bench->add_option("--duration", o->duration_s, "seconds per level instead of a request count")
                    ->check(between(0.1, 86400.0, number::real));
    req->excludes(dur);
    needs(req);
    needs(dur);
    needs(bench->add_option("--prompt-tokens", o->prompt_tokens, "prompt tokens per request (random ids, distinct)")
              ->check(between(1, 1 << 20)));
    needs(bench->add_option("--max-tokens", o->max_tokens, "tokens generated per request (ignore_eos)")
              ->check(between(1, 1 << 20)));
    needs(bench->add_option("--shared-prefix", o->shared_prefix,
                            "prefix test: tokens of the shared prompt prefix (cut to the daemon's prompt limit; "
                            "0 skips the test)")
              ->check(between(0, 1 << 20)));
    needs(bench->add_option("--kv-interval-ms", o->kv_interval_ms,
                            "how often KV use is sampled from /v1/tandem/status while a level runs (default 20)")
              ->check(between(1, 60000)));
    needs(bench->add_option("--seed", o->seed, "seed of the random prompts"));
    return {serve, [o, &json] { return run(*o, json); }};
}

} // namespace tandem::cli
