// GBNF, llama.cpp's grammar syntax, so existing grammars work: rules `name ::= ...`, literals
// "..." with escapes (\n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH), classes [...] and [^...], `.`,
// groups, `|`, `? * +`, `{n}` `{n,}` `{n,m}`, # comments. Outside a group a line break ends a
// rule only where the next line opens one (`name ::=`), so what llama.cpp reads means the same
// and continuation lines work too. The start rule is `root`; a rule defined twice is an error.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <string_view>

namespace tandem::grammar {

// Adds the grammar's rules to b and returns its `root`. A syntax error, an undefined rule or
// a missing root is a grammar_error naming the rule and line.
rule_id add_gbnf(builder& b, std::string_view text);

} // namespace tandem::grammar
