// Writes synthetic Llama GGUF models tensor by tensor from a seeded generator.
#include "runtime/synth.hpp"

#include "quant/blocks.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"
#include "runtime/gguf.hpp"
#include "runtime/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/ranges.h>
#include <optional>
#include <unordered_set>
#include <vector>

namespace tandem {
namespace {

// splitmix64: tiny, fast, and good enough for test weights; fixed so files never change.
struct rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Sum of four 16-bit uniforms (Irwin-Hall), scaled to mean 0 and std 1: bell-shaped,
    // bounded by +-3.46, one draw per value.
    float normal() {
        const uint64_t r = next();
        const uint32_t sum = uint32_t(r & 0xffff) + uint32_t(r >> 16 & 0xffff) + uint32_t(r >> 32 & 0xffff) +
                             uint32_t(r >> 48);
        return (float(sum) / 65536.0f - 2.0f) * 1.7320508f;
    }
};

// Each tensor's stream depends only on the seed and its name, not on write order.
uint64_t tensor_seed(uint64_t seed, std::string_view name) {
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a
    for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
    rng r{seed ^ h};
    return r.next();
}

// Fills `out` (the tensor's bytes) with n values mean + std * normal, converted to `type`.
void generate(std::span<uint8_t> out, dtype type, int64_t n, uint64_t seed, float mean, float std) {
    rng r{seed};
    constexpr int64_t chunk = 4096; // a multiple of every block size
    float buf[chunk];
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        const int64_t m = std::min(chunk, n - i0);
        for (int64_t i = 0; i < m; ++i) buf[i] = mean + std * r.normal();
        if (is_block_format(type)) {
            quantize_blocks_ref(type, buf, out.data() + block_bytes_of(type, i0), m);
            continue;
        }
        switch (type) {
        case dtype::f32: std::memcpy(out.data() + i0 * 4, buf, size_t(m) * 4); break;
        case dtype::f16:
        case dtype::bf16:
            for (int64_t i = 0; i < m; ++i) {
                const uint16_t h = type == dtype::f16 ? f32_to_fp16(buf[i]) : f32_to_bf16(buf[i]);
                std::memcpy(out.data() + (i0 + i) * 2, &h, 2);
            }
            break;
        default: TANDEM_ASSERT(false, "synth does not write {}", name_of(type));
        }
    }
}

const std::string sp_space = "\xe2\x96\x81"; // U+2581, SentencePiece's word-start mark

struct vocab {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
};

// <unk>, <s>, </s>, 256 byte tokens, then unique pieces in falling score order: common
// letters, pairs and words first, then every 2-, 3-, ...-letter string until n_vocab.
vocab make_vocab(int32_t n_vocab, const std::vector<std::string>& added) {
    constexpr int32_t normal = 1, unknown = 2, control = 3, user_defined = 4, byte = 6; // llama.cpp token types
    const int32_t n_all = n_vocab;
    n_vocab -= int32_t(added.size()); // (the added tokens come last)
    vocab v;
    v.tokens.reserve(size_t(n_vocab));
    std::unordered_set<std::string> seen;
    auto add = [&](std::string s, float score, int32_t type) {
        if (int32_t(v.tokens.size()) >= n_vocab || !seen.insert(s).second) return;
        v.tokens.push_back(std::move(s));
        v.scores.push_back(score);
        v.types.push_back(type);
    };
    add("<unk>", 0.0f, unknown);
    add("<s>", 0.0f, control);
    add("</s>", 0.0f, control);
    for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0.0f, byte);

    int32_t rank = 0;
    auto piece = [&](const std::string& s) { add(s, -float(rank++), normal); };
    const std::string lower = "abcdefghijklmnopqrstuvwxyz";
    piece(sp_space);
    for (char c : lower) piece(std::string(1, c));
    for (char c : lower) piece(sp_space + c);
    for (const char* p : {"th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te",
                          "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou",
                          "io", "le", "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce"})
        piece(p);
    for (const char* w : {"the", "and", "of", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for",
                          "on", "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from",
                          "or", "had", "by", "not", "but", "what", "some", "we", "can", "out", "there", "when",
                          "up", "your", "how", "said", "an", "she", "her", "him", "day", "big", "little",
                          "once", "upon", "time", "girl", "boy", "dog", "cat", "play", "happy", "went",
                          "saw", "very", "friend", "mom", "ball", "tree", "sun", "home", "good", "new"})
        piece(sp_space + w);
    for (char c = 'A'; c <= 'Z'; ++c) piece(std::string(1, c));
    for (char c = 'A'; c <= 'Z'; ++c) piece(sp_space + c);
    for (char c = '0'; c <= '9'; ++c) piece(std::string(1, c));
    for (char c : std::string(".,!?'\"-:;()")) piece(std::string(1, c));
    for (const char* w : {"Once", "The", "She", "He", "They", "Tom", "Lily", "One", "It"}) piece(sp_space + w);
    // Every lowercase k-letter string, bare and word-initial, for k = 2, 3, ... until full.
    for (int k = 2; int32_t(v.tokens.size()) < n_vocab; ++k) {
        for (int start = 0; start < 2 && int32_t(v.tokens.size()) < n_vocab; ++start) {
            std::vector<int> idx(size_t(k), 0);
            while (int32_t(v.tokens.size()) < n_vocab) {
                std::string s = start ? sp_space : "";
                for (int i : idx) s += lower[size_t(i)];
                piece(s);
                int d = k - 1; // odometer increment
                while (d >= 0 && ++idx[size_t(d)] == 26) idx[size_t(d--)] = 0;
                if (d < 0) break;
            }
        }
    }
    n_vocab = n_all;
    for (const std::string& t : added) add(t, 0.0f, user_defined);
    TANDEM_CHECK(int32_t(v.tokens.size()) == n_all, "synth: an added token is already in the vocabulary");
    return v;
}

uint32_t file_type_of(dtype t) {
    switch (t) { // llama.cpp's LLAMA_FTYPE values
    case dtype::f32: return 0;
    case dtype::f16: return 1;
    case dtype::q4_0: return 2;
    case dtype::q4_1: return 3;
    case dtype::q8_0: return 7;
    case dtype::q5_0: return 8;
    case dtype::q5_1: return 9;
    case dtype::q2_k: return 10; // MOSTLY_Q2_K (Q2_K_S, 21, is a later, imatrix-era mix)
    case dtype::q3_k: return 11; // llama.cpp's _S variants: every matrix in the one type
    case dtype::q4_k: return 14;
    case dtype::q5_k: return 16;
    case dtype::q6_k: return 18;
    case dtype::iq4_nl: return 25;
    case dtype::iq4_xs: return 30;
    case dtype::bf16: return 32;
    case dtype::i8: break;
    }
    fail("synth: type {} is not one of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS",
         name_of(t));
}

// The made-up SentencePiece vocabulary's tokenizer keys.
void write_vocab(gguf::writer& w, int32_t n_vocab, const std::vector<std::string>& added) {
    vocab v = make_vocab(n_vocab, added);
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string("tokenizer.ggml.pre", "default");
    w.set_string_array("tokenizer.ggml.tokens", std::move(v.tokens));
    w.set_f32_array("tokenizer.ggml.scores", std::move(v.scores));
    w.set_i32_array("tokenizer.ggml.token_type", std::move(v.types));
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_u32("tokenizer.ggml.unknown_token_id", 0);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_bool("tokenizer.ggml.add_eos_token", false);
}

} // namespace

namespace {

// Real models' shapes (from their published configs), in their architectures.
struct preset {
    std::string_view name, arch;
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx, window;
    float rope_scale;
    std::string_view rope_scaling;
    int32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
};
constexpr preset presets[] = {
    {"tinyllama-1.1b", "llama", 22, 2048, 32, 4, 0, 5632, 32000, 2048, 0, 0, "linear"},
    {"llama3.2-1b", "llama", 16, 2048, 32, 8, 0, 8192, 128256, 131072, 0, 32, "llama3"},
    {"qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 0, 4864, 151936, 32768, 0, 0, "linear"},
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 0, 0, "linear"},
    {"phi3-mini", "phi3", 32, 3072, 32, 32, 0, 8192, 32064, 4096, 2047, 0, "linear"},
    {"gemma-2b", "gemma", 18, 2048, 8, 1, 256, 16384, 256000, 8192, 0, 0, "linear"},
    {"gemma2-2b", "gemma2", 26, 2304, 8, 4, 256, 9216, 256000, 8192, 4096, 0, "linear"},
    {"gemma3-1b", "gemma3", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 512, 0, "linear"},
    // mixtures of experts: total and active parameters 30.5B / 3.3B, 14.3B / 2.7B, 46.7B / 12.9B
    {"qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 0, 0, "linear", 128, 8, 768, 0},
    {"qwen1.5-moe-a2.7b", "qwen2moe", 24, 2048, 16, 16, 0, 5632, 151936, 8192, 0, 0, "linear", 60, 4, 1408, 5632},
    {"mixtral-8x7b", "mixtral", 32, 4096, 32, 8, 0, 14336, 32000, 32768, 0, 0, "linear", 8, 2, 14336, 0},
};

} // namespace

const std::vector<std::string_view> synth_preset_names = [] {
    std::vector<std::string_view> names{"tiny"};
    for (const preset& pr : presets) names.push_back(pr.name);
    return names;
}();

synth_params synth_preset(std::string_view name) {
    synth_params p;
    if (name == "tiny") {
        p.name = "tandem-synth-tiny";
        return p; // the defaults
    }
    for (const preset& pr : presets)
        if (pr.name == name) {
            p.arch = pr.arch;
            p.n_layer = pr.n_layer;
            p.n_embd = pr.n_embd;
            p.n_head = pr.n_head;
            p.n_head_kv = pr.n_head_kv;
            p.head_dim = pr.head_dim;
            p.n_ff = pr.n_ff;
            p.n_vocab = pr.n_vocab;
            p.n_ctx = pr.n_ctx;
            p.sliding_window = pr.window;
            p.rope_scale = pr.rope_scale;
            p.rope_scaling = pr.rope_scaling;
            p.n_expert = pr.n_expert;
            p.n_expert_used = pr.n_expert_used;
            p.n_ff_exp = pr.n_ff_exp;
            p.n_ff_shexp = pr.n_ff_shexp;
            p.type = dtype::q8_0;
            p.name = fmt::format("tandem-synth-{}", pr.name);
            return p;
        }
    fail("synth: unknown preset '{}' ({})", name, fmt::join(synth_preset_names, ", "));
}

void synth_write(const synth_params& params, const std::string& path) {
    synth_params p = params;
    std::optional<gguf::file> vocab_file;
    if (!p.vocab_from.empty()) {
        vocab_file.emplace(gguf::file::open(p.vocab_from));
        const auto tokens = vocab_file->find("tokenizer.ggml.tokens");
        TANDEM_CHECK(tokens && tokens->as_array(), "synth: {} has no tokenizer.ggml.tokens", p.vocab_from);
        p.n_vocab = int32_t(tokens->as_array()->items.size());
    }
    TANDEM_CHECK(p.n_layer >= 1 && p.n_embd >= 1 && p.n_head >= 1 && p.n_head_kv >= 1 && p.n_ff >= 1 &&
                     p.n_ctx >= 1,
                 "synth: sizes must be positive");
    TANDEM_CHECK(p.head_dim > 0 || p.n_embd % p.n_head == 0, "synth: n_embd {} is not a multiple of n_head {}",
                 p.n_embd, p.n_head);
    TANDEM_CHECK(p.n_head % p.n_head_kv == 0, "synth: n_head {} is not a multiple of n_head_kv {}", p.n_head,
                 p.n_head_kv);
    const int32_t head_dim = p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
    TANDEM_CHECK(head_dim % 2 == 0, "synth: head_dim {} must be even for RoPE", head_dim);
    TANDEM_CHECK(p.n_vocab >= 260, "synth: n_vocab {} < 260 (3 specials, 256 bytes, one piece)", p.n_vocab);
    const uint32_t file_type = file_type_of(p.type);
    TANDEM_CHECK(p.arch == "mixtral" || std::find(supported_archs.begin(), supported_archs.end(), p.arch) != supported_archs.end(),
                 "synth: architecture '{}' is not one of {}, mixtral", p.arch, fmt::join(supported_archs, ", "));
    // Experts: Mixtral is llama with experts of n_ff; the Qwen MoEs have their own widths.
    const bool mixtral = p.arch == "mixtral" || (p.arch == "llama" && p.n_expert > 0);
    const bool moe = mixtral || p.arch == "qwen2moe" || p.arch == "qwen3moe";
    if (p.arch == "mixtral") p.arch = "llama";
    TANDEM_CHECK(moe || p.n_expert == 0, "synth: {} has no experts", p.arch);
    if (moe) {
        if (p.n_expert == 0) p.n_expert = 8;
        if (p.n_expert_used == 0) p.n_expert_used = std::min(2, p.n_expert);
        if (mixtral) p.n_ff_exp = p.n_ff;
        else if (p.n_ff_exp == 0) p.n_ff_exp = 64;
        if (p.arch == "qwen2moe" && p.n_ff_shexp == 0) p.n_ff_shexp = p.n_ff;
        if (p.arch != "qwen2moe") p.n_ff_shexp = 0;
        TANDEM_CHECK(p.n_expert_used >= 1 && p.n_expert_used <= p.n_expert && p.n_ff_exp >= 1,
                     "synth: top {} of {} experts of width {}", p.n_expert_used, p.n_expert, p.n_ff_exp);
    }
    TANDEM_CHECK(p.rope_scaling == "linear" || p.rope_scaling == "yarn" || p.rope_scaling == "llama3",
                 "synth: RoPE scaling '{}' is not linear, yarn or llama3", p.rope_scaling);
    TANDEM_CHECK(p.sliding_window >= 0, "synth: sliding window {} is negative", p.sliding_window);
    TANDEM_CHECK(p.rope_scale == 0 || (p.rope_scale >= 1 && p.rope_scale <= 1024), "synth: rope scale {} out of range",
                 p.rope_scale);
    for (const dtype t : {p.type, p.mix_type}) {
        if (!is_block_format(t)) continue;
        const int64_t blk = traits_of(uint32_t(t))->block;
        TANDEM_CHECK(p.n_embd % blk == 0 && p.n_ff % blk == 0 && p.n_ff_exp % blk == 0 && p.n_ff_shexp % blk == 0,
                     "synth: {} needs n_embd, n_ff and the experts' widths to be multiples of {}", name_of(t), blk);
    }

    gguf::writer w;
    const std::string& arch = p.arch;
    const bool gemma = arch.starts_with("gemma"), phi3 = arch == "phi3";
    const bool qk_norm = arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3", post_norms = arch == "gemma2" || arch == "gemma3";
    const std::string a = p.arch + ".";
    w.set_string("general.architecture", p.arch);
    w.set_string("general.name", p.name.empty() ? "tandem-synth" : p.name);
    w.set_u32("general.file_type", file_type);
    if (is_block_format(p.type)) w.set_u32("general.quantization_version", 2);
    w.set_u32(a + "context_length", uint32_t(p.n_ctx));
    w.set_u32(a + "embedding_length", uint32_t(p.n_embd));
    w.set_u32(a + "block_count", uint32_t(p.n_layer));
    w.set_u32(a + "feed_forward_length", uint32_t(p.n_ff));
    w.set_u32(a + "attention.head_count", uint32_t(p.n_head));
    w.set_u32(a + "attention.head_count_kv", uint32_t(p.n_head_kv));
    if (p.head_dim > 0) {
        w.set_u32(a + "attention.key_length", uint32_t(head_dim));
        w.set_u32(a + "attention.value_length", uint32_t(head_dim));
    }
    w.set_u32(a + "rope.dimension_count", uint32_t(head_dim));
    const bool big_base = arch == "qwen2" || arch == "qwen3" || arch == "gemma3" || moe;
    w.set_f32(a + "rope.freq_base", big_base ? 1000000.0f : arch == "llama" && p.rope_scaling == "llama3" ? 500000.0f : 10000.0f);
    if (p.rope_scale > 0 && p.rope_scaling != "llama3") {
        w.set_string(a + "rope.scaling.type", p.rope_scaling);
        w.set_f32(a + "rope.scaling.factor", p.rope_scale);
        if (p.rope_scaling == "yarn") w.set_u32(a + "rope.scaling.original_context_length", uint32_t(p.n_ctx / p.rope_scale));
    }
    if (arch == "gemma2") {
        w.set_f32(a + "attn_logit_softcapping", 50.0f);
        w.set_f32(a + "final_logit_softcapping", 30.0f);
    }
    w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
    if (p.sliding_window > 0) w.set_u32(a + "attention.sliding_window", uint32_t(p.sliding_window));
    w.set_u32(a + "vocab_size", uint32_t(p.n_vocab));
    if (moe) { // the keys llama.cpp's conversion writes
        w.set_u32(a + "expert_count", uint32_t(p.n_expert));
        w.set_u32(a + "expert_used_count", uint32_t(p.n_expert_used));
        if (!mixtral) w.set_u32(a + "expert_feed_forward_length", uint32_t(p.n_ff_exp));
        if (p.n_ff_shexp > 0) w.set_u32(a + "expert_shared_feed_forward_length", uint32_t(p.n_ff_shexp));
    }

    if (vocab_file) {
        for (const auto& kv : vocab_file->metadata())
            if (kv.key.starts_with("tokenizer.")) w.set(kv.key, kv.val);
    } else {
        write_vocab(w, p.n_vocab, p.added_tokens);
    }
    if (!p.chat_template.empty()) w.set_string("tokenizer.chat_template", p.chat_template);

    const uint64_t seed = p.seed;
    // A matrix [ne0, ne1] in GGUF order: ne0 is the input (fan-in) side, so std 1/sqrt(ne0)
    // keeps each output near unit scale after an RMS norm.
    auto matrix = [&](const std::string& name, int64_t ne0, int64_t ne1, float std, bool more_bits = false) {
        const dtype t = more_bits && p.mix_type != dtype::f32 ? p.mix_type : p.type;
        const uint64_t s = tensor_seed(seed, name);
        w.add_tensor(name, t, {ne0, ne1},
                     [=](std::span<uint8_t> out) { generate(out, t, ne0 * ne1, s, 0.0f, std); });
    };
    auto norm = [&](const std::string& name, int64_t n) {
        const uint64_t s = tensor_seed(seed, name);
        w.add_tensor(name, dtype::f32, {n},
                     [=](std::span<uint8_t> out) { generate(out, dtype::f32, n, s, 1.0f, 0.05f); });
    };
    auto bias = [&](const std::string& name, int64_t n) {
        const uint64_t s = tensor_seed(seed, name);
        w.add_tensor(name, dtype::f32, {n},
                     [=](std::span<uint8_t> out) { generate(out, dtype::f32, n, s, 0.0f, 0.5f); });
    };
    const int64_t n_embd = p.n_embd, n_ff = p.n_ff, n_embd_kv = int64_t(p.n_head_kv) * head_dim;
    const float std_embd = 1.0f / std::sqrt(float(n_embd)), std_ff = 1.0f / std::sqrt(float(n_ff));

    const int64_t n_embd_q = int64_t(p.n_head) * head_dim;
    const float std_q = 1.0f / std::sqrt(float(n_embd_q));

    // Gemma scales its embeddings by sqrt(n_embd): rows of smaller values keep the stream near unit scale.
    matrix("token_embd.weight", n_embd, p.n_vocab, gemma ? 0.02f / std::sqrt(float(n_embd)) : 0.02f);
    if (p.rope_scale > 0 && p.rope_scaling == "llama3") {
        // Llama 3.1's scaling as its conversion writes it: per pair, a wavelength shorter than
        // 8192 / 4 keeps its frequency, one longer than 8192 / 1 divides it by the factor, a
        // smooth blend between (low_freq_factor 1, high_freq_factor 4, original context 8192).
        const int64_t n_pairs = head_dim / 2;
        const float factor = p.rope_scale;
        w.add_tensor("rope_freqs.weight", dtype::f32, {n_pairs}, [=](std::span<uint8_t> out) {
            const double pi = 3.14159265358979323846, orig = 8192, low = 1, high = 4;
            for (int64_t i = 0; i < n_pairs; ++i) {
                const double wavelen = 2 * pi / std::pow(500000.0, -2.0 * double(i) / double(2 * n_pairs));
                double f = 1;
                if (wavelen > orig / low) {
                    f = factor;
                } else if (wavelen >= orig / high) {
                    const double smooth = (orig / wavelen - low) / (high - low);
                    f = 1 / ((1 - smooth) / factor + smooth);
                }
                const float v = float(f);
                std::memcpy(out.data() + i * 4, &v, 4);
            }
        });
    }
    for (int32_t il = 0; il < p.n_layer; ++il) {
        const std::string b = fmt::format("blk.{}.", il);
        norm(b + "attn_norm.weight", n_embd);
        if (phi3) {
            matrix(b + "attn_qkv.weight", n_embd, n_embd_q + 2 * n_embd_kv, std_embd);
        } else {
            matrix(b + "attn_q.weight", n_embd, n_embd_q, std_embd);
            matrix(b + "attn_k.weight", n_embd, n_embd_kv, std_embd);
            matrix(b + "attn_v.weight", n_embd, n_embd_kv, std_embd, il % 2 == 0);
        }
        matrix(b + "attn_output.weight", n_embd_q, n_embd, std_q);
        if (arch == "qwen2" || arch == "qwen2moe") {
            bias(b + "attn_q.bias", n_embd_q);
            bias(b + "attn_k.bias", n_embd_kv);
            bias(b + "attn_v.bias", n_embd_kv);
        }
        if (qk_norm) {
            norm(b + "attn_q_norm.weight", head_dim);
            norm(b + "attn_k_norm.weight", head_dim);
        }
        if (post_norms) norm(b + "post_attention_norm.weight", n_embd);
        norm(b + "ffn_norm.weight", n_embd);
        if (moe) {
            // The router stays F32 (llama.cpp's quantize leaves ffn_gate_inp alone); the experts
            // are 3-D [n_in, n_out, n_expert] in the file's type.
            const int64_t ffe = p.n_ff_exp, nx = p.n_expert, ffs = p.n_ff_shexp;
            const dtype router_t = dtype::f32;
            const uint64_t rs = tensor_seed(seed, b + "ffn_gate_inp.weight");
            w.add_tensor(b + "ffn_gate_inp.weight", router_t, {n_embd, nx},
                         [=](std::span<uint8_t> out) { generate(out, router_t, n_embd * nx, rs, 0.0f, std_embd); });
            const auto experts = [&](const std::string& name, int64_t ne0, int64_t ne1, float std, bool more_bits) {
                const dtype t = more_bits && p.mix_type != dtype::f32 ? p.mix_type : p.type;
                const uint64_t s = tensor_seed(seed, name);
                w.add_tensor(name, t, {ne0, ne1, nx},
                             [=](std::span<uint8_t> out) { generate(out, t, ne0 * ne1 * nx, s, 0.0f, std); });
            };
            experts(b + "ffn_gate_exps.weight", n_embd, ffe, std_embd, false);
            experts(b + "ffn_up_exps.weight", n_embd, ffe, std_embd, false);
            experts(b + "ffn_down_exps.weight", ffe, n_embd, 1.0f / std::sqrt(float(ffe)), il % 2 == 0);
            if (ffs > 0) {
                bias(b + "ffn_gate_inp_shexp.weight", n_embd);
                matrix(b + "ffn_gate_shexp.weight", n_embd, ffs, std_embd);
                matrix(b + "ffn_up_shexp.weight", n_embd, ffs, std_embd);
                matrix(b + "ffn_down_shexp.weight", ffs, n_embd, 1.0f / std::sqrt(float(ffs)), il % 2 == 0);
            }
            continue;
        }
        if (phi3) {
            matrix(b + "ffn_up.weight", n_embd, 2 * n_ff, std_embd);
        } else {
            matrix(b + "ffn_gate.weight", n_embd, n_ff, std_embd);
            matrix(b + "ffn_up.weight", n_embd, n_ff, std_embd);
        }
        matrix(b + "ffn_down.weight", n_ff, n_embd, std_ff, il % 2 == 0);
        if (post_norms) norm(b + "post_ffw_norm.weight", n_embd);
    }
    norm("output_norm.weight", n_embd);
    if (!p.tied_output && !gemma) matrix("output.weight", n_embd, p.n_vocab, std_embd, true);
    w.write(path);
}

} // namespace tandem
