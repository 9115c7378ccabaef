// Scalar IEEE half and bfloat16 conversions (the reference for any SIMD conversion).
#pragma once

#include "runtime/fp16_round.hpp"

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
inline uint16_t f32_to_fp16(float f) { return fp16_bits_of_f32_bits(std::bit_cast<uint32_t>(f)); }

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
