// The host CPU as code outside the backends reaches it (the daemon's entry points, the CLI's
// offline commands and benchmarks): the process set up for inference, a context of n threads
// for the ops, and what the machine can do, measured. Only runtime/ and the deployment module
// name the CPU backend itself (scripts/check-layers).
#pragma once

#include "runtime/ops/dispatch.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace tandem {

// Sets the process up for inference on the CPU: oneDNN's OpenMP threads wait passively, so
// they do not spin on the cores the engine's threads need. libgomp reads the policy only at
// start, so this may re-exec the process; call it first thing in main.
void prepare_inference_process();

// A context of n threads on the CPU for the ops (exec_ctx backend::cpu).
class host_threads {
public:
    explicit host_threads(int n_threads);
    ~host_threads();
    host_threads(const host_threads&) = delete;
    host_threads& operator=(const host_threads&) = delete;
    exec_ctx ctx() const;
    int size() const;

private:
    std::unique_ptr<cpu::thread_pool> pool_;
};

} // namespace tandem
