// The `tandem` binary end to end: run (text and JSON), tokenize/detokenize, synth, bad files.
#include "runtime/gguf.hpp"
#include "runtime/model.hpp"
#include "runtime/reference_forward.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

using namespace tandem;
using json = nlohmann::json;

namespace {

using test::run_tandem;

const std::string stories = test::model_path("stories260K.gguf");

// Greedy continuation by the scalar reference forward: the spec the CLI must reproduce.
std::vector<token_id> reference_greedy(const std::string& path, const std::vector<token_id>& prompt, int n) {
    gguf::file f = gguf::file::open(path);
    model_config cfg = model_config::from_gguf(f);
    model_weights w = model_weights::load(f, cfg);
    reference_forward ref(cfg, w, int32_t(prompt.size()) + n);
    std::vector<token_id> out;
    const std::vector<float>* logits = nullptr;
    for (size_t i = 0; i < prompt.size(); ++i) logits = &ref.forward(prompt[i], int32_t(i));
    for (int i = 0; i < n; ++i) {
        const token_id next = token_id(std::max_element(logits->begin(), logits->end()) - logits->begin());
        out.push_back(next);
        if (next == 2) break; // EOS
        logits = &ref.forward(next, int32_t(prompt.size() + out.size() - 1));
    }
    return out;
}

} // namespace

TEST_CASE("tandem run --json: greedy ids equal the reference forward's") {
    // the F32 path is the one that equals the reference exactly (INT8 is held to it by test_quant)
    auto r = run_tandem({"run", "-m", stories, "-p", "Once upon a time", "-n", "64", "--temp", "0", "--json",
                         "--weights", "f32", "--kv", "f32"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    const auto prompt = j["prompt_tokens"].get<std::vector<token_id>>();
    const auto tokens = j["tokens"].get<std::vector<token_id>>();
    REQUIRE(!prompt.empty());
    CHECK(prompt[0] == 1); // BOS, as the metadata's defaults ask
    CHECK(tokens == reference_greedy(stories, prompt, 64));
    CHECK(j["text"].get<std::string>().size() > 40);
    CHECK(j["prefill_tok_s"].get<double>() > 0);
    CHECK(j["decode_tok_s"].get<double>() > 0);
}

TEST_CASE("tandem run streams the prompt and the same text as --json") {
    auto text = run_tandem({"run", "-m", stories, "-p", "Lily had a cat", "-n", "40", "--temp", "0"});
    auto js = run_tandem({"run", "-m", stories, "-p", "Lily had a cat", "-n", "40", "--temp", "0", "--json"});
    REQUIRE(text.rc == 0);
    REQUIRE(js.rc == 0);
    CHECK(text.out == "Lily had a cat" + json::parse(js.out)["text"].get<std::string>() + "\n");
}

TEST_CASE("tandem run: same seed, same output; the model from TANDEM_MODEL") {
    auto a = run_tandem({"run", "-m", stories, "-p", "The dog", "-n", "30", "--temp", "1", "--seed", "7", "--json"});
    auto b = run_tandem({"run", "-m", stories, "-p", "The dog", "-n", "30", "--temp", "1", "--seed", "7", "--json"});
    auto c = run_tandem({"run", "-m", stories, "-p", "The dog", "-n", "30", "--temp", "1", "--seed", "8", "--json"});
    REQUIRE(a.rc == 0);
    CHECK(json::parse(a.out)["tokens"] == json::parse(b.out)["tokens"]);
    CHECK(json::parse(a.out)["tokens"] != json::parse(c.out)["tokens"]);
    ::setenv("TANDEM_MODEL", stories.c_str(), 1);
    auto d = run_tandem({"run", "-p", "The dog", "-n", "30", "--temp", "1", "--seed", "7", "--json"});
    ::unsetenv("TANDEM_MODEL");
    REQUIRE(d.rc == 0);
    CHECK(json::parse(d.out)["tokens"] == json::parse(a.out)["tokens"]);
}

TEST_CASE("tandem run: stop strings and token limit") {
    // the F32 path is the one that equals the reference exactly (INT8 is held to it by test_quant)
    auto r = run_tandem({"run", "-m", stories, "-p", "Once upon a time", "-n", "64", "--temp", "0", "--json",
                         "--weights", "f32", "--kv", "f32"});
    REQUIRE(r.rc == 0);
    const std::string full = json::parse(r.out)["text"];
    // stop at the first word after the first 10 characters
    const std::string stop = full.substr(10, 4);
    auto s = run_tandem({"run", "-m", stories, "-p", "Once upon a time", "-n", "64", "--temp", "0", "--json", "--stop", stop});
    REQUIRE(s.rc == 0);
    const json j = json::parse(s.out);
    CHECK(j["text"] == full.substr(0, full.find(stop)));
    CHECK(j["finish_reason"] == "stop");
    auto n = run_tandem({"run", "-m", stories, "-p", "Once upon a time", "-n", "5", "--temp", "0", "--json"});
    CHECK(json::parse(n.out)["tokens"].size() == 5);
    CHECK(json::parse(n.out)["finish_reason"] == "length");
}

TEST_CASE("tandem run --draft-tokens: prompt-lookup speculation gives the same tokens, greedy and seeded") {
    const std::string copy = "Lily saw a big red ball. She wanted to play with the ball. Lily saw a big red ball. She";
    for (const std::vector<std::string>& sampling : {std::vector<std::string>{"--temp", "0"},
                                                     std::vector<std::string>{"--temp", "1", "--seed", "5"}}) {
        std::vector<std::string> args{"run", "-m", stories, "-p", copy, "-n", "48", "--json"};
        args.insert(args.end(), sampling.begin(), sampling.end());
        auto plain = run_tandem(args);
        args.insert(args.end(), {"--draft-tokens", "4"});
        auto spec = run_tandem(args);
        INFO(spec.err);
        REQUIRE(plain.rc == 0);
        REQUIRE(spec.rc == 0);
        CHECK(json::parse(spec.out)["tokens"] == json::parse(plain.out)["tokens"]);
    }
    CHECK(run_tandem({"run", "-m", stories, "-p", "x", "--draft-tokens", "17"}).rc != 0); // 0..16
}

TEST_CASE("tandem tokenize / detokenize") {
    auto t = run_tandem({"tokenize", "-m", stories, "Once upon a time"});
    REQUIRE(t.rc == 0);
    const auto ids = json::parse(t.out).get<std::vector<int>>();
    REQUIRE(!ids.empty());
    CHECK(ids[0] != 1); // no BOS by default
    auto ts = run_tandem({"tokenize", "-m", stories, "--add-special", "Once upon a time"});
    CHECK(json::parse(ts.out)[0] == 1);
    auto from_stdin = run_tandem({"tokenize", "-m", stories, "-"}, "Once upon a time");
    CHECK(json::parse(from_stdin.out) == json::parse(t.out));
    std::vector<std::string> args{"detokenize", "-m", stories};
    for (int id : ids) args.push_back(std::to_string(id));
    auto d = run_tandem(args);
    REQUIRE(d.rc == 0);
    CHECK(d.out == "Once upon a time\n");
    auto bad = run_tandem({"detokenize", "-m", stories, "999999"});
    CHECK(bad.rc == 1);
    CHECK(bad.err.find("outside the vocabulary") != std::string::npos);
}

TEST_CASE("bad model files: one clear error line, exit 1, no crash") {
    test::scratch_dir dir("cli-bad");
    const auto bytes = test::read_bytes(stories);
    auto write = [&](const std::string& name, const std::vector<uint8_t>& b) {
        std::ofstream f(dir.file(name), std::ios::binary);
        f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
        return dir.file(name);
    };
    std::vector<std::string> files{
        write("truncated.gguf", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 5000)),
        write("empty.gguf", {}),
        write("text.gguf", {'h', 'e', 'l', 'l', 'o'}),
        dir.file("missing.gguf"),
    };
    auto flipped = bytes;
    flipped[8] ^= 0xff; // the tensor count
    files.push_back(write("flipped.gguf", flipped));
    for (const auto& f : files) {
        auto r = run_tandem({"run", "-m", f, "-p", "hi", "-n", "4"});
        INFO(f, ": ", r.err);
        CHECK(r.rc == 1);
        CHECK(r.err.find(f) != std::string::npos);
        CHECK(r.err.find("tandem: error:") == 0);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    }
}

TEST_CASE("tandem synth writes a model that tandem runs, deterministically") {
    test::scratch_dir dir("cli-synth");
    for (const std::string type : {"f32", "q8_0"}) {
        const std::string a = dir.file("a-" + type + ".gguf"), b = dir.file("b-" + type + ".gguf");
        REQUIRE(run_tandem({"synth", "-o", a, "--preset", "tiny", "--type", type, "--seed", "3"}).rc == 0);
        REQUIRE(run_tandem({"synth", "-o", b, "--preset", "tiny", "--type", type, "--seed", "3"}).rc == 0);
        CHECK(test::read_bytes(a) == test::read_bytes(b));
        auto r = run_tandem({"run", "-m", a, "-p", "hello world", "-n", "8", "--temp", "0", "--json", "--ignore-eos"});
        INFO(r.err);
        REQUIRE(r.rc == 0);
        CHECK(json::parse(r.out)["tokens"].size() == 8);
    }
    const std::string c = dir.file("c.gguf");
    REQUIRE(run_tandem({"synth", "-o", c, "--layers", "3", "--dim", "96", "--heads", "6", "--kv-heads", "2", "--ff", "200",
                    "--vocab", "700"}).rc == 0);
    gguf::file f = gguf::file::open(c);
    model_config cfg = model_config::from_gguf(f);
    model_weights w = model_weights::load(f, cfg);
    CHECK(cfg.n_layer == 3);
    CHECK(cfg.n_embd == 96);
    CHECK(cfg.n_head_kv == 2);
    CHECK(cfg.n_ff == 200);
    CHECK(cfg.n_vocab == 700);
}

TEST_CASE("tandem quantize, perplexity, eval-drift and bench print what they promise") {
    test::scratch_dir dir("cli-int8");
    // a text written by the model itself
    auto gen = run_tandem({"run", "-m", stories, "-p", "Once upon a time", "-n", "300", "--temp", "1", "--seed", "3",
                           "--weights", "f32", "--kv", "f32"});
    REQUIRE(gen.rc == 0);
    const std::string text = dir.file("text.txt");
    {
        std::ofstream f(text, std::ios::binary);
        f << gen.out;
    }
    const std::string q = dir.file("q.gguf");
    auto qz = run_tandem({"quantize", stories, q});
    INFO(qz.err);
    REQUIRE(qz.rc == 0);
    CHECK(qz.out.find("tandem.int8.rowwise") != std::string::npos);

    auto pf = run_tandem({"perplexity", "-m", stories, "-f", text, "--weights", "f32", "--kv", "f32", "--json"});
    auto pq = run_tandem({"perplexity", "-m", q, "-f", text, "--json"});
    REQUIRE(pf.rc == 0);
    REQUIRE(pq.rc == 0);
    const json jf = json::parse(pf.out), jq = json::parse(pq.out);
    CHECK(jf["n_tokens"].get<int64_t>() > 100);
    CHECK(jq["n_tokens"] == jf["n_tokens"]);
    CHECK(jq["ppl"].get<double>() == doctest::Approx(jf["ppl"].get<double>()).epsilon(0.03));

    auto dr = run_tandem({"eval-drift", "-m", stories, "-f", text, "--json"});
    REQUIRE(dr.rc == 0);
    const json jd = json::parse(dr.out);
    CHECK(jd["top1"].get<double>() > 0.9);
    CHECK(jd["mean_kl"].get<double>() < 0.01);
    CHECK(jd["ppl_f32"].get<double>() == doctest::Approx(jf["ppl"].get<double>()).epsilon(1e-6));

    auto bad = run_tandem({"perplexity", "-m", stories, "-f", text, "--kv", "int4"});
    CHECK(bad.rc != 0);

    auto b = run_tandem({"bench", "-m", q, "-p", "40", "-n", "4", "-t", "2", "--batch", "1,3", "--json"});
    INFO(b.err);
    REQUIRE(b.rc == 0);
    const json jb = json::parse(b.out);
    for (const char* k : {"load_s", "prefill_tok_s", "decode_tok_s", "bandwidth_gbs", "roofline_tok_s", "roofline_pct",
                          "peak_rss_mb", "onednn_raw_prefill_tok_s"}) {
        INFO(k);
        CHECK(jb[k].get<double>() > 0);
    }
    CHECK(jb["decode_batch_tok_s"]["1"].get<double>() > 0);
    CHECK(jb["decode_batch_tok_s"]["3"].get<double>() > 0);
    // The compute limit (every machine this runs on has AVX2 at least): the peak over a token's
    // matmul operations, and prefill as a share of it.
    REQUIRE(jb.contains("int8_peak_tops"));
    CHECK(jb["int8_peak_isa"].get<std::string>() != "scalar");
    CHECK(jb["int8_peak_tops"].get<double>() > 0);
    CHECK(jb["prefill_pct_of_peak"].get<double>() ==
          doctest::Approx(100.0 * jb["prefill_tok_s"].get<double>() / jb["compute_limit_tok_s"].get<double>()));
    // The op breakdowns: every op of the profiled forward, their times within its wall time;
    // the decode step at batch 3 stores K/V and attends once per layer for all three sequences,
    // as often as the one-sequence prefill does.
    auto calls = [](const json& ops) {
        std::map<std::string, int64_t> c;
        double s = 0;
        for (const auto& e : ops) {
            c[e["op"].get<std::string>()] = e["calls"].get<int64_t>();
            s += e["s"].get<double>();
        }
        return std::pair{c, s};
    };
    const auto [pc, ps] = calls(jb["prefill_ops"]);
    CHECK(pc.at("matmul_i8") > 0);
    CHECK(pc.at("attention") == pc.at("kv_store"));
    CHECK(ps <= jb["prefill_profiled_s"].get<double>());
    CHECK(jb["decode_step_batch"].get<int>() == 3);
    const auto [dc, ds] = calls(jb["decode_step_ops"]);
    CHECK(dc.at("kv_store") == dc.at("attention"));
    CHECK(dc.at("attention") == pc.at("attention"));
    CHECK(dc.at("embed") == 1);
    CHECK(ds <= jb["decode_step_profiled_s"].get<double>());
}

TEST_CASE("tandem bench --speculative: the verify cost per k and batch, and prompt lookup's counts") {
    auto r = run_tandem({"bench", "-m", stories, "--speculative", "3", "-n", "24", "-t", "1", "--batch", "1,2", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    for (const char* nb : {"1", "2"}) {
        REQUIRE(j["verify_cost"][nb].size() == 3); // k = 1..3
        for (const auto& v : j["verify_cost"][nb]) CHECK(v.get<double>() > 0);
    }
    for (const char* task : {"copy", "random"}) {
        const json& t = j["prompt_lookup"][task];
        INFO(task);
        CHECK(t["accepted"].get<uint64_t>() <= t["drafted"].get<uint64_t>());
        CHECK(t["steps_speculative"].get<uint64_t>() <= t["steps_plain"].get<uint64_t>());
        CHECK(t["steps_plain"].get<uint64_t>() == 24); // one prefill step, then one token a step
        CHECK(t["tok_s_plain"].get<double>() > 0);
    }
    CHECK(j["prompt_lookup"]["copy"]["drafted"].get<uint64_t>() > 0);
    // The upper bound: replayed drafts are all accepted, at k = 3 (K) and fewer steps.
    const json& bound = j["replay"]["3"];
    CHECK(bound["accepted"] == bound["drafted"]);
    CHECK(bound["drafted"].get<uint64_t>() > 0);
    CHECK(bound["steps_speculative"].get<uint64_t>() < bound["steps_plain"].get<uint64_t>());
    CHECK(bound["speedup_min"].get<double>() <= bound["speedup"].get<double>());
    CHECK(run_tandem({"bench", "-m", stories, "--speculative", "0"}).rc != 0); // K in 1..16
    // With a draft model (the model itself: its greedy drafts are all accepted).
    auto d = run_tandem({"bench", "-m", stories, "--speculative", "2", "-n", "16", "-t", "1", "--batch", "1",
                         "--draft-model", stories, "--json"});
    INFO(d.err);
    REQUIRE(d.rc == 0);
    const json dj = json::parse(d.out);
    const json& dm = dj["draft_model"]["copy"];
    CHECK(dm["drafted"].get<uint64_t>() > 0);
    CHECK(dm["accepted"] == dm["drafted"]);
}

TEST_CASE("tandem bench --beams: width W against width 1, aggregate rates, and pages shared between the beams") {
    // 64 prompt tokens (4 pages of 16), 64 tokens a beam: a copy of one sequence is 8 pages.
    auto r = run_tandem({"bench", "-m", stories, "--beams", "3", "-p", "64", "-n", "64", "-t", "1", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    CHECK(j["width"].get<int>() == 3);
    CHECK(j["runs"].get<int>() == 3);
    for (const char* k : {"tok_s_width1", "tok_s_beam", "speedup"}) {
        INFO(k);
        CHECK(j[k].get<double>() > 0);
        CHECK(j[std::string(k) + "_min"].get<double>() <= j[k].get<double>());
        CHECK(j[k].get<double>() <= j[std::string(k) + "_max"].get<double>());
    }
    // Timed: the decode steps, every one after the prompt's (the 64th token is never computed).
    CHECK(j["steps_timed"].get<int>() == 63);
    CHECK(j["page_size"].get<int>() == 16);
    CHECK(j["unshared_pages"].get<int>() == 3 * 8);
    // One sequence holds its 8 pages (at most: the last token is never computed); the beams share
    // the prompt's 4 pages, so they hold at most 4 + 3 x (4 pages of generated tokens + one copied
    // on write) = 19, below the 24 of three copies.
    const int peak = j["peak_pages"].get<int>(), peak1 = j["peak_pages_width1"].get<int>();
    CHECK(peak1 > 4);
    CHECK(peak1 <= 8);
    CHECK(peak > peak1);
    CHECK(peak <= 4 + 3 * (4 + 1));
    CHECK(j["pages_ratio"].get<double>() == doctest::Approx(double(peak) / 24));
    // Options that --beams would drop are refused, and the width is 1..64.
    CHECK(run_tandem({"bench", "-m", stories, "--beams", "2", "--batch", "1,2"}).rc != 0);
    CHECK(run_tandem({"bench", "-m", stories, "--beams", "2", "--speculative", "2"}).rc != 0);
    CHECK(run_tandem({"bench", "-m", stories, "--beams", "0"}).rc != 0);
}

TEST_CASE("tandem run --draft-model / --speculative, and synth --vocab-from: a draft model for a model") {
    test::scratch_dir dir("cli-draft");
    const std::string draft = dir.file("draft.gguf");
    auto sy = run_tandem({"synth", "-o", draft, "--vocab-from", stories, "--layers", "1", "--dim", "32", "--heads", "2",
                          "--kv-heads", "1", "--ff", "64"});
    REQUIRE(sy.rc == 0);
    const std::string copy = "Lily saw a big red ball. She wanted to play with the ball. Lily saw a big red ball. She";
    const std::vector<std::string> base{"run", "-m", stories, "-p", copy, "-n", "32", "--temp", "0", "--json"};
    const auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> args = base;
        args.insert(args.end(), extra.begin(), extra.end());
        return run_tandem(args);
    };
    const auto plain = with({});
    REQUIRE(plain.rc == 0);
    const json want = json::parse(plain.out)["tokens"];
    for (const auto& extra : {std::vector<std::string>{"--draft-model", draft},               // random drafts
                              std::vector<std::string>{"--draft-model", stories, "--draft-tokens", "3"}, // its own
                              std::vector<std::string>{"--speculative", "ngram"}}) {
        const auto r = with(extra);
        INFO(extra[0], " ", extra[1], ": ", r.err);
        REQUIRE(r.rc == 0);
        const json j = json::parse(r.out);
        CHECK(j["tokens"] == want);
        CHECK(j["draft_tokens"].get<int>() > 0);
        CHECK(j["accepted_tokens"].get<int>() <= j["draft_tokens"].get<int>());
        if (extra[1] == stories) CHECK(j["accepted_tokens"] == j["draft_tokens"]);
    }
    // Refused: another vocabulary (named), draft without a model, off with one.
    const auto other = with({"--draft-model", test::model_path("llama-2-tiny-random.gguf")});
    CHECK(other.rc == 1);
    CHECK(other.err.find("cannot draft for the model") != std::string::npos);
    CHECK(with({"--speculative", "draft"}).err.find("needs --draft-model") != std::string::npos);
    CHECK(with({"--speculative", "off", "--draft-model", draft}).rc == 1);
    CHECK(with({"--speculative", "ngram", "--draft-model", draft}).err.find("would not be used") != std::string::npos);
    CHECK(with({"--speculative", "off", "--draft-tokens", "3"}).rc == 1);
    CHECK(run_tandem({"bench", "-m", stories, "--draft-model", draft}).rc != 0); // needs --speculative
    CHECK(with({"--speculative", "medusa"}).rc != 0);
    // --vocab-from and --vocab together: CLI11 refuses.
    CHECK(run_tandem({"synth", "-o", dir.file("x.gguf"), "--vocab-from", stories, "--vocab", "600"}).rc != 0);
}

TEST_CASE("tandem run --beams: the beams best first with their scores; width 1 is greedy; sampling flags refused") {
    const std::vector<std::string> base{"run", "-m", stories, "-p", "Once upon a time", "-n", "12", "--json",
                                        "--weights", "f32", "--kv", "f32"};
    const auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> args = base;
        args.insert(args.end(), extra.begin(), extra.end());
        return run_tandem(args);
    };
    const auto r = with({"--beams", "3", "--length-penalty", "0.5"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    REQUIRE(j["beams"].size() == 3);
    CHECK(j["text"] == j["beams"][0]["text"]);
    CHECK(j["tokens"] == j["beams"][0]["tokens"]);
    for (size_t k = 0; k < 3; ++k) {
        const json& b = j["beams"][k];
        CHECK(b["cumulative_logprob"].get<double>() < 0);
        const double length = double(b["tokens"].size()) - (b["finish_reason"] == "stop" ? 1 : 0); // EOS not counted
        CHECK(b["score"].get<double>() == doctest::Approx(b["cumulative_logprob"].get<double>() / std::sqrt(length)));
        if (k > 0) CHECK(b["score"].get<double>() <= j["beams"][k - 1]["score"].get<double>());
    }
    const auto one = with({"--beams", "1"});
    REQUIRE(one.rc == 0);
    const json j1 = json::parse(one.out);
    CHECK(j1["tokens"].get<std::vector<token_id>>() ==
          reference_greedy(stories, j1["prompt_tokens"].get<std::vector<token_id>>(), 12));
    CHECK(with({"--beams", "2", "--temp", "0.7"}).rc != 0); // beam search does not sample
    CHECK(with({"--length-penalty", "2"}).rc != 0);          // without --beams
    CHECK(with({"--beams", "2", "--early-stopping", "sometimes"}).rc != 0);
}

namespace {

// Every weight of a model loaded as the engine holds it (INT8 matrices with their scales and
// row sums, F32 vectors): what `tandem info` must predict without loading anything.
int64_t loaded_int8_bytes(const std::string& path) {
    gguf::file f = gguf::file::open(path);
    model_config cfg = model_config::from_gguf(f);
    model_weights w = model_weights::load(f, cfg, {weight_format::int8});
    const auto bytes = [](const weight& x) { return x.bytes() + int64_t(x.q_sum.size()) * 4; };
    int64_t n = bytes(w.tok_embd) + bytes(w.output_norm) + bytes(w.output) + bytes(w.rope_freqs);
    for (const layer_weights& l : w.layers)
        for (const auto field : layer_weight_fields) n += bytes(l.*field);
    return n;
}

json info_json(const std::string& path, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"info", path, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run_tandem(args);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    return json::parse(r.out);
}

} // namespace

TEST_CASE("tandem info: shapes, tensors, context, RoPE, template, tokenizer and INT8 memory of the test models") {
    // stories260K (PROVENANCE.md): llama, 5 layers, 64 wide, 8 heads of 8 over 4 KV heads, ff 172,
    // vocab 512, 48 F32 tensors, context 2048, no rope.freq_base (10000)
    const json j = info_json(stories);
    CHECK(j["arch"] == "llama");
    CHECK(j["shapes"] == json{{"n_layer", 5}, {"n_embd", 64}, {"n_head", 8}, {"n_head_kv", 4}, {"head_dim", 8},
                              {"n_ff", 172}, {"n_vocab", 512}});
    CHECK(j["tensors"]["count"] == 48);
    CHECK(j["tensors"]["types"] == json{{"F32", {{"count", 48}, {"bytes", 292800 * 4}}}});
    CHECK(j["n_ctx_train"] == 2048);
    CHECK(j["sliding_window"] == json{{"size", 0}, {"layers", 0}});
    CHECK(j["rope"]["base"] == 10000.0);
    CHECK(j["rope"]["dims"] == 8);
    CHECK(j["rope"]["scaling"]["type"] == "none");
    CHECK(j["chat_template"] == json{{"family", "plain"},
                                     {"in_file", false},
                                     {"renderer", "family:plain"},
                                     {"tool_syntax", "hermes"},
                                     {"renderer_note", "the model file has no chat template"},
                                     {"reasoning", nullptr}});
    CHECK(j["tokenizer"]["model"] == "llama");
    CHECK(j["tokenizer"]["n_vocab"] == 512);
    CHECK(j["tokenizer"]["bos"] == json{{"id", 1}, {"text", "<s>"}});
    CHECK(j["tokenizer"]["eos"] == json{{"id", 2}, {"text", "</s>"}});
    // memory: the weights as loaded in INT8; K and V of 5 layers x 4 heads x 8 in f16 a token
    CHECK(j["memory"]["weight_bytes"] == loaded_int8_bytes(stories));
    CHECK(j["memory"]["kv_bytes_per_token"] == 2 * 5 * 4 * 8 * 2);
    CHECK(j["memory"]["kv_bytes_train_context"] == 2 * 5 * 4 * 8 * 2 * 2048);
    CHECK(info_json(stories, {"--kv", "f32"})["memory"]["kv_bytes_per_token"] == 2 * 5 * 4 * 8 * 4);

    const std::string tiny = test::model_path("llama-2-tiny-random.gguf"); // F16 x9, F32 x3, vocab 32000, ctx 4096
    const json t = info_json(tiny);
    CHECK(t["tensors"]["types"]["F16"]["count"] == 9);
    CHECK(t["tensors"]["types"]["F32"]["count"] == 3);
    CHECK(t["shapes"]["n_vocab"] == 32000);
    CHECK(t["n_ctx_train"] == 4096);
    CHECK(t["memory"]["weight_bytes"] == loaded_int8_bytes(tiny));

    // a vocabulary-only file (no tensors at all): its metadata is all info reads
    const json v = info_json(test::model_path("vocab/ggml-vocab-deepseek-coder.gguf"));
    CHECK(v["tensors"]["count"] == 0);
    CHECK(v["shapes"]["n_layer"] == 32);
    CHECK(v["n_ctx_train"] == 16384);
    CHECK(v["tokenizer"]["model"] == "gpt2");
    CHECK(v["tokenizer"]["pre"] == "deepseek-coder");
    CHECK(v["tokenizer"]["bos"]["id"] == 32013);
    CHECK(v["memory"]["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2); // 512 KiB: Llama-2-7B's shape

    // the text form says the same
    const auto r = run_tandem({"info", stories});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    for (const char* line : {"llama", "5 layers, embd 64, heads 8, kv heads 4, head_dim 8, ff 172, vocab 512",
                             "48 (1.1 MiB): F32 x48", "2048 tokens (training)", "sliding window none",
                             "base 10000, 8 of 8 dims, normal, scaling none", "chat template  the family's format; family plain (tool calls hermes; no thinking markers) (the file has none)",
                             "llama (pre default), vocab 512, bos 1 \"<s>\", eos 2 \"</s>\"",
                             "KV (f16) 640 bytes a token, 1.2 MiB for the training context"})
        CHECK_MESSAGE(r.out.find(line) != std::string::npos, line, " in:\n", r.out);
}

namespace {

// stories260K rewritten with other metadata: `arch` for llama's keys (general.architecture
// and each "llama." key renamed), `extra` keys set, and `more` F32 vector tensors added.
void variant_of_stories(const std::string& out, const std::string& arch, const std::vector<gguf::kv>& extra,
                        const std::vector<std::pair<std::string, int64_t>>& more = {}) {
    gguf::file f = gguf::file::open(stories);
    gguf::writer w;
    for (const auto& kv : f.metadata()) {
        if (kv.key == "general.architecture") w.set_string(kv.key, arch);
        else if (kv.key.starts_with("llama.")) w.set(arch + kv.key.substr(5), kv.val);
        else w.set(kv.key, kv.val);
    }
    for (const auto& kv : extra) w.set(kv.key, kv.val);
    for (const auto& t : f.tensors()) w.add_tensor(t.name, t.type, t.ne, {t.data, t.n_bytes});
    for (const auto& [name, n] : more) {
        const std::vector<float> ones(size_t(n), 1.0f);
        w.add_tensor(name, dtype::f32, {n}, {reinterpret_cast<const uint8_t*>(ones.data()), ones.size() * 4});
    }
    w.write(out);
}

gguf::kv kv_of(const std::string& key, gguf::value v) { return {key, std::move(v)}; }
gguf::value u32(uint64_t x) { return {gguf::value_type::u32, x}; }
gguf::value f32(double x) { return {gguf::value_type::f32, x}; }
gguf::value str(std::string x) { return {gguf::value_type::string, std::move(x)}; }

} // namespace

TEST_CASE("tandem info: sliding windows, RoPE scaling and a chat template of variants of a model; errors") {
    test::scratch_dir dir("cli-info");
    // a window on every layer (llama's pattern), and gemma2's even layers
    variant_of_stories(dir.file("window.gguf"), "llama", {kv_of("llama.attention.sliding_window", u32(256))});
    const json w = info_json(dir.file("window.gguf"));
    CHECK(w["sliding_window"] == json{{"size", 256}, {"layers", 5}});
    CHECK(w["memory"]["weight_bytes"] == loaded_int8_bytes(dir.file("window.gguf")));
    CHECK(run_tandem({"info", dir.file("window.gguf")}).out.find("sliding window 256 tokens on 5 of 5 layers") !=
          std::string::npos);
    variant_of_stories(dir.file("gemma2.gguf"), "gemma2", {kv_of("gemma2.attention.sliding_window", u32(64))});
    const json g = info_json(dir.file("gemma2.gguf"));
    CHECK(g["arch"] == "gemma2");
    CHECK(g["sliding_window"] == json{{"size", 64}, {"layers", 3}}); // layers 0, 2 and 4

    // RoPE: a base, linear and YaRN scaling from the keys, Llama 3's from its rope_freqs tensor
    variant_of_stories(dir.file("linear.gguf"), "llama",
                       {kv_of("llama.rope.freq_base", f32(500000)), kv_of("llama.rope.scaling.type", str("linear")),
                        kv_of("llama.rope.scaling.factor", f32(4))});
    const json lin = info_json(dir.file("linear.gguf"))["rope"];
    CHECK(lin["base"] == 500000.0);
    CHECK(lin["scaling"] == json{{"type", "linear"}, {"factor", 4.0}});
    variant_of_stories(dir.file("yarn.gguf"), "llama",
                       {kv_of("llama.rope.scaling.type", str("yarn")), kv_of("llama.rope.scaling.factor", f32(4)),
                        kv_of("llama.rope.scaling.original_context_length", u32(512))});
    CHECK(info_json(dir.file("yarn.gguf"))["rope"]["scaling"] ==
          json{{"type", "yarn"}, {"factor", 4.0}, {"original_context", 512}});
    variant_of_stories(dir.file("llama3.gguf"), "llama", {}, {{"rope_freqs.weight", 4}});
    CHECK(info_json(dir.file("llama3.gguf"))["rope"]["scaling"]["type"] == "llama3");

    // a synthetic model in a block type: its tensors by type, and what they become in INT8
    const std::string q8 = dir.file("q8.gguf");
    REQUIRE(run_tandem({"synth", "-o", q8, "--preset", "tiny", "--type", "q8_0", "--window", "32"}).rc == 0);
    const json q = info_json(q8);
    CHECK(q["tensors"]["types"].contains("Q8_0"));
    CHECK(q["tensors"]["types"].contains("F32")); // the norms
    CHECK(q["sliding_window"]["size"] == 32);
    CHECK(q["memory"]["weight_bytes"] == loaded_int8_bytes(q8));

    // a ChatML template in the file: its family
    variant_of_stories(
        dir.file("chatml.gguf"), "llama",
        {kv_of("tokenizer.chat_template",
               str("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"))});
    CHECK(info_json(dir.file("chatml.gguf"))["chat_template"] ==
          json{{"family", "chatml"}, {"in_file", true}, {"renderer", "jinja"}, {"tool_syntax", "hermes"},
               {"reasoning", nullptr}});
    // one that writes thinking markers and reads enable_thinking (Qwen3's way): a reasoning model
    variant_of_stories(
        dir.file("think.gguf"), "llama",
        {kv_of("tokenizer.chat_template",
               str("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
                   "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"))});
    CHECK(info_json(dir.file("think.gguf"))["chat_template"]["reasoning"] ==
          json{{"open", "<think>"}, {"close", "</think>"}, {"can_disable", true}});
    const auto think_text = run_tandem({"info", dir.file("think.gguf")});
    CHECK(think_text.out.find("thinking <think> ... </think>") != std::string::npos);

    // errors: exit 1 with one line that says what is wrong; a bad flag is a usage error (2)
    const auto fails = [](const std::vector<std::string>& args, const std::string& what) {
        const auto r = run_tandem(args);
        CHECK(r.rc == 1);
        CHECK_MESSAGE(r.err.find(what) != std::string::npos, r.err);
        CHECK(r.out.empty());
    };
    fails({"info", dir.file("missing.gguf")}, "cannot open");
    std::ofstream(dir.file("junk.gguf")) << "not a model at all";
    fails({"info", dir.file("junk.gguf")}, "not a GGUF file");
    fails({"info", test::model_path("vocab/ggml-vocab-gpt-2.gguf")}, "architecture 'gpt2' is not supported");
    CHECK(run_tandem({"info", stories, "--kv", "f8"}).rc == 2);
    CHECK(run_tandem({"info", stories, "--no-such-flag"}).rc == 2);
}

TEST_CASE("tandem info reads no weights: a model of 4 GiB of tensors (a sparse file) is described at once") {
    // stories260K's metadata, and one F16 tensor of 65536 x 32768 (4 GiB) whose bytes are a hole
    // in the file: loading it would read and convert them all; info reads the header alone.
    test::scratch_dir dir("cli-info-big");
    gguf::file f = gguf::file::open(stories);
    gguf::writer w;
    for (const auto& kv : f.metadata()) w.set(kv.key, kv.val);
    const std::string marker = "tandem-info-test-end-of-metadata";
    w.set_string("zz.marker", marker);
    std::vector<uint8_t> bytes = w.serialize();
    const std::string text(bytes.begin(), bytes.end());
    const size_t kv_end = text.rfind(marker) + marker.size();
    bytes.resize(kv_end);
    const uint64_t n_tensors = 1;
    std::memcpy(bytes.data() + 8, &n_tensors, 8); // the header's tensor count
    const auto put = [&](const void* p, size_t n) {
        bytes.insert(bytes.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    const std::string name = "token_embd.weight";
    const uint64_t name_len = name.size(), ne0 = 65536, ne1 = 32768, offset = 0;
    const uint32_t n_dims = 2, type = uint32_t(dtype::f16);
    put(&name_len, 8);
    put(name.data(), name.size());
    put(&n_dims, 4);
    put(&ne0, 8);
    put(&ne1, 8);
    put(&type, 4);
    put(&offset, 8);
    bytes.resize((bytes.size() + 31) / 32 * 32); // the data section starts aligned
    const std::string big = dir.file("big.gguf");
    {
        std::ofstream out(big, std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    const uint64_t data_bytes = ne0 * ne1 * 2;
    std::filesystem::resize_file(big, bytes.size() + data_bytes);
    const auto t0 = std::chrono::steady_clock::now();
    const json j = info_json(big);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("tandem info on a 4 GiB model: ", s, " s");
    CHECK(s < 2.0);
    CHECK(j["tensors"]["types"]["F16"] == json{{"count", 1}, {"bytes", data_bytes}});
    CHECK(j["memory"]["weight_bytes"] == ne1 * (ne0 + 8)); // INT8 rows, each with a scale and a row sum
    CHECK(j["file_bytes"] == bytes.size() + data_bytes);
}

TEST_CASE("tandem run never cuts a prompt: too long for --ctx is an error saying what to change") {
    std::string text;
    for (int i = 0; i < 30; ++i) text += "Lily saw a dog. ";
    const auto tok = run_tandem({"tokenize", "-m", stories, "--add-special", text});
    REQUIRE(tok.rc == 0);
    const size_t n = json::parse(tok.out).size();
    REQUIRE(n > 64);
    auto r = run_tandem({"run", "-m", stories, "-p", text, "-c", "64", "-n", "4"});
    CHECK(r.rc == 1);
    CHECK(r.out.empty());
    for (const std::string& part : std::vector<std::string>{"the prompt has " + std::to_string(n) + " tokens",
                                                            "more than the 63 the context holds", "--ctx 64 less one",
                                                            "raise --ctx (the model's training context is 2048)"})
        CHECK_MESSAGE(r.err.find(part) != std::string::npos, part, " in: ", r.err);
    r = run_tandem({"run", "-m", stories, "-p", "x", "-c", "4096"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("--ctx 4096 is more than the model's training context, 2048 tokens") != std::string::npos);
    // -n past the context: the output stops at its end (finish_reason length), with a warning
    r = run_tandem({"run", "-m", stories, "-p", "Once upon a time", "-c", "16", "-n", "100", "--json", "--ignore-eos"});
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    CHECK(j["tokens"].size() + j["prompt_tokens"].size() == 16);
    CHECK(j["finish_reason"] == "length");
    CHECK(r.err.find("-n 100: the context (16 tokens) has room for") != std::string::npos);
    // tandem embed -m (offline) neither: a text past the context is an error with its numbers
    std::string longer;
    for (int i = 0; i < 500; ++i) longer += "Lily saw a dog. ";
    const size_t n_long = json::parse(run_tandem({"tokenize", "-m", stories, "--add-special", longer}).out).size();
    r = run_tandem({"embed", "-m", stories, "-t", "1", "Lily", longer});
    CHECK(r.rc == 1);
    CHECK(r.err.find("text 2 has " + std::to_string(n_long) + " tokens, more than the 2047 the model's context holds") !=
          std::string::npos);
}

TEST_CASE("a mixture of experts through the CLI: synth, info, run and bench") {
    test::scratch_dir dir("cli-moe");
    const std::string path = dir.file("q3moe.gguf");
    REQUIRE(run_tandem({"synth", "-o", path, "--arch", "qwen3moe", "--experts", "6", "--experts-used", "2", "--layers", "3",
                        "--type", "q4_0"}).rc == 0);
    const test::run_result info = run_tandem({"info", "--json", path});
    REQUIRE(info.rc == 0);
    const json ij = json::parse(info.out);
    CHECK(ij["experts"]["count"] == 6);
    CHECK(ij["experts"]["used"] == 2);
    CHECK(ij["experts"]["n_ff_exp"] == 64);
    const int64_t total = ij["parameters"]["total"], active = ij["parameters"]["active"];
    CHECK(total - active == 3 * 4 * (3 * 64 * 64)); // 4 of 6 experts idle a token in each of 3 layers
    CHECK(ij["memory"]["decode_bytes_per_token"].get<int64_t>() < ij["memory"]["weight_bytes"].get<int64_t>());
    const test::run_result text = run_tandem({"info", path});
    CHECK(text.out.find("6 a layer, 2 used a token") != std::string::npos);
    CHECK(text.out.find("active a token") != std::string::npos);

    const test::run_result run = run_tandem({"run", "-m", path, "-p", "Once upon", "-n", "5", "--temp", "0", "--ignore-eos",
                                             "--json"});
    REQUIRE(run.rc == 0);
    CHECK(json::parse(run.out)["tokens"].size() == 5);

    const test::run_result bench = run_tandem({"bench", "-m", path, "-p", "8", "-n", "2", "--batch", "1", "-t", "2",
                                               "--no-raw", "--json"});
    REQUIRE(bench.rc == 0);
    const json bj = json::parse(bench.out);
    CHECK(bj["decode_expert_reads_per_step"]["1"]["runs"] == 3 * 2); // one token: 2 experts in each of 3 layers
    CHECK(bj["decode_expert_reads_per_step"]["1"]["mb"].get<double>() > 0);
}
