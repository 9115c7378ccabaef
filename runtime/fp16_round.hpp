// The F32 -> F16 rounding as integer arithmetic on the float's bits, shared by the host
// (runtime/fp16.hpp) and the CUDA kernels (cuda/ops/common.cuh), so that a page written by
// either holds the same bits. C++17, for nvcc.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem {

// x: the bits of an F32. Round to nearest even, with overflow to inf and NaN kept quiet (its
// sign kept).
TANDEM_HOST_DEVICE inline uint16_t fp16_bits_of_f32_bits(uint32_t x) {
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // nan
    if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u); // overflow (incl. inf)
    if (abs < 0x38800000u) {                                  // subnormal or zero in half
        if (abs < 0x33000000u) return uint16_t(sign);         // below half of the smallest subnormal
        const uint32_t e = abs >> 23;
        const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e; // 14 - (e - 127) + 13 - 1 + 1
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) ++h;
        return uint16_t(sign | h);
    }
    uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
    const uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
}

} // namespace tandem
