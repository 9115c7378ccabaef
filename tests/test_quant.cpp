// INT8 end to end on stories260K: `tandem quantize` round trip, and the accuracy bars of the
// INT8 paths (perplexity, top-1 agreement, KL) over a text the F32 model wrote itself.
#include "cpu/ops/ops.hpp"
#include "cpu/thread_pool.hpp"
#include "runtime/evaluate.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/quantize_file.hpp"
#include "runtime/synth.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>

using namespace tandem;

namespace {

const std::string stories = test::model_path("stories260K.gguf");

// At least n tokens of stories sampled from the F32 model at temperature 1 with fixed seeds
// (each story ends at EOS; the next one starts from BOS), as one token sequence. pure: plain
// temperature-1 sampling; otherwise with the CLI's default top-k/top-p/min-p.
std::vector<token_id> sampled_text(model_bundle& f32, int n, bool pure) {
    cpu::thread_pool pool(2);
    std::vector<token_id> toks;
    for (uint64_t seed = 1; int(toks.size()) < n; ++seed) {
        generate_params p;
        p.request.max_tokens = 400;
        p.request.sampling.temperature = 1.0f;
        if (!pure) { // the CLI's defaults, as `tandem run --temp 1 --seed N` samples
            p.request.sampling.top_k = 40;
            p.request.sampling.top_p = 0.95f;
            p.request.sampling.min_p = 0.05f;
        }
        p.request.sampling.seed = seed;
        const auto r = generate(exec_ctx{backend::cpu, &pool}, *f32.mdl, *f32.tok, {1}, p);
        toks.push_back(1);
        toks.insert(toks.end(), r.tokens.begin(), r.tokens.end());
    }
    return toks;
}

// Writes `qf` again as `out`: its metadata less the keys in `drop`, then what `add` sets, and
// each tensor's bytes as `bytes` gives them (as they are where it gives none).
void rewrite(const gguf::file& qf, const std::string& out, const std::vector<std::string>& drop,
             const std::function<void(gguf::writer&)>& add,
             const std::function<std::vector<uint8_t>(const gguf::tensor_info&)>& bytes = nullptr) {
    gguf::writer w;
    for (const auto& kv : qf.metadata())
        if (std::find(drop.begin(), drop.end(), kv.key) == drop.end()) w.set(kv.key, kv.val);
    add(w);
    for (const auto& t : qf.tensors()) {
        std::vector<uint8_t> b = bytes ? bytes(t) : std::vector<uint8_t>{};
        if (b.empty()) b.assign(t.data, t.data + t.n_bytes);
        w.add_tensor(t.name, t.type, t.ne, std::span<const uint8_t>(b));
    }
    w.write(out);
}

bool listed_blocked(const gguf::file& qf, const std::string& name) {
    const auto names = qf.get_string_array(quant_blocked_key);
    return std::find(names.begin(), names.end(), name) != names.end();
}

// A version 2 file as version 1 wrote it: every I8 matrix in rows.
void write_v1(const gguf::file& qf, const std::string& out) {
    rewrite(qf, out, {quant_version_key, quant_blocked_key}, [](gguf::writer& w) { w.set_u32(quant_version_key, 1); },
            [&](const gguf::tensor_info& t) {
                std::vector<uint8_t> rows;
                if (!listed_blocked(qf, t.name)) return rows;
                weight v;
                v.n_in = t.ne[0];
                v.n_out = t.ne[1];
                v.q_ext = reinterpret_cast<const int8_t*>(t.data);
                v.layout = q_layout::blocked;
                rows.resize(t.n_bytes);
                for (int64_t o = 0; o < v.n_out; ++o) v.q_row(o, reinterpret_cast<int8_t*>(rows.data()) + o * v.n_in);
                return rows;
            });
}

// The bytes of the mapping holding p that this process has in memory (its smaps Rss).
int64_t mapping_rss(const void* p) {
    std::ifstream f("/proc/self/smaps");
    const auto a = reinterpret_cast<uintptr_t>(p);
    bool here = false;
    for (std::string line; std::getline(f, line);) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
            here = a >= lo && a < hi;
        } else if (here && line.rfind("Rss:", 0) == 0) {
            return std::stoll(line.substr(4)) * 1024;
        }
    }
    return -1;
}

// wb holds what wa holds: the same layout, bytes, scales and row sums.
void check_same(const weight& wa, const weight& wb) {
    REQUIRE(wa.is_i8());
    REQUIRE(wb.is_i8());
    REQUIRE(wa.layout == wb.layout);
    REQUIRE(wa.q_bytes() == wb.q_bytes());
    CHECK(std::equal(wa.q(), wa.q() + wa.q_bytes(), wb.q()));
    CHECK(std::equal(wa.scale(), wa.scale() + wa.n_out, wb.scale()));
    CHECK(wa.q_sum == wb.q_sum);
}

// Every INT8 matrix of b as a holds it.
void check_same_model(const model_bundle& a, const model_bundle& b) {
    const model_weights& wa = a.mdl->weights();
    const model_weights& wb = b.mdl->weights();
    check_same(wa.tok_embd, wb.tok_embd);
    if (wa.output.is_i8()) check_same(wa.output, wb.output);
    for (size_t il = 0; il < wa.layers.size(); ++il)
        for (const auto field : layer_weight_fields)
            if ((wa.layers[il].*field).is_i8()) {
                CAPTURE(il);
                check_same(wa.layers[il].*field, wb.layers[il].*field);
            }
}

std::vector<token_id> greedy(const model_bundle& m, int n) {
    cpu::thread_pool pool(2);
    generate_params p;
    p.request.max_tokens = n;
    p.request.sampling.temperature = 0;
    return generate(exec_ctx{backend::cpu, &pool}, *m.mdl, *m.tok, m.tok->encode("Once upon a time", true), p).tokens;
}

} // namespace

TEST_CASE("INT8 accuracy bars on stories260K over >= 2000 sampled tokens") {
    model_bundle f32 = load_model(stories, {weight_format::f32, kv_dtype::f32});
    const auto toks = sampled_text(f32, 2048, /*pure=*/true);
    REQUIRE(toks.size() >= 2000);
    cpu::thread_pool pool(2);
    const exec_ctx ctx{backend::cpu, &pool};
    const eval_params ep{512, 128};
    const double ppl_f32 = perplexity(ctx, *f32.mdl, toks, ep).ppl;
    MESSAGE("F32 perplexity ", ppl_f32, " over ", toks.size(), " tokens");
    CHECK(ppl_f32 > 1.0);
    CHECK(ppl_f32 < 20.0); // the model's own samples are predictable to it

    struct bar {
        kv_dtype kv;
        double ppl_rel;
    };
    for (const bar b : {bar{kv_dtype::f16, 0.01}, bar{kv_dtype::i8, 0.02}}) {
        model_bundle q = load_model(stories, {weight_format::int8, b.kv});
        const drift_result d = eval_drift(ctx, *f32.mdl, *q.mdl, toks, ep);
        INFO("int8 weights, kv ", name_of(b.kv), ": ppl ", d.ppl_test, " vs ", d.ppl_base, ", top-1 ", d.top1,
             ", mean KL ", d.mean_kl, " over ", d.n_tokens);
        MESSAGE("int8 weights, kv ", name_of(b.kv), ": ppl ", d.ppl_test, " (f32 ", d.ppl_base, "), top-1 ", d.top1,
                ", mean KL ", d.mean_kl);
        CHECK(d.n_tokens >= 2000);
        CHECK(d.ppl_base == doctest::Approx(ppl_f32).epsilon(1e-9));
        CHECK(std::abs(d.ppl_test / d.ppl_base - 1.0) <= b.ppl_rel);
        if (b.kv == kv_dtype::f16) {
            // The bar. One per-token int8 term everywhere gave 0.975 here; with the down
            // projection's input (the SwiGLU output) in two int8 terms and the logits' in f32: 0.985.
            CHECK(d.top1 >= 0.98);
            CHECK(d.mean_kl < 0.01);
        }
    }
}

TEST_CASE("tandem quantize files load without re-quantizing, to the same model") {
    test::scratch_dir dir("quant");
    const std::string out = dir.file("stories-int8.gguf");
    cpu::thread_pool pool(2);
    const quantize_stats st = quantize_gguf(stories, out, pool);
    CHECK(st.n_quantized == 5 * 7 + 2); // every layer's 7 matrices, token_embd, output

    const gguf::file qf = gguf::file::open(out);
    CHECK(qf.get_string(quant_scheme_key) == std::string("tandem.int8.rowwise"));
    CHECK(qf.get_int(quant_version_key) == 2);
    CHECK(qf.find_tensor("blk.0.attn_q.weight")->type == dtype::i8);
    CHECK(qf.find_tensor("blk.0.attn_q.weight.scale")->type == dtype::f32);
    CHECK(qf.find_tensor("blk.0.attn_norm.weight")->type == dtype::f32);
    // Matrices of whole 64 x 64 blocks in the kernels' layout; stories' 32-row K and V, its
    // 172-wide FFN and its embedding table (untied: the embed op reads rows) in rows.
    const std::pair<const char*, bool> expect[] = {
        {"blk.0.attn_q.weight", true},  {"blk.4.attn_output.weight", true}, {"output.weight", true},
        {"blk.0.attn_k.weight", false}, {"blk.0.ffn_down.weight", false},   {"token_embd.weight", false}};
    for (const auto& e : expect) CHECK_MESSAGE(listed_blocked(qf, e.first) == e.second, e.first);

    model_bundle a = load_model(stories); // quantized at load
    model_bundle b = load_model(out);     // copied (the blocks, or the rows laid out anew), not re-quantized
    const layer_weights& lb = b.mdl->weights().layers[1];
    CHECK(lb.wq.layout == cpu::matmul_i8_layout());
    CHECK(lb.w_down.layout == cpu::matmul_i8_layout());
    CHECK(lb.wq.q_ext == nullptr); // in memory of its own, not the mapping's pages (docs/cpu.md)
    check_same_model(a, b);
    CHECK(greedy(a, 24) == greedy(b, 24));

    // Rows asked for (as a GPU worker uploads them): the blocked matrices read back into rows.
    load_options rows;
    rows.cpu_layout = false;
    model_bundle ar = load_model(stories, rows), br = load_model(out, rows);
    CHECK(br.mdl->weights().layers[1].wq.layout == q_layout::rows);
    check_same_model(ar, br);

    // --weights f32 on a quantized file dequantizes, from either layout; quantizing it again
    // changes nothing
    model_bundle c = load_model(out, {weight_format::f32, kv_dtype::f32});
    for (const auto field : {&layer_weights::wq, &layer_weights::w_down}) {
        const weight& wc = c.mdl->weights().layers[1].*field;
        const weight& wa = a.mdl->weights().layers[1].*field;
        REQUIRE_FALSE(wc.is_i8());
        std::vector<float> x(size_t(wa.n_in));
        for (int64_t r = 0; r < wa.n_out; ++r) {
            wa.row_f32(r, x.data());
            CHECK(std::equal(x.begin(), x.end(), wc.row(r)));
        }
    }
    const std::string again = dir.file("again.gguf");
    quantize_gguf(out, again, pool);
    const gguf::file qa = gguf::file::open(again);
    for (const char* name : {"blk.2.ffn_up.weight", "blk.2.attn_q.weight", "blk.2.attn_q.weight.scale"}) {
        CAPTURE(name);
        const auto* t1 = qf.find_tensor(name);
        const auto* t2 = qa.find_tensor(name);
        REQUIRE(t1->n_bytes == t2->n_bytes);
        CHECK(std::equal(t1->data, t1->data + t1->n_bytes, t2->data));
    }
    CHECK(qa.get_string_array(quant_blocked_key) == qf.get_string_array(quant_blocked_key));
}

TEST_CASE("version 1 files (every matrix in rows) load as version 2's; the mapping's pages are given back") {
    test::scratch_dir dir("quant-v1");
    cpu::thread_pool pool(2);
    // Every matrix whole blocks, the embedding table the logits' too, and matrices of 0.25-2 MiB
    // (a smaller one's pages come back with the kernel's fault-around for its neighbours).
    synth_params tied = synth_preset("tiny");
    tied.type = dtype::f16;
    tied.n_embd = 1024;
    tied.n_head = 16;
    tied.n_head_kv = 4;
    tied.n_ff = 2048;
    tied.n_vocab = 320;
    tied.tied_output = true;
    synth_params phi = tied; // fused q/k/v whose k and v rows are not whole blocks; fused gate and up that are
    phi.arch = "phi3";
    phi.tied_output = false;
    phi.n_head = 32;
    phi.n_head_kv = 1;
    for (const synth_params& p : {tied, phi}) {
        CAPTURE(p.arch);
        const std::string src = dir.file("src.gguf"), v2 = dir.file("v2.gguf"), v1 = dir.file("v1.gguf");
        synth_write(p, src);
        quantize_gguf(src, v2, pool);
        {
            const gguf::file qf = gguf::file::open(v2);
            CHECK(listed_blocked(qf, "token_embd.weight") == p.tied_output);
            if (p.arch == "phi3") CHECK(listed_blocked(qf, "blk.0.attn_qkv.weight"));
            write_v1(qf, v1);
        }
        const model_bundle a = load_model(src), b2 = load_model(v2), b1 = load_model(v1);
        check_same_model(a, b2);
        check_same_model(a, b1);
        const auto ids = greedy(a, 8);
        CHECK(ids == greedy(b2, 8));
        CHECK(ids == greedy(b1, 8));
        if (p.arch != "llama") continue;
        // Each matrix and its scales are copied into memory of their own and the mapping's pages
        // given back, so the model is held once (peak RSS about 1x the INT8 weights), not twice,
        // and decoding does not fault them back in.
        for (const model_bundle* m : {&b2, &b1}) {
            const int64_t rss = mapping_rss(m->file->bytes().data());
            MESSAGE("mapping in memory after the load: " << rss << " of " << m->file->bytes().size() << " bytes");
            REQUIRE(rss >= 0);
            CHECK(rss * 8 < int64_t(m->file->bytes().size()));
        }
    }
}

TEST_CASE("tandem quantize takes every block format: the file holds what loading quantizes") {
    test::scratch_dir dir("quant-blocks");
    cpu::thread_pool pool(2);
    synth_params p = synth_preset("tiny");
    p.n_vocab = 300;
    p.n_embd = 256; // whole super-blocks
    p.n_ff = 512;
    for (dtype t : {dtype::q2_k, dtype::q3_k, dtype::iq4_nl, dtype::iq4_xs}) {
        CAPTURE(name_of(t));
        p.type = t;
        const std::string in = dir.file(std::string(name_of(t)) + ".gguf"), out = dir.file("int8.gguf");
        synth_write(p, in);
        const quantize_stats st = quantize_gguf(in, out, pool);
        CHECK(st.n_quantized == 2 * 7 + 2);
        CHECK(gguf::file::open(out).find_tensor("blk.1.ffn_down.weight")->type == dtype::i8);
        load_options i8; // the INT8 family: quantized at load (auto would keep the blocks' bits)
        i8.weights = weight_format::int8;
        model_bundle a = load_model(in, i8);
        model_bundle b = load_model(out);
        const weight& wa = a.mdl->weights().layers[1].w_down;
        const weight& wb = b.mdl->weights().layers[1].w_down;
        REQUIRE(wb.is_i8());
        REQUIRE(wa.layout == wb.layout);
        CHECK(std::equal(wa.q(), wa.q() + wa.q_bytes(), wb.q()));
        CHECK(std::equal(wa.scale(), wa.scale() + wa.n_out, wb.scale()));
    }
}

TEST_CASE("I8 tensors without the scheme metadata, of another version, or listed as blocks they are not, are refused") {
    test::scratch_dir dir("quant-bad");
    cpu::thread_pool pool(1);
    const std::string out = dir.file("q.gguf"), bad = dir.file("bad.gguf");
    quantize_gguf(stories, out, pool);
    const gguf::file qf = gguf::file::open(out);
    const auto refused = [&](const std::string& why) {
        CAPTURE(why);
        CHECK_THROWS_WITH_AS(load_model(bad), doctest::Contains(why.c_str()), tandem::error);
    };
    rewrite(qf, bad, {quant_scheme_key}, [](gguf::writer&) {});
    refused("quantization scheme (none)");
    rewrite(qf, bad, {quant_version_key}, [](gguf::writer& w) { w.set_u32(quant_version_key, 3); });
    refused("version 3; this build reads tandem.int8.rowwise versions 1 to 2");
    rewrite(qf, bad, {quant_version_key}, [](gguf::writer& w) { w.set_u32(quant_version_key, 1); });
    refused("tandem.quantization.blocked in a version 1 file");
    // stories' FFN is 172 wide: read as blocks, it would run past the tensor
    rewrite(qf, bad, {quant_blocked_key}, [&](gguf::writer& w) {
        auto names = qf.get_string_array(quant_blocked_key);
        names.push_back("blk.3.ffn_down.weight");
        w.set_string_array(quant_blocked_key, names);
    });
    refused("blk.3.ffn_down.weight [172, 64] is listed in tandem.quantization.blocked but is not whole blocks");
}
