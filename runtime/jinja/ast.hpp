// Jinja syntax tree: expressions and statements as the parser builds them.
#pragma once

#include "runtime/jinja/value.hpp"

#include <memory>
#include <string>
#include <vector>

namespace tandem::jinja {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

enum class ex : unsigned char {
    literal,   // lit
    name,      // name
    list,      // args
    tuple,     // args
    dict,      // args: key, value, key, value, ...
    attr,      // args[0].name
    subscript, // args[0][args[1]]
    slice,     // args[0][args[1]:args[2]:args[3]] (null parts absent)
    call,      // args[0](args[1..], kwargs)
    filter,    // args[0] | name(args[1..], kwargs)
    test,      // args[0] is [not] name(args[1..], kwargs)
    not_,      // not args[0]
    neg,       // -args[0]
    pos,       // +args[0]
    binop,     // args[0] name args[1]: + - * / // % ** ~ == != < <= > >= in (negated: not in)
    and_,
    or_,
    cond,      // args[1] if args[0] else args[2] (args[2] null: undefined)
};

struct expr {
    ex kind;
    int line = 0;
    value lit;
    std::string name;
    bool negated = false;
    std::vector<expr_ptr> args;
    std::vector<std::pair<std::string, expr_ptr>> kwargs;
};

struct stmt;
using stmt_ptr = std::unique_ptr<stmt>;
using body = std::vector<stmt_ptr>;

enum class st : unsigned char {
    text,         // text
    output,       // {{ e }}
    if_,          // conds[i] -> branches[i]; branches.size() > conds.size(): else
    for_,         // for targets in e [if cond] body [else else_body]
    set,          // set targets = e; or set targets[0].attr = e (attr non-empty)
    set_block,    // set targets[0] [| filter] body
    macro,        // name(params) body
    call_block,   // call [(params)] e body
    filter_block, // filter e body (e's innermost input is the body)
    break_,
    continue_,
    scope,        // generation, with: body (with: params as assignments)
};

struct param {
    std::string name;
    expr_ptr def; // null: no default
};

struct stmt {
    st kind;
    int line = 0;
    std::string text;
    std::string attr;
    expr_ptr e;
    expr_ptr cond;
    std::vector<std::string> targets;
    std::vector<expr_ptr> conds;
    std::vector<body> branches;
    body inner;
    body else_body;
    std::vector<param> params;
    bool recursive = false;
};

// The placeholder a filter block's (or block set's) filter chain takes its input from.
inline constexpr const char* body_placeholder = "\x01body";

} // namespace tandem::jinja
