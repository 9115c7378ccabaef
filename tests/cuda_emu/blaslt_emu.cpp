// cuda/blaslt.cpp's counterpart in the emulated build: the cuBLASLt entry points are the
// stand-ins of tests/cuda_emu/cublasLt.h, nothing is loaded.
#include "cuda/blaslt.hpp"

#include <atomic>

namespace tandem::cuda {
namespace {
std::atomic<bool> loaded{false};
} // namespace

const blaslt_api& blaslt() {
    static const blaslt_api api{
        cublasLtCreate,
        cublasLtDestroy,
        cublasLtGetStatusString,
        cublasLtMatmulDescCreate,
        cublasLtMatmulDescDestroy,
        cublasLtMatmulDescSetAttribute,
        cublasLtMatrixLayoutCreate,
        cublasLtMatrixLayoutDestroy,
        cublasLtMatmulPreferenceCreate,
        cublasLtMatmulPreferenceDestroy,
        cublasLtMatmulPreferenceSetAttribute,
        cublasLtMatmulAlgoGetHeuristic,
        cublasLtMatmul,
    };
    loaded = true;
    return api;
}

bool blaslt_loaded() { return loaded; }

} // namespace tandem::cuda
