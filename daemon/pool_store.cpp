// The pool's page table as the scheduler's page store, and its restore after a restart.
#include "daemon/pool_store.hpp"

#include <algorithm>
#include <cstring>

namespace tandem::daemon {
namespace {

class pool_store final : public page_store {
public:
    explicit pool_store(ipc::kv_pool& pool) : pool_(pool) {
        // the LRU clock goes on from the last run's entries
        for (int32_t p = 0; p < pool.info().n_pages; ++p)
            if (pool.entry(p).state.load(std::memory_order_acquire) == 1) clock_ = std::max(clock_, pool.entry(p).last_use);
    }
    void published(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) override {
        pool_.publish_entry(page, hash, parent, tokens, ++clock_);
    }
    void cleared(int32_t page) override { pool_.clear_entry(page); }
    void copy_page(int32_t src, int32_t dst) override {
        const int64_t pb = pool_.info().layout.page_bytes();
        pool_.clear_entry(dst);
        std::memcpy(pool_.pages() + dst * pb, pool_.pages() + src * pb, size_t(pb));
    }

private:
    ipc::kv_pool& pool_;
    uint64_t clock_ = 0;
};

} // namespace

std::unique_ptr<page_store> make_pool_store(ipc::kv_pool& pool) {
    return std::make_unique<pool_store>(pool);
}

int32_t restore_prefix_cache(ipc::kv_pool& pool, scheduler& s) {
    const int32_t ps = pool.info().layout.page_size;
    struct cached {
        uint64_t last_use;
        int32_t page;
    };
    std::vector<cached> valid;
    for (int32_t p = 0; p < pool.info().n_pages; ++p) {
        const auto& e = pool.entry(p);
        if (e.state.load(std::memory_order_acquire) == 1 && e.n_tokens == ps) valid.push_back({e.last_use, p});
        else if (e.state.load(std::memory_order_relaxed) != 0) pool.clear_entry(p);
    }
    std::sort(valid.begin(), valid.end(), [](const cached& a, const cached& b) { return a.last_use < b.last_use; });
    int32_t n = 0;
    for (const auto& c : valid) {
        const auto& e = pool.entry(c.page);
        if (s.restore(c.page, e.hash, e.parent, pool.entry_tokens(c.page))) ++n;
        else pool.clear_entry(c.page); // unusable (a duplicate, or not what its hash says)
    }
    return n;
}

} // namespace tandem::daemon
