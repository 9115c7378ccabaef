// Stand-in for the CUDA runtime API in the emulated build (see cuda_emu.hpp): the calls Tandem
// makes, on one device whose memory is host memory. Copies and launches complete before they
// return, so streams and events are bookkeeping. The device has a memory limit, 8 GiB or
// $TANDEM_EMU_DEVICE_MIB, so running out of it can be tested; failed calls set the sticky
// error cudaGetLastError returns.
#pragma once

#include "cuda_emu.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorIllegalAddress = 700,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };

constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostRegisterPortable = 1;

struct CUstream_st {};
using cudaStream_t = CUstream_st*;
struct CUevent_st {
    std::chrono::steady_clock::time_point t;
};
using cudaEvent_t = CUevent_st*;
struct CUmemPoolHandle_st {};
using cudaMemPool_t = CUmemPoolHandle_st*;

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
    int multiProcessorCount;
};

namespace tandem::cuda_emu {

inline size_t emu_device_bytes() {
    static const size_t bytes = [] {
        const char* mib = std::getenv("TANDEM_EMU_DEVICE_MIB");
        return mib && *mib ? size_t(std::strtoull(mib, nullptr, 10)) << 20 : size_t(8) << 30;
    }();
    return bytes;
}
constexpr int emu_smem_optin = 227 * 1024; // an H100/H200's

struct runtime_state {
    std::mutex mu;
    std::map<void*, size_t> allocs; // device allocations and their sizes
    size_t used = 0;
    std::set<void*> registered;    // host ranges registered
    cudaError_t last = cudaSuccess;
    int device = 0;
    CUmemPoolHandle_st pool;
    std::map<const void*, int> smem_optin; // kernel -> the dynamic shared memory it may use
};
inline runtime_state& rt() {
    static runtime_state s;
    return s;
}
inline cudaError_t fail_with(cudaError_t e) {
    rt().last = e;
    return e;
}
// A sticky device error, as a kernel's illegal address leaves one: once the file that
// TANDEM_EMU_FAULT_FILE names exists, every synchronize of this process fails from then on.
inline bool sticky_fault() {
    static const char* path = std::getenv("TANDEM_EMU_FAULT_FILE");
    static std::atomic<bool> faulted{false};
    if (!faulted && path && *path && ::access(path, F_OK) == 0) faulted = true;
    return faulted;
}
inline cudaError_t synchronized() {
    return sticky_fault() ? fail_with(cudaErrorIllegalAddress) : cudaSuccess;
}
// Whether Linux would refuse to pin p long-term for writing, as the real cudaHostRegister
// does (seen on an H200 machine: cudaErrorInvalidValue): p lies in a shared mapping of a file
// that needs dirty tracking, i.e. one not on tmpfs or hugetlbfs (memfds are tmpfs).
inline bool unpinnable(const void* p) {
    std::ifstream maps("/proc/self/maps");
    const auto at = reinterpret_cast<uintptr_t>(p);
    for (std::string line; std::getline(maps, line);) {
        std::istringstream in(line);
        std::string range, perms, offset, dev, inode, path;
        in >> range >> perms >> offset >> dev >> inode;
        std::getline(in >> std::ws, path);
        const size_t dash = range.find('-');
        const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16);
        const uintptr_t hi = std::stoull(range.substr(dash + 1), nullptr, 16);
        if (at < lo || at >= hi) continue;
        if (perms.size() < 4 || perms[3] != 's' || path.empty() || path[0] != '/' || path.rfind("/memfd:", 0) == 0)
            return false;
        struct statfs st {};
        if (::statfs(path.c_str(), &st) != 0) return false; // removed since: cannot tell
        return st.f_type != TMPFS_MAGIC && st.f_type != HUGETLBFS_MAGIC;
    }
    return false;
}

} // namespace tandem::cuda_emu

inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    }
    return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError() {
    if (tandem::cuda_emu::sticky_fault()) return cudaErrorIllegalAddress; // never cleared
    const cudaError_t e = tandem::cuda_emu::rt().last;
    tandem::cuda_emu::rt().last = cudaSuccess;
    return e;
}

inline cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
    *d = tandem::cuda_emu::rt().device;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
    if (d != 0) return tandem::cuda_emu::fail_with(cudaErrorInvalidDevice);
    tandem::cuda_emu::rt().device = d;
    return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    if (d != 0) return tandem::cuda_emu::fail_with(cudaErrorInvalidDevice);
    *p = cudaDeviceProp{};
    std::strcpy(p->name, "emulated CUDA device (the host)");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = tandem::cuda_emu::emu_device_bytes();
    p->multiProcessorCount = 1;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
    if (d != 0) return tandem::cuda_emu::fail_with(cudaErrorInvalidDevice);
    if (a != cudaDevAttrMaxSharedMemoryPerBlockOptin) return tandem::cuda_emu::fail_with(cudaErrorInvalidValue);
    *v = tandem::cuda_emu::emu_smem_optin;
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
    auto& s = tandem::cuda_emu::rt();
    std::lock_guard lock(s.mu);
    *total_b = tandem::cuda_emu::emu_device_bytes();
    *free_b = *total_b - s.used;
    return cudaSuccess;
}

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    auto& s = tandem::cuda_emu::rt();
    std::lock_guard lock(s.mu);
    if (bytes > tandem::cuda_emu::emu_device_bytes() - s.used) return tandem::cuda_emu::fail_with(cudaErrorMemoryAllocation);
    *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256); // cudaMalloc's alignment
    if (!*p) return tandem::cuda_emu::fail_with(cudaErrorMemoryAllocation);
    s.allocs[*p] = bytes;
    s.used += bytes;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    auto& s = tandem::cuda_emu::rt();
    std::lock_guard lock(s.mu);
    const auto it = s.allocs.find(p);
    if (it == s.allocs.end()) return tandem::cuda_emu::fail_with(cudaErrorInvalidDevicePointer);
    s.used -= it->second;
    s.allocs.erase(it);
    std::free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int d) {
    if (d != 0) return tandem::cuda_emu::fail_with(cudaErrorInvalidDevice);
    *pool = &tandem::cuda_emu::rt().pool;
    return cudaSuccess;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    *s = new CUstream_st;
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return tandem::cuda_emu::synchronized(); }
inline cudaError_t cudaDeviceSynchronize() { return tandem::cuda_emu::synchronized(); }

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t = nullptr) {
    if (bytes && (!dst || !src)) return tandem::cuda_emu::fail_with(cudaErrorInvalidValue);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind k) {
    return cudaMemcpyAsync(dst, src, bytes, k);
}
inline cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                     size_t height, cudaMemcpyKind, cudaStream_t = nullptr) {
    if (width > dpitch || width > spitch) return tandem::cuda_emu::fail_with(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; ++r)
        std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t = nullptr) {
    std::memset(p, v, bytes);
    return cudaSuccess;
}

inline cudaError_t cudaHostRegister(void* p, size_t, unsigned) {
    if (tandem::cuda_emu::unpinnable(p)) return tandem::cuda_emu::fail_with(cudaErrorInvalidValue);
    auto& s = tandem::cuda_emu::rt();
    std::lock_guard lock(s.mu);
    if (!s.registered.insert(p).second) return tandem::cuda_emu::fail_with(cudaErrorHostMemoryAlreadyRegistered);
    return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void* p) {
    auto& s = tandem::cuda_emu::rt();
    std::lock_guard lock(s.mu);
    if (s.registered.erase(p) == 0) return tandem::cuda_emu::fail_with(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
    *e = new CUevent_st;
    return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr) {
    e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}

template <class F> cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute a, int v) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > tandem::cuda_emu::emu_smem_optin)
        return tandem::cuda_emu::fail_with(cudaErrorInvalidValue);
    auto& s = tandem::cuda_emu::rt();
    std::lock_guard lock(s.mu);
    s.smem_optin[reinterpret_cast<const void*>(kernel)] = v;
    return cudaSuccess;
}

namespace tandem::cuda_emu {

// A launch as the device takes it: a configuration it refuses (no blocks, too many threads,
// more than 48 KiB of dynamic shared memory without the kernel's opt-in) runs nothing and
// leaves the error for cudaGetLastError; otherwise the kernel runs to its end.
template <class Body> void launch_checked(const void* kernel, dim3 grid, dim3 block, size_t smem, Body&& body) {
    const uint64_t threads = uint64_t(block.x) * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || threads == 0 ||
        threads > 1024) {
        fail_with(cudaErrorInvalidConfiguration);
        return;
    }
    size_t limit = 48 * 1024;
    {
        std::lock_guard lock(rt().mu);
        if (const auto it = rt().smem_optin.find(kernel); it != rt().smem_optin.end())
            limit = std::max(limit, size_t(it->second));
    }
    if (smem > limit) {
        fail_with(cudaErrorInvalidValue);
        return;
    }
    launch(grid, block, smem, std::forward<Body>(body));
}

} // namespace tandem::cuda_emu
