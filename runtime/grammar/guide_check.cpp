// Walking texts through masks, and MaskBench's files run schema by schema.
#include "runtime/grammar/guide_check.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace tandem::grammar {

using json = nlohmann::ordered_json;

namespace {

using clock_type = std::chrono::steady_clock;

double us_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

void python_string(std::string& out, const std::string& s) {
    out += '"';
    for (size_t i = 0; i < s.size();) {
        auto [c, n] = utf8_decode(s, i);
        if (n == 0) { // not UTF-8: as the byte (Python would have refused it)
            c = uint8_t(s[i]);
            n = 1;
        }
        i += n;
        switch (c) {
        case '"': out += "\\\""; continue;
        case '\\': out += "\\\\"; continue;
        case '\n': out += "\\n"; continue;
        case '\r': out += "\\r"; continue;
        case '\t': out += "\\t"; continue;
        case '\b': out += "\\b"; continue;
        case '\f': out += "\\f"; continue;
        default: break;
        }
        if (c >= 0x20 && c <= 0x7E) out += char(c);
        else if (c < 0x10000) out += fmt::format("\\u{:04x}", uint32_t(c));
        else {
            const char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", uint32_t(0xD800 + (v >> 10)), uint32_t(0xDC00 + (v & 0x3FF)));
        }
    }
    out += '"';
}

// Python's float repr: the shortest digits that read back, fixed from 1e-4 up to 1e16.
std::string python_float(double x) {
    if (std::isnan(x)) return "NaN";
    if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
    char buf[64];
    const char* end = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific).ptr;
    std::string t(buf, size_t(end - buf)); // -d.ddde+XX
    std::string sign;
    if (t[0] == '-') {
        sign = "-";
        t.erase(0, 1);
    }
    const size_t e = t.find('e');
    const int exp = std::stoi(t.substr(e + 1));
    std::string digits = t.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    if (exp >= -4 && exp < 16) {
        const int point = exp + 1; // digits before the decimal point
        std::string out;
        if (point <= 0) out = "0." + std::string(size_t(-point), '0') + digits;
        else if (size_t(point) >= digits.size()) out = digits + std::string(size_t(point) - digits.size(), '0') + ".0";
        else out = digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
        return sign + out;
    }
    std::string mant = digits.substr(0, 1);
    if (digits.size() > 1) mant += "." + digits.substr(1);
    return sign + mant + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

void python_dump(std::string& out, const json& v) {
    switch (v.type()) {
    case json::value_t::object: {
        out += '{';
        bool first = true;
        for (const auto& [k, x] : v.items()) {
            if (!first) out += ", ";
            first = false;
            python_string(out, k);
            out += ": ";
            python_dump(out, x);
        }
        out += '}';
        break;
    }
    case json::value_t::array: {
        out += '[';
        for (size_t i = 0; i < v.size(); ++i) {
            if (i) out += ", ";
            python_dump(out, v[i]);
        }
        out += ']';
        break;
    }
    case json::value_t::string: python_string(out, v.get_ref<const std::string&>()); break;
    case json::value_t::number_float: out += python_float(v.get<double>()); break;
    case json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case json::value_t::null: out += "null"; break;
    default: out += v.dump(); break; // integers
    }
}

} // namespace

std::string python_json_dumps(const json& v) {
    std::string out;
    python_dump(out, v);
    return out;
}

std::vector<token_id> tokens_of(const tokenizer& tok, const vocab_trie& vocab, std::string_view text) {
    std::vector<token_id> ids = tok.encode(text);
    std::string spelled;
    for (const token_id t : ids) spelled += vocab.piece(t);
    if (spelled == text) return ids;
    // The longest piece at each position (a vocabulary with byte tokens has one for any byte).
    std::unordered_map<std::string_view, token_id> by_piece;
    size_t longest = 1;
    for (token_id t = 0; t < vocab.n_vocab(); ++t) {
        const std::string& p = vocab.piece(t);
        if (p.empty()) continue;
        by_piece.try_emplace(p, t);
        longest = std::max(longest, p.size());
    }
    std::vector<token_id> out;
    for (size_t i = 0; i < text.size();) {
        size_t len = std::min(longest, text.size() - i);
        for (; len > 0; --len)
            if (const auto it = by_piece.find(text.substr(i, len)); it != by_piece.end()) {
                out.push_back(it->second);
                break;
            }
        if (len == 0) throw grammar_error(fmt::format("no token of the vocabulary spells byte {} of the text", i));
        i += len;
    }
    return out;
}

walk_result walk_tokens(mask_cache& cache, const std::vector<token_id>& tokens) {
    walk_result r;
    matcher m(cache.grammar());
    token_set allowed(cache.vocab().n_vocab());
    const auto& ends = cache.vocab().end_tokens();
    for (size_t i = 0; i <= tokens.size(); ++i) {
        const auto t0 = clock_type::now();
        cache.fill(m, allowed);
        r.mask_us.push_back(us_since(t0));
        if (i == tokens.size()) {
            r.accepted = m.can_end() && (ends.empty() || allowed.has(ends[0]));
            if (!r.accepted) r.rejected_at = int32_t(i);
            break;
        }
        const token_id t = tokens[i];
        if (!allowed.has(t) || !m.advance(cache.vocab().piece(t))) {
            r.rejected_at = int32_t(i);
            break;
        }
        ++r.n_tokens;
    }
    return r;
}

schema_run run_schema(const json& entry, const std::string& id, const tokenizer& tok,
                      const std::shared_ptr<const vocab_trie>& vocab, const bench_options& opt) {
    schema_run run;
    run.id = id;
    std::shared_ptr<mask_cache> cache;
    const std::string text = entry.at("schema").dump();
    const auto t0 = clock_type::now();
    try {
        builder b;
        const rule_id root = add_json_schema(b, json::parse(text), {.ws = opt.ws});
        build_limits lim;
        lim.deadline = t0 + std::chrono::milliseconds(2000);
        auto g = std::make_shared<const compiled>(build_json_schema(b, root, lim));
        run.n_rules = g->n_rules();
        run.n_elems = g->elems.size();
        cache = std::make_shared<mask_cache>(std::move(g), vocab, std::chrono::microseconds(0));
        run.compile_us = us_since(t0);
        run.compiled = true;
    } catch (const grammar_error& e) {
        run.error = e.what();
    }
    const json& tests = entry.contains("tests") ? entry["tests"] : json::array();
    bool first_mask = true;
    for (size_t i = 0; i < tests.size(); ++i) {
        const bool valid = tests[i].value("valid", false);
        (valid ? run.n_valid : run.n_invalid)++;
        if (!run.compiled) continue;
        const std::string inst = python_json_dumps(tests[i].at("data"));
        std::vector<token_id> tokens = tokens_of(tok, *vocab, inst);
        const bool cut = tokens.size() > size_t(opt.max_tokens);
        if (cut) tokens.resize(size_t(opt.max_tokens));
        walk_result w = walk_tokens(*cache, tokens);
        if (first_mask && !w.mask_us.empty()) {
            run.ttfm_us = run.compile_us + w.mask_us[0];
            w.mask_us.erase(w.mask_us.begin());
            first_mask = false;
        }
        run.mask_us.insert(run.mask_us.end(), w.mask_us.begin(), w.mask_us.end());
        const bool accepted = w.accepted || (cut && w.rejected_at == int32_t(tokens.size()));
        if (accepted == valid) continue;
        (valid ? run.valid_rejected : run.invalid_accepted)++;
        std::string where = "accepted";
        if (!accepted) {
            size_t offset = 0;
            for (int32_t k = 0; k < w.rejected_at; ++k) offset += vocab->piece(tokens[size_t(k)]).size();
            const std::string piece = w.rejected_at < int32_t(tokens.size()) ? vocab->piece(tokens[size_t(w.rejected_at)])
                                                                             : std::string("<end>");
            where = fmt::format("rejected at byte {} ({}): ...{}", offset, json(piece).dump(),
                                inst.substr(offset >= 40 ? offset - 40 : 0, std::min<size_t>(offset, 40) + 20));
        }
        run.failures.push_back(fmt::format("test {} ({}): {}", i, valid ? "valid" : "invalid", where));
    }
    return run;
}

std::vector<std::pair<std::string, json>> read_maskbench(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error(fmt::format("cannot read {}", path));
    std::stringstream ss;
    ss << in.rdbuf();
    json j;
    try {
        j = json::parse(ss.str());
    } catch (const json::exception& e) {
        throw error(fmt::format("{} is not JSON: {}", path, e.what()));
    }
    std::string stem = path.substr(path.find_last_of('/') + 1);
    if (stem.ends_with(".json")) stem.resize(stem.size() - 5);
    std::vector<std::pair<std::string, json>> out;
    if (j.is_object()) {
        if (!j.contains("schema")) throw error(fmt::format("{}: a MaskBench entry has a \"schema\"", path));
        out.emplace_back(stem, std::move(j));
        return out;
    }
    if (!j.is_array()) throw error(fmt::format("{}: neither a MaskBench entry nor an array of them", path));
    for (size_t i = 0; i < j.size(); ++i) {
        if (!j[i].is_object() || !j[i].contains("schema"))
            throw error(fmt::format("{}: entry {} has no \"schema\"", path, i));
        out.emplace_back(j[i].contains("id") ? j[i]["id"].get<std::string>() : fmt::format("{}[{}]", stem, i),
                         std::move(j[i]));
    }
    return out;
}

double percentile(const std::vector<double>& sorted, double p) {
    if (sorted.empty()) return 0;
    return sorted[std::min(sorted.size() - 1, size_t(p * double(sorted.size())))];
}

} // namespace tandem::grammar
