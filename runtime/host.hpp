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
    cpu::thread_pool& pool() const { return *pool_; } // for runtime calls that take the pool

    // What this machine can do, measured on these threads. The int8 peak: a register-only
    // loop of the multiply-add the kernels at the active ISA level are built on (cpu/peak.hpp),
    // run for about `seconds`; at the scalar level there is none (tops 0).
    struct int8_peak {
        std::string isa; // the level's name
        double tops = 0;
    };
    int8_peak measure_int8_peak(double seconds) const;
    // Read bandwidth in GB/s over these ranges (a model's weights: what decode reads).
    double read_bandwidth_gbs(std::span<const std::span<const uint8_t>> ranges) const;

private:
    std::unique_ptr<cpu::thread_pool> pool_;
};

// oneDNN's int8 matmul on n_threads, m x k by k x n: giga-ops per second over `reps` runs,
// and the name of the implementation oneDNN picks for the shape (the raw prefill bound
// `tandem bench` prints).
double host_matmul_gops(int n_threads, int64_t m, int64_t k, int64_t n, int reps);
std::string host_matmul_impl(int64_t m, int64_t k, int64_t n);

} // namespace tandem
