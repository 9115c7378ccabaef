// tandemd's configuration: defaults, `key = value` files, and overrides from flags.
#pragma once

#include "runtime/engine.hpp"

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::daemon {

// A `[model NAME]` section of tandemd.conf: a model the daemon serves by that name, loaded on
// demand (daemon/model_host.hpp). `path` is its GGUF; its other keys override the daemon's for
// this model (the keys model_section_keys() lists).
struct model_section {
    std::string name;
    std::vector<std::pair<std::string, std::string>> settings; // in the file's order, `path` included
    std::string origin;                                        // "FILE:LINE" of its header
};

// An `[upstream NAME]` section: an OpenAI-compatible server (vLLM, SGLang, llm-d, another
// tandemd) that requests for its models are forwarded to (daemon/upstream.hpp).
struct upstream_section {
    std::string name;
    std::string base_url;              // "http://host:port" (its /v1/... routes are used)
    std::string api_key_file;          // "" = none; else a file whose first line is the key
    std::vector<std::string> models;   // the model names forwarded there
    double timeout_s = 300;            // a reply silent this long (no byte) is a 504
    std::string origin;
};

struct config {
    std::string model;                 // GGUF path or a name in the store; "" = default_model_path(), if installed
    std::string store;                 // the model store; "" = default_store_dir() (daemon/model_store.hpp)
    std::string model_id;              // the id /v1/models reports; "" = the file's stem
    std::string chat_template;         // a .jinja file that replaces the model's chat template; "" = the file's
    std::string socket;                // "" = the default for this user (see default_socket_path)
    std::string socket_group;          // "" = the daemon's group
    uint32_t socket_mode = 0660;
    std::string listen_tcp;            // "" = off; else "HOST:PORT" (not loopback: api_keys_file is required)
    std::string api_keys_file;         // "" = no keys (TCP on loopback only); else keys TCP clients must send
    std::vector<std::string> tcp_allowed_origins; // Origin values a TCP listener accepts ("*": any)
    std::vector<std::string> tcp_allowed_hosts;   // Host values besides the listener's own address
    std::string placement = "auto";    // auto | cpu | gpu | local: sets prefill and decode (local: one process)
    std::string prefill = "auto";      // auto | cpu | gpu (auto: gpu when a CUDA device is present)
    std::string decode = "auto";       // auto | cpu | gpu (auto: cpu)
    bool workers = true;               // false: prefill and decode in the daemon's own process
    int threads = 0;                   // 0 = all cores
    int prefill_threads = 0;           // 0 = threads (the workers share the cores: see docs/config.md)
    int decode_threads = 0;            // 0 = threads
    int32_t n_ctx = 0;                 // 0 = the model's training context
    // The engine's and its scheduler's settings, each set by the key of its name: page_size,
    // prefix_cache, priority_aging_s, background_step_tokens (32 here: 0 is no cap),
    // max_running, max_waiting, step_tokens, draft_cost (0 = measured). A new one is a field
    // there and a line in config.cpp's table; the daemon fills in what it derives (the
    // context, the pool's pages, the logits rows, the fingerprint, the draft model).
    engine_options engine{.sched{.background_step_tokens = 32}};
    int64_t kv_cache_mb = 0;           // 0 = room for max_running full contexts, at most 2 GiB
    int32_t kv_pages = 0;              // > 0: the pool's page count (instead of kv_cache_mb)
    std::string kv_dtype = "f16";      // f16 | int8 | f32
    std::string weights = "auto";      // auto (low-bit files keep their bits) | int8
    std::string kv_pool;               // "" = default_kv_pool_path (a file on tmpfs)
    bool kv_pool_persist = false;      // keep the pool file at exit (a warm prefix cache after a clean restart)
    int32_t max_connections = 256;
    int32_t draft_tokens = 0;          // speculative decoding: drafts per step (0: off; 4 with a draft_model)
    std::string draft_model;           // a GGUF with the model's vocabulary that drafts ("" = prompt lookup)
    int64_t max_body_bytes = 1 << 20;
    int32_t max_json_depth = 64;       // nesting of objects and arrays in any JSON a client sends
    int64_t max_inflight_mb = 512;     // request and reply bodies held in memory, all connections together
    int64_t max_document_bytes = 512 << 10; // a chat request's documents, all together
    int32_t max_passages = 1024;       // passages documents too long for the context are split into
    int32_t max_stop_bytes = 1024;     // one stop string
    int32_t grammar_compile_ms = 2000; // compiling one output constraint (off the io thread)
    int64_t max_embedding_floats = int64_t(1) << 21; // inputs x n_embd in one embeddings reply
    // Batch jobs (/v1/files, /v1/batches): their files and state live under state_dir.
    std::string state_dir;             // "" = default_state_dir()
    int64_t max_file_bytes = int64_t(100) << 20; // one uploaded file
    int32_t max_files = 1000;          // files kept (uploads and batch results)
    int32_t responses_ttl_h = 720;     // stored Responses (previous_response_id) expire after this many hours
    int32_t batch_concurrency = 0;     // a job's requests in flight; 0 = max_running
    int32_t max_prompt_tokens = 0;     // 0 = the context less one
    int32_t max_tokens_limit = 0;      // 0 = the context
    int32_t max_n = 8;
    double request_timeout_s = 30;     // to read one whole request (idle keep-alive included)
    double load_wait_s = 30;           // a request that needs the model waits this long for it to load (0: 503 at once)
    double drain_timeout_s = 30;
    double worker_timeout_s = 300;     // a worker silent on one batch this long is killed and restarted
    double worker_heartbeat_s = 5;     // a worker whose heartbeat stops this long (SIGSTOP, frozen) is too
    std::vector<std::string> allowed_users;  // names or uids
    std::vector<std::string> allowed_groups; // names or gids
    std::string log_level = "info";
    // Several models (docs/config.md#several-models): the sections, and how many stay loaded.
    std::vector<model_section> models; // [model NAME] sections
    std::vector<upstream_section> upstreams; // [upstream NAME] sections
    int32_t models_max = 4;            // local models loaded at once (least recently used out first)
    int64_t memory_budget_mb = 0;      // 0 = no budget; else the loaded models' weights and KV pools
    double keep_alive_s = 300;         // a model idle this long is unloaded (< 0: never; the default model: never)
    // Where each key was set, "FILE:LINE" (or the flag), for the errors validate() reports.
    std::map<std::string, std::string> origin;

    // Drafts per step each request may ask for: draft_tokens, or 4 when it is 0 and a draft
    // model is set (a draft model is loaded to draft).
    int32_t speculative_tokens() const { return draft_tokens > 0 || draft_model.empty() ? draft_tokens : 4; }

    // Sets one key from its text; an error message, or nullopt when it was fine.
    std::optional<std::string> set(const std::string& key, const std::string& value);
    // Reads `path`; throws tandem::error "FILE:LINE: key: problem" for a bad entry. A value in
    // matching double or single quotes is taken without them (no escapes).
    void load_file(const std::string& path);
    // The same from a stream, its errors naming `source` as the file.
    void load(std::istream& in, const std::string& source);
    // Checks what one key cannot (listen_tcp is loopback, the user and group names exist);
    // throws tandem::error "FILE:LINE: key: problem", the place from `origin`.
    void validate() const;
};

// The context length and the KV pool's size, from the config and the model (what tandemd
// serves; server.cpp logs the notes). n_ctx 0 is the model's training context, capped by the
// tokens the configured KV memory holds (kv_pages, kv_cache_mb, else the 2048 MiB default); an
// explicit n_ctx is honoured by growing a smaller pool to one full context, and one above the
// training context is refused (`error`).
struct context_plan {
    int32_t n_ctx = 0;
    int64_t n_pages = 0;               // the KV pool
    int32_t max_prompt_tokens = 0;     // max_prompt_tokens, at most n_ctx - 1
    int32_t max_tokens_limit = 0;      // max_tokens_limit, at most n_ctx
    struct note {
        bool warn = false;
        std::string text;
    };
    std::vector<note> notes;           // what was chosen, and what to change for another
    std::string error;                 // not empty: the daemon cannot serve this config
};
// page_bytes: one KV page of page_size tokens in the pool (kv_layout::page_bytes).
context_plan plan_context(const config& cfg, int32_t n_ctx_train, int64_t page_bytes);

// Whether systemd gave this process a RuntimeDirectory= ($RUNTIME_DIRECTORY).
bool under_systemd_runtime();

// $RUNTIME_DIRECTORY/tandem.sock under systemd (RuntimeDirectory=tandem), else
// /run/tandem/tandem.sock for root and $XDG_RUNTIME_DIR/tandem/tandem.sock for a user.
std::string default_socket_path();

// Where batch jobs keep their files and state: $STATE_DIRECTORY under systemd
// (StateDirectory=tandem), else /var/lib/tandem for root and $XDG_STATE_HOME/tandem (or
// ~/.local/state/tandem) for a user.
std::string default_state_dir();

// The demo model a packaged tandemd serves when none is configured: stories260K.gguf in the
// installed share/tandem/models/ (found from the running tandemd's own path, so any install
// prefix works); "" when there is none there (a build tree).
std::string default_model_path();

// A keep_alive: seconds ("300", "-1"), or a duration with a unit ("5m", "10s", "1h", "500ms");
// negative means for good. nullopt when it is neither.
std::optional<double> parse_keep_alive(const std::string& v);

// The keys a [model NAME] section takes besides `path`, `keep_alive` and `overflow`: those
// that may differ between models (the context, the KV pool, placement, limits).
const std::vector<std::string>& model_section_keys();

// The documented keys, in order, for --help-config.
std::vector<std::string> config_keys();

} // namespace tandem::daemon
