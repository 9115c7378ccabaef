// Overflow-checked integer arithmetic for sizes read from untrusted files.
#pragma once

#include <cstdint>
#include <optional>

namespace tandem {

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

// Rounds n up to a multiple of align (align > 0); nullopt on overflow.
inline std::optional<uint64_t> checked_align(uint64_t n, uint64_t align) {
    auto r = checked_add(n, align - 1);
    if (!r) return std::nullopt;
    return *r / align * align;
}

} // namespace tandem
