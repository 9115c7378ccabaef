// Page mirror: which host KV pages a device holds, of which generation, how much of each.
#include "runtime/page_mirror.hpp"

#include "runtime/error.hpp"

#include <algorithm>

namespace tandem {
namespace {

// Appends a copy; a whole page right after a run of whole pages consecutive on both sides
// joins the run (one copy of many pages).
void add_copy(std::vector<page_copy>& out, const page_copy& c) {
    if (c.whole && !out.empty()) {
        page_copy& last = out.back();
        if (last.whole && last.host_page + last.n_pages == c.host_page && last.dev_page + last.n_pages == c.dev_page) {
            last.n_pages += c.n_pages;
            return;
        }
    }
    out.push_back(c);
}

} // namespace

void page_mirror::reset(int32_t capacity, int32_t n_host_pages, int32_t page_size) {
    TANDEM_ASSERT(capacity >= 0 && n_host_pages >= 0 && page_size > 0);
    capacity_ = std::min(capacity, n_host_pages);
    page_size_ = page_size;
    slot_of_.assign(size_t(n_host_pages), none);
    index_.assign(size_t(n_host_pages), none);
    const size_t c = size_t(capacity_);
    host_of_.assign(c, none);
    gen_.assign(c, 0);
    known_.assign(c, 0);
    valid_.assign(c, 0);
    prev_.assign(c, none);
    next_.assign(c, none);
    free_.clear();
    for (int32_t d = capacity_ - 1; d >= 0; --d) free_.push_back(d); // page 0 is taken first
    head_ = tail_ = none;
    n_resident_ = 0;
    touched_.clear();
    pending_.clear();
    prepared_ = false;
}

void page_mirror::forget() { reset(capacity_, n_host_pages(), page_size_); }

int32_t page_mirror::dev_page_of(int32_t host_page) const {
    TANDEM_ASSERT(host_page >= 0 && host_page < n_host_pages());
    return slot_of_[size_t(host_page)];
}

int32_t page_mirror::valid_of(int32_t host_page) const {
    const int32_t d = dev_page_of(host_page);
    return d == none ? 0 : valid_[size_t(d)];
}

void page_mirror::unlink(int32_t d) {
    const int32_t a = prev_[size_t(d)], b = next_[size_t(d)];
    (a == none ? head_ : next_[size_t(a)]) = b;
    (b == none ? tail_ : prev_[size_t(b)]) = a;
    prev_[size_t(d)] = next_[size_t(d)] = none;
}

void page_mirror::to_tail(int32_t d) {
    if (identity()) return; // nothing is ever evicted: no order to keep
    if (tail_ == d) return;
    if (prev_[size_t(d)] != none || head_ == d) unlink(d);
    prev_[size_t(d)] = tail_;
    next_[size_t(d)] = none;
    (tail_ == none ? head_ : next_[size_t(tail_)]) = d;
    tail_ = d;
}

int32_t page_mirror::assign(int32_t page) {
    int32_t d;
    if (identity()) {
        d = page;
    } else if (!free_.empty()) {
        d = free_.back();
        free_.pop_back();
    } else {
        // The least recently used page; the batch's own resident pages were moved to the
        // tail first, and it touches no more pages than there are, so this is not one of them.
        d = head_;
        TANDEM_ASSERT(d != none && index_[size_t(host_of_[size_t(d)])] == none, "no device page to evict");
        slot_of_[size_t(host_of_[size_t(d)])] = none;
        unlink(d);
        --n_resident_;
    }
    host_of_[size_t(d)] = page;
    slot_of_[size_t(page)] = d;
    known_[size_t(d)] = 0; // new contents: nothing valid
    valid_[size_t(d)] = 0;
    ++n_resident_;
    return d;
}

bool page_mirror::prepare(const batch& b, mirror_plan& plan) {
    TANDEM_ASSERT(!prepared_, "prepare twice without commit or forget");
    const int32_t ps = page_size_;
    plan.tables.clear();
    plan.table_begin.clear();
    plan.uploads.clear();
    plan.writes.clear();
    plan.n_pages = 0;
    plan.n_upload_slots = plan.n_kept_slots = 0;

    // Pass 1: what each distinct page needs (validated before anything changes).
    touched_.clear();
    auto clear_index = [&] {
        for (const touched& t : touched_) index_[size_t(t.page)] = none;
    };
    try {
        for (int32_t i = 0; i < b.n_seqs(); ++i) {
            const auto table = b.table(i);
            const auto gens = b.table_generations(i);
            const int64_t n_past = b.n_past(i), n_end = n_past + b.n_new(i);
            const int64_t n_pages = (n_end + ps - 1) / ps;
            TANDEM_CHECK(n_past >= 0 && int64_t(table.size()) >= n_pages, "{} pages cannot hold {} positions",
                         table.size(), n_end);
            for (int64_t j = 0; j < n_pages; ++j) {
                const int32_t page = table[size_t(j)];
                if (page == no_page && (j + 1) * ps <= n_past) continue; // not read again: nothing to hold
                TANDEM_CHECK(page >= 0 && page < n_host_pages(), "page {} outside the pool of {}", page,
                             n_host_pages());
                const bool known = !gens.empty();
                const uint32_t gen = known ? gens[size_t(j)] : 0;
                const int32_t need = int32_t(std::clamp<int64_t>(n_past - j * ps, 0, ps));
                const int32_t w0 = int32_t(std::max(n_past, j * ps) - j * ps);
                const int32_t w1 = int32_t(std::min(n_end, (j + 1) * ps) - j * ps);
                int32_t& ix = index_[size_t(page)];
                if (ix == none) {
                    ix = int32_t(touched_.size());
                    touched_.push_back({page, gen, known, need, -1, -1});
                } else {
                    touched& t = touched_[size_t(ix)];
                    TANDEM_CHECK(!(t.known && known) || t.gen == gen, "page {} with generations {} and {}", page,
                                 t.gen, gen);
                    t.known = t.known && known; // one caller that cannot vouch for it: upload it
                    t.need = std::max(t.need, need);
                }
                if (w0 < w1) {
                    touched& t = touched_[size_t(ix)];
                    TANDEM_CHECK(t.w0 < 0, "page {} written by two sequences", page);
                    t.w0 = w0;
                    t.w1 = w1;
                }
            }
        }
    } catch (...) {
        clear_index();
        throw;
    }
    plan.n_pages = int32_t(touched_.size());
    if (plan.n_pages > capacity_) {
        clear_index();
        return false;
    }

    // Pass 2: device pages. The batch's resident pages first leave the eviction order's
    // head, then new pages are placed (evicting), then all go to the tail in batch order.
    for (const touched& t : touched_)
        if (const int32_t d = slot_of_[size_t(t.page)]; d != none) to_tail(d);
    for (const touched& t : touched_)
        if (slot_of_[size_t(t.page)] == none) assign(t.page);
    for (const touched& t : touched_) to_tail(slot_of_[size_t(t.page)]);

    // Pass 3: uploads of what each page lacks.
    pending_.clear();
    for (const touched& t : touched_) {
        const int32_t d = slot_of_[size_t(t.page)];
        if (!t.known || !known_[size_t(d)] || gen_[size_t(d)] != t.gen) { // other contents now
            valid_[size_t(d)] = 0;
            known_[size_t(d)] = t.known ? 1 : 0;
            gen_[size_t(d)] = t.gen;
        }
        int32_t& valid = valid_[size_t(d)];
        if (t.need > valid) {
            if (valid == 0) // nothing there: the whole page, in one copy with its neighbours
                add_copy(plan.uploads, {t.page, d, 1, true, 0, ps});
            else // another worker appended positions since: those
                add_copy(plan.uploads, {t.page, d, 1, false, valid, t.need});
            plan.n_upload_slots += t.need - valid;
            plan.n_kept_slots += valid;
            valid = t.need;
        } else {
            plan.n_kept_slots += t.need;
        }
        if (t.w0 >= 0) {
            // The forward rewrites positions from w0 on; the device holds nothing beyond
            // them that it could keep (a pool owner never asks for this, but be safe).
            valid = std::min(valid, t.w0);
            pending_.push_back({d, t.w0, t.w1});
        }
    }

    // Pass 4: device block tables and the write-back of new positions.
    for (int32_t i = 0; i < b.n_seqs(); ++i) {
        const auto table = b.table(i);
        plan.table_begin.push_back(int32_t(plan.tables.size()));
        const int64_t n_past = b.n_past(i), n_end = n_past + b.n_new(i);
        const int64_t n_pages = (n_end + ps - 1) / ps;
        for (int64_t j = 0; j < n_pages; ++j)
            plan.tables.push_back(table[size_t(j)] == no_page ? no_page : slot_of_[size_t(table[size_t(j)])]);
        for (int64_t j = n_past / ps; j * ps < n_end; ++j) {
            const int32_t w0 = int32_t(std::max(n_past, j * ps) - j * ps);
            const int32_t w1 = int32_t(std::min(n_end, (j + 1) * ps) - j * ps);
            if (w0 >= w1) continue; // a sequence with nothing new
            const int32_t host = table[size_t(j)];
            add_copy(plan.writes, {host, slot_of_[size_t(host)], 1, w0 == 0 && w1 == ps, w0, w1});
        }
    }
    clear_index();
    prepared_ = true;
    return true;
}

void page_mirror::commit() {
    TANDEM_ASSERT(prepared_, "commit without prepare");
    for (const pending& p : pending_) {
        int32_t& valid = valid_[size_t(p.dev)];
        if (valid >= p.w0) valid = std::max(valid, p.w1);
    }
    pending_.clear();
    prepared_ = false;
}

} // namespace tandem
