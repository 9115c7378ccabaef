// The CUDA runner: the model forward on one GPU, reading past K/V from host pages and writing
// the new K/V back into them, so a CPU worker can continue from the same pages.
#pragma once

#include "runtime/runner.hpp"

#include <cstdint>
#include <memory>

namespace tandem {

// Uploads the model's INT8 weights to `device` once. Throws tandem::error when there is no
// such device, the weights are not INT8, or the device is out of memory.
std::unique_ptr<runner> make_cuda_runner(model& mdl, int device);

namespace cuda {

// What the last forward of a CUDA runner spent on the K/V hand-off (device to host pages),
// measured with events on its stream.
struct forward_stats {
    double forward_s = 0;      // the whole forward, uploads to logits on the host
    double handoff_s = 0;      // the new K/V copied back into the host pages
    int64_t handoff_bytes = 0;
    int64_t upload_bytes = 0;  // past K/V pages copied to the device mirror
};
// The stats of a runner made by make_cuda_runner; null for any other runner.
const forward_stats* stats_of(const runner& r);

} // namespace cuda
} // namespace tandem
