// The scheduler: which sequences run, which tokens each batch computes, and who owns which
// KV page (prefix cache, admission, preemption). Pure bookkeeping, no compute, no threads.
#pragma once

#include "runtime/block_pool.hpp"
#include "runtime/tokenizer.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace tandem {

struct scheduler_options {
    int32_t page_size = 16;
    int32_t n_pages = 0;
    int32_t max_running = 16;         // sequences admitted at once (a decode batch at most)
    int32_t step_tokens = 512;        // token budget of one prefill batch (chunked prefill)
    bool prefix_cache = true;
    uint64_t prefix_seed = 0;         // the model fingerprint: hashes of other models never match
    double priority_aging_s = 5;      // each this many seconds waited raises priority by one
};

// Where the page table of the prefix cache is kept besides the scheduler (the shared
// segment, so a restarted daemon finds its cache), and who copies pages.
class page_store {
public:
    virtual ~page_store() = default;
    // A full, computed page got a prefix hash.
    virtual void published(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) = 0;
    // A cached page was evicted or is about to be written: whatever is stored about it is void.
    virtual void cleared(int32_t page) = 0;
    // Copy-on-write of a cached page into a fresh one (before any batch uses `dst`).
    virtual void copy_page(int32_t src, int32_t dst) = 0;
};

// One sequence's share of a planned batch. The spans stay valid until the batch completes.
struct planned_seq {
    uint64_t id = 0;
    int32_t n_past = 0;
    std::span<const token_id> tokens;       // positions n_past .. n_past + tokens.size()
    std::span<const int32_t> block_table;   // covers every position up to the last one
    std::span<const uint32_t> generations;  // [block_table.size()] each page's block_pool generation
    bool wants_logits = false;              // the batch reaches the end of its tokens
};

enum class work_kind : uint8_t { prefill = 1, decode = 2, both = 3 };

struct scheduler_stats {
    int32_t n_running = 0, n_waiting = 0;
    int32_t n_pages_used = 0, n_pages_cached = 0;
    int64_t n_kv_tokens = 0;                // positions stored (or being written) in referenced pages, shared once
    uint64_t n_preemptions = 0;
    uint64_t n_prefix_hit_tokens = 0;       // prompt tokens reused at first admission
    uint64_t n_prompt_tokens = 0;           // prompt tokens at first admission
};

class scheduler {
public:
    scheduler(const scheduler_options& o, page_store* store);
    ~scheduler();

    const scheduler_options& options() const { return o_; }
    const block_pool& pool() const { return pool_; }

    // A new request waits; it joins (admit) in priority order, FIFO within a priority.
    void add(uint64_t id, std::vector<token_id> prompt, int32_t priority,
             std::chrono::steady_clock::time_point now);
    // Forgets a sequence and frees its pages. Not while a batch runs it (busy).
    void remove(uint64_t id);
    bool contains(uint64_t id) const;
    bool busy(uint64_t id) const;
    // The sampled token joins the sequence (it is computed by the next decode batch).
    void append(uint64_t id, token_id t);
    std::span<const token_id> tokens(uint64_t id) const;

    // Moves waiting sequences into the running set while there are batch slots and pages
    // for all their tokens (after prefix reuse). Strict order: a head that does not fit
    // blocks the ones behind it, so a large request is never starved by small ones.
    void admit(std::chrono::steady_clock::time_point now);

    // Plans the next batch for an executor that runs `kind` work: decode work is a sequence
    // with one token to compute, prefill work one with more (chunked to the token budget).
    // Allocates pages for the new positions, preempting lower-priority idle sequences if
    // the pool is short (freed, back to waiting, recomputed later). The planned sequences
    // are busy until complete().
    std::vector<planned_seq> plan(int slot, work_kind kind);
    // The batch `slot` ran is done (ok) or lost (its positions are not computed; the
    // sequences are planned again). Returns the ids whose logits are now due (sample them).
    std::vector<uint64_t> complete(int slot, bool ok);
    // Sequences in the batch of `slot` (e.g. to fail them after repeated crashes).
    std::vector<uint64_t> in_batch(int slot) const;

    // Ids preempted / admitted since the last call.
    std::vector<uint64_t> take_preempted();
    std::vector<uint64_t> take_admitted();
    // Prefix tokens reused when `id` was admitted (0 if none or not admitted yet).
    int32_t reused_tokens(uint64_t id) const;

    // Rebuilds a cached page from the persisted page table after a restart (call in LRU
    // order, before any request). False when it cannot be used (duplicate hash).
    bool restore(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens);

    scheduler_stats stats() const;
    // Pages a sequence of n tokens needs.
    int32_t pages_for(int64_t n_tokens) const { return int32_t((n_tokens + o_.page_size - 1) / o_.page_size); }

private:
    struct seq;
    seq& get(uint64_t id);
    const seq& get(uint64_t id) const;
    double effective_priority(const seq& s, std::chrono::steady_clock::time_point now) const;
    bool try_admit(seq& s);
    bool grow(seq& s, int32_t n_tokens);   // pages for n_tokens positions, preempting others
    void preempt(seq& s);
    void free_pages(seq& s);
    void publish_full_pages(seq& s);
    void note_evicted();
    bool page_matches(int32_t page, uint64_t parent, std::span<const token_id> tokens) const;

    scheduler_options o_;
    page_store* store_;
    block_pool pool_;
    std::vector<int32_t> page_tokens_;    // [n_pages, page_size] tokens of hashed pages
    std::vector<uint64_t> page_parent_;   // [n_pages] parent hash of hashed pages
    std::unordered_map<uint64_t, std::unique_ptr<seq>> seqs_;
    std::vector<seq*> waiting_;           // in arrival order
    std::vector<seq*> running_;           // in admission order
    std::vector<std::vector<seq*>> batches_; // [slot] the batch in flight
    std::vector<uint64_t> preempted_, admitted_;
    uint64_t n_preemptions_ = 0, n_hit_tokens_ = 0, n_prompt_tokens_ = 0;
    uint64_t arrivals_ = 0;
};

} // namespace tandem
