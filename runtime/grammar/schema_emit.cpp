// Writing value sets as grammar rules: a rule per formula (so recursive schemas close on
// themselves), a rule per automaton state for strings and numbers, and objects and arrays as
// small state machines over their members (which names are written, how many items and how
// many of them a `contains` counts).
#include "runtime/grammar/schema_compiler.hpp"

#include "runtime/grammar/json_text.hpp"

#include <algorithm>
#include <bit>

namespace tandem::grammar {

using json = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxShapeStates = 4096; // of one object's or array's state machine
constexpr size_t kAnyOrderNames = 6;     // objects with at most this many names write each once, in any order
constexpr size_t kMaxTracked = 10;       // past this many required names, objects take the schema's order

expr quoted_body(expr body) { return seq({lit("\""), std::move(body)}); }

} // namespace

schema_compiler::schema_compiler(builder& b, const json& root, const json_options& opt)
    : b_(b), doc_(root), alg_(f_), opt_(opt) {}

rule_id schema_compiler::root_rule() {
    const formula_id f = f_.of(doc_.root());
    if (eval(f).trivially_empty()) reject("the schema is unsatisfiable: no JSON value is valid under it");
    return emit(f);
}

rule_id schema_compiler::shared(std::optional<rule_id>& slot, const char* name, maker make) {
    if (!slot) {
        slot = b_.declare(name);
        b_.define(*slot, (this->*make)());
    }
    return *slot;
}

expr schema_compiler::make_ws() {
    if (opt_.ws == whitespace::compact) return lit("");
    // At most one line break and then up to kMaxIndent spaces or tabs: what a pretty printer
    // writes, and no more (a model could otherwise spend its tokens on whitespace).
    return seq({opt(alt({lit("\n"), lit("\r\n")})), rep(cls({{' ', ' '}, {'\t', '\t'}}), 0, json_options::max_indent)});
}
expr schema_compiler::make_char() { return json_char(all_chars()); }
expr schema_compiler::make_string() { return seq({lit("\""), star(ref(any_char())), lit("\"")}); }
expr schema_compiler::make_number() {
    const expr digit = cls({{'0', '9'}});
    const expr whole = alt({lit("0"), seq({cls({{'1', '9'}}), rep(digit, 0, kIntDigits - 1)})});
    const expr fraction = opt(seq({lit("."), rep(digit, 1, kFracDigits)}));
    const expr exponent =
        seq({cls({{'e', 'e'}, {'E', 'E'}}), opt(cls({{'+', '+'}, {'-', '-'}})), rep(digit, 1, kExpDigits)});
    return seq({opt(lit("-")), whole, fraction, opt(exponent)});
}
expr schema_compiler::make_value() {
    return alt({ref(any_object()), ref(any_array()), ref(any_string()), ref(any_number()), lit("true"), lit("false"),
                lit("null")});
}
expr schema_compiler::make_object() {
    const expr member = seq({ref(any_string()), colon(), ref(any_value())});
    return seq({lit("{"), ws(), opt(seq({member, star(seq({sep(), member})), ws()})), lit("}")});
}
expr schema_compiler::make_array() {
    return seq({lit("["), ws(), opt(seq({ref(any_value()), star(seq({sep(), ref(any_value())})), ws()})), lit("]")});
}

rule_id schema_compiler::emit(formula_id f) {
    if (const auto it = rules_.find(f); it != rules_.end()) return it->second;
    const formula_node& n = f_.at(f);
    const rule_id r = b_.declare(n.o == formula_node::op::loc ? (n.loc->path.empty() ? "root" : n.loc->path) : "value");
    rules_.emplace(f, r);
    b_.define(r, formula_expr(f));
    return r;
}

expr schema_compiler::formula_expr(formula_id f) {
    if (f == f_true) return ref(any_value());
    if (f == f_false) return cls({}); // nothing: the builder drops the alternatives that lead here
    const formula_node& n = f_.at(f);
    if (n.o == formula_node::op::loc) {
        // A reference is its target's rule; a union of subschemas (anyOf, or a oneOf whose
        // branches exclude each other) is the union of their rules: each schema's rules once.
        const schema_loc& s = through_refs(*n.loc);
        if (&s != n.loc) return ref(emit(f_.of(s)));
        const value_set& v = eval(f);
        const json& j = *s.node;
        std::vector<std::string> keys;
        for (const auto& [k, _] : j.items())
            if (schema_doc::is_keyword(s.d, k)) keys.push_back(k);
        const bool union_only = keys.size() == 1 && (keys[0] == "anyOf" || (keys[0] == "oneOf" && disjoint_one_of_.contains(&s)));
        if (!union_only) return value_expr(v, s.path);
        std::vector<expr> alts;
        for (size_t i = 0; i < j[keys[0]].size(); ++i) {
            const formula_id b = f_.of(doc_.item(s, keys[0], i));
            if (b != f_false && !eval(b).trivially_empty()) alts.push_back(ref(emit(b)));
        }
        return alts.empty() ? cls({}) : alt(std::move(alts));
    }
    if (n.o == formula_node::op::any) {
        std::vector<expr> alts;
        for (const formula_id a : n.args)
            if (!eval(a).trivially_empty()) alts.push_back(ref(emit(a)));
        return alts.empty() ? cls({}) : alt(std::move(alts));
    }
    return value_expr(eval(f), "value");
}

expr schema_compiler::value_expr(const value_set& v, const std::string& name) {
    if (v.is_every()) return ref(any_value());
    std::vector<expr> alts;
    if (v.null_ok) alts.push_back(lit("null"));
    if (v.bools & 2) alts.push_back(lit("true"));
    if (v.bools & 1) alts.push_back(lit("false"));
    if (v.numbers.any) alts.push_back(ref(any_number()));
    else if (!v.numbers.empty()) alts.push_back(ref(number_rule(v.numbers.d)));
    if (v.strings.is_every()) alts.push_back(ref(any_string()));
    else if (!v.strings.empty()) alts.push_back(ref(string_rule(v.strings)));
    for (const array_shape& a : v.arrays) alts.push_back(array_expr(a, name));
    for (const object_shape& o : v.objects) alts.push_back(object_expr(o, name));
    return alts.empty() ? cls({}) : alt(std::move(alts));
}

// A character of `set` as JSON writes it. The escapes (\uXXXX ranges, surrogate pairs) make
// a set's rule large, and only the characters outside printable ASCII have them: so the rule
// is the printable ASCII part, small, beside a rule for the rest, shared by every set with the
// same rest (a key that is none of some names excludes letters, not the rest).
rule_id schema_compiler::char_rule(const std::vector<cp_range>& set) {
    if (set == all_chars()) return any_char();
    const auto key_of = [](const std::vector<cp_range>& r) {
        std::string k;
        for (const auto& [lo, hi] : r) k += fmt::format("{:x}-{:x},", uint32_t(lo), uint32_t(hi));
        return k;
    };
    const std::string key = key_of(set);
    if (const auto it = char_rules_.find(key); it != char_rules_.end()) return it->second;
    std::vector<cp_range> ascii, rest;
    for (const auto& [lo, hi] : set) {
        if (lo < 0x20) rest.push_back({lo, std::min<char32_t>(hi, 0x1F)});
        if (hi >= 0x20 && lo <= 0x7E) ascii.push_back({std::max<char32_t>(lo, 0x20), std::min<char32_t>(hi, 0x7E)});
        if (hi > 0x7E) rest.push_back({std::max<char32_t>(lo, 0x7F), hi});
    }
    std::vector<expr> alts;
    if (!ascii.empty()) alts.push_back(json_char(ascii));
    if (!rest.empty()) {
        const std::string rest_key = "rest:" + key_of(rest);
        auto it = char_rules_.find(rest_key);
        if (it == char_rules_.end()) it = char_rules_.emplace(rest_key, b_.add("char", json_char(rest))).first;
        alts.push_back(ref(it->second));
    }
    const rule_id r = b_.add("char", alts.empty() ? cls({}) : alt(std::move(alts)));
    char_rules_.emplace(key, r);
    return r;
}

// One rule per state: an edge is a character class and the target's rule (a tail call, so a
// long string does not grow the matcher's stack); an accepting state may end (a string's
// closing quote).
rule_id schema_compiler::dfa_rules(const dfa& d, bool json_chars, const std::string& name) {
    const std::string key = fmt::format("{}{}", json_chars ? "S" : "N", d.key());
    if (const auto it = dfa_rules_.find(key); it != dfa_rules_.end()) return it->second;
    std::vector<rule_id> states(d.n_states());
    for (uint32_t s = 0; s < d.n_states(); ++s) states[s] = b_.declare(name);
    dfa_rules_.emplace(key, states[0]);
    for (uint32_t s = 0; s < d.n_states(); ++s) {
        std::map<uint32_t, std::vector<cp_range>> by_target;
        for (const auto& e : d.edges(s)) by_target[e.to].push_back({e.lo, e.hi});
        std::vector<expr> alts;
        for (const auto& [to, ranges] : by_target)
            alts.push_back(seq({json_chars ? ref(char_rule(ranges)) : cls(ranges), ref(states[to])}));
        if (d.accepting(s)) alts.push_back(lit(json_chars ? "\"" : ""));
        b_.define(states[s], alts.empty() ? cls({}) : alt(std::move(alts)));
    }
    return states[0];
}

// A string's body: a rule per automaton state and count of characters so far, the count kept
// as far as the bounds need it (to max_len, or to min_len when there is no max).
rule_id schema_compiler::string_rule(const string_set& st) {
    const std::string key = fmt::format("Q{}:{}:{}", st.all ? "*" : st.d.key(), st.min_len, st.max_len);
    if (const auto it = dfa_rules_.find(key); it != dfa_rules_.end()) return it->second;
    const dfa d = st.all ? dfa::all() : st.d;
    const int64_t cap = st.max_len >= 0 ? st.max_len : st.min_len;
    std::vector<std::vector<std::pair<uint32_t, rule_id>>> edges(d.n_states()); // (target, character rule)
    for (uint32_t s = 0; s < d.n_states(); ++s) {
        std::map<uint32_t, std::vector<cp_range>> by_target;
        for (const auto& e : d.edges(s)) by_target[e.to].push_back({e.lo, e.hi});
        for (const auto& [to, ranges] : by_target) edges[s].push_back({to, char_rule(ranges)});
    }
    std::map<std::pair<uint32_t, int64_t>, rule_id> rules;
    std::vector<std::pair<uint32_t, int64_t>> todo;
    const auto rule_of = [&](uint32_t s, int64_t c) {
        const auto [it, fresh] = rules.try_emplace({s, c}, 0);
        if (fresh) {
            if (rules.size() > 200000) reject("a string's pattern and length bounds need over 200000 rules: too large");
            it->second = b_.declare("string-char");
            todo.push_back({s, c});
        }
        return it->second;
    };
    const rule_id start = rule_of(0, 0);
    while (!todo.empty()) {
        const auto [s, c] = todo.back();
        todo.pop_back();
        std::vector<expr> alts;
        if (st.max_len < 0 || c < st.max_len)
            for (const auto& [to, ch] : edges[s]) alts.push_back(seq({ref(ch), ref(rule_of(to, std::min(c + 1, cap)))}));
        if (d.accepting(s) && c >= st.min_len) alts.push_back(lit("\""));
        b_.define(rules[{s, c}], alts.empty() ? cls({}) : alt(std::move(alts)));
    }
    const rule_id r = b_.add("string", quoted_body(ref(start)));
    dfa_rules_.emplace(key, r);
    return r;
}

rule_id schema_compiler::number_rule(const dfa& d) { return dfa_rules(d, false, "number"); }

expr schema_compiler::key_literal(const std::string& name) {
    const bool plain = std::all_of(name.begin(), name.end(), [](char c) {
        return c >= 0x20 && c < 0x7F && c != '"' && c != '\\' && c != '/';
    });
    if (plain) return lit("\"" + name + "\"");
    std::vector<expr> items{lit("\"")};
    for (const char32_t c : to_u32(name)) items.push_back(json_char({{c, c}}));
    items.push_back(lit("\""));
    return seq(std::move(items));
}

// Members in any order. With few names, each name at most once (the state is the set
// written so far); with more, the required ones once each and the optional ones any number of
// times (a parser keeps one value per name, and every value written was valid for it), unless
// minProperties needs distinct names counted: then the names in the shape's order. Members
// of key regions (patternProperties, additionalProperties) may come anywhere, and their keys
// are not checked for repeats: minProperties counts the members written. Counts are kept
// only as far as minProperties, maxProperties and counted regions need.
expr schema_compiler::object_expr(const object_shape& o, const std::string& name) {
    if (o.is_any()) return ref(any_object());
    struct member {
        rule_id kv;
        bool required;
        int64_t min = 0, max = -1; // regions
    };
    std::vector<member> names, regions;
    // closed_objects: a shape that names keys (or has keys a keyword evaluates) writes no keys
    // that no keyword speaks of. Leaving members out is safe anywhere: the texts are fewer.
    const bool closed = opt_.closed_objects && std::any_of(o.classes.begin(), o.classes.end(), [](const member_class& c) {
        return c.value != f_false && (c.named || c.evaluated);
    });
    for (const member_class& c : o.classes) {
        if (closed && !c.named && !c.evaluated && c.min == 0) continue;
        if (c.value == f_false || (!c.named && c.keys.empty())) {
            if (c.named && o.needs(c.name)) return cls({});
            continue;
        }
        if (c.named) {
            const rule_id kv = b_.add(name + "/" + c.name, seq({key_literal(c.name), colon(), ref(emit(c.value))}));
            names.push_back({kv, o.needs(c.name)});
        } else {
            const rule_id kv = b_.add(name + "/*", seq({ref(string_rule(string_set::of(c.keys))), colon(), ref(emit(c.value))}));
            regions.push_back({kv, false, c.min, c.max});
        }
    }
    const size_t n = names.size();
    int64_t n_required = 0;
    for (const member& m : names) n_required += m.required;
    if (o.max >= 0 && n_required > o.max) return cls({});
    const bool need_min = o.min > n_required, need_max = o.max >= 0;
    enum class mode { each_once, required_once, ordered };
    const mode md = n <= kAnyOrderNames                      ? mode::each_once
                    : !need_min && size_t(n_required) <= kMaxTracked ? mode::required_once
                                                             : mode::ordered;
    // The names a state tracks (bit i of POS): all (each_once) or the required ones.
    std::vector<size_t> bit_of(n, SIZE_MAX);
    uint64_t all_required = 0;
    for (size_t i = 0, b = 0; i < n; ++i)
        if (md == mode::each_once || (md == mode::required_once && names[i].required)) {
            bit_of[i] = b;
            if (names[i].required) all_required |= uint64_t(1) << b;
            ++b;
        }
    // One rule for the members that change nothing a state tracks (optional names when
    // required_once, regions not counted).
    std::vector<expr> free_members;
    if (md == mode::required_once)
        for (size_t i = 0; i < n; ++i)
            if (!names[i].required) free_members.push_back(ref(names[i].kv));
    std::vector<size_t> tracked_regions;
    for (size_t r = 0; r < regions.size(); ++r) {
        if (regions[r].min > 0 || regions[r].max >= 0 || md == mode::ordered) tracked_regions.push_back(r);
        else free_members.push_back(ref(regions[r].kv));
    }
    std::optional<rule_id> free_rule;
    if (!free_members.empty()) free_rule = b_.add(name + "/other", alt(std::move(free_members)));
    // A state: pos (each_once, required_once: the tracked names written, a bit each; ordered:
    // the next name's index), phase (ordered: 0 regions may come, 1 the next name), first,
    // members written (for minProperties, up to it; for maxProperties), each counted region's.
    using state = std::vector<int64_t>;
    enum { POS, PHASE, FIRST, SEEN, TOTAL, COUNTS };
    std::map<state, rule_id> rules;
    std::vector<state> todo;
    const auto rule_of = [&](state st) {
        const auto [it, fresh] = rules.try_emplace(st, 0);
        if (fresh) {
            if (rules.size() > kMaxShapeStates)
                reject("the object schema {} has too many combinations of properties and counts to write (over {})",
                       name.empty() ? "at the root" : "at " + name, kMaxShapeStates);
            it->second = b_.declare(name + "/members");
            todo.push_back(st);
        }
        return it->second;
    };
    const auto cap = [](int64_t v, int64_t c) { return std::min(v, c); };
    state start(COUNTS + regions.size(), 0);
    start[FIRST] = 1;
    const rule_id first_rule = rule_of(start);
    while (!todo.empty()) {
        const state st = todo.back();
        todo.pop_back();
        const bool first = st[FIRST] != 0;
        const expr lead = first ? lit("") : sep();
        std::vector<expr> alts;
        const bool room = !need_max || st[TOTAL] < o.max;
        const auto after = [&](state next) {
            next[FIRST] = 0;
            if (need_max) ++next[TOTAL];
            if (need_min) next[SEEN] = cap(next[SEEN] + 1, o.min);
            return next;
        };
        const auto add = [&](rule_id kv, const state& next) {
            alts.push_back(seq({lead, ref(kv), ref(rule_of(after(next)))}));
        };
        const bool members_here = md != mode::ordered || st[PHASE] == 0;
        if (members_here && room) {
            if (free_rule) add(*free_rule, st);
            for (const size_t r : tracked_regions) {
                state next = st;
                if (regions[r].min > 0 || regions[r].max >= 0) {
                    if (regions[r].max >= 0 && st[COUNTS + r] >= regions[r].max) continue;
                    next[COUNTS + r] = cap(st[COUNTS + r] + 1, std::max(regions[r].min, regions[r].max));
                }
                add(regions[r].kv, next);
            }
        }
        bool can_end = true;
        if (md != mode::ordered) {
            if (room)
                for (size_t i = 0; i < n; ++i) {
                    if (bit_of[i] == SIZE_MAX || (st[POS] >> bit_of[i] & 1)) continue;
                    state next = st;
                    next[POS] |= int64_t(1) << bit_of[i];
                    add(names[i].kv, next);
                }
            can_end = (uint64_t(st[POS]) & all_required) == all_required;
        } else if (st[PHASE] == 0) {
            state next = st;
            next[PHASE] = 1;
            alts.push_back(ref(rule_of(next)));
            can_end = false;
        } else if (const auto i = size_t(st[POS]); i < n) {
            if (room) {
                state next = st;
                next[POS] = int64_t(i) + 1;
                next[PHASE] = 0;
                add(names[i].kv, next);
            }
            if (!names[i].required) {
                state next = st;
                next[POS] = int64_t(i) + 1;
                alts.push_back(ref(rule_of(next)));
            }
            can_end = false;
        }
        if (can_end) {
            for (size_t r = 0; r < regions.size(); ++r) can_end = can_end && st[COUNTS + r] >= regions[r].min;
            if (need_min && st[SEEN] < o.min) can_end = false;
        }
        if (can_end) alts.push_back(first ? lit("}") : seq({ws(), lit("}")}));
        b_.define(rules[st], alts.empty() ? cls({}) : alt(std::move(alts)));
    }
    return seq({lit("{"), ws(), ref(first_rule)});
}

// Items by position (the prefix, then the rest), up to maxItems or the position past which
// nothing changes; each item of a counted kind (contains) either counted or not.
expr schema_compiler::array_expr(const array_shape& a, const std::string& name) {
    if (a.is_any()) return ref(any_array());
    const std::string where = name.empty() ? "at the root" : "at " + name;
    if (a.unique && (a.max < 0 || a.max > 1))
        reject("\"uniqueItems\" {}: items that must differ from each other are not supported", where);
    const auto n = int64_t(a.prefix.size());
    const int64_t last = a.max >= 0 ? a.max : std::max({n, a.min, int64_t(1)}); // positions tracked: 0..last
    std::vector<int64_t> caps;
    for (const auto& c : a.counts) caps.push_back(c.max >= 0 ? c.max : c.min);
    using state = std::vector<int64_t>; // position, then each count
    std::map<state, rule_id> rules;
    std::vector<state> todo;
    const auto rule_of = [&](const state& st) {
        const auto [it, fresh] = rules.try_emplace(st, 0);
        if (fresh) {
            if (rules.size() > kMaxShapeStates * 4)
                reject("the array schema {} has too many positions and counts to write (over {})", where,
                       kMaxShapeStates * 4);
            it->second = b_.declare(name + "/items");
            todo.push_back(st);
        }
        return it->second;
    };
    state start(1 + a.counts.size(), 0);
    const rule_id first_rule = rule_of(start);
    while (!todo.empty()) {
        const state st = todo.back();
        todo.pop_back();
        const int64_t i = st[0];
        const bool first = i == 0;
        std::vector<expr> alts;
        const formula_id f = i < n ? a.prefix[size_t(i)] : a.rest;
        if ((a.max < 0 || i < a.max) && f != f_false) {
            std::vector<size_t> here; // the counts that apply at i
            for (size_t k = 0; k < a.counts.size(); ++k)
                if (i >= a.counts[k].from) here.push_back(k);
            for (uint64_t mask = 0; mask < (uint64_t(1) << here.size()); ++mask) {
                std::vector<formula_id> parts{f};
                state next = st;
                next[0] = a.max >= 0 ? i + 1 : std::min(i + 1, last);
                bool ok = true;
                for (size_t b = 0; b < here.size(); ++b) {
                    const auto& c = a.counts[here[b]];
                    if (mask >> b & 1) {
                        if (c.max >= 0 && st[1 + here[b]] >= c.max) ok = false;
                        parts.push_back(c.f);
                        next[1 + here[b]] = std::min(st[1 + here[b]] + 1, caps[here[b]]);
                    } else {
                        parts.push_back(f_.negate(c.f));
                    }
                }
                const formula_id item = f_.all(parts);
                if (!ok || item == f_false || eval(item).trivially_empty()) continue;
                alts.push_back(seq({first ? lit("") : sep(), ref(emit(item)), ref(rule_of(next))}));
            }
        }
        bool can_end = i >= a.min;
        for (size_t k = 0; k < a.counts.size(); ++k) can_end = can_end && st[1 + k] >= a.counts[k].min;
        if (can_end) alts.push_back(first ? lit("]") : seq({ws(), lit("]")}));
        b_.define(rules[st], alts.empty() ? cls({}) : alt(std::move(alts)));
    }
    return seq({lit("["), ws(), ref(first_rule)});
}

} // namespace tandem::grammar
