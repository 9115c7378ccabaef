// The engine's forward pass: a Llama-family model built from ops over a paged KV cache.
#pragma once

#include "runtime/attn_params.hpp"
#include "runtime/batch.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/model_config.hpp"
#include "runtime/ops/dispatch.hpp"
#include "runtime/ops/scratch.hpp"
#include "runtime/tokenizer.hpp"
#include "runtime/weights.hpp"

#include <atomic>
#include <span>
#include <vector>

namespace tandem {

namespace ops { struct act_i8; }

// The KV pages of one forward on the context's backend (attn_params without the sequences,
// which come from the batch): the block tables are host memory, staged to the backend by
// the forward, with where each of the batch's sequences starts in them (a runner that moves
// pages to a device translates the batch's block tables into its own device pages).
struct forward_pages {
    kv_layout lay;
    uint8_t* kv_base = nullptr;            // backend memory
    int32_t n_pages = 0;
    std::span<const int32_t> tables;       // host memory
    std::span<const int32_t> table_begin;  // [n_seqs] offsets into tables
};

class model {
public:
    // kv: the element type of the caches that make_kv_layout describes.
    model(model_config cfg, model_weights weights, kv_dtype kv = kv_dtype::f32);

    const model_config& config() const { return cfg_; }
    const model_weights& weights() const { return w_; }

    // A KV layout for this model with the given page size (and the model's KV dtype).
    kv_layout make_kv_layout(int32_t page_size = 16) const;
    kv_dtype kv_type() const { return kv_; }
    void set_kv_type(kv_dtype kv) { kv_ = kv; }

    // Runs every new token of every sequence as one flat batch (matmuls over all tokens, one
    // attention op for all sequences) and writes the row of each token that wants one into
    // logits [b.n_logits(), n_vocab], in token order: its logits, or its hidden state after
    // the output norm in the row's first n_embd floats (row_kind::hidden, which needs
    // n_embd <= n_vocab). The batch, its token ids checked here, is host memory.
    //
    // Any backend: weights `w` (this model's, or a view of a copy on the context's backend,
    // cuda::device_model_weights::view()), the pages and logits are backend memory, and the
    // activations come from ctx.scratch (reset here). The one forward every runner runs.
    void forward(const exec_ctx& ctx, const model_weights& w, const batch& b, const forward_pages& kv,
                 float* logits) const;
    // Host backends: this model's weights, the pages of `kv` with the batch's block tables,
    // scratch from ctx.scratch or else the model's own.
    void forward(const exec_ctx& ctx, const batch& b, kv_cache& kv, float* logits);
    // Builds ahead what a forward of up to max_tokens tokens and max_rows output rows on this
    // context builds on first use (the CPU's oneDNN primitives, one per multiple of 64 rows and
    // weight shape, and ctx.scratch's block when given), so a server's memory is at its steady
    // state once this returns. A later forward of any size up to those builds nothing more and
    // takes no more scratch (test_model counts both).
    void prepare(const exec_ctx& ctx, int32_t max_tokens, int32_t max_rows) const;
    // The scratch bytes forward takes at most for n_tok tokens and n_rows rows.
    size_t scratch_bytes(int64_t n_tok, int64_t n_rows) const;

    // What the routed experts cost so far, over every forward of this model (mixture of
    // experts): expert runs (one expert over its tokens of one step in one layer) and the bytes
    // of expert weights they read (each once per step, whatever its token count).
    struct expert_reads {
        int64_t runs = 0;
        int64_t bytes = 0;
    };
    expert_reads expert_reads_total() const { return {expert_runs_.load(), expert_bytes_.load()}; }

private:
    // logits [n_rows, n_vocab] from the normed rows xn [n_rows, n_embd]; act: INT8 scratch.
    void project_logits(const exec_ctx& ctx, const model_weights& w, const float* xn, int64_t n_rows, float* logits,
                        const ops::act_i8& act) const;

    // gate [n] = act(gate) * up, the architecture's gated activation (SwiGLU or GeGLU).
    void glu(const exec_ctx& ctx, float* gate, const float* up, int64_t n) const;

    // The buffers of a forward's FFN, from its scratch.
    struct ffn_bufs {
        float* gate;     // [n_tok, n_ff_max]
        float* up;       // [n_tok, n_ff_max]
        float* proj;     // [2 * n_tok, n_embd]
        int8_t* xq;      // [2 * n_tok, max(n_embd, n_ff_max)]
        float* xs;       // [2 * n_tok]
        // mixture of experts only
        float* scores;   // [n_tok, n_expert] the router's logits
        int32_t* ids;    // [n_tok, n_expert_used]
        float* weights;  // [n_tok, n_expert_used]
        float* rows;     // [n_tok, n_embd] an expert's tokens' normed rows, gathered
    };
    // proj [m, n_embd] = (act(xn W_gate^T) * (xn W_up^T)) W_down^T over m rows of normed input
    // xn [m, n_embd]: an expert or the shared expert (W8A8 as the dense FFN for integer
    // weights). Returns b.proj.
    const float* gated_ffn(const exec_ctx& ctx, const weight& w_gate, const weight& w_up, const weight& w_down,
                           const float* xn, int64_t m, const ffn_bufs& b) const;
    // The mixture-of-experts FFN of layer l: x [n_tok, n_embd] += the routed experts' outputs
    // (and the shared expert's) from the normed rows xn (runtime/ops/moe.hpp; host backends).
    void moe_ffn(const exec_ctx& ctx, const layer_weights& l, const float* xn, float* x, int64_t n_tok,
                 const ffn_bufs& b) const;

    model_config cfg_;
    model_weights w_;
    std::vector<model_config::rope_table> rope_; // the distinct RoPE tables
    std::vector<int32_t> layer_rope_;            // [n_layer]: each layer's index into rope_
    kv_dtype kv_;
    scratch_arena scratch_ = scratch_arena::host(); // for host contexts without one
    mutable std::atomic<int64_t> expert_runs_{0}, expert_bytes_{0};
};

} // namespace tandem
