// `tandem quantize`: rewrites a GGUF with every matrix as INT8 (rows, or the CPU kernels' blocks)
// plus an F32 scale tensor.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

namespace cpu { class thread_pool; }

// Metadata keys of a pre-quantized file; the loader checks them before using I8 tensors.
inline constexpr const char* quant_scheme_key = "tandem.quantization.scheme";
inline constexpr const char* quant_version_key = "tandem.quantization.version";
// The I8 matrices stored in q_layout::blocked (string array; version 2): whole blocks only.
inline constexpr const char* quant_blocked_key = "tandem.quantization.blocked";

struct quantize_stats {
    int64_t n_quantized = 0; // matrices written as I8 + scale
    int64_t n_copied = 0;    // other tensors, copied as they are
    int64_t out_bytes = 0;
};

// Reads `in` (F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 matrices, or an already quantized file), writes `out`: every
// 2-D tensor `name` becomes I8 [same shape] with `name.scale` F32 [rows]; everything else,
// metadata included, is copied. Matrices stream through one at a time, rows on the pool.
// A matrix of whole 64 x 64 blocks is stored in the blocked layout the CPU kernels read from
// the VNNI level up, so that there loading it is a plain copy (the embedding table only when
// the logits use it too: the embed op reads rows); the others, in rows.
quantize_stats quantize_gguf(const std::string& in, const std::string& out, cpu::thread_pool& pool);

} // namespace tandem
