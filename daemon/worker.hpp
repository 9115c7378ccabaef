// The worker split: prefill and decode worker processes (same binary, `tandemd --worker`)
// that run batches over the shared KV pool, and the executor the supervisor drives them by.
#pragma once

#include "ipc/kv_pool.hpp"
#include "runtime/engine.hpp"
#include "runtime/kv_layout.hpp"
#include "runtime/weights.hpp"

#include <memory>
#include <string>

namespace tandem::daemon {

// Everything a worker process needs to start; it goes on the worker's command line.
struct worker_spec {
    std::string role;                 // "prefill" or "decode" (names the worker in logs)
    std::string device = "cpu";       // "cpu" or "cuda" / "cuda:N"
    int n_threads = 1;
    std::string model;                // GGUF path
    std::string pool;                 // the shared KV pool's path
    weight_format weights = weight_format::int8;
    kv_dtype kv = kv_dtype::f16;
    int32_t page_size = 16;
    int32_t n_pages = 0;
    uint64_t fingerprint = 0;         // what the supervisor computed; the worker checks its own
    int32_t max_rows = 1;             // logits rows per batch
    int32_t n_vocab = 0;
    std::string log_level = "info";
    double timeout_s = 300;           // longest a batch may take before the worker counts as hung
};

// The supervisor's side of one worker: starts it (from the engine thread, on the first
// poll, so the worker's parent-death signal is tied to a thread that lives as long as the
// engine), sends batches through its channel, and restarts it with a backoff when it dies.
std::unique_ptr<executor> make_worker_executor(const worker_spec& spec, work_kind kind);

// The prefix cache's page table kept in the pool's segment, and page copies done there.
std::unique_ptr<page_store> make_pool_store(ipc::kv_pool& pool);
// Hands the valid entries of the segment's page table to the scheduler (oldest first);
// returns how many pages were restored.
int32_t restore_prefix_cache(ipc::kv_pool& pool, scheduler& s);

// `tandemd --worker ...`: the worker process's main. Returns the exit status.
int worker_main(int argc, char** argv);

} // namespace tandem::daemon
