// Placement to executors, and the worker's runner by device.
#include "daemon/deployment.hpp"

#include "daemon/worker_executor.hpp"
#include "ipc/kv_pool.hpp"
#include "runtime/error.hpp"
#include "runtime/log.hpp"
#if TANDEM_HAVE_CUDA
#include "cuda/device.hpp"
#include "cuda/runner.hpp"
#endif

#include <cstdlib>

namespace tandem::daemon {
namespace {

// What only a CUDA build has; the rest of the daemon asks here.
#if TANDEM_HAVE_CUDA
int n_cuda_devices(std::string& why) { return int(cuda::list_devices(&why).size()); }

std::unique_ptr<runner> make_gpu_runner(const worker_spec& s, model& m, kv_cache& kv) {
    const int dev = s.device.size() > 5 ? std::atoi(s.device.c_str() + 5) : 0;
    // The decode worker keeps its pages on the device between steps (a step then uploads
    // only what the device lacks); the prefill worker's forwards read little of the past
    // and it may share the device, so it uploads into scratch.
    cuda_runner_options ro;
    ro.keep_pages = s.role == "decode";
    auto run = make_cuda_runner(m, dev, ro);
    // Pinned pages: K/V copies to and from the pool run asynchronously at full bus speed.
    // (This makes the whole pool resident; the worker keeps it registered until it exits.)
    // A pool the kernel will not pin (a file on disk) still works, its copies staged.
    if (std::string why; !cuda::try_register_host(kv.base(), size_t(kv.bytes()), why))
        logger(s.role)->warn("cannot page-lock the KV pool {} ({}: {}); K/V copies to and from {} are staged "
                             "through the driver, slower: put kv_pool on a tmpfs such as /dev/shm",
                             s.pool, ipc::file_system_name(s.pool), why, s.device);
    return run;
}

std::optional<device_kv_report> gpu_report(const runner& r) {
    if (const auto* st = cuda::stats_of(r)) return device_kv_report{st->upload_bytes, st->kept_bytes, st->mirror_pages};
    return std::nullopt;
}
#else
int n_cuda_devices(std::string& why) {
    why = "this build has no CUDA support";
    return 0;
}

std::unique_ptr<runner> make_gpu_runner(const worker_spec& s, model&, kv_cache&) {
    fail("device {}: this build has no CUDA runner", s.device);
}

std::optional<device_kv_report> gpu_report(const runner&) { return std::nullopt; }
#endif

} // namespace

deployment deploy_workers(const config& cfg, const worker_spec& base, int n_threads) {
    std::string no_gpu_why;
    const bool have_gpu = (cfg.prefill != "cpu" || cfg.decode == "gpu") && n_cuda_devices(no_gpu_why) > 0;
    auto place = [&](const std::string& want, bool prefill) -> std::string {
        if (want == "gpu") {
            TANDEM_CHECK(have_gpu, "{}=gpu: no CUDA device is usable ({})", prefill ? "prefill" : "decode", no_gpu_why);
            return "cuda:0";
        }
        if (want == "auto" && prefill && have_gpu) return "cuda:0";
        return "cpu";
    };
    worker_spec pre = base, dec = base;
    pre.role = "prefill";
    pre.device = place(cfg.prefill, true);
    dec.role = "decode";
    dec.device = place(cfg.decode, false);
    // Both CPU workers may use every core by default: a lone request is in one phase at a
    // time, and idle pools sleep. Split the cores (prefill_threads/decode_threads) when
    // many requests keep both phases busy.
    pre.n_threads = pre.device == "cpu" ? (cfg.prefill_threads > 0 ? cfg.prefill_threads : n_threads) : 1;
    dec.n_threads = dec.device == "cpu" ? (cfg.decode_threads > 0 ? cfg.decode_threads : n_threads) : 1;
    dec.max_tokens = std::min(base.max_tokens, base.max_rows); // each token of a decode step wants a row
    deployment d;
    d.prefill_device = pre.device;
    d.decode_device = dec.device;
    d.executors.push_back(make_worker_executor(pre, work_kind::prefill));
    d.executors.push_back(make_worker_executor(dec, work_kind::decode));
    return d;
}

std::unique_ptr<runner> make_worker_runner(const worker_spec& s, model& m, kv_cache& kv) {
    return s.device == "cpu" ? make_cpu_runner(m, s.n_threads) : make_gpu_runner(s, m, kv);
}

std::optional<device_kv_report> device_kv_of(const runner& r) { return gpu_report(r); }

} // namespace tandem::daemon
