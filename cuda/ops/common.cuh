// What the CUDA kernels share: the stream, launches and their checks, the dynamic shared
// memory, warp and block reductions, the INT8 row quantizer and the F16 encoder (each written
// to give the reference's exact bits).
#pragma once

#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "runtime/fp16_round.hpp"

#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <utility>

namespace tandem::cuda {

inline cudaStream_t stream_of(const context& c) { return static_cast<cudaStream_t>(c.stream()); }

// Every launch is followed by this: a bad launch configuration throws right there.
#define TANDEM_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

// kernel<<<grid, block, smem, the context's stream>>>(args...), checked. Every kernel launches
// through this: built against tests/cuda_emu/ (TANDEM_CUDA_EMULATED) it runs on the host.
template <class... P, class... A>
void launch_kernel(const context& c, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
#if TANDEM_CUDA_EMULATED
    ::tandem::cuda_emu::launch_checked(reinterpret_cast<const void*>(kernel), grid, block, smem,
                                       [&] { kernel(args...); });
    (void)c;
#else
    kernel<<<grid, block, smem, stream_of(c)>>>(std::forward<A>(args)...);
#endif
    TANDEM_LAUNCH_CHECK();
}

// The block's dynamic shared memory (the launch's smem bytes), 128-byte aligned.
__device__ __forceinline__ unsigned char* dynamic_smem() {
#if TANDEM_CUDA_EMULATED
    return ::tandem::cuda_emu::dynamic_smem();
#else
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    return dyn_smem;
#endif
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Threads per block of the kernels that give a block to each row.
constexpr int row_block = 256;

inline unsigned grid_1d(int64_t n, int block) { return unsigned((n + block - 1) / block); }

// Reduces v over the whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `scratch` is __shared__ T[32]; the block must not be inside divergent code.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < n_warps; ++w) v = op(v, scratch[w]);
    return v;
}

struct max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct sum_op {
    template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};

// quantize_row_i8_ref, split in its two steps: the max |x| over finite values (a reduction),
// then scale/inverse and the rounding of each element. Explicit _rn intrinsics keep nvcc from
// contracting or approximating anything, so the bytes equal the reference's.
__device__ __forceinline__ float finite_abs(float x) { return isfinite(x) ? fabsf(x) : 0.0f; }

struct i8_row_scale {
    float scale, inv;
};
__device__ __forceinline__ i8_row_scale i8_scale_of(float amax) {
    const float scale = __fdiv_rn(amax, 127.0f);
    return {scale, scale > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f};
}
__device__ __forceinline__ int8_t quantize_one(float x, float inv) {
    float v = isnan(x) ? 0.0f : rintf(__fmul_rn(x, inv));
    if (isinf(x)) v = x > 0.0f ? 127.0f : -127.0f; // inf * 0 would be NaN
    return int8_t(fminf(fmaxf(v, -127.0f), 127.0f));
}

// f32_to_fp16 of runtime/fp16.hpp, the same code: pages written here equal the CPU's.
__device__ __forceinline__ uint16_t f32_to_fp16_bits(float f) { return fp16_bits_of_f32_bits(__float_as_uint(f)); }

__device__ __forceinline__ float fp16_bits_to_f32(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

} // namespace tandem::cuda
