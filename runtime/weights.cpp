// Loads GGUF tensors into F32 weights, checking names and shapes.
#include "runtime/weights.hpp"

#include "quant/q8_0.hpp"
#include "runtime/error.hpp"
#include "runtime/fp16.hpp"
#include "runtime/gguf.hpp"

#include <cstring>

namespace tandem {
namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

void to_f32(const gguf::tensor_info& t, float* out) {
    const int64_t n = t.n_elements();
    switch (t.type) {
    case dtype::f32: std::memcpy(out, t.data, size_t(n) * sizeof(float)); return;
    case dtype::f16:
    case dtype::bf16: {
        const bool half = t.type == dtype::f16;
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, t.data + 2 * i, 2);
            out[i] = half ? fp16_to_f32(h) : bf16_to_f32(h);
        }
        return;
    }
    case dtype::q8_0: dequantize_q8_0_ref(t.data, out, n); return;
    case dtype::i8: break;
    }
    fail("tensor {} has type {}, which the F32 loader does not convert", t.name, name_of(t.type));
}

// Finds `name`, checks its shape is exactly `ne` (GGUF order, ne[0] contiguous), converts it.
weight load_tensor(const gguf::file& f, const std::string& name, std::vector<int64_t> ne, bool optional = false) {
    const gguf::tensor_info* t = f.find_tensor(name);
    if (!t) {
        TANDEM_CHECK(optional, "{}: missing tensor {}", f.path(), name);
        return {};
    }
    TANDEM_CHECK(t->ne == ne, "{}: tensor {} has shape {}, expected {}", f.path(), name, shape_str(t->ne),
                 shape_str(ne));
    weight w;
    w.n_in = ne.size() == 1 ? 1 : ne[0];
    w.n_out = ne.size() == 1 ? ne[0] : ne[1];
    w.data.resize(size_t(t->n_elements()));
    to_f32(*t, w.data.data());
    return w;
}

} // namespace

model_weights model_weights::load(const gguf::file& f, model_config& c) {
    const gguf::tensor_info* emb = f.find_tensor("token_embd.weight");
    TANDEM_CHECK(emb, "{}: missing tensor token_embd.weight", f.path());
    TANDEM_CHECK(emb->ne.size() == 2 && emb->ne[0] == c.n_embd, "{}: token_embd.weight has shape {}, expected [{}, n_vocab]",
                 f.path(), shape_str(emb->ne), c.n_embd);
    TANDEM_CHECK(c.n_vocab == 0 || c.n_vocab == emb->ne[1], "{}: vocab_size {} differs from token_embd rows {}",
                 f.path(), c.n_vocab, emb->ne[1]);
    c.n_vocab = int32_t(emb->ne[1]);

    const int64_t e = c.n_embd, kv = c.n_embd_kv(), ff = c.n_ff, v = c.n_vocab;
    model_weights w;
    w.tok_embd = load_tensor(f, "token_embd.weight", {e, v});
    w.output_norm = load_tensor(f, "output_norm.weight", {e});
    w.output = load_tensor(f, "output.weight", {e, v}, /*optional=*/true);
    c.tied_output = w.output.empty();

    w.layers.resize(size_t(c.n_layer));
    for (int il = 0; il < c.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        layer_weights& l = w.layers[size_t(il)];
        l.attn_norm = load_tensor(f, p + "attn_norm.weight", {e});
        l.wq = load_tensor(f, p + "attn_q.weight", {e, e});
        l.wk = load_tensor(f, p + "attn_k.weight", {e, kv});
        l.wv = load_tensor(f, p + "attn_v.weight", {e, kv});
        l.wo = load_tensor(f, p + "attn_output.weight", {e, e});
        l.bq = load_tensor(f, p + "attn_q.bias", {e}, true);
        l.bk = load_tensor(f, p + "attn_k.bias", {kv}, true);
        l.bv = load_tensor(f, p + "attn_v.bias", {kv}, true);
        const bool has_bias = !l.bq.empty() || !l.bk.empty() || !l.bv.empty();
        TANDEM_CHECK(!has_bias || (!l.bq.empty() && !l.bk.empty() && !l.bv.empty()),
                     "{}: layer {} has only some of the q/k/v biases", f.path(), il);
        TANDEM_CHECK(il == 0 || has_bias == c.qkv_bias, "{}: layer {} differs from layer 0 in q/k/v biases", f.path(), il);
        c.qkv_bias = has_bias;
        l.ffn_norm = load_tensor(f, p + "ffn_norm.weight", {e});
        l.w_gate = load_tensor(f, p + "ffn_gate.weight", {e, ff});
        l.w_up = load_tensor(f, p + "ffn_up.weight", {e, ff});
        l.w_down = load_tensor(f, p + "ffn_down.weight", {ff, e});
    }
    return w;
}

} // namespace tandem
