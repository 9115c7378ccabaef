// GGML's K-quant super-blocks of 256 values: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (through quant/blocks.hpp).
#pragma once

#include <cstdint>

namespace tandem {

// Layouts (f16 d and dmin; 8 sub-blocks of 32, or 16 of 16 for Q2_K, Q3_K and Q6_K):
//   Q2_K {scales[16]; qs[64]; d, dmin}            84 bytes
//   Q3_K {hmask[32]; qs[64]; scales[12]; d}       110 bytes
//   Q4_K {d, dmin; scales[12]; qs[128]}           144 bytes
//   Q5_K {d, dmin; scales[12]; qh[32]; qs[128]}   176 bytes
//   Q6_K {ql[128]; qh[64]; int8 scales[16]; d}    210 bytes
// Q4_K/Q5_K: sub-block j has a 6-bit scale sc and min m packed in `scales` (j < 4: sc = s[j] &
// 63, m = s[j + 4] & 63; else sc = s[j + 4] & 15 | (s[j - 4] >> 6) << 4, m = s[j + 4] >> 4 |
// (s[j] >> 6) << 4), and x = d * sc * q - dmin * m. Per 64 values, qs holds 32 bytes: the low
// nibbles are the first sub-block, the high ones the second; Q5_K's fifth bit of value l of
// that pair of sub-blocks is bit 2i (first) or 2i + 1 (second) of qh[l], i the pair's index.
// Q6_K: per 128 values, 64 bytes of ql, 32 of qh and 8 scales: value l (l < 32) and l + 32,
// l + 64, l + 96 take the low nibble of ql[l], of ql[l + 32], the high nibble of ql[l], of
// ql[l + 32], and bits 0-1, 2-3, 4-5, 6-7 of qh[l] as their top two bits; x = d * sc * (q - 32)
// with sc = scales[l / 16 + 0, 2, 4, 6] respectively.
// Q2_K/Q3_K: per 128 values, 32 bytes of qs: value l (l < 32) and l + 32, l + 64, l + 96 take
// bits 0-1, 2-3, 4-5, 6-7 of qs[l]; sub-block s (16 values, s = value / 16 over the whole
// super-block) has its own scale. Q2_K: scales[s] holds a 4-bit scale (low nibble) and a 4-bit
// min (high nibble), x = d * sc * q - dmin * m. Q3_K: value v = 128 h + 32 k + l has a third bit,
// bit 4 h + k of hmask[l] (the same 32 bytes for both halves): set, q is the two bits as they
// are; clear, q is the two bits minus 4 (q in -4..3). Its 6-bit scale is (low | high << 4) - 32,
// low the low nibble of scales[s] (s < 8) or the high nibble of scales[s - 8], high bits
// 2 (s / 4), 2 (s / 4) + 1 of scales[8 + s % 4]; x = d * sc * q.
// Q4_K/Q5_K sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes at `scales`.
void k_scale_min(const uint8_t* scales, int j, int& sc, int& m);

void dequantize_q2_k_ref(const uint8_t* blocks, float* out, int64_t n);
void dequantize_q3_k_ref(const uint8_t* blocks, float* out, int64_t n);
void dequantize_q4_k_ref(const uint8_t* blocks, float* out, int64_t n);
void dequantize_q5_k_ref(const uint8_t* blocks, float* out, int64_t n);
void dequantize_q6_k_ref(const uint8_t* blocks, float* out, int64_t n);

// Reference quantizers (for synthetic files and tests): per sub-block min (at most 0) and
// range, scales and mins to 6 bits (Q2_K: 4 bits; Q3_K and Q6_K: symmetric, the value of largest
// magnitude per sub-block on the lowest code, scales to 6 bits or int8), codes to nearest.
void quantize_q2_k_ref(const float* x, uint8_t* blocks, int64_t n);
void quantize_q3_k_ref(const float* x, uint8_t* blocks, int64_t n);
void quantize_q4_k_ref(const float* x, uint8_t* blocks, int64_t n);
void quantize_q5_k_ref(const float* x, uint8_t* blocks, int64_t n);
void quantize_q6_k_ref(const float* x, uint8_t* blocks, int64_t n);

} // namespace tandem
