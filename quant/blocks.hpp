// GGML's block formats: the 32-value Q4_0, Q4_1, Q5_0, Q5_1 here; Q8_0 (quant/q8_0.hpp), the
// K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (quant/k_blocks.hpp) and the non-linear IQ4_NL, IQ4_XS
// (quant/iq4_blocks.hpp) through the same two functions.
#pragma once

#include "runtime/dtype.hpp"

#include <cstddef>
#include <cstdint>

namespace tandem {

// Layouts (each block 32 values; f16 scales; the low nibbles of qs are values 0..15, the high
// nibbles values 16..31; a Q5 value's fifth bit is bit i of the little-endian u32 qh):
//   Q4_0 {d; qs[16]}          18 bytes, x = d * (q - 8)
//   Q4_1 {d, m; qs[16]}       20 bytes, x = d * q + m
//   Q5_0 {d; qh[4]; qs[16]}   22 bytes, x = d * (q - 16)
//   Q5_1 {d, m; qh[4]; qs[16]} 24 bytes, x = d * q + m
// n is a multiple of the type's block (traits_of).
bool is_block_format(dtype t); // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS
// Bytes of the blocks that hold n values of type t (n a multiple of its block).
size_t block_bytes_of(dtype t, int64_t n);

// Expands the blocks of n values of type t into n floats.
void dequantize_blocks_ref(dtype t, const uint8_t* blocks, float* out, int64_t n);

// The reference quantizer (for synthetic files and tests): symmetric types map the value of
// largest magnitude to the lowest code (d = that value / -2^(bits-1)), offset types spread
// [min, max] over the codes (d = (max - min) / (2^bits - 1), m = min); codes round to nearest.
void quantize_blocks_ref(dtype t, const float* x, uint8_t* blocks, int64_t n);

} // namespace tandem
