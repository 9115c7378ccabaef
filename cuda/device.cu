// CUDA device discovery, per-device context, device buffers, host registration.
#include "cuda/blaslt.hpp"
#include "cuda/check.hpp"
#include "cuda/device.hpp"
#include "cuda/ops/register.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <utility>

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
    int current = 0;
    cudaGetDevice(&current); // restored below: the query must not move the caller's device
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
    if (n > 0) cudaSetDevice(current);
    return out;
}

namespace {
// cuBLASLt's recommended workspace for Hopper is 32 MiB; smaller GPUs use less of it.
constexpr size_t workspace_size = size_t(32) << 20;
} // namespace

struct context::impl {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t blaslt = nullptr;
    void* workspace = nullptr;
};

context::context(int device) : device_(device), impl_(std::make_unique<impl>()) {
    register_ops(); // whoever can run CUDA ops has them dispatched (runtime/ops' CUDA slots)
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(tandem::cuda::blaslt().Create(&impl_->blaslt));
    // Stream-ordered allocations come back to the pool instead of the driver at every
    // synchronize, so per-batch scratch costs no cudaMalloc after the first batch.
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    impl_->workspace = alloc(workspace_size);
}

context::~context() {
    cudaSetDevice(device_);
    if (impl_->stream) cudaStreamSynchronize(impl_->stream);
    if (impl_->workspace) cudaFreeAsync(impl_->workspace, impl_->stream);
    if (impl_->blaslt) tandem::cuda::blaslt().Destroy(impl_->blaslt);
    if (impl_->stream) {
        cudaStreamSynchronize(impl_->stream);
        cudaStreamDestroy(impl_->stream);
    }
}

void* context::stream() const { return impl_->stream; }
void* context::blaslt() const { return impl_->blaslt; }
void* context::workspace() const { return impl_->workspace; }
size_t context::workspace_bytes() const { return workspace_size; }

void context::make_current() const { CUDA_CHECK(cudaSetDevice(device_)); }

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

void context::upload(void* dst_dev, const void* src_host, size_t bytes) const {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, impl_->stream));
}

void context::download(void* dst_host, const void* src_dev, size_t bytes) const {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, impl_->stream));
}

void context::copy(void* dst_dev, const void* src_dev, size_t bytes) const {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, impl_->stream));
}

buffer::buffer(const context& ctx, size_t bytes) : ctx_(&ctx), p_(bytes ? ctx.alloc(bytes) : nullptr), bytes_(bytes) {}

buffer::~buffer() { release(); }

buffer::buffer(buffer&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

buffer& buffer::operator=(buffer&& o) noexcept {
    if (this != &o) {
        release();
        ctx_ = std::exchange(o.ctx_, nullptr);
        p_ = std::exchange(o.p_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void buffer::release() noexcept {
    if (p_ && ctx_) {
        // A destructor must not throw; a failed free leaks at worst.
        cudaSetDevice(ctx_->device());
        cudaFreeAsync(p_, static_cast<cudaStream_t>(ctx_->stream()));
    }
    p_ = nullptr;
    bytes_ = 0;
}

buffer to_device(const context& ctx, const void* host, size_t bytes) {
    buffer b(ctx, bytes);
    ctx.upload(b.get(), host, bytes);
    return b;
}

void register_host(void* p, size_t bytes) {
    CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
}

void unregister_host(void* p) { CUDA_CHECK(cudaHostUnregister(p)); }

bool try_register_host(void* p, size_t bytes, std::string& why) {
    const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (err == cudaSuccess) return true;
    cudaGetLastError(); // not a sticky error: clear it so later calls start clean
    why = fmt::format("{} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
    return false;
}

} // namespace tandem::cuda
