// The scheduler: which sequences run, which tokens each batch computes, and who owns which
// KV page (prefix cache, admission, preemption). Pure bookkeeping, no compute, no threads.
#pragma once

#include "runtime/batch.hpp"
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
    // A sequence with at most this many tokens to compute is decode work, one with more is
    // prefill work (a decode step carries 1..decode_tokens tokens of a sequence: drafts).
    int32_t decode_tokens = 1;
    int32_t max_logits = 0;           // logits rows one batch may ask for; 0: no limit
    bool prefix_cache = true;
    uint64_t prefix_seed = 0;         // the model fingerprint: hashes of other models never match
    double priority_aging_s = 5;      // each this many seconds waited raises priority by one
                                      // (a negative priority to -1 at most: background work)
    // Tokens of background work (sequences of a negative priority) one batch carries, decode
    // and prefill together; 0: no cap. It bounds how long a live request that arrives waits
    // for the batch in flight. While a live sequence has a prompt to compute, batches carry
    // no background work at all.
    int32_t background_step_tokens = 0;
    // > 0: every layer's attention window (model_config::kv_window()). A sequence's pages wholly
    // before what its next token sees (n_computed - kv_window + 1, less decode_tokens - 1 for the
    // drafts a verify step may reject) are released as soon as its computed count passes them:
    // its table keeps no_page there. 0: a sequence keeps all its pages (some layer is global).
    int32_t kv_window = 0;
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

enum class work_kind : uint8_t { prefill = 1, decode = 2, both = 3 };

struct scheduler_stats {
    int32_t n_running = 0, n_waiting = 0;
    int32_t n_pages_used = 0, n_pages_cached = 0;
    int32_t n_pages_peak = 0;               // the most pages referenced at once so far
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
    // Tokens join the sequence, computed or not (a sampled token, or drafts to verify); the
    // next batches compute them.
    void append(uint64_t id, token_id t);
    void append(uint64_t id, std::span<const token_id> t);
    // Cuts the sequence to its first n_tokens tokens (>= 1; rejected drafts): positions from
    // there are uncomputed again, pages past the end are released, and a page whose positions
    // will be rewritten gets a new generation (or, when shared or cached, is copied first).
    void truncate(uint64_t id, int32_t n_tokens);
    // A new sequence `child` with the tokens, computed positions and pages of `parent` (pages
    // shared: the first write to a shared page copies it). Neither may be busy; the child of
    // a running parent runs beyond max_running if it must (a request's group stays whole), the
    // child of a preempted one waits with it.
    void fork(uint64_t parent, uint64_t child);
    // Tokens at positions >= pos want rows when they are computed (drafts to verify, a
    // prompt to score or embed); the last token always does. Default: only the last. The
    // rows are logits, or hidden states for an embedding (`kind`, for all of its rows).
    void set_logits_from(uint64_t id, int32_t pos, row_kind kind = row_kind::logits);
    std::span<const token_id> tokens(uint64_t id) const;
    int32_t n_computed(uint64_t id) const;

    // Moves waiting sequences into the running set while there are batch slots and pages
    // for all their tokens (after prefix reuse). Strict order: a head that does not fit
    // blocks the ones behind it, so a large request is never starved by small ones. With
    // every slot taken, a head of a higher priority takes the place of the idle running
    // sequence of the lowest (preempted, as for pages): a live request never waits behind
    // background work. Priorities age from arrival, running or not, so the one preempted
    // never outranks the one that took its place later on (no ping-pong).
    void admit(std::chrono::steady_clock::time_point now);

    // Plans the next batch for an executor that runs `kind` work: decode work is a sequence
    // with 1..decode_tokens tokens to compute, prefill work one with more (chunked to the
    // token budget). Live work first: while a live sequence (priority >= 0) has prefill work,
    // in this batch or another slot's, no batch takes background work (priority < 0), and a
    // batch takes at most background_step_tokens of it otherwise (half of them kept for
    // prefill while a background sequence waits for one; background decodes take turns).
    // Allocates pages for the new positions (copying shared ones they write), preempting
    // lower-priority idle sequences if the pool is short (freed, back to waiting, recomputed
    // later). The planned sequences are busy until complete(); the batch stays
    // readable until the slot's next plan().
    const batch& plan(int slot, work_kind kind);
    // The batch `slot` ran is done (ok) or lost (its positions are not computed; the
    // sequences are planned again). Returns the ids whose logits are now due (sample them).
    std::vector<uint64_t> complete(int slot, bool ok);
    // Sequences in the batch of `slot` (e.g. to fail them after repeated crashes).
    std::vector<uint64_t> in_batch(int slot) const;

    // Ids preempted / admitted since the last call, of sequences not removed since.
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
    bool make_room(seq& s, int32_t n);     // n free pages, preempting others (false: s was preempted)
    // With every slot taken: preempts the idle running sequence of the lowest priority below
    // s's (the latest arrived of those); false when there is none.
    bool free_slot_for(const seq& s, std::chrono::steady_clock::time_point now);
    bool writable(seq& s, int32_t n_end);  // private pages for positions [n_computed, n_end)
    // Page j of s becomes private and unhashed: a shared page is copied into a free one; a
    // cached page only s holds goes back to the free list first, so it needs no free page and
    // is taken back (no copy) when it is the one allocation takes.
    void copy_on_write(seq& s, int32_t j);
    void preempt(seq& s);
    void free_pages(seq& s);
    void release_behind_window(seq& s); // kv_window: the pages no token of s reads again
    // kv_window: the first page a sequence with n_computed positions must still hold (0 without one).
    int32_t first_kept_page(int32_t n_computed) const;
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
    struct slot_batch {
        std::vector<seq*> seqs;
        batch b;
    };
    std::vector<std::unique_ptr<slot_batch>> batches_; // [slot] the batch in flight (stable: plan returns it)
    std::vector<uint64_t> preempted_, admitted_;
    uint64_t n_preemptions_ = 0, n_hit_tokens_ = 0, n_prompt_tokens_ = 0;
    uint64_t arrivals_ = 0;
    uint64_t takes_ = 0;
};

} // namespace tandem
