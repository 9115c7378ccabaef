// The scratch arena and the upload op.
#include "runtime/ops/scratch.hpp"

#include "runtime/ops/op_defs.hpp"

#include <cstring>
#include <new>

namespace tandem {

scratch_arena::scratch_arena(alloc_fn alloc) : alloc_(std::move(alloc)) {}

scratch_arena scratch_arena::host() {
    return scratch_arena([](size_t bytes) {
        constexpr std::align_val_t a{align};
        void* p = ::operator new(bytes, a);
        std::memset(p, 0, bytes); // resident now: a process's RSS holds its arena once reserved
        return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, a); });
    });
}

void* scratch_arena::take_bytes(size_t bytes) {
    bytes = (bytes + align - 1) / align * align;
    round_ += bytes;
    if (blocks_.empty() || used_ + bytes > blocks_.back().bytes) {
        // A block for this take and what may follow it; the reset merges the round's blocks.
        const size_t n = std::max(bytes, blocks_.empty() ? size_t(0) : blocks_.back().bytes);
        blocks_.push_back({alloc_(n), n});
        used_ = 0;
    }
    void* p = static_cast<uint8_t*>(blocks_.back().mem.get()) + used_;
    used_ += bytes;
    return p;
}

void scratch_arena::reset() {
    if (blocks_.size() > 1) { // the round outgrew one block: one block for all of it next time
        blocks_.clear();
        blocks_.push_back({alloc_(round_), round_});
    }
    used_ = 0;
    round_ = 0;
}

void scratch_arena::reserve(size_t bytes) {
    TANDEM_ASSERT(round_ == 0, "scratch_arena::reserve during a round");
    if (blocks_.size() == 1 && blocks_.back().bytes >= bytes) return;
    blocks_.clear();
    blocks_.push_back({alloc_(bytes), bytes});
}

size_t scratch_arena::capacity() const {
    size_t n = 0;
    for (const block& b : blocks_) n += b.bytes;
    return n;
}

namespace ops {
namespace {

// On host backends both are a memcpy.
template <class Op>
struct host_copy : Op {
    static void ref(void* dst, const void* src, size_t bytes) {
        if (bytes > 0) std::memcpy(dst, src, bytes);
    }
    static void cpu(::tandem::cpu::thread_pool&, void* dst, const void* src, size_t bytes) { ref(dst, src, bytes); }
};

} // namespace

void upload(const exec_ctx& ctx, void* dst, const void* src, size_t bytes) {
    dispatch<host_copy<upload_op>>(ctx, dst, src, bytes);
}

void copy(const exec_ctx& ctx, void* dst, const void* src, size_t bytes) {
    dispatch<host_copy<copy_op>>(ctx, dst, src, bytes);
}

} // namespace ops
} // namespace tandem
