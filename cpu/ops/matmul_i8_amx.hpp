// The AMX int8 small GEMM behind matmul_i8 at isa::amx (internal to cpu/ops).
#pragma once

#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::cpu {

class thread_pool;

// How the tile instructions run: on this CPU's AMX tiles, or on a scalar model of them (any
// CPU; it lets the tests check the kernel's tiling where there is no AMX).
enum class amx_exec { hardware, emulated };

// The AMX kernel takes whole 16-row blocks of weights at least 64 inputs wide.
inline bool amx_fits(const weight& w) { return w.is_i8() && w.n_in >= 64 && w.n_out >= 16; }

// matmul_i8's contract for the output rows [0, amx_rows) where amx_rows = w.n_out / 16 * 16:
// out[t][o] = (sx[t] * sw[o]) * dot(qx[t], q_w[o]) + bias[o], out [n_tok, w.n_out]. The caller
// computes the rows from amx_rows on. Returns amx_rows. Needs amx_fits(w).
int64_t matmul_i8_amx(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                      const float* bias, amx_exec how);

} // namespace tandem::cpu
