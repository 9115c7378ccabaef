// Per-token INT8 activation CUDA kernels: their source is quant_kernels.cuh (tests/test_cuda_emu.cpp
// also runs it on the host); this compiles it for the device.
#include "cuda/ops/common.cuh"

#include "cuda/ops/quant_kernels.cuh"
