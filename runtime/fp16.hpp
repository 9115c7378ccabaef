// Scalar IEEE half and bfloat16 conversions (the reference for any SIMD conversion).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace tandem {

inline float fp16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { // subnormal: normalise
            int e = -1;
            do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
            bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | mant << 13; // inf / nan
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    return std::bit_cast<float>(bits);
}

// Round to nearest even, with overflow to inf and NaN kept quiet.
inline uint16_t f32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u); // nan
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

// A little-endian f16 at p (any alignment), as GGUF's blocks store their scales.
inline float load_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

// Stores v at p as a little-endian f16 (round to nearest even).
inline void store_f16(uint8_t* p, float v) {
    const uint16_t h = f32_to_fp16(v);
    std::memcpy(p, &h, 2);
}

inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u); // quiet nan
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}

} // namespace tandem
