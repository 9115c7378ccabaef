// Scheduler: admission with prefix reuse, batch planning, page growth and preemption.
#include "runtime/scheduler.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <limits>
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
    int32_t logits_from = std::numeric_limits<int32_t>::max(); // positions from which tokens want rows
    row_kind rows = row_kind::logits;                            // what they hold
    std::vector<int32_t> pages;       // block table
    std::vector<uint32_t> gens;       // [pages] their generations, filled when a batch takes it
    std::vector<uint64_t> hashes;     // prefix hashes of the leading full computed pages
    int busy = -1;                    // slot of the batch running it
    int32_t n_inflight = 0;           // tokens that batch computes
    uint64_t last_taken = 0;          // when a batch last took it, in takes (turns of background decode)
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
    // no news of a sequence that is gone: the engine looks up what take_* report
    std::erase(preempted_, id);
    std::erase(admitted_, id);
    seqs_.erase(id);
}

bool scheduler::contains(uint64_t id) const { return seqs_.contains(id); }
bool scheduler::busy(uint64_t id) const { return get(id).busy >= 0; }

void scheduler::append(uint64_t id, token_id t) { append(id, std::span(&t, 1)); }

void scheduler::append(uint64_t id, std::span<const token_id> t) {
    seq& s = get(id);
    TANDEM_ASSERT(s.busy < 0, "sequence {} grows while a batch runs it", id);
    s.tokens.insert(s.tokens.end(), t.begin(), t.end());
}

void scheduler::truncate(uint64_t id, int32_t n_tokens) {
    seq& s = get(id);
    TANDEM_ASSERT(s.busy < 0 && n_tokens >= 1 && n_tokens <= int32_t(s.tokens.size()), "truncate {} to {} of {}", id,
                  n_tokens, s.tokens.size());
    s.tokens.resize(size_t(n_tokens));
    s.n_prompt = std::min(s.n_prompt, n_tokens);
    if (!s.running) return; // waiting: it holds no pages
    const int32_t ps = o_.page_size, old_computed = s.n_computed;
    s.n_computed = std::min(s.n_computed, n_tokens);
    while (int64_t(s.hashes.size()) * ps > s.n_computed) s.hashes.pop_back();
    // With a window, a cut further back than the released pages allow (more than a verify
    // step's drafts) leaves positions the next token sees without pages: recompute them all.
    if (o_.kv_window > 0) {
        const int32_t first = std::max(0, s.n_computed - o_.kv_window + 1) / ps;
        for (int32_t j = first; j < std::min(pages_for(s.n_computed + 1), int32_t(s.pages.size())); ++j)
            if (s.pages[size_t(j)] == no_page) {
                free_pages(s);
                return;
            }
    }
    const int32_t keep = pages_for(n_tokens);
    if (int32_t(s.pages.size()) > keep) {
        std::vector<int32_t> rev;
        for (auto it = s.pages.rbegin(); it != s.pages.rend() - keep; ++it)
            if (*it != no_page) rev.push_back(*it);
        pool_.release(rev);
        s.pages.resize(size_t(keep));
    }
    // Kept pages with positions from n_computed on that were computed will be rewritten: a
    // private page gets new contents (a device copy of it is stale); a shared or cached one is
    // copied when the rewrite is planned (writable).
    for (int32_t j = s.n_computed / ps; j < int32_t(s.pages.size()) && j * ps < old_computed; ++j) {
        const int32_t p = s.pages[size_t(j)];
        if (pool_.ref_count(p) == 1 && !pool_.hash_of(p)) pool_.renew(p);
    }
}

void scheduler::fork(uint64_t parent, uint64_t child) {
    seq& p = get(parent);
    TANDEM_ASSERT(p.busy < 0 && !seqs_.contains(child), "fork {} into {}", parent, child);
    auto c = std::make_unique<seq>(p);
    c->id = child;
    for (int32_t page : c->pages)
        if (page != no_page) pool_.add_ref(page); // (a windowed parent's released pages stay released)
    // A preempted parent (no pages) has a waiting child: both are recomputed when admitted.
    (p.running ? running_ : waiting_).push_back(c.get());
    seqs_.emplace(child, std::move(c));
}

void scheduler::set_logits_from(uint64_t id, int32_t pos, row_kind kind) {
    seq& s = get(id);
    s.logits_from = std::max(pos, 0);
    s.rows = kind;
}

std::span<const token_id> scheduler::tokens(uint64_t id) const { return get(id).tokens; }

int32_t scheduler::n_computed(uint64_t id) const { return get(id).n_computed; }

int32_t scheduler::reused_tokens(uint64_t id) const { return get(id).reused; }

double scheduler::effective_priority(const seq& s, clock_type::time_point now) const {
    if (o_.priority_aging_s <= 0) return s.priority;
    const double waited = std::chrono::duration<double>(now - s.arrival).count();
    const double aged = s.priority + std::floor(std::max(0.0, waited) / o_.priority_aging_s);
    // Background work (a negative priority) ages among itself, never up to the default 0.
    return s.priority < 0 ? std::min(aged, -1.0) : aged;
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
    std::vector<int32_t> match; // the cached page of each matched full page, or no_page
    std::vector<uint64_t> hashes;
    if (o_.prefix_cache) {
        uint64_t parent = o_.prefix_seed;
        // (positions that want logits rows, a prompt to score, are computed, not reused)
        for (int32_t j = 0; int64_t(j + 1) * ps <= std::min(n_tok, s.logits_from); ++j) {
            const auto chunk = std::span(s.tokens).subspan(size_t(j) * size_t(ps), size_t(ps));
            const uint64_t h = prefix_hash(parent, chunk);
            const auto p = pool_.lookup(h);
            const bool cached = p && page_matches(*p, parent, chunk);
            if (!cached && o_.kv_window <= 0) break; // (a window may not need this page: go on)
            match.push_back(cached ? *p : no_page);
            hashes.push_back(h);
            parent = h; // the chain's hashes come from the tokens, cached or not
        }
        // The longest match whose pages the first computed token reads are all cached: every
        // page without a window; with one, only those its window (and a verify step's slack)
        // reaches, the earlier ones staying no_page.
        int32_t m = int32_t(match.size());
        for (; m > 0; --m) {
            const int32_t from = first_kept_page(std::min(m * ps, n_tok - 1));
            if (std::all_of(match.begin() + from, match.begin() + m, [](int32_t p) { return p != no_page; })) {
                std::fill(match.begin(), match.begin() + from, no_page);
                break;
            }
        }
        match.resize(size_t(m));
        hashes.resize(size_t(m));
    }
    // At least the last token is computed again: its logits are what the request needs.
    const int32_t reuse = std::min(int32_t(match.size()) * ps, n_tok - 1);
    const int32_t n_shared = reuse / ps;
    const bool cow = reuse % ps != 0; // the match ends inside a cached page: copy it
    const int32_t n_new = pages_for(n_tok) - n_shared;
    int32_t n_revive = 0;
    for (int32_t j = 0; j < n_shared; ++j) n_revive += match[size_t(j)] != no_page && pool_.ref_count(match[size_t(j)]) == 0;
    // (a copied page that was free is revived and goes back before its copy is taken: no page)
    // Pages are taken as the tokens are computed (plan), so a sequence holds at most one
    // partly filled page; admission only checks that the pages every admitted sequence
    // will still need for its present tokens are free, so prefill does not thrash.
    int32_t n_promised = 0;
    for (const seq* o : running_) n_promised += std::max(0, pages_for(int64_t(o->tokens.size())) - int32_t(o->pages.size()));
    if (n_new + n_revive > pool_.n_free() - n_promised) return false;

    for (int32_t j = 0; j < n_shared + cow; ++j)
        if (match[size_t(j)] != no_page) pool_.add_ref(match[size_t(j)]);
    s.pages.assign(match.begin(), match.begin() + n_shared + cow);
    s.hashes.assign(hashes.begin(), hashes.begin() + n_shared);
    if (cow) copy_on_write(s, n_shared); // the admission check counted its page
    s.n_computed = reuse;
    release_behind_window(s); // matched pages before the window of the first token computed
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
    while (!waiting_.empty()) {
        seq& s = *waiting_.front();
        if (int32_t(running_.size()) >= o_.max_running && !free_slot_for(s, now)) break;
        if (!try_admit(s)) break;
        s.running = true;
        running_.push_back(&s);
        admitted_.push_back(s.id);
        waiting_.erase(waiting_.begin());
    }
}

bool scheduler::free_slot_for(const seq& s, clock_type::time_point now) {
    const double ps = effective_priority(s, now);
    seq* victim = nullptr;
    double pv = 0;
    for (seq* o : running_) {
        if (o->busy >= 0) continue;
        const double po = effective_priority(*o, now);
        if (po >= ps) continue;
        if (victim == nullptr || po < pv || (po == pv && o->arrival_no > victim->arrival_no)) {
            victim = o;
            pv = po;
        }
    }
    if (victim == nullptr) return false;
    preempt(*victim);
    return true;
}

void scheduler::free_pages(seq& s) {
    // Last page first: the free list then keeps a prefix's first pages longest.
    std::vector<int32_t> rev;
    for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it)
        if (*it != no_page) rev.push_back(*it);
    if (!rev.empty()) pool_.release(rev);
    s.pages.clear();
    s.hashes.clear();
    s.n_computed = 0;
}

int32_t scheduler::first_kept_page(int32_t n_computed) const {
    if (o_.kv_window <= 0) return 0;
    // The next token (position n_computed) sees n_computed - kv_window + 1 on; a verify step's
    // rejected drafts may move n_computed back by up to decode_tokens - 1 (truncate).
    return std::max(0, n_computed - (o_.kv_window - 1) - (o_.decode_tokens - 1)) / o_.page_size;
}

void scheduler::release_behind_window(seq& s) {
    if (o_.kv_window <= 0) return;
    const int32_t n_dead = std::min(first_kept_page(s.n_computed), int32_t(s.pages.size()));
    std::vector<int32_t> dead;
    for (int32_t j = n_dead - 1; j >= 0 && s.pages[size_t(j)] != no_page; --j) { // the last released before
        dead.push_back(s.pages[size_t(j)]);
        s.pages[size_t(j)] = no_page;
    }
    // Pages with a prefix hash stay cached on the free list, like any released page.
    if (!dead.empty()) pool_.release(dead);
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

bool scheduler::make_room(seq& s, int32_t need) {
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
    return true;
}

void scheduler::copy_on_write(seq& s, int32_t j) {
    const int32_t src = s.pages[size_t(j)];
    const int32_t old[] = {src};
    // A cached page only s holds (one a verify step filled with drafts since rejected) is
    // released first: it stays cached at the free list's tail, so a copy still reads it, and
    // when allocation takes it back (no other page free) it is evicted and kept as it is.
    const bool sole = pool_.ref_count(src) == 1;
    if (sole) pool_.release(old);
    auto fresh = pool_.allocate(1);
    TANDEM_ASSERT(fresh.has_value());
    note_evicted();
    if (store_ && (*fresh)[0] != src) store_->copy_page(src, (*fresh)[0]);
    if (!sole) pool_.release(old);
    s.pages[size_t(j)] = (*fresh)[0];
}

bool scheduler::writable(seq& s, int32_t n_end) {
    const int32_t ps = o_.page_size;
    for (int32_t j = s.n_computed / ps; j < int32_t(s.pages.size()) && j * ps < n_end; ++j) {
        const int32_t p = s.pages[size_t(j)];
        if (pool_.ref_count(p) == 1 && !pool_.hash_of(p)) continue;
        if (pool_.ref_count(p) > 1 && !make_room(s, 1)) return false; // a shared page needs a free one
        copy_on_write(s, j);
    }
    return true;
}

bool scheduler::grow(seq& s, int32_t n_tokens) {
    const int32_t need = pages_for(n_tokens) - int32_t(s.pages.size());
    if (need <= 0) return true;
    if (!make_room(s, need)) return false;
    auto fresh = pool_.allocate(need);
    TANDEM_ASSERT(fresh.has_value());
    note_evicted();
    s.pages.insert(s.pages.end(), fresh->begin(), fresh->end());
    return true;
}

const batch& scheduler::plan(int slot, work_kind kind) {
    TANDEM_ASSERT(slot >= 0);
    while (size_t(slot) >= batches_.size()) batches_.push_back(std::make_unique<slot_batch>());
    slot_batch& sb = *batches_[size_t(slot)];
    TANDEM_ASSERT(sb.seqs.empty(), "slot {} already has a batch in flight", slot);
    sb.b.clear();
    const bool decode = (uint8_t(kind) & uint8_t(work_kind::decode)) != 0;
    const bool prefill = (uint8_t(kind) & uint8_t(work_kind::prefill)) != 0;
    int32_t budget = o_.step_tokens;
    int32_t rows_left = o_.max_logits > 0 ? o_.max_logits : std::numeric_limits<int32_t>::max();
    // Logits rows of the next n tokens of s: those from logits_from on, and its last token.
    auto rows = [](const seq& s, int32_t n) {
        const int32_t n_tok = int32_t(s.tokens.size()), end = s.n_computed + n;
        int32_t r = std::max(0, end - std::max(s.logits_from, s.n_computed));
        if (end == n_tok && s.logits_from > n_tok - 1) ++r;
        return s.rows == row_kind::pooled ? std::min(r, 1) : r; // pooled tokens share one row
    };
    // Takes n tokens of s if its pages can be had (growing may preempt, which edits running_).
    auto take = [&](seq& s, int32_t n) {
        if (!grow(s, s.n_computed + n) || !writable(s, s.n_computed + n)) return false;
        s.busy = slot;
        s.n_inflight = n;
        s.last_taken = ++takes_;
        sb.seqs.push_back(&s);
        budget -= n;
        rows_left -= rows(s, n);
        return true;
    };
    auto pending = [](const seq& s) { return int32_t(s.tokens.size()) - s.n_computed; };
    auto background = [](const seq& s) { return s.priority < 0; };
    // Background work: none while a live prompt is computed anywhere, else a capped share.
    int32_t bg_left = o_.background_step_tokens > 0 ? o_.background_step_tokens : std::numeric_limits<int32_t>::max();
    int32_t bg_prefill_share = 0; // of bg_left, kept from background decodes for background prefill
    for (const seq* s : running_) {
        if (pending(*s) <= o_.decode_tokens) continue;
        if (!background(*s)) bg_left = 0;
        else if (prefill && s->busy < 0 && o_.background_step_tokens > 0) bg_prefill_share = bg_left / 2;
    }
    if (bg_left == 0) bg_prefill_share = 0;
    bool bg_taken = false;
    // Decodes first (a few tokens each, never split), then prefill chunks from the budget.
    std::vector<seq*> order = running_;
    if (decode) {
        // Background decodes in turns (least recently taken first) when the cap leaves some out.
        std::stable_sort(order.begin(), order.end(), [&](const seq* a, const seq* b) {
            if (background(*a) != background(*b)) return !background(*a);
            return background(*a) && a->last_taken < b->last_taken;
        });
        for (seq* s : order) {
            const int32_t n = pending(*s);
            if (!s->running || s->busy >= 0 || n < 1 || n > o_.decode_tokens) continue;
            // (the first background decode of a batch fits whatever its drafts, so none waits forever)
            if (background(*s) && (bg_left == 0 || (bg_taken && n > bg_left - bg_prefill_share))) continue;
            if (rows(*s, n) > rows_left) continue;
            if (take(*s, n) && background(*s)) {
                bg_left = std::max(0, bg_left - n);
                bg_taken = true;
            }
        }
        order = running_;
    }
    if (prefill) {
        for (seq* s : order) {
            if (budget <= 0) break;
            if (!s->running || s->busy >= 0) continue;
            const int32_t left = pending(*s);
            if (left <= o_.decode_tokens) continue;
            int32_t n = std::min(left, budget);
            if (background(*s)) n = std::min(n, bg_left);
            // A chunk asks for no more rows than are left (a scored prompt is chunked by them).
            if (rows(*s, n) > rows_left) {
                const int64_t first = std::max(s->logits_from, s->n_computed); // first position wanting a row
                n = int32_t(std::min<int64_t>(n, first - s->n_computed + rows_left));
                if (n == left && rows(*s, n) > rows_left) --n; // its last token's row does not fit
            }
            if (n <= 0) continue;
            if (take(*s, n) && background(*s)) bg_left -= n;
        }
    }
    for (seq* s : sb.seqs) {
        // Stable until complete(): the pages of a busy sequence are referenced, so none is
        // allocated (or restored) again meanwhile.
        s->gens.resize(s->pages.size());
        for (size_t j = 0; j < s->pages.size(); ++j)
            s->gens[j] = s->pages[j] == no_page ? 0 : pool_.generation(s->pages[j]);
        const int32_t last = int32_t(s->tokens.size()) - 1;
        sb.b.add_seq(s->id, s->n_computed, std::span(s->tokens).subspan(size_t(s->n_computed), size_t(s->n_inflight)),
                     s->pages, s->gens, std::min(s->logits_from, last), s->rows);
    }
    return sb.b;
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
        if (page == no_page || pool_.hash_of(page)) continue; // released, or shared from the cache already
        if (!pool_.set_hash(page, h)) continue; // the same prefix is cached in another page
        std::copy(chunk.begin(), chunk.end(), &page_tokens_[size_t(page) * size_t(ps)]);
        page_parent_[size_t(page)] = parent;
        if (store_) store_->published(page, h, parent, chunk);
    }
}

std::vector<uint64_t> scheduler::complete(int slot, bool ok) {
    TANDEM_ASSERT(slot >= 0 && size_t(slot) < batches_.size());
    std::vector<uint64_t> due;
    for (seq* s : batches_[size_t(slot)]->seqs) {
        s->busy = -1;
        if (!ok) continue;
        s->n_computed += s->n_inflight;
        publish_full_pages(*s);
        release_behind_window(*s);
        if (s->n_computed == int32_t(s->tokens.size())) due.push_back(s->id);
    }
    batches_[size_t(slot)]->seqs.clear();
    return due;
}

std::vector<uint64_t> scheduler::in_batch(int slot) const {
    std::vector<uint64_t> out;
    if (slot >= 0 && size_t(slot) < batches_.size())
        for (const seq* s : batches_[size_t(slot)]->seqs) out.push_back(s->id);
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
    st.n_pages_peak = pool_.n_used_peak();
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
            if (p == no_page) continue;
            if (pool_.ref_count(p) > 1) shared[p] = std::max(shared[p], fill);
            else st.n_kv_tokens += fill;
        }
    }
    for (const auto& [p, fill] : shared) st.n_kv_tokens += fill;
    return st;
}

} // namespace tandem
