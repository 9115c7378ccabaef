// Element-wise and row-wise CUDA kernels: their source is elementwise_kernels.cuh (tests/test_cuda_emu.cpp
// also runs it on the host); this compiles it for the device.
#include "cuda/ops/common.cuh"

#include "cuda/ops/elementwise_kernels.cuh"
