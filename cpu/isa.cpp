// CPU feature detection through the compiler's cpuid builtins.
#include "cpu/isa.hpp"

#include "runtime/log.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

namespace tandem::cpu {
namespace {

std::atomic<int> g_forced{-1};

isa parse_env() {
    const isa hw = detect_isa();
    const char* env = std::getenv("TANDEM_ISA");
    if (!env || !*env) return hw;
    const std::string v(env);
    isa want = hw;
    if (v == "scalar") want = isa::scalar;
    else if (v == "avx2") want = isa::avx2;
    else if (v == "avx512") want = isa::avx512;
    else logger("cpu")->warn("TANDEM_ISA={} is not one of scalar, avx2, avx512; using {}", v, name_of(hw));
    return want < hw ? want : hw;
}

} // namespace

std::string_view name_of(isa level) {
    switch (level) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    }
    return "?";
}

isa detect_isa() {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return isa::avx2;
#endif
    return isa::scalar;
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
