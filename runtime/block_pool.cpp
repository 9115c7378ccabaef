// Block pool: reference counts, the free list in eviction order, and prefix-cache hashes.
#include "runtime/block_pool.hpp"

#include "runtime/error.hpp"

#include <algorithm>

namespace tandem {

block_pool::block_pool(int32_t n_pages)
    : ref_(size_t(n_pages), 0), prev_(size_t(n_pages), none), next_(size_t(n_pages), none),
      has_hash_(size_t(n_pages), 0), hash_(size_t(n_pages), 0), gen_(size_t(n_pages), 0) {
    TANDEM_ASSERT(n_pages > 0);
    // page 0 first, like the LIFO stack this list replaced
    for (int32_t p = 0; p < n_pages; ++p) push_back(p);
}

void block_pool::unlink(int32_t p) {
    const int32_t a = prev_[size_t(p)], b = next_[size_t(p)];
    (a == none ? head_ : next_[size_t(a)]) = b;
    (b == none ? tail_ : prev_[size_t(b)]) = a;
    prev_[size_t(p)] = next_[size_t(p)] = none;
    --n_free_;
    if (has_hash_[size_t(p)]) --n_cached_;
}

void block_pool::push_front(int32_t p) {
    prev_[size_t(p)] = none;
    next_[size_t(p)] = head_;
    (head_ == none ? tail_ : prev_[size_t(head_)]) = p;
    head_ = p;
    ++n_free_;
    if (has_hash_[size_t(p)]) ++n_cached_;
}

void block_pool::push_back(int32_t p) {
    next_[size_t(p)] = none;
    prev_[size_t(p)] = tail_;
    (tail_ == none ? head_ : next_[size_t(tail_)]) = p;
    tail_ = p;
    ++n_free_;
    if (has_hash_[size_t(p)]) ++n_cached_;
}

std::optional<std::vector<int32_t>> block_pool::allocate(int32_t n) {
    if (n < 0 || n > n_free_) return std::nullopt;
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (auto& p : out) {
        p = head_;
        unlink(p);
        TANDEM_ASSERT(ref_[size_t(p)] == 0);
        ref_[size_t(p)] = 1;
        ++gen_[size_t(p)]; // whatever it held is void: its next contents are new
        if (has_hash_[size_t(p)]) { // evicted: its cached prefix is gone
            by_hash_.erase(hash_[size_t(p)]);
            has_hash_[size_t(p)] = 0;
            evicted_.push_back(p);
        }
    }
    n_used_peak_ = std::max(n_used_peak_, n_pages() - n_free_);
    return out;
}

void block_pool::add_ref(int32_t p) {
    TANDEM_ASSERT(p >= 0 && p < n_pages(), "page {}", p);
    if (ref_[size_t(p)] == 0) {
        TANDEM_ASSERT(has_hash_[size_t(p)], "add_ref of free page {} without a hash", p);
        unlink(p);
        n_used_peak_ = std::max(n_used_peak_, n_pages() - n_free_);
    }
    ++ref_[size_t(p)];
}

void block_pool::release(std::span<const int32_t> pages) {
    for (int32_t p : pages) {
        TANDEM_ASSERT(p >= 0 && p < n_pages() && ref_[size_t(p)] > 0, "page {}", p);
        if (--ref_[size_t(p)] > 0) continue;
        if (has_hash_[size_t(p)]) push_back(p);
        else push_front(p);
    }
}

int32_t block_pool::ref_count(int32_t p) const {
    TANDEM_ASSERT(p >= 0 && p < n_pages());
    return ref_[size_t(p)];
}

uint32_t block_pool::generation(int32_t p) const {
    TANDEM_ASSERT(p >= 0 && p < n_pages());
    return gen_[size_t(p)];
}

void block_pool::renew(int32_t p) {
    TANDEM_ASSERT(p >= 0 && p < n_pages() && ref_[size_t(p)] == 1 && !has_hash_[size_t(p)],
                  "page {} renewed while shared or cached", p);
    ++gen_[size_t(p)];
}

bool block_pool::set_hash(int32_t p, uint64_t hash) {
    TANDEM_ASSERT(p >= 0 && p < n_pages() && ref_[size_t(p)] > 0, "set_hash of page {}", p);
    if (has_hash_[size_t(p)]) return hash_[size_t(p)] == hash;
    if (by_hash_.contains(hash)) return false;
    by_hash_.emplace(hash, p);
    has_hash_[size_t(p)] = 1;
    hash_[size_t(p)] = hash;
    return true;
}

std::optional<int32_t> block_pool::lookup(uint64_t hash) const {
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) return std::nullopt;
    return it->second;
}

std::optional<uint64_t> block_pool::hash_of(int32_t p) const {
    TANDEM_ASSERT(p >= 0 && p < n_pages());
    if (!has_hash_[size_t(p)]) return std::nullopt;
    return hash_[size_t(p)];
}

void block_pool::drop_hash(int32_t p) {
    TANDEM_ASSERT(p >= 0 && p < n_pages());
    if (!has_hash_[size_t(p)]) return;
    const bool is_free = ref_[size_t(p)] == 0;
    if (is_free) unlink(p);
    by_hash_.erase(hash_[size_t(p)]);
    has_hash_[size_t(p)] = 0;
    if (is_free) push_front(p);
}

bool block_pool::restore_cached(int32_t p, uint64_t hash) {
    TANDEM_ASSERT(p >= 0 && p < n_pages() && ref_[size_t(p)] == 0 && !has_hash_[size_t(p)]);
    if (by_hash_.contains(hash)) return false;
    unlink(p);
    by_hash_.emplace(hash, p);
    has_hash_[size_t(p)] = 1;
    hash_[size_t(p)] = hash;
    ++gen_[size_t(p)]; // contents from the last run: no device copy of this pool's past is trusted
    push_back(p);
    return true;
}

std::vector<int32_t> block_pool::take_evicted() {
    std::vector<int32_t> out;
    out.swap(evicted_);
    return out;
}

std::vector<int32_t> block_pool::free_list() const {
    std::vector<int32_t> out;
    for (int32_t p = head_; p != none; p = next_[size_t(p)]) out.push_back(p);
    return out;
}

uint64_t prefix_hash(uint64_t parent, std::span<const int32_t> page_tokens) {
    // FNV-1a over the parent hash and the tokens' bytes, then a 64-bit finalizer (splitmix)
    // so that nearby inputs spread over the whole word.
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](uint64_t v) {
        for (int i = 0; i < 8; ++i) {
            h ^= (v >> (8 * i)) & 0xff;
            h *= 0x100000001b3ull;
        }
    };
    mix(parent);
    mix(page_tokens.size());
    for (int32_t t : page_tokens) mix(uint64_t(uint32_t(t)));
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

} // namespace tandem
