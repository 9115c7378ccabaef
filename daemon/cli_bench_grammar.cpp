// `tandem bench --grammar`: guided generation's costs on a model's vocabulary: compiling a
// constraint (with the mask cache's classification ahead, --grammar-prepare-ms), and the token
// mask per generated token (first walk: contexts the cache has not classified yet are met;
// later walks: mostly classified), over random walks that pick any allowed token.
#include "daemon/cli.hpp"

#include "runtime/gguf.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>

namespace tandem::cli {

namespace {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

double us_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

// A record-like schema of the kind apps ask for: strings with limits, numbers with bounds,
// an enum, an array of objects, a format.
json record_schema() {
    return json::parse(R"({
      "type": "object",
      "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "score": {"type": "number"},
        "status": {"enum": ["active", "suspended", "deleted"]},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city"]},
        "orders": {"type": "array",
                   "items": {"type": "object",
                             "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                             "required": ["sku", "qty"]}}
      },
      "required": ["id", "name", "age", "status", "tags"]
    })");
}

// 100 properties of mixed types, half of them required: the compile-time case.
json wide_schema() {
    json props = json::object(), req = json::array();
    const char* types[] = {"string", "integer", "number", "boolean"};
    for (int i = 0; i < 100; ++i) {
        props[fmt::format("field_{:03}", i)] = {{"type", types[i % 4]}};
        if (i % 2 == 0) req.push_back(fmt::format("field_{:03}", i));
    }
    return {{"type", "object"}, {"properties", props}, {"required", req}};
}

struct walk_stats {
    std::vector<double> us;
    void add(double v) { us.push_back(v); }
    json summary() {
        if (us.empty()) return {{"n", 0}};
        std::sort(us.begin(), us.end());
        double sum = 0;
        for (const double v : us) sum += v;
        const auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
        return {{"n", us.size()}, {"mean_us", sum / double(us.size())}, {"p50_us", at(0.5)}, {"p99_us", at(0.99)}};
    }
};

// Random walks through the grammar: each step fills the mask (timed) and takes any allowed
// token, the end only when nothing else is allowed or by a one-in-ten chance.
void walk(grammar::mask_cache& cache, std::mt19937& rng, int n_tokens, walk_stats& st) {
    grammar::matcher m(cache.grammar());
    grammar::token_set allowed(cache.vocab().n_vocab());
    std::vector<token_id> next;
    for (int i = 0; i < n_tokens; ++i) {
        const auto t0 = clock_type::now();
        cache.fill(m, allowed);
        st.add(us_since(t0));
        next.clear();
        for (token_id t = 0; t < allowed.size(); ++t)
            if (allowed.has(t) && !cache.vocab().piece(t).empty()) next.push_back(t);
        if (next.empty() || (m.can_end() && rng() % 10 == 0)) return;
        if (!m.advance(cache.vocab().piece(next[rng() % next.size()]))) throw error("a masked token was refused");
    }
}

int run_grammar_bench(const std::string& model, int walks, int n_tokens, double prepare_ms, bool as_json) {
    const tokenizer tok = tokenizer::from_gguf(gguf::file::open(resolve_model(model)));
    auto t0 = clock_type::now();
    const auto vocab = grammar::vocab_trie::of(tok);
    json j{{"model", resolve_model(model)}, {"n_vocab", tok.n_vocab()}, {"vocab_trie_ms", us_since(t0) / 1000},
           {"prepare_ms", prepare_ms}};
    using kind = grammar::constraint::kind;
    const std::vector<std::pair<std::string, grammar::constraint>> cases{
        {"record_schema", {kind::json_schema, record_schema().dump()}},
        {"wide_schema_100", {kind::json_schema, wide_schema().dump()}},
        {"json_object", {kind::json_object, ""}},
        {"regex_date_list", {kind::regex, R"((\d{4}-\d{2}-\d{2}, )*\d{4}-\d{2}-\d{2})"}},
    };
    std::mt19937 rng(1);
    for (const auto& [name, c] : cases) {
        t0 = clock_type::now();
        auto cache = std::make_shared<grammar::mask_cache>(
            grammar::compile(c), vocab, std::chrono::microseconds(int64_t(prepare_ms * 1000)));
        const double compile_ms = us_since(t0) / 1000;
        walk_stats cold, warm;
        walk(*cache, rng, n_tokens, cold);
        for (int w = 1; w < walks; ++w) walk(*cache, rng, n_tokens, warm);
        j["cases"][name] = {{"compile_ms", compile_ms},
                            {"positions_cached", cache->n_cached()},
                            {"mask_first_walk", cold.summary()},
                            {"mask_later_walks", warm.summary()}};
    }
    if (as_json) {
        std::cout << j.dump(2) << "\n";
        return 0;
    }
    std::cout << fmt::format("vocabulary   {} tokens (trie built in {:.1f} ms); contexts classified ahead for {:g} "
                             "ms at most\n",
                             tok.n_vocab(), j["vocab_trie_ms"].get<double>(), prepare_ms);
    std::cout << fmt::format("{:<18} {:>10} {:>9}  {:>30}  {:>30}\n", "constraint", "compile", "positions",
                             "mask, first walk (mean/p99)", "mask, later walks (mean/p99)");
    for (const auto& [name, r] : j["cases"].items()) {
        const auto cell = [](const json& s) {
            return s["n"].get<size_t>() ? fmt::format("{:.1f} / {:.1f} us ({} tok)", s["mean_us"].get<double>(),
                                                      s["p99_us"].get<double>(), s["n"].get<size_t>())
                                        : std::string("-");
        };
        std::cout << fmt::format("{:<18} {:>7.2f} ms {:>9}  {:>30}  {:>30}\n", name, r["compile_ms"].get<double>(),
                                 r["positions_cached"].get<size_t>(), cell(r["mask_first_walk"]),
                                 cell(r["mask_later_walks"]));
    }
    return 0;
}

} // namespace

bench_mode add_bench_grammar(CLI::App* bench, const std::string& model, const bool& json) {
    struct opts {
        int walks = 20, n_tokens = 200;
        double prepare_ms = double(grammar::mask_cache::default_prepare.count()) / 1000;
        bool on = false;
    };
    auto o = std::make_shared<opts>();
    bench_mode mode;
    mode.flag = bench->add_flag("--grammar", o->on, "guided generation instead: constraint compile time and token-mask "
                                                     "time per token on the model's vocabulary (random walks)");
    bench->add_option("--grammar-walks", o->walks, "random walks per constraint (--grammar)")->check(between(1, 10000));
    bench->add_option("--grammar-tokens", o->n_tokens, "tokens per walk at most (--grammar)")->check(between(1, 100000));
    bench->add_option("--grammar-prepare-ms", o->prepare_ms,
                      "time each constraint's mask cache may classify contexts before the walks, in the "
                      "compile time (--grammar; 0: classify each when first met)")
        ->check(between(0.0, 60000.0, number::real))
        ->capture_default_str();
    mode.run = [o, &model, &json] { return run_grammar_bench(model, o->walks, o->n_tokens, o->prepare_ms, json); };
    return mode;
}

} // namespace tandem::cli
