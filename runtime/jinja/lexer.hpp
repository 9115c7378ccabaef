// Jinja lexer: template text, tags and expression tokens, with Jinja2's whitespace rules
// (`-` and `+` markers, trim_blocks and lstrip_blocks as Hugging Face sets them, one final
// newline dropped, \r\n and \r read as \n).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja {

enum class tok : unsigned char {
    data,        // template text
    var_begin,   // {{
    var_end,     // }}
    block_begin, // {%
    block_end,   // %}
    name,
    string,      // text is the decoded string
    integer,
    floating,
    op,          // + - * / // % ** ~ ( ) [ ] { } . , : | = == != < <= > >=
    eof,
};

struct token {
    tok kind;
    std::string text;
    int line;
};

struct lex_options {
    bool trim_blocks = true;
    bool lstrip_blocks = true;
    bool keep_trailing_newline = false;
};

// Throws jinja::error (with the line) on an unterminated tag, comment or string.
std::vector<token> lex(std::string_view source, const lex_options& opt = {});

} // namespace tandem::jinja
