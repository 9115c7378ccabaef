// Regular expressions to grammar expressions: the ECMAScript subset JSON Schema's `pattern`
// uses (literals and escapes, `.`, classes with ranges and \d \w \s \D \W \S, groups (plain,
// non-capturing, named), alternation, `? * + {n} {n,} {n,m}` with their lazy forms, `^` and
// `$` at the ends). What a generator cannot honour (backreferences, lookaround, word
// boundaries, anchors inside) is a grammar_error naming the construct and its byte offset.
// `^` may open and `$` close only a top-level alternative (`^a$|^b$`, `^(a|b)$`). As in
// browsers without the u flag, a `{` that opens no quantifier and a lone `]` or `}` are
// literals, while `\u{...}` is a code point as with the u flag.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <string_view>

namespace tandem::grammar {

struct regex_options {
    // JSON Schema semantics: a pattern matches anywhere in the string unless anchored, so an
    // unanchored end accepts any text there. Off: the whole text matches the pattern (the
    // structured_outputs `regex` form), and `^`/`$` at the ends are allowed and mean nothing.
    bool search = false;
    // The expression matches the text as the body of a JSON string (between the quotes):
    // each code point the pattern allows appears as JSON writes it (`"` as \", `\` as \\,
    // control characters as \n, \t, ... or \u00XX), so the value decoded matches the pattern.
    // One form per code point, the one nlohmann::json writes: the short escape where JSON has
    // one, else \u00xx in lower case; everything else (`/` and DEL included) raw.
    bool json_string = false;
};

// The expression for `pattern`; helper rules it needs are added to b.
expr regex_expr(builder& b, std::string_view pattern, const regex_options& opt = {});
// The same with no rule references (for automata: dfa::of).
expr regex_expr(std::string_view pattern, const regex_options& opt = {});

} // namespace tandem::grammar
