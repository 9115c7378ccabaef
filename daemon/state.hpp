// What every session shares: configuration, metrics, and the model once it is loaded.
#pragma once

#include "runtime/prelude.hpp"

#include "daemon/config.hpp"
#include "daemon/metrics.hpp"
#include "daemon/retrieval.hpp"
#include "runtime/chat_template.hpp"
#include "runtime/reasoning.hpp"
#include "runtime/engine.hpp"
#include "runtime/grammar/guide.hpp"
#include "ipc/kv_pool.hpp"
#include "runtime/model_loader.hpp"

#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>

namespace tandem::daemon {

// The loaded model: set once on the io thread, then read-only there.
struct model_state {
    model_bundle bundle;             // without weights when workers hold them
    chat_template tmpl;
    std::string template_source;     // tokenizer.chat_template ("" when the model has none)
    std::optional<reasoning_format> reasoning; // the template's thinking markers (runtime/reasoning.hpp)
    int model_fd = -1;                    // the model file the workers load (workers only; closed with the state)
    std::unique_ptr<ipc::kv_pool> pool;   // the shared KV pool (workers only)
    std::unique_ptr<page_store> store;    // its prefix-cache page table
    bool unlink_pool = false;             // remove the pool's file with this state (kv_pool_persist = false)
    std::unique_ptr<grammar::guide_registry> guides; // compiled constraints over the vocabulary
    std::optional<model_bundle> draft;    // draft_model: speculative decoding's drafts (the engine runs it)
    std::unique_ptr<engine> eng;          // declared last: stopped before the pool goes
    std::string prefill_device, decode_device;
    std::string id;                  // what /v1/models reports
    std::string path;
    int32_t n_ctx = 0;
    int32_t max_prompt_tokens = 0;
    int32_t max_tokens_limit = 0;
    int threads = 0;
    std::unique_ptr<embedding_cache> passage_embeddings; // retrieval's, made on first use

    model_state() = default;
    model_state(const model_state&) = delete;
    model_state& operator=(const model_state&) = delete;
    // The engine stops (its workers exit) before the pool's file is removed; a start that
    // failed after the pool was made goes through here too, so it leaves no file behind.
    ~model_state(); // (server.cpp)
};

class batch_jobs;
class model_host;
class response_store;

// Owned by the server; sessions hold a reference. Touched on the io thread only (metrics
// and the engine are thread-safe themselves).
struct daemon_state {
    config cfg;
    batch_jobs* jobs = nullptr;      // /v1/files and /v1/batches; null in tandem batch's own daemon
    std::shared_ptr<response_store> responses; // stored Responses (state_dir/responses); null: none stored
    metrics met;
    std::shared_ptr<model_state> ms; // the default model; null while it loads (or is unloaded)
    model_host* models = nullptr;    // every model by name (the server's); null in a bare state: ms only
    bool stopping = false;
    bool serving = false;            // the default model loaded once: the daemon is ready
    // Blocking work of requests (parsing and tokenizing, grammar compilation, batch files on
    // disk), off the io thread; null in a bare state (tests): the work runs on the io thread.
    std::unique_ptr<boost::asio::thread_pool> blocking;
    int64_t n_body_bytes_held = 0;   // request bodies in memory, all sessions (max_inflight_mb)
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    std::time_t started_unix = std::time(nullptr); // /v1/models "created": the same on every call
};

// One session's share of n_body_bytes_held: reserved before a body is read, given back when
// the request is done (io thread only).
class body_hold {
public:
    explicit body_hold(daemon_state& st) : st_(st) {}
    ~body_hold() { release(); }
    body_hold(const body_hold&) = delete;
    body_hold& operator=(const body_hold&) = delete;
    // False when n more bytes would go past max_inflight_mb (unless nothing is held at all:
    // a body under max_body_bytes always gets through alone).
    bool reserve(int64_t n) {
        release();
        if (st_.n_body_bytes_held > 0 && st_.n_body_bytes_held + n > st_.cfg.max_inflight_mb * (int64_t(1) << 20))
            return false;
        st_.n_body_bytes_held += n;
        n_ = n;
        return true;
    }
    void release() {
        st_.n_body_bytes_held -= n_;
        n_ = 0;
    }

private:
    daemon_state& st_;
    int64_t n_ = 0;
};

} // namespace tandem::daemon
