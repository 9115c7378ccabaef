// Element types of tensors, with the GGML type ids that GGUF files use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

// Values are GGML's type ids, so a GGUF tensor's type converts directly.
enum class dtype : uint32_t {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,  // blocks of 32 (quant/blocks.hpp has the layouts)
    q4_1 = 3,
    q5_0 = 6,
    q5_1 = 7,
    q8_0 = 8,  // blocks of 32: one f16 scale + 32 int8
    q2_k = 10, // super-blocks of 256 (quant/k_blocks.hpp)
    q3_k = 11,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    iq4_nl = 20, // blocks of 32, codes into a fixed table (quant/iq4_blocks.hpp)
    iq4_xs = 23, // super-blocks of 256, the same table
    i8 = 24,   // Tandem's own INT8 weights (with separate scale tensors)
    bf16 = 30,
};

inline constexpr int64_t q8_0_block = 32;
inline constexpr size_t q8_0_block_bytes = 2 + 32;

// Elements per block and bytes per block; nullopt for a type Tandem does not handle.
struct dtype_traits {
    int64_t block;
    size_t block_bytes;
};

std::optional<dtype_traits> traits_of(uint32_t ggml_type);

// GGML's name for any GGML type id, known to Tandem or not ("Q4_K", "F16", ...).
std::string_view ggml_type_name(uint32_t ggml_type);

inline std::string_view name_of(dtype t) { return ggml_type_name(uint32_t(t)); }

} // namespace tandem
