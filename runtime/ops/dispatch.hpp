// Where an op runs (reference, CPU, CUDA) and the one template that routes a call there.
#pragma once

#include "runtime/error.hpp"

#include <chrono>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

namespace cpu { class thread_pool; }
namespace cuda { class context; }
class scratch_arena;

enum class backend { ref, cpu, cuda };

inline std::string_view name_of(backend b) {
    switch (b) {
    case backend::ref: return "ref";
    case backend::cpu: return "cpu";
    case backend::cuda: return "cuda";
    }
    return "?";
}

// Wall time per op name, for `tandem bench`'s breakdown of a forward pass. Host ops only:
// on backend::cuda a call only queues work, so its time says nothing and is not recorded.
class op_profile {
public:
    struct entry {
        std::string_view name;
        int64_t calls = 0;
        double seconds = 0;
    };
    void record(std::string_view name, double seconds) {
        for (auto& e : entries_)
            if (e.name == name) {
                ++e.calls;
                e.seconds += seconds;
                return;
            }
        entries_.push_back({name, 1, seconds});
    }
    const std::vector<entry>& entries() const { return entries_; }

private:
    std::vector<entry> entries_; // in order of first call; a forward has a dozen op kinds
};

// Everything an op needs to run: the backend and its execution resources.
struct exec_ctx {
    backend be = backend::cpu;
    cpu::thread_pool* pool = nullptr; // required by backend::cpu
    // Required by backend::cuda: the device, stream and cuBLASLt handle (cuda/device.hpp),
    // opaque here so runtime/ includes no CUDA header; making one fills the ops' CUDA slots
    // (cuda::register_ops). On backend::cuda an op's pointers are device memory and it is
    // queued on the context's stream; each op header says what stays on the host (block
    // tables, biases).
    cuda::context* cuda = nullptr;
    op_profile* profile = nullptr; // when set, host ops add their wall time here
    // Backend memory for a forward's activations (runtime/ops/scratch.hpp), required by
    // model::forward on backend::cuda; host backends fall back to the model's own.
    scratch_arena* scratch = nullptr;
};

// Op is a struct with a `name`, static `ref(...)` and `cpu(pool, ...)` members and optionally a
// `cuda_impl(context, ...)` slot (runtime/ops/op_defs.hpp); a backend the op lacks, or whose
// slot nothing filled, is an error naming both.
template <class Op, class... Args>
void dispatch(const exec_ctx& ctx, Args&&... args) {
    if (ctx.profile != nullptr && ctx.be != backend::cuda) {
        exec_ctx plain = ctx;
        plain.profile = nullptr;
        const auto t0 = std::chrono::steady_clock::now();
        dispatch<Op>(plain, std::forward<Args>(args)...);
        ctx.profile->record(Op::name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        return;
    }
    switch (ctx.be) {
    case backend::ref: Op::ref(std::forward<Args>(args)...); return;
    case backend::cpu:
        TANDEM_ASSERT(ctx.pool != nullptr, "op {} on the CPU needs a thread pool", Op::name);
        Op::cpu(*ctx.pool, std::forward<Args>(args)...);
        return;
    case backend::cuda:
        if constexpr (requires { Op::cuda_impl; }) {
            if (Op::cuda_impl != nullptr) {
                TANDEM_ASSERT(ctx.cuda != nullptr, "op {} on CUDA needs a cuda::context", Op::name);
                Op::cuda_impl(*ctx.cuda, std::forward<Args>(args)...);
                return;
            }
        }
        break;
    }
    fail("op {} has no {} implementation", Op::name, name_of(ctx.be));
}

} // namespace tandem
