// One weight as every backend sees it: F32, or INT8 rows with a scale per output channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
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

// How matrices are held in memory. Vectors (norms, biases) are always F32.
enum class weight_format { f32, int8 };

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

    bool is_i8() const { return q_ext != nullptr || !q_store.empty(); }
    bool is_f32() const { return data_ext != nullptr || !data.empty(); }
    bool empty() const { return !is_f32() && !is_i8(); }
    const float* f32() const { return data_ext ? data_ext : data.data(); }
    const float* row(int64_t i) const { return f32() + i * n_in; }
    const int8_t* q() const { return q_ext ? q_ext : q_store.data(); }
    const float* scale() const { return scale_ext ? scale_ext : scale_store.data(); }
    int64_t bytes() const { return is_i8() ? q_bytes() + n_out * 4 : is_f32() ? n_out * n_in * 4 : 0; }
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
