// Jinja builtins besides filters: attribute and item access (the immutable sandbox's view of
// Python's str, list and dict methods), iteration, slicing, tests, globals, % formatting.
#include "runtime/jinja/evaluator.hpp"
#include "runtime/jinja/strings.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>

namespace tandem::jinja {

namespace {

value method(std::string name, std::function<value(evaluator&, call_args&)> fn) {
    return make_func(std::move(name), std::move(fn));
}

std::string arg_str(const call_args& a, size_t i, const char* name, const char* fn) {
    const value* v = a.get(i, name);
    if (!v || !v->is_string()) throw error(std::string(fn) + "() argument must be str");
    return v->str();
}

value unsafe(const value& obj, const std::string& name) {
    value u = value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
    std::get<undefined_t>(u.v).unsafe = true;
    return u;
}

value string_method(evaluator& ev, const std::string& s, const std::string& name) {
    (void)ev;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        return method(name, [s, name](evaluator&, call_args& a) -> value {
            const value* c = a.get(0, "chars");
            const bool custom = c && !c->is_none();
            if (custom && !c->is_string()) throw error(name + " arg must be None or str");
            const std::string chars = custom ? c->str() : std::string();
            return value(py_strip(s, custom ? &chars : nullptr, name != "rstrip", name != "lstrip"));
        });
    }
    if (name == "split" || name == "rsplit") {
        return method(name, [s, name](evaluator& ev, call_args& a) -> value {
            const value* sep = a.get(0, "sep");
            const value* mx = a.get(1, "maxsplit");
            const int64_t maxsplit = mx && !mx->is_none() ? mx->as_int() : -1;
            std::vector<std::string> parts;
            if (sep && !sep->is_none()) {
                if (!sep->is_string()) throw error("must be str or None");
                if (sep->str().empty()) throw error("empty separator");
                parts = name == "split" ? py_split(s, sep->str(), maxsplit) : py_rsplit(s, sep->str(), maxsplit);
            } else {
                parts = py_split_ws(s, maxsplit, name == "rsplit");
            }
            std::vector<value> items;
            for (auto& p : parts) {
                ev.tick();
                items.emplace_back(std::move(p));
            }
            return make_list(std::move(items));
        });
    }
    if (name == "splitlines") {
        return method(name, [s](evaluator&, call_args&) -> value {
            std::vector<value> items;
            size_t start = 0;
            for (size_t i = 0; i < s.size(); ++i)
                if (s[i] == '\n' || s[i] == '\r') {
                    items.emplace_back(s.substr(start, i - start));
                    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
                    start = i + 1;
                }
            if (start < s.size()) items.emplace_back(s.substr(start));
            return make_list(std::move(items));
        });
    }
    if (name == "startswith" || name == "endswith") {
        return method(name, [s, name](evaluator&, call_args& a) -> value {
            const value* p = a.get(0, "prefix");
            if (!p) throw error(name + "() takes at least 1 argument");
            std::vector<std::string> cands;
            if (p->is_string()) cands.push_back(p->str());
            else if (p->is_list())
                for (const auto& x : p->list()->items) {
                    if (!x.is_string()) throw error("tuple for " + name + " must only contain str");
                    cands.push_back(x.str());
                }
            else throw error(name + " first arg must be str or a tuple of str");
            for (const auto& c : cands)
                if (name == "startswith" ? std::string_view(s).starts_with(c) : std::string_view(s).ends_with(c))
                    return value(true);
            return value(false);
        });
    }
    if (name == "replace") {
        return method(name, [s](evaluator& ev, call_args& a) -> value {
            const value* c = a.get(2, "count");
            std::string r = py_replace(s, arg_str(a, 0, "old", "replace"), arg_str(a, 1, "new", "replace"),
                                       c ? c->as_int() : -1, ev.options().limits.max_output);
            return value(std::move(r));
        });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
        return method(name, [s, name](evaluator&, call_args&) -> value {
            if (name == "upper") return value(ascii_upper(s));
            if (name == "lower") return value(ascii_lower(s));
            if (name == "title") return value(py_title(s));
            if (name == "capitalize") return value(py_capitalize(s));
            std::string r = s;
            for (char& ch : r)
                ch = std::isupper(static_cast<unsigned char>(ch)) ? char(std::tolower(static_cast<unsigned char>(ch)))
                                                                  : char(std::toupper(static_cast<unsigned char>(ch)));
            return value(std::move(r));
        });
    }
    if (name == "count" || name == "find" || name == "rfind" || name == "index" || name == "rindex") {
        return method(name, [s, name](evaluator&, call_args& a) -> value {
            const std::string sub = arg_str(a, 0, "sub", name.c_str());
            if (name == "count") {
                if (sub.empty()) return value(int64_t(n_code_points(s) + 1));
                int64_t n = 0;
                for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
                return value(n);
            }
            const size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
            if (p == std::string::npos) {
                if (name.find("index") != std::string::npos) throw error("substring not found");
                return value(int64_t(-1));
            }
            return value(int64_t(n_code_points(std::string_view(s).substr(0, p))));
        });
    }
    if (name == "join") {
        return method(name, [s](evaluator& ev, call_args& a) -> value {
            if (a.pos.empty()) throw error("join() takes exactly one argument");
            std::string r;
            bool first = true;
            for (const auto& x : iterate(a.pos[0], 0)) {
                if (!x.is_string()) throw error("sequence item: expected str instance, " + type_name(x) + " found");
                if (!first) r += s;
                first = false;
                r += x.str();
                ev.check_size(r.size());
            }
            return value(std::move(r));
        });
    }
    if (name == "format") {
        return method(name, [s](evaluator& ev, call_args& a) -> value { return value(py_str_format(ev, s, a)); });
    }
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
        name == "islower" || name == "isnumeric" || name == "isdecimal") {
        return method(name, [s, name](evaluator&, call_args&) -> value { return value(py_is(s, name)); });
    }
    if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
        return method(name, [s, name](evaluator& ev, call_args& a) -> value {
            const value* w = a.get(0, "width");
            if (!w) throw error(name + "() takes at least 1 argument");
            const int64_t width = w->as_int();
            ev.check_size(size_t(std::max<int64_t>(0, width)));
            const int64_t n = int64_t(n_code_points(s));
            if (width <= n) return value(s);
            const size_t pad = size_t(width - n);
            if (name == "zfill") return value(std::string(pad, '0') + s);
            if (name == "ljust") return value(s + std::string(pad, ' '));
            if (name == "rjust") return value(std::string(pad, ' ') + s);
            const size_t left = pad / 2 + (pad & size_t(n) & 1);
            return value(std::string(left, ' ') + s + std::string(pad - left, ' '));
        });
    }
    return value::undefined("'str object' has no attribute '" + name + "'");
}

bool is_mutator(const std::string& name, bool dict) {
    static const char* const list_m[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
    static const char* const dict_m[] = {"pop", "popitem", "clear", "setdefault", "update"};
    if (dict) {
        for (const char* m : dict_m)
            if (name == m) return true;
    } else {
        for (const char* m : list_m)
            if (name == m) return true;
    }
    return false;
}

value pairs_of(const dict_obj& d) {
    std::vector<value> items;
    for (const auto& [k, v] : d.items) items.push_back(make_list({value(k), v}, true));
    return make_list(std::move(items));
}

} // namespace

std::vector<value> iterate(const value& v, int line) {
    if (v.is_list()) return v.list()->items;
    if (v.is_dict()) {
        if (v.dict()->is_namespace || v.dict()->is_loop) throw error("'" + type_name(v) + "' object is not iterable", line);
        std::vector<value> keys;
        for (const auto& kv : v.dict()->items) keys.emplace_back(kv.first);
        return keys;
    }
    if (v.is_string()) {
        std::vector<value> out;
        for (auto& c : code_points(v.str())) out.emplace_back(std::move(c));
        return out;
    }
    if (v.is_undefined()) return {};
    throw error("'" + type_name(v) + "' object is not iterable", line);
}

value get_attr(evaluator& ev, const value& obj, const std::string& name) {
    if (obj.is_undefined()) {
        const auto& u = obj.undef();
        throw error(u.hint.empty() ? "'" + name + "' of an undefined value" : u.hint);
    }
    if (!name.empty() && name[0] == '_') return unsafe(obj, name);
    if (obj.is_dict()) {
        const dict_obj& d = *obj.dict();
        if (!d.is_namespace && !d.is_loop) {
            const dict_ptr dp = obj.dict();
            if (name == "items") return method(name, [dp](evaluator&, call_args&) { return pairs_of(*dp); });
            if (name == "keys" || name == "values") {
                const bool keys = name == "keys";
                return method(name, [dp, keys](evaluator&, call_args&) {
                    std::vector<value> items;
                    for (const auto& [k, v] : dp->items) items.push_back(keys ? value(k) : v);
                    return make_list(std::move(items));
                });
            }
            if (name == "get") {
                return method(name, [dp](evaluator&, call_args& a) -> value {
                    const value* k = a.get(0, "key");
                    if (!k) throw error("get expected at least 1 argument, got 0");
                    if (k->is_string())
                        if (const value* v = dp->find(k->str())) return *v;
                    const value* d = a.get(1, "default");
                    return d ? *d : value(nullptr);
                });
            }
            if (name == "copy") return method(name, [dp](evaluator&, call_args&) -> value {
                auto c = std::make_shared<dict_obj>(*dp);
                return value(std::move(c));
            });
            if (is_mutator(name, true)) return unsafe(obj, name);
        }
        if (const value* v = d.find(name)) return *v;
        return value::undefined("'" + std::string(d.is_namespace ? "Namespace" : "dict object") +
                                "' has no attribute '" + name + "'");
    }
    if (obj.is_string()) return string_method(ev, obj.str(), name);
    if (obj.is_list()) {
        if (is_mutator(name, false)) return unsafe(obj, name);
        const list_ptr lp = obj.list();
        if (name == "index" || name == "count") {
            const bool count = name == "count";
            return method(name, [lp, count](evaluator&, call_args& a) -> value {
                if (a.pos.empty()) throw error("expected 1 argument");
                int64_t n = 0;
                for (size_t i = 0; i < lp->items.size(); ++i)
                    if (equals(lp->items[i], a.pos[0])) {
                        if (!count) return value(int64_t(i));
                        ++n;
                    }
                if (!count) throw error(repr(a.pos[0]) + " is not in list");
                return value(n);
            });
        }
        return value::undefined("'list object' has no attribute '" + name + "'");
    }
    return value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

namespace {

// Python's index normalisation; false when out of range.
bool norm_index(int64_t& i, size_t n) {
    if (i < 0) i += int64_t(n);
    return i >= 0 && i < int64_t(n);
}

} // namespace

value get_item(evaluator& ev, const value& obj, const value& key) {
    if (obj.is_undefined()) {
        const auto& u = obj.undef();
        throw error(u.hint.empty() ? "subscript of an undefined value" : u.hint);
    }
    if (obj.is_dict()) {
        if (key.is_string()) {
            if (const value* v = obj.dict()->find(key.str())) return *v;
            if (!obj.dict()->is_namespace && !obj.dict()->is_loop) {
                // Jinja2 falls back to the attribute: methods such as items
                value a = get_attr(ev, obj, key.str());
                if (a.is_func()) return a;
            }
            return value::undefined("'dict object' has no attribute '" + key.str() + "'");
        }
        return value::undefined("'dict object' has no attribute " + repr(key));
    }
    if (obj.is_list() || obj.is_string()) {
        if (key.is_string()) return get_attr(ev, obj, key.str());
        if (!key.is_int() && !key.is_bool()) return value::undefined("bad index " + repr(key));
        int64_t i = key.as_int();
        if (obj.is_list()) {
            if (!norm_index(i, obj.list()->items.size()))
                return value::undefined("'list object' has no attribute '" + std::to_string(key.as_int()) + "'");
            return obj.list()->items[size_t(i)];
        }
        const std::string& s = obj.str();
        bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
        if (ascii) {
            if (!norm_index(i, s.size())) return value::undefined("string index out of range");
            return value(std::string(1, s[size_t(i)]));
        }
        auto cps = code_points(s);
        if (!norm_index(i, cps.size())) return value::undefined("string index out of range");
        return value(cps[size_t(i)]);
    }
    if (key.is_string()) return get_attr(ev, obj, key.str());
    return value::undefined("'" + type_name(obj) + " object' has no attribute " + repr(key));
}

value slice_of(evaluator& ev, const value& obj, const value& start, const value& stop, const value& step) {
    if (obj.is_undefined()) throw error(obj.undef().hint.empty() ? "slice of an undefined value" : obj.undef().hint);
    auto opt_int = [](const value& v) -> std::optional<int64_t> {
        if (v.is_none()) return std::nullopt;
        if (!v.is_int() && !v.is_bool()) throw error("slice indices must be integers or None");
        return v.as_int();
    };
    const int64_t st = opt_int(step).value_or(1);
    if (st == 0) throw error("slice step cannot be zero");
    std::vector<value> items;
    std::vector<std::string> cps;
    size_t n = 0;
    if (obj.is_list()) n = obj.list()->items.size();
    else if (obj.is_string()) {
        cps = code_points(obj.str());
        n = cps.size();
    } else throw error("'" + type_name(obj) + "' object is not subscriptable");
    const int64_t len = int64_t(n);
    auto clamp = [&](std::optional<int64_t> v, int64_t def) {
        if (!v) return def;
        int64_t i = *v;
        if (i < 0) i += len;
        if (st > 0) return std::clamp<int64_t>(i, 0, len);
        return std::clamp<int64_t>(i, -1, len - 1);
    };
    const int64_t b = clamp(opt_int(start), st > 0 ? 0 : len - 1);
    const int64_t e = clamp(opt_int(stop), st > 0 ? len : -1);
    std::string s;
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
        ev.tick();
        if (obj.is_list()) items.push_back(obj.list()->items[size_t(i)]);
        else s += cps[size_t(i)];
    }
    if (obj.is_string()) return value(std::move(s));
    return make_list(std::move(items), obj.list()->tuple);
}

bool is_test(const std::string& name) {
    static const char* const names[] = {
        "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string", "mapping",
        "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt",
        "lessthan", "<", "gt", "greaterthan", ">", "le", "<=", "ge", ">=", "in", "sameas", "lower", "upper", "escaped"};
    for (const char* n : names)
        if (name == n) return true;
    return false;
}

bool apply_test(evaluator& ev, const std::string& name, const value& v, call_args& a, int line) {
    auto arg = [&](size_t i) -> const value& {
        if (i >= a.pos.size()) throw error("test '" + name + "' expects an argument", line);
        return a.pos[i];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && std::get<bool>(v.v);
    if (name == "false") return v.is_bool() && !std::get<bool>(v.v);
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict() && !v.dict()->is_namespace && !v.dict()->is_loop;
    if (name == "iterable") return v.is_list() || v.is_string() || v.is_undefined() || (v.is_dict() && !v.dict()->is_namespace);
    if (name == "sequence") return v.is_list() || v.is_string() || (v.is_dict() && !v.dict()->is_namespace);
    if (name == "callable") return v.is_func();
    if (name == "odd" || name == "even") {
        if (!v.is_int() && !v.is_bool()) throw error("odd/even of a non-integer", line);
        return (v.as_int() % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
        const int64_t d = arg(0).as_int();
        if (d == 0) throw error("integer division or modulo by zero", line);
        return v.as_int() % d == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg(0));
    if (name == "ne" || name == "!=") return !equals(v, arg(0));
    if (name == "lt" || name == "lessthan" || name == "<") return less(v, arg(0));
    if (name == "gt" || name == "greaterthan" || name == ">") return less(arg(0), v);
    if (name == "le" || name == "<=") return !less(arg(0), v);
    if (name == "ge" || name == ">=") return !less(v, arg(0));
    if (name == "in") {
        const value& c = arg(0);
        if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
        if (c.is_dict()) return v.is_string() && c.dict()->find(v.str());
        for (const auto& x : iterate(c, line))
            if (equals(v, x)) return true;
        return false;
    }
    if (name == "sameas") {
        const value& o = arg(0);
        if (v.v.index() != o.v.index()) return false;
        if (v.is_list()) return v.list() == o.list();
        if (v.is_dict()) return v.dict() == o.dict();
        return equals(v, o);
    }
    if (name == "lower") return v.is_string() && ascii_lower(v.str()) == v.str();
    if (name == "upper") return v.is_string() && ascii_upper(v.str()) == v.str();
    if (name == "escaped") return false;
    (void)ev;
    throw error("No test named '" + name + "'.", line);
}

std::string strftime_at(std::time_t t, const std::string& fmt, bool utc) {
    if (fmt.size() > 256) throw error("strftime_now: format too long");
    std::tm tm{};
    if (utc) gmtime_r(&t, &tm);
    else localtime_r(&t, &tm);
    char buf[1024];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) return {};
    return std::string(buf, n);
}

void install_globals(frame& g) {
    g.set("range", make_func("range", [](evaluator& ev, call_args& a) -> value {
              if (a.pos.empty() || a.pos.size() > 3) throw error("range expected 1 to 3 arguments");
              int64_t start = 0, stop, step = 1;
              if (a.pos.size() == 1) stop = a.pos[0].as_int();
              else {
                  start = a.pos[0].as_int();
                  stop = a.pos[1].as_int();
                  if (a.pos.size() == 3) step = a.pos[2].as_int();
              }
              if (step == 0) throw error("range() arg 3 must not be zero");
              std::vector<value> items;
              for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                  ev.tick();
                  items.emplace_back(i);
              }
              return make_list(std::move(items));
          }));
    g.set("dict", make_func("dict", [](evaluator&, call_args& a) -> value {
              auto d = std::make_shared<dict_obj>();
              if (!a.pos.empty()) {
                  if (a.pos[0].is_dict()) *d = *a.pos[0].dict();
                  else
                      for (const auto& p : iterate(a.pos[0], 0)) {
                          if (!p.is_list() || p.list()->items.size() != 2 || !p.list()->items[0].is_string())
                              throw error("dict(): expected pairs of a string key and a value");
                          d->set(p.list()->items[0].str(), p.list()->items[1]);
                      }
                  d->is_namespace = d->is_loop = false;
              }
              for (const auto& k : a.kw) d->set(k.name, k.v);
              return value(std::move(d));
          }));
    g.set("namespace", make_func("namespace", [](evaluator& ev, call_args& a) -> value {
              auto d = std::make_shared<dict_obj>();
              ev.adopt(d);
              if (!a.pos.empty() && a.pos[0].is_dict())
                  for (const auto& [k, v] : a.pos[0].dict()->items) d->set(k, v);
              for (const auto& k : a.kw) d->set(k.name, k.v);
              d->is_namespace = true;
              return value(std::move(d));
          }));
    g.set("raise_exception", make_func("raise_exception", [](evaluator&, call_args& a) -> value {
              throw error(a.pos.empty() ? std::string("raise_exception") : to_str(a.pos[0]));
          }));
    g.set("strftime_now", make_func("strftime_now", [](evaluator&, call_args& a) -> value {
              const value* fmt = a.get(0, "format");
              if (!fmt || !fmt->is_string()) throw error("strftime_now expects a format string");
              return value(strftime_at(std::time(nullptr), fmt->str(), false));
          }));
    g.set("joiner", make_func("joiner", [](evaluator&, call_args& a) -> value {
              const std::string sep = a.pos.empty() ? ", " : to_str(a.pos[0]);
              auto used = std::make_shared<bool>(false);
              return make_func("joiner", [sep, used](evaluator&, call_args&) -> value {
                  if (!*used) {
                      *used = true;
                      return value(std::string());
                  }
                  return value(sep);
              });
          }));
}

value python_format(evaluator& ev, const std::string& fmt, const value& args) {
    std::vector<value> pos;
    if (args.is_list() && args.list()->tuple) pos = args.list()->items;
    else pos.push_back(args);
    std::string out;
    size_t k = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out.push_back(fmt[i]);
            continue;
        }
        if (++i >= fmt.size()) throw error("incomplete format");
        const char c = fmt[i];
        if (c == '%') {
            out.push_back('%');
            continue;
        }
        // %[flags][width][.precision]type, as str.format's spec
        std::string flags;
        size_t j = i;
        while (j < fmt.size() && std::strchr("-+ 0#", fmt[j])) flags += fmt[j++];
        std::string width, prec;
        while (j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j]))) width += fmt[j++];
        bool has_prec = false;
        if (j < fmt.size() && fmt[j] == '.') {
            has_prec = true;
            ++j;
            while (j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j]))) prec += fmt[j++];
        }
        if (j >= fmt.size()) throw error("incomplete format");
        const char t = fmt[j];
        i = j;
        if (k >= pos.size()) throw error("not enough arguments for format string");
        const value& v = pos[k++];
        std::string spec;
        if (flags.find('-') != std::string::npos) spec += '<';
        else if (!width.empty()) spec += '>';
        if (flags.find('+') != std::string::npos) spec += '+';
        else if (flags.find(' ') != std::string::npos) spec += ' ';
        if (flags.find('0') != std::string::npos && flags.find('-') == std::string::npos) spec = spec.empty() || spec == ">" ? "0" : spec + "0";
        spec += width;
        if (has_prec) spec += "." + (prec.empty() ? std::string("0") : prec);
        if (t == 's' || t == 'r') {
            const value sv(t == 's' ? to_str(v) : repr(v));
            out += format_spec(sv, spec);
        } else if (t == 'd' || t == 'i' || t == 'u') {
            if (!v.is_number()) throw error("%d format: a real number is required, not " + type_name(v));
            out += format_spec(value(v.is_float() ? int64_t(v.as_double()) : v.as_int()), spec + "d");
        } else if (std::strchr("fFeEgGxXo", t)) {
            if (!v.is_number()) throw error(std::string("%") + t + " format: a real number is required, not " + type_name(v));
            out += format_spec(std::strchr("xXo", t) && v.is_bool() ? value(v.as_int()) : v, spec + t);
        } else {
            throw error(std::string("unsupported format character '") + t + "'");
        }
        ev.check_size(out.size());
    }
    if (k < pos.size()) throw error("not all arguments converted during string formatting");
    return value(std::move(out));
}

} // namespace tandem::jinja
