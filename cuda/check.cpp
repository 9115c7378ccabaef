// Error formatting for CUDA_CHECK and CUBLAS_CHECK.
#include "cuda/check.hpp"

#include "cuda/blaslt.hpp"

#include <fmt/format.h>

namespace tandem::cuda {
namespace {

int current_device() {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    return dev;
}

} // namespace

void throw_cuda_error(cudaError_t err, const char* stmt, const char* file, int line) {
    throw error(fmt::format("CUDA error on device {}: {} ({}) in `{}` at {}:{}", current_device(),
                            cudaGetErrorString(err), cudaGetErrorName(err), stmt, file, line));
}

void throw_cublas_error(cublasStatus_t st, const char* stmt, const char* file, int line) {
    throw error(fmt::format("cuBLAS error on device {}: {} ({}) in `{}` at {}:{}", current_device(),
                            blaslt_loaded() ? blaslt().GetStatusString(st) : "status", int(st), stmt, file, line));
}

} // namespace tandem::cuda
