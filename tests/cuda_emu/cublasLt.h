// Stand-in for cuBLASLt in the emulated build (see cuda_emu.hpp): the int8 GEMM Tandem asks it
// for, computed on the host from the descriptors as cuBLASLt documents them (column-major
// matrices, D = alpha op(A) op(B) + beta C). Descriptors whose shapes do not chain up are
// refused with CUBLAS_STATUS_INVALID_VALUE, so a wrong layout shows here too. What it accepts:
// int8 A and B, int32 C/D, 32-bit integer compute, A transposed and B not (the IMMA "TN" form).
#pragma once

#include "cuda_runtime.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasComputeType_t { CUBLAS_COMPUTE_32I = 72 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_8I = 3, CUDA_R_32I = 10 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasLtMatmulDescAttributes_t { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 };
enum cublasLtMatmulPreferenceAttributes_t { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 };

struct cublasLtContext {};
using cublasLtHandle_t = cublasLtContext*;
struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cudaDataType scale;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
struct cublasLtMatmulPreferenceOpaque_t {};
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;
struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
    *h = new cublasLtContext;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
inline const char* cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(emulated, other)";
    }
}
namespace tandem::cuda_emu {
// Descriptors live here until the process ends (a plan cache keeps some that long; kept
// reachable, they are no leak to LeakSanitizer). Destroying one is a no-op.
template <class T> T* lt_object(T v) {
    static std::deque<T> all;
    static std::mutex mu;
    std::lock_guard lock(mu);
    return &all.emplace_back(v);
}
} // namespace tandem::cuda_emu

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType scale) {
    *d = tandem::cuda_emu::lt_object(cublasLtMatmulDescOpaque_t{compute, scale});
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                     const void* buf, size_t size) {
    if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(a == CUBLASLT_MATMUL_DESC_TRANSA ? &d->ta : &d->tb, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    if (ld < int64_t(rows)) return CUBLAS_STATUS_INVALID_VALUE; // column-major: ld >= rows
    *l = tandem::cuda_emu::lt_object(cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld});
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new cublasLtMatmulPreferenceOpaque_t;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                           cublasLtMatmulPreferenceAttributes_t, const void*, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}

namespace tandem::cuda_emu {
// m, n, k of D = op(A) op(B) when the descriptors chain up and are the int8 TN form.
inline bool lt_shape(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, uint64_t& m, uint64_t& n, uint64_t& k) {
    if (d->compute != CUBLAS_COMPUTE_32I || d->scale != CUDA_R_32I || d->ta != CUBLAS_OP_T || d->tb != CUBLAS_OP_N)
        return false;
    if (a->type != CUDA_R_8I || b->type != CUDA_R_8I || c->type != CUDA_R_32I || dd->type != CUDA_R_32I) return false;
    m = a->cols; // op(A) = A^T: m x k
    k = a->rows;
    n = b->cols; // op(B) = B: k x n
    return b->rows == k && dd->rows == m && dd->cols == n && c->rows == m && c->cols == n;
}
} // namespace tandem::cuda_emu

inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                     cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t, int requested,
                                                     cublasLtMatmulHeuristicResult_t* res, int* n_res) {
    uint64_t m, n, k;
    *n_res = 0;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (!tandem::cuda_emu::lt_shape(d, a, b, c, dd, m, n, k)) return CUBLAS_STATUS_NOT_SUPPORTED;
    *res = cublasLtMatmulHeuristicResult_t{};
    *n_res = 1;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                                     cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b,
                                     const void* beta, const void* C, cublasLtMatrixLayout_t c, void* D,
                                     cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t*, void*, size_t,
                                     cudaStream_t) {
    uint64_t m, n, k;
    if (!tandem::cuda_emu::lt_shape(d, a, b, c, dd, m, n, k)) return CUBLAS_STATUS_INVALID_VALUE;
    const int32_t al = *static_cast<const int32_t*>(alpha), be = *static_cast<const int32_t*>(beta);
    const auto* pa = static_cast<const int8_t*>(A);
    const auto* pb = static_cast<const int8_t*>(B);
    const auto* pc = static_cast<const int32_t*>(C);
    auto* pd = static_cast<int32_t*>(D);
    for (uint64_t j = 0; j < n; ++j)
        for (uint64_t i = 0; i < m; ++i) {
            int32_t acc = 0;
            for (uint64_t l = 0; l < k; ++l) // op(A)(i, l) = A(l, i); B(l, j)
                acc += int32_t(pa[l + i * uint64_t(a->ld)]) * int32_t(pb[l + j * uint64_t(b->ld)]);
            const int32_t cv = be != 0 ? pc[i + j * uint64_t(c->ld)] : 0;
            pd[i + j * uint64_t(dd->ld)] = al * acc + be * cv;
        }
    return CUBLAS_STATUS_SUCCESS;
}
