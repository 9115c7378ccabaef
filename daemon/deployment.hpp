// Composition: the placement policy turned into executors, and the runner a worker process
// runs its batches on. The one place the daemon names a backend.
#pragma once

#include "daemon/config.hpp"
#include "daemon/worker_spec.hpp"
#include "runtime/engine.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/runner.hpp"

#include <memory>
#include <string>
#include <vector>

namespace tandem::daemon {

// The prefill and decode workers of cfg's placement ("cpu", "gpu" or "auto" each) and the
// devices they were given ("cpu", "cuda:0"). Throws tandem::error when a GPU is asked for
// and none is usable.
struct deployment {
    std::string prefill_device, decode_device;
    std::vector<std::unique_ptr<executor>> executors;
};
// base: what both workers share (model, pool, sizes); n_threads: the default per CPU worker.
deployment deploy_workers(const config& cfg, const worker_spec& base, int n_threads);

// The runner of a worker process on its spec's device over the pool's pages `kv` (GPU: the
// pages are pinned for fast copies; the decode worker keeps its device pages between steps).
std::unique_ptr<runner> make_worker_runner(const worker_spec& s, model& m, kv_cache& kv);

// What a worker's runner reports after a batch: past K/V uploaded and found on the device,
// and the device pages it holds (a GPU runner; nullopt for any other).
struct device_kv_report {
    int64_t upload_bytes = 0, kept_bytes = 0;
    int32_t mirror_pages = 0;
};
std::optional<device_kv_report> device_kv_of(const runner& r);

} // namespace tandem::daemon
