// Layout of one KV page, shared by the page owner and every kernel that reads pages.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

// Element type of cached K/V. i8 is symmetric with one f32 scale per (position, kv head).
enum class kv_dtype { f32, f16, i8 };

std::string_view name_of(kv_dtype t);
std::optional<kv_dtype> parse_kv_dtype(std::string_view s); // "f32", "f16", "int8"

// One page holds `page_size` consecutive positions of one sequence for every layer:
// [n_layer][K|V][n_head_kv][page_size][head_dim] elements of `dtype`, then for i8 the
// scales [n_layer][K|V][n_head_kv][page_size] f32. Keeping a head's positions contiguous
// lets attention stream through a page with unit stride.
struct kv_layout {
    int32_t n_layer = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t page_size = 16; // tokens per page
    kv_dtype dtype = kv_dtype::f32;

    int elem_bytes() const { return dtype == kv_dtype::f32 ? 4 : dtype == kv_dtype::f16 ? 2 : 1; }
    int64_t head_elems() const { return int64_t(page_size) * head_dim; }
    int64_t page_elems() const { return int64_t(n_layer) * 2 * n_head_kv * head_elems(); }
    // Offset in elements of (layer, K or V, kv head) inside a page.
    int64_t offset(int il, bool is_v, int kvh) const {
        return ((int64_t(il) * 2 + (is_v ? 1 : 0)) * n_head_kv + kvh) * head_elems();
    }
    // Byte offset of the i8 scales, 64-byte aligned, and the f32 index of one head's scales.
    int64_t scales_begin() const { return (page_elems() * elem_bytes() + 63) / 64 * 64; }
    int64_t scale_offset(int il, bool is_v, int kvh) const {
        return ((int64_t(il) * 2 + (is_v ? 1 : 0)) * n_head_kv + kvh) * page_size;
    }
    // Bytes per page, a multiple of 64 so every page starts cache-aligned.
    int64_t page_bytes() const {
        const int64_t scales = dtype == kv_dtype::i8 ? int64_t(n_layer) * 2 * n_head_kv * page_size * 4 : 0;
        return (scales_begin() + scales + 63) / 64 * 64;
    }
};

} // namespace tandem
