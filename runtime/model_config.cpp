// Reads and validates Llama-family hyperparameters from GGUF metadata.
#include "runtime/model_config.hpp"

#include "runtime/error.hpp"
#include "runtime/gguf.hpp"

#include <filesystem>

namespace tandem {
namespace {

int32_t require_int(const gguf::file& f, const std::string& key, int64_t lo, int64_t hi) {
    auto v = f.get_int(key);
    TANDEM_CHECK(v.has_value(), "{}: missing metadata key {}", f.path(), key);
    TANDEM_CHECK(*v >= lo && *v <= hi, "{}: {} = {} is out of range [{}, {}]", f.path(), key, *v, lo, hi);
    return int32_t(*v);
}

} // namespace

int32_t model_config::kv_window() const {
    if (sliding_window <= 0) return 0;
    for (int il = 0; il < n_layer; ++il)
        if (window_of(il) == 0) return 0;
    return sliding_window;
}

model_config model_config::from_gguf(const gguf::file& f) {
    model_config c;
    auto arch = f.get_string("general.architecture");
    TANDEM_CHECK(arch.has_value(), "{}: missing metadata key general.architecture", f.path());
    c.arch = *arch;
    TANDEM_CHECK(c.arch == "llama" || c.arch == "mistral" || c.arch == "qwen2",
                 "{}: architecture '{}' is not supported (llama, mistral, qwen2)", f.path(), c.arch);
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
    c.head_dim = c.n_embd / c.n_head;
    if (auto kd = f.get_int(p + "attention.key_length")) {
        TANDEM_CHECK(*kd == c.head_dim, "{}: attention.key_length {} differs from n_embd/n_head = {} (unsupported)",
                     f.path(), *kd, c.head_dim);
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
    // Linear RoPE scaling: the current key, then the older one.
    auto scaling_type = f.get_string(p + "rope.scaling.type");
    if (scaling_type && *scaling_type != "none") {
        TANDEM_CHECK(*scaling_type == "linear", "{}: rope scaling '{}' is not supported (linear only)",
                     f.path(), *scaling_type);
        if (auto factor = f.get_float(p + "rope.scaling.factor")) {
            TANDEM_CHECK(*factor >= 1 && *factor <= 1024, "{}: rope.scaling.factor {} out of range", f.path(), *factor);
            c.rope_freq_scale = float(1.0 / *factor);
        }
    } else if (auto lin = f.get_float(p + "rope.scale_linear")) {
        TANDEM_CHECK(*lin >= 1 && *lin <= 1024, "{}: rope.scale_linear {} out of range", f.path(), *lin);
        c.rope_freq_scale = float(1.0 / *lin);
    }
    c.rope = c.arch == "qwen2" ? rope_style::neox : rope_style::normal;

    // Sliding window: every layer of the Llama-family architectures that set one.
    if (f.get_int(p + "attention.sliding_window")) {
        c.sliding_window = require_int(f, p + "attention.sliding_window", 1, int64_t(1) << 24);
        c.layer_windowed.assign(size_t(c.n_layer), 1);
    }

    if (auto pt = f.get_int(p + "pooling_type")) {
        if (*pt == 2) c.pooling = pooling_type::cls;
        else if (*pt == 3) c.pooling = pooling_type::last;
    }

    // The vocabulary size comes from the tokenizer or the embedding; the loader checks both.
    if (auto nv = f.get_int(p + "vocab_size")) c.n_vocab = require_int(f, p + "vocab_size", 1, int64_t(1) << 24);
    else if (const auto* emb = f.find_tensor("token_embd.weight"); emb && emb->ne.size() == 2 && emb->ne[1] > 0 &&
                                                                    emb->ne[1] <= (int64_t(1) << 24))
        c.n_vocab = int32_t(emb->ne[1]);
    return c;
}

} // namespace tandem
