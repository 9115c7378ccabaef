#include "runtime/grammar/grammar.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace tandem::grammar {

std::pair<char32_t, size_t> utf8_decode(std::string_view s, size_t pos) {
    const auto b0 = uint8_t(s[pos]);
    if (b0 < 0x80) return {b0, 1};
    const size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC0 ? 2 : 0;
    if (n == 0 || b0 > 0xF4 || pos + n > s.size()) return {0, 0};
    char32_t c = b0 & (0x7F >> n);
    for (size_t i = 1; i < n; ++i) {
        const auto b = uint8_t(s[pos + i]);
        if ((b & 0xC0) != 0x80) return {0, 0};
        c = c << 6 | (b & 0x3F);
    }
    static constexpr char32_t min_of[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_of[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return {0, 0};
    return {c, n};
}

void utf8_append(std::string& out, char32_t c) {
    if (c < 0x80) {
        out += char(c);
        return;
    }
    const int n = c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    static constexpr uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    out += char(lead[n] | c >> (6 * (n - 1)));
    for (int i = n - 2; i >= 0; --i) out += char(0x80 | (c >> (6 * i) & 0x3F));
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

expr lit(std::string_view utf8) {
    expr e;
    e.k = expr::kind::literal;
    e.text = utf8;
    return e;
}

expr cls(std::vector<cp_range> ranges, bool negated) {
    expr e;
    e.k = expr::kind::cls;
    e.ranges = std::move(ranges);
    e.negated = negated;
    return e;
}

expr any_char() { return cls({}, true); }

expr ref(rule_id r) {
    expr e;
    e.k = expr::kind::ref;
    e.rule = r;
    return e;
}

expr seq(std::vector<expr> items) {
    expr e;
    e.k = expr::kind::seq;
    e.items = std::move(items);
    return e;
}

expr alt(std::vector<expr> items) {
    TANDEM_ASSERT(!items.empty(), "an alternative of nothing");
    if (items.size() == 1) return std::move(items[0]);
    expr e;
    e.k = expr::kind::alt;
    e.items = std::move(items);
    return e;
}

expr rep(expr item, int32_t min, int32_t max) {
    expr e;
    e.k = expr::kind::repeat;
    e.items.push_back(std::move(item));
    e.min = min;
    e.max = max;
    return e;
}

rule_id builder::declare(std::string name) {
    names_.push_back(std::move(name));
    defs_.emplace_back();
    is_defined_.push_back(false);
    return rule_id(defs_.size() - 1);
}

void builder::define(rule_id r, expr e) {
    TANDEM_ASSERT(r < defs_.size() && !is_defined_[r], "rule {} defined twice or never declared", r);
    defs_[r] = std::move(e);
    is_defined_[r] = true;
}

namespace {

constexpr char32_t max_cp = 0x10FFFF;

} // namespace

std::vector<cp_range> normalize(std::vector<cp_range> r, bool negated) {
    for (auto& [lo, hi] : r) hi = std::min(hi, max_cp);
    std::erase_if(r, [](const cp_range& x) { return x.first > x.second; });
    std::sort(r.begin(), r.end());
    std::vector<cp_range> m;
    for (const auto& x : r) {
        if (!m.empty() && x.first <= m.back().second + 1) m.back().second = std::max(m.back().second, x.second);
        else m.push_back(x);
    }
    if (negated) {
        std::vector<cp_range> c;
        char32_t next = 0;
        for (const auto& [lo, hi] : m) {
            if (lo > next) c.push_back({next, lo - 1});
            next = hi + 1;
        }
        if (next <= max_cp) c.push_back({next, max_cp});
        m = std::move(c);
    }
    std::vector<cp_range> out; // surrogates are not characters UTF-8 can carry
    for (const auto& [lo, hi] : m) {
        if (hi < 0xD800 || lo > 0xDFFF) out.push_back({lo, hi});
        else {
            if (lo < 0xD800) out.push_back({lo, 0xD7FF});
            if (hi > 0xDFFF) out.push_back({0xE000, hi});
        }
    }
    return out;
}

namespace {

int utf8_len(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

using byte_range_seq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] (one UTF-8 length) into pieces whose encodings are products of byte
// ranges: a piece's code points differ only in their last k continuation bytes, and those
// span the whole 0x80..0xBF range, except in the first byte that differs.
void utf8_pieces(char32_t lo, char32_t hi, std::vector<byte_range_seq>& out) {
    const int n = utf8_len(lo);
    if (n != utf8_len(hi)) {
        const char32_t edge = n == 1 ? 0x7F : n == 2 ? 0x7FF : 0xFFFF;
        utf8_pieces(lo, edge, out);
        utf8_pieces(edge + 1, hi, out);
        return;
    }
    for (int i = 1; i < n; ++i) {
        const char32_t m = (char32_t(1) << (6 * i)) - 1; // the low i continuation bytes
        if ((lo & ~m) == (hi & ~m)) continue;
        if ((lo & m) != 0) {
            utf8_pieces(lo, lo | m, out);
            utf8_pieces((lo | m) + 1, hi, out);
            return;
        }
        if ((hi & m) != m) {
            utf8_pieces(lo, (hi & ~m) - 1, out);
            utf8_pieces(hi & ~m, hi, out);
            return;
        }
    }
    std::string a, b;
    utf8_append(a, lo);
    utf8_append(b, hi);
    byte_range_seq s;
    for (int i = 0; i < n; ++i) s.push_back({uint8_t(a[size_t(i)]), uint8_t(b[size_t(i)])});
    out.push_back(std::move(s));
}

// Lowers expressions into the compiled form; helper rules join after the declared ones.
class lowering {
public:
    lowering(const std::vector<std::string>& names, const std::vector<expr>& defs, const build_limits& lim)
        : defs_(defs), lim_(lim) {
        g_.rule_names = names;
        alts_.resize(names.size());
    }

    compiled run(rule_id root) {
        for (rule_id r = 0; r < defs_.size(); ++r) alts_[r] = alternatives(defs_[r]);
        prune();
        g_.root = root;
        g_.alt_starts.resize(alts_.size());
        for (rule_id r = 0; r < alts_.size(); ++r) {
            for (const auto& a : alts_[r]) {
                g_.alt_starts[r].push_back(uint32_t(g_.elems.size()));
                g_.elems.insert(g_.elems.end(), a.begin(), a.end());
                g_.elems.push_back({element::kind::end, 0});
            }
        }
        return std::move(g_);
    }

private:
    using seq_t = std::vector<element>;

    // Drops the alternatives that can never complete (an empty class, or a rule that cannot):
    // front ends build them where parts of a constraint turn out to allow nothing, and the
    // matcher must not offer a byte that leads there.
    void prune() {
        std::vector<bool> prod(alts_.size(), false);
        const auto ok = [&](const element& el) {
            if (el.k == element::kind::ref) return bool(prod[el.arg]);
            const auto& c = g_.classes[el.arg];
            return (c[0] | c[1] | c[2] | c[3]) != 0;
        };
        for (bool changed = true; changed;) {
            changed = false;
            for (rule_id r = 0; r < alts_.size(); ++r) {
                if (prod[r]) continue;
                for (const auto& a : alts_[r])
                    if (std::all_of(a.begin(), a.end(), ok)) {
                        prod[r] = changed = true;
                        break;
                    }
            }
        }
        for (auto& alts : alts_)
            std::erase_if(alts, [&](const seq_t& a) { return !std::all_of(a.begin(), a.end(), ok); });
    }

    std::vector<seq_t> alternatives(const expr& e) {
        std::vector<seq_t> out;
        if (e.k == expr::kind::alt) {
            for (const auto& x : e.items) out.push_back(sequence(x));
        } else {
            out.push_back(sequence(e));
        }
        return out;
    }

    seq_t sequence(const expr& e) {
        seq_t s;
        append(e, s);
        return s;
    }

    void grow(seq_t& s, const element& el) {
        if (++n_elems_ > lim_.max_elems) reject("the grammar is too large (over {} elements)", lim_.max_elems);
        if (n_elems_ % 4096 == 0 && std::chrono::steady_clock::now() > lim_.deadline)
            reject("the grammar took too long to compile ({} elements so far)", n_elems_);
        s.push_back(el);
    }

    void append(const expr& e, seq_t& s) {
        switch (e.k) {
        case expr::kind::literal:
            for (const char c : e.text) grow(s, byte_element(single(uint8_t(c))));
            break;
        case expr::kind::cls: grow(s, class_element(normalize(e.ranges, e.negated))); break;
        case expr::kind::ref:
            TANDEM_ASSERT(e.rule < defs_.size(), "reference to rule {} of {}", e.rule, defs_.size());
            grow(s, {element::kind::ref, e.rule});
            break;
        case expr::kind::seq:
            for (const auto& x : e.items) append(x, s);
            break;
        case expr::kind::alt: grow(s, {element::kind::ref, helper("alt", alternatives(e))}); break;
        case expr::kind::repeat: repeat(e, s); break;
        }
    }

    // item{min,max}: the item min times, then a tail rule: `t ::= item t | ""` when
    // unbounded (a tail call: the matcher's stack does not grow with it), else a chain of
    // max - min optional items, `t_k ::= item t_(k-1) | ""`.
    void repeat(const expr& e, seq_t& s) {
        if (e.min < 0 || (e.max >= 0 && e.max < e.min)) reject("a repetition of {} to {} times", e.min, e.max);
        if (e.min > lim_.max_repeat || e.max > lim_.max_repeat)
            reject("a repetition count over {} ({{{},{}}})", lim_.max_repeat, e.min, e.max);
        const seq_t body = sequence(e.items[0]);
        for (int32_t i = 0; i < e.min; ++i)
            for (const auto& el : body) grow(s, el);
        if (e.max == e.min) return;
        const auto tail_of = [&](const seq_t& next) {
            seq_t more = body;
            more.insert(more.end(), next.begin(), next.end());
            n_elems_ += more.size();
            return helper("rep", {std::move(more), {}});
        };
        rule_id t;
        if (e.max < 0) {
            t = rule_id(alts_.size());
            g_.rule_names.push_back("rep");
            alts_.push_back({});
            seq_t more = body;
            more.push_back({element::kind::ref, t});
            n_elems_ += more.size();
            alts_[t] = {std::move(more), {}};
        } else {
            t = tail_of({});
            for (int32_t k = e.max - e.min - 1; k > 0; --k) t = tail_of({{element::kind::ref, t}});
        }
        grow(s, {element::kind::ref, t});
    }

    rule_id helper(const char* name, std::vector<seq_t> alts) {
        g_.rule_names.push_back(name);
        alts_.push_back(std::move(alts));
        return rule_id(alts_.size() - 1);
    }

    static byte_set single(uint8_t b) {
        byte_set s{};
        add_byte(s, b);
        return s;
    }

    element byte_element(const byte_set& set) {
        auto [it, fresh] = class_index_.try_emplace(set, uint32_t(g_.classes.size()));
        if (fresh) g_.classes.push_back(set);
        return {element::kind::bytes, it->second};
    }

    // One code point of the (normalized) ranges: a byte class when they are ASCII, else a
    // helper rule with one alternative per UTF-8 piece, shared by every equal class.
    element class_element(const std::vector<cp_range>& ranges) {
        if (ranges.empty() || ranges.back().second < 0x80) {
            byte_set set{};
            for (const auto& [lo, hi] : ranges)
                for (char32_t c = lo; c <= hi; ++c) add_byte(set, uint8_t(c));
            return byte_element(set); // empty: a class nothing matches, a dead end
        }
        if (const auto it = class_rule_.find(ranges); it != class_rule_.end()) return {element::kind::ref, it->second};
        std::vector<byte_range_seq> pieces;
        for (const auto& [lo, hi] : ranges) utf8_pieces(lo, hi, pieces);
        std::vector<seq_t> alts;
        for (const auto& p : pieces) {
            seq_t s;
            for (const auto& [a, b] : p) {
                byte_set set{};
                for (int c = a; c <= b; ++c) add_byte(set, uint8_t(c));
                grow(s, byte_element(set));
            }
            alts.push_back(std::move(s));
        }
        const rule_id r = helper("char", std::move(alts));
        class_rule_.emplace(ranges, r);
        return {element::kind::ref, r};
    }

    const std::vector<expr>& defs_;
    const build_limits& lim_;
    compiled g_;
    std::vector<std::vector<seq_t>> alts_;
    std::map<byte_set, uint32_t> class_index_;
    std::map<std::vector<cp_range>, rule_id> class_rule_;
    size_t n_elems_ = 0;
};

// The rules some alternative of which has only elements `ok` accepts, as a fixpoint (ok may
// look at the marks so far: a rule's answer depends on the rules it refers to).
template <class Ok>
std::vector<bool> rules_where(const compiled& g, Ok ok) {
    std::vector<bool> mark(g.n_rules(), false);
    for (bool changed = true; changed;) {
        changed = false;
        for (rule_id r = 0; r < g.n_rules(); ++r) {
            if (mark[r]) continue;
            for (const uint32_t a : g.alt_starts[r]) {
                uint32_t p = a;
                while (g.elems[p].k != element::kind::end && ok(g.elems[p], mark)) ++p;
                if (g.elems[p].k == element::kind::end) {
                    mark[r] = changed = true;
                    break;
                }
            }
        }
    }
    return mark;
}

std::vector<bool> nullable_rules(const compiled& g) {
    return rules_where(g, [](const element& el, const std::vector<bool>& nul) {
        return el.k == element::kind::ref && nul[el.arg];
    });
}

// Left recursion the matcher cannot run: a rule reaching itself through references with only
// nullable elements before them, where some reference on the cycle is not a tail call (a
// cycle of tail calls only, like a repetition of a nullable item, is fine: it revisits one
// stack and stops). Strongly connected components of the "leftmost reference" graph, with a
// non-tail edge inside one component.
void check_left_recursion(const compiled& g) {
    const auto nul = nullable_rules(g);
    const size_t n = g.n_rules();
    std::vector<std::vector<std::pair<uint32_t, bool>>> edges(n); // (to, is tail call)
    for (rule_id r = 0; r < n; ++r) {
        for (const uint32_t a : g.alt_starts[r]) {
            for (uint32_t p = a; g.elems[p].k == element::kind::ref; ++p) {
                edges[r].push_back({g.elems[p].arg, g.elems[p + 1].k == element::kind::end});
                if (!nul[g.elems[p].arg]) break;
            }
        }
    }
    // Tarjan's components, iteratively (a deep grammar must not overflow the stack).
    std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1);
    std::vector<uint32_t> stack;
    std::vector<bool> on(n, false);
    int32_t next = 0, n_comp = 0;
    for (uint32_t s = 0; s < n; ++s) {
        if (index[s] >= 0) continue;
        std::vector<std::pair<uint32_t, size_t>> dfs{{s, 0}};
        index[s] = low[s] = next++;
        stack.push_back(s);
        on[s] = true;
        while (!dfs.empty()) {
            auto& [v, i] = dfs.back();
            if (i < edges[v].size()) {
                const uint32_t w = edges[v][i++].first;
                if (index[w] < 0) {
                    index[w] = low[w] = next++;
                    stack.push_back(w);
                    on[w] = true;
                    dfs.push_back({w, 0});
                } else if (on[w]) {
                    low[v] = std::min(low[v], index[w]);
                }
                continue;
            }
            const uint32_t done = v;
            dfs.pop_back();
            if (!dfs.empty()) low[dfs.back().first] = std::min(low[dfs.back().first], low[done]);
            if (low[done] == index[done]) {
                for (uint32_t w = ~0u; w != done;) {
                    w = stack.back();
                    stack.pop_back();
                    on[w] = false;
                    comp[w] = n_comp;
                }
                ++n_comp;
            }
        }
    }
    for (rule_id r = 0; r < n; ++r)
        for (const auto& [to, tail] : edges[r])
            if (!tail && comp[to] == comp[r])
                reject("rule \"{}\" is left-recursive (it can reach itself before matching a character)",
                       g.rule_names[r]);
}

// Whether the root matches any text at all (a rule is productive when some alternative has
// only bytes with a non-empty class and productive rules).
void check_productive(const compiled& g) {
    const auto prod = rules_where(g, [&](const element& el, const std::vector<bool>& prod) {
        if (el.k == element::kind::ref) return bool(prod[el.arg]);
        const auto& c = g.classes[el.arg];
        return (c[0] | c[1] | c[2] | c[3]) != 0;
    });
    if (!prod[g.root]) reject("the grammar matches no text (rule \"{}\" can never complete)", g.rule_names[g.root]);
}

// The closure tables (compiled::reach): from each position, a search over (position, pushes)
// that follows references into their alternatives (pushing the return position unless the
// reference ends its alternative: a tail call) and ends back into pushed returns. Left
// recursion is refused before this runs, so the pushes stay bounded and the search ends.
void compute_closures(compiled& g, const build_limits& lim) {
    // A search state is a position and its pushes; pushes are nodes of a trie (parent, value,
    // depth), interned per start position, so a state is two numbers.
    struct push_node {
        uint32_t parent, value, depth;
    };
    std::vector<push_node> nodes;
    std::unordered_map<uint64_t, uint32_t> node_index;
    const auto push = [&](uint32_t parent, uint32_t value) {
        const auto [it, fresh] = node_index.try_emplace(uint64_t(parent) << 32 | value, uint32_t(nodes.size()));
        if (fresh) nodes.push_back({parent, value, nodes[parent].depth + 1});
        return it->second;
    };
    const auto n = uint32_t(g.elems.size());
    g.closure_begin.assign(1, 0);
    g.completes.assign(n, 0);
    std::vector<std::pair<uint32_t, uint32_t>> work; // (position, push node)
    std::unordered_set<uint64_t> seen;
    std::vector<uint32_t> scratch;
    const size_t limit = 4 * lim.max_elems; // reaches and pushes, and the search's own states
    for (uint32_t p = 0; p < n; ++p) {
        nodes.assign(1, {0, 0, 0}); // node 0: no pushes
        node_index.clear();
        work.assign(1, {p, 0});
        seen.clear();
        size_t searched = 0, n_states = 0;
        while (!work.empty()) {
            if ((++n_states & 4095) == 0 && std::chrono::steady_clock::now() > lim.deadline)
                reject("the grammar took too long to compile (expanding position {} of {})", p, n);
            const auto [x, node] = work.back();
            work.pop_back();
            if ((searched += 1 + nodes[node].depth) > limit)
                reject("the grammar is too large (expanding position {} passes {} entries)", p, limit);
            if (!seen.insert(uint64_t(x) << 32 | node).second) continue;
            const element& el = g.elems[x];
            if (el.k == element::kind::bytes) {
                scratch.clear();
                for (uint32_t k = node; k != 0; k = nodes[k].parent) scratch.push_back(nodes[k].value);
                const auto b = uint32_t(g.closure_pushes.size());
                g.closure_pushes.insert(g.closure_pushes.end(), scratch.rbegin(), scratch.rend());
                g.closure.push_back({x, b, uint32_t(g.closure_pushes.size())});
            } else if (el.k == element::kind::end) {
                if (node == 0) g.completes[p] = 1;
                else work.push_back({nodes[node].value, nodes[node].parent});
            } else {
                const uint32_t inner = g.elems[x + 1].k != element::kind::end ? push(node, x + 1) : node;
                for (const uint32_t a : g.alt_starts[el.arg]) work.push_back({a, inner});
            }
        }
        g.closure_begin.push_back(uint32_t(g.closure.size()));
        if (g.closure.size() + g.closure_pushes.size() > limit)
            reject("the grammar is too large (its expansions pass {} entries)", limit);
    }
}

} // namespace

compiled builder::build(rule_id root, const build_limits& lim) const {
    TANDEM_ASSERT(root < defs_.size(), "root {} of {} rules", root, defs_.size());
    for (rule_id r = 0; r < defs_.size(); ++r)
        if (!is_defined_[r]) reject("rule \"{}\" is used but never defined", names_[r]);
    compiled g = lowering(names_, defs_, lim).run(root);
    check_left_recursion(g);
    check_productive(g);
    compute_closures(g, lim);
    return g;
}

std::string compiled::dump() const {
    std::string out;
    const auto byte_class = [&](const byte_set& s) {
        std::string c = "[";
        for (int b = 0; b < 256;) {
            if (!has_byte(s, uint8_t(b))) {
                ++b;
                continue;
            }
            int e = b;
            while (e + 1 < 256 && has_byte(s, uint8_t(e + 1))) ++e;
            c += e == b ? fmt::format("{:02x}", b) : fmt::format("{:02x}-{:02x}", b, e);
            c += ' ';
            b = e + 1;
        }
        if (c.size() > 1) c.pop_back();
        return c + "]";
    };
    for (rule_id r = 0; r < n_rules(); ++r) {
        out += fmt::format("{}#{} ::=", rule_names[r], r);
        for (size_t i = 0; i < alt_starts[r].size(); ++i) {
            out += i ? " |" : "";
            for (uint32_t p = alt_starts[r][i]; elems[p].k != element::kind::end; ++p) {
                if (elems[p].k == element::kind::ref) out += fmt::format(" {}#{}", rule_names[elems[p].arg], elems[p].arg);
                else out.append(" ").append(byte_class(classes[elems[p].arg]));
            }
        }
        out += '\n';
    }
    return out;
}

} // namespace tandem::grammar
