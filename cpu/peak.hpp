// The int8 arithmetic peak of this CPU, measured on the spot: loops of the multiply-add
// instruction each ISA level's matmuls are built on, with every operand in registers, so no
// memory traffic limits them. `tandem bench` prints prefill as a share of it (the compute
// limit, beside the bandwidth roofline that bounds decode).
#pragma once

#include "cpu/isa.hpp"

#include <cstdint>
#include <span>

namespace tandem::cpu {

class thread_pool;

// What a run of the loop did. ops counts a multiply and an add as two (TOPS convention).
struct int8_peak {
    isa level = isa::scalar;
    double ops = 0;
    double seconds = 0;
    // Every accumulator lane summed after the run: the multiply-adds the hardware did times
    // a * b, so the tests can check `ops` against the arithmetic actually performed.
    int64_t checksum = 0;
    double tops() const { return seconds > 0 ? ops / seconds * 1e-12 : 0; }
};

// Multiply-adds one iteration of the loop at `level` performs:
//   avx2:   8 accumulators x (vpmaddubsw + vpmaddwd + vpaddd), 32 each (what the AVX2
//           kernels and oneDNN's AVX2 int8 matmul do without VNNI);
//   avx512: 12 accumulators x vpdpbusd (zmm), 64 each;
//   amx:    4 x tdpbusd on 16 x 16 int32 tiles over 64 bytes of K, 16,384 each.
// 0 for scalar: there is no register loop to speak of, and no peak is reported.
int64_t peak_macs_per_iteration(isa level);

// The loop at `level` (supported by this CPU, not scalar) on this thread: n_iter iterations
// with every u8 operand equal to a and every s8 operand to b. Exact checksums need
// n_iter * 64 * a * |b| < 2^31 (no lane wraps) and 2 * a * |b| < 2^15 (vpmaddubsw's pairs).
int8_peak run_int8_peak(isa level, int64_t n_iter, uint8_t a, int8_t b);

// The loop on every thread of `pool` at once for about `seconds`: the machine's peak.
int8_peak measure_int8_peak(thread_pool& pool, isa level, double seconds);

// Read bandwidth in GB/s: every range summed on the threads of `pool` (1 MiB pieces shared
// out as the GEMV shares a matrix), the best of three passes. Over ranges well above the
// cache size (a model's weights) it is the memory's, the bound of decode.
double measure_read_bandwidth_gbs(thread_pool& pool, std::span<const std::span<const uint8_t>> ranges);

} // namespace tandem::cpu
