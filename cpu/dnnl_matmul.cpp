// oneDNN (2.x API) int8 matmul: u8 activations x s8 weights -> s32, scaled by the caller.
// Measured here (oneDNN 2.6.3, 2 threads, 512x2048x2048): u8 src with s32 dst runs on
// brg:avx512_core_vnni at ~1.3 TOPS, while runtime output scales drop it to gemm:jit at
// ~0.15-0.35 TOPS and s8 src costs ~20%; plain [n, k] weight rows cost ~5-10% against
// oneDNN's blocked layout, which is Tandem's own from the VNNI level up (runtime/weight.hpp).
#include "cpu/dnnl_matmul.hpp"

#include "cpu/isa.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/error.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <unistd.h>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

extern "C" void omp_set_num_threads(int); // oneDNN runs on OpenMP (libgomp) in Debian's build

#define DNNL_CHECK(stmt)                                                                                    \
    do {                                                                                                    \
        try {                                                                                               \
            stmt;                                                                                           \
        } catch (const dnnl::error& e_) {                                                                   \
            ::tandem::fail("oneDNN: {} failed: {} (status {})", #stmt, e_.what(), int(e_.status));          \
        }                                                                                                   \
    } while (0)

namespace tandem::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// oneDNN picks its own kernels by what the CPU has: on an AMX CPU with TANDEM_ISA=avx512 it
// would still run the tiles (seen on the H200 machine's Xeon), so it is capped to VNNI there,
// once, before its first primitive (oneDNN reads the cap then; force_isa later cannot move it).
dnnl::engine& engine() {
    static dnnl::engine e = [] {
        if (active_isa() == isa::avx512 && detect_isa() == isa::amx) {
            try {
                dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_vnni);
            } catch (const dnnl::error&) { // already fixed by an earlier use: keep oneDNN's choice
            }
        }
        return dnnl::engine(dnnl::engine::kind::cpu, 0);
    }();
    return e;
}

struct prim {
    dnnl::matmul mm;
    dnnl::memory::desc wd; // the weights' layout this primitive expects
    std::string impl;      // oneDNN's name for the implementation it chose
};

// How the primitive gets its weights: as Tandem holds them (rows, or the blocked layout, which
// is oneDNN's BA16a64b4a), or in whatever layout oneDNN prefers (the raw figure of bench).
enum class wei { rows, blocked, any };

std::mutex cache_mu;
std::map<std::tuple<int64_t, int64_t, int64_t, wei>, prim> cache; // kept for the process's life

// One primitive per (m, k, n, weights): matmul_i8 asks for m in multiples of 64 only, so a
// model has a few per weight shape.
prim& get_prim(int64_t m, int64_t k, int64_t n, wei how) {
    std::lock_guard lock(cache_mu);
    auto key = std::make_tuple(m, k, n, how);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const dnnl::memory::desc src({m, k}, dt::u8, tag::ab);
    const tag wt = how == wei::rows ? tag::ba : how == wei::blocked ? tag::BA16a64b4a : tag::any;
    const dnnl::memory::desc wts({k, n}, dt::s8, wt);
    const dnnl::memory::desc dst({m, n}, dt::s32, tag::ab);
    prim p;
    DNNL_CHECK({
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wts, dst), engine());
        p.mm = dnnl::matmul(pd);
        p.wd = pd.weights_desc();
        p.impl = pd.impl_info_str();
    });
    return cache.emplace(key, std::move(p)).first->second;
}

wei wei_of(const weight& w) { return w.layout == q_layout::blocked ? wei::blocked : wei::rows; }

} // namespace

bool dnnl_matmul_u8s8(thread_pool& pool, int32_t* out, const uint8_t* xu, int64_t m, const weight& w) {
    prim& p = get_prim(m, w.n_in, w.n_out, wei_of(w));
    // oneDNN's BA16a64b4a pads as weight.hpp's blocked layout does: the same bytes, or not ours
    if (w.layout == q_layout::blocked && p.wd.get_size() != size_t(w.q_bytes())) return false;
    omp_set_num_threads(pool.n_threads()); // no more threads than the pool: the cores are shared
    DNNL_CHECK({
        dnnl::memory src({{m, w.n_in}, dt::u8, tag::ab}, engine(), const_cast<uint8_t*>(xu));
        dnnl::memory wts(p.wd, engine(), const_cast<int8_t*>(w.q()));
        dnnl::memory dst({{m, w.n_out}, dt::s32, tag::ab}, engine(), out);
        dnnl::stream s(engine());
        p.mm.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
        s.wait();
    });
    return true;
}

void dnnl_blocked_reference(const weight& w, int8_t* out) {
    TANDEM_ASSERT(w.is_i8() && w.layout == q_layout::rows);
    DNNL_CHECK({
        dnnl::memory plain({{w.n_in, w.n_out}, dt::s8, tag::ba}, engine(), const_cast<int8_t*>(w.q()));
        dnnl::memory blocked({{w.n_in, w.n_out}, dt::s8, tag::BA16a64b4a}, engine(), out);
        dnnl::stream s(engine());
        dnnl::reorder(plain, blocked).execute(s, plain, blocked);
        s.wait();
    });
}

size_t dnnl_blocked_bytes(const weight& w) {
    return dnnl::memory::desc({w.n_in, w.n_out}, dt::s8, tag::BA16a64b4a).get_size();
}

void dnnl_prepare(int64_t m, const weight& w) { get_prim(m, w.n_in, w.n_out, wei_of(w)); }

double dnnl_matmul_gops(int n_threads, int64_t m, int64_t k, int64_t n, int reps) {
    omp_set_num_threads(n_threads);
    prim& p = get_prim(m, k, n, wei::any);
    double best = 0;
    DNNL_CHECK({
        dnnl::memory src({{m, k}, dt::u8, tag::ab}, engine());
        dnnl::memory wts(p.wd, engine());
        dnnl::memory dst({{m, n}, dt::s32, tag::ab}, engine());
        std::fill_n(static_cast<uint8_t*>(src.get_data_handle()), m * k, uint8_t(3));
        std::fill_n(static_cast<int8_t*>(wts.get_data_handle()), wts.get_desc().get_size(), int8_t(1));
        dnnl::stream s(engine());
        for (int r = 0; r <= reps; ++r) { // the first run warms up
            const auto t0 = std::chrono::steady_clock::now();
            p.mm.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
            s.wait();
            const double dt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r > 0) best = std::max(best, 2.0 * double(m) * double(k) * double(n) / dt_s / 1e9);
        }
    });
    return best;
}

void ensure_passive_openmp() {
    if (std::getenv("OMP_WAIT_POLICY")) return;
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> args;
    for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
    if (args.empty()) return;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    ::execv("/proc/self/exe", argv.data()); // returns only on failure: carry on as we are
}

size_t dnnl_primitive_count() {
    std::lock_guard lock(cache_mu);
    return cache.size();
}

const char* dnnl_impl_name(int64_t m, int64_t k, int64_t n) { return get_prim(m, k, n, wei::any).impl.c_str(); }

} // namespace tandem::cpu
