// Symmetric INT8 rows (W8A8): per-output-channel weights and per-token activations, x ~= scale * q.
#pragma once

#include <cstdint>

namespace tandem {

// Scheme name and version written into `tandem quantize` files; a reader refuses others.
// Version 2 may hold matrices in the CPU kernels' blocked layout (runtime/weight.hpp), named by
// the file; version 1 (every matrix in rows) still loads.
inline constexpr const char* int8_scheme = "tandem.int8.rowwise";
inline constexpr uint32_t int8_scheme_version = 2;
inline constexpr uint32_t int8_scheme_min_version = 1;

// Quantizes one row of n floats: scale = max|x| / 127, q = round(x / scale) in [-127, 127].
// NaN becomes 0, infinities saturate; an all-zero row gets scale 0. Returns the scale.
float quantize_row_i8_ref(const float* x, int8_t* q, int64_t n);

// out [n] = scale * q
void dequantize_row_i8_ref(const int8_t* q, float scale, float* out, int64_t n);

// sum a[i] * b[i] in exact int32 arithmetic (n * 127 * 127 must fit, n < 2^17)
int32_t dot_i8_ref(const int8_t* a, const int8_t* b, int64_t n);

// sum q[i]: the correction for the u8 = s8 + 128 offset trick of VNNI's u8 x s8 dot
int32_t sum_i8_ref(const int8_t* q, int64_t n);

} // namespace tandem
