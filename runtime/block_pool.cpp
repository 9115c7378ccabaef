// Block pool: free list and reference counts of KV pages.
#include "runtime/block_pool.hpp"

#include "runtime/error.hpp"

namespace tandem {

block_pool::block_pool(int32_t n_pages) : ref_(size_t(n_pages), 0) {
    TANDEM_ASSERT(n_pages > 0);
    free_.reserve(size_t(n_pages));
    for (int32_t i = n_pages - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<std::vector<int32_t>> block_pool::allocate(int32_t n) {
    if (n < 0 || n > n_free()) return std::nullopt;
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (auto& p : out) {
        p = free_.back();
        free_.pop_back();
        TANDEM_ASSERT(ref_[size_t(p)] == 0);
        ref_[size_t(p)] = 1;
    }
    return out;
}

void block_pool::add_ref(int32_t page) {
    TANDEM_ASSERT(page >= 0 && page < n_pages() && ref_[size_t(page)] > 0);
    ++ref_[size_t(page)];
}

void block_pool::release(std::span<const int32_t> pages) {
    for (int32_t p : pages) {
        TANDEM_ASSERT(p >= 0 && p < n_pages() && ref_[size_t(p)] > 0, "page {}", p);
        if (--ref_[size_t(p)] == 0) free_.push_back(p);
    }
}

int32_t block_pool::ref_count(int32_t page) const {
    TANDEM_ASSERT(page >= 0 && page < n_pages());
    return ref_[size_t(page)];
}

} // namespace tandem
