// Paged KV storage and per-sequence page tables.
#include "runtime/kv_cache.hpp"

#include "runtime/error.hpp"

#include <cstring>

namespace tandem {

kv_cache::kv_cache(const kv_layout& layout, int32_t n_pages)
    : layout_(layout), pool_(n_pages),
      data_(std::make_unique<float[]>(size_t(n_pages) * size_t(layout.page_floats()))) {
    TANDEM_ASSERT(layout.page_size > 0 && layout.n_layer > 0 && layout.n_head_kv > 0 && layout.head_dim > 0);
}

bool sequence_kv::reserve(int32_t n_tokens) {
    const int32_t ps = cache_->layout().page_size;
    const int32_t need = (n_tokens + ps - 1) / ps - int32_t(pages_.size());
    if (need <= 0) return true;
    auto got = cache_->pool().allocate(need);
    if (!got) return false;
    pages_.insert(pages_.end(), got->begin(), got->end());
    return true;
}

void sequence_kv::clear() {
    if (!pages_.empty()) cache_->pool().release(pages_);
    pages_.clear();
}

} // namespace tandem
