// CUDA_CHECK / CUBLAS_CHECK: failed calls throw tandem::error naming the statement and device.
#pragma once

#include "runtime/error.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace tandem::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* stmt, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* stmt, const char* file, int line);

} // namespace tandem::cuda

#define CUDA_CHECK(stmt)                                                                        \
    do {                                                                                        \
        cudaError_t err_ = (stmt);                                                              \
        if (err_ != cudaSuccess) [[unlikely]]                                                   \
            ::tandem::cuda::throw_cuda_error(err_, #stmt, __FILE__, __LINE__);                  \
    } while (0)

#define CUBLAS_CHECK(stmt)                                                                      \
    do {                                                                                        \
        cublasStatus_t st_ = (stmt);                                                            \
        if (st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                          \
            ::tandem::cuda::throw_cublas_error(st_, #stmt, __FILE__, __LINE__);                 \
    } while (0)
