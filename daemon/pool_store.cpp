// The pool's page table as the scheduler's page store, and its restore after a restart; all
// through the file's descriptor (kv_pool::read_entry), never the mapping.
#include "daemon/pool_store.hpp"

#include <algorithm>

namespace tandem::daemon {
namespace {

class pool_store final : public page_store {
public:
    explicit pool_store(ipc::kv_pool& pool) : pool_(pool) {
        // the LRU clock goes on from the last run's entries
        for (int32_t p = 0; p < pool.info().n_pages; ++p)
            if (const auto e = pool.read_entry(p); e.state == 1) clock_ = std::max(clock_, e.last_use);
    }
    void published(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) override {
        pool_.publish_entry(page, hash, parent, tokens, ++clock_);
    }
    void cleared(int32_t page) override { pool_.clear_entry(page); }
    void copy_page(int32_t src, int32_t dst) override {
        pool_.clear_entry(dst);
        pool_.copy_page(src, dst);
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
        int32_t page;
        ipc::kv_pool::entry_copy e;
    };
    std::vector<cached> valid;
    for (int32_t p = 0; p < pool.info().n_pages; ++p) {
        auto e = pool.read_entry(p);
        if (e.state == 1 && e.n_tokens == ps) valid.push_back({p, std::move(e)});
        else if (e.state != 0) pool.clear_entry(p);
    }
    std::sort(valid.begin(), valid.end(), [](const cached& a, const cached& b) { return a.e.last_use < b.e.last_use; });
    int32_t n = 0;
    for (const auto& c : valid) {
        if (s.restore(c.page, c.e.hash, c.e.parent, c.e.tokens)) ++n;
        else pool.clear_entry(c.page); // unusable (a duplicate, or not what its hash says)
    }
    return n;
}

} // namespace tandem::daemon
