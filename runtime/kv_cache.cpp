// Paged KV storage and per-sequence page tables.
#include "runtime/kv_cache.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tandem {

std::string_view name_of(kv_dtype t) {
    switch (t) {
    case kv_dtype::f32: return "f32";
    case kv_dtype::f16: return "f16";
    case kv_dtype::i8: return "int8";
    }
    return "?";
}

std::optional<kv_dtype> parse_kv_dtype(std::string_view s) {
    if (s == "f32") return kv_dtype::f32;
    if (s == "f16") return kv_dtype::f16;
    if (s == "int8" || s == "i8") return kv_dtype::i8;
    return std::nullopt;
}

void kv_cache::free_aligned::operator()(uint8_t* p) const { std::free(p); }

kv_cache::kv_cache(const kv_layout& layout, int32_t n_pages) : layout_(layout), n_pages_(n_pages) {
    TANDEM_ASSERT(layout.page_size > 0 && layout.n_layer > 0 && layout.n_head_kv > 0 && layout.head_dim > 0);
    const size_t n = std::max<size_t>(64, size_t(n_pages) * size_t(layout.page_bytes()));
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, n)));
    TANDEM_CHECK(data_ != nullptr, "cannot allocate {} bytes of KV cache", n);
    std::memset(data_.get(), 0, n); // unwritten positions read as zeros, never as garbage
    base_ = data_.get();
}

kv_cache::kv_cache(const kv_layout& layout, int32_t n_pages, uint8_t* base)
    : layout_(layout), n_pages_(n_pages), base_(base) {
    TANDEM_ASSERT(layout.page_size > 0 && layout.n_layer > 0 && layout.n_head_kv > 0 && layout.head_dim > 0);
    TANDEM_ASSERT(base != nullptr && reinterpret_cast<uintptr_t>(base) % 64 == 0);
}

bool sequence_kv::reserve(int32_t n_tokens) {
    const int32_t need = (n_tokens + page_size_ - 1) / page_size_ - int32_t(pages_.size());
    if (need <= 0) return true;
    auto got = pages_of_->allocate(need);
    if (!got) return false;
    pages_.insert(pages_.end(), got->begin(), got->end());
    return true;
}

void sequence_kv::clear() {
    if (!pages_.empty()) pages_of_->release(pages_);
    pages_.clear();
}

} // namespace tandem
