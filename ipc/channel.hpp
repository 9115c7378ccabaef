// The control channel between the supervisor and one worker: a shared mapping (memfd) with a
// command ring, a result ring and a logits area, plus one eventfd wakeup each way.
#pragma once

#include "ipc/ring.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem::ipc {

struct channel_config {
    uint64_t command_bytes = 1 << 20;  // ring capacities, powers of two
    uint64_t result_bytes = 1 << 16;
    int32_t max_rows = 1;              // logits rows one batch can return
    int32_t n_vocab = 1;
};

// One wakeup per batch each way, not a syscall per token: the writer pushes its message,
// then signals the eventfd; the reader polls the eventfd (with whatever else it waits on),
// reads it to reset, and drains the ring.
class channel {
public:
    // Supervisor side: a fresh memfd-backed area (sealed at its size) and two eventfds, all
    // close-on-exec except when handed to a child through child_fds(). Throws tandem::error
    // on a bad config or a failed system call.
    static std::unique_ptr<channel> create(const channel_config& cfg);
    // Worker side: maps what the supervisor passed (fd numbers from the command line);
    // throws tandem::error when the area's header does not match. Owns (closes) the fds
    // once it returns; after a throw they are still the caller's.
    static std::unique_ptr<channel> attach(int memfd, int to_worker_efd, int to_supervisor_efd);
    ~channel();

    const channel_config& config() const { return cfg_; }
    ring& commands() { return commands_; }  // supervisor -> worker
    ring& results() { return results_; }    // worker -> supervisor
    float* logits_row(int32_t row);         // [n_vocab] floats, row < max_rows

    // The worker's heartbeat: a counter in the shared area that a thread of the worker bumps
    // a few times a second, whatever its batch is doing, so a stopped (SIGSTOP) or frozen
    // process is told from a long batch.
    void beat();
    uint64_t beats() const;

    void notify_worker();
    void notify_supervisor();
    // The fd each side polls (readable when woken); consume_* resets it.
    int worker_wait_fd() const { return to_worker_; }
    int supervisor_wait_fd() const { return to_supervisor_; }
    static void consume(int eventfd);

    // {memfd, to_worker_efd, to_supervisor_efd}: the numbers to pass to the worker.
    std::vector<int> child_fds() const { return {memfd_, to_worker_, to_supervisor_}; }

private:
    channel() = default;
    channel_config cfg_;
    int memfd_ = -1, to_worker_ = -1, to_supervisor_ = -1;
    void* base_ = nullptr;
    uint64_t bytes_ = 0;
    ring commands_, results_;
    float* logits_ = nullptr;
    uint64_t* heartbeat_ = nullptr; // in the shared area
};

// Waits until one of `fds` is readable or `timeout` passes; returns the indices of the
// readable ones (POLLIN, POLLHUP, POLLERR, or POLLNVAL for an fd that is not open), empty on
// timeout. EINTR is retried for the time left. Negative fds are ignored.
std::vector<size_t> wait_readable(const std::vector<int>& fds, std::chrono::milliseconds timeout);

} // namespace tandem::ipc
