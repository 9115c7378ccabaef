// Jinja evaluator: runs a syntax tree over scopes (frames), with the sandbox's limits. The
// builtins (filters, tests, attributes and methods) are in builtins.cpp.
#pragma once

#include "runtime/jinja/ast.hpp"
#include "runtime/jinja/jinja.hpp"

#include <chrono>
#include <memory>

namespace tandem::jinja {

struct frame {
    std::vector<std::pair<std::string, value>> vars;
    std::shared_ptr<frame> parent;

    const value* find(std::string_view name) const;
    void set(const std::string& name, value v);
};
using frame_ptr = std::shared_ptr<frame>;

class evaluator {
public:
    evaluator(const render_options& opt, frame_ptr globals);
    // Clears what can hold a reference cycle (a macro's scope holds the macro, a namespace
    // can hold itself), so that nothing a template made outlives its render.
    ~evaluator();
    evaluator(const evaluator&) = delete;
    evaluator& operator=(const evaluator&) = delete;
    void adopt(const dict_ptr& d) { owned_dicts_.push_back(d); }

    void exec(const body& b, const frame_ptr& f, std::string& out);
    value eval(const expr& e, const frame_ptr& f);
    value call(const value& callee, call_args& args, int line);

    // One loop iteration or item built: counts against the limit, checks the clock.
    void tick();
    // A string about to reach `n` bytes: refused over the output limit.
    void check_size(size_t n) const;

    const render_options& options() const { return opt_; }

private:
    enum class flow { normal, break_, continue_ };
    flow run(const body& b, const frame_ptr& f, std::string& out);
    flow run_stmt(const stmt& s, const frame_ptr& f, std::string& out);
    void run_for(const stmt& s, const frame_ptr& f, std::string& out);
    void assign(const std::vector<std::string>& targets, const value& v, const frame_ptr& f, int line);
    value make_macro(const stmt& s, const frame_ptr& f);
    value binop(const expr& e, const frame_ptr& f);
    value call_expr(const expr& e, const frame_ptr& f);
    void args_of(const expr& e, const frame_ptr& f, call_args& out);

    const render_options& opt_;
    frame_ptr globals_;
    std::vector<frame_ptr> owned_frames_;
    std::vector<dict_ptr> owned_dicts_;
    uint64_t n_ticks_ = 0;
    int depth_ = 0;
    int eval_depth_ = 0;
    std::chrono::steady_clock::time_point deadline_;
};

// builtins.cpp
bool is_filter(const std::string& name);
bool is_test(const std::string& name);
value apply_filter(evaluator& ev, const std::string& name, const value& input, call_args& args, int line);
bool apply_test(evaluator& ev, const std::string& name, const value& input, call_args& args, int line);
value get_attr(evaluator& ev, const value& obj, const std::string& name);
value get_item(evaluator& ev, const value& obj, const value& key);
value slice_of(evaluator& ev, const value& obj, const value& start, const value& stop, const value& step);
std::vector<value> iterate(const value& v, int line);
void install_globals(frame& f);
value python_format(evaluator& ev, const std::string& fmt, const value& args); // "%s" % x
std::string strftime_at(std::time_t t, const std::string& fmt, bool utc);

} // namespace tandem::jinja
