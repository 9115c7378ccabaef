// Per-token INT8 activation kernels: plain, fused with RMSNorm, fused with SwiGLU, two-term split.
// One block per row; the row is read once for its max and again to round (it stays in L1/L2).
#include "cuda/ops/common.cuh"
#include "cuda/ops/ops.hpp"

namespace tandem::cuda {
namespace {

// Quantizes the row value(i) (a functor, evaluated twice with the same bits) into q, scale into
// *s; every thread gets the scale back.
template <class Value>
__device__ float quantize_row(int8_t* q, float* s, int64_t n, Value value, float* scratch) {
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) amax = fmaxf(amax, finite_abs(value(i)));
    amax = block_reduce(amax, max_op{}, scratch);
    const i8_row_scale sc = i8_scale_of(amax);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) q[i] = quantize_one(value(i), sc.inv);
    if (threadIdx.x == 0) *s = sc.scale;
    return sc.scale;
}

__global__ void quantize_rows_kernel(int8_t* q, float* s, const float* x, int64_t n) {
    __shared__ float scratch[32];
    const int64_t t = blockIdx.x;
    const float* xt = x + t * n;
    quantize_row(q + t * n, s + t, n, [=](int64_t i) { return xt[i]; }, scratch);
}

__global__ void rms_norm_quant_kernel(int8_t* q, float* s, const float* x, const float* w, int64_t n, float eps) {
    __shared__ double dscratch[32];
    __shared__ float scratch[32];
    const int64_t t = blockIdx.x;
    const float* xt = x + t * n;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(xt[i]) * double(xt[i]);
    ss = block_reduce(ss, sum_op{}, dscratch);
    const float scale = float(1.0 / sqrt(ss / double(n) + double(eps)));
    quantize_row(q + t * n, s + t, n, [=](int64_t i) { return __fmul_rn(w[i], __fmul_rn(xt[i], scale)); }, scratch);
}

__global__ void swiglu_quant_kernel(int8_t* q, float* s, const float* gate, const float* up, int64_t n) {
    __shared__ float scratch[32];
    const int64_t t = blockIdx.x;
    const float* g = gate + t * n;
    const float* u = up + t * n;
    quantize_row(q + t * n, s + t, n,
                 [=](int64_t i) { return __fmul_rn(__fdiv_rn(g[i], __fadd_rn(1.0f, expf(-g[i]))), u[i]); }, scratch);
}

// hi quantizes x; lo quantizes x - s_hi * q_hi (computed without FMA, as the reference does).
__global__ void quantize_rows_split_kernel(int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x,
                                           int64_t n) {
    __shared__ float scratch[32];
    const int64_t t = blockIdx.x;
    const float* xt = x + t * n;
    int8_t* qh = q_hi + t * n;
    // Each thread reads back only the qh[i] it wrote itself (same striding).
    const float sh = quantize_row(qh, s_hi + t, n, [=](int64_t i) { return xt[i]; }, scratch);
    quantize_row(q_lo + t * n, s_lo + t, n, [=](int64_t i) { return __fsub_rn(xt[i], __fmul_rn(sh, float(qh[i]))); },
                 scratch);
}

} // namespace

void quantize_rows(const context& c, int8_t* q, float* s, const float* x, int64_t n_tok, int64_t n) {
    if (n_tok == 0) return;
    launch_kernel(c, quantize_rows_kernel, unsigned(n_tok), row_block, 0, q, s, x, n);
}

void rms_norm_quant(const context& c, int8_t* q, float* s, const float* x, const float* w, int64_t n_tok, int64_t n,
                    float eps) {
    if (n_tok == 0) return;
    launch_kernel(c, rms_norm_quant_kernel, unsigned(n_tok), row_block, 0, q, s, x, w, n, eps);
}

void swiglu_quant(const context& c, int8_t* q, float* s, const float* gate, const float* up, int64_t n_tok,
                  int64_t n) {
    if (n_tok == 0) return;
    launch_kernel(c, swiglu_quant_kernel, unsigned(n_tok), row_block, 0, q, s, gate, up, n);
}

void quantize_rows_split(const context& c, int8_t* q_hi, float* s_hi, int8_t* q_lo, float* s_lo, const float* x,
                         int64_t n_tok, int64_t n) {
    if (n_tok == 0) return;
    launch_kernel(c, quantize_rows_split_kernel, unsigned(n_tok), row_block, 0, q_hi, s_hi, q_lo, s_lo, x, n);
}

} // namespace tandem::cuda
