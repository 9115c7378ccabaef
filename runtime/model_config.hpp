// Hyperparameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <string>
#include <vector>

namespace tandem {

namespace gguf { class file; }

// normal: rotate adjacent pairs (x[2i], x[2i+1]) as GGUF's llama conversion expects;
// neox: rotate x[i] with x[i + n_rot/2] (Qwen2 and other NeoX-style models).
enum class rope_style { normal, neox };

// How an embedding pools a text's final hidden states (GGUF's <arch>.pooling_type 1, 2, 3;
// mean for a file without one, or with none (0) or rank (4), which a generative model's
// embeddings cannot use).
enum class pooling_type : uint8_t { mean, cls, last };

// The feed-forward's gate activation: SiLU (SwiGLU: Llama, Qwen, Phi-3) or GELU with the tanh
// approximation (GeGLU: the Gemma family).
enum class ffn_act : uint8_t { silu, gelu };

// RoPE frequency scaling beyond linear: none, or YaRN (Qwen 2.5's long context), which mixes
// interpolated and extrapolated frequencies by wavelength and scales attention's logits.
// (Llama 3.x's `llama3` scaling is per-dimension factors, the file's rope_freqs.weight.)
struct yarn_params {
    float factor = 0;          // 0: no YaRN; else the context's scale (rope.scaling.factor)
    int32_t orig_ctx = 0;      // rope.scaling.original_context_length
    float beta_fast = 32.0f;   // the wavelength ramp's ends, in rotations over orig_ctx
    float beta_slow = 1.0f;
    float attn_factor = 1.0f;  // rope.scaling.attn_factor
};

// The general.architecture values Tandem runs.
extern const std::array<std::string_view, 10> supported_archs;

struct model_config {
    std::string arch;      // general.architecture (supported_archs in model_config.cpp)
    std::string name;      // general.name, or the file name
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_embd = 0;
    int32_t n_layer = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;  // attention.key_length, else n_embd / n_head
    int32_t n_ff = 0;
    int32_t n_rot = 0;     // rotated dims per head (<= head_dim)
    float rms_eps = 1e-5f;
    float rope_freq_base = 10000.0f;
    float rope_freq_scale = 1.0f; // linear scaling: position * scale
    rope_style rope = rope_style::normal;
    bool qkv_bias = false;        // set by the loader when bias tensors exist
    bool tied_output = false;     // no output.weight: logits use token_embd
    pooling_type pooling = pooling_type::mean;
    yarn_params yarn;

    // Sliding-window attention (<arch>.attention.sliding_window): a windowed layer's token at
    // position p sees only p - sliding_window + 1..p. Which layers are windowed is the
    // architecture's pattern: every layer (mistral, qwen2, phi3 with a window), the even ones
    // (gemma2), all but every sixth (gemma3); see model_config.cpp.
    int32_t sliding_window = 0;
    std::vector<uint8_t> layer_windowed; // [n_layer] (empty without a window)
    // The attention window of layer il (0: the whole context).
    int32_t window_of(int il) const {
        return sliding_window > 0 && layer_windowed[size_t(il)] != 0 ? sliding_window : 0;
    }
    // How far back any layer still reads: the positions a sequence must keep in its KV pages
    // behind its next token (0: all of them, when some layer is global).
    int32_t kv_window() const;

    // Architecture details beyond Llama's (their defaults are Llama's):
    ffn_act act = ffn_act::silu;
    float embd_scale = 1.0f;      // the embeddings' rows times this (Gemma: sqrt(n_embd))
    float attn_scale = 0.0f;      // the query's scale; 0: 1 / sqrt(head_dim)
    float attn_softcap = 0.0f;    // > 0: attention logits s become c * tanh(s / c) (Gemma 2)
    float final_softcap = 0.0f;   // the same on the output logits (Gemma 2)
    float rope_freq_base_swa = 0; // windowed layers' RoPE base, unscaled (Gemma 3); 0: as the rest
    bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen 3, Gemma 3)
    bool post_norms = false;      // RMSNorm of the attention and FFN outputs (Gemma 2 and 3)

    int32_t n_embd_q() const { return n_head * head_dim; }

    // Mixture of experts (qwen2moe, qwen3moe, llama with <arch>.expert_count > 0): each
    // layer's FFN is a router (ffn_gate_inp) over n_expert experts of width n_ff_exp, of which
    // each token runs its top n_expert_used (softmax over all, the top-k's probabilities as
    // weights, renormalised to sum 1 when expert_norm), plus, where n_ff_shexp > 0, a shared
    // expert every token runs, scaled by the sigmoid of its own gate (qwen2moe).
    int32_t n_expert = 0;         // 0: a dense FFN of n_ff
    int32_t n_expert_used = 0;
    int32_t n_ff_exp = 0;
    int32_t n_ff_shexp = 0;
    bool expert_norm = false;
    bool is_moe() const { return n_expert > 0; }
    // The widest FFN activation row a token holds (dense, expert or shared).
    int32_t n_ff_max() const;

    // Layer il's RoPE: each pair's frequency (host memory; rope_params::inv_freq on a device is
    // a copy) and the scales. factors: the file's rope_freqs.weight, n_rot / 2 divisors of the
    // frequencies (Llama 3.x's `llama3` scaling), or null.
    struct rope_table {
        std::vector<float> inv_freq;
        float freq_scale = 1.0f;
        float mscale = 1.0f;
    };
    rope_table rope_of(int il, const float* factors) const;

    int32_t n_embd_kv() const { return n_head_kv * head_dim; }
    int32_t n_gqa() const { return n_head / n_head_kv; }

    // Throws tandem::error naming the file and the missing or inconsistent key.
    static model_config from_gguf(const gguf::file& f);
};

} // namespace tandem
