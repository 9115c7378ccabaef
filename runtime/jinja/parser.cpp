// Jinja parser: recursive descent over jinja2/parser.py's grammar (precedence: or, and, not,
// comparisons, + -, ~, * / // %, **, unary, then postfix . [] () and | is).
#include "runtime/jinja/parser.hpp"

#include <charconv>
#include <cstdlib>

namespace tandem::jinja {

namespace {

constexpr int max_depth = 200; // nesting of expressions and statements

class parser {
public:
    explicit parser(const std::vector<token>& t) : t_(t) {}

    body parse_all() {
        body b = subparse({});
        if (cur().kind != tok::eof) fail("unexpected '" + cur().text + "'");
        return b;
    }

private:
    const std::vector<token>& t_;
    size_t i_ = 0;
    int depth_ = 0;

    struct depth_guard {
        parser& p;
        explicit depth_guard(parser& p_) : p(p_) {
            if (++p.depth_ > max_depth) p.fail("template nested too deeply");
        }
        ~depth_guard() { --p.depth_; }
    };

    const token& cur() const { return t_[i_]; }
    const token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
    [[noreturn]] void fail(const std::string& what) const { throw error(what, cur().line); }
    void next() {
        if (cur().kind != tok::eof) ++i_;
    }
    bool is_op(const char* o) const { return cur().kind == tok::op && cur().text == o; }
    bool is_name(const char* n) const { return cur().kind == tok::name && cur().text == n; }
    bool skip_op(const char* o) {
        if (!is_op(o)) return false;
        next();
        return true;
    }
    bool skip_name(const char* n) {
        if (!is_name(n)) return false;
        next();
        return true;
    }
    void expect_op(const char* o) {
        if (!skip_op(o)) fail(std::string("expected '") + o + "', got '" + describe() + "'");
    }
    std::string expect_name() {
        if (cur().kind != tok::name) fail("expected a name, got '" + describe() + "'");
        std::string n = cur().text;
        next();
        return n;
    }
    std::string describe() const {
        switch (cur().kind) {
        case tok::eof: return "end of template";
        case tok::block_end: return "end of statement block";
        case tok::var_end: return "end of print statement";
        default: return cur().text;
        }
    }
    void expect_block_end() {
        if (cur().kind != tok::block_end) fail("expected end of statement block, got '" + describe() + "'");
        next();
    }

    expr_ptr make(ex k, int line) {
        auto e = std::make_unique<expr>();
        e->kind = k;
        e->line = line;
        return e;
    }

    // Statements up to one of `end_tags` (left at the tag's name) or the end.
    body subparse(std::initializer_list<const char*> end_tags) {
        depth_guard g(*this);
        body out;
        for (;;) {
            const token& tk = cur();
            if (tk.kind == tok::eof) {
                if (end_tags.size() != 0)
                    fail(std::string("unexpected end of template, expected '") + *(end_tags.end() - 1) + "'");
                return out;
            }
            if (tk.kind == tok::data) {
                auto s = std::make_unique<stmt>();
                s->kind = st::text;
                s->line = tk.line;
                s->text = tk.text;
                out.push_back(std::move(s));
                next();
            } else if (tk.kind == tok::var_begin) {
                auto s = std::make_unique<stmt>();
                s->kind = st::output;
                s->line = tk.line;
                next();
                s->e = parse_tuple(true, false);
                if (cur().kind != tok::var_end) fail("expected end of print statement, got '" + describe() + "'");
                next();
                out.push_back(std::move(s));
            } else if (tk.kind == tok::block_begin) {
                next();
                if (cur().kind != tok::name) fail("tag name expected");
                for (const char* e : end_tags)
                    if (cur().text == e) return out;
                out.push_back(statement());
            } else {
                fail("unexpected '" + describe() + "'");
            }
        }
    }

    stmt_ptr new_stmt(st k) {
        auto s = std::make_unique<stmt>();
        s->kind = k;
        s->line = cur().line;
        return s;
    }

    stmt_ptr statement() {
        const std::string tag = cur().text;
        const int line = cur().line;
        if (tag == "if") return parse_if();
        if (tag == "for") return parse_for();
        if (tag == "set") return parse_set();
        if (tag == "macro") return parse_macro();
        if (tag == "call") return parse_call();
        if (tag == "filter") return parse_filter_block();
        if (tag == "break" || tag == "continue") {
            auto s = new_stmt(tag == "break" ? st::break_ : st::continue_);
            next();
            expect_block_end();
            return s;
        }
        if (tag == "generation") {
            auto s = new_stmt(st::scope);
            next();
            expect_block_end();
            s->inner = subparse({"endgeneration"});
            next();
            expect_block_end();
            return s;
        }
        if (tag == "with") return parse_with();
        static const char* const known[] = {"block", "extends", "include", "import", "from", "print",
                                            "autoescape", "do"};
        for (const char* k : known)
            if (tag == k) throw error("unsupported tag '" + tag + "'", line);
        throw error("Encountered unknown tag '" + tag + "'", line);
    }

    stmt_ptr parse_if() {
        auto s = new_stmt(st::if_);
        next();
        s->conds.push_back(parse_tuple(false, false));
        expect_block_end();
        for (;;) {
            s->branches.push_back(subparse({"elif", "else", "endif"}));
            if (skip_name("elif")) {
                s->conds.push_back(parse_tuple(false, false));
                expect_block_end();
                continue;
            }
            if (skip_name("else")) {
                expect_block_end();
                s->branches.push_back(subparse({"endif"}));
            }
            next(); // endif
            expect_block_end();
            return s;
        }
    }

    std::vector<std::string> assign_targets(bool allow_attr, std::string* attr) {
        std::vector<std::string> names;
        const bool paren = skip_op("(");
        names.push_back(expect_name());
        if (allow_attr && names.size() == 1 && is_op(".")) {
            next();
            *attr = expect_name();
            return names;
        }
        while (skip_op(",")) {
            if (cur().kind != tok::name) break;
            names.push_back(expect_name());
        }
        if (paren) expect_op(")");
        return names;
    }

    stmt_ptr parse_for() {
        auto s = new_stmt(st::for_);
        next();
        s->targets = assign_targets(false, nullptr);
        if (!skip_name("in")) fail("expected 'in'");
        s->e = parse_tuple(false, false, "recursive");
        if (skip_name("if")) s->cond = parse_expression(true);
        if (skip_name("recursive")) s->recursive = true;
        if (s->recursive) fail("recursive loops are not supported");
        expect_block_end();
        s->inner = subparse({"endfor", "else"});
        if (skip_name("else")) {
            expect_block_end();
            s->else_body = subparse({"endfor"});
        }
        next();
        expect_block_end();
        return s;
    }

    stmt_ptr parse_set() {
        auto s = new_stmt(st::set);
        next();
        s->targets = assign_targets(true, &s->attr);
        if (skip_op("=")) {
            s->e = parse_tuple(true, false);
            expect_block_end();
            return s;
        }
        if (!s->attr.empty() || s->targets.size() != 1) fail("expected '='");
        s->kind = st::set_block;
        if (is_op("|")) s->e = parse_filter_chain();
        expect_block_end();
        s->inner = subparse({"endset"});
        next();
        expect_block_end();
        return s;
    }

    // `| f(args) | g` applied to the body placeholder.
    expr_ptr parse_filter_chain() {
        auto e = make(ex::name, cur().line);
        e->name = body_placeholder;
        while (skip_op("|")) e = parse_filter(std::move(e));
        return e;
    }

    stmt_ptr parse_filter_block() {
        auto s = new_stmt(st::filter_block);
        next();
        auto e = make(ex::name, cur().line);
        e->name = body_placeholder;
        e = parse_filter(std::move(e));
        while (skip_op("|")) e = parse_filter(std::move(e));
        s->e = std::move(e);
        expect_block_end();
        s->inner = subparse({"endfilter"});
        next();
        expect_block_end();
        return s;
    }

    void parse_params(std::vector<param>& out) {
        expect_op("(");
        while (!is_op(")")) {
            if (!out.empty()) expect_op(",");
            if (is_op(")")) break;
            param p;
            p.name = expect_name();
            if (skip_op("=")) p.def = parse_expression(true);
            out.push_back(std::move(p));
        }
        expect_op(")");
    }

    stmt_ptr parse_macro() {
        auto s = new_stmt(st::macro);
        next();
        s->text = expect_name();
        parse_params(s->params);
        expect_block_end();
        s->inner = subparse({"endmacro"});
        next();
        expect_block_end();
        return s;
    }

    stmt_ptr parse_call() {
        auto s = new_stmt(st::call_block);
        next();
        if (is_op("(")) parse_params(s->params);
        s->e = parse_expression(true);
        if (s->e->kind != ex::call) fail("expected call");
        expect_block_end();
        s->inner = subparse({"endcall"});
        next();
        expect_block_end();
        return s;
    }

    stmt_ptr parse_with() {
        auto s = new_stmt(st::scope);
        next();
        while (cur().kind != tok::block_end) {
            if (!s->params.empty()) expect_op(",");
            param p;
            p.name = expect_name();
            expect_op("=");
            p.def = parse_expression(true);
            s->params.push_back(std::move(p));
        }
        expect_block_end();
        s->inner = subparse({"endwith"});
        next();
        expect_block_end();
        return s;
    }

    // ---- expressions ----

    expr_ptr parse_tuple(bool with_condexpr, bool explicit_parens, const char* extra_end = nullptr) {
        const int line = cur().line;
        std::vector<expr_ptr> items;
        bool is_tuple = false;
        for (;;) {
            if (!items.empty()) {
                if (!skip_op(",")) break;
                is_tuple = true;
            }
            if (cur().kind == tok::var_end || cur().kind == tok::block_end || is_op(")") ||
                (extra_end && is_name(extra_end)) || (!with_condexpr && is_name("if")))
                break;
            items.push_back(parse_expression(with_condexpr));
        }
        if (!is_tuple) {
            if (items.empty()) {
                if (!explicit_parens) fail("expected an expression, got '" + describe() + "'");
                return make(ex::tuple, line);
            }
            return std::move(items[0]);
        }
        auto t = make(ex::tuple, line);
        t->args = std::move(items);
        return t;
    }

    expr_ptr parse_expression(bool with_condexpr) {
        depth_guard g(*this);
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    expr_ptr parse_condexpr() {
        expr_ptr e1 = parse_or();
        while (is_name("if")) {
            const int line = cur().line;
            next();
            expr_ptr e2 = parse_or();
            expr_ptr e3;
            if (skip_name("else")) e3 = parse_condexpr();
            auto c = make(ex::cond, line);
            c->args.push_back(std::move(e2));
            c->args.push_back(std::move(e1));
            c->args.push_back(std::move(e3));
            e1 = std::move(c);
        }
        return e1;
    }

    expr_ptr binary(ex k, expr_ptr a, expr_ptr b, std::string name = {}) {
        auto e = make(k, a->line);
        e->name = std::move(name);
        e->args.push_back(std::move(a));
        e->args.push_back(std::move(b));
        return e;
    }

    expr_ptr parse_or() {
        expr_ptr l = parse_and();
        while (skip_name("or")) l = binary(ex::or_, std::move(l), parse_and());
        return l;
    }
    expr_ptr parse_and() {
        expr_ptr l = parse_not();
        while (skip_name("and")) l = binary(ex::and_, std::move(l), parse_not());
        return l;
    }
    expr_ptr parse_not() {
        if (is_name("not")) {
            depth_guard g(*this);
            auto e = make(ex::not_, cur().line);
            next();
            e->args.push_back(parse_not());
            return e;
        }
        return parse_compare();
    }
    expr_ptr parse_compare() {
        expr_ptr l = parse_math1();
        for (;;) {
            if (cur().kind == tok::op &&
                (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                 cur().text == ">" || cur().text == ">=")) {
                std::string op = cur().text;
                next();
                l = binary(ex::binop, std::move(l), parse_math1(), op);
            } else if (skip_name("in")) {
                l = binary(ex::binop, std::move(l), parse_math1(), "in");
            } else if (is_name("not") && peek().kind == tok::name && peek().text == "in") {
                next();
                next();
                l = binary(ex::binop, std::move(l), parse_math1(), "in");
                l->negated = true;
            } else {
                return l;
            }
        }
    }
    expr_ptr parse_math1() {
        expr_ptr l = parse_concat();
        while (is_op("+") || is_op("-")) {
            std::string op = cur().text;
            next();
            l = binary(ex::binop, std::move(l), parse_concat(), op);
        }
        return l;
    }
    expr_ptr parse_concat() {
        expr_ptr l = parse_math2();
        while (skip_op("~")) l = binary(ex::binop, std::move(l), parse_math2(), "~");
        return l;
    }
    expr_ptr parse_math2() {
        expr_ptr l = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            std::string op = cur().text;
            next();
            l = binary(ex::binop, std::move(l), parse_pow(), op);
        }
        return l;
    }
    expr_ptr parse_pow() {
        expr_ptr l = parse_unary(true);
        while (skip_op("**")) l = binary(ex::binop, std::move(l), parse_unary(true), "**");
        return l;
    }
    expr_ptr parse_unary(bool with_filter) {
        depth_guard g(*this);
        expr_ptr e;
        if (is_op("-") || is_op("+")) {
            e = make(is_op("-") ? ex::neg : ex::pos, cur().line);
            next();
            e->args.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    expr_ptr parse_primary() {
        const token& tk = cur();
        const int line = tk.line;
        if (tk.kind == tok::name) {
            auto e = make(ex::literal, line);
            if (tk.text == "true" || tk.text == "True") e->lit = value(true);
            else if (tk.text == "false" || tk.text == "False") e->lit = value(false);
            else if (tk.text == "none" || tk.text == "None") e->lit = value(nullptr);
            else {
                e->kind = ex::name;
                e->name = tk.text;
            }
            next();
            return e;
        }
        if (tk.kind == tok::string) {
            std::string s;
            while (cur().kind == tok::string) {
                s += cur().text;
                next();
            }
            auto e = make(ex::literal, line);
            e->lit = value(std::move(s));
            return e;
        }
        if (tk.kind == tok::integer) {
            int64_t v = 0;
            auto r = std::from_chars(tk.text.data(), tk.text.data() + tk.text.size(), v);
            if (r.ec != std::errc{}) fail("integer literal out of range");
            auto e = make(ex::literal, line);
            e->lit = value(v);
            next();
            return e;
        }
        if (tk.kind == tok::floating) {
            auto e = make(ex::literal, line);
            e->lit = value(std::strtod(tk.text.c_str(), nullptr));
            next();
            return e;
        }
        if (skip_op("(")) {
            expr_ptr e = parse_tuple(true, true);
            expect_op(")");
            return e;
        }
        if (skip_op("[")) {
            auto e = make(ex::list, line);
            while (!is_op("]")) {
                if (!e->args.empty()) expect_op(",");
                if (is_op("]")) break;
                e->args.push_back(parse_expression(true));
            }
            expect_op("]");
            return e;
        }
        if (skip_op("{")) {
            auto e = make(ex::dict, line);
            while (!is_op("}")) {
                if (!e->args.empty()) expect_op(",");
                if (is_op("}")) break;
                e->args.push_back(parse_expression(true));
                expect_op(":");
                e->args.push_back(parse_expression(true));
            }
            expect_op("}");
            return e;
        }
        fail("unexpected '" + describe() + "'");
    }

    expr_ptr parse_postfix(expr_ptr e) {
        for (;;) {
            if (is_op(".") || is_op("[")) e = parse_subscript(std::move(e));
            else if (is_op("(")) e = parse_call_args(std::move(e), ex::call, {});
            else return e;
        }
    }

    expr_ptr parse_filter_expr(expr_ptr e) {
        for (;;) {
            if (is_op("|")) {
                next();
                e = parse_filter(std::move(e));
            } else if (is_name("is")) {
                e = parse_test(std::move(e));
            } else if (is_op("(")) {
                e = parse_call_args(std::move(e), ex::call, {});
            } else {
                return e;
            }
        }
    }

    expr_ptr parse_subscript(expr_ptr obj) {
        const int line = cur().line;
        if (skip_op(".")) {
            if (cur().kind == tok::integer) {
                auto e = make(ex::subscript, line);
                auto k = make(ex::literal, line);
                k->lit = value(int64_t(std::atoll(cur().text.c_str())));
                next();
                e->args.push_back(std::move(obj));
                e->args.push_back(std::move(k));
                return e;
            }
            auto e = make(ex::attr, line);
            e->name = expect_name();
            e->args.push_back(std::move(obj));
            return e;
        }
        expect_op("[");
        std::vector<expr_ptr> parts(3);
        bool is_slice = false;
        int idx = 0;
        while (!is_op("]")) {
            if (skip_op(":")) {
                is_slice = true;
                if (++idx > 2) fail("bad slice");
                continue;
            }
            if (parts[size_t(idx)]) fail("expected ']'");
            parts[size_t(idx)] = parse_expression(true);
            if (!is_slice && is_op(",")) fail("tuple subscripts are not supported");
        }
        expect_op("]");
        auto e = make(is_slice ? ex::slice : ex::subscript, line);
        e->args.push_back(std::move(obj));
        if (is_slice) {
            for (auto& p : parts) e->args.push_back(std::move(p));
        } else {
            if (!parts[0]) fail("expected a subscript");
            e->args.push_back(std::move(parts[0]));
        }
        return e;
    }

    // `(` args `)` into e (args[0] = the callee or the filtered/tested value).
    expr_ptr parse_call_args(expr_ptr target, ex kind, std::string name) {
        auto e = make(kind, target->line);
        e->name = std::move(name);
        e->args.push_back(std::move(target));
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) expect_op(",");
            first = false;
            if (is_op(")")) break;
            if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
            if (cur().kind == tok::name && peek().kind == tok::op && peek().text == "=") {
                std::string k = cur().text;
                next();
                next();
                e->kwargs.emplace_back(std::move(k), parse_expression(true));
            } else {
                if (!e->kwargs.empty()) fail("positional argument after keyword argument");
                e->args.push_back(parse_expression(true));
            }
        }
        expect_op(")");
        return e;
    }

    std::string dotted_name() {
        std::string n = expect_name();
        while (is_op(".") && peek().kind == tok::name) {
            next();
            n += "." + expect_name();
        }
        return n;
    }

    expr_ptr parse_filter(expr_ptr input) {
        const int line = cur().line;
        std::string name = dotted_name();
        if (is_op("(")) return parse_call_args(std::move(input), ex::filter, std::move(name));
        auto e = make(ex::filter, line);
        e->name = std::move(name);
        e->args.push_back(std::move(input));
        return e;
    }

    expr_ptr parse_test(expr_ptr input) {
        const int line = cur().line;
        next(); // is
        const bool negated = skip_name("not");
        std::string name = dotted_name();
        expr_ptr e;
        if (is_op("(")) {
            e = parse_call_args(std::move(input), ex::test, std::move(name));
        } else {
            e = make(ex::test, line);
            e->name = std::move(name);
            e->args.push_back(std::move(input));
            const token& tk = cur();
            const bool arg_start = tk.kind == tok::name || tk.kind == tok::string || tk.kind == tok::integer ||
                                   tk.kind == tok::floating || is_op("(") || is_op("[") || is_op("{");
            if (arg_start && !(tk.kind == tok::name && (tk.text == "else" || tk.text == "or" ||
                                                        tk.text == "and" || tk.text == "if" || tk.text == "in" ||
                                                        tk.text == "is" || tk.text == "not"))) {
                expr_ptr arg = parse_postfix(parse_primary());
                e->args.push_back(std::move(arg));
            }
        }
        e->negated = negated;
        return e;
    }
};

} // namespace

body parse(const std::vector<token>& tokens) { return parser(tokens).parse_all(); }

} // namespace tandem::jinja
