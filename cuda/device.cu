// CUDA device discovery and per-device context.
#include "cuda/check.hpp"
#include "cuda/device.hpp"

#include <fmt/format.h>

namespace tandem::cuda {

std::vector<device_info> list_devices(std::string* why) {
    std::vector<device_info> out;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why) *why = cudaGetErrorString(err);
        cudaGetLastError(); // clear the sticky error so later calls start clean
        return out;
    }
    if (n == 0 && why) *why = "no CUDA device";
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        device_info d;
        d.index = i;
        d.name = p.name;
        d.cc_major = p.major;
        d.cc_minor = p.minor;
        d.total_mem = p.totalGlobalMem;
        d.n_sm = p.multiProcessorCount;
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            d.free_mem = free_b;
        out.push_back(std::move(d));
    }
    return out;
}

struct context::impl {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t blaslt = nullptr;
};

context::context(int device) : device_(device), impl_(std::make_unique<impl>()) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&impl_->blaslt));
}

context::~context() {
    cudaSetDevice(device_);
    if (impl_->blaslt) cublasLtDestroy(impl_->blaslt);
    if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void* context::stream() const { return impl_->stream; }
void* context::blaslt() const { return impl_->blaslt; }

void context::synchronize() const {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

void* context::alloc(size_t bytes) const {
    CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, bytes, impl_->stream);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        throw error(fmt::format("CUDA device {}: out of memory allocating {} MiB ({} MiB free of {} MiB)",
                                device_, bytes >> 20, free_b >> 20, total_b >> 20));
    }
    CUDA_CHECK(err);
    return p;
}

void context::free(void* p) const {
    if (!p) return;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaFreeAsync(p, impl_->stream));
}

} // namespace tandem::cuda
