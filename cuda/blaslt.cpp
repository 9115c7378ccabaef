// Lazy loading of cuBLASLt (see blaslt.hpp).
#include "cuda/blaslt.hpp"

#include "runtime/error.hpp"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

namespace tandem::cuda {
namespace {

std::atomic<bool> loaded{false};

blaslt_api load() {
    // The soname of the toolkit the build used first, then the unversioned development link.
    const std::string versioned = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = ::dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) h = ::dlopen("libcublasLt.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) fail("cannot load cuBLASLt ({}): {}", versioned, ::dlerror());
    blaslt_api a{};
    auto sym = [&](auto& fn, const char* name) {
        void* p = ::dlsym(h, name);
        if (!p) fail("cuBLASLt ({}) lacks {}", versioned, name);
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    sym(a.Create, "cublasLtCreate");
    sym(a.Destroy, "cublasLtDestroy");
    sym(a.GetStatusString, "cublasLtGetStatusString");
    sym(a.MatmulDescCreate, "cublasLtMatmulDescCreate");
    sym(a.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    sym(a.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    sym(a.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    sym(a.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    sym(a.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    sym(a.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    sym(a.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(a.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(a.Matmul, "cublasLtMatmul");
    return a; // the handle stays open for the life of the process
}

} // namespace

const blaslt_api& blaslt() {
    static const blaslt_api api = [] {
        blaslt_api a = load();
        loaded = true;
        return a;
    }();
    return api;
}

bool blaslt_loaded() { return loaded; }

} // namespace tandem::cuda
