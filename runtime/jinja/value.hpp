// Jinja values: Python's data model as chat templates see it (undefined, none, bool, int,
// float, str, list/tuple, dict, callables), with Python's str/repr, equality and ordering.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::jinja {

// A template error: syntax at load, or an error raised while rendering (Jinja2's
// TemplateSyntaxError, UndefinedError, TypeError, SecurityError, raise_exception).
class error : public std::runtime_error {
public:
    error(const std::string& what, int line = 0)
        : std::runtime_error(line > 0 ? what + " (line " + std::to_string(line) + ")" : what), line_(line) {}
    int line() const { return line_; }

private:
    int line_;
};

struct value;
struct list_obj;
struct dict_obj;
struct func_obj;

// Jinja2's default Undefined: prints as "", iterates as empty, is false; any other use fails
// naming what was undefined. `unsafe` marks a sandbox refusal (an attribute the immutable
// sandbox does not give out), reported as such when used.
struct undefined_t {
    std::string hint;
    bool unsafe = false;
};

using list_ptr = std::shared_ptr<list_obj>;
using dict_ptr = std::shared_ptr<dict_obj>;
using func_ptr = std::shared_ptr<func_obj>;

struct value {
    std::variant<undefined_t, std::nullptr_t, bool, int64_t, double, std::string, list_ptr, dict_ptr, func_ptr> v;

    value() : v(undefined_t{}) {}
    value(std::nullptr_t) : v(nullptr) {}
    value(bool b) : v(b) {}
    value(int i) : v(int64_t(i)) {}
    value(int64_t i) : v(i) {}
    value(size_t i) : v(int64_t(i)) {}
    value(double d) : v(d) {}
    value(std::string s) : v(std::move(s)) {}
    value(std::string_view s) : v(std::string(s)) {}
    value(const char* s) : v(std::string(s)) {}
    value(list_ptr l) : v(std::move(l)) {}
    value(dict_ptr d) : v(std::move(d)) {}
    value(func_ptr f) : v(std::move(f)) {}
    static value undefined(std::string hint = {}) { value x; x.v = undefined_t{std::move(hint), false}; return x; }

    bool is_undefined() const { return std::holds_alternative<undefined_t>(v); }
    bool is_none() const { return std::holds_alternative<std::nullptr_t>(v); }
    bool is_bool() const { return std::holds_alternative<bool>(v); }
    bool is_int() const { return std::holds_alternative<int64_t>(v); }
    bool is_float() const { return std::holds_alternative<double>(v); }
    bool is_number() const { return is_int() || is_float() || is_bool(); }
    bool is_string() const { return std::holds_alternative<std::string>(v); }
    bool is_list() const { return std::holds_alternative<list_ptr>(v); }
    bool is_dict() const { return std::holds_alternative<dict_ptr>(v); }
    bool is_func() const { return std::holds_alternative<func_ptr>(v); }

    const std::string& str() const { return std::get<std::string>(v); }
    const list_ptr& list() const { return std::get<list_ptr>(v); }
    const dict_ptr& dict() const { return std::get<dict_ptr>(v); }
    const func_ptr& func() const { return std::get<func_ptr>(v); }
    const undefined_t& undef() const { return std::get<undefined_t>(v); }
    double as_double() const;      // numbers (bool as 0/1)
    int64_t as_int() const;        // int and bool
};

struct list_obj {
    std::vector<value> items;
    bool tuple = false;
};

// An ordered dict with string keys (chat templates index by strings); a namespace() is a
// dict whose attributes can be set.
struct dict_obj {
    std::vector<std::pair<std::string, value>> items;
    bool is_namespace = false;
    bool is_loop = false;

    const value* find(std::string_view key) const;
    value* find(std::string_view key);
    void set(std::string key, value v);
};

struct kwarg {
    std::string name;
    value v;
};

struct call_args {
    std::vector<value> pos;
    std::vector<kwarg> kw;
    // The argument at `i` or named `name`, or undefined.
    const value* get(size_t i, std::string_view name) const;
};

class evaluator;

// A callable: a global (range, namespace, raise_exception, ...), a bound method, a macro or
// caller(), loop.cycle.
struct func_obj {
    std::string name;
    std::function<value(evaluator&, call_args&)> fn;
};

value make_list(std::vector<value> items = {}, bool tuple = false);
value make_dict();
value make_func(std::string name, std::function<value(evaluator&, call_args&)> fn);

// From JSON (objects keep their key order) and back (undefined is refused).
value from_json(const nlohmann::ordered_json& j);

// Python's truthiness (Jinja's `if x`).
bool truthy(const value& x);

// Python's str() (Jinja's output of `{{ x }}`), and repr() for items inside containers.
std::string to_str(const value& x);
std::string repr(const value& x);
std::string python_float(double d);

// Python's json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
// as Hugging Face's tojson runs it. indent < 0: none.
std::string to_json(const value& x, int indent, bool sort_keys, const std::string* item_sep = nullptr,
                    const std::string* key_sep = nullptr, bool ensure_ascii = false);

// Python's == (1 == 1.0 == True; lists and dicts compared item by item).
bool equals(const value& a, const value& b);
// Python's < for numbers, strings and sequences; throws for other pairs.
bool less(const value& a, const value& b);

// A value's type name as Python says it ("str", "list", "dict", "NoneType", ...).
std::string type_name(const value& x);

// The budget of the recursive value operations (str/repr, tojson, ==, <) in this thread: a
// list can hold one list twice, so a few `set a = [a, a]` make a value whose walk is
// exponential. A render sets it from its limits; exceeding it is an error.
struct value_budget {
    uint64_t steps = 64'000'000;
    size_t max_bytes = size_t(64) << 20;
};
void set_value_budget(const value_budget& b);

// UTF-8 code point counts and slicing by code points (Python's str indexing).
size_t n_code_points(std::string_view s);
std::vector<std::string> code_points(std::string_view s);

} // namespace tandem::jinja
