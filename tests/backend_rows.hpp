// What the op suites share: memory for an op on any backend, the CUDA rows, and running an op
// on every backend and ISA level this machine has against the reference.
#pragma once

#include "cpu/isa.hpp"
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/attn_params.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/ops/dispatch.hpp"
#include "runtime/weight.hpp"
#include "runtime/weights.hpp"
#include "tests/op_data.hpp"
#if TANDEM_HAVE_CUDA
#include "cuda/device.hpp"
#include "cuda/weight.hpp"
#endif

#include <doctest/doctest.h>

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem::test {

// Named tolerances: f32 kernels differ from the reference only in summation order.
inline constexpr double tol_f32 = 1e-10;
inline constexpr double tol_transcendental = 1e-9; // exp/sin/cos in float vs the reference's
// INT8 kernels: integer dots are exact (GEMV and oneDNN alike) and the scaling is the
// reference's own expression, so results match bit for bit; a fused op may round an
// activation to the neighbouring int8 step where its vector exp differs in the last bits.
inline constexpr double tol_i8 = 1e-10;
inline constexpr double tol_i8_fused = 1e-5;
// F16/INT8 KV: pages hold the same bytes on every backend, so only summation order differs.
inline constexpr double tol_kv = 1e-9;

#if TANDEM_HAVE_CUDA
// The CUDA device the CUDA rows run on (device 0), or null: then each row prints as skipped.
inline cuda::context* cuda_device() {
    static std::string why;
    static const std::unique_ptr<cuda::context> ctx = []() -> std::unique_ptr<cuda::context> {
        if (cuda::list_devices(&why).empty()) return nullptr;
        return std::make_unique<cuda::context>(0);
    }();
    return ctx.get();
}
#endif

// Memory for one run of an op. On ref/cpu it hands back the host vectors themselves; on CUDA
// device copies of them (one per vector, made on first use), a device view of a weight, or a
// kv_cache over a device copy of the pages; finish() reads outputs (and pages) back.
class op_mem {
public:
    explicit op_mem(const exec_ctx& ctx) : ctx_(ctx) {}
    op_mem(const op_mem&) = delete;
    op_mem& operator=(const op_mem&) = delete;

    template <class T> const T* in(const std::vector<T>& v) { return dev(v.data(), v.size() * sizeof(T), nullptr); }
    // Read and written by the op: uploaded, and read back by finish().
    template <class T> T* out(std::vector<T>& v) { return dev(v.data(), v.size() * sizeof(T), v.data()); }

    // On the CPU, an INT8 matrix in rows goes in the layout the loader gives it at the active
    // ISA level (blocked from VNNI up), so the kernels a loaded model runs are the ones tested.
    const weight& w(const weight& host) {
#if TANDEM_HAVE_CUDA
        if (ctx_.be == backend::cuda) return weights_.emplace_back(*ctx_.cuda, host).view();
#endif
        if (ctx_.be == backend::cpu && host.is_i8() && host.layout == q_layout::rows &&
            cpu::matmul_i8_layout() == q_layout::blocked) {
            weight& c = laid_out_.emplace_back(host);
            pack_blocked(c);
            return c;
        }
        return host;
    }

    kv_cache& kv(kv_cache& host) {
#if TANDEM_HAVE_CUDA
        if (ctx_.be == backend::cuda) {
            uint8_t* d = dev(host.base(), size_t(host.bytes()), host.base());
            return caches_.emplace_back(host.layout(), host.n_pages(), d);
        }
#endif
        return host;
    }

    // attention and kv_store's parameters over the pages of `cache` (kv()), with these block
    // tables (in() on the backend, the vector itself as host_tables) and sequences, window and soft-cap.
    attn_params pages(kv_cache& cache, const std::vector<int32_t>& tables, const std::vector<attn_seq>& seqs,
                      int32_t window = 0, float softcap = 0.0f) {
        kv_cache& kc = kv(cache);
        return attn_params{kc.layout(), kc.base(), kc.n_pages(), in(tables), tables, seqs, window, softcap};
    }

    void finish() {
#if TANDEM_HAVE_CUDA
        if (ctx_.be != backend::cuda) return;
        for (const auto& [host, d] : reads_) ctx_.cuda->download(host, d.first, d.second);
        ctx_.cuda->synchronize();
#endif
    }

private:
    template <class T> T* dev(T* host, size_t bytes, void* read_back) {
#if TANDEM_HAVE_CUDA
        if (ctx_.be == backend::cuda) {
            auto it = copies_.find(host);
            if (it == copies_.end())
                it = copies_.emplace(host, cuda::to_device(*ctx_.cuda, host, std::max<size_t>(bytes, 1))).first;
            // Copies are found by address: another array at a dead one's address would get its
            // stale copy. Arrays an op reads must live as long as the op_mem.
            REQUIRE_MESSAGE(it->second.bytes() == std::max<size_t>(bytes, 1),
                            "op_mem: a different array at an address already copied (keep inputs alive)");
            if (read_back) reads_[read_back] = {it->second.get(), bytes};
            return static_cast<T*>(it->second.get());
        }
#endif
        (void)bytes;
        (void)read_back;
        return host;
    }

    const exec_ctx& ctx_;
    std::list<weight> laid_out_;
#if TANDEM_HAVE_CUDA
    std::map<const void*, cuda::buffer> copies_;
    std::map<void*, std::pair<void*, size_t>> reads_;
    std::list<cuda::device_weight> weights_;
    std::list<kv_cache> caches_;
#endif
};

// Whether an op has a CUDA twin to compare; one without prints as skipped.
enum class cuda_row { compare, none };

// Runs `op` on CUDA (device 0) and compares with `want`, or says why it cannot.
inline void run_cuda_row(const std::function<std::vector<float>(const exec_ctx&)>& op, const std::vector<float>& want,
                  double tol, const std::string& what) {
#if TANDEM_HAVE_CUDA
    cuda::context* c = cuda_device();
    if (!c) {
        MESSAGE(what, ": cuda skipped: no CUDA device");
        return;
    }
    const std::vector<float> got = op(exec_ctx{backend::cuda, nullptr, c});
    const double e = nmse(want, got);
    INFO(what, " backend=cuda nmse=", e);
    CHECK(e <= tol);
#else
    (void)op;
    (void)want;
    (void)tol;
    MESSAGE(what, ": cuda skipped: this build has no CUDA backend");
#endif
}

// Whether CUDA rows can run here; prints why not under `what` when they cannot.
inline bool cuda_available(const std::string& what) {
#if TANDEM_HAVE_CUDA
    if (cuda_device()) return true;
    MESSAGE(what, ": cuda skipped: no CUDA device");
#else
    MESSAGE(what, ": cuda skipped: this build has no CUDA backend");
#endif
    return false;
}

// Runs `op` once on the reference backend and then on the CPU at every ISA level this
// machine supports and with 1 and 3 threads, and on CUDA, comparing each result with the
// reference's.
inline void for_each_cpu_variant(const std::function<std::vector<float>(const exec_ctx&)>& op, double tol,
                          const std::string& what, cuda_row cuda = cuda_row::compare) {
    const std::vector<float> want = op(exec_ctx{backend::ref, nullptr});
    for (int lvl = 0; lvl <= int(cpu::detect_isa()); ++lvl) {
        const cpu::isa level = cpu::force_isa(cpu::isa(lvl));
        for (int nt : {1, 3}) {
            cpu::thread_pool pool(nt);
            const std::vector<float> got = op(exec_ctx{backend::cpu, &pool});
            const double e = nmse(want, got);
            INFO(what, " isa=", std::string(cpu::name_of(level)), " threads=", nt, " nmse=", e);
            CHECK(e <= tol);
        }
    }
    cpu::force_isa(cpu::detect_isa());
    if (cpu::detect_isa() < cpu::isa::amx)
        MESSAGE(what, ": isa=amx skipped (this CPU or OS gives the process no AMX tiles)");
    if (cuda == cuda_row::none) {
        // No CUDA twin (the CUDA forward is INT8-only); say so rather than pass silently.
        MESSAGE(what, ": cuda skipped (no CUDA implementation of this op)");
        return;
    }
    run_cuda_row(op, want, tol, what);
}

} // namespace tandem::test
