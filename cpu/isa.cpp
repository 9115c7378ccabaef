// CPU feature detection through the compiler's cpuid builtins.
#include "cpu/isa.hpp"

#include "runtime/log.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace tandem::cpu {
namespace {

std::atomic<int> g_forced{-1};

isa parse_env() {
    const isa hw = detect_isa();
    const char* env = std::getenv("TANDEM_ISA");
    bool unknown = false;
    const isa chosen = isa_from_env(env ? env : "", hw, &unknown);
    if (unknown)
        logger("cpu")->warn("TANDEM_ISA={} is not one of scalar, avx2, avx512, amx; using the default, {}", env,
                            name_of(chosen));
    return chosen;
}

// AMX tiles usable by this process: the CPU has AMX-TILE and AMX-INT8 (CPUID.(7,0):EDX bits
// 24, 25), the OS saves the tile state (XCR0 bits 17, 18), and Linux grants this process the
// tile data (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, once; without it the first tile
// instruction faults). A VM may hide all of it, as the development machines' does.
bool amx_usable() {
#if defined(__linux__) && defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false; // OSXSAVE: xgetbv is allowed
    uint32_t xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if (((xcr0_lo >> 17) & 3) != 3) return false;
    constexpr int arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return false;
#endif
}

} // namespace

std::string_view name_of(isa level) {
    switch (level) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::amx: return "amx";
    }
    return "?";
}

isa detect_isa() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        static const bool amx = amx_usable(); // asks the kernel for the tile state once
        return amx ? isa::amx : isa::avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return isa::avx2;
#endif
    return isa::scalar;
}

isa isa_from_env(std::string_view value, isa hw, bool* unknown) {
    // The default is what the CPU has (AMX included: its kernel's hardware rows pass on this
    // project's development machine, and matmul_i8 uses it where it measured faster). An
    // unknown value (a typo) gets the default, never more.
    const isa fallback = hw;
    if (unknown) *unknown = false;
    if (value.empty()) return fallback;
    isa want;
    if (value == "scalar") want = isa::scalar;
    else if (value == "avx2") want = isa::avx2;
    else if (value == "avx512") want = isa::avx512;
    else if (value == "amx") want = isa::amx;
    else {
        if (unknown) *unknown = true;
        return fallback;
    }
    return want < hw ? want : hw;
}

isa active_isa() {
    static const isa from_env = parse_env();
    const int forced = g_forced.load(std::memory_order_relaxed);
    return forced >= 0 ? isa(forced) : from_env;
}

isa force_isa(isa level) {
    const isa hw = detect_isa();
    const isa chosen = level < hw ? level : hw;
    g_forced.store(int(chosen), std::memory_order_relaxed);
    return chosen;
}

} // namespace tandem::cpu
