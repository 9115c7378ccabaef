// Offline subcommands of `tandem`: run, tokenize, detokenize, synth (no daemon needed).
#include "daemon/cli.hpp"
#include "daemon/model_store.hpp"

#include "runtime/error.hpp"
#include "runtime/generate.hpp"
#include "runtime/host.hpp"
#include "runtime/gguf.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/log.hpp"
#include "runtime/model_config.hpp"
#include "runtime/synth.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>

namespace tandem::cli {

namespace {

// The weight types `tandem synth --type` writes, by name.
const std::map<std::string, dtype>& synth_types() {
    static const std::map<std::string, dtype> types{
        {"f32", dtype::f32},   {"f16", dtype::f16},   {"bf16", dtype::bf16}, {"q4_0", dtype::q4_0},
        {"q4_1", dtype::q4_1}, {"q5_0", dtype::q5_0}, {"q5_1", dtype::q5_1}, {"q8_0", dtype::q8_0},
        {"q2_k", dtype::q2_k}, {"q3_k", dtype::q3_k}, {"q4_k", dtype::q4_k}, {"q5_k", dtype::q5_k},
        {"q6_k", dtype::q6_k}, {"iq4_nl", dtype::iq4_nl}, {"iq4_xs", dtype::iq4_xs},
        {"q4_k_m", dtype::q4_k}}; // with Q6_K where llama.cpp's Q4_K_M has it (synth_params::mix_type)
    return types;
}

std::vector<std::string> names_of(const std::map<std::string, dtype>& m) {
    std::vector<std::string> names;
    for (const auto& [name, t] : m) names.push_back(name);
    return names;
}

} // namespace

std::string resolve_model(const std::string& flag) {
    std::string model = flag;
    if (const char* env = std::getenv("TANDEM_MODEL"); model.empty() && env && *env) model = env;
    if (model.empty()) throw error("no model given: pass -m MODEL or set TANDEM_MODEL");
    // Not a file: a name in the model store (tandem pull, tandem alias); a missing .gguf path
    // stays a path, for the loader's own error.
    std::error_code ec;
    if (std::filesystem::exists(model, ec) || model.ends_with(".gguf")) return model;
    const daemon::resolve_result r = daemon::locate_model(model);
    if (!r.model) throw error(r.error);
    return r.model->paths.front();
}

int default_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

std::string read_stdin() {
    return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
}

void write_out(std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

std::string unescape(std::string s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        const char next = i + 1 < s.size() ? s[i + 1] : '\0';
        const char* const from = "ntr\\";
        const char* const to = "\n\t\r\\";
        const char* hit = s[i] == '\\' && next ? std::strchr(from, next) : nullptr;
        if (hit) {
            out += to[hit - from];
            ++i;
        } else {
            out += s[i];
        }
    }
    return out;
}

namespace {

struct run_opts {
    std::string model, prompt;
    int32_t n_predict = 256;
    float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
    float presence_penalty = 0.0f, frequency_penalty = 0.0f;
    int32_t top_k = 40, repeat_last_n = 64, ctx = 0, draft_tokens = -1;
    std::string draft_model, speculative; // speculative: ngram, draft, off; empty: draft with a draft model
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;
    int threads = default_threads();
    bool json = false, parse_special = false, ignore_eos = false;
    int32_t beams = 0;                // beam search of this width (0: sampling)
    float length_penalty = 1.0f;
    std::string early_stopping = "false"; // true, false or never (Hugging Face's)
    load_options load;
    // Guided generation (at most one): a JSON Schema file, a regex, a GBNF file, choices.
    std::string json_schema, regex, grammar;
    std::vector<std::string> choices;
    std::string whitespace = "bounded"; // between JSON tokens under --json-schema
    bool closed_objects = false;
};

// The constraint the flags ask for, if any (CLI11 keeps them exclusive).
std::optional<grammar::constraint> run_constraint(const run_opts& o) {
    using kind = grammar::constraint::kind;
    const auto file = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw error(fmt::format("cannot read {}", path));
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    if (!o.json_schema.empty())
        return grammar::constraint{kind::json_schema, file(o.json_schema),
                                   o.whitespace == "compact" ? grammar::whitespace::compact : grammar::whitespace::bounded,
                                   o.closed_objects};
    if (!o.regex.empty()) return grammar::constraint{kind::regex, o.regex};
    if (!o.grammar.empty()) return grammar::constraint{kind::gbnf, file(o.grammar)};
    if (!o.choices.empty()) return grammar::constraint{kind::choice, nlohmann::json(o.choices).dump()};
    return std::nullopt;
}

// Speculative decoding from the flags: --speculative (or --draft-model alone, or
// --draft-tokens alone for prompt lookup) picks the drafts, --draft-tokens how many (4 when
// unsaid).
void set_speculation(const run_opts& o, const model_bundle* draft, generate_params& p) {
    std::string method = o.speculative;
    if (method.empty()) method = draft ? "draft" : o.draft_tokens > 0 ? "ngram" : "off";
    TANDEM_CHECK(method != "draft" || draft, "--speculative draft needs --draft-model");
    TANDEM_CHECK(method == "draft" || !draft, "--speculative {} with --draft-model: the draft model would not be used",
                 method);
    TANDEM_CHECK(method != "off" || o.draft_tokens <= 0, "--speculative off with --draft-tokens {}: no drafts would be made",
                 o.draft_tokens);
    if (method == "off") return;
    p.request.draft_tokens = o.draft_tokens < 0 ? 4 : o.draft_tokens;
    TANDEM_CHECK(p.request.draft_tokens > 0, "--speculative {} with --draft-tokens 0: no drafts", method);
    p.request.drafts = method == "draft" ? draft_source::model : draft_source::ngram;
    if (draft) p.draft_model = draft->mdl.get();
    p.draft_threads = o.threads;
}

int cmd_run(const run_opts& o) {
    model_bundle b = load_model(resolve_model(o.model), o.load);
    std::optional<model_bundle> draft;
    if (!o.draft_model.empty()) draft = load_draft_model(o.draft_model, *b.tok, o.load);
    const std::string prompt = o.prompt == "-" ? read_stdin() : o.prompt;
    std::vector<token_id> ids = b.tok->encode(prompt, /*add_special=*/true, o.parse_special);
    // The context never cuts the prompt: a prompt it cannot hold is an error that says what to change.
    const int32_t n_train = b.cfg.n_ctx_train, n_ctx = o.ctx > 0 ? o.ctx : n_train, n_prompt = int32_t(ids.size());
    TANDEM_CHECK(o.ctx <= n_train, "--ctx {} is more than the model's training context, {} tokens: give {} or less",
                 o.ctx, n_train, n_train);
    TANDEM_CHECK(n_prompt < n_ctx,
                 "the prompt has {} tokens, more than the {} the context holds (--ctx {} less one, for the first "
                 "generated token): shorten it{}",
                 n_prompt, n_ctx - 1, n_ctx,
                 n_ctx < n_train ? fmt::format(", or raise --ctx (the model's training context is {})", n_train) : "");
    if (o.n_predict > n_ctx - n_prompt)
        logger("run")->warn("-n {}: the context ({} tokens) has room for {} after the prompt; the output stops there "
                            "(finish_reason length){}",
                            o.n_predict, n_ctx, n_ctx - n_prompt, n_ctx < n_train ? "; --ctx raises it" : "");

    generate_params p;
    p.request.max_tokens = o.n_predict;
    p.n_ctx = o.ctx;
    p.request.stop = o.stop;
    p.request.ignore_eos = o.ignore_eos;
    p.request.sampling.temperature = o.temp;
    p.request.sampling.top_k = o.top_k;
    p.request.sampling.top_p = o.top_p;
    p.request.sampling.min_p = o.min_p;
    p.request.sampling.repetition_penalty = o.repeat_penalty;
    p.request.sampling.penalty_last_n = o.repeat_last_n;
    p.request.sampling.presence_penalty = o.presence_penalty;
    p.request.sampling.frequency_penalty = o.frequency_penalty;
    p.request.sampling.seed = o.seed;
    set_speculation(o, draft ? &*draft : nullptr, p);
    if (o.beams > 0) { // every beam comes back; the best is the text
        p.request.beam.width = o.beams;
        p.request.beam.length_penalty = o.length_penalty;
        p.request.beam.early_stopping = o.early_stopping == "true"    ? beam_params::stopping::early
                                : o.early_stopping == "never" ? beam_params::stopping::never
                                                              : beam_params::stopping::heuristic;
        p.request.n = o.beams;
        p.request.sampling.temperature = 0;
    }
    if (const auto c = run_constraint(o)) {
        auto cache = std::make_shared<grammar::mask_cache>(grammar::compile(*c), grammar::vocab_trie::of(*b.tok));
        p.request.make_processor = [cache] { return grammar::make_grammar_processor(cache); };
    }

    const host_threads threads(o.threads);
    const exec_ctx run_ctx = threads.ctx();
    if (!o.json) write_out(prompt);
    generate_result r = generate(run_ctx, *b.mdl, *b.tok, std::move(ids), p, [&](std::string_view text) {
        if (!o.json) write_out(text);
        return true;
    });
    if (o.json) {
        nlohmann::json j{{"prompt_tokens", r.prompt_tokens}, {"tokens", r.tokens},
                         {"text", r.text},                   {"finish_reason", r.finish_reason},
                         {"prefill_tok_s", r.prefill_tok_s()}, {"decode_tok_s", r.decode_tok_s()},
                         {"draft_tokens", r.n_draft_tokens},   {"accepted_tokens", r.n_accepted_tokens}};
        if (o.beams > 0) {
            j.erase("prefill_tok_s"); // the search reports only when it ends: all its time counts as decode
            j["beams"] = nlohmann::json::array();
            for (const beam_result& br : r.beams)
                j["beams"].push_back({{"text", br.text},
                                      {"tokens", br.tokens},
                                      {"finish_reason", br.finish_reason},
                                      {"score", br.score},
                                      {"cumulative_logprob", br.cumulative_logprob}});
        }
        std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
        write_out("\n");
        logger("run")->info("{} prompt tokens at {:.1f} tok/s, {} generated at {:.1f} tok/s ({}){}",
                            r.prompt_tokens.size(), r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(),
                            r.finish_reason,
                            r.n_draft_tokens ? fmt::format(", {} of {} drafts accepted", r.n_accepted_tokens,
                                                           r.n_draft_tokens)
                                             : "");
    }
    return 0;
}

// The vocabulary alone is enough: no weights are converted.
tokenizer open_tokenizer(const std::string& model) {
    gguf::file f = gguf::file::open(resolve_model(model));
    return tokenizer::from_gguf(f);
}

int cmd_tokenize(const std::string& model, const std::string& text, bool add_special, bool parse_special) {
    tokenizer tok = open_tokenizer(model);
    const std::string input = text == "-" ? read_stdin() : text;
    std::cout << nlohmann::json(tok.encode(input, add_special, parse_special)).dump() << "\n";
    return 0;
}

int cmd_detokenize(const std::string& model, const std::vector<int64_t>& ids, bool render_special) {
    tokenizer tok = open_tokenizer(model);
    std::vector<token_id> v;
    for (int64_t id : ids) {
        TANDEM_CHECK(id >= 0 && id < tok.n_vocab(), "token id {} is outside the vocabulary [0, {})", id,
                     tok.n_vocab());
        v.push_back(token_id(id));
    }
    write_out(tok.decode(v, render_special));
    write_out("\n");
    return 0;
}

} // namespace

void register_offline(CLI::App& app, registry& reg) {
    auto ro = std::make_shared<run_opts>();
    auto* run = app.add_subcommand("run", "generate text from a prompt, offline (no daemon)");
    run->add_option("-m,--model", ro->model, "GGUF model (default: $TANDEM_MODEL)");
    run->add_option("-p,--prompt", ro->prompt, "prompt text, or - for stdin")->required();
    run->add_option("-n,--n-predict", ro->n_predict, "tokens to generate (-1: until EOS or full context)")->check(at_least(-1));
    run->add_option("--temp", ro->temp, "temperature (0: greedy)")->check(between(0.0, 100.0, number::real));
    run->add_option("--top-k", ro->top_k, "top-k (0: off)")->check(at_least(0));
    run->add_option("--top-p", ro->top_p, "top-p (1: off)")->check(between(0.0, 1.0, number::real));
    run->add_option("--min-p", ro->min_p, "min-p (0: off)")->check(between(0.0, 1.0, number::real));
    run->add_option("--repeat-penalty", ro->repeat_penalty, "repetition penalty (1: off)")->check(between(0.0, 10.0, number::real));
    run->add_option("--repeat-last-n", ro->repeat_last_n, "tokens the penalties look back over (-1: all)")->check(at_least(-1));
    run->add_option("--presence-penalty", ro->presence_penalty, "presence penalty")->check(between(-2.0, 2.0, number::real));
    run->add_option("--frequency-penalty", ro->frequency_penalty, "frequency penalty")->check(between(-2.0, 2.0, number::real));
    run->add_option("--seed", ro->seed, "sampling seed (same seed and request, same output)");
    run->add_option("--stop", ro->stop, "stop string (repeatable; \\n, \\t, \\r, \\\\ are escapes)")->transform(unescape);
    run->add_option("-c,--ctx", ro->ctx, "context size (default: the model's)")->check(at_least(0));
    run->add_option("-t,--threads", ro->threads, "CPU threads")->check(at_least(1));
    run->add_option("--draft-tokens", ro->draft_tokens,
                    "speculative decoding: up to this many drafts a step, verified (plain decoding's output; "
                    "alone: prompt lookup)")
        ->check(between(0, 16));
    run->add_option("--draft-model", ro->draft_model,
                    "speculative decoding from this smaller GGUF with the same vocabulary (4 drafts a step unless "
                    "--draft-tokens)");
    run->add_option("--speculative", ro->speculative,
                    "ngram (prompt lookup), draft (--draft-model) or off (default: draft with --draft-model, ngram "
                    "with --draft-tokens)")
        ->check(one_of({"ngram", "draft", "off"}));
    auto* js = run->add_option("--json-schema", ro->json_schema, "constrain the output to JSON valid under this schema file");
    run->add_option("--whitespace", ro->whitespace,
                    "whitespace between JSON tokens under --json-schema: bounded (at most a line break and 20 spaces "
                    "or tabs; the default) or compact (none)")
        ->check(one_of({"bounded", "compact"}));
    run->add_flag("--closed-objects", ro->closed_objects,
                  "under --json-schema, objects that list properties and say nothing of additionalProperties get "
                  "no other keys (the specification allows any)");
    auto* rx = run->add_option("--regex", ro->regex, "constrain the output to match this regular expression");
    auto* gr = run->add_option("--grammar", ro->grammar, "constrain the output to this GBNF grammar file");
    auto* ch = run->add_option("--choice", ro->choices, "constrain the output to one of these texts (A,B,...)")->delimiter(',');
    for (auto* a : {js, rx, gr, ch})
        for (auto* b : {js, rx, gr, ch})
            if (a != b) a->excludes(b);
    run->add_flag("--parse-special", ro->parse_special, "parse special-token text in the prompt");
    run->add_flag("--ignore-eos", ro->ignore_eos, "keep generating past EOS");
    run->add_flag("--json", ro->json, "print one JSON object instead of streaming text");
    auto* beams = run->add_option("--beams", ro->beams,
                                  "beam search of this width: the likeliest output (the best beam; --json lists "
                                  "them all with their scores)")
                      ->check(between(1, 64));
    for (const char* sampling : {"--temp", "--top-k", "--top-p", "--min-p", "--draft-tokens", "--draft-model", "--speculative"})
        beams->excludes(sampling);
    run->add_option("--length-penalty", ro->length_penalty,
                    "beam search: a beam scores sum(logprob) / length^this (default 1; 0: the sum)")
        ->check(between(-10.0, 10.0, number::real))
        ->needs(beams);
    run->add_option("--early-stopping", ro->early_stopping,
                    "beam search ends with width beams finished: true (at once), false (when no live beam can "
                    "beat them now, the default) or never (nor later)")
        ->check(one_of({"true", "false", "never"}))
        ->needs(beams);
    add_precision_flags(run, ro->load);
    reg.push_back({run, [ro] { return cmd_run(*ro); }});

    struct tokenize_opts {
        std::string model, text;
        bool add = false, parse = false;
    };
    auto tk = std::make_shared<tokenize_opts>();
    auto* tkz = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
    tkz->add_option("-m,--model", tk->model, "GGUF model (default: $TANDEM_MODEL)");
    tkz->add_option("text", tk->text, "text, or - for stdin")->required();
    tkz->add_flag("--add-special", tk->add, "add BOS/EOS as the model's metadata asks");
    tkz->add_flag("--parse-special", tk->parse, "parse special-token text");
    reg.push_back({tkz, [tk] { return cmd_tokenize(tk->model, tk->text, tk->add, tk->parse); }});

    struct detokenize_opts {
        std::string model;
        std::vector<int64_t> ids;
        bool special = false;
    };
    auto dt = std::make_shared<detokenize_opts>();
    auto* dtz = app.add_subcommand("detokenize", "print the text of token ids");
    dtz->add_option("-m,--model", dt->model, "GGUF model (default: $TANDEM_MODEL)");
    dtz->add_option("ids", dt->ids, "token ids")->required();
    dtz->add_flag("--special", dt->special, "render control tokens such as <s>");
    reg.push_back({dtz, [dt] { return cmd_detokenize(dt->model, dt->ids, dt->special); }});

    struct synth_opts {
        std::string out, preset = "tiny", type = "f32", arch, rope_scaling = "linear", vocab_from, chat_template;
        std::vector<std::string> added_tokens;
        bool tied = false;
        float rope_scale = 0;
        synth_params flags = synth_preset("tiny");
        std::vector<std::pair<CLI::Option*, int32_t synth_params::*>> shape; // flag -> field
        CLI::Option* seed = nullptr;
        CLI::Option* type_opt = nullptr;
    };
    auto sy = std::make_shared<synth_opts>();
    auto* syn = app.add_subcommand("synth", "write a GGUF with seeded random weights");
    syn->add_option("-o,--output", sy->out, "output file")->required();
    const std::vector<std::string> presets(synth_preset_names.begin(), synth_preset_names.end());
    syn->add_option("--preset", sy->preset, "tiny, or a real model's shapes and architecture")->check(one_of(presets));
    auto shape = [&](const char* name, int32_t synth_params::*field, const char* help, int lo, int hi) {
        sy->shape.emplace_back(syn->add_option(name, sy->flags.*field, help)->check(between(lo, hi)), field);
    };
    shape("--layers", &synth_params::n_layer, "layers", 1, 512);
    shape("--dim", &synth_params::n_embd, "embedding size", 2, 65536);
    shape("--heads", &synth_params::n_head, "attention heads", 1, 1024);
    shape("--kv-heads", &synth_params::n_head_kv, "key/value heads", 1, 1024);
    shape("--ff", &synth_params::n_ff, "feed-forward size", 1, 262144);
    shape("--vocab", &synth_params::n_vocab, "vocabulary size", 300, 1 << 20);
    shape("--ctx", &synth_params::n_ctx, "context length", 8, 1 << 20);
    shape("--window", &synth_params::sliding_window, "sliding attention window (0: none)", 0, 1 << 20);
    shape("--head-dim", &synth_params::head_dim, "attention head width (default: dim / heads)", 2, 4096);
    shape("--experts", &synth_params::n_expert, "experts per layer (qwen2moe, qwen3moe, mixtral)", 1, 4096);
    shape("--experts-used", &synth_params::n_expert_used, "experts each token runs", 1, 4096);
    shape("--expert-ff", &synth_params::n_ff_exp, "an expert's feed-forward size (qwen2moe, qwen3moe)", 1, 262144);
    shape("--shared-ff", &synth_params::n_ff_shexp, "the shared expert's feed-forward size (qwen2moe)", 1, 262144);
    sy->type_opt = syn->add_option("--type", sy->type, "weight type (default: the preset's)")
                       ->check(one_of(names_of(synth_types())));
    sy->seed = syn->add_option("--seed", sy->flags.seed, "seed");
    auto* arch_opt = syn->add_option("--arch", sy->arch, "architecture (default: the preset's)")
                         ->check(one_of([] {
                             std::vector<std::string> v(supported_archs.begin(), supported_archs.end());
                             v.push_back("mixtral"); // llama with experts
                             return v;
                         }()));
    auto* vf = syn->add_option("--vocab-from", sy->vocab_from,
                               "copy the tokenizer (and its size) from this GGUF: a draft model for it")
                   ->check(existing_file());
    for (auto& [opt, field] : sy->shape)
        if (field == &synth_params::n_vocab) vf->excludes(opt);
    syn->add_option("--add-token", sy->added_tokens,
                    "a user-defined token (\"<think>\") at the end of the made-up vocabulary; repeatable")
        ->excludes(vf);
    syn->add_option("--chat-template", sy->chat_template, "a file whose Jinja source is the model's chat template")
        ->check(existing_file());
    syn->add_flag("--tied", sy->tied, "no output.weight: tie the logits to the embedding");
    syn->add_option("--rope-scale", sy->rope_scale, "RoPE scaling factor")->check(between(1.0, 1024.0, number::real));
    auto* scaling_opt = syn->add_option("--rope-scaling", sy->rope_scaling, "linear | yarn | llama3 (with --rope-scale)")
                            ->check(one_of({"linear", "yarn", "llama3"}));
    reg.push_back({syn, [syn, sy, arch_opt, scaling_opt] {
        // The preset gives every shape; flags given on the command line override it.
        synth_params p = synth_preset(sy->preset);
        for (auto [opt, field] : sy->shape)
            if (*opt) p.*field = sy->flags.*field;
        if (*sy->seed) p.seed = sy->flags.seed;
        if (*arch_opt) p.arch = sy->arch;
        p.tied_output = p.tied_output || sy->tied;
        if (sy->rope_scale > 0) p.rope_scale = sy->rope_scale;
        if (*scaling_opt) p.rope_scaling = sy->rope_scaling;
        // A kind of scaling without a factor would write no scaling at all (the preset's factor
        // counts: llama3.2-1b has one).
        if (*scaling_opt && p.rope_scale == 0)
            return usage_error(*syn, fmt::format("--rope-scaling: {} needs --rope-scale (the factor); without one the "
                                                 "file would have no RoPE scaling",
                                                 sy->rope_scaling));
        p.vocab_from = sy->vocab_from;
        p.added_tokens = sy->added_tokens;
        if (!sy->chat_template.empty()) {
            std::ifstream in(sy->chat_template, std::ios::binary);
            p.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
            if (p.chat_template.empty()) fail("synth: {} is empty", sy->chat_template);
        }
        if (*sy->type_opt) p.type = synth_types().at(sy->type);
        if (*sy->type_opt && sy->type == "q4_k_m") p.mix_type = dtype::q6_k;
        synth_write(p, sy->out);
        return 0;
    }});
}

} // namespace tandem::cli
