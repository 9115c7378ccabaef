// `tandem guide`: the constraint engine on its own. `compile` a schema (its grammar's size and
// compile time, or the 400 the daemon would answer), `check` instances against it through a
// vocabulary's token masks, and `bench` MaskBench's files (jsonschemabench, maskbench/data):
// per schema compiled or why not, valid instances rejected, invalid ones accepted, time to the
// first mask (TTFM) and between masks (TBM).
#include "daemon/cli.hpp"

#include "runtime/gguf.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/grammar/guide_check.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

namespace tandem::cli {

namespace {

using ojson = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

constexpr int kRefused = 4; // the daemon's 400: the same exit code as a rejected request

struct guide_opts {
    std::string schema, model, whitespace = "bounded";
    std::vector<std::string> files;
    bool json = false, dump = false, failures = false;
    int32_t limit = 0, max_tokens = 4096;
};

std::string read_file(const std::string& path) {
    if (path == "-") return read_stdin();
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error(fmt::format("cannot read {}", path));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

grammar::whitespace ws_of(const guide_opts& o) {
    return o.whitespace == "compact" ? grammar::whitespace::compact : grammar::whitespace::bounded;
}

std::string cpu_name() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
        if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
    return "unknown";
}

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

int cmd_compile(const guide_opts& o) {
    const grammar::constraint c{grammar::constraint::kind::json_schema, read_file(o.schema), ws_of(o)};
    const auto t0 = clock_type::now();
    std::shared_ptr<const grammar::compiled> g;
    try {
        g = grammar::compile(c);
    } catch (const grammar::grammar_error& e) {
        if (o.json) write_out(ojson{{"compiled", false}, {"error", e.what()}}.dump() + "\n");
        else std::fprintf(stderr, "tandem: refused: %s\n", e.what());
        return kRefused;
    }
    const double ms = ms_since(t0);
    if (o.dump) write_out(g->dump());
    if (o.json)
        write_out(ojson{{"compiled", true}, {"compile_ms", ms}, {"rules", g->n_rules()}, {"elements", g->elems.size()}}
                      .dump() +
                  "\n");
    else if (!o.dump)
        write_out(fmt::format("compiled in {:.2f} ms: {} rules, {} elements\n", ms, g->n_rules(), g->elems.size()));
    return 0;
}

struct vocab_bundle {
    tokenizer tok;
    std::shared_ptr<const grammar::vocab_trie> vocab;
};

vocab_bundle load_vocab(const std::string& model) {
    tokenizer tok = tokenizer::from_gguf(gguf::file::open(resolve_model(model)));
    auto vocab = grammar::vocab_trie::of(tok);
    return {std::move(tok), std::move(vocab)};
}

int cmd_check(const guide_opts& o) {
    const grammar::constraint c{grammar::constraint::kind::json_schema, read_file(o.schema), ws_of(o)};
    const vocab_bundle v = load_vocab(o.model);
    std::shared_ptr<grammar::mask_cache> cache;
    try {
        cache = std::make_shared<grammar::mask_cache>(grammar::compile(c), v.vocab, std::chrono::microseconds(0));
    } catch (const grammar::grammar_error& e) {
        std::fprintf(stderr, "tandem: refused: %s\n", e.what());
        return kRefused;
    }
    int n_rejected = 0;
    ojson results = ojson::array();
    for (const std::string& path : o.files) {
        std::string text = read_file(path);
        while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
        const auto tokens = grammar::tokens_of(v.tok, *v.vocab, text);
        const grammar::walk_result w = grammar::walk_tokens(*cache, tokens);
        n_rejected += !w.accepted;
        ojson r{{"file", path}, {"accepted", w.accepted}, {"tokens", tokens.size()}};
        std::string line = fmt::format("{}: accepted ({} tokens)", path, tokens.size());
        if (!w.accepted) {
            size_t offset = 0;
            for (int32_t k = 0; k < w.rejected_at; ++k) offset += v.vocab->piece(tokens[size_t(k)]).size();
            const bool at_end = w.rejected_at == int32_t(tokens.size());
            r["rejected_at_token"] = w.rejected_at;
            r["rejected_at_byte"] = offset;
            line = at_end ? fmt::format("{}: rejected: the text ends where the schema does not allow it", path)
                          : fmt::format("{}: rejected at token {} {} (byte {}): ...{}", path, w.rejected_at,
                                        ojson(v.vocab->piece(tokens[size_t(w.rejected_at)])).dump(), offset,
                                        text.substr(offset >= 30 ? offset - 30 : 0, std::min<size_t>(offset, 30) + 10));
        }
        results.push_back(std::move(r));
        if (!o.json) write_out(line + "\n");
    }
    if (o.json) write_out(results.dump() + "\n");
    if (n_rejected > 0) {
        std::fprintf(stderr, "tandem: %d of %zu instances rejected\n", n_rejected, o.files.size());
        return 1;
    }
    return 0;
}

ojson percentiles(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {{"n", v.size()},
            {"p50", grammar::percentile(v, 0.5)},
            {"p75", grammar::percentile(v, 0.75)},
            {"p90", grammar::percentile(v, 0.9)},
            {"p99", grammar::percentile(v, 0.99)},
            {"max", v.empty() ? 0.0 : v.back()}};
}

int cmd_bench(const guide_opts& o) {
    const vocab_bundle v = load_vocab(o.model);
    grammar::bench_options opt{.ws = ws_of(o), .max_tokens = o.max_tokens};
    std::vector<grammar::schema_run> runs;
    for (const std::string& path : o.files)
        for (auto& [id, entry] : grammar::read_maskbench(path)) {
            if (o.limit > 0 && runs.size() >= size_t(o.limit)) break;
            runs.push_back(grammar::run_schema(entry, id, v.tok, v.vocab, opt));
        }
    std::vector<double> ttfm, tbm;
    int64_t n_compiled = 0, n_valid = 0, n_invalid = 0, valid_rejected = 0, invalid_accepted = 0;
    ojson schemas = ojson::array();
    for (const auto& r : runs) {
        ojson s{{"id", r.id}, {"compiled", r.compiled}};
        if (!r.compiled) s["error"] = r.error;
        else {
            ++n_compiled;
            n_valid += r.n_valid;
            n_invalid += r.n_invalid;
            valid_rejected += r.valid_rejected;
            invalid_accepted += r.invalid_accepted;
            ttfm.push_back(r.ttfm_us > 0 ? r.ttfm_us : r.compile_us);
            tbm.insert(tbm.end(), r.mask_us.begin(), r.mask_us.end());
            std::vector<double> m = r.mask_us;
            std::sort(m.begin(), m.end());
            s.update(ojson{{"valid", r.n_valid}, {"invalid", r.n_invalid}, {"valid_rejected", r.valid_rejected},
                           {"invalid_accepted", r.invalid_accepted}, {"compile_us", r.compile_us},
                           {"ttfm_us", r.ttfm_us}, {"rules", r.n_rules}, {"elements", r.n_elems},
                           {"tbm_us", percentiles(r.mask_us)}});
            if (!r.failures.empty()) s["failures"] = r.failures;
        }
        schemas.push_back(std::move(s));
    }
    const ojson total{{"schemas", runs.size()},
                      {"compiled", n_compiled},
                      {"compiled_share", runs.empty() ? 0.0 : double(n_compiled) / double(runs.size())},
                      {"valid_instances", n_valid},
                      {"invalid_instances", n_invalid},
                      {"valid_rejected", valid_rejected},
                      {"invalid_accepted", invalid_accepted},
                      {"ttfm_us", percentiles(ttfm)},
                      {"tbm_us", percentiles(tbm)}};
    if (o.json) {
        write_out(ojson{{"vocabulary", resolve_model(o.model)},
                        {"n_vocab", v.tok.n_vocab()},
                        {"whitespace", o.whitespace},
                        {"cpu", cpu_name()},
                        {"schemas", schemas},
                        {"total", total}}
                      .dump(1) +
                  "\n");
        return 0;
    }
    std::string out = fmt::format("{:<48} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "schema", "compiled", "valid rej",
                                  "inval acc", "TTFM ms", "TBM p50", "TBM p99");
    for (const auto& s : schemas) {
        std::string id = s["id"].get<std::string>();
        if (id.size() > 48) id = id.substr(0, 45) + "...";
        if (!s["compiled"].get<bool>()) {
            std::string why = s["error"].get<std::string>();
            if (why.size() > 100) why = why.substr(0, 97) + "...";
            out += fmt::format("{:<48} {:>8}  {}\n", id, "no", why);
            continue;
        }
        out += fmt::format("{:<48} {:>8} {:>4}/{:<4} {:>4}/{:<4} {:>9.2f} {:>9.1f} {:>9.1f}\n", id, "yes",
                           s["valid_rejected"].get<int>(), s["valid"].get<int>(), s["invalid_accepted"].get<int>(),
                           s["invalid"].get<int>(), s["ttfm_us"].get<double>() / 1000, s["tbm_us"]["p50"].get<double>(),
                           s["tbm_us"]["p99"].get<double>());
        if (o.failures && s.contains("failures"))
            for (const auto& f : s["failures"]) out += "    " + f.get<std::string>() + "\n";
    }
    const auto pct = [](const ojson& p, double scale) {
        return fmt::format("p50 {:.1f}, p75 {:.1f}, p90 {:.1f}, p99 {:.1f}, max {:.1f}", p["p50"].get<double>() * scale,
                           p["p75"].get<double>() * scale, p["p90"].get<double>() * scale,
                           p["p99"].get<double>() * scale, p["max"].get<double>() * scale);
    };
    out += fmt::format("\nvocabulary {} ({} tokens), whitespace {}, one thread on {}\n", resolve_model(o.model),
                       v.tok.n_vocab(), o.whitespace, cpu_name());
    out += fmt::format("schemas compiled    {} of {} ({:.1f}%)\n", n_compiled, runs.size(),
                       100.0 * total["compiled_share"].get<double>());
    out += fmt::format("valid rejected      {} of {} valid instances of compiled schemas ({:.2f}%)\n", valid_rejected,
                       n_valid, n_valid ? 100.0 * double(valid_rejected) / double(n_valid) : 0.0);
    out += fmt::format("invalid accepted    {} of {} invalid instances of compiled schemas\n", invalid_accepted,
                       n_invalid);
    out += fmt::format("TTFM (ms)           {}\n", pct(total["ttfm_us"], 0.001));
    out += fmt::format("TBM (us)            {} ({} masks)\n", pct(total["tbm_us"], 1), total["tbm_us"]["n"].get<size_t>());
    write_out(out);
    return 0;
}

} // namespace

void register_guide(CLI::App& app, registry& reg) {
    auto o = std::make_shared<guide_opts>();
    auto* guide = app.add_subcommand("guide", "the guided-generation engine on its own: compile a JSON Schema, check "
                                              "instances through a vocabulary's token masks, bench MaskBench files");
    guide->require_subcommand(1);
    const auto ws_flag = [&](CLI::App* sub) {
        sub->add_option("--whitespace", o->whitespace,
                        "whitespace between JSON tokens: bounded (at most a line break and 20 spaces or tabs; the "
                        "default) or compact (none)")
            ->check(one_of({"bounded", "compact"}));
    };
    auto* compile = guide->add_subcommand("compile", "compile SCHEMA.json (\"-\": stdin): the grammar's size and "
                                                     "compile time, or why it is refused (exit code 4)");
    compile->add_option("schema", o->schema, "the JSON Schema file")->required();
    compile->add_flag("--dump", o->dump, "print the compiled grammar");
    compile->add_flag("--json", o->json, "print one JSON object");
    ws_flag(compile);
    auto* check = guide->add_subcommand("check", "check INSTANCE.json files against SCHEMA.json: each instance's "
                                                 "tokens must pass every mask and end where the schema may end");
    check->add_option("schema", o->schema, "the JSON Schema file")->required();
    check->add_option("instances", o->files, "JSON files, each checked as written (a final newline aside)")->required();
    check->add_option("-m,--model", o->model, "the vocabulary: a GGUF model or vocabulary file (default: $TANDEM_MODEL)");
    check->add_flag("--json", o->json, "print a JSON array of results");
    ws_flag(check);
    auto* bench = guide->add_subcommand("bench", "run MaskBench files ({\"schema\", \"tests\"}, or an array of them "
                                                 "with \"id\"s): compile rate, valid rejected, invalid accepted, "
                                                 "TTFM and TBM");
    bench->add_option("files", o->files, "MaskBench JSON files")->required();
    bench->add_option("-m,--model", o->model, "the vocabulary: a GGUF model or vocabulary file (default: $TANDEM_MODEL)");
    bench->add_option("--limit", o->limit, "the first N schemas only")->check(between(1, 1000000));
    bench->add_option("--max-tokens", o->max_tokens, "tokens of an instance walked at most")->check(between(1, 1000000));
    bench->add_flag("--failures", o->failures, "list each wrong verdict under its schema");
    bench->add_flag("--json", o->json, "print one JSON object");
    ws_flag(bench);
    reg.push_back({guide, [o, compile, check, bench] {
                       if (compile->parsed()) return cmd_compile(*o);
                       if (check->parsed()) return cmd_check(*o);
                       return cmd_bench(*o);
                   }});
}

} // namespace tandem::cli
