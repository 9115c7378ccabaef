// Q8_0 blocks in GGML's layout: per 32 values one f16 scale d and 32 int8 q, x ~= d * q.
#pragma once

#include <cstdint>

namespace tandem {

// Quantizes n floats (n a multiple of 32) into n / 32 blocks of 34 bytes each.
// d = max|x| / 127, q = round(x / d); NaN becomes 0 and infinities saturate.
void quantize_q8_0_ref(const float* x, uint8_t* blocks, int64_t n);

// Expands n / 32 blocks into n floats (n a multiple of 32).
void dequantize_q8_0_ref(const uint8_t* blocks, float* out, int64_t n);

} // namespace tandem
