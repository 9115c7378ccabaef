// CUDA backend basics: device discovery, context, error checks, out-of-memory reporting.
// Without a device every case prints "skipped: no CUDA device" and passes.
#include "cuda/check.hpp"
#include "cuda/device.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace tandem;

namespace {

bool have_device() {
    std::string why;
    const auto devs = cuda::list_devices(&why);
    if (devs.empty()) MESSAGE("skipped: no CUDA device (", why, ")");
    return !devs.empty();
}

} // namespace

TEST_CASE("CUDA_CHECK turns an error into tandem::error naming the statement") {
    // Needs no device: the macro only formats what the runtime returns.
    try {
        CUDA_CHECK(cudaErrorInvalidValue);
        FAIL("no throw");
    } catch (const error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("cudaErrorInvalidValue") != std::string::npos);
        CHECK(msg.find("CUDA error on device") == 0);
    }
    try {
        CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
        FAIL("no throw");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("cuBLAS error") == 0);
    }
}

TEST_CASE("device query, context, allocation") {
    if (!have_device()) return;
    const auto devs = cuda::list_devices();
    for (const auto& d : devs) {
        MESSAGE("device ", d.index, ": ", d.name, " sm_", d.cc_major, d.cc_minor, ", ", d.total_mem >> 20, " MiB");
        CHECK(d.total_mem > 0);
        CHECK(d.n_sm > 0);
    }
    cuda::context ctx(0);
    void* p = ctx.alloc(1 << 20);
    CHECK(p != nullptr);
    CUDA_CHECK(cudaMemsetAsync(p, 0x5a, 1 << 20, static_cast<cudaStream_t>(ctx.stream())));
    unsigned char host[16] = {};
    CUDA_CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(ctx.stream())));
    ctx.synchronize();
    CHECK(host[0] == 0x5a);
    CHECK(host[15] == 0x5a);
    ctx.free(p);
    ctx.synchronize();
}

TEST_CASE("out of device memory is a clear error, and the context stays usable") {
    if (!have_device()) return;
    cuda::context ctx(0);
    const size_t too_much = cuda::list_devices()[0].total_mem * 4;
    try {
        ctx.alloc(too_much);
        FAIL("no throw");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
    }
    void* p = ctx.alloc(4096);
    CHECK(p != nullptr);
    ctx.free(p);
    ctx.synchronize();
}
