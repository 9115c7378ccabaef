// Owner of KV page allocation: a free list, reference counts, and all-or-nothing allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace tandem {

class block_pool {
public:
    explicit block_pool(int32_t n_pages);

    int32_t n_pages() const { return int32_t(ref_.size()); }
    int32_t n_free() const { return int32_t(free_.size()); }

    // n pages, each with ref count 1; nullopt (and nothing taken) when fewer are free.
    std::optional<std::vector<int32_t>> allocate(int32_t n);
    void add_ref(int32_t page);
    // Drops one reference of each page; a page whose count reaches 0 is free again.
    void release(std::span<const int32_t> pages);
    int32_t ref_count(int32_t page) const;

private:
    std::vector<int32_t> free_;   // LIFO keeps recently used pages warm in cache
    std::vector<int32_t> ref_;    // [n_pages]
};

} // namespace tandem
