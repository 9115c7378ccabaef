// Synthetic Llama-family GGUF models: seeded random weights and a made-up SentencePiece vocab.
#pragma once

#include "runtime/dtype.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct synth_params {
    int32_t n_layer = 2;
    int32_t n_embd = 64;
    int32_t n_head = 4;
    int32_t n_head_kv = 2;
    int32_t n_ff = 160;
    int32_t n_vocab = 512;       // >= 260: 3 specials + 256 byte tokens + at least one piece
    int32_t n_ctx = 256;
    dtype type = dtype::f32;     // of the matrices: f32, f16, bf16 or a block format (quant/blocks.hpp); norms stay F32
    // Not f32: output.weight, and attn_v and ffn_down of every other layer (from the first), in
    // this type instead (Q6_K over Q4_K: a Q4_K_M-like mix, as llama.cpp gives those more bits).
    dtype mix_type = dtype::f32;
    uint64_t seed = 1;
    std::string name = "tandem-synth";
    // Any of model_config's supported_archs, with the tensors and keys llama.cpp's conversion
    // writes for it: qwen2 (Q/K/V biases), qwen3 (q/k norms), phi3 (fused attn_qkv, ffn_up
    // holding gate and up), gemma (tied output), gemma2 (post norms, soft-caps), gemma3 (q/k
    // and post norms); NeoX RoPE for all but llama and mistral.
    std::string arch = "llama";
    // Mixture of experts: qwen3moe, qwen2moe (with a shared expert), or "mixtral" (written as
    // llama with experts). 0 here takes the architecture's tiny defaults: 8 experts, top 2,
    // experts of 64 (Mixtral's: n_ff), qwen2moe's shared expert of n_ff.
    int32_t n_expert = 0;
    int32_t n_expert_used = 0;
    int32_t n_ff_exp = 0;
    int32_t n_ff_shexp = 0;
    int32_t head_dim = 0;        // attention.key_length; 0: n_embd / n_head
    bool tied_output = false;    // no output.weight: logits use token_embd (always for gemma*)
    float rope_scale = 0;        // > 1: RoPE scaling by this factor, of the kind rope_scaling says
    std::string rope_scaling = "linear"; // linear, yarn, or llama3 (a rope_freqs.weight as Llama 3.1's)
    int32_t sliding_window = 0;  // > 0: <arch>.attention.sliding_window (windowed layers as the architecture has them)
    std::string vocab_from;      // a GGUF whose tokenizer (tokenizer.* keys) and vocabulary size to copy
    std::vector<std::string> added_tokens; // user-defined tokens ("<think>"), the made-up vocabulary's last ids
    std::string chat_template;   // tokenizer.chat_template (Jinja source) when not empty
};

// "tiny" (2 layers, 64 dim, F32), or a real model's shapes and architecture at Q8_0:
// synth_preset_names lists them. tandem::error for any other name.
synth_params synth_preset(std::string_view preset);
extern const std::vector<std::string_view> synth_preset_names;

// Writes a GGUF that llama.cpp would load as a Llama model: its metadata keys, tokenizer
// arrays and tensor names. The same params (seed included) give the same bytes. Tensors are
// generated one at a time while writing, so memory stays at about the largest tensor.
void synth_write(const synth_params& p, const std::string& path);

} // namespace tandem
