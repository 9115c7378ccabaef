// The AMX tile configuration the int8 kernels load (cpu/ops/matmul_i8_amx, cpu/peak).
#pragma once

#include <cstdint>

namespace tandem::cpu {

// The 64 bytes LDTILECFG reads (palette 1).
struct alignas(64) tile_config {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(tile_config) == 64);

// Tiles 0-7 each 16 rows of 64 bytes, the rest unused: what every kernel here uses.
inline tile_config full_tile_config() {
    tile_config c;
    for (int t = 0; t < 8; ++t) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    return c;
}

} // namespace tandem::cpu
