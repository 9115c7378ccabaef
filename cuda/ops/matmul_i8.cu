// INT8 matmuls on CUDA: W8A8 through cuBLASLt's IMMA kernels (int32 out, then a per-token x
// per-channel scale kernel) or a hand-written tiled dp4a kernel (both in matmul_kernels.cuh).
#include "cuda/blaslt.hpp"
#include "cuda/ops/common.cuh"
#include "cuda/ops/ops.hpp"

#include "cuda/ops/matmul_kernels.cuh"

#include <map>
#include <mutex>
#include <tuple>

namespace tandem::cuda {
namespace {

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
