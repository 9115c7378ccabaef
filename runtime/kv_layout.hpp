// Layout of one KV page, shared by the page owner and every kernel that reads pages.
#pragma once

#include <cstdint>

namespace tandem {

// One page holds `page_size` consecutive positions of one sequence for every layer:
// [n_layer][K|V][n_head_kv][page_size][head_dim], F32. Keeping a head's positions
// contiguous lets attention stream through a page with unit stride.
struct kv_layout {
    int32_t n_layer = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    int32_t page_size = 16; // tokens per page

    int64_t head_floats() const { return int64_t(page_size) * head_dim; }
    int64_t page_floats() const { return int64_t(n_layer) * 2 * n_head_kv * head_floats(); }
    // Offset in floats of (layer, K or V, kv head) inside a page.
    int64_t offset(int il, bool is_v, int kvh) const {
        return ((int64_t(il) * 2 + (is_v ? 1 : 0)) * n_head_kv + kvh) * head_floats();
    }
};

} // namespace tandem
