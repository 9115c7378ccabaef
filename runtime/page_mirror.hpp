// What a device keeps of the host KV pages between forwards, and which copies a batch needs.
#pragma once

#include "runtime/batch.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// One copy between host pages and device pages. Whole pages (whole): n_pages consecutive
// pages on both sides, every byte of them. Otherwise positions [slot_begin, slot_end) of one
// page (every layer, K and V, every kv head; the i8 scales too).
struct page_copy {
    int32_t host_page = 0;
    int32_t dev_page = 0;
    int32_t n_pages = 1;
    bool whole = false;
    int32_t slot_begin = 0, slot_end = 0; // [0, page_size) when whole
};

// The copies and device block tables of one batch.
struct mirror_plan {
    std::vector<int32_t> tables;        // each sequence's device pages, concatenated
    std::vector<int32_t> table_begin;   // [batch] where each sequence's pages start in `tables`
    std::vector<page_copy> uploads;     // host -> device before the forward: past positions it lacks
    std::vector<page_copy> writes;      // device -> host after the forward: the new positions
    int32_t n_pages = 0;                // distinct host pages the batch touches
    int64_t n_upload_slots = 0;         // past positions uploaded (of distinct pages)
    int64_t n_kept_slots = 0;           // past positions read that the device already held
};

// A device's copy of host KV pages, as bookkeeping only (the CUDA runner moves the bytes;
// this class is host code, tested without a device). Each device page remembers which host
// page it holds, that page's generation (block_pool::generation) and how many leading
// positions are valid. Valid positions stay valid while the generation stays: the pool owner
// changes it whenever a page gets new contents, and within one generation positions are
// appended, never rewritten (a lost batch is recomputed to the same values). So a forward
// uploads only positions [valid, n_past) of each page, or the whole page when it is new to
// the device; the positions it computes are in the device page already and become valid
// when it succeeds (commit). A sequence without generations is re-uploaded every time.
// A batch the pool owner counts as lost either failed its forward (the runner then calls
// forget()) or lost its worker (and the device pages with it), so the valid positions never
// include one the owner thinks uncomputed.
//
// Device pages: with capacity >= the pool's page count, host page p lives in device page p
// (nothing is ever evicted, and runs of consecutive pages copy in one go). The pool lives in
// host memory, which is often larger than what a device can spare (a prefill worker may
// share it), so with less, pages are evicted least recently used first: pages are ordered by
// the last batch that touched them and, within one batch, by first appearance (sequence
// order, then block-table order).
class page_mirror {
public:
    // Forgets everything: `capacity` device pages for a pool of n_host_pages pages of
    // page_size positions.
    void reset(int32_t capacity, int32_t n_host_pages, int32_t page_size);
    // Forgets every device page's contents (after a failed forward: what the device holds
    // is unknown). Capacity and pool stay.
    void forget();

    int32_t capacity() const { return capacity_; }
    int32_t n_host_pages() const { return int32_t(slot_of_.size()); }
    int32_t page_size() const { return page_size_; }
    // Host pages with a device page now.
    int32_t n_resident() const { return n_resident_; }
    // The device page holding `host_page` (-1: none), and its valid leading positions.
    int32_t dev_page_of(int32_t host_page) const;
    int32_t valid_of(int32_t host_page) const;

    // Maps every page the batch touches (positions below each sequence's last new one;
    // no_page entries of positions it does not write are skipped) to a device page and fills `plan`. False, with nothing changed and
    // plan.n_pages set, when the batch touches more pages than the capacity. Throws
    // tandem::error on a batch no pool owner sends (a page outside the pool, generations
    // that do not match the block table, two sequences writing one page, a page with two
    // generations). Until commit() or forget(), no other prepare.
    bool prepare(const batch& b, mirror_plan& plan);
    // The prepared forward succeeded: the positions it computed are valid on the device.
    void commit();

private:
    struct touched {
        int32_t page;
        uint32_t gen;
        bool known;        // has a generation
        int32_t need;      // leading positions some sequence reads (below its n_past)
        int32_t w0, w1;    // positions written by the forward; w0 < 0: none
    };
    struct pending {
        int32_t dev, w0, w1;
    };

    bool identity() const { return capacity_ >= n_host_pages(); }
    int32_t assign(int32_t page);  // a device page for a host page that has none
    void to_tail(int32_t dev);     // most recently used (LRU mode)
    void unlink(int32_t dev);

    static constexpr int32_t none = -1;
    int32_t capacity_ = 0, page_size_ = 1;
    std::vector<int32_t> slot_of_;    // [n_host_pages] device page, or none
    std::vector<int32_t> host_of_;    // [capacity] host page, or none
    std::vector<uint32_t> gen_;       // [capacity]
    std::vector<uint8_t> known_;      // [capacity] gen_ is meaningful
    std::vector<int32_t> valid_;      // [capacity] leading valid positions
    std::vector<int32_t> prev_, next_;// [capacity] LRU list (head: least recently used)
    std::vector<int32_t> free_;       // free device pages (LRU mode), lowest on top
    int32_t head_ = none, tail_ = none;
    int32_t n_resident_ = 0;
    std::vector<int32_t> index_;      // [n_host_pages] index into touched_ during prepare, else none
    std::vector<touched> touched_;
    std::vector<pending> pending_;
    bool prepared_ = false;
};

} // namespace tandem
