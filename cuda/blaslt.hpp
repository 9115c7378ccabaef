// cuBLASLt, loaded when first used (dlopen) instead of linked: a CPU-only process (the
// `tandem` tool, the supervisor, CPU workers) then never maps the library, whose start-up
// relocations alone cost ~60 MiB of resident memory per process.
#pragma once

#include <cublasLt.h>

namespace tandem::cuda {

// The cuBLASLt entry points Tandem uses, resolved from libcublasLt.so.
struct blaslt_api {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtDestroy) Destroy;
    decltype(&cublasLtGetStatusString) GetStatusString;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmul) Matmul;
};

// Loads the library once (thread-safe); throws tandem::error naming the library and
// dlerror() when it or a symbol is missing.
const blaslt_api& blaslt();
// True once blaslt() has loaded it (error messages use the library's status strings then).
bool blaslt_loaded();

} // namespace tandem::cuda
