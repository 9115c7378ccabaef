// Where an op runs (reference, CPU, CUDA) and the one template that routes a call there.
#pragma once

#include "runtime/error.hpp"

#include <string_view>
#include <utility>

namespace tandem {

namespace cpu { class thread_pool; }
namespace cuda { class context; }

enum class backend { ref, cpu, cuda };

inline std::string_view name_of(backend b) {
    switch (b) {
    case backend::ref: return "ref";
    case backend::cpu: return "cpu";
    case backend::cuda: return "cuda";
    }
    return "?";
}

// Everything an op needs to run: the backend and its execution resources.
struct exec_ctx {
    backend be = backend::cpu;
    cpu::thread_pool* pool = nullptr; // required by backend::cpu
    // Required by backend::cuda: the device, stream and cuBLASLt handle (cuda/device.hpp),
    // opaque here so runtime/ includes no CUDA header. On backend::cuda an op's pointers are
    // device memory and it is queued on the context's stream; each op header says what stays
    // on the host (block tables, biases).
    cuda::context* cuda = nullptr;
};

// Op is a struct with a `name` and static `ref(...)`, `cpu(pool, ...)` and optionally
// `cuda(context, ...)` members; a backend the op lacks is an error naming both.
template <class Op, class... Args>
void dispatch(const exec_ctx& ctx, Args&&... args) {
    switch (ctx.be) {
    case backend::ref: Op::ref(std::forward<Args>(args)...); return;
    case backend::cpu:
        TANDEM_ASSERT(ctx.pool != nullptr, "op {} on the CPU needs a thread pool", Op::name);
        Op::cpu(*ctx.pool, std::forward<Args>(args)...);
        return;
    case backend::cuda:
        if constexpr (requires { Op::cuda(*ctx.cuda, std::forward<Args>(args)...); }) {
            TANDEM_ASSERT(ctx.cuda != nullptr, "op {} on CUDA needs a cuda::context", Op::name);
            Op::cuda(*ctx.cuda, std::forward<Args>(args)...);
            return;
        }
        break;
    }
    fail("op {} has no {} implementation", Op::name, name_of(ctx.be));
}

} // namespace tandem
