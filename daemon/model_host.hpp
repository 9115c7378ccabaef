// The daemon's models: every model it may serve by name (the config's default, its [model NAME]
// sections, the store later), which of them are loaded, loading them on demand within
// models_max and memory_budget_mb (least recently used out first, never one with requests
// running), unloading idle ones after keep_alive, and the names served by an upstream.
#pragma once

#include "runtime/prelude.hpp"

#include "daemon/config.hpp"
#include "daemon/reply.hpp"
#include "daemon/state.hpp"

#include <boost/asio/any_io_executor.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tandem::daemon {

namespace asio = boost::asio;

// A model the daemon can load: its name and the config it is loaded with (the daemon's, with
// `model` its file and the section's own keys applied).
struct model_source {
    std::string name;
    config cfg;
    bool is_default = false;         // the config's `model`: loaded at start, kept unless told
    double keep_alive_s = 300;       // idle this long: unloaded (< 0: never)
    std::string overflow;            // an upstream that takes requests when the local queue is full
};

// The one resolver from a requested name to a model (an Ollama name's ":latest" tag is
// dropped): the config's default model (by its id or file stem), then its [model NAME]
// sections, then the model store (tandem pull, tandem alias: by name, never a path). nullopt
// when none has that name.
std::optional<model_source> resolve_model(const config& cfg, const std::string& name);
// The name of the default model ("" when the config has none).
std::string default_model_name(const config& cfg);
// Every local model's name, the default first.
std::vector<std::string> local_model_names(const config& cfg);
// The upstream that serves `name`, or null.
const upstream_section* upstream_of(const config& cfg, const std::string& name);

class model_host;

// A request's hold on a loaded model: while one is held the model is not unloaded. Its
// release marks the model used (and applies the request's keep_alive, Ollama's).
class model_lease {
public:
    model_lease() = default;
    model_lease(model_lease&& o) noexcept { *this = std::move(o); }
    model_lease& operator=(model_lease&& o) noexcept;
    ~model_lease() { release(); }
    model_state* get() const { return ms_.get(); }
    explicit operator bool() const { return bool(ms_); }
    void keep_alive(std::optional<double> s) { keep_alive_ = s; }
    void release();

private:
    friend class model_host;
    model_host* host_ = nullptr;
    std::string name_;
    std::shared_ptr<model_state> ms_;
    std::optional<double> keep_alive_;
};

// What a request for a model gets: the model held, an upstream to forward to, an error, or
// "wait" (it is loading; ask again when the host reports a change).
struct model_pick {
    model_lease lease;
    const upstream_section* upstream = nullptr;
    bool overflow = false;           // forwarded because the local queue is full
    const upstream_section* overflow_to = nullptr; // with a lease: where the request goes if the queue refuses it
    std::optional<api_error> error;
    bool wait = false;
};

// Owned by the server; everything on the io thread except the loads and unloads themselves,
// which run on threads of their own and report back through `exec`.
class model_host {
public:
    // load(source, abort): load_model_state for the source (tests may stub it). changed: called
    // on the io thread after a model loaded, failed or was unloaded (sessions waiting look again).
    using loader_fn = std::function<std::unique_ptr<model_state>(const model_source&, const std::atomic<bool>&)>;
    model_host(daemon_state& st, asio::any_io_executor exec, loader_fn load, std::function<void()> changed);
    ~model_host();
    model_host(const model_host&) = delete;
    model_host& operator=(const model_host&) = delete;

    // The model a request names ("" = the default), for a route that `forwardable` (an upstream
    // takes it).
    model_pick pick(const std::string& name, bool forwardable);
    // POST /v1/tandem/models/{id}/load and /unload. load: as pick, without a lease kept.
    model_pick load(const std::string& name);
    std::optional<api_error> unload(const std::string& name);
    // Once a second: models idle past their keep_alive go; finished threads are joined.
    void tick();
    // A request forwarded to an upstream (/metrics counts them).
    void count_forward(const std::string& upstream, bool overflow) { ++n_forwarded_[{upstream, overflow}]; }
    // A thread that ends on its own (a cancelled upstream transfer), joined once `done` (tick)
    // or at exit.
    void keep_thread(std::thread t, std::shared_ptr<std::atomic<bool>> done) {
        threads_.push_back({std::move(t), std::move(done)});
    }
    // The daemon drains: loads in progress give up.
    void abort_loading() { abort_ = true; }
    // At exit: every engine stopped, every thread joined (the io thread no longer runs).
    void stop_all();

    // What /v1/models, /v1/tandem/status and /metrics show.
    json cards() const;                       // every model, loaded or not, and the upstreams'
    std::optional<json> card(const std::string& name) const;
    json status() const;                      // per model: state, memory, requests, engine counts
    void render_metrics(std::string& out) const;
    api_error not_found(const std::string& name) const; // 404 model_not_found, naming what there is
    // Why the default model failed its first load (nullopt: it did not fail, or served before).
    std::optional<std::string> default_failure() const;
    // The loaded models (for /api/ps and /api/tags).
    std::vector<std::shared_ptr<model_state>> loaded() const;

private:
    friend class model_lease;
    enum class state { unloaded, loading, loaded, unloading, failed };
    struct entry {
        model_source src;
        state st = state::unloaded;
        std::shared_ptr<model_state> ms;
        std::string error;              // the last load's failure
        int n_active = 0;               // leases held
        std::chrono::steady_clock::time_point last_used;
        double keep_alive_s = 300;      // the source's, or the last request's keep_alive
        int64_t memory_bytes = 0;       // weights and KV pool, once loaded
        int64_t n_loads = 0, n_unloads = 0;
    };

    entry* find(const std::string& name);
    const entry* find(const std::string& name) const;
    // Unloads least recently used idle models until `want` (want_bytes) fits models_max and
    // memory_budget_mb; false when what is left has requests running.
    bool make_room(const entry& want, int64_t want_bytes);
    void start_load(entry& e);
    void start_unload(entry& e);
    void release(const std::string& name, std::optional<double> keep_alive);
    void publish_default();             // st.ms: the default model while it is loaded
    json card_of(const entry& e) const;
    void join_done();

    daemon_state& st_;
    asio::any_io_executor exec_;
    loader_fn load_;
    std::function<void()> changed_;
    std::list<entry> entries_;          // stable addresses; the default first
    struct worker {
        std::thread t;
        std::shared_ptr<std::atomic<bool>> done;
    };
    std::vector<worker> threads_;
    std::atomic<bool> abort_{false};
    bool stopped_ = false;
    bool room_wanted_ = false;          // a request waits for a model to go idle
    std::map<std::pair<std::string, bool>, int64_t> n_forwarded_; // (upstream, overflow): requests
};

// The model a request names, read without parsing the whole body where it can: its top
// level's "model" (or Ollama's "name"), and Ollama's "keep_alive".
struct model_request {
    std::string name;
    std::optional<double> keep_alive_s;
};
// ollama: the path is Ollama's (keep_alive read, "name" as well as "model").
model_request peek_model_request(std::string_view body, bool ollama);

// A loaded model's entry in /v1/models.
json model_card(const model_state& ms, const daemon_state& st);

} // namespace tandem::daemon
