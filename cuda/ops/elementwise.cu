// Element-wise and row-wise CUDA kernels: RMSNorm, RoPE, SwiGLU, add, embedding rows, row gather.
#include "cuda/ops/common.cuh"
#include "cuda/ops/ops.hpp"

namespace tandem::cuda {
namespace {

// 1 / rms(x) of one row as the reference computes it: the sum of squares in double.
__device__ float rms_scale(const float* xt, int64_t n, float eps, double* scratch) {
    double ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(xt[i]) * double(xt[i]);
    ss = block_reduce(ss, sum_op{}, scratch);
    return float(1.0 / sqrt(ss / double(n) + double(eps)));
}

// One block per row: out = w * (x * scale)
__global__ void rms_norm_kernel(float* out, const float* x, const float* w, int64_t n, float eps) {
    __shared__ double scratch[32];
    const float* xt = x + int64_t(blockIdx.x) * n;
    const float scale = rms_scale(xt, n, eps, scratch);
    float* ot = out + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ot[i] = __fmul_rn(w[i], __fmul_rn(xt[i], scale));
}

// One thread per rotated pair (t, h, i).
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
                            rope_params rp) {
    const int half = rp.n_rot / 2;
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= n_tok * n_head * half) return;
    const int i = int(idx % half);
    const int64_t th = idx / half; // t * n_head + h
    const int64_t t = th / n_head;
    const float p = __fmul_rn(float(positions[t]), rp.freq_scale);
    const float theta = __fmul_rn(p, rp.inv_freq[i]);
    float sn, cs;
    sincosf(theta, &sn, &cs);
    sn = __fmul_rn(sn, rp.mscale);
    cs = __fmul_rn(cs, rp.mscale);
    float* v = x + th * head_dim;
    const int a = rp.neox ? i : 2 * i;
    const int b = rp.neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    v[b] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

__global__ void swiglu_kernel(float* out, const float* gate, const float* up, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

// GELU's tanh approximation, as the reference writes it.
__global__ void geglu_kernel(float* out, const float* gate, const float* up, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i], c = sqrtf(2.0f / 3.14159265358979f);
    const float inner = __fmul_rn(c, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g)));
    out[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), up[i]);
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], s);
}

__global__ void softcap_kernel(float* x, float cap, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

// One block per token.
__global__ void embed_kernel(float* out, const int32_t* tokens, const int8_t* q, const float* scale, const float* f,
                             int64_t n_embd) {
    const int64_t id = tokens[blockIdx.x];
    float* o = out + int64_t(blockIdx.x) * n_embd;
    if (q) {
        const int8_t* row = q + id * n_embd;
        const float s = scale[id];
        for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) o[i] = __fmul_rn(s, float(row[i]));
    } else {
        const float* row = f + id * n_embd;
        for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) o[i] = row[i];
    }
}

__global__ void gather_rows_kernel(float* out, const float* x, const int32_t* rows, int64_t n) {
    const float* src = x + int64_t(rows[blockIdx.x]) * n;
    float* dst = out + int64_t(blockIdx.x) * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

} // namespace

void rms_norm(const context& c, float* out, const float* x, const float* w, int64_t n_tok, int64_t n, float eps) {
    if (n_tok == 0) return;
    launch_kernel(c, rms_norm_kernel, unsigned(n_tok), row_block, 0, out, x, w, n, eps);
}

void rope(const context& c, float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
          const rope_params& rp) {
    const int64_t n = n_tok * n_head * (rp.n_rot / 2);
    if (n == 0) return;
    launch_kernel(c, rope_kernel, grid_1d(n, 256), 256, 0, x, positions, n_tok, n_head, head_dim, rp);
}

void swiglu(const context& c, float* out, const float* gate, const float* up, int64_t n) {
    if (n == 0) return;
    launch_kernel(c, swiglu_kernel, grid_1d(n, 256), 256, 0, out, gate, up, n);
}

void geglu(const context& c, float* out, const float* gate, const float* up, int64_t n) {
    if (n == 0) return;
    launch_kernel(c, geglu_kernel, grid_1d(n, 256), 256, 0, out, gate, up, n);
}

void scale(const context& c, float* x, float s, int64_t n) {
    if (n == 0) return;
    launch_kernel(c, scale_kernel, grid_1d(n, 256), 256, 0, x, s, n);
}

void softcap(const context& c, float* x, float cap, int64_t n) {
    if (n == 0) return;
    launch_kernel(c, softcap_kernel, grid_1d(n, 256), 256, 0, x, cap, n);
}

void add(const context& c, float* x, const float* y, int64_t n) {
    if (n == 0) return;
    launch_kernel(c, add_kernel, grid_1d(n, 256), 256, 0, x, y, n);
}

void embed(const context& c, float* out, const int32_t* tokens, int64_t n_tok, const int8_t* q, const float* scale,
           const float* f, int64_t n_embd) {
    if (n_tok == 0) return;
    launch_kernel(c, embed_kernel, unsigned(n_tok), row_block, 0, out, tokens, q, scale, f, n_embd);
}

void gather_rows(const context& c, float* out, const float* x, const int32_t* rows, int64_t n_rows, int64_t n) {
    if (n_rows == 0) return;
    launch_kernel(c, gather_rows_kernel, unsigned(n_rows), row_block, 0, out, x, rows, n);
}

} // namespace tandem::cuda
