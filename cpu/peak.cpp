// Register-only int8 loops, one per ISA level. Each keeps enough independent accumulators to
// cover its instruction's latency, and an empty asm statement makes the operands look new
// every iteration, so the compiler cannot hoist the products out of the loop.
#include "cpu/peak.hpp"

#include "cpu/amx_tile.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/error.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

namespace tandem::cpu {
namespace {

constexpr int avx2_accs = 8, avx512_accs = 12;

template <typename V>
int64_t sum_lanes(const V* acc, int n) {
    int64_t s = 0;
    for (int i = 0; i < n; ++i) {
        alignas(64) int32_t lanes[sizeof(V) / 4];
        std::memcpy(lanes, &acc[i], sizeof(V));
        for (int32_t v : lanes) s += v;
    }
    return s;
}

__attribute__((target("avx2"))) int64_t loop_avx2(int64_t n_iter, uint8_t a, int8_t b) {
    __m256i va = _mm256_set1_epi8(char(a));
    const __m256i vb = _mm256_set1_epi8(b);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[avx2_accs];
    for (auto& x : acc) x = _mm256_setzero_si256();
    for (int64_t it = 0; it < n_iter; ++it)
        for (auto& x : acc) {
            __asm__ volatile("" : "+x"(va)); // a new product for each accumulator, not one shared
            x = _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_maddubs_epi16(va, vb), ones));
        }
    return sum_lanes(acc, avx2_accs);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t loop_avx512(int64_t n_iter, uint8_t a, int8_t b) {
    __m512i va = _mm512_set1_epi8(char(a)), vb = _mm512_set1_epi8(b);
    __m512i acc[avx512_accs];
    for (auto& x : acc) x = _mm512_setzero_si512();
    for (int64_t it = 0; it < n_iter; ++it) {
        __asm__ volatile("" : "+v"(va), "+v"(vb));
        for (auto& x : acc) x = _mm512_dpbusd_epi32(x, va, vb);
    }
    return sum_lanes(acc, avx512_accs);
}

// AMX: tiles 0-3 accumulate (16 rows x 16 int32), 4-5 hold u8 operands, 6-7 s8 operands in
// the VNNI order (every byte equal, so the order does not matter). Inline asm for the reason
// cpu/ops/matmul_i8_amx.cpp gives: GCC 12's _tile_* macros have no memory clobbers.
int64_t loop_amx(int64_t n_iter, uint8_t a, int8_t b) {
    const tile_config cfg = full_tile_config();
    alignas(64) uint8_t ua[16 * 64];
    alignas(64) int8_t sb[16 * 64];
    std::fill(std::begin(ua), std::end(ua), a);
    std::fill(std::begin(sb), std::end(sb), b);
    alignas(64) int32_t c[4][16 * 16];
    const int64_t stride = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory");
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm4\n\t"
                     "tileloadd (%0,%1,1), %%tmm5\n\t"
                     "tileloadd (%2,%1,1), %%tmm6\n\t"
                     "tileloadd (%2,%1,1), %%tmm7" ::"r"(ua),
                     "r"(stride), "r"(sb)
                     : "memory");
    for (int64_t it = 0; it < n_iter; ++it)
        __asm__ volatile("tdpbusd %%tmm6, %%tmm4, %%tmm0\n\t"
                         "tdpbusd %%tmm7, %%tmm4, %%tmm1\n\t"
                         "tdpbusd %%tmm6, %%tmm5, %%tmm2\n\t"
                         "tdpbusd %%tmm7, %%tmm5, %%tmm3" ::
                             : "memory");
    __asm__ volatile("tilestored %%tmm0, (%0,%1,1)\n\t"
                     "tilestored %%tmm1, (%2,%1,1)\n\t"
                     "tilestored %%tmm2, (%3,%1,1)\n\t"
                     "tilestored %%tmm3, (%4,%1,1)" ::"r"(c[0]),
                     "r"(stride), "r"(c[1]), "r"(c[2]), "r"(c[3])
                     : "memory");
    __asm__ volatile("tilerelease" ::: "memory");
    int64_t s = 0;
    for (const auto& tile : c)
        for (int32_t v : tile) s += v;
    return s;
}

int64_t run_loop(isa level, int64_t n_iter, uint8_t a, int8_t b) {
    switch (level) {
    case isa::avx2: return loop_avx2(n_iter, a, b);
    case isa::avx512: return loop_avx512(n_iter, a, b);
    case isa::amx: return loop_amx(n_iter, a, b);
    case isa::scalar: break;
    }
    TANDEM_ASSERT(false, "no int8 peak loop at {}", name_of(level));
    return 0;
}

} // namespace

int64_t peak_macs_per_iteration(isa level) {
    switch (level) {
    case isa::avx2: return int64_t(avx2_accs) * 32;
    case isa::avx512: return int64_t(avx512_accs) * 64;
    case isa::amx: return 4 * 16 * 16 * 64;
    case isa::scalar: return 0;
    }
    return 0;
}

int8_peak run_int8_peak(isa level, int64_t n_iter, uint8_t a, int8_t b) {
    TANDEM_ASSERT(level != isa::scalar && level <= detect_isa() && n_iter >= 0, "int8 peak at {}", name_of(level));
    int8_peak r;
    r.level = level;
    const auto t0 = std::chrono::steady_clock::now();
    r.checksum = run_loop(level, n_iter, a, b);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.ops = 2.0 * double(n_iter) * double(peak_macs_per_iteration(level));
    return r;
}

int8_peak measure_int8_peak(thread_pool& pool, isa level, double seconds) {
    // Rounds of about a millisecond each, on every thread at once, until the time is up; the
    // rounds stop together, so the wall time covers every thread's work.
    const int64_t n_iter = level == isa::amx ? 4096 : 1 << 16;
    run_int8_peak(level, n_iter / 16, 1, 1); // warm-up: the wide units power up, tiles configure
    const int nth = pool.n_threads();
    std::atomic<bool> done{false};
    std::vector<int64_t> rounds(size_t(nth), 0);
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int ith, int) {
        do { // every thread runs a round at least, however late it starts
            run_loop(level, n_iter, 1, 1);
            ++rounds[size_t(ith)];
            if (ith == 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds)
                done = true;
        } while (!done.load(std::memory_order_relaxed));
    });
    int8_peak r;
    r.level = level;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t n : rounds) r.ops += 2.0 * double(n) * double(n_iter) * double(peak_macs_per_iteration(level));
    return r;
}

namespace {

__attribute__((target("avx512f"))) uint64_t sum_avx512(const uint8_t* p, int64_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 256 <= n; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
    }
    alignas(64) uint64_t l[8];
    _mm512_store_si512(l, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    uint64_t s = 0;
    for (uint64_t v : l) s += v;
    for (; i < n; ++i) s += p[i];
    return s;
}

uint64_t sum_plain(const uint8_t* p, int64_t n) {
    uint64_t s[8] = {};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 8; ++j) {
            uint64_t v;
            std::memcpy(&v, p + i + 8 * j, 8);
            s[j] += v;
        }
    uint64_t t = 0;
    for (uint64_t v : s) t += v;
    for (; i < n; ++i) t += p[i];
    return t;
}

} // namespace

double measure_read_bandwidth_gbs(thread_pool& pool, std::span<const std::span<const uint8_t>> ranges) {
    std::vector<std::span<const uint8_t>> pieces;
    int64_t total = 0;
    for (const auto& r : ranges) {
        for (size_t o = 0; o < r.size(); o += size_t(1) << 20) pieces.push_back(r.subspan(o, std::min(r.size() - o, size_t(1) << 20)));
        total += int64_t(r.size());
    }
    const bool avx512 = __builtin_cpu_supports("avx512f");
    std::atomic<uint64_t> sink{0};
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(int64_t(pieces.size()), 1, [&](int64_t b, int64_t e) {
            uint64_t s = 0;
            for (int64_t i = b; i < e; ++i) {
                const auto& piece = pieces[size_t(i)];
                s += avx512 ? sum_avx512(piece.data(), int64_t(piece.size())) : sum_plain(piece.data(), int64_t(piece.size()));
            }
            sink += s;
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(total) / s / 1e9);
    }
    return best;
}

} // namespace tandem::cpu
