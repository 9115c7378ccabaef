// The INT8 matmul kernels of matmul_i8.cu that are ours: the tiled dp4a GEMM and the scale
// epilogue after cuBLASLt's int32 GEMM. No CUDA header here (tests/cuda_emu.hpp runs this on
// the host); matmul_i8.cu includes it after common.cuh.
#pragma once

#include "cuda/ops/device_util.cuh"
#include "runtime/error.hpp"

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {
namespace {

// ---- tiled dp4a kernel: a 64x64 output tile per block of 256 threads, 4x4 outputs per thread

constexpr int tile_m = 64, tile_n = 64, tile_k = 32;
constexpr int tile_kp = tile_k + 4; // padded row in bytes: keeps int loads aligned, spreads banks

// The reference's epilogue expression, rounding step by step.
__device__ __forceinline__ float scale_dot(int32_t dot, float sx, float sw, const float* bias, int64_t o) {
    return __fadd_rn(__fmul_rn(__fmul_rn(float(dot), sx), sw), bias ? bias[o] : 0.0f);
}

// out [M, N] = dot(qx[m], qw[n]) * sx[m] * sw[n] + bias[n]. VEC: K % 8 == 0 and 8-byte aligned
// rows, so each thread moves 8 bytes of A and of B per K-step with one load each.
template <bool VEC>
__global__ void __launch_bounds__(256)
gemm_i8_tiled_kernel(float* out, const int8_t* qx, const float* sx, const int8_t* qw, const float* sw,
                     const float* bias, int64_t M, int64_t N, int64_t K) {
    __shared__ __align__(16) int8_t as[tile_m][tile_kp];
    __shared__ __align__(16) int8_t bs[tile_n][tile_kp];
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int64_t m0 = int64_t(blockIdx.y) * tile_m, n0 = int64_t(blockIdx.x) * tile_n;
    const int lr = tid / 4, lc = (tid % 4) * 8; // loader: row lr, bytes lc..lc+7 of the K-step
    int32_t acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += tile_k) {
        const int64_t k = k0 + lc;
        if (VEC) {
            int2 a = make_int2(0, 0), b = make_int2(0, 0);
            if (m0 + lr < M && k < K) a = *reinterpret_cast<const int2*>(qx + (m0 + lr) * K + k);
            if (n0 + lr < N && k < K) b = *reinterpret_cast<const int2*>(qw + (n0 + lr) * K + k);
            // Rows are 36 bytes apart (4-byte aligned, not 8): two int stores each.
            int* sa = reinterpret_cast<int*>(&as[lr][lc]);
            int* sb = reinterpret_cast<int*>(&bs[lr][lc]);
            sa[0] = a.x;
            sa[1] = a.y;
            sb[0] = b.x;
            sb[1] = b.y;
        } else {
            for (int j = 0; j < 8; ++j) {
                const bool in_k = k + j < K;
                as[lr][lc + j] = (m0 + lr < M && in_k) ? qx[(m0 + lr) * K + k + j] : int8_t(0);
                bs[lr][lc + j] = (n0 + lr < N && in_k) ? qw[(n0 + lr) * K + k + j] : int8_t(0);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < tile_k; kk += 4) {
            int a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const int*>(&as[ty * 4 + i][kk]);
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const int*>(&bs[tx * 4 + j][kk]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t m = m0 + ty * 4 + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t n = n0 + tx * 4 + j;
            if (n < N) out[m * N + n] = scale_dot(acc[i][j], sx[m], sw[n], bias, n);
        }
    }
}

// out [M, N] = d [M, N] (int32 dots) scaled per token and per channel.
__global__ void scale_i32_kernel(float* out, const int32_t* d, const float* sx, const float* sw, const float* bias,
                                 int64_t M, int64_t N) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= M * N) return;
    const int64_t m = idx / N, n = idx % N;
    out[idx] = scale_dot(d[idx], sx[m], sw[n], bias, n);
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

void run_tiled(const context& c, float* out, const int8_t* qx, const float* sx, int64_t M, const int8_t* qw,
               const float* sw, int64_t N, int64_t K, const float* bias) {
    const dim3 grid{unsigned((N + tile_n - 1) / tile_n), unsigned((M + tile_m - 1) / tile_m)};
    TANDEM_ASSERT(grid.y <= 65535u, "matmul_i8: {} tokens exceed one launch", M);
    if (K % 8 == 0 && aligned(qx, 8) && aligned(qw, 8))
        launch_kernel(c, gemm_i8_tiled_kernel<true>, grid, 256, 0, out, qx, sx, qw, sw, bias, M, N, K);
    else
        launch_kernel(c, gemm_i8_tiled_kernel<false>, grid, 256, 0, out, qx, sx, qw, sw, bias, M, N, K);
}

// out [M, N] = d [M, N] (int32 dots) scaled per token and per channel, plus bias.
void scale_i32(const context& c, float* out, const int32_t* d, const float* sx, const float* sw, const float* bias,
               int64_t M, int64_t N) {
    launch_kernel(c, scale_i32_kernel, grid_1d(M * N, 256), 256, 0, out, d, sx, sw, bias, M, N);
}

} // namespace
} // namespace tandem::cuda
