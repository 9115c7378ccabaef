// CUDA device discovery, a per-device context (stream, cuBLASLt handle, workspace), device
// buffers and host-memory registration. No CUDA header here: handles are opaque pointers.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tandem::cuda {

struct device_info {
    int index = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    size_t total_mem = 0, free_mem = 0;
    int n_sm = 0;
};

// Every usable device. Any error from the driver (none installed, no device) means "no
// device": an empty list and, in `why`, the driver's message.
std::vector<device_info> list_devices(std::string* why = nullptr);

// A device made current, with its own non-blocking stream, cuBLASLt handle and workspace.
// Every op given this context runs on its stream, in issue order.
class context {
public:
    explicit context(int device);
    ~context();
    context(const context&) = delete;
    context& operator=(const context&) = delete;

    int device() const { return device_; }
    void* stream() const;        // cudaStream_t
    void* blaslt() const;        // cublasLtHandle_t
    void* workspace() const;     // cuBLASLt workspace, workspace_bytes() long
    size_t workspace_bytes() const;
    void synchronize() const;
    // Makes this context's device current on the calling thread (every member does it too).
    void make_current() const;

    // Device memory, stream-ordered; throws tandem::error naming the size and free memory
    // when out of memory.
    void* alloc(size_t bytes) const;
    void free(void* p) const;

    // Copies on the stream. They are asynchronous: synchronize() before the host reads `dst`
    // of a download or reuses `src` of an upload. With pageable (unregistered) host memory
    // the driver stages them, which is slower but never wrong.
    void upload(void* dst_dev, const void* src_host, size_t bytes) const;
    void download(void* dst_host, const void* src_dev, size_t bytes) const;
    void copy(void* dst_dev, const void* src_dev, size_t bytes) const;

private:
    int device_;
    struct impl;
    std::unique_ptr<impl> impl_;
};

// Device memory owned by one context (freed on its stream). Move-only.
class buffer {
public:
    buffer() = default;
    buffer(const context& ctx, size_t bytes);
    ~buffer();
    buffer(buffer&& o) noexcept;
    buffer& operator=(buffer&& o) noexcept;
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;

    void* get() const { return p_; }
    size_t bytes() const { return bytes_; }
    template <class T> T* as() const { return static_cast<T*>(p_); }

private:
    void release() noexcept;
    const context* ctx_ = nullptr;
    void* p_ = nullptr;
    size_t bytes_ = 0;
};

// A device copy of a small host array for the ops queued next (a block table, a bias); the
// host array may change as soon as this returns (the driver stages pageable memory).
buffer to_device(const context& ctx, const void* host, size_t bytes);

// Page-locks host memory so copies to and from it run asynchronously at full speed (the
// shared KV pool). The range must not be registered already; unregister_host takes the
// pointer register_host was given.
void register_host(void* p, size_t bytes);
void unregister_host(void* p);
// register_host where a refusal is an answer: false, and the driver's reason in `why`. Linux
// refuses to pin a writable shared mapping of a file on disk (only tmpfs and hugetlbfs files
// pin); copies to and from unpinned memory still work, staged by the driver.
bool try_register_host(void* p, size_t bytes, std::string& why);

} // namespace tandem::cuda
