// A model's weights loaded from GGUF in the engine's layout (one weight: runtime/weight.hpp).
#pragma once

#include "runtime/model_config.hpp"
#include "runtime/weight.hpp"

#include <cstdint>
#include <string>
#include <array>
#include <vector>

namespace tandem {

namespace gguf { class file; struct tensor_info; }
namespace cpu { class thread_pool; }

struct layer_weights {
    weight attn_norm;          // [n_embd]
    weight wq, wk, wv, wo;     // [n_embd_q, n_embd], [n_embd_kv, n_embd] x2, [n_embd, n_embd_q]
    weight bq, bk, bv;         // optional biases (Qwen2): [n_embd_q], [n_embd_kv] x2
    weight q_norm, k_norm;     // per-head RMSNorm weights [head_dim] (model_config::qk_norm)
    weight attn_post_norm;     // [n_embd] (model_config::post_norms)
    weight ffn_norm;           // [n_embd]
    weight w_gate, w_up;       // [n_ff, n_embd]
    weight w_down;             // [n_embd, n_ff]
    weight ffn_post_norm;      // [n_embd] (model_config::post_norms)

    // Mixture of experts (model_config::is_moe; w_gate, w_up and w_down are empty then). Each
    // expert is one weight, a slice of the file's 3-D tensor, so every matmul kernel (F32,
    // INT8, low-bit) reads it as it reads a dense matrix.
    weight router;                          // [n_expert, n_embd] ffn_gate_inp, always F32
    std::vector<weight> gate_exps, up_exps; // [n_expert] x [n_ff_exp, n_embd]
    std::vector<weight> down_exps;          // [n_expert] x [n_embd, n_ff_exp]
    weight shexp_gate;                      // [n_embd] ffn_gate_inp_shexp (qwen2moe), F32
    weight w_gate_shexp, w_up_shexp;        // [n_ff_shexp, n_embd]
    weight w_down_shexp;                    // [n_embd, n_ff_shexp]
};

// Every weight of a layer but the routed experts, for code that treats them alike (sizes,
// device copies).
inline constexpr std::array<weight layer_weights::*, 21> layer_weight_fields = {
    &layer_weights::attn_norm, &layer_weights::wq,       &layer_weights::wk,     &layer_weights::wv,
    &layer_weights::wo,        &layer_weights::bq,       &layer_weights::bk,     &layer_weights::bv,
    &layer_weights::q_norm,    &layer_weights::k_norm,   &layer_weights::attn_post_norm, &layer_weights::ffn_norm,
    &layer_weights::w_gate,    &layer_weights::w_up,     &layer_weights::w_down, &layer_weights::ffn_post_norm,
    &layer_weights::router,    &layer_weights::shexp_gate, &layer_weights::w_gate_shexp, &layer_weights::w_up_shexp,
    &layer_weights::w_down_shexp};

struct weight_load_options {
    weight_format format = weight_format::f32;
    cpu::thread_pool* pool = nullptr; // quantizes rows in parallel when set
    q_layout layout = q_layout::rows; // of the INT8 matrices (blocked: the CPU kernels' from VNNI up)
    // native (`--weights auto`): matrices the file holds in a low-bit format (quant/lowbit.hpp)
    // keep it (the embedding table too), the rest are INT8.
};

struct model_weights {
    weight tok_embd;           // [n_vocab, n_embd]
    weight output_norm;        // [n_embd]
    weight output;             // [n_vocab, n_embd]; empty when tied to tok_embd
    weight rope_freqs;         // [n_rot / 2] Llama 3's frequency divisors (rope_freqs.weight); may be empty
    std::vector<layer_weights> layers;

    const weight& logits_weight() const { return output.empty() ? tok_embd : output; }
    int64_t bytes() const;     // what the weights occupy in memory (or in the mapping)
    int64_t expert_bytes() const; // the routed experts' share of bytes()
    // What one token's decode step reads: every weight but the embedding table (one row of
    // it, unless it is the logits' too), and of the routed experts n_used of n_expert.
    int64_t decode_bytes(const model_config& c) const;
    // "f32", "int8", "low-bit" (every matrix read by matmul low-bit) or "low-bit + int8".
    std::string family() const;

    // Loads and converts every tensor, checking each shape against the config; fills in
    // cfg.n_vocab, cfg.qkv_bias and cfg.tied_output. Throws tandem::error naming the tensor.
    // Phi-3's fused tensors (attn_qkv, ffn_up holding gate and up) are split into wq/wk/wv and
    // w_gate/w_up here, so the forward has one shape of layer.
    // INT8 tensors of a `tandem quantize` file are copied as they are for format int8 (never
    // quantized again) and read back for f32; nothing points into the file after it.
    static model_weights load(const gguf::file& f, model_config& cfg, const weight_load_options& opt = {});
};

// What load() will hold for the file's tensors in `format`, from their infos alone (nothing is
// read): every matrix INT8 rows with a scale and a row sum, or under native the file's
// low-bit matrices in the low-bit layout; vectors and a mixture's router F32; a mixture's
// 3-D experts one matrix each. experts: the routed experts' share.
struct weight_estimate {
    int64_t bytes = 0, expert_bytes = 0;
};
weight_estimate estimate_weight_bytes(const gguf::file& f, weight_format format);
// tandem::error when `need` bytes of weights exceed `available` (MemAvailable, or -1 to read
// /proc/meminfo), saying what the model needs and where: "PATH needs 17.2 GiB of memory for
// its weights (INT8; 15.9 GiB of them experts), and this machine has 12.1 GiB available".
void check_weights_fit(const std::string& path, const weight_estimate& need, weight_format format,
                       int64_t available = -1);

// Whether the matmul kernels read the file's matrix `name`, so that it is laid out for them
// (blocked from the VNNI level up, and so stored by `tandem quantize`): every matrix but the
// embedding table, which the embed op reads by rows unless the logits use it too.
bool read_by_matmul(const gguf::file& f, const std::string& name);

// Row r of a 2-D GGUF tensor of any supported type (I8 with its .scale tensor) as F32 [ne[0]].
void tensor_row_to_f32(const gguf::file& f, const gguf::tensor_info& t, int64_t r, float* out);

// Symmetric per-row INT8 of an F32 matrix [n_out, n_in] (rows in parallel when pool is set).
weight quantize_weight(const float* data, int64_t n_out, int64_t n_in, cpu::thread_pool* pool = nullptr);
// Fills w.q_sum from its rows.
void compute_row_sums(weight& w, cpu::thread_pool* pool = nullptr);
// Lays w's INT8 rows out as q_layout::blocked: in place when no padding is needed, else (and
// for rows in a mapped file) into a new q_store. Does nothing to a blocked or F32 weight.
void pack_blocked(weight& w, cpu::thread_pool* pool = nullptr);

} // namespace tandem
