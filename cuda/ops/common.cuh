// The CUDA runtime side of the kernels: the stream, launches and their checks, the dynamic
// shared memory. The device helpers every kernel uses are in device_util.cuh, which
// tests/cuda_emu.hpp can compile for the host; so are the *_kernels.cuh sources.
#pragma once

#include "cuda/check.hpp"
#include "cuda/device.hpp"

#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <utility>

namespace tandem::cuda {

inline cudaStream_t stream_of(const context& c) { return static_cast<cudaStream_t>(c.stream()); }

// Every launch is followed by this: a bad launch configuration throws right there.
#define TANDEM_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

// kernel<<<grid, block, smem, the context's stream>>>(args...), checked. Kernel sources launch
// through this (tests/cuda_emu.hpp has its host twin).
template <class... P, class... A>
void launch_kernel(const context& c, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
    kernel<<<grid, block, smem, stream_of(c)>>>(std::forward<A>(args)...);
    TANDEM_LAUNCH_CHECK();
}

// The block's dynamic shared memory (the launch's smem bytes), 128-byte aligned.
__device__ __forceinline__ unsigned char* dynamic_smem() {
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    return dyn_smem;
}

} // namespace tandem::cuda

#include "cuda/ops/device_util.cuh"
