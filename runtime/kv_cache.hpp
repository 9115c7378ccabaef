// The KV cache as fixed-size pages: page storage and its layout; per-sequence block tables
// for code that runs a model without a scheduler.
#pragma once

#include "runtime/block_pool.hpp"
#include "runtime/kv_layout.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

class kv_cache {
public:
    kv_cache(const kv_layout& layout, int32_t n_pages);
    // A view of pages someone else owns (the shared-memory pool of a worker): `base` holds
    // n_pages pages of layout.page_bytes(), 64-byte aligned.
    kv_cache(const kv_layout& layout, int32_t n_pages, uint8_t* base);

    const kv_layout& layout() const { return layout_; }

    // Page 0 (64-byte aligned); kernels index pages with layout().page_bytes().
    uint8_t* base() { return base_; }
    const uint8_t* base() const { return base_; }
    int32_t n_pages() const { return n_pages_; }
    int64_t bytes() const { return int64_t(n_pages_) * layout_.page_bytes(); }

private:
    struct free_aligned {
        void operator()(uint8_t* p) const;
    };

    kv_layout layout_;
    int32_t n_pages_ = 0;
    std::unique_ptr<uint8_t[], free_aligned> data_; // null for a view
    uint8_t* base_ = nullptr;
};

// The pages of one sequence, taken from a block_pool (the one page allocator; the engine's is
// its scheduler's) by code that runs a model without a scheduler: offline evaluation,
// benchmarks, tests. Pages are page_size positions each.
class sequence_kv {
public:
    sequence_kv(block_pool& pages, int32_t page_size) : pages_of_(&pages), page_size_(page_size) {}
    ~sequence_kv() { clear(); }
    sequence_kv(const sequence_kv&) = delete;
    sequence_kv& operator=(const sequence_kv&) = delete;

    // Makes room for n_tokens positions; false (nothing changed) when the pool is short.
    bool reserve(int32_t n_tokens);
    void clear(); // returns every page to the pool

    const std::vector<int32_t>& block_table() const { return pages_; }
    int32_t capacity() const { return int32_t(pages_.size()) * page_size_; }

private:
    block_pool* pages_of_;
    int32_t page_size_;
    std::vector<int32_t> pages_;
};

} // namespace tandem
