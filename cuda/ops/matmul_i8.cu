// INT8 matmuls on CUDA: W8A8 through cuBLASLt's IMMA kernels (int32 out, then a per-token x
// per-channel scale kernel) or a hand-written tiled dp4a kernel.
#include "cuda/blaslt.hpp"
#include "cuda/ops/common.cuh"
#include "cuda/ops/ops.hpp"

#include <map>
#include <mutex>
#include <tuple>

namespace tandem::cuda {
namespace {

// ---- tiled dp4a kernel: a 64x64 output tile per block of 256 threads, 4x4 outputs per thread

constexpr int tile_m = 64, tile_n = 64, tile_k = 32;
constexpr int tile_kp = tile_k + 4; // padded row in bytes: keeps int loads aligned, spreads banks

// The reference's epilogue expression, rounding step by step.
__device__ __forceinline__ float scale_dot(int32_t dot, float sx, float sw, const float* bias, int64_t o) {
    return __fadd_rn(__fmul_rn(__fmul_rn(float(dot), sx), sw), bias ? bias[o] : 0.0f);
}

// out [M, N] = dot(qx[m], qw[n]) * sx[m] * sw[n] + bias[n]. VEC: K % 8 == 0 and 8-byte aligned
// rows, so each thread moves 8 bytes of A and of B per K-step with one load each.
template <bool VEC>
__global__ void __launch_bounds__(256)
gemm_i8_tiled_kernel(float* out, const int8_t* qx, const float* sx, const int8_t* qw, const float* sw,
                     const float* bias, int64_t M, int64_t N, int64_t K) {
    __shared__ __align__(16) int8_t as[tile_m][tile_kp];
    __shared__ __align__(16) int8_t bs[tile_n][tile_kp];
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int64_t m0 = int64_t(blockIdx.y) * tile_m, n0 = int64_t(blockIdx.x) * tile_n;
    const int lr = tid / 4, lc = (tid % 4) * 8; // loader: row lr, bytes lc..lc+7 of the K-step
    int32_t acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += tile_k) {
        const int64_t k = k0 + lc;
        if (VEC) {
            int2 a = make_int2(0, 0), b = make_int2(0, 0);
            if (m0 + lr < M && k < K) a = *reinterpret_cast<const int2*>(qx + (m0 + lr) * K + k);
            if (n0 + lr < N && k < K) b = *reinterpret_cast<const int2*>(qw + (n0 + lr) * K + k);
            // Rows are 36 bytes apart (4-byte aligned, not 8): two int stores each.
            int* sa = reinterpret_cast<int*>(&as[lr][lc]);
            int* sb = reinterpret_cast<int*>(&bs[lr][lc]);
            sa[0] = a.x;
            sa[1] = a.y;
            sb[0] = b.x;
            sb[1] = b.y;
        } else {
            for (int j = 0; j < 8; ++j) {
                const bool in_k = k + j < K;
                as[lr][lc + j] = (m0 + lr < M && in_k) ? qx[(m0 + lr) * K + k + j] : int8_t(0);
                bs[lr][lc + j] = (n0 + lr < N && in_k) ? qw[(n0 + lr) * K + k + j] : int8_t(0);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < tile_k; kk += 4) {
            int a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const int*>(&as[ty * 4 + i][kk]);
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const int*>(&bs[tx * 4 + j][kk]);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t m = m0 + ty * 4 + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t n = n0 + tx * 4 + j;
            if (n < N) out[m * N + n] = scale_dot(acc[i][j], sx[m], sw[n], bias, n);
        }
    }
}

// out [M, N] = d [M, N] (int32 dots) scaled per token and per channel.
__global__ void scale_i32_kernel(float* out, const int32_t* d, const float* sx, const float* sw, const float* bias,
                                 int64_t M, int64_t N) {
    const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= M * N) return;
    const int64_t m = idx / N, n = idx % N;
    out[idx] = scale_dot(d[idx], sx[m], sw[n], bias, n);
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

void run_tiled(const context& c, float* out, const int8_t* qx, const float* sx, int64_t M, const int8_t* qw,
               const float* sw, int64_t N, int64_t K, const float* bias) {
    const dim3 grid{unsigned((N + tile_n - 1) / tile_n), unsigned((M + tile_m - 1) / tile_m)};
    TANDEM_ASSERT(grid.y <= 65535u, "matmul_i8: {} tokens exceed one launch", M);
    if (K % 8 == 0 && aligned(qx, 8) && aligned(qw, 8))
        launch_kernel(c, gemm_i8_tiled_kernel<true>, grid, 256, 0, out, qx, sx, qw, sw, bias, M, N, K);
    else
        launch_kernel(c, gemm_i8_tiled_kernel<false>, grid, 256, 0, out, qx, sx, qw, sw, bias, M, N, K);
}

// out [M, N] = d [M, N] (int32 dots) scaled per token and per channel, plus bias.
void scale_i32(const context& c, float* out, const int32_t* d, const float* sx, const float* sw, const float* bias,
               int64_t M, int64_t N) {
    launch_kernel(c, scale_i32_kernel, grid_1d(M * N, 256), 256, 0, out, d, sx, sw, bias, M, N);
}

// ---- cuBLASLt: D [n_tok, n_out] int32 = qx . qw^T as column-major D^T [n_out, n_tok] = qw^T(T) x qx(N),
// the "TN" form its IMMA kernels take with the regular (column-major) order.

struct lt_plan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

// Plans are per device and shape, made once and kept for the process (host objects only).
const lt_plan& plan_for(const context& c, int64_t M, int64_t N, int64_t K) {
    static std::mutex mu;
    static std::map<std::tuple<int, int64_t, int64_t, int64_t>, lt_plan> plans;
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = plans.try_emplace({c.device(), M, N, K});
    lt_plan& p = it->second;
    if (!fresh) return p;
    CUBLAS_CHECK(tandem::cuda::blaslt().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(tandem::cuda::blaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(tandem::cuda::blaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(tandem::cuda::blaslt().MatrixLayoutCreate(&p.a, CUDA_R_8I, uint64_t(K), uint64_t(N), K));  // qw: [N][K] row-major
    CUBLAS_CHECK(tandem::cuda::blaslt().MatrixLayoutCreate(&p.b, CUDA_R_8I, uint64_t(K), uint64_t(M), K));  // qx: [M][K] row-major
    CUBLAS_CHECK(tandem::cuda::blaslt().MatrixLayoutCreate(&p.d, CUDA_R_32I, uint64_t(N), uint64_t(M), N)); // d: [M][N] row-major
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(tandem::cuda::blaslt().MatmulPreferenceCreate(&pref));
    const size_t ws = c.workspace_bytes();
    CUBLAS_CHECK(tandem::cuda::blaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res{};
    int n_res = 0;
    const cublasStatus_t st = tandem::cuda::blaslt().MatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(c.blaslt()), p.desc, p.a,
                                                             p.b, p.d, p.d, pref, 1, &res, &n_res);
    tandem::cuda::blaslt().MatmulPreferenceDestroy(pref);
    // Unsupported shapes come back as NOT_SUPPORTED or no result: the tiled kernel runs them.
    if (st == CUBLAS_STATUS_SUCCESS && n_res > 0) {
        p.algo = res.algo;
        p.ok = true;
    }
    return p;
}

bool lt_eligible(const int8_t* qx, const int8_t* qw, int64_t N, int64_t K) {
    return N % 4 == 0 && K % 4 == 0 && aligned(qx, 16) && aligned(qw, 16);
}

bool run_lt(const context& c, int32_t* d, const int8_t* qx, int64_t M, const int8_t* qw, int64_t N, int64_t K) {
    if (!lt_eligible(qx, qw, N, K) || !aligned(d, 16)) return false;
    const lt_plan& p = plan_for(c, M, N, K);
    if (!p.ok) return false;
    const int32_t alpha = 1, beta = 0;
    CUBLAS_CHECK(tandem::cuda::blaslt().Matmul(static_cast<cublasLtHandle_t>(c.blaslt()), p.desc, &alpha, qw, p.a, qx, p.b, &beta,
                                d, p.d, d, p.d, &p.algo, c.workspace(), c.workspace_bytes(), stream_of(c)));
    return true;
}

// Below this many tokens the tiled kernel (a GEMV in effect) runs even where cuBLASLt could.
constexpr int64_t lt_min_tokens = 16;

} // namespace

gemm_impl matmul_i8(const context& c, float* out, const int8_t* qx, const float* sx, int64_t n_tok, const int8_t* qw,
                    const float* sw, int64_t n_out, int64_t n_in, const float* bias, gemm_impl impl) {
    if (n_tok == 0) return gemm_impl::tiled;
    c.make_current();
    const bool try_lt = impl == gemm_impl::cublaslt || (impl == gemm_impl::automatic && n_tok >= lt_min_tokens);
    if (try_lt && lt_eligible(qx, qw, n_out, n_in)) {
        buffer d(c, size_t(n_tok * n_out) * sizeof(int32_t));
        if (run_lt(c, d.as<int32_t>(), qx, n_tok, qw, n_out, n_in)) {
            scale_i32(c, out, d.as<int32_t>(), sx, sw, bias, n_tok, n_out);
            return gemm_impl::cublaslt; // d is freed in stream order, after the scale kernel
        }
    }
    run_tiled(c, out, qx, sx, n_tok, qw, sw, n_out, n_in, bias);
    return gemm_impl::tiled;
}

bool gemm_i8_i32_cublaslt(const context& c, int32_t* out_i32, const int8_t* qx, int64_t n_tok, const int8_t* qw,
                          int64_t n_out, int64_t n_in) {
    c.make_current();
    return run_lt(c, out_i32, qx, n_tok, qw, n_out, n_in);
}

} // namespace tandem::cuda
