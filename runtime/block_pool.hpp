// Owner of KV page allocation: reference counts, a free list in eviction order, and the
// prefix cache's content hashes.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace tandem {

// Pages are either referenced (ref count > 0, owned by sequences) or free. A free page may
// still hold a cached prefix (it has a hash): it stays reusable until allocation evicts it.
// The free list is ordered for eviction: allocation takes from its head; a released page
// without a hash goes to the head (nothing is lost by reusing it), a released page with a
// hash goes to the tail (least recently used pages are evicted first). All operations are
// O(1) per page.
class block_pool {
public:
    explicit block_pool(int32_t n_pages);

    int32_t n_pages() const { return int32_t(ref_.size()); }
    // Pages allocation can hand out now: every unreferenced page, cached ones included.
    int32_t n_free() const { return n_free_; }
    // Unreferenced pages that still hold a cached prefix (a subset of n_free).
    int32_t n_cached() const { return n_cached_; }
    // The most pages referenced at once since the pool was made (its high-water mark).
    int32_t n_used_peak() const { return n_used_peak_; }

    // n pages, each with ref count 1 and no hash, taken from the head of the free list
    // (evicting cached pages if it gets to them); nullopt (and nothing taken) when fewer
    // than n are free.
    std::optional<std::vector<int32_t>> allocate(int32_t n);
    // One more reference to a referenced page, or revives a free cached page (it leaves the
    // free list with ref count 1). Asserts on a free page without a hash.
    void add_ref(int32_t page);
    // Drops one reference of each page, in order; a page whose count reaches 0 is free again
    // (head of the free list without a hash, tail with one).
    void release(std::span<const int32_t> pages);
    int32_t ref_count(int32_t page) const;
    // Changes whenever the page is given new contents: each allocate() (fresh data, a
    // copy-on-write target, an evicted cached page) and restore_cached(). It stays while the
    // contents stay, so a device copy of the page (page_mirror) can tell it is still good:
    // sharing a cached prefix (add_ref), release, set_hash and drop_hash keep it. Within one
    // generation positions are only appended, never rewritten. Starts at 0; wraps at 2^32.
    uint32_t generation(int32_t page) const;
    // A new generation for a page whose positions its one owner will rewrite (rejected
    // drafts): it must be referenced once and have no hash.
    void renew(int32_t page);

    // Prefix cache. A page gets a hash once it is full and its K/V are computed; the hash
    // keys the page's whole token prefix (see prefix_hash). If another page already has
    // this hash, the call does nothing and returns false (the first one stays the cached
    // copy). The page must be referenced.
    bool set_hash(int32_t page, uint64_t hash);
    // The page cached under `hash`, referenced or free.
    std::optional<int32_t> lookup(uint64_t hash) const;
    std::optional<uint64_t> hash_of(int32_t page) const;
    // Forgets a page's hash (a free cached page becomes a plain free page, moved to the head).
    void drop_hash(int32_t page);

    // Rebuilds a cached page after a restart: `page` must be free without a hash; it gets
    // `hash` and goes to the tail of the free list. Call in least-recently-used-first order.
    // Returns false (nothing changed) when the hash is already cached.
    bool restore_cached(int32_t page, uint64_t hash);

    // Pages evicted (their hash dropped by allocate) since the last call; lets the owner
    // clear whatever it mirrors per page (the shared segment's page table).
    std::vector<int32_t> take_evicted();

    // The free list from head to tail (tests and diagnostics).
    std::vector<int32_t> free_list() const;

private:
    void unlink(int32_t page);
    void push_front(int32_t page);
    void push_back(int32_t page);

    static constexpr int32_t none = -1;
    std::vector<int32_t> ref_;            // [n_pages] reference counts
    std::vector<int32_t> prev_, next_;    // [n_pages] free-list links (none at the ends)
    std::vector<uint8_t> has_hash_;       // [n_pages]
    std::vector<uint64_t> hash_;          // [n_pages] valid where has_hash_
    std::vector<uint32_t> gen_;           // [n_pages] generation of the contents
    std::unordered_map<uint64_t, int32_t> by_hash_;
    std::vector<int32_t> evicted_;
    int32_t head_ = none, tail_ = none;
    int32_t n_free_ = 0, n_cached_ = 0;
    int32_t n_used_peak_ = 0;
};

// The hash of a full page's whole prefix: chained over pages, so equal hashes mean equal
// token prefixes (up to 64-bit collisions, which the owner rules out by comparing tokens).
// `parent` is the previous page's hash, or the seed (the model fingerprint) for page 0.
uint64_t prefix_hash(uint64_t parent, std::span<const int32_t> page_tokens);

} // namespace tandem
