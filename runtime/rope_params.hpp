// What the RoPE op reads: the rotated dims, each pair's frequency, the scales.
#pragma once

// Core: the reference, CPU and CUDA kernels take this struct. C++17, as the CUDA sources are.

namespace tandem {

// Token at position p turns pair i of each head (i < n_rot / 2) by the angle
// p * freq_scale * inv_freq[i], and multiplies the turned pair by mscale. Every RoPE variant is
// a table: plain base^(-2i / n_rot), Llama 3's per-pair factors dividing it, YaRN's blend of
// interpolated and extrapolated frequencies (model_config.cpp rope_table builds them).
struct rope_params {
    int n_rot = 0;                   // even; the first n_rot dims of each head
    const float* inv_freq = nullptr; // [n_rot / 2], backend memory
    float freq_scale = 1.0f;         // linear scaling: positions times this
    float mscale = 1.0f;             // YaRN's attention factor on cos and sin
    bool neox = false;               // pairs (i, i + n_rot / 2); else (2i, 2i + 1)
};

} // namespace tandem
