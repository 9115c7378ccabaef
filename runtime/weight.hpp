// One weight as every backend sees it: F32, or INT8 rows with a scale per output channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

// Storage on 64-byte boundaries: the kernels load 64 bytes at a time, and a load that straddles
// two cache lines costs two (the decode GEMV ran ~40% faster on L2-resident rows once its
// activation rows were aligned). Blocks of 4 MiB and more sit on 2 MiB boundaries with their
// whole 2 MiB pages marked for transparent huge pages (a loaded model faults in 2 MiB at a
// time, not 4 KiB). Elements are default-initialized: a resize writes nothing (every user
// fills what it asks for), so a model's INT8 rows are written once, by the threads converting
// them, instead of zeroed first on one thread.
void* allocate_cachelines(size_t bytes);
void free_cachelines(void* p, size_t bytes);

template <class T>
struct cacheline_allocator {
    using value_type = T;
    cacheline_allocator() = default;
    template <class U> cacheline_allocator(const cacheline_allocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(allocate_cachelines(n * sizeof(T))); }
    void deallocate(T* p, size_t n) { free_cachelines(p, n * sizeof(T)); }
    template <class U> void construct(U* p) { ::new (static_cast<void*>(p)) U; }
    template <class U, class... A> void construct(U* p, A&&... a) { ::new (static_cast<void*>(p)) U(std::forward<A>(a)...); }
    template <class U> bool operator==(const cacheline_allocator<U>&) const { return true; }
};

// How matrices are held in memory. Vectors (norms, biases) are always F32. `native` is
// `--weights auto`: matrices a file holds below 8 bits (Q4_0 ... IQ4_XS) keep their bits in
// the low-bit family (lowbit_matrix below), every other matrix is INT8 as for `int8`.
enum class weight_format { f32, int8, native };

// Whether matrices of this format are integer (INT8 or low-bit).
inline bool is_quantized(weight_format f) { return f != weight_format::f32; }
// "f32", "int8", "auto".
const char* name_of(weight_format f);
// The inverse; nullopt for anything else.
std::optional<weight_format> parse_weight_format(std::string_view s);

// A matrix in the low-bit family (quant/lowbit.hpp has the formats and the packing; the
// kernels are cpu/ops/matmul_lowbit.cpp): the file's integers and scales, never re-quantized,
// repacked for the vector width. Outputs go in tiles of 16 (n_out padded with zero rows);
// each tile holds, per super-block of `super` inputs, `super_bytes` bytes:
//   header (padded to 64 bytes): d [16] f16, dm [16] f16 (has_min), sc [n_grp][16] int8 and
//     mg [n_grp][16] int8 (has_min) unless unit_sc (every sc and mg is 1)
//   nibbles: super / 8 lines of 64 bytes; line j, byte 4 * lane + b: low nibble = input 8j + b,
//     high nibble = input 8j + 4 + b of output lane
//   hi (has_hi): super / 16 lines; line j, byte 4 * lane + b, bits 2s..2s+1 = bits 4-5 of
//     the code of input 16j + 4s + b
// A code u is the nibble with the hi bits above it (u in 0..63), or table[nibble] where
// has_table; its value is v = u - off, and w[o][i] = d * sc * v (+ dm * mg) with the group's
// (`group` inputs) sc and mg.
struct lowbit_matrix {
    uint32_t type = 0;       // the file's dtype (GGML id)
    int32_t group = 32;      // inputs per sc / mg: 16 or 32
    int32_t super = 256;     // inputs per d / dm: 32 or 256
    bool has_min = false;
    bool has_hi = false;
    bool unit_sc = false;
    bool has_table = false;
    int32_t off = 0;
    uint8_t table[16] = {};
    int64_t n_out = 0, n_in = 0;
    int64_t header_bytes = 0, super_bytes = 0;
    std::vector<uint8_t, cacheline_allocator<uint8_t>> data; // [tiles][n_in / super][super_bytes]

    static constexpr int64_t tile = 16;
    int64_t n_tiles() const { return (n_out + tile - 1) / tile; }
    int64_t n_super() const { return n_in / super; }
    int32_t n_grp() const { return super / group; }
    const uint8_t* at(int64_t tile_i, int64_t s) const { return data.data() + (tile_i * n_super() + s) * super_bytes; }
    int64_t bytes() const { return int64_t(data.size()); }
};

// The order of an INT8 matrix's bytes.
//
// rows: [n_out][n_in], as GGUF stores them.
// blocked: oneDNN's BA16a64b4a of the [n_in, n_out] matrix, the one layout every CPU kernel
// from the VNNI level up reads: blocks of 64 outputs, each [k_pad / 4][64][4], so every 64-byte
// line holds four consecutive inputs of 16 outputs. That line is what `vpdpbusd` multiplies by
// four broadcast activations (16 sums, one per output, with no horizontal reduction), a row
// of an AMX B tile (16 of them, 256 bytes apart), and oneDNN's own preferred layout for its
// int8 matmul, so one copy serves the GEMV, the tiles and oneDNN. n_out is padded to a
// multiple of 64 and n_in to one of 64 (k_pad) with zeros.
enum class q_layout { rows, blocked };

inline constexpr int64_t q_block_rows = 64; // outputs in a block
inline constexpr int64_t q_block_k = 64;    // n_in is padded to a multiple of this

// A weight: a matrix [n_out, n_in] (each output's n_in inputs; for INT8 in `layout`), or a
// vector [n_out] with n_in == 1. Either F32 (`data`, row-major) or INT8: q with one f32 scale
// per row, w[o][i] ~= scale[o] * q[o][i]. INT8 bytes live in `q_store` or elsewhere (`q_ext`: a
// view whose owner outlives the weight).
struct weight {
    std::vector<float> data;          // F32 form
    int64_t n_out = 0;
    int64_t n_in = 0;
    std::vector<int8_t, cacheline_allocator<int8_t>> q_store; // [n_out, n_in] when quantized at load
    std::vector<float> scale_store;   // [n_out]
    const int8_t* q_ext = nullptr;    // [n_out, n_in] held elsewhere, in `layout`
    const float* scale_ext = nullptr; // [n_out]
    const float* data_ext = nullptr;  // F32 form held elsewhere (a backend's copy: a device view)
    std::vector<int32_t> q_sum;       // [n_out] sum of each q row (VNNI's u8 offset correction)
    q_layout layout = q_layout::rows; // of the INT8 bytes
    std::shared_ptr<const lowbit_matrix> lb; // the low-bit family (q, scale, q_sum empty then)

    bool is_lowbit() const { return lb != nullptr; }
    bool is_integer() const { return is_i8() || is_lowbit(); } // read by matmul_i8
    bool is_i8() const { return q_ext != nullptr || !q_store.empty(); }
    bool is_f32() const { return data_ext != nullptr || !data.empty(); }
    bool empty() const { return !is_f32() && !is_i8() && !is_lowbit(); }
    const float* f32() const { return data_ext ? data_ext : data.data(); }
    const float* row(int64_t i) const { return f32() + i * n_in; }
    const int8_t* q() const { return q_ext ? q_ext : q_store.data(); }
    const float* scale() const { return scale_ext ? scale_ext : scale_store.data(); }
    int64_t bytes() const { return is_lowbit() ? lb->bytes() : is_i8() ? q_bytes() + n_out * 4 : is_f32() ? n_out * n_in * 4 : 0; }
    // Row i as F32 (dequantized for INT8) into out [n_in].
    void row_f32(int64_t i, float* out) const;

    // The blocked layout's padded sizes, blocks and bytes (of the INT8 bytes in either layout).
    int64_t k_pad() const { return (n_in + q_block_k - 1) / q_block_k * q_block_k; }
    int64_t n_blocks() const { return (n_out + q_block_rows - 1) / q_block_rows; }
    int64_t q_bytes() const { return layout == q_layout::blocked ? n_blocks() * q_block_rows * k_pad() : n_out * n_in; }
    const int8_t* q_block(int64_t b) const { return q() + b * q_block_rows * k_pad(); }
    // Where q[o][i] is in q() for the blocked layout.
    int64_t blocked_offset(int64_t o, int64_t i) const {
        return (o / q_block_rows) * q_block_rows * k_pad() + (i / 4) * (4 * q_block_rows) + (o % q_block_rows) * 4 + i % 4;
    }
    // INT8 row o into out [n_in], in either layout.
    void q_row(int64_t o, int8_t* out) const;
};

} // namespace tandem
