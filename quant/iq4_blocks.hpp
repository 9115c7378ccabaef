// GGML's non-linear 4-bit formats IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256), through quant/blocks.hpp.
#pragma once

#include <cstdint>

namespace tandem {

// A 4-bit code indexes this fixed table, not a linear scale: finer steps near zero.
inline constexpr int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Layouts (f16 d; per 32 values 16 bytes of qs, whose low nibbles are values 0..15 and high
// nibbles values 16..31, as in Q4_0):
//   IQ4_NL {d; qs[16]}                            18 bytes, x = d * iq4_values[code]
//   IQ4_XS {d; u16 scales_h; scales_l[4]; qs[128]} 136 bytes, 8 sub-blocks of 32
// IQ4_XS: sub-block j has a 6-bit scale ls, its low 4 bits the low (j even) or high (j odd)
// nibble of scales_l[j / 2], its high 2 bits bits 2j, 2j + 1 of the little-endian scales_h;
// x = d * (ls - 32) * iq4_values[code].
void dequantize_iq4_nl_ref(const uint8_t* blocks, float* out, int64_t n);
void dequantize_iq4_xs_ref(const uint8_t* blocks, float* out, int64_t n);

// Reference quantizers (for synthetic files and tests): per 32 values the value of largest
// magnitude on the table's -127 (IQ4_XS: those scales to 6 bits under one d), each value to
// the nearest entry.
void quantize_iq4_nl_ref(const float* x, uint8_t* blocks, int64_t n);
void quantize_iq4_xs_ref(const float* x, uint8_t* blocks, int64_t n);

} // namespace tandem
