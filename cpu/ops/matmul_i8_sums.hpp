// The int8 matmul's epilogue over 16 outputs of one token (internal to cpu/ops): what every
// kernel from the VNNI level up does with its int32 sums. Built into files compiled with
// -ffp-contract=off (cpu/CMakeLists.txt), so it rounds as the reference does.
#pragma once

#include <immintrin.h>

#include <cstdint>

// GCC 12's AVX-512 intrinsics pass an "undefined" vector (`__m512i __Y = __Y;`) to their
// builtins, which its -Wmaybe-uninitialized takes for a read where this is inlined into the AMX
// kernel: a false positive, widely reported, silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::cpu {

// Where a matmul's sums go: out [n_tok, n_out] = float(dot) * sx[t] * sw[o] + bias[o], the
// reference's expression and order (multiplies, then the add; no FMA). With q_sum the sums are
// of u8 activations (s8 + 128, VNNI's vpdpbusd) and 128 * q_sum[o] comes off first.
struct i8_sums_out {
    float* out;
    int64_t n_out;
    const float* sx;
    const float* sw;
    const float* bias;       // or null
    const int32_t* q_sum;    // or null: the sums are s8 x s8 already

    // Outputs [o, o + 16) of token t (those below n_out) from their sums' lanes.
    __attribute__((target("avx512f"))) inline void store(int64_t o, int64_t t, __m512i acc) const {
        if (o >= n_out) return;
        const __mmask16 m = n_out - o >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n_out - o)) - 1);
        if (q_sum) acc = _mm512_sub_epi32(acc, _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, q_sum + o), 7));
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(sx[t])),
                                 _mm512_maskz_loadu_ps(m, sw + o));
        v = _mm512_add_ps(v, bias ? _mm512_maskz_loadu_ps(m, bias + o) : _mm512_setzero_ps());
        _mm512_mask_storeu_ps(out + t * n_out + o, m, v);
    }
    // The same from 16 sums in memory (for code built without AVX-512 enabled).
    __attribute__((target("avx512f"))) void store(int64_t o, int64_t t, const int32_t* lanes) const {
        store(o, t, _mm512_loadu_si512(lanes));
    }
};

} // namespace tandem::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
