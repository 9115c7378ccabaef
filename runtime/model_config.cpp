// Reads and validates Llama-family hyperparameters from GGUF metadata.
#include "runtime/model_config.hpp"

#include "runtime/error.hpp"
#include "runtime/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/ranges.h>

namespace tandem {
namespace {

int32_t require_int(const gguf::file& f, const std::string& key, int64_t lo, int64_t hi) {
    auto v = f.get_int(key);
    TANDEM_CHECK(v.has_value(), "{}: missing metadata key {}", f.path(), key);
    TANDEM_CHECK(*v >= lo && *v <= hi, "{}: {} = {} is out of range [{}, {}]", f.path(), key, *v, lo, hi);
    return int32_t(*v);
}

// The mixture-of-experts keys, as llama.cpp reads them for these architectures: qwen3moe's
// experts are expert_feed_forward_length wide (default n_ff / n_expert_used), its top-k
// renormalised; qwen2moe adds a shared expert (expert_shared_feed_forward_length, default
// n_ff) and does not renormalise; Mixtral (llama) has experts of feed_forward_length,
// renormalised. Any other expert_* key is a feature Tandem does not implement: refused by name.
void read_experts(const gguf::file& f, model_config& c) {
    const std::string p = c.arch + ".";
    const bool moe_arch = c.arch == "qwen2moe" || c.arch == "qwen3moe";
    const int64_t n_expert = f.get_int(p + "expert_count").value_or(0);
    TANDEM_CHECK(!moe_arch || n_expert > 0, "{}: {} needs {}expert_count", f.path(), c.arch, p);
    for (const auto& kv : f.metadata()) {
        if (!kv.key.starts_with(p + "expert_")) continue;
        const std::string_view k = std::string_view(kv.key).substr(p.size());
        const bool known = k == "expert_count" || k == "expert_used_count" || k == "expert_feed_forward_length" ||
                           k == "expert_shared_feed_forward_length" || k == "expert_gating_func" ||
                           k == "expert_weights_norm" || k == "expert_weights_scale";
        TANDEM_CHECK(known, "{}: {} is a mixture-of-experts feature Tandem does not support", f.path(), kv.key);
    }
    if (n_expert == 0) return;
    TANDEM_CHECK(c.arch == "llama" || moe_arch, "{}: {} with {}expert_count: mixture-of-experts {} is not supported "
                 "(llama, qwen2moe, qwen3moe)", f.path(), c.arch, p, c.arch);
    c.n_expert = require_int(f, p + "expert_count", 1, 4096);
    c.n_expert_used = require_int(f, p + "expert_used_count", 1, c.n_expert);
    const int32_t by_default = c.arch == "llama" ? c.n_ff : std::max(1, c.n_ff / c.n_expert_used);
    c.n_ff_exp = c.arch != "llama" && f.get_int(p + "expert_feed_forward_length")
                     ? require_int(f, p + "expert_feed_forward_length", 1, int64_t(1) << 20)
                     : by_default;
    if (c.arch == "qwen2moe")
        c.n_ff_shexp = f.get_int(p + "expert_shared_feed_forward_length")
                           ? require_int(f, p + "expert_shared_feed_forward_length", 1, int64_t(1) << 20)
                           : c.n_ff;
    c.expert_norm = c.arch != "qwen2moe";
    if (f.find(p + "expert_weights_norm")) {
        const auto b = f.get_bool(p + "expert_weights_norm");
        TANDEM_CHECK(b.has_value(), "{}: {}expert_weights_norm is not a bool", f.path(), p);
        c.expert_norm = *b;
    }
    if (auto g = f.get_int(p + "expert_gating_func"))
        TANDEM_CHECK(*g == 1, "{}: {}expert_gating_func {} is not softmax (1), the one gating Tandem does", f.path(), p,
                     *g);
    if (auto s = f.get_float(p + "expert_weights_scale"))
        TANDEM_CHECK(*s == 1.0, "{}: {}expert_weights_scale {} (scaled expert weights) is not supported", f.path(), p,
                     *s);
}

} // namespace

const std::array<std::string_view, 10> supported_archs = {"llama", "mistral", "qwen2",  "qwen3",  "phi3",
                                                          "gemma", "gemma2",  "gemma3", "qwen2moe", "qwen3moe"};

int32_t model_config::n_ff_max() const { return std::max({n_ff, is_moe() ? n_ff_exp : 0, n_ff_shexp}); }

int32_t model_config::kv_window() const {
    if (sliding_window <= 0) return 0;
    for (int il = 0; il < n_layer; ++il)
        if (window_of(il) == 0) return 0;
    return sliding_window;
}

model_config::rope_table model_config::rope_of(int il, const float* factors) const {
    // Gemma 3's local layers turn by their own base, unscaled.
    const bool local = rope_freq_base_swa > 0 && window_of(il) > 0;
    const float base = local ? rope_freq_base_swa : rope_freq_base;
    rope_table t;
    t.freq_scale = local ? 1.0f : rope_freq_scale;
    t.inv_freq.resize(size_t(n_rot / 2));
    for (int i = 0; i < n_rot / 2; ++i) {
        t.inv_freq[size_t(i)] = std::pow(base, -2.0f * float(i) / float(n_rot));
        if (factors != nullptr && !local) t.inv_freq[size_t(i)] /= factors[i];
    }
    if (yarn.factor > 1 && !local) {
        // YaRN: pairs that turn fewer than beta_slow times over the original context are
        // interpolated (frequency / factor), those turning more than beta_fast times keep their
        // frequency, a linear ramp between; cos and sin grow by 0.1 ln(factor).
        const auto pair_turning = [&](float turns) { // the pair that turns `turns` times over orig_ctx
            return float(n_rot) * std::log(float(yarn.orig_ctx) / (turns * 2.0f * 3.14159265358979f)) /
                   (2.0f * std::log(base));
        };
        const float lo = std::max(0.0f, std::floor(pair_turning(yarn.beta_fast)));
        const float hi = std::min(float(n_rot - 1), std::ceil(pair_turning(yarn.beta_slow)));
        for (int i = 0; i < n_rot / 2; ++i) {
            const float keep = 1.0f - std::clamp((float(i) - lo) / std::max(0.001f, hi - lo), 0.0f, 1.0f);
            t.inv_freq[size_t(i)] *= (1.0f - keep) / yarn.factor + keep;
        }
        t.mscale = yarn.attn_factor * (1.0f + 0.1f * std::log(yarn.factor));
    }
    return t;
}

model_config model_config::from_gguf(const gguf::file& f) {
    model_config c;
    auto arch = f.get_string("general.architecture");
    TANDEM_CHECK(arch.has_value(), "{}: missing metadata key general.architecture", f.path());
    c.arch = *arch;
    TANDEM_CHECK(std::find(supported_archs.begin(), supported_archs.end(), c.arch) != supported_archs.end(),
                 "{}: architecture '{}' is not supported ({})", f.path(), c.arch, fmt::join(supported_archs, ", "));
    c.name = f.get_string("general.name").value_or(std::filesystem::path(f.path()).stem().string());

    const std::string p = c.arch + ".";
    constexpr int64_t big = int64_t(1) << 20;
    c.n_embd = require_int(f, p + "embedding_length", 1, big);
    c.n_layer = require_int(f, p + "block_count", 1, 4096);
    c.n_head = require_int(f, p + "attention.head_count", 1, 4096);
    c.n_head_kv = f.get_int(p + "attention.head_count_kv") ? require_int(f, p + "attention.head_count_kv", 1, 4096)
                                                           : c.n_head;
    c.n_ff = require_int(f, p + "feed_forward_length", 1, big);
    c.n_ctx_train = f.get_int(p + "context_length") ? require_int(f, p + "context_length", 1, int64_t(1) << 24) : 2048;

    TANDEM_CHECK(c.n_embd % c.n_head == 0, "{}: embedding_length {} is not a multiple of head_count {}",
                 f.path(), c.n_embd, c.n_head);
    TANDEM_CHECK(c.n_head % c.n_head_kv == 0, "{}: head_count {} is not a multiple of head_count_kv {}",
                 f.path(), c.n_head, c.n_head_kv);
    // Heads may be wider than n_embd / n_head (Gemma, Qwen 3): attention.key_length says so.
    c.head_dim = f.get_int(p + "attention.key_length") ? require_int(f, p + "attention.key_length", 2, 4096)
                                                       : c.n_embd / c.n_head;
    if (auto vd = f.get_int(p + "attention.value_length")) {
        TANDEM_CHECK(*vd == c.head_dim, "{}: attention.value_length {} differs from key_length {} (unsupported)",
                     f.path(), *vd, c.head_dim);
    }
    c.n_rot = f.get_int(p + "rope.dimension_count") ? require_int(f, p + "rope.dimension_count", 2, c.head_dim)
                                                    : c.head_dim;
    TANDEM_CHECK(c.n_rot % 2 == 0, "{}: rope.dimension_count {} is odd", f.path(), c.n_rot);

    if (auto eps = f.get_float(p + "attention.layer_norm_rms_epsilon")) {
        TANDEM_CHECK(*eps > 0 && *eps < 1, "{}: layer_norm_rms_epsilon {} out of range", f.path(), *eps);
        c.rms_eps = float(*eps);
    }
    if (auto base = f.get_float(p + "rope.freq_base")) {
        TANDEM_CHECK(*base > 1, "{}: rope.freq_base {} out of range", f.path(), *base);
        c.rope_freq_base = float(*base);
    }
    // RoPE scaling: linear or YaRN by the current keys, linear by the older one. (Llama 3's
    // scaling is the rope_freqs tensor: the loader reads it.)
    auto scaling_type = f.get_string(p + "rope.scaling.type");
    if (scaling_type && *scaling_type != "none") {
        TANDEM_CHECK(*scaling_type == "linear" || *scaling_type == "yarn",
                     "{}: rope scaling '{}' is not supported (linear, yarn)", f.path(), *scaling_type);
        float factor = 1;
        if (auto v = f.get_float(p + "rope.scaling.factor")) {
            TANDEM_CHECK(*v >= 1 && *v <= 1024, "{}: rope.scaling.factor {} out of range", f.path(), *v);
            factor = float(*v);
        }
        if (*scaling_type == "linear") {
            c.rope_freq_scale = 1.0f / factor;
        } else if (factor > 1) {
            c.yarn.factor = factor;
            c.yarn.orig_ctx = f.get_int(p + "rope.scaling.original_context_length")
                                  ? require_int(f, p + "rope.scaling.original_context_length", 1, int64_t(1) << 24)
                                  : c.n_ctx_train;
            if (auto af = f.get_float(p + "rope.scaling.attn_factor")) {
                TANDEM_CHECK(*af > 0 && *af < 100, "{}: rope.scaling.attn_factor {} out of range", f.path(), *af);
                c.yarn.attn_factor = float(*af);
            }
        }
    } else if (auto lin = f.get_float(p + "rope.scale_linear")) {
        TANDEM_CHECK(*lin >= 1 && *lin <= 1024, "{}: rope.scale_linear {} out of range", f.path(), *lin);
        c.rope_freq_scale = float(1.0 / *lin);
    }
    // Every architecture here but Llama's (and Mistral's) rotates NeoX-style halves.
    c.rope = c.arch == "llama" || c.arch == "mistral" ? rope_style::normal : rope_style::neox;

    // Sliding window: every layer, or Gemma 2's even layers (local, global, ...), or all but
    // every sixth of Gemma 3's (five local, one global), as llama.cpp and the models' reference
    // code place them.
    if (f.get_int(p + "attention.sliding_window")) {
        c.sliding_window = require_int(f, p + "attention.sliding_window", 1, int64_t(1) << 24);
        c.layer_windowed.resize(size_t(c.n_layer));
        for (int il = 0; il < c.n_layer; ++il)
            c.layer_windowed[size_t(il)] = c.arch == "gemma2" ? il % 2 == 0 : c.arch == "gemma3" ? il % 6 != 5 : 1;
    }

    // The Gemma family: GeGLU, embeddings times sqrt(n_embd) (its norms' weights hold 1 + w in
    // GGUF already); Gemma 2 soft-caps, both add norms after attention and the FFN; Gemma 3's
    // local layers turn by an unscaled base of 10000. The 27B models scale queries by
    // n_embd / n_head, not the head width (their query_pre_attn_scalar; GGUF's attention.scale
    // when a file sets it).
    const bool gemma = c.arch.starts_with("gemma");
    if (gemma) {
        c.act = ffn_act::gelu;
        c.embd_scale = std::sqrt(float(c.n_embd));
    }
    const bool is_27b = (c.arch == "gemma2" && c.n_layer == 46) || (c.arch == "gemma3" && c.n_layer == 62);
    if (is_27b) c.attn_scale = 1.0f / std::sqrt(float(c.n_embd / c.n_head));
    if (auto s = f.get_float(p + "attention.scale")) {
        TANDEM_CHECK(*s > 0 && *s < 100, "{}: attention.scale {} out of range", f.path(), *s);
        c.attn_scale = float(*s);
    }
    if (c.arch == "gemma2") {
        c.attn_softcap = 50.0f;
        c.final_softcap = 30.0f;
    }
    for (auto [key, field] : {std::pair{"attn_logit_softcapping", &model_config::attn_softcap},
                              std::pair{"final_logit_softcapping", &model_config::final_softcap}})
        if (auto v = f.get_float(p + key)) {
            TANDEM_CHECK(*v >= 0 && *v < 1e6, "{}: {}{} = {} out of range", f.path(), p, key, *v);
            c.*field = float(*v);
        }
    c.post_norms = c.arch == "gemma2" || c.arch == "gemma3";
    c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma3";
    if (c.arch == "gemma3") c.rope_freq_base_swa = 10000.0f;

    if (auto pt = f.get_int(p + "pooling_type")) {
        if (*pt == 2) c.pooling = pooling_type::cls;
        else if (*pt == 3) c.pooling = pooling_type::last;
    }

    read_experts(f, c);

    // The vocabulary size comes from the tokenizer or the embedding; the loader checks both.
    if (auto nv = f.get_int(p + "vocab_size")) c.n_vocab = require_int(f, p + "vocab_size", 1, int64_t(1) << 24);
    else if (const auto* emb = f.find_tensor("token_embd.weight"); emb && emb->ne.size() == 2 && emb->ne[1] > 0 &&
                                                                    emb->ne[1] <= (int64_t(1) << 24))
        c.n_vocab = int32_t(emb->ne[1]);
    return c;
}

} // namespace tandem
