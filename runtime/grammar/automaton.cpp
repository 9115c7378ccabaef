// Automata: Thompson's construction from expressions, the subset construction, products for
// the boolean operations, Moore's minimization; states renumbered breadth first so that one
// language has one form.
#include "runtime/grammar/automaton.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>

namespace tandem::grammar {

namespace {

constexpr uint32_t dead = UINT32_MAX;

struct vec_hash {
    size_t operator()(const std::vector<uint32_t>& v) const {
        uint64_t h = v.size();
        for (const uint32_t x : v) h = (h ^ x) * 0x9E3779B97F4A7C15ull;
        return size_t(h ^ (h >> 29));
    }
};

// Thompson's automaton with epsilon moves.
struct nfa {
    struct move {
        char32_t lo, hi;
        uint32_t to;
    };
    std::vector<std::vector<move>> moves;
    std::vector<std::vector<uint32_t>> eps;
    size_t max_states;
    std::string_view what;

    uint32_t add() {
        if (moves.size() >= max_states) reject("{} is too complex for a finite automaton (over {} states)", what, max_states);
        moves.emplace_back();
        eps.emplace_back();
        return uint32_t(moves.size() - 1);
    }

    // The fragment for e from state `from`; returns its end state.
    uint32_t build(const expr& e, uint32_t from) {
        switch (e.k) {
        case expr::kind::literal:
            for (const char32_t c : to_u32(e.text)) {
                const uint32_t s = add();
                moves[from].push_back({c, c, s});
                from = s;
            }
            return from;
        case expr::kind::cls: {
            const uint32_t s = add();
            for (const auto& [lo, hi] : normalize(e.ranges, e.negated)) moves[from].push_back({lo, hi, s});
            return s;
        }
        case expr::kind::ref: reject("{}: a rule reference has no finite automaton", what);
        case expr::kind::seq:
            for (const expr& x : e.items) from = build(x, from);
            return from;
        case expr::kind::alt: {
            const uint32_t end = add();
            for (const expr& x : e.items) {
                const uint32_t s = add();
                eps[from].push_back(s);
                eps[build(x, s)].push_back(end);
            }
            return end;
        }
        case expr::kind::repeat: {
            for (int32_t i = 0; i < e.min; ++i) from = build(e.items[0], from);
            if (e.max < 0) {
                const uint32_t loop = add();
                eps[from].push_back(loop);
                eps[build(e.items[0], loop)].push_back(loop);
                return loop;
            }
            const uint32_t end = add();
            for (int32_t i = e.min; i < e.max; ++i) {
                eps[from].push_back(end);
                from = build(e.items[0], from);
            }
            eps[from].push_back(end);
            return end;
        }
        }
        return from;
    }

    void close(std::vector<uint32_t>& set) const {
        std::vector<uint32_t> todo = set;
        std::vector<bool> in(moves.size(), false);
        for (const uint32_t s : set) in[s] = true;
        while (!todo.empty()) {
            const uint32_t s = todo.back();
            todo.pop_back();
            for (const uint32_t t : eps[s])
                if (!in[t]) {
                    in[t] = true;
                    set.push_back(t);
                    todo.push_back(t);
                }
        }
        std::sort(set.begin(), set.end());
    }
};

} // namespace

// Builds dfas from raw tables: trims, minimizes, renumbers.
class dfa_builder {
public:
    static dfa finish(std::vector<std::vector<dfa::edge>> edges, std::vector<uint8_t> acc) {
        trim(edges, acc);
        minimize(edges, acc);
        dfa d;
        d.edges_ = std::move(edges);
        d.accepting_ = std::move(acc);
        return d;
    }

    enum class op { both, either, left_only };

    static dfa combine(const dfa& a, const dfa& b, op o, size_t max_states) {
        std::unordered_map<uint64_t, uint32_t> index;
        std::vector<std::pair<uint32_t, uint32_t>> pairs;
        std::vector<std::vector<dfa::edge>> edges;
        std::vector<uint8_t> acc;
        const auto id = [&](uint32_t x, uint32_t y) {
            const auto [it, fresh] = index.try_emplace(uint64_t(x) << 32 | y, uint32_t(pairs.size()));
            if (fresh) {
                if (pairs.size() >= max_states)
                    reject("a combination of string or number constraints is too complex (over {} states)", max_states);
                pairs.push_back({x, y});
            }
            return it->second;
        };
        id(0, 0);
        for (size_t i = 0; i < pairs.size(); ++i) {
            const auto [x, y] = pairs[i];
            const bool ax = x != dead && a.accepting_[x], by = y != dead && b.accepting_[y];
            acc.push_back(o == op::both ? ax && by : o == op::either ? ax || by : ax && !by);
            const std::vector<dfa::edge> none;
            const auto& ea = x == dead ? none : a.edges_[x];
            const auto& eb = y == dead ? none : b.edges_[y];
            std::vector<char32_t> points;
            for (const auto* es : {&ea, &eb})
                for (const auto& e : *es) points.insert(points.end(), {e.lo, char32_t(e.hi + 1)});
            std::sort(points.begin(), points.end());
            points.erase(std::unique(points.begin(), points.end()), points.end());
            std::vector<dfa::edge> out;
            size_t ia = 0, ib = 0;
            for (size_t k = 0; k + 1 < points.size(); ++k) {
                const char32_t lo = points[k], hi = points[k + 1] - 1;
                while (ia < ea.size() && ea[ia].hi < lo) ++ia;
                while (ib < eb.size() && eb[ib].hi < lo) ++ib;
                const uint32_t tx = ia < ea.size() && ea[ia].lo <= lo ? ea[ia].to : dead;
                const uint32_t ty = ib < eb.size() && eb[ib].lo <= lo ? eb[ib].to : dead;
                if (tx == dead && ty == dead) continue;
                if (o == op::both && (tx == dead || ty == dead)) continue;
                if (o == op::left_only && tx == dead) continue;
                const uint32_t t = id(tx, ty);
                if (!out.empty() && out.back().to == t && out.back().hi + 1 == lo) out.back().hi = hi;
                else out.push_back({lo, hi, t});
            }
            edges.push_back(std::move(out));
        }
        return finish(std::move(edges), std::move(acc));
    }

private:
    // Keeps the states reachable from 0 that can reach an accepting one.
    static void trim(std::vector<std::vector<dfa::edge>>& edges, std::vector<uint8_t>& acc) {
        const size_t n = edges.size();
        std::vector<std::vector<uint32_t>> back(n);
        for (uint32_t s = 0; s < n; ++s)
            for (const auto& e : edges[s]) back[e.to].push_back(s);
        std::vector<bool> live(n, false);
        std::vector<uint32_t> todo;
        for (uint32_t s = 0; s < n; ++s)
            if (acc[s]) {
                live[s] = true;
                todo.push_back(s);
            }
        while (!todo.empty()) {
            const uint32_t s = todo.back();
            todo.pop_back();
            for (const uint32_t p : back[s])
                if (!live[p]) {
                    live[p] = true;
                    todo.push_back(p);
                }
        }
        if (n == 0 || !live[0]) {
            edges.assign(1, {});
            acc.assign(1, 0);
            return;
        }
        for (auto& es : edges) std::erase_if(es, [&](const dfa::edge& e) { return !live[e.to]; });
    }

    // Moore's partition refinement, then states renumbered in breadth-first order from 0.
    static void minimize(std::vector<std::vector<dfa::edge>>& edges, std::vector<uint8_t>& acc) {
        const size_t n = edges.size();
        std::vector<uint32_t> block(n);
        for (size_t s = 0; s < n; ++s) block[s] = acc[s];
        size_t n_blocks = 0;
        std::unordered_map<std::vector<uint32_t>, uint32_t, vec_hash> sigs;
        for (;;) {
            sigs.clear();
            std::vector<uint32_t> next(n);
            std::vector<uint32_t> sig;
            for (size_t s = 0; s < n; ++s) {
                sig.assign(1, block[s]);
                for (size_t i = 0; i < edges[s].size(); ++i) {
                    const auto& e = edges[s][i];
                    const uint32_t tb = block[e.to];
                    if (sig.size() > 1 && sig.back() == tb && sig[sig.size() - 2] + 1 == e.lo) {
                        sig[sig.size() - 2] = e.hi; // extends the previous range to the same block
                        continue;
                    }
                    sig.insert(sig.end(), {uint32_t(e.lo), uint32_t(e.hi), tb});
                }
                next[s] = sigs.try_emplace(sig, uint32_t(sigs.size())).first->second;
            }
            block = std::move(next);
            if (sigs.size() == n_blocks) break;
            n_blocks = sigs.size();
        }
        // One representative per block, numbered breadth first.
        std::vector<uint32_t> rep(n_blocks, dead), number(n_blocks, dead);
        for (uint32_t s = 0; s < n; ++s)
            if (rep[block[s]] == dead) rep[block[s]] = s;
        std::vector<uint32_t> order{block[0]};
        number[block[0]] = 0;
        for (size_t i = 0; i < order.size(); ++i)
            for (const auto& e : edges[rep[order[i]]])
                if (number[block[e.to]] == dead) {
                    number[block[e.to]] = uint32_t(order.size());
                    order.push_back(block[e.to]);
                }
        std::vector<std::vector<dfa::edge>> out(order.size());
        std::vector<uint8_t> out_acc(order.size());
        for (size_t i = 0; i < order.size(); ++i) {
            out_acc[i] = acc[rep[order[i]]];
            for (const auto& e : edges[rep[order[i]]]) {
                const uint32_t t = number[block[e.to]];
                if (!out[i].empty() && out[i].back().to == t && out[i].back().hi + 1 == e.lo) out[i].back().hi = e.hi;
                else out[i].push_back({e.lo, e.hi, t});
            }
        }
        edges = std::move(out);
        acc = std::move(out_acc);
    }
};

dfa::dfa() : edges_(1), accepting_(1, 0) {}

dfa dfa::all() {
    static const dfa every = [] {
        std::vector<std::vector<edge>> e(1);
        for (const auto& [lo, hi] : all_chars()) e[0].push_back({lo, hi, 0});
        return dfa_builder::finish(std::move(e), {1});
    }();
    return every;
}

dfa dfa::from_table(std::vector<std::vector<edge>> edges, std::vector<uint8_t> accepting) {
    return dfa_builder::finish(std::move(edges), std::move(accepting));
}

dfa dfa::lengths(int64_t min, int64_t max) {
    const int64_t n = (max < 0 ? min : max) + 1;
    if (n > int64_t(default_max_states) * 5) reject("a length bound of {} is too large", max < 0 ? min : max);
    std::vector<std::vector<edge>> e(static_cast<size_t>(n));
    std::vector<uint8_t> acc(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        acc[size_t(i)] = i >= min;
        const int64_t to = i + 1 < n ? i + 1 : max < 0 ? i : -1;
        if (to >= 0)
            for (const auto& [lo, hi] : all_chars()) e[size_t(i)].push_back({lo, hi, uint32_t(to)});
    }
    return dfa_builder::finish(std::move(e), std::move(acc));
}

dfa dfa::of_strings(const std::vector<std::u32string>& strings) {
    // A trie is a dfa; edges kept sorted by inserting into a map per state.
    std::vector<std::map<char32_t, uint32_t>> trie(1);
    std::vector<uint8_t> acc(1, 0);
    for (const auto& s : strings) {
        uint32_t at = 0;
        for (const char32_t c : s) {
            const auto it = trie[at].find(c);
            if (it != trie[at].end()) {
                at = it->second;
                continue;
            }
            const auto next = uint32_t(trie.size());
            trie[at].emplace(c, next);
            trie.emplace_back();
            acc.push_back(0);
            at = next;
        }
        acc[at] = 1;
    }
    std::vector<std::vector<edge>> e(trie.size());
    for (size_t i = 0; i < trie.size(); ++i)
        for (const auto& [c, to] : trie[i]) e[i].push_back({c, c, to});
    return dfa_builder::finish(std::move(e), std::move(acc));
}

dfa dfa::of(const expr& e, std::string_view what, size_t max_states) {
    nfa a{{}, {}, max_states * 8, what};
    const uint32_t start = a.add();
    const uint32_t end = a.build(e, start);
    std::unordered_map<std::vector<uint32_t>, uint32_t, vec_hash> index;
    std::vector<std::vector<uint32_t>> sets;
    std::vector<std::vector<edge>> edges;
    std::vector<uint8_t> acc;
    const auto id = [&](std::vector<uint32_t> set) {
        a.close(set);
        const auto [it, fresh] = index.try_emplace(set, uint32_t(sets.size()));
        if (fresh) {
            if (sets.size() >= max_states) reject("{} is too complex for a finite automaton (over {} states)", what, max_states);
            sets.push_back(std::move(set));
        }
        return it->second;
    };
    id({start});
    for (size_t i = 0; i < sets.size(); ++i) {
        const std::vector<uint32_t> set = sets[i];
        acc.push_back(std::binary_search(set.begin(), set.end(), end));
        std::vector<nfa::move> moves;
        for (const uint32_t s : set) moves.insert(moves.end(), a.moves[s].begin(), a.moves[s].end());
        std::vector<char32_t> points;
        for (const auto& m : moves) points.insert(points.end(), {m.lo, char32_t(m.hi + 1)});
        std::sort(points.begin(), points.end());
        points.erase(std::unique(points.begin(), points.end()), points.end());
        std::vector<edge> out;
        std::vector<uint32_t> targets, prev;
        for (size_t k = 0; k + 1 < points.size(); ++k) {
            targets.clear();
            for (const auto& m : moves)
                if (m.lo <= points[k] && points[k] <= m.hi) targets.push_back(m.to);
            if (targets.empty()) continue;
            std::sort(targets.begin(), targets.end());
            targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
            if (!out.empty() && out.back().hi + 1 == points[k] && targets == prev) {
                out.back().hi = points[k + 1] - 1;
                continue;
            }
            prev = targets;
            const uint32_t t = id(targets);
            out.push_back({points[k], points[k + 1] - 1, t});
        }
        edges.push_back(std::move(out));
    }
    return dfa_builder::finish(std::move(edges), std::move(acc));
}

dfa dfa::operator&(const dfa& o) const { return dfa_builder::combine(*this, o, dfa_builder::op::both, default_max_states); }
dfa dfa::operator|(const dfa& o) const {
    return dfa_builder::combine(*this, o, dfa_builder::op::either, default_max_states);
}
dfa dfa::operator-(const dfa& o) const {
    return dfa_builder::combine(*this, o, dfa_builder::op::left_only, default_max_states);
}
dfa dfa::complement() const { return all() - *this; }

bool dfa::universal() const { return *this == all(); }

bool dfa::accepts(std::u32string_view s) const {
    uint32_t at = 0;
    for (const char32_t c : s) {
        const auto& es = edges_[at];
        const auto it = std::upper_bound(es.begin(), es.end(), c, [](char32_t x, const edge& e) { return x < e.lo; });
        if (it == es.begin() || std::prev(it)->hi < c) return false;
        at = std::prev(it)->to;
    }
    return accepting_[at];
}

bool dfa::single(std::u32string& out) const {
    out.clear();
    for (uint32_t at = 0, steps = 0; steps <= n_states(); ++steps) {
        const auto& es = edges_[at];
        if (accepting_[at]) return es.empty();
        if (es.size() != 1 || es[0].lo != es[0].hi) return false;
        out.push_back(es[0].lo);
        at = es[0].to;
    }
    return false;
}

std::string dfa::key() const {
    std::string k;
    for (size_t s = 0; s < edges_.size(); ++s) {
        k += accepting_[s] ? 'A' : 'N';
        for (const auto& e : edges_[s]) k += fmt::format("{:x}-{:x}>{:x},", uint32_t(e.lo), uint32_t(e.hi), e.to);
        k += ';';
    }
    return k;
}

std::u32string to_u32(std::string_view utf8) {
    std::u32string out;
    for (size_t i = 0; i < utf8.size();) {
        const auto [c, n] = utf8_decode(utf8, i);
        if (n == 0) reject("malformed UTF-8 at byte {}", i);
        out.push_back(c);
        i += n;
    }
    return out;
}

} // namespace tandem::grammar
