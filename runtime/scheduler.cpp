// Scheduler: admission with prefix reuse, batch planning, page growth and preemption.
#include "runtime/scheduler.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <unordered_map>

namespace tandem {

using clock_type = std::chrono::steady_clock;

struct scheduler::seq {
    uint64_t id = 0;
    int32_t priority = 0;
    clock_type::time_point arrival{};
    uint64_t arrival_no = 0;          // ties in arrival order
    std::vector<token_id> tokens;     // prompt + generated
    int32_t n_prompt = 0;
    int32_t n_computed = 0;           // positions whose K/V are in the pages
    std::vector<int32_t> pages;       // block table
    std::vector<uint32_t> gens;       // [pages] their generations, filled when a batch takes it
    std::vector<uint64_t> hashes;     // prefix hashes of the leading full computed pages
    int busy = -1;                    // slot of the batch running it
    int32_t n_inflight = 0;           // tokens that batch computes
    bool running = false;             // admitted: holds pages
    bool admitted_once = false;
    int32_t reused = 0;               // prefix tokens reused at first admission
};

scheduler::scheduler(const scheduler_options& o, page_store* store)
    : o_(o), store_(store), pool_(o.n_pages), page_tokens_(size_t(o.n_pages) * size_t(o.page_size), 0),
      page_parent_(size_t(o.n_pages), 0) {
    TANDEM_ASSERT(o_.page_size > 0 && o_.n_pages > 0 && o_.max_running > 0 && o_.step_tokens > 0);
}

scheduler::~scheduler() = default;

scheduler::seq& scheduler::get(uint64_t id) {
    auto it = seqs_.find(id);
    TANDEM_ASSERT(it != seqs_.end(), "unknown sequence {}", id);
    return *it->second;
}

const scheduler::seq& scheduler::get(uint64_t id) const {
    auto it = seqs_.find(id);
    TANDEM_ASSERT(it != seqs_.end(), "unknown sequence {}", id);
    return *it->second;
}

void scheduler::add(uint64_t id, std::vector<token_id> prompt, int32_t priority, clock_type::time_point now) {
    TANDEM_ASSERT(!prompt.empty() && !seqs_.contains(id));
    auto s = std::make_unique<seq>();
    s->id = id;
    s->priority = priority;
    s->arrival = now;
    s->arrival_no = ++arrivals_;
    s->n_prompt = int32_t(prompt.size());
    s->tokens = std::move(prompt);
    waiting_.push_back(s.get());
    seqs_.emplace(id, std::move(s));
}

void scheduler::remove(uint64_t id) {
    seq& s = get(id);
    TANDEM_ASSERT(s.busy < 0, "sequence {} removed while a batch runs it", id);
    free_pages(s);
    std::erase(waiting_, &s);
    std::erase(running_, &s);
    seqs_.erase(id);
}

bool scheduler::contains(uint64_t id) const { return seqs_.contains(id); }
bool scheduler::busy(uint64_t id) const { return get(id).busy >= 0; }

void scheduler::append(uint64_t id, token_id t) {
    seq& s = get(id);
    TANDEM_ASSERT(s.busy < 0 && s.n_computed == int32_t(s.tokens.size()));
    s.tokens.push_back(t);
}

std::span<const token_id> scheduler::tokens(uint64_t id) const { return get(id).tokens; }

int32_t scheduler::reused_tokens(uint64_t id) const { return get(id).reused; }

double scheduler::effective_priority(const seq& s, clock_type::time_point now) const {
    if (o_.priority_aging_s <= 0) return s.priority;
    const double waited = std::chrono::duration<double>(now - s.arrival).count();
    return s.priority + std::floor(std::max(0.0, waited) / o_.priority_aging_s);
}

bool scheduler::page_matches(int32_t page, uint64_t parent, std::span<const token_id> tokens) const {
    if (page_parent_[size_t(page)] != parent) return false;
    const int32_t* pt = &page_tokens_[size_t(page) * size_t(o_.page_size)];
    return std::equal(tokens.begin(), tokens.end(), pt);
}

void scheduler::note_evicted() {
    for (int32_t p : pool_.take_evicted())
        if (store_) store_->cleared(p);
}

bool scheduler::try_admit(seq& s) {
    const int32_t ps = o_.page_size;
    const int32_t n_tok = int32_t(s.tokens.size());
    std::vector<int32_t> match;
    std::vector<uint64_t> hashes;
    if (o_.prefix_cache) {
        uint64_t parent = o_.prefix_seed;
        for (int32_t j = 0; int64_t(j + 1) * ps <= n_tok; ++j) {
            const auto chunk = std::span(s.tokens).subspan(size_t(j) * size_t(ps), size_t(ps));
            const uint64_t h = prefix_hash(parent, chunk);
            const auto p = pool_.lookup(h);
            if (!p || !page_matches(*p, parent, chunk)) break;
            match.push_back(*p);
            hashes.push_back(h);
            parent = h;
        }
    }
    // At least the last token is computed again: its logits are what the request needs.
    const int32_t reuse = std::min(int32_t(match.size()) * ps, n_tok - 1);
    const int32_t n_shared = reuse / ps;
    const bool cow = reuse % ps != 0; // the match ends inside a cached page: copy it
    const int32_t n_new = pages_for(n_tok) - n_shared;
    int32_t n_revive = 0;
    for (int32_t j = 0; j < n_shared; ++j) n_revive += pool_.ref_count(match[size_t(j)]) == 0;
    const int32_t cow_src = cow ? match[size_t(n_shared)] : -1;
    const int32_t n_hold_src = cow && pool_.ref_count(cow_src) == 0 ? 1 : 0;
    // Pages are taken as the tokens are computed (plan), so a sequence holds at most one
    // partly filled page; admission only checks that the pages every admitted sequence
    // will still need for its present tokens are free, so prefill does not thrash.
    int32_t n_promised = 0;
    for (const seq* o : running_) n_promised += std::max(0, pages_for(int64_t(o->tokens.size())) - int32_t(o->pages.size()));
    if (n_new + n_revive + n_hold_src > pool_.n_free() - n_promised) return false;

    for (int32_t j = 0; j < n_shared; ++j) pool_.add_ref(match[size_t(j)]);
    if (cow) pool_.add_ref(cow_src); // keeps it from being evicted by the allocation below
    auto fresh = pool_.allocate(cow ? 1 : 0);
    TANDEM_ASSERT(fresh.has_value());
    note_evicted();
    if (cow) {
        if (store_) store_->copy_page(cow_src, (*fresh)[0]);
        const int32_t src[] = {cow_src};
        pool_.release(src);
    }
    s.pages.assign(match.begin(), match.begin() + n_shared);
    s.pages.insert(s.pages.end(), fresh->begin(), fresh->end());
    s.hashes.assign(hashes.begin(), hashes.begin() + n_shared);
    s.n_computed = reuse;
    if (!s.admitted_once) {
        s.admitted_once = true;
        s.reused = reuse;
        n_prompt_tokens_ += uint64_t(s.n_prompt);
        n_hit_tokens_ += uint64_t(std::min(reuse, s.n_prompt));
    }
    return true;
}

void scheduler::admit(clock_type::time_point now) {
    if (waiting_.empty()) return;
    std::stable_sort(waiting_.begin(), waiting_.end(), [&](const seq* a, const seq* b) {
        const double pa = effective_priority(*a, now), pb = effective_priority(*b, now);
        if (pa != pb) return pa > pb;
        return a->arrival_no < b->arrival_no;
    });
    while (!waiting_.empty() && int32_t(running_.size()) < o_.max_running) {
        seq& s = *waiting_.front();
        if (!try_admit(s)) break;
        s.running = true;
        running_.push_back(&s);
        admitted_.push_back(s.id);
        waiting_.erase(waiting_.begin());
    }
}

void scheduler::free_pages(seq& s) {
    // Last page first: the free list then keeps a prefix's first pages longest.
    std::vector<int32_t> rev(s.pages.rbegin(), s.pages.rend());
    if (!rev.empty()) pool_.release(rev);
    s.pages.clear();
    s.hashes.clear();
    s.n_computed = 0;
}

void scheduler::preempt(seq& s) {
    TANDEM_ASSERT(s.busy < 0 && s.running);
    free_pages(s);
    s.running = false;
    std::erase(running_, &s);
    waiting_.push_back(&s); // its old arrival keeps its place in the order
    preempted_.push_back(s.id);
    ++n_preemptions_;
}

bool scheduler::grow(seq& s, int32_t n_tokens) {
    const int32_t need = pages_for(n_tokens) - int32_t(s.pages.size());
    if (need <= 0) return true;
    const auto now = clock_type::now();
    while (pool_.n_free() < need) {
        // The victim is the lowest-priority, latest-arrived idle sequence, the requester
        // included: a request never pushes out one that ranks above it.
        seq* victim = &s;
        for (seq* o : running_) {
            if (o->busy >= 0 || o == &s) continue;
            const double po = effective_priority(*o, now), pv = effective_priority(*victim, now);
            if (po < pv || (po == pv && o->arrival_no > victim->arrival_no)) victim = o;
        }
        preempt(*victim);
        if (victim == &s) return false;
    }
    auto fresh = pool_.allocate(need);
    TANDEM_ASSERT(fresh.has_value());
    note_evicted();
    s.pages.insert(s.pages.end(), fresh->begin(), fresh->end());
    return true;
}

std::vector<planned_seq> scheduler::plan(int slot, work_kind kind) {
    TANDEM_ASSERT(slot >= 0);
    if (size_t(slot) >= batches_.size()) batches_.resize(size_t(slot) + 1);
    auto& batch = batches_[size_t(slot)];
    TANDEM_ASSERT(batch.empty(), "slot {} already has a batch in flight", slot);
    const bool decode = (uint8_t(kind) & uint8_t(work_kind::decode)) != 0;
    const bool prefill = (uint8_t(kind) & uint8_t(work_kind::prefill)) != 0;
    auto take = [&](seq& s, int32_t n) {
        s.busy = slot;
        s.n_inflight = n;
        batch.push_back(&s);
    };
    // Decodes first (one token each), then prefill chunks from the token budget. A copy of
    // the running list: growing may preempt (which edits running_).
    const std::vector<seq*> order = running_;
    int32_t budget = o_.step_tokens;
    if (decode) {
        for (seq* s : order) {
            if (!s->running || s->busy >= 0 || int32_t(s->tokens.size()) - s->n_computed != 1) continue;
            if (!grow(*s, s->n_computed + 1)) continue;
            take(*s, 1);
            --budget;
        }
    }
    if (prefill) {
        for (seq* s : order) {
            if (budget <= 0) break;
            if (!s->running || s->busy >= 0) continue;
            const int32_t pending = int32_t(s->tokens.size()) - s->n_computed;
            if (pending <= 1) continue;
            const int32_t n = std::min(pending, budget);
            if (!grow(*s, s->n_computed + n)) continue;
            take(*s, n);
            budget -= n;
        }
    }
    std::vector<planned_seq> out;
    out.reserve(batch.size());
    for (seq* s : batch) {
        planned_seq p;
        p.id = s->id;
        p.n_past = s->n_computed;
        p.tokens = std::span(s->tokens).subspan(size_t(s->n_computed), size_t(s->n_inflight));
        p.block_table = s->pages;
        // Stable until complete(): the pages of a busy sequence are referenced, so none is
        // allocated (or restored) again meanwhile.
        s->gens.resize(s->pages.size());
        for (size_t j = 0; j < s->pages.size(); ++j) s->gens[j] = pool_.generation(s->pages[j]);
        p.generations = s->gens;
        p.wants_logits = s->n_computed + s->n_inflight == int32_t(s->tokens.size());
        out.push_back(p);
    }
    return out;
}

void scheduler::publish_full_pages(seq& s) {
    const int32_t ps = o_.page_size;
    while (int64_t(s.hashes.size() + 1) * ps <= s.n_computed) {
        const size_t j = s.hashes.size();
        const uint64_t parent = j == 0 ? o_.prefix_seed : s.hashes[j - 1];
        const auto chunk = std::span(s.tokens).subspan(j * size_t(ps), size_t(ps));
        const uint64_t h = prefix_hash(parent, chunk);
        s.hashes.push_back(h);
        if (!o_.prefix_cache) continue;
        const int32_t page = s.pages[j];
        if (pool_.hash_of(page)) continue; // shared from the cache already
        if (!pool_.set_hash(page, h)) continue; // the same prefix is cached in another page
        std::copy(chunk.begin(), chunk.end(), &page_tokens_[size_t(page) * size_t(ps)]);
        page_parent_[size_t(page)] = parent;
        if (store_) store_->published(page, h, parent, chunk);
    }
}

std::vector<uint64_t> scheduler::complete(int slot, bool ok) {
    TANDEM_ASSERT(slot >= 0 && size_t(slot) < batches_.size());
    std::vector<uint64_t> due;
    for (seq* s : batches_[size_t(slot)]) {
        s->busy = -1;
        if (!ok) continue;
        s->n_computed += s->n_inflight;
        publish_full_pages(*s);
        if (s->n_computed == int32_t(s->tokens.size())) due.push_back(s->id);
    }
    batches_[size_t(slot)].clear();
    return due;
}

std::vector<uint64_t> scheduler::in_batch(int slot) const {
    std::vector<uint64_t> out;
    if (slot >= 0 && size_t(slot) < batches_.size())
        for (const seq* s : batches_[size_t(slot)]) out.push_back(s->id);
    return out;
}

std::vector<uint64_t> scheduler::take_preempted() {
    std::vector<uint64_t> out;
    out.swap(preempted_);
    return out;
}

std::vector<uint64_t> scheduler::take_admitted() {
    std::vector<uint64_t> out;
    out.swap(admitted_);
    return out;
}

bool scheduler::restore(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) {
    if (page < 0 || page >= pool_.n_pages() || int32_t(tokens.size()) != o_.page_size) return false;
    if (pool_.ref_count(page) != 0 || pool_.hash_of(page)) return false;
    if (prefix_hash(parent, tokens) != hash) return false; // not what we would have written
    if (!pool_.restore_cached(page, hash)) return false;
    std::copy(tokens.begin(), tokens.end(), &page_tokens_[size_t(page) * size_t(o_.page_size)]);
    page_parent_[size_t(page)] = parent;
    return true;
}

scheduler_stats scheduler::stats() const {
    scheduler_stats st;
    st.n_running = int32_t(running_.size());
    st.n_waiting = int32_t(waiting_.size());
    st.n_pages_used = pool_.n_pages() - pool_.n_free();
    st.n_pages_cached = pool_.n_cached();
    st.n_preemptions = n_preemptions_;
    st.n_prefix_hit_tokens = n_hit_tokens_;
    st.n_prompt_tokens = n_prompt_tokens_;
    // Positions held in referenced pages, those a batch is writing now included (their
    // pages were taken for them); a page shared by several sequences counts once, with the
    // most positions any of them has in it.
    const int32_t ps = o_.page_size;
    std::unordered_map<int32_t, int32_t> shared;
    for (const seq* s : running_) {
        const int32_t held = s->n_computed + (s->busy >= 0 ? s->n_inflight : 0);
        for (size_t j = 0; j < s->pages.size(); ++j) {
            const int32_t fill = std::clamp(held - int32_t(j) * ps, 0, ps);
            const int32_t p = s->pages[j];
            if (pool_.ref_count(p) > 1) shared[p] = std::max(shared[p], fill);
            else st.n_kv_tokens += fill;
        }
    }
    for (const auto& [p, fill] : shared) st.n_kv_tokens += fill;
    return st;
}

} // namespace tandem
