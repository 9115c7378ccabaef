// oneDNN (2.x API) int8 matmul: u8 activations x s8 weights -> s32, scaled by the caller.
// Measured here (oneDNN 2.6.3, 2 threads, 512x2048x2048): u8 src with s32 dst runs on
// brg:avx512_core_vnni at ~1.3 TOPS, while runtime output scales drop it to gemm:jit at
// ~0.15-0.35 TOPS and s8 src costs ~20%; the plain [n, k] weight rows cost ~5-10% vs
// oneDNN's blocked layout, which would need a second copy of every matrix.
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

std::mutex cache_mu;
std::map<std::tuple<int64_t, int64_t, int64_t, bool>, prim> cache; // kept for the process's life

// One primitive per (m, k, n, packed): matmul_i8 asks for m in multiples of 64 only, so a
// model has a few per weight shape.
prim& get_prim(int64_t m, int64_t k, int64_t n, bool packed) {
    std::lock_guard lock(cache_mu);
    auto key = std::make_tuple(m, k, n, packed);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const dnnl::memory::desc src({m, k}, dt::u8, tag::ab);
    const dnnl::memory::desc wts({k, n}, dt::s8, packed ? tag::any : tag::ba); // ba: the [n, k] rows as stored
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

// A blocked copy of a weight, owned by weight::packed.
struct packed_weight {
    dnnl::memory mem;
};

} // namespace

void dnnl_pack(weight& w) {
    TANDEM_ASSERT(w.is_i8());
    // The layout depends on m only through the implementation's choice; a typical prefill m.
    prim& p = get_prim(512, w.n_in, w.n_out, true);
    auto pw = std::make_shared<packed_weight>();
    DNNL_CHECK({
        dnnl::memory plain({{w.n_in, w.n_out}, dt::s8, tag::ba}, engine(), const_cast<int8_t*>(w.q()));
        pw->mem = dnnl::memory(p.wd, engine());
        dnnl::stream s(engine());
        dnnl::reorder(plain, pw->mem).execute(s, plain, pw->mem);
        s.wait();
    });
    w.packed = pw;
}

bool dnnl_matmul_u8s8(thread_pool& pool, int32_t* out, const uint8_t* xu, int64_t m, const weight& w) {
    const auto* pw = static_cast<const packed_weight*>(w.packed.get());
    prim& p = get_prim(m, w.n_in, w.n_out, pw != nullptr);
    if (pw && pw->mem.get_desc() != p.wd) pw = nullptr; // another m chose another layout
    prim& q = pw ? p : get_prim(m, w.n_in, w.n_out, false);
    omp_set_num_threads(pool.n_threads()); // no more threads than the pool: the cores are shared
    DNNL_CHECK({
        dnnl::memory src({{m, w.n_in}, dt::u8, tag::ab}, engine(), const_cast<uint8_t*>(xu));
        dnnl::memory wts = pw ? pw->mem : dnnl::memory(q.wd, engine(), const_cast<int8_t*>(w.q()));
        dnnl::memory dst({{m, w.n_out}, dt::s32, tag::ab}, engine(), out);
        dnnl::stream s(engine());
        q.mm.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
        s.wait();
    });
    return true;
}

void dnnl_prepare(int64_t m, const weight& w) {
    const auto* pw = static_cast<const packed_weight*>(w.packed.get());
    prim& p = get_prim(m, w.n_in, w.n_out, pw != nullptr);
    if (pw && pw->mem.get_desc() != p.wd) get_prim(m, w.n_in, w.n_out, false);
}

double dnnl_matmul_gops(int n_threads, int64_t m, int64_t k, int64_t n, int reps) {
    omp_set_num_threads(n_threads);
    prim& p = get_prim(m, k, n, true);
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

const char* dnnl_impl_name(int64_t m, int64_t k, int64_t n) {
    prim& p = get_prim(m, k, n, true);
    return p.impl.c_str();
}

} // namespace tandem::cpu
