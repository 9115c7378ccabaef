// What attention and kv_store read: the pages, each sequence's new tokens over them, the window.
#pragma once

// Core: the reference, CPU and CUDA kernels take this struct, and so does runtime/ops. C++17,
// as the CUDA sources are.

#include "runtime/kv_layout.hpp"

#include <algorithm>
#include <utility>
#include <cstddef>
#include <cstdint>

namespace tandem {

// A block-table entry for a page the sequence does not hold (positions it never reads
// again, e.g. outside an attention window). Never a page that a step writes or reads.
inline constexpr int32_t no_page = -1;

// A read-only array someone else owns (std::span, which CUDA's C++17 lacks): from a vector or span.
template <class T>
class array_view {
public:
    array_view() = default;
    array_view(const T* p, size_t n) : p_(p), n_(n) {}
    template <class C, class = decltype(std::declval<const C&>().data())>
    array_view(const C& c) : p_(c.data()), n_(c.size()) {}
    const T* data() const { return p_; }
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    const T* begin() const { return p_; }
    const T* end() const { return p_ + n_; }
    const T& operator[](size_t i) const { return p_[i]; }

private:
    const T* p_ = nullptr;
    size_t n_ = 0;
};

// One sequence's new tokens: rows row.. of q, k, v and out, at positions n_past..n_past + n_tok - 1.
struct attn_seq {
    int64_t row = 0;
    int32_t n_tok = 0;
    int32_t n_past = 0;
    int32_t table_begin = 0; // its block table: tables[table_begin..], one entry per page_size positions
};

struct attn_params {
    kv_layout lay;
    uint8_t* kv_base = nullptr;          // n_pages pages of lay (backend memory)
    int32_t n_pages = 0;
    const int32_t* tables = nullptr;     // every sequence's block table, concatenated (backend memory)
    array_view<int32_t> host_tables;     // the same entries in host memory (.data() == tables on host backends)
    array_view<attn_seq> seqs;           // host memory
    // 0: the token at position p sees positions 0..p; else only the last `window` of them,
    // p - window + 1..p. Pages wholly before what a sequence's first new token sees may be no_page.
    int32_t window = 0;
    // > 0: each score s (q.k times the scale) becomes softcap * tanh(s / softcap) before the
    // softmax (Gemma 2's attention logit soft-capping).
    float softcap = 0.0f;

    int32_t first_seen(int32_t p) const { return window > 0 ? std::max(0, p - window + 1) : 0; }
    const int32_t* table(const attn_seq& s) const { return tables + s.table_begin; }
};

} // namespace tandem
