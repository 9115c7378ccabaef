// CUDA device discovery and a per-device context owning a stream and a cuBLASLt handle.
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

// A device made current, with its own non-blocking stream and cuBLASLt handle.
class context {
public:
    explicit context(int device);
    ~context();
    context(const context&) = delete;
    context& operator=(const context&) = delete;

    int device() const { return device_; }
    void* stream() const;        // cudaStream_t
    void* blaslt() const;        // cublasLtHandle_t
    void synchronize() const;

    // Device memory; throws tandem::error naming the size and free memory when out of memory.
    void* alloc(size_t bytes) const;
    void free(void* p) const;

private:
    int device_;
    struct impl;
    std::unique_ptr<impl> impl_;
};

} // namespace tandem::cuda
