// The AMX int8 small GEMM behind matmul_i8 at isa::amx (internal to cpu/ops).
#pragma once

#include "runtime/weight.hpp"

#include <cstdint>

namespace tandem::cpu {

class thread_pool;

// How the tile instructions run: on this CPU's AMX tiles, or on a scalar model of them (any
// CPU; it lets the tests check the kernel's tiling where there is no AMX).
enum class amx_exec { hardware, emulated };

// matmul_i8's contract, out [n_tok, w.n_out] = (sx[t] * sw[o]) * dot(qx[t], q_w[o]) + bias[o],
// for weights in the blocked layout (runtime/weight.hpp).
void matmul_i8_amx(thread_pool& pool, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const weight& w,
                   const float* bias, amx_exec how);

} // namespace tandem::cpu
