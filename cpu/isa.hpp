// Runtime ISA detection and the level kernels dispatch on (TANDEM_ISA forces a lower one).
#pragma once

#include <string_view>

namespace tandem::cpu {

// avx512: F, BW, VL, VNNI. amx: avx512 plus AMX-TILE and AMX-INT8 tiles that the OS lets this
// process use (Linux: XCR0 has the tile state and ARCH_REQ_XCOMP_PERM granted it).
enum class isa { scalar = 0, avx2 = 1, avx512 = 2, amx = 3 };

std::string_view name_of(isa level);

// What this CPU supports.
isa detect_isa();

// The level kernels use: detect_isa(), lowered by TANDEM_ISA (scalar|avx2|avx512|amx) or by
// force_isa(). A level above what the CPU supports is never chosen.
isa active_isa();

// The level TANDEM_ISA=value picks on a CPU that supports hw: "" or an unknown value (then
// *unknown is set) gives the default, hw; a known one, that level or hw if lower.
isa isa_from_env(std::string_view value, isa hw, bool* unknown = nullptr);

// For tests: forces a level (clamped to detect_isa()); returns the level now active.
isa force_isa(isa level);

} // namespace tandem::cpu
