// Hyperparameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

namespace gguf { class file; }

// normal: rotate adjacent pairs (x[2i], x[2i+1]) as GGUF's llama conversion expects;
// neox: rotate x[i] with x[i + n_rot/2] (Qwen2 and other NeoX-style models).
enum class rope_style { normal, neox };

// How an embedding pools a text's final hidden states (GGUF's <arch>.pooling_type 1, 2, 3;
// mean for a file without one, or with none (0) or rank (4), which a generative model's
// embeddings cannot use).
enum class pooling_type : uint8_t { mean, cls, last };

struct model_config {
    std::string arch;      // general.architecture: llama, mistral, qwen2
    std::string name;      // general.name, or the file name
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_embd = 0;
    int32_t n_layer = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;  // n_embd / n_head
    int32_t n_ff = 0;
    int32_t n_rot = 0;     // rotated dims per head (<= head_dim)
    float rms_eps = 1e-5f;
    float rope_freq_base = 10000.0f;
    float rope_freq_scale = 1.0f; // linear scaling: position * scale
    rope_style rope = rope_style::normal;
    bool qkv_bias = false;        // set by the loader when bias tensors exist
    bool tied_output = false;     // no output.weight: logits use token_embd
    pooling_type pooling = pooling_type::mean;

    int32_t n_embd_kv() const { return n_head_kv * head_dim; }
    int32_t n_gqa() const { return n_head / n_head_kv; }

    // Throws tandem::error naming the file and the missing or inconsistent key.
    static model_config from_gguf(const gguf::file& f);
};

} // namespace tandem
