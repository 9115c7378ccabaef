// What a worker process is started with, and its command line (written by the supervisor,
// parsed by the worker).
#pragma once

#include "runtime/engine.hpp"
#include "runtime/kv_layout.hpp"
#include "runtime/weights.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::daemon {

// A file's size and modification time, to tell that it changed.
struct file_stamp {
    int64_t size = -1;
    int64_t mtime_ns = 0;
    static file_stamp of(int fd); // size -1 when fstat fails
    bool operator==(const file_stamp&) const = default;
};

// Everything a worker process needs to start; it goes on the worker's command line.
struct worker_spec {
    std::string role;                 // "prefill" or "decode" (names the worker in logs)
    std::string exe;                  // the worker's binary; empty: this one (tandemd starts itself)
    std::string device = "cpu";       // "cpu" or "cuda" / "cuda:N"
    int n_threads = 1;
    std::string model;                // GGUF path
    std::string pool;                 // the shared KV pool's path
    // The supervisor's descriptors of both, inherited by the worker: it loads and maps the
    // files the daemon started with, even once renamed over or removed (-1: open the paths).
    int model_fd = -1, pool_fd = -1;
    file_stamp model_stat;            // the model file when the daemon loaded it
    int64_t pool_bytes = 0;           // the pool's segment size
    weight_format weights = weight_format::native; // a GPU worker holds INT8 whatever this says
    kv_dtype kv = kv_dtype::f16;
    int32_t page_size = 16;
    int32_t n_pages = 0;
    uint64_t fingerprint = 0;         // what the supervisor computed; the worker checks its own
    int32_t max_rows = 1;             // logits rows per batch
    int32_t max_tokens = 0;           // tokens per batch, at most: the runner prepares for them at start
    uint64_t command_bytes = 1 << 20; // the command ring's capacity: holds the largest batch (command_ring_bytes)
    int32_t n_vocab = 0;
    std::string log_level = "info";
    double timeout_s = 300;           // longest a batch may take before the worker counts as hung
    double heartbeat_s = 5;           // longest the worker's heartbeat may stop (a stopped or frozen process)
};

// The command ring's capacity for the largest batch the engine plans under these options
// (runtime/scheduler.cpp plan: decodes up to max_logits rows, prefill chunks from
// step_tokens, at most max_running requests of up to max_n sequences each), every sequence
// with a full context's block table.
uint64_t command_ring_bytes(const engine_options& eo, int32_t max_n);

// Why a worker cannot start from the spec's files any more ("" while it can): the model
// file changed in place (truncated or rewritten: its weights are not the ones the daemon
// loaded), or the pool file was truncated (its pages are gone). Both need a restart of tandemd.
std::string files_changed(const worker_spec& s);

// The worker's command line: the spec, the channel's fds and the supervisor's pid.
std::vector<std::string> worker_args(const worker_spec& s, const std::vector<int>& fds);

// What worker_main parses back.
struct worker_args_parsed {
    worker_spec spec;
    std::string fds;
    int parent = 0;
};

} // namespace tandem::daemon
