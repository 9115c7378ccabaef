// Jinja parser: tokens to a syntax tree, Jinja2's grammar and precedence. Unknown tags and
// constructs outside the supported subset are errors naming them and their line.
#pragma once

#include "runtime/jinja/ast.hpp"
#include "runtime/jinja/lexer.hpp"

namespace tandem::jinja {

body parse(const std::vector<token>& tokens);

} // namespace tandem::jinja
