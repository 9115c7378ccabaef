// Value sets: formulas hash-consed and simplified; intersection of shapes by refining their key
// partitions (objects) and positions (arrays); complements as the union of the ways a value of
// the type can break the shape.
#include "runtime/grammar/schema_value.hpp"

#include "runtime/grammar/json_text.hpp"

#include <algorithm>

namespace tandem::grammar {

// ---- formulas

formula_table::formula_table() {
    nodes_.push_back({formula_node::op::constant, nullptr, {0}});
    nodes_.push_back({formula_node::op::constant, nullptr, {1}});
}

formula_id formula_table::intern(formula_node n) {
    const auto [it, fresh] = index_.try_emplace({uint8_t(n.o), n.loc, n.args}, formula_id(nodes_.size()));
    if (fresh) nodes_.push_back(std::move(n));
    return it->second;
}

formula_id formula_table::of(const schema_loc& s) {
    if (s.node->is_boolean()) return s.node->get<bool>() ? f_true : f_false;
    return intern({formula_node::op::loc, &s, {}});
}

// all and any alike: nested ones flattened, the neutral constant dropped, the absorbing one
// (or a formula beside its negation) decides, one argument is itself.
formula_id formula_table::combine(formula_node::op o, std::vector<formula_id> fs) {
    const formula_id absorbing = o == formula_node::op::all ? f_false : f_true;
    const formula_id neutral = o == formula_node::op::all ? f_true : f_false;
    std::vector<formula_id> flat;
    for (const formula_id f : fs) {
        if (f == absorbing) return absorbing;
        if (f == neutral) continue;
        if (nodes_[f].o == o) flat.insert(flat.end(), nodes_[f].args.begin(), nodes_[f].args.end());
        else flat.push_back(f);
    }
    std::sort(flat.begin(), flat.end());
    flat.erase(std::unique(flat.begin(), flat.end()), flat.end());
    for (const formula_id f : flat)
        if (nodes_[f].o == formula_node::op::negate && std::binary_search(flat.begin(), flat.end(), nodes_[f].args[0]))
            return absorbing;
    if (flat.empty()) return neutral;
    if (flat.size() == 1) return flat[0];
    return intern({o, nullptr, std::move(flat)});
}

formula_id formula_table::negate(formula_id f) {
    if (f == f_true) return f_false;
    if (f == f_false) return f_true;
    if (nodes_[f].o == formula_node::op::negate) return nodes_[f].args[0];
    return intern({formula_node::op::negate, nullptr, {f}});
}

// ---- shapes

string_set string_set::of(dfa x) {
    if (x.universal()) return every();
    return {false, std::move(x), 0, -1};
}

bool string_set::empty() const {
    if (max_len >= 0 && min_len > max_len) return true;
    if (all) return false;
    if (d.empty()) return true;
    if (min_len == 0 && max_len < 0) return false;
    // Breadth first by length: is an accepting state reached at a length in range? Past
    // min_len + the number of states, the lengths that can end repeat.
    const int64_t last = max_len < 0 ? min_len + int64_t(d.n_states()) : std::min(max_len, min_len + int64_t(d.n_states()));
    std::vector<uint8_t> at(d.n_states(), 0), next(d.n_states());
    at[0] = 1;
    for (int64_t len = 0; len <= last; ++len) {
        bool any = false;
        for (uint32_t s = 0; s < d.n_states(); ++s) {
            if (!at[s]) continue;
            any = true;
            if (len >= min_len && d.accepting(s)) return false;
        }
        if (!any) return true;
        std::fill(next.begin(), next.end(), 0);
        for (uint32_t s = 0; s < d.n_states(); ++s)
            if (at[s])
                for (const auto& e : d.edges(s)) next[e.to] = 1;
        at.swap(next);
    }
    return true;
}

dfa string_set::language() const {
    constexpr int64_t max_bound = 1000;
    if (std::max(min_len, max_len) > max_bound)
        reject("a string length bound over {} cannot be combined by union or complement", max_bound);
    dfa x = all ? dfa::all() : d;
    if (min_len > 0 || max_len >= 0) x = x & dfa::lengths(min_len, max_len);
    return x;
}

bool array_shape::is_any() const {
    return prefix.empty() && rest == f_true && min == 0 && max < 0 && counts.empty() && !unique;
}

object_shape object_shape::any() {
    object_shape s;
    member_class c;
    c.keys = dfa::all();
    s.classes.push_back(std::move(c));
    return s;
}

bool object_shape::is_any() const {
    return classes.size() == 1 && !classes[0].named && classes[0].value == f_true && classes[0].min == 0 &&
           classes[0].max < 0 && required.empty() && min == 0 && max < 0 && classes[0].keys.universal();
}

const member_class& object_shape::class_of(const std::string& key) const {
    std::u32string k;
    bool decoded = false;
    for (const member_class& c : classes) {
        if (c.named) {
            if (c.name == key) return c;
            continue;
        }
        if (!decoded) {
            k = to_u32(key);
            decoded = true;
        }
        if (c.keys.accepts(k)) return c;
    }
    TANDEM_ASSERT(false, "an object shape's classes cover every key");
    return classes.front();
}

bool object_shape::needs(const std::string& name) const {
    return std::find(required.begin(), required.end(), name) != required.end();
}

value_set value_set::every() {
    value_set v;
    v.null_ok = true;
    v.bools = 3;
    v.numbers = number_set::every();
    v.strings = string_set::every();
    v.arrays.emplace_back();
    v.objects.push_back(object_shape::any());
    return v;
}

bool value_set::is_every() const {
    return null_ok && bools == 3 && numbers.any && strings.is_every() && arrays.size() == 1 && arrays[0].is_any() &&
           objects.size() == 1 && objects[0].is_any();
}

bool value_set::trivially_empty() const {
    return !null_ok && bools == 0 && numbers.empty() && strings.empty() && arrays.empty() && objects.empty();
}

// ---- the algebra

namespace {

number_set meet(const number_set& a, const number_set& b) {
    if (a.any) return b;
    if (b.any) return a;
    return {false, a.d & b.d};
}

} // namespace

string_set value_algebra::meet(const string_set& a, const string_set& b) {
    string_set r = a.all ? b : b.all ? a : string_set{false, a.d & b.d, 0, -1};
    r.min_len = std::max(a.min_len, b.min_len);
    r.max_len = a.max_len < 0 ? b.max_len : b.max_len < 0 ? a.max_len : std::min(a.max_len, b.max_len);
    return r;
}

namespace {

bool counted(const member_class& c) { return !c.named && (c.min > 0 || c.max >= 0); }

} // namespace

std::optional<array_shape> value_algebra::meet(const array_shape& a, const array_shape& b) {
    array_shape r;
    const size_t n = std::max(a.prefix.size(), b.prefix.size());
    for (size_t i = 0; i < n; ++i) {
        const formula_id x = i < a.prefix.size() ? a.prefix[i] : a.rest;
        const formula_id y = i < b.prefix.size() ? b.prefix[i] : b.rest;
        r.prefix.push_back(f_.all({x, y}));
    }
    r.rest = f_.all({a.rest, b.rest});
    r.min = std::max(a.min, b.min);
    r.max = a.max < 0 ? b.max : b.max < 0 ? a.max : std::min(a.max, b.max);
    r.counts = a.counts;
    r.counts.insert(r.counts.end(), b.counts.begin(), b.counts.end());
    r.unique = a.unique || b.unique;
    r.n_evaluated = std::max(a.n_evaluated, b.n_evaluated);
    r.all_evaluated = a.all_evaluated || b.all_evaluated;
    // A false item ends the array before it.
    for (size_t i = 0; i < r.prefix.size(); ++i)
        if (r.prefix[i] == f_false) {
            r.max = r.max < 0 ? int64_t(i) : std::min(r.max, int64_t(i));
            break;
        }
    if (r.rest == f_false) r.max = r.max < 0 ? int64_t(r.prefix.size()) : std::min(r.max, int64_t(r.prefix.size()));
    if (r.max >= 0 && r.min > r.max) return std::nullopt;
    for (const auto& c : r.counts) {
        if (c.max >= 0 && c.min > c.max) return std::nullopt;
        if (c.min > 0 && (c.f == f_false || (r.max >= 0 && c.from + c.min > r.max))) return std::nullopt;
    }
    return r;
}

std::optional<object_shape> value_algebra::meet(const object_shape& a, const object_shape& b, const std::string& where) {
    if (a.is_any()) return b;
    if (b.is_any()) return a;
    object_shape r;
    std::vector<std::string> names;
    for (const object_shape* s : {&a, &b})
        for (const member_class& c : s->classes)
            if (c.named && std::find(names.begin(), names.end(), c.name) == names.end()) names.push_back(c.name);
    for (const std::string& name : names) {
        const member_class& ca = a.class_of(name);
        const member_class& cb = b.class_of(name);
        if (counted(ca) || counted(cb))
            reject("the schema {} needs a property \"{}\" apart from keys counted by a negated schema: not supported",
                   where, name);
        member_class c;
        c.named = true;
        c.name = name;
        c.value = f_.all({ca.value, cb.value});
        c.evaluated = ca.evaluated || cb.evaluated;
        r.classes.push_back(std::move(c));
    }
    for (const member_class& ra : a.classes) {
        if (ra.named) continue;
        for (const member_class& rb : b.classes) {
            if (rb.named) continue;
            // Each side's regions exclude its own names, so the intersection excludes them all.
            dfa keys = ra.keys & rb.keys;
            if (keys.empty()) continue;
            if ((counted(ra) && !(keys == ra.keys)) || (counted(rb) && !(keys == rb.keys)))
                reject("the schema {} splits the keys counted by a negated schema: not supported", where);
            member_class c;
            c.keys = std::move(keys);
            c.value = f_.all({ra.value, rb.value});
            c.evaluated = ra.evaluated || rb.evaluated;
            c.min = std::max(ra.min, rb.min);
            c.max = ra.max < 0 ? rb.max : rb.max < 0 ? ra.max : std::min(ra.max, rb.max);
            if (c.max >= 0 && c.min > c.max) return std::nullopt;
            if (c.min > 0 && c.value == f_false) return std::nullopt;
            r.classes.push_back(std::move(c));
        }
    }
    r.required = a.required;
    for (const std::string& n : b.required)
        if (!r.needs(n)) r.required.push_back(n);
    for (const std::string& n : r.required)
        if (r.class_of(n).value == f_false) return std::nullopt;
    r.min = std::max(a.min, b.min);
    r.max = a.max < 0 ? b.max : b.max < 0 ? a.max : std::min(a.max, b.max);
    if (r.max >= 0 && (r.min > r.max || int64_t(r.required.size()) > r.max)) return std::nullopt;
    return r;
}

value_set value_algebra::meet(const value_set& a, const value_set& b, const std::string& where) {
    if (a.is_every()) return b;
    if (b.is_every()) return a;
    value_set r;
    r.null_ok = a.null_ok && b.null_ok;
    r.bools = a.bools & b.bools;
    r.numbers = grammar::meet(a.numbers, b.numbers);
    r.strings = meet(a.strings, b.strings);
    for (const array_shape& x : a.arrays)
        for (const array_shape& y : b.arrays)
            if (auto m = meet(x, y)) r.arrays.push_back(std::move(*m));
    for (const object_shape& x : a.objects)
        for (const object_shape& y : b.objects)
            if (auto m = meet(x, y, where)) r.objects.push_back(std::move(*m));
    if (r.arrays.size() > max_terms || r.objects.size() > max_terms)
        reject("the schema {} combines into over {} alternative shapes of one type: too complex", where, max_terms);
    return r;
}

value_set value_algebra::join(value_set a, const value_set& b) {
    a.null_ok = a.null_ok || b.null_ok;
    a.bools |= b.bools;
    if (a.numbers.any || b.numbers.any) a.numbers = number_set::every();
    else a.numbers.d = a.numbers.d | b.numbers.d;
    if (b.strings.empty()) {
    } else if (a.strings.empty()) {
        a.strings = b.strings;
    } else if (a.strings.is_every() || b.strings.is_every()) {
        a.strings = string_set::every();
    } else if (a.strings.min_len == b.strings.min_len && a.strings.max_len == b.strings.max_len) {
        const int64_t lo = a.strings.min_len, hi = a.strings.max_len;
        a.strings = a.strings.all || b.strings.all ? string_set::every() : string_set::of(a.strings.d | b.strings.d);
        a.strings.min_len = lo;
        a.strings.max_len = hi;
    } else {
        a.strings = string_set::of(a.strings.language() | b.strings.language());
    }
    const auto any_array = [](const std::vector<array_shape>& v) {
        return std::any_of(v.begin(), v.end(), [](const array_shape& s) { return s.is_any(); });
    };
    const auto any_object = [](const std::vector<object_shape>& v) {
        return std::any_of(v.begin(), v.end(), [](const object_shape& s) { return s.is_any(); });
    };
    // A union with "any" is "any", unless a shape carries what unevaluated* needs to know.
    const auto evaluated = [](const std::vector<object_shape>& v) {
        return std::any_of(v.begin(), v.end(), [](const object_shape& s) {
            return std::any_of(s.classes.begin(), s.classes.end(), [](const member_class& c) { return c.evaluated; });
        });
    };
    const auto evaluated_items = [](const std::vector<array_shape>& v) {
        return std::any_of(v.begin(), v.end(), [](const array_shape& s) { return s.n_evaluated > 0 || s.all_evaluated; });
    };
    if ((any_array(a.arrays) || any_array(b.arrays)) && !evaluated_items(a.arrays) && !evaluated_items(b.arrays))
        a.arrays.assign(1, array_shape{});
    else a.arrays.insert(a.arrays.end(), b.arrays.begin(), b.arrays.end());
    if ((any_object(a.objects) || any_object(b.objects)) && !evaluated(a.objects) && !evaluated(b.objects))
        a.objects.assign(1, object_shape::any());
    else a.objects.insert(a.objects.end(), b.objects.begin(), b.objects.end());
    if (a.arrays.size() > max_terms || a.objects.size() > max_terms)
        reject("a union of over {} alternative shapes of one type: too complex", max_terms);
    return a;
}

std::vector<array_shape> value_algebra::complement(const array_shape& a, const std::string& where) {
    if (a.unique) reject("\"uniqueItems\" {} under \"not\" (or a oneOf or if that needs its complement) is not supported", where);
    std::vector<array_shape> out;
    if (a.min > 0) out.push_back({.max = a.min - 1});
    if (a.max >= 0) out.push_back({.min = a.max + 1});
    for (size_t i = 0; i < a.prefix.size(); ++i) {
        if (a.prefix[i] == f_true) continue;
        array_shape s;
        s.prefix.assign(i, f_true);
        s.prefix.push_back(f_.negate(a.prefix[i]));
        s.min = int64_t(i) + 1;
        out.push_back(std::move(s));
    }
    if (a.rest != f_true) {
        array_shape s;
        s.counts.push_back({f_.negate(a.rest), int64_t(a.prefix.size()), 1, -1});
        out.push_back(std::move(s));
    }
    for (const auto& c : a.counts) {
        if (c.min > 0) {
            array_shape s;
            s.counts.push_back({c.f, c.from, 0, c.min - 1});
            out.push_back(std::move(s));
        }
        if (c.max >= 0) {
            array_shape s;
            s.counts.push_back({c.f, c.from, c.max + 1, -1});
            out.push_back(std::move(s));
        }
    }
    return out;
}

std::vector<object_shape> value_algebra::complement(const object_shape& a, const std::string& where) {
    std::vector<object_shape> out;
    // A shape of any object but the members of one class: a name made a class of its own.
    const auto with_name = [](const std::string& name, formula_id value, bool required) {
        object_shape s;
        member_class c;
        c.named = true;
        c.name = name;
        c.value = value;
        s.classes.push_back(std::move(c));
        member_class rest;
        rest.keys = dfa::all() - dfa::of_strings({to_u32(name)});
        s.classes.push_back(std::move(rest));
        if (required) s.required.push_back(name);
        return s;
    };
    const auto with_region = [](const dfa& keys, formula_id value, int64_t min, int64_t max) {
        object_shape s;
        member_class c;
        c.keys = keys;
        c.value = value;
        c.min = min;
        c.max = max;
        s.classes.push_back(std::move(c));
        member_class rest;
        rest.keys = dfa::all() - keys;
        if (!rest.keys.empty()) s.classes.push_back(std::move(rest));
        return s;
    };
    for (const std::string& r : a.required) out.push_back(with_name(r, f_false, false));
    for (const member_class& c : a.classes) {
        if (c.named) {
            if (c.value != f_true) out.push_back(with_name(c.name, f_.negate(c.value), true));
            continue;
        }
        if (c.min > 0 || c.max >= 0) {
            if (c.max >= 1) // more than max: at least two keys, which duplicates could fake
                reject("the schema {} needs the complement of a count of properties: not supported", where);
            if (c.min > 0) out.push_back(with_region(c.keys, c.value, 0, c.min - 1));
            if (c.max == 0) out.push_back(with_region(c.keys, f_true, 1, 1));
        }
        // A key of the region with a value the region does not allow (exactly one such key in
        // the region, so that no duplicate key can hide it).
        if (c.value != f_true && c.max != 0) out.push_back(with_region(c.keys, f_.negate(c.value), 1, 1));
    }
    if (a.min > 0) {
        object_shape s = object_shape::any();
        s.max = a.min - 1;
        out.push_back(std::move(s));
    }
    if (a.max >= 0) {
        object_shape s = object_shape::any();
        s.min = a.max + 1;
        out.push_back(std::move(s));
    }
    return out;
}

value_set value_algebra::complement(const value_set& a, dialect, const std::string& where) {
    value_set r;
    r.null_ok = !a.null_ok;
    r.bools = uint8_t(~a.bools & 3);
    if (!a.numbers.any) r.numbers = {false, number_universe() - a.numbers.d};
    if (!a.strings.is_every()) r.strings = string_set::of(a.strings.language().complement());
    r.arrays.emplace_back();
    for (const array_shape& s : a.arrays) {
        std::vector<array_shape> next;
        for (const array_shape& x : r.arrays)
            for (const array_shape& y : complement(s, where))
                if (auto m = meet(x, y)) next.push_back(std::move(*m));
        if (next.size() > max_terms) reject("the complement of the schema {} has over {} shapes: too complex", where, max_terms);
        r.arrays = std::move(next);
    }
    r.objects.push_back(object_shape::any());
    for (const object_shape& s : a.objects) {
        std::vector<object_shape> next;
        for (const object_shape& x : r.objects)
            for (const object_shape& y : complement(s, where))
                if (auto m = meet(x, y, where)) next.push_back(std::move(*m));
        if (next.size() > max_terms) reject("the complement of the schema {} has over {} shapes: too complex", where, max_terms);
        r.objects = std::move(next);
    }
    return r;
}

} // namespace tandem::grammar
