// Backend memory for one forward's activations, and host inputs staged into it.
#pragma once

#include "runtime/ops/dispatch.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace tandem {

// Memory taken in order during a forward and released all at once by reset(). Pointers stay
// valid until then: when a take does not fit, a new block is added beside the old ones, and
// the reset after such a round replaces them all by one block that holds the whole round, so
// a steady workload allocates nothing. Not thread-safe: one per execution context.
class scratch_arena {
public:
    // n bytes of backend memory, aligned to at least `align`; freed when the last copy of the
    // pointer goes (on CUDA in stream order, so queued work that reads it still runs first).
    using alloc_fn = std::function<std::shared_ptr<void>(size_t bytes)>;
    static constexpr size_t align = 256; // cudaMalloc's alignment; cuBLASLt wants 16

    explicit scratch_arena(alloc_fn alloc);
    // Host memory, for the reference and the CPU.
    static scratch_arena host();

    template <class T> T* take(int64_t n) { return static_cast<T*>(take_bytes(size_t(std::max<int64_t>(n, 1)) * sizeof(T))); }
    void* take_bytes(size_t bytes);
    // Everything taken is free again (on CUDA: what was queued on it runs before later work).
    void reset();
    // Holds at least `bytes` in one block from now on (between rounds).
    void reserve(size_t bytes);
    size_t capacity() const; // bytes held

private:
    struct block {
        std::shared_ptr<void> mem;
        size_t bytes = 0;
    };
    alloc_fn alloc_;
    std::vector<block> blocks_; // takes come from the last one
    size_t used_ = 0;           // of the last block
    size_t round_ = 0;          // bytes taken since the reset, alignment included
};

namespace ops {

// Copies host memory to backend memory (on CUDA queued on the stream; the host array may
// change once this returns).
void upload(const exec_ctx& ctx, void* dst, const void* src, size_t bytes);
// Copies backend memory to backend memory (on CUDA queued on the stream).
void copy(const exec_ctx& ctx, void* dst, const void* src, size_t bytes);

// The host array as backend memory: itself on a host backend, else a copy in ctx.scratch.
template <class T>
const T* stage(const exec_ctx& ctx, std::span<const T> host) {
    if (ctx.be != backend::cuda) return host.data();
    TANDEM_ASSERT(ctx.scratch != nullptr, "staging on {} needs a scratch arena", name_of(ctx.be));
    T* dst = ctx.scratch->take<T>(int64_t(host.size()));
    if (!host.empty()) upload(ctx, dst, host.data(), host.size_bytes());
    return dst;
}

} // namespace ops
} // namespace tandem
