// The daemon's models (daemon/model_host.hpp): resolving names, loading on demand within the
// budget, idle unloads, and what the routes show of them.
#include "daemon/model_host.hpp"

#include "daemon/model_store.hpp"

#include "runtime/error.hpp"
#include "runtime/kv_layout.hpp"
#include "runtime/log.hpp"
#include "runtime/tokenizer.hpp"

#include <boost/asio/post.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace tandem::daemon {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

// Ollama's names carry a tag: "stories260K:latest" is "stories260K".
std::string base_name(const std::string& name) {
    return name.ends_with(":latest") ? name.substr(0, name.size() - 7) : name;
}

const model_section* section_of(const config& cfg, const std::string& name) {
    for (const auto& m : cfg.models)
        if (m.name == name) return &m;
    return nullptr;
}

int64_t file_bytes(const std::string& path) {
    std::error_code ec;
    const auto n = path.empty() ? 0 : fs::file_size(path, ec);
    return ec ? 0 : int64_t(n);
}

std::string label_text(const std::string& s) { // a Prometheus label value
    std::string out;
    for (char c : s) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

// The model store's manifests, for the listings (none when it cannot be read).
std::vector<model_manifest> store_models(const config& cfg) {
    try {
        return model_store(cfg.store).list();
    } catch (const std::exception& e) {
        logger("models")->warn("the model store: {}", e.what());
        return {};
    }
}

} // namespace

std::string default_model_name(const config& cfg) {
    if (!cfg.model.empty() && section_of(cfg, cfg.model)) return cfg.model;
    if (!cfg.model.empty()) return cfg.model_id.empty() ? fs::path(cfg.model).stem().string() : cfg.model_id;
    return cfg.models.empty() ? std::string() : cfg.models.front().name;
}

std::vector<std::string> local_model_names(const config& cfg) {
    std::vector<std::string> out;
    const std::string def = default_model_name(cfg);
    if (!def.empty()) out.push_back(def);
    for (const auto& m : cfg.models)
        if (m.name != def) out.push_back(m.name);
    return out;
}

const upstream_section* upstream_of(const config& cfg, const std::string& name) {
    const std::string n = base_name(name);
    for (const auto& u : cfg.upstreams)
        if (std::find(u.models.begin(), u.models.end(), n) != u.models.end() ||
            std::find(u.models.begin(), u.models.end(), name) != u.models.end())
            return &u;
    return nullptr;
}

std::optional<model_source> resolve_model(const config& cfg, const std::string& requested) {
    const std::string def = default_model_name(cfg);
    const std::string name = requested.empty() ? def : base_name(requested);
    if (name.empty()) return std::nullopt;
    model_source src;
    src.name = name;
    src.is_default = name == def;
    src.cfg = cfg;
    src.cfg.models.clear(); // (what the model's own config needs is below)
    src.cfg.upstreams.clear();
    src.keep_alive_s = src.is_default ? -1 : cfg.keep_alive_s; // the default model stays unless its section says
    const model_section* sec = section_of(cfg, name);
    if (!sec && src.is_default) return src; // `model = PATH`: the daemon's own keys
    // A model of its own: its own pool file, no draft model but its section's.
    const auto own = [&cfg](model_source& m) {
        m.cfg.model_id = m.name;
        // One pool file per model, beside the configured one: a store name's '/' and ':' (org/repo:Q4_K_M)
        // become '_', so the file stays in that directory.
        if (!cfg.kv_pool.empty()) {
            std::string file = m.name;
            for (char& c : file)
                if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
            m.cfg.kv_pool = cfg.kv_pool + "." + file;
        }
        m.cfg.draft_model.clear();
        m.cfg.draft_tokens = 0;
    };
    if (!sec) {
        // The model store's (`tandem pull`, `tandem alias`): a model pulled while the daemon
        // runs is served without a restart. Store names only: a request never makes the daemon
        // open a path it names.
        std::optional<model_manifest> m;
        try {
            const model_store store(cfg.store);
            m = store.find(name);
            if (!m || m->files.empty()) return std::nullopt;
            src.cfg.model = store.paths(*m).front();
        } catch (const std::exception& e) { // (an unreadable store: the model is not there)
            logger("models")->warn("the model store: {}", e.what());
            return std::nullopt;
        }
        src.name = m->name;
        src.is_default = src.name == def;
        if (src.is_default) src.keep_alive_s = -1;
        own(src);
        return src;
    }
    own(src);
    for (const auto& [key, value] : sec->settings) {
        if (key == "path") src.cfg.model = value;
        else if (key == "overflow") src.overflow = value;
        else if (key == "keep_alive") src.keep_alive_s = *parse_keep_alive(value);
        else if (auto err = src.cfg.set(key, value)) fail("{}: [model {}] {}: {}", sec->origin, name, key, *err);
    }
    if (src.cfg.model_id != name) src.cfg.model_id = name; // a request names it by its section
    return src;
}

json model_card(const model_state& ms, const daemon_state& st) {
    const auto& c = ms.bundle.cfg;
    return json{{"id", ms.id},
                {"object", "model"},
                {"created", int64_t(st.started_unix)},
                {"owned_by", "tandem"},
                {"meta",
                 {{"path", ms.path},
                  {"arch", c.arch},
                  {"n_ctx", ms.n_ctx},
                  {"n_ctx_train", c.n_ctx_train},
                  {"n_vocab", c.n_vocab},
                  {"n_layer", c.n_layer},
                  {"n_embd", c.n_embd},
                  {"chat_template", std::string(name_of(ms.tmpl.family()))},
                  {"chat_template_renderer", ms.tmpl.renderer_name()}}}};
}

// --- leases -------------------------------------------------------------------------------

model_lease& model_lease::operator=(model_lease&& o) noexcept {
    if (this != &o) {
        release();
        host_ = std::exchange(o.host_, nullptr);
        name_ = std::move(o.name_);
        ms_ = std::move(o.ms_);
        keep_alive_ = o.keep_alive_;
    }
    return *this;
}

void model_lease::release() {
    if (!host_) return;
    ms_.reset(); // first: an unload the release starts holds the last reference
    std::exchange(host_, nullptr)->release(name_, keep_alive_);
}

// --- the host -----------------------------------------------------------------------------

model_host::model_host(daemon_state& st, asio::any_io_executor exec, loader_fn load, std::function<void()> changed)
    : st_(st), exec_(std::move(exec)), load_(std::move(load)), changed_(std::move(changed)) {
    for (const std::string& name : local_model_names(st_.cfg)) {
        entry e;
        e.src = *resolve_model(st_.cfg, name);
        e.keep_alive_s = e.src.keep_alive_s;
        e.last_used = clock_type::now();
        entries_.push_back(std::move(e));
    }
}

model_host::~model_host() { stop_all(); }

model_host::entry* model_host::find(const std::string& name) {
    const std::string n = name.empty() ? default_model_name(st_.cfg) : base_name(name);
    for (entry& e : entries_)
        if (e.src.name == n) return &e;
    // A name of the model store (pulled after the daemon started, or `org/repo` for its
    // `org/repo:QUANT`): an entry from now on, unloaded until a request needs it.
    std::optional<model_source> src = n.empty() ? std::nullopt : resolve_model(st_.cfg, n);
    if (!src) return nullptr;
    for (entry& e : entries_)
        if (e.src.name == src->name) return &e;
    entry e;
    e.src = std::move(*src);
    e.keep_alive_s = e.src.keep_alive_s;
    e.last_used = clock_type::now();
    entries_.push_back(std::move(e));
    return &entries_.back();
}

const model_host::entry* model_host::find(const std::string& name) const {
    const std::string n = name.empty() ? default_model_name(st_.cfg) : base_name(name);
    for (const entry& e : entries_)
        if (e.src.name == n) return &e;
    return nullptr;
}

api_error model_host::not_found(const std::string& name) const {
    std::string have;
    for (const entry& e : entries_) have += (have.empty() ? "" : ", ") + e.src.name;
    for (const model_manifest& m : store_models(st_.cfg))
        if (!find(m.name)) have += (have.empty() ? "" : ", ") + m.name;
    for (const auto& u : st_.cfg.upstreams)
        for (const auto& m : u.models) have += (have.empty() ? "" : ", ") + m + " (upstream " + u.name + ")";
    api_error e = bad(fmt::format("The model '{}' does not exist; this daemon serves: {}", name, have), "model");
    e.status = 404;
    e.code = "model_not_found";
    return e;
}

model_pick model_host::pick(const std::string& name, bool forwardable) {
    model_pick p;
    if (stopped_) {
        p.error = api_error{503, "the daemon is stopping", "server_error", "", "stopping", 5};
        return p;
    }
    entry* e = find(name);
    if (!e) {
        p.upstream = upstream_of(st_.cfg, name);
        if (!p.upstream) p.error = not_found(name);
        else if (!forwardable)
            p.error = bad(fmt::format("the model '{}' is served by upstream '{}', which takes only /v1/chat/completions, "
                                      "/v1/completions and /v1/embeddings",
                                      name, p.upstream->name),
                          "model");
        return p;
    }
    switch (e->st) {
    case state::loaded: {
        if (forwardable && !e->src.overflow.empty()) // the local queue full: the upstream takes it
            for (const auto& u : st_.cfg.upstreams)
                if (u.name == e->src.overflow) {
                    const engine_stats es = e->ms->eng->stats();
                    if (es.n_running >= e->src.cfg.engine.sched.max_running && es.n_waiting >= e->src.cfg.engine.max_waiting) {
                        p.upstream = &u;
                        p.overflow = true;
                        return p;
                    }
                    p.overflow_to = &u; // (the engine may still refuse it: the completion handler forwards then)
                }
        ++e->n_active;
        e->last_used = clock_type::now();
        p.lease.host_ = this;
        p.lease.name_ = e->src.name;
        p.lease.ms_ = e->ms;
        return p;
    }
    case state::failed:
        p.error = api_error{503, fmt::format("the model '{}' could not be loaded: {}", e->src.name, e->error),
                            "server_error", "model", "model_load_failed", 5};
        e->st = state::unloaded; // the next request tries again
        return p;
    case state::unloaded:
        if (!make_room(*e, file_bytes(e->src.cfg.model) + file_bytes(e->src.cfg.draft_model))) {
            room_wanted_ = true;
            p.wait = true;
            return p;
        }
        start_load(*e);
        p.wait = true;
        return p;
    case state::loading:
    case state::unloading:
        p.wait = true;
        return p;
    }
    return p;
}

model_pick model_host::load(const std::string& name) {
    model_pick p = pick(name, false);
    p.lease = model_lease(); // (released: the model stays for its keep_alive)
    return p;
}

std::optional<api_error> model_host::unload(const std::string& name) {
    entry* e = find(name);
    if (!e) return not_found(name);
    if (e->st != state::loaded) return std::nullopt;
    if (e->n_active > 0) { // it goes when its last request ends
        e->keep_alive_s = 0;
        return std::nullopt;
    }
    start_unload(*e);
    return std::nullopt;
}

bool model_host::make_room(const entry& want, int64_t want_bytes) {
    const int64_t budget = st_.cfg.memory_budget_mb * (int64_t(1) << 20);
    for (;;) {
        int n = 0;
        int64_t used = 0;
        for (const entry& e : entries_) {
            if (&e == &want || (e.st != state::loaded && e.st != state::loading)) continue;
            ++n;
            used += e.st == state::loaded ? e.memory_bytes : file_bytes(e.src.cfg.model);
        }
        const bool over = n + 1 > st_.cfg.models_max || (budget > 0 && used + want_bytes > budget);
        if (!over || n == 0) return true; // (a model alone over the budget still loads)
        entry* victim = nullptr;
        for (entry& e : entries_)
            if (&e != &want && e.st == state::loaded && e.n_active == 0 && (!victim || e.last_used < victim->last_used))
                victim = &e;
        if (!victim) return false;
        logger("server")->info("unloading {} to make room for {} (models_max {}, memory_budget_mb {})", victim->src.name,
                               want.src.name, st_.cfg.models_max, st_.cfg.memory_budget_mb);
        start_unload(*victim);
    }
}

void model_host::start_load(entry& e) {
    e.st = state::loading;
    logger("server")->info("loading {} ({})", e.src.name, e.src.cfg.model);
    auto done = std::make_shared<std::atomic<bool>>(false);
    entry* ep = &e;
    std::thread t([this, ep, src = e.src, done] {
        std::unique_ptr<model_state> ms;
        std::string err;
        try {
            ms = load_(src, abort_);
        } catch (const std::exception& ex) {
            err = ex.what();
        }
        asio::post(exec_, [this, ep, ms = std::shared_ptr<model_state>(std::move(ms)), err]() mutable {
            if (stopped_) return;
            entry& e = *ep;
            if (!ms) {
                logger("server")->error("cannot load {}: {}", e.src.name, err);
                e.st = state::failed;
                e.error = err;
            } else {
                e.st = state::loaded;
                e.ms = std::move(ms);
                e.error.clear();
                e.keep_alive_s = e.src.keep_alive_s;
                e.last_used = clock_type::now();
                ++e.n_loads;
                const engine_stats es = e.ms->eng->stats();
                const model_config& mc = e.ms->bundle.cfg;
                const kv_layout layout{mc.n_layer, mc.n_head_kv, mc.head_dim, e.src.cfg.engine.sched.page_size,
                                       *parse_kv_dtype(e.src.cfg.kv_dtype)};
                const int64_t kv = e.ms->pool ? int64_t(e.ms->pool->bytes())
                                              : int64_t(es.n_pages_total) * int64_t(layout.page_bytes());
                e.memory_bytes = file_bytes(e.src.cfg.model) + file_bytes(e.src.cfg.draft_model) + kv;
                logger("server")->info("loaded {}: {:.1f} MiB (weights and KV pool), context {}", e.src.name,
                                       double(e.memory_bytes) / (1 << 20), e.ms->n_ctx);
                make_room(e, e.memory_bytes); // the budget with its real size
                publish_default();
            }
            changed_();
        });
        done->store(true);
    });
    threads_.push_back({std::move(t), done});
}

void model_host::start_unload(entry& e) {
    e.st = state::unloading;
    ++e.n_unloads;
    std::shared_ptr<model_state> ms = std::move(e.ms);
    e.memory_bytes = 0;
    publish_default();
    logger("server")->info("unloading {}", e.src.name);
    auto done = std::make_shared<std::atomic<bool>>(false);
    entry* ep = &e;
    std::thread t([this, ep, ms = std::move(ms), done]() mutable {
        if (ms) ms->eng->stop(); // its workers exit; the pool file goes with the state (unless kept)
        ms.reset();
        asio::post(exec_, [this, ep] {
            if (stopped_) return;
            ep->st = state::unloaded;
            changed_();
        });
        done->store(true);
    });
    threads_.push_back({std::move(t), done});
}

void model_host::release(const std::string& name, std::optional<double> keep_alive) {
    entry* e = find(name);
    if (!e) return;
    --e->n_active;
    e->last_used = clock_type::now();
    if (keep_alive) e->keep_alive_s = *keep_alive;
    if (stopped_) return;
    if (e->n_active == 0 && e->keep_alive_s == 0 && e->st == state::loaded) start_unload(*e);
    if (room_wanted_) { // a request waits for a model to go idle
        room_wanted_ = false;
        changed_();
    }
}

void model_host::publish_default() {
    for (const entry& e : entries_)
        if (e.src.is_default) st_.ms = e.st == state::loaded ? e.ms : nullptr;
}

void model_host::tick() {
    join_done();
    if (stopped_) return;
    const auto now = clock_type::now();
    for (entry& e : entries_) {
        // A model other than the default whose engine failed for good (a worker that cannot
        // start again) goes once idle; the next request loads it anew. (The default's failure
        // ends the daemon: server::status_loop.)
        std::string failure;
        if (e.st == state::loaded && !e.src.is_default && e.n_active == 0 &&
            !e.ms->eng->wait_ready(std::chrono::milliseconds(0), failure) && !failure.empty()) {
            logger("server")->error("{} cannot serve any more: {}; unloading it", e.src.name, failure);
            start_unload(e);
        }
    }
    for (entry& e : entries_)
        if (e.st == state::loaded && e.n_active == 0 && e.keep_alive_s >= 0 &&
            std::chrono::duration<double>(now - e.last_used).count() >= e.keep_alive_s) {
            logger("server")->info("{} idle for {:.0f} s (keep_alive): unloading", e.src.name, e.keep_alive_s);
            start_unload(e);
        }
}

void model_host::join_done() {
    for (auto it = threads_.begin(); it != threads_.end();) {
        if (it->done->load()) {
            it->t.join();
            it = threads_.erase(it);
        } else {
            ++it;
        }
    }
}

void model_host::stop_all() {
    if (stopped_ && threads_.empty()) return;
    stopped_ = true;
    abort_ = true;
    for (entry& e : entries_)
        if (e.ms) e.ms->eng->stop();
    for (worker& w : threads_) w.t.join();
    threads_.clear();
    st_.ms.reset();
    for (entry& e : entries_) e.ms.reset(); // (a lease still held keeps its state until it ends)
}

std::optional<std::string> model_host::default_failure() const {
    for (const entry& e : entries_)
        if (e.src.is_default && e.st == state::failed && e.n_loads == 0) return e.error;
    return std::nullopt;
}

std::vector<std::shared_ptr<model_state>> model_host::loaded() const {
    std::vector<std::shared_ptr<model_state>> out;
    for (const entry& e : entries_)
        if (e.st == state::loaded) out.push_back(e.ms);
    return out;
}

namespace {

const char* state_name(int s) {
    static const char* names[] = {"unloaded", "loading", "loaded", "unloading", "failed"};
    return names[s];
}

} // namespace

json model_host::card_of(const entry& e) const {
    json j;
    if (e.st == state::loaded) {
        j = model_card(*e.ms, st_);
    } else {
        j = json{{"id", e.src.name}, {"object", "model"}, {"created", int64_t(st_.started_unix)}, {"owned_by", "tandem"},
                 {"meta", {{"path", e.src.cfg.model}}}};
    }
    j["loaded"] = e.st == state::loaded;
    j["state"] = state_name(int(e.st));
    j["default"] = e.src.is_default;
    j["memory_bytes"] = e.st == state::loaded ? e.memory_bytes : file_bytes(e.src.cfg.model);
    j["keep_alive_s"] = e.keep_alive_s;
    return j;
}

json model_host::cards() const {
    json data = json::array();
    for (const entry& e : entries_) data.push_back(card_of(e));
    for (const model_manifest& m : store_models(st_.cfg))
        if (!find(m.name))
            data.push_back({{"id", m.name},
                            {"object", "model"},
                            {"created", int64_t(st_.started_unix)},
                            {"owned_by", "tandem"},
                            {"loaded", false},
                            {"state", "unloaded"},
                            {"default", false},
                            {"memory_bytes", m.size},
                            {"meta", {{"source", m.source}, {"arch", m.architecture}, {"quantization", m.quantization}}}});
    for (const auto& u : st_.cfg.upstreams)
        for (const auto& m : u.models)
            data.push_back({{"id", m},
                            {"object", "model"},
                            {"created", int64_t(st_.started_unix)},
                            {"owned_by", "upstream:" + u.name},
                            {"loaded", false},
                            {"state", "upstream"},
                            {"upstream", u.name}});
    return data;
}

std::optional<json> model_host::card(const std::string& name) const {
    if (const entry* e = find(name)) return card_of(*e);
    if (const upstream_section* u = upstream_of(st_.cfg, name))
        return json{{"id", base_name(name)},   {"object", "model"},     {"created", int64_t(st_.started_unix)},
                    {"owned_by", "upstream:" + u->name}, {"loaded", false}, {"state", "upstream"},
                    {"upstream", u->name}};
    return std::nullopt;
}

json model_host::status() const {
    json models = json::array();
    const auto now = clock_type::now();
    int64_t used = 0;
    for (const entry& e : entries_) {
        json m = {{"id", e.src.name},
                  {"state", state_name(int(e.st))},
                  {"default", e.src.is_default},
                  {"path", e.src.cfg.model},
                  {"memory_bytes", e.memory_bytes},
                  {"requests_active", e.n_active},
                  {"idle_s", std::chrono::duration<double>(now - e.last_used).count()},
                  {"keep_alive_s", e.keep_alive_s},
                  {"loads", e.n_loads},
                  {"unloads", e.n_unloads}};
        if (!e.src.overflow.empty()) m["overflow"] = e.src.overflow;
        if (!e.error.empty()) m["error"] = e.error;
        if (e.st == state::loaded) {
            const engine_stats es = e.ms->eng->stats();
            m["running"] = es.n_running;
            m["waiting"] = es.n_waiting;
            m["kv_pages_used"] = es.n_pages_used;
            m["kv_pages_total"] = es.n_pages_total;
            m["n_ctx"] = e.ms->n_ctx;
            used += e.memory_bytes;
        }
        models.push_back(std::move(m));
    }
    json ups = json::array();
    for (const auto& u : st_.cfg.upstreams) ups.push_back({{"name", u.name}, {"base_url", u.base_url}, {"models", u.models}});
    return json{{"models", std::move(models)},
                {"upstreams", std::move(ups)},
                {"models_max", st_.cfg.models_max},
                {"memory_budget_mb", st_.cfg.memory_budget_mb},
                {"memory_bytes", used}};
}

void model_host::render_metrics(std::string& out) const {
    struct gauge {
        const char* name;
        const char* type;
        const char* help;
        std::function<double(const entry&)> value;
    };
    const auto stat = [](const entry& e, int32_t engine_stats::*f) {
        return e.st == state::loaded ? double(e.ms->eng->stats().*f) : 0.0;
    };
    const gauge gauges[] = {
        {"tandem_model_loaded", "gauge", "Whether the model is loaded (1) or not (0).",
         [](const entry& e) { return e.st == state::loaded ? 1.0 : 0.0; }},
        {"tandem_model_memory_bytes", "gauge", "The loaded model's weights and KV pool.",
         [](const entry& e) { return double(e.memory_bytes); }},
        {"tandem_model_requests_active", "gauge", "Requests holding the model now.",
         [](const entry& e) { return double(e.n_active); }},
        {"tandem_model_running", "gauge", "Sequences the model's engine runs now.",
         [&](const entry& e) { return stat(e, &engine_stats::n_running); }},
        {"tandem_model_waiting", "gauge", "Requests waiting in the model's engine queue.",
         [&](const entry& e) { return stat(e, &engine_stats::n_waiting); }},
        {"tandem_model_kv_pages_used", "gauge", "KV pages the model's sequences hold.",
         [&](const entry& e) { return stat(e, &engine_stats::n_pages_used); }},
        {"tandem_model_loads_total", "counter", "Times the model was loaded.",
         [](const entry& e) { return double(e.n_loads); }},
        {"tandem_model_unloads_total", "counter", "Times the model was unloaded (idle, evicted or asked).",
         [](const entry& e) { return double(e.n_unloads); }},
    };
    for (const gauge& g : gauges) {
        out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", g.name, g.help, g.name, g.type);
        for (const entry& e : entries_) out += fmt::format("{}{{model=\"{}\"}} {}\n", g.name, label_text(e.src.name), g.value(e));
    }
    if (st_.cfg.upstreams.empty()) return;
    out += "# HELP tandem_upstream_requests_total Requests forwarded to an upstream (overflow: a local model's queue was full).\n"
           "# TYPE tandem_upstream_requests_total counter\n";
    for (const auto& u : st_.cfg.upstreams)
        for (bool overflow : {false, true}) {
            const auto it = n_forwarded_.find({u.name, overflow});
            out += fmt::format("tandem_upstream_requests_total{{upstream=\"{}\",overflow=\"{}\"}} {}\n", label_text(u.name),
                               overflow, it == n_forwarded_.end() ? 0 : it->second);
        }
}

// --- the model a request names ------------------------------------------------------------

namespace {

// Reads the body's top level for "model" (or "name") and "keep_alive", and stops once it
// has both, or "model" outside Ollama's API (where keep_alive is not read).
struct model_peek : nlohmann::json_sax<nlohmann::json> {
    using number_integer_t = nlohmann::json::number_integer_t;
    using number_unsigned_t = nlohmann::json::number_unsigned_t;
    using number_float_t = nlohmann::json::number_float_t;
    using string_t = nlohmann::json::string_t;
    using binary_t = nlohmann::json::binary_t;

    int depth = 0;
    std::string cur;                  // the top-level key whose value comes next
    std::optional<std::string> model, name;
    std::optional<double> keep_alive;
    bool want_keep_alive = true;

    bool top_value() const { return depth == 1; }
    bool enough() const { return model && (!want_keep_alive || keep_alive); }
    bool number(double v) {
        if (top_value() && cur == "keep_alive") keep_alive = v < 0 ? -1.0 : v;
        cur.clear();
        return !enough();
    }
    bool null() override { return number_none(); }
    bool boolean(bool) override { return number_none(); }
    bool number_integer(number_integer_t v) override { return number(double(v)); }
    bool number_unsigned(number_unsigned_t v) override { return number(double(v)); }
    bool number_float(number_float_t v, const string_t&) override { return number(v); }
    bool string(string_t& v) override {
        if (top_value() && cur == "model") model = v;
        if (top_value() && cur == "name") name = v;
        if (top_value() && cur == "keep_alive") keep_alive = parse_keep_alive(v);
        cur.clear();
        return !enough();
    }
    bool binary(binary_t&) override { return number_none(); }
    bool start_object(std::size_t) override {
        ++depth;
        cur.clear();
        return true;
    }
    bool key(string_t& k) override {
        if (depth == 1) cur = k;
        return true;
    }
    bool end_object() override {
        --depth;
        return depth > 0;
    }
    bool start_array(std::size_t) override {
        ++depth;
        return true;
    }
    bool end_array() override {
        --depth;
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

private:
    bool number_none() {
        cur.clear();
        return true;
    }
};

} // namespace

model_request peek_model_request(std::string_view body, bool ollama) {
    model_request r;
    if (body.empty()) return r;
    model_peek p;
    p.want_keep_alive = ollama;
    nlohmann::json::sax_parse(body.begin(), body.end(), &p, nlohmann::json::input_format_t::json, false);
    if (p.model) r.name = *p.model;
    else if (p.name && ollama) r.name = *p.name;
    r.keep_alive_s = p.keep_alive;
    return r;
}

} // namespace tandem::daemon
