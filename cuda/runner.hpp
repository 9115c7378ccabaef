// The CUDA runner: the model forward on one GPU, reading past K/V from host pages and writing
// the new K/V back into them, so a CPU worker can continue from the same pages.
#pragma once

#include "runtime/runner.hpp"

#include <cstdint>
#include <memory>

namespace tandem {

struct cuda_runner_options {
    // Keep a device copy of the pool's pages between forwards (the decode worker): a forward
    // uploads only the past positions the device does not hold yet, by the pages' generations
    // (runtime/page_mirror.hpp), so a decode step stops re-copying its whole context. It
    // assumes one page pool for the runner's life (a different pool base, layout or size
    // starts the copy afresh). Off: each forward uploads every past page it reads into
    // scratch device memory (the prefill worker: it may share the device with a decode
    // worker, and a chunk reads little of the past).
    bool keep_pages = false;
    // Device memory for kept pages; 0: as many as the pool has, or as free memory allows
    // after a reserve (the larger of 1 GiB and an eighth of the device), least recently used
    // pages evicted first. Never less than one batch's pages.
    int64_t mirror_bytes = 0;
};

// Uploads the model's INT8 weights to `device` once. Throws tandem::error when there is no
// such device, the weights are not INT8, or the device is out of memory.
std::unique_ptr<runner> make_cuda_runner(model& mdl, int device, const cuda_runner_options& opts = {});

namespace cuda {

// What the last forward of a CUDA runner spent on the K/V hand-off (device to host pages),
// measured with events on its stream, and on bringing past K/V to the device.
struct forward_stats {
    double forward_s = 0;      // the whole forward, uploads to logits on the host
    double handoff_s = 0;      // the new K/V copied back into the host pages
    int64_t handoff_bytes = 0;
    int64_t upload_bytes = 0;  // past K/V copied from host pages to device pages
    int64_t kept_bytes = 0;    // past K/V the forward read that the device held already (keep_pages)
    int32_t mirror_pages = 0;  // device pages for host pages (kept between forwards with keep_pages)
    // Since the runner was made:
    int64_t total_upload_bytes = 0;
    int64_t total_kept_bytes = 0;
};
// The stats of a runner made by make_cuda_runner; null for any other runner.
const forward_stats* stats_of(const runner& r);

} // namespace cuda
} // namespace tandem
