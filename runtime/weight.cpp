// One weight: reading a row back as F32.
#include "runtime/weight.hpp"

#include <algorithm>
#include <cstring>
#include <sys/mman.h>

namespace tandem {
namespace {

constexpr size_t huge_page = size_t(2) << 20;
constexpr size_t huge_min = 2 * huge_page; // below this the alignment would waste too much

std::align_val_t align_for(size_t bytes) { return std::align_val_t(bytes >= huge_min ? huge_page : 64); }

} // namespace

void* allocate_cachelines(size_t bytes) {
    void* p = ::operator new(bytes, align_for(bytes));
    // Only whole 2 MiB pages inside the block: a huge page past its end would be memory no one uses.
    if (bytes >= huge_min) (void)::madvise(p, bytes / huge_page * huge_page, MADV_HUGEPAGE);
    return p;
}

void free_cachelines(void* p, size_t bytes) { ::operator delete(p, align_for(bytes)); }

const char* name_of(weight_format f) {
    switch (f) {
    case weight_format::f32: return "f32";
    case weight_format::int8: return "int8";
    case weight_format::native: return "auto";
    }
    return "?";
}

std::optional<weight_format> parse_weight_format(std::string_view s) {
    if (s == "f32") return weight_format::f32;
    if (s == "int8") return weight_format::int8;
    if (s == "auto") return weight_format::native;
    return std::nullopt;
}

void weight::row_f32(int64_t i, float* out) const {
    if (!is_i8()) {
        std::memcpy(out, row(i), size_t(n_in) * sizeof(float));
        return;
    }
    // w = scale * q, as quant/int8's dequantize (a layer above this one) has it.
    const float s = scale()[i];
    if (layout == q_layout::rows) {
        const int8_t* qi = q() + i * n_in;
        for (int64_t k = 0; k < n_in; ++k) out[k] = s * float(qi[k]);
        return;
    }
    for (int64_t k = 0; k < n_in; ++k) out[k] = s * float(q()[blocked_offset(i, k)]);
}

void weight::q_row(int64_t o, int8_t* out) const {
    if (layout == q_layout::rows) {
        std::memcpy(out, q() + o * n_in, size_t(n_in));
        return;
    }
    const int8_t* p = q() + blocked_offset(o, 0); // four bytes every 256
    for (int64_t k = 0; k < n_in; k += 4) std::memcpy(out + k, p + k * q_block_rows, size_t(std::min<int64_t>(4, n_in - k)));
}

} // namespace tandem
