// Jinja evaluator: statements (scopes as Jinja2 has them: a for loop's body is a new scope
// each iteration, if is not a scope, macros close over their defining scope) and
// expressions with Python's operators.
#include "runtime/jinja/evaluator.hpp"

#include "runtime/jinja/lexer.hpp"
#include "runtime/jinja/parser.hpp"

#include <cmath>

namespace tandem::jinja {

const value* frame::find(std::string_view name) const {
    for (const frame* f = this; f; f = f->parent.get())
        for (const auto& [k, v] : f->vars)
            if (k == name) return &v;
    return nullptr;
}

void frame::set(const std::string& name, value v) {
    for (auto& [k, x] : vars)
        if (k == name) {
            x = std::move(v);
            return;
        }
    vars.emplace_back(name, std::move(v));
}

evaluator::evaluator(const render_options& opt, frame_ptr globals)
    : opt_(opt), globals_(std::move(globals)), deadline_(std::chrono::steady_clock::now() + opt.limits.max_time) {
    value_budget b;
    b.steps = opt.limits.max_iterations * 16;
    b.max_bytes = opt.limits.max_output;
    set_value_budget(b);
}

evaluator::~evaluator() {
    for (auto& f : owned_frames_) f->vars.clear();
    for (auto& d : owned_dicts_) d->items.clear();
}

void evaluator::tick() {
    if (++n_ticks_ > opt_.limits.max_iterations)
        throw error("template exceeded " + std::to_string(opt_.limits.max_iterations) + " loop iterations");
    if ((n_ticks_ & 63) == 0 && std::chrono::steady_clock::now() > deadline_)
        throw error("template exceeded its time limit of " + std::to_string(opt_.limits.max_time.count()) + " ms");
}

void evaluator::check_size(size_t n) const {
    if (n > opt_.limits.max_output)
        throw error("template output exceeded " + std::to_string(opt_.limits.max_output) + " bytes");
}

void evaluator::exec(const body& b, const frame_ptr& f, std::string& out) {
    if (run(b, f, out) != flow::normal) throw error("break or continue outside a loop");
}

evaluator::flow evaluator::run(const body& b, const frame_ptr& f, std::string& out) {
    for (const auto& s : b) {
        const flow fl = run_stmt(*s, f, out);
        if (fl != flow::normal) return fl;
    }
    return flow::normal;
}

namespace {

struct depth_guard {
    int& d;
    depth_guard(int& d_, int max, const char* what) : d(d_) {
        if (++d > max) {
            --d;
            throw error(std::string(what) + " nested too deeply (limit " + std::to_string(max) + ")");
        }
    }
    ~depth_guard() { --d; }
};

frame_ptr child(const frame_ptr& parent) {
    auto f = std::make_shared<frame>();
    f->parent = parent;
    return f;
}

} // namespace

evaluator::flow evaluator::run_stmt(const stmt& s, const frame_ptr& f, std::string& out) {
    try {
        switch (s.kind) {
        case st::text:
            check_size(out.size() + s.text.size());
            out += s.text;
            return flow::normal;
        case st::output: {
            const std::string text = to_str(eval(*s.e, f));
            check_size(out.size() + text.size());
            out += text;
            return flow::normal;
        }
        case st::if_:
            for (size_t i = 0; i < s.conds.size(); ++i)
                if (truthy(eval(*s.conds[i], f))) return run(s.branches[i], f, out);
            if (s.branches.size() > s.conds.size()) return run(s.branches.back(), f, out);
            return flow::normal;
        case st::for_: run_for(s, f, out); return flow::normal;
        case st::set: {
            value v = eval(*s.e, f);
            if (!s.attr.empty()) {
                const value* ns = f->find(s.targets[0]);
                if (!ns || !ns->is_dict() || !ns->dict()->is_namespace)
                    throw error("cannot assign attribute on non-namespace object", s.line);
                ns->dict()->set(s.attr, std::move(v));
            } else {
                assign(s.targets, v, f, s.line);
            }
            return flow::normal;
        }
        case st::set_block: {
            std::string text;
            exec(s.inner, f, text);
            value v(std::move(text));
            if (s.e) {
                auto inner = child(f);
                inner->set(body_placeholder, std::move(v));
                v = eval(*s.e, inner);
            }
            f->set(s.targets[0], std::move(v));
            return flow::normal;
        }
        case st::macro: f->set(s.text, make_macro(s, f)); return flow::normal;
        case st::call_block: {
            const value caller = make_macro(s, f);
            call_args args;
            args_of(*s.e, f, args);
            args.kw.push_back({"caller", caller});
            const value callee = eval(*s.e->args[0], f);
            const std::string text = to_str(call(callee, args, s.line));
            check_size(out.size() + text.size());
            out += text;
            return flow::normal;
        }
        case st::filter_block: {
            std::string text;
            exec(s.inner, f, text);
            auto inner = child(f);
            inner->set(body_placeholder, value(std::move(text)));
            const std::string r = to_str(eval(*s.e, inner));
            check_size(out.size() + r.size());
            out += r;
            return flow::normal;
        }
        case st::break_: return flow::break_;
        case st::continue_: return flow::continue_;
        case st::scope: {
            auto inner = child(f);
            for (const auto& p : s.params) inner->set(p.name, eval(*p.def, f));
            return run(s.inner, s.params.empty() ? f : inner, out);
        }
        }
    } catch (const error& e) {
        if (e.line() == 0) throw error(e.what(), s.line);
        throw;
    }
    return flow::normal;
}

void evaluator::assign(const std::vector<std::string>& targets, const value& v, const frame_ptr& f, int line) {
    if (targets.size() == 1) {
        f->set(targets[0], v);
        return;
    }
    std::vector<value> items = iterate(v, line);
    if (items.size() != targets.size())
        throw error(items.size() < targets.size()
                        ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                              std::to_string(items.size()) + ")"
                        : "too many values to unpack (expected " + std::to_string(targets.size()) + ")",
                    line);
    for (size_t i = 0; i < targets.size(); ++i) f->set(targets[i], items[i]);
}

void evaluator::run_for(const stmt& s, const frame_ptr& f, std::string& out) {
    const value seq = eval(*s.e, f);
    std::vector<value> items = iterate(seq, s.line);
    if (s.cond) {
        std::vector<value> kept;
        for (auto& it : items) {
            tick();
            auto probe = child(f);
            assign(s.targets, it, probe, s.line);
            if (truthy(eval(*s.cond, probe))) kept.push_back(std::move(it));
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        if (!s.else_body.empty()) exec(s.else_body, f, out);
        return;
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
        tick();
        auto inner = child(f);
        auto loop = std::make_shared<dict_obj>();
        loop->is_loop = true;
        loop->set("index0", value(i));
        loop->set("index", value(i + 1));
        loop->set("revindex", value(n - i));
        loop->set("revindex0", value(n - i - 1));
        loop->set("first", value(i == 0));
        loop->set("last", value(i == n - 1));
        loop->set("length", value(n));
        loop->set("depth", value(1));
        loop->set("depth0", value(0));
        if (i > 0) loop->set("previtem", items[size_t(i - 1)]);
        if (i + 1 < n) loop->set("nextitem", items[size_t(i + 1)]);
        loop->set("cycle", make_func("cycle", [i](evaluator&, call_args& a) -> value {
                      if (a.pos.empty()) throw error("no items for cycling given");
                      return a.pos[size_t(i) % a.pos.size()];
                  }));
        loop->set("changed", make_func("changed", [](evaluator&, call_args&) -> value { return value(true); }));
        inner->set("loop", value(std::move(loop)));
        assign(s.targets, items[size_t(i)], inner, s.line);
        if (run(s.inner, inner, out) == flow::break_) break;
    }
}

value evaluator::make_macro(const stmt& s, const frame_ptr& f) {
    owned_frames_.push_back(f);
    const stmt* sp = &s;
    frame_ptr closure = f;
    const std::string name = s.kind == st::macro ? s.text : "caller";
    return make_func(name, [sp, closure, name](evaluator& ev, call_args& a) -> value {
        depth_guard g(ev.depth_, ev.opt_.limits.max_depth, "macro calls");
        ev.tick();
        auto inner = child(closure);
        size_t used = 0;
        for (size_t i = 0; i < sp->params.size(); ++i) {
            const param& p = sp->params[i];
            const value* v = nullptr;
            for (const auto& k : a.kw)
                if (k.name == p.name) v = &k.v;
            if (!v && i < a.pos.size()) {
                v = &a.pos[i];
                ++used;
            }
            if (v) inner->set(p.name, *v);
            else if (p.def) inner->set(p.name, ev.eval(*p.def, inner));
            else inner->set(p.name, value::undefined("parameter '" + p.name + "' was not provided"));
        }
        std::vector<value> rest(a.pos.begin() + std::ptrdiff_t(std::min(used, a.pos.size())), a.pos.end());
        if (a.pos.size() > sp->params.size())
            rest.assign(a.pos.begin() + std::ptrdiff_t(sp->params.size()), a.pos.end());
        else
            rest.clear();
        inner->set("varargs", make_list(std::move(rest), true));
        auto kw = std::make_shared<dict_obj>();
        for (const auto& k : a.kw) {
            bool is_param = false;
            for (const auto& p : sp->params) is_param |= p.name == k.name;
            if (k.name == "caller") inner->set("caller", k.v);
            else if (!is_param) kw->set(k.name, k.v);
        }
        inner->set("kwargs", value(std::move(kw)));
        std::string out;
        ev.exec(sp->inner, inner, out);
        (void)name;
        return value(std::move(out));
    });
}

void evaluator::args_of(const expr& e, const frame_ptr& f, call_args& out) {
    for (size_t i = 1; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i], f));
    for (const auto& [k, x] : e.kwargs) out.kw.push_back({k, eval(*x, f)});
}

value evaluator::call(const value& callee, call_args& args, int line) {
    if (callee.is_undefined()) {
        const auto& u = callee.undef();
        throw error(u.hint.empty() ? "call of an undefined value" : u.hint, line);
    }
    if (!callee.is_func()) throw error("'" + type_name(callee) + "' object is not callable", line);
    return callee.func()->fn(*this, args);
}

value evaluator::call_expr(const expr& e, const frame_ptr& f) {
    const value callee = eval(*e.args[0], f);
    call_args args;
    args_of(e, f, args);
    return call(callee, args, e.line);
}

namespace {

[[noreturn]] void type_error(const char* op, const value& a, const value& b) {
    throw error(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" +
                type_name(b) + "'");
}

void fail_if_undefined(const value& v) {
    if (v.is_undefined()) {
        const auto& u = v.undef();
        throw error(u.hint.empty() ? "undefined value used" : u.hint);
    }
}

bool is_intlike(const value& v) { return v.is_int() || v.is_bool(); }

} // namespace

value evaluator::binop(const expr& e, const frame_ptr& f) {
    const std::string& op = e.name;
    const value a = eval(*e.args[0], f);
    const value b = eval(*e.args[1], f);
    if (op == "~") {
        std::string s = to_str(a);
        const std::string t = to_str(b);
        check_size(s.size() + t.size());
        return value(s + t);
    }
    if (op == "==") return value(equals(a, b));
    if (op == "!=") return value(!equals(a, b));
    if (op == "in") {
        bool r = false;
        if (b.is_string()) {
            if (!a.is_string()) throw error("'in <string>' requires string as left operand, not " + type_name(a));
            r = b.str().find(a.str()) != std::string::npos;
        } else if (b.is_list()) {
            for (const auto& x : b.list()->items)
                if (equals(a, x)) { r = true; break; }
        } else if (b.is_dict()) {
            r = a.is_string() && b.dict()->find(a.str()) != nullptr;
        } else if (!b.is_undefined()) {
            throw error("argument of type '" + type_name(b) + "' is not iterable");
        }
        return value(e.negated ? !r : r);
    }
    fail_if_undefined(a);
    fail_if_undefined(b);
    if (op == "<") return value(less(a, b));
    if (op == ">") return value(less(b, a));
    if (op == "<=") return value(!less(b, a));
    if (op == ">=") return value(!less(a, b));
    if (op == "+") {
        if (is_intlike(a) && is_intlike(b)) {
            int64_t r;
            if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) throw error("integer overflow");
            return value(r);
        }
        if (a.is_number() && b.is_number()) return value(a.as_double() + b.as_double());
        if (a.is_string() && b.is_string()) {
            check_size(a.str().size() + b.str().size());
            return value(a.str() + b.str());
        }
        if (a.is_list() && b.is_list()) {
            std::vector<value> items = a.list()->items;
            for (const auto& x : b.list()->items) {
                tick();
                items.push_back(x);
            }
            return make_list(std::move(items), a.list()->tuple);
        }
        type_error("+", a, b);
    }
    if (op == "-") {
        if (is_intlike(a) && is_intlike(b)) {
            int64_t r;
            if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) throw error("integer overflow");
            return value(r);
        }
        if (a.is_number() && b.is_number()) return value(a.as_double() - b.as_double());
        type_error("-", a, b);
    }
    if (op == "*") {
        if (is_intlike(a) && is_intlike(b)) {
            int64_t r;
            if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) throw error("integer overflow");
            return value(r);
        }
        if (a.is_number() && b.is_number()) return value(a.as_double() * b.as_double());
        const value* seq = a.is_string() || a.is_list() ? &a : &b;
        const value* n = seq == &a ? &b : &a;
        if ((seq->is_string() || seq->is_list()) && is_intlike(*n)) {
            const int64_t k = std::max<int64_t>(0, n->as_int());
            if (seq->is_string()) {
                check_size(seq->str().size() * size_t(k));
                std::string r;
                for (int64_t i = 0; i < k; ++i) r += seq->str();
                return value(std::move(r));
            }
            std::vector<value> items;
            for (int64_t i = 0; i < k; ++i)
                for (const auto& x : seq->list()->items) {
                    tick();
                    items.push_back(x);
                }
            return make_list(std::move(items), seq->list()->tuple);
        }
        type_error("*", a, b);
    }
    if (op == "/") {
        if (!a.is_number() || !b.is_number()) type_error("/", a, b);
        if (b.as_double() == 0) throw error("division by zero");
        return value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
        if (op == "%" && a.is_string()) return python_format(*this, a.str(), b);
        if (!a.is_number() || !b.is_number()) type_error(op.c_str(), a, b);
        if (b.as_double() == 0) throw error(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
        if (is_intlike(a) && is_intlike(b)) {
            const int64_t x = a.as_int(), y = b.as_int();
            if (x == INT64_MIN && y == -1) throw error("integer overflow");
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                --q;
                r += y;
            }
            return value(op == "//" ? q : r);
        }
        const double x = a.as_double(), y = b.as_double();
        if (op == "//") return value(std::floor(x / y));
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return value(r);
    }
    if (op == "**") {
        if (!a.is_number() || !b.is_number()) type_error("**", a, b);
        if (is_intlike(a) && is_intlike(b) && b.as_int() >= 0) {
            int64_t r = 1, base = a.as_int();
            for (int64_t i = 0; i < b.as_int(); ++i) {
                if (__builtin_mul_overflow(r, base, &r)) throw error("integer overflow");
                if (r == 0 || r == 1) break;
            }
            return value(r);
        }
        return value(std::pow(a.as_double(), b.as_double()));
    }
    throw error("unknown operator " + op);
}

value evaluator::eval(const expr& e, const frame_ptr& f) {
    depth_guard g(eval_depth_, 400, "expressions");
    switch (e.kind) {
    case ex::literal: return e.lit;
    case ex::name: {
        if (const value* v = f->find(e.name)) return *v;
        return value::undefined("'" + e.name + "' is undefined");
    }
    case ex::list:
    case ex::tuple: {
        std::vector<value> items;
        for (const auto& x : e.args) items.push_back(eval(*x, f));
        return make_list(std::move(items), e.kind == ex::tuple);
    }
    case ex::dict: {
        auto d = std::make_shared<dict_obj>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
            const value k = eval(*e.args[i], f);
            if (!k.is_string()) throw error("dict keys other than strings are not supported", e.line);
            d->set(k.str(), eval(*e.args[i + 1], f));
        }
        return value(std::move(d));
    }
    case ex::attr: return get_attr(*this, eval(*e.args[0], f), e.name);
    case ex::subscript: {
        const value obj = eval(*e.args[0], f);
        return get_item(*this, obj, eval(*e.args[1], f));
    }
    case ex::slice: {
        const value obj = eval(*e.args[0], f);
        value parts[3];
        for (int i = 0; i < 3; ++i)
            parts[i] = e.args[size_t(i) + 1] ? eval(*e.args[size_t(i) + 1], f) : value(nullptr);
        return slice_of(*this, obj, parts[0], parts[1], parts[2]);
    }
    case ex::call: return call_expr(e, f);
    case ex::filter: {
        const value input = eval(*e.args[0], f);
        call_args args;
        args_of(e, f, args);
        return apply_filter(*this, e.name, input, args, e.line);
    }
    case ex::test: {
        const value input = eval(*e.args[0], f);
        call_args args;
        args_of(e, f, args);
        const bool r = apply_test(*this, e.name, input, args, e.line);
        return value(e.negated ? !r : r);
    }
    case ex::not_: return value(!truthy(eval(*e.args[0], f)));
    case ex::neg:
    case ex::pos: {
        const value v = eval(*e.args[0], f);
        fail_if_undefined(v);
        if (!v.is_number()) throw error("bad operand type for unary -: '" + type_name(v) + "'", e.line);
        if (e.kind == ex::pos) return v.is_bool() ? value(v.as_int()) : v;
        if (v.is_float()) return value(-v.as_double());
        if (v.as_int() == INT64_MIN) throw error("integer overflow", e.line);
        return value(-v.as_int());
    }
    case ex::binop: return binop(e, f);
    case ex::and_: {
        value a = eval(*e.args[0], f);
        return truthy(a) ? eval(*e.args[1], f) : a;
    }
    case ex::or_: {
        value a = eval(*e.args[0], f);
        return truthy(a) ? a : eval(*e.args[1], f);
    }
    case ex::cond:
        if (truthy(eval(*e.args[0], f))) return eval(*e.args[1], f);
        if (e.args[2]) return eval(*e.args[2], f);
        return value::undefined("the inline if expression evaluated to false and no else section was defined");
    }
    return value();
}

namespace {

// Jinja2 refuses unknown filters and tests when it compiles a template, except inside an `if`
// or a conditional expression (a "soft" frame: they fail only if reached); so does this.
void check_names(const expr& e, bool soft) {
    if (!soft && e.kind == ex::filter && !is_filter(e.name)) throw error("No filter named '" + e.name + "'.", e.line);
    if (!soft && e.kind == ex::test && !is_test(e.name)) throw error("No test named '" + e.name + "'.", e.line);
    soft |= e.kind == ex::cond;
    for (const auto& a : e.args)
        if (a) check_names(*a, soft);
    for (const auto& [k, a] : e.kwargs) check_names(*a, soft);
}

void check_names(const body& b, bool soft) {
    for (const auto& s : b) {
        const bool inner_soft = s->kind == st::if_ || (soft && s->kind != st::for_ && s->kind != st::macro &&
                                                        s->kind != st::call_block && s->kind != st::scope);
        const bool own_soft = s->kind == st::if_ || soft;
        for (const expr* e : {s->e.get(), s->cond.get()})
            if (e) check_names(*e, own_soft && s->kind != st::for_);
        for (const auto& c : s->conds) check_names(*c, own_soft);
        for (const auto& br : s->branches) check_names(br, inner_soft);
        check_names(s->inner, inner_soft);
        check_names(s->else_body, inner_soft);
        for (const auto& p : s->params)
            if (p.def) check_names(*p.def, false);
    }
}

} // namespace

template_program template_program::parse(std::string_view source) {
    template_program p;
    try {
        auto b = std::make_shared<body>(jinja::parse(lex(source)));
        check_names(*b, false);
        p.body_ = std::move(b);
    } catch (const error&) {
        throw;
    } catch (const std::exception& e) { // (std::bad_alloc, out_of_range ...): still the template's failure
        throw error(std::string("template failed to load: ") + e.what());
    }
    return p;
}

std::string template_program::render(const value& context, const render_options& opt) const {
    auto globals = std::make_shared<frame>();
    install_globals(*globals);
    if (opt.now) {
        const std::time_t t = *opt.now;
        globals->set("strftime_now", make_func("strftime_now", [t](evaluator&, call_args& a) -> value {
                         const value* fmt = a.get(0, "format");
                         if (!fmt || !fmt->is_string()) throw error("strftime_now expects a format string");
                         return value(strftime_at(t, fmt->str(), true));
                     }));
    }
    auto top = std::make_shared<frame>();
    top->parent = globals;
    if (context.is_dict())
        for (const auto& [k, v] : context.dict()->items) top->set(k, v);
    std::string out;
    try {
        evaluator ev(opt, globals);
        ev.exec(*body_, top, out);
    } catch (const error&) {
        top->vars.clear();
        globals->vars.clear();
        throw;
    } catch (const std::exception& e) { // (std::bad_alloc, out_of_range ...): still the template's failure
        top->vars.clear();
        globals->vars.clear();
        throw error(std::string("template failed: ") + e.what());
    }
    top->vars.clear();
    globals->vars.clear();
    return out;
}

std::string template_program::render(const nlohmann::ordered_json& context, const render_options& opt) const {
    return render(from_json(context), opt);
}

} // namespace tandem::jinja
