// The supervisor's side of one worker process: the executor the engine drives it by.
#pragma once

#include "daemon/worker_spec.hpp"
#include "runtime/engine.hpp"

#include <memory>

namespace tandem::daemon {

// Starts the worker (from the engine thread, on the first poll, so the worker's parent-death
// signal is tied to a thread that lives as long as the engine), sends batches through its
// channel, and restarts it with a backoff when it dies.
std::unique_ptr<executor> make_worker_executor(const worker_spec& spec, work_kind kind);

} // namespace tandem::daemon
