// oneDNN int8 matmul for prefill batches: primitives cached by shape, weights reordered once.
#pragma once

#include "runtime/weight.hpp"

#include <cstddef>
#include <cstdint>

namespace tandem::cpu {

class thread_pool;

// out [m, w.n_out] = xu [m, w.n_in] . q_w^T in int32, with u8 activations (s8 + 128: the
// caller subtracts 128 * row sum and applies the scales and bias), reading w in its layout
// (rows, or blocked as oneDNN's BA16a64b4a). Runs on pool.n_threads() threads; false if
// oneDNN cannot.
bool dnnl_matmul_u8s8(thread_pool& pool, int32_t* out, const uint8_t* xu, int64_t m, const weight& w);

// Builds the primitive dnnl_matmul_u8s8 would build on its first call with m rows and w.
void dnnl_prepare(int64_t m, const weight& w);

// oneDNN's own reorder of w's rows into BA16a64b4a, into out [dnnl_blocked_bytes(w)]: what the
// tests hold weight.hpp's blocked layout against.
void dnnl_blocked_reference(const weight& w, int8_t* out);
size_t dnnl_blocked_bytes(const weight& w);

// oneDNN's own u8 x s8 -> s32 matmul throughput in GOPS (2 ops per multiply-add) for
// [m, k] x [k, n] with weights in its preferred layout, best of `reps` runs.
double dnnl_matmul_gops(int n_threads, int64_t m, int64_t k, int64_t n, int reps);

// oneDNN runs on libgomp, whose threads spin for a while after each parallel region and so
// steal the cores from the thread pool's next op; libgomp reads OMP_WAIT_POLICY only when it
// loads. If it is unset, sets it to PASSIVE and re-executes this program with the same
// arguments (from /proc/self), once; returns if it is already set or the exec fails.
void ensure_passive_openmp();

// The matmul primitives built so far (each holds its JIT code for the process's life).
size_t dnnl_primitive_count();

// The implementation oneDNN picked for that shape, e.g. "brg:avx512_core_amx" (for reports).
const char* dnnl_impl_name(int64_t m, int64_t k, int64_t n);

} // namespace tandem::cpu
