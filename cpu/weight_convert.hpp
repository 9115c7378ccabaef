// Weight rows converted at load (runtime/weights.cpp): GGUF block formats and F32 rows to INT8
// rows and row sums, block formats, F16 and BF16 to F32, with AVX2 fast paths that give the
// reference's bits.
#pragma once

#include "runtime/dtype.hpp"

#include <cstdint>

namespace tandem::cpu {

// x [n] -> q [n], *sum, returns the scale: quantize_row_i8_ref(x, q, n) and sum_i8_ref(q, n),
// bit for bit at every ISA level (a row with an inf or NaN, or a max so small that 127 / max
// overflows, takes the reference itself).
float row_to_i8(const float* x, int8_t* q, int32_t* sum, int64_t n);

// The n values (a multiple of the type's block) of block type t at `blocks` -> out [n]:
// dequantize_blocks_ref's floats, bit for bit. Q8_0, Q4_K and Q6_K have AVX2 kernels (a block
// whose f16 scales are inf or NaN is left to the reference); the other types are the reference.
void blocks_to_f32(dtype t, const uint8_t* blocks, float* out, int64_t n);

// n F16 or BF16 values at p -> out [n]: fp16_to_f32 / bf16_to_f32 bit for bit (F16C and AVX2;
// 8 F16 values holding a NaN take fp16_to_f32, which keeps a signaling NaN's bits).
void halves_to_f32(dtype t, const uint8_t* p, float* out, int64_t n);

// The same values as an INT8 row: blocks_to_i8_ref's q, *sum and scale, bit for bit. Q8_0 is
// fused (the row's max from each block's f16 scale times its largest |code|, then one pass
// that dequantizes, rounds, packs and sums); the other types go through blocks_to_f32 into
// tmp [n] and row_to_i8.
float blocks_to_i8(dtype t, const uint8_t* blocks, int8_t* q, int32_t* sum, float* tmp, int64_t n);

// The spec: dequantize_blocks_ref into tmp [n], quantize_row_i8_ref, sum_i8_ref.
float blocks_to_i8_ref(dtype t, const uint8_t* blocks, int8_t* q, int32_t* sum, float* tmp, int64_t n);

} // namespace tandem::cpu
