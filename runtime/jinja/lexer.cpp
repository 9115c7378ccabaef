// Jinja lexer: follows jinja2/lexer.py's rules (root text, tags, comments, raw blocks and
// the whitespace control around them), byte for byte.
#include "runtime/jinja/lexer.hpp"

#include "runtime/jinja/value.hpp"

#include <cstring>

namespace tandem::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

std::string normalize(std::string_view src, bool keep_trailing_newline) {
    std::string s;
    s.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
        if (src[i] == '\r') {
            s.push_back('\n');
            if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
        } else {
            s.push_back(src[i]);
        }
    }
    if (!keep_trailing_newline && !s.empty() && s.back() == '\n') s.pop_back();
    return s;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out.push_back(char(cp));
    else if (cp < 0x800) { out.push_back(char(0xC0 | (cp >> 6))); out.push_back(char(0x80 | (cp & 0x3F))); }
    else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

class lexer {
public:
    lexer(std::string src, const lex_options& opt) : s_(std::move(src)), opt_(opt) {}

    std::vector<token> run() {
        bool line_starting = true;
        while (pos_ < s_.size()) {
            const size_t at = find_tag(pos_);
            if (at == std::string::npos) {
                emit(tok::data, s_.substr(pos_), line_);
                count_lines(pos_, s_.size());
                pos_ = s_.size();
                break;
            }
            std::string text = s_.substr(pos_, at - pos_);
            const char kind = s_[at + 1]; // '{', '%' or '#'
            char sign = 0;
            if (at + 2 < s_.size() && (s_[at + 2] == '-' || s_[at + 2] == '+')) sign = s_[at + 2];
            const int text_line = line_;
            count_lines(pos_, at);
            strip_text(text, sign, kind != '{', line_starting);
            if (!text.empty()) emit(tok::data, std::move(text), text_line);
            pos_ = at + 2 + (sign ? 1 : 0);
            if (kind == '#') {
                line_starting = comment();
            } else if (kind == '%' && raw_begin()) {
                line_starting = raw();
            } else {
                line_starting = tag(kind == '%');
            }
        }
        out_.push_back({tok::eof, {}, line_});
        return std::move(out_);
    }

private:
    std::string s_;
    lex_options opt_;
    size_t pos_ = 0;
    int line_ = 1;
    std::vector<token> out_;

    void emit(tok k, std::string text, int line) { out_.push_back({k, std::move(text), line}); }
    void count_lines(size_t from, size_t to) {
        for (size_t i = from; i < to; ++i)
            if (s_[i] == '\n') ++line_;
    }

    size_t find_tag(size_t from) const {
        for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1))
            if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
        return std::string::npos;
    }

    // The text before a tag: `-` strips all whitespace; lstrip_blocks strips the spaces
    // between the line's start and a block or comment tag when nothing else is there.
    void strip_text(std::string& text, char sign, bool lstrip_kind, bool line_starting) const {
        if (sign == '-') {
            size_t n = text.size();
            while (n > 0 && is_space(text[n - 1])) --n;
            text.resize(n);
        } else if (sign != '+' && opt_.lstrip_blocks && lstrip_kind) {
            const size_t nl = text.rfind('\n');
            const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
            if (l_pos > 0 || line_starting) {
                bool all_ws = l_pos < text.size();
                for (size_t i = l_pos; i < text.size() && all_ws; ++i) all_ws = is_space(text[i]);
                if (all_ws) text.resize(l_pos);
            }
        }
    }

    // After a closing `-X}`: skip all whitespace; after `X}` of a block or comment, one
    // newline when trim_blocks. Returns whether the consumed text ended with a newline.
    bool close(size_t end_at, bool minus, bool plus, bool block_like) {
        size_t p = end_at;
        if (minus) {
            while (p < s_.size() && is_space(s_[p])) ++p;
        } else if (!plus && block_like && opt_.trim_blocks && p < s_.size() && s_[p] == '\n') {
            ++p;
        }
        count_lines(pos_, p);
        pos_ = p;
        return p > 0 && s_[p - 1] == '\n';
    }

    bool comment() {
        const size_t start = pos_;
        size_t q = s_.find("#}", start);
        if (q == std::string::npos) throw error("Missing end of comment tag", line_);
        bool minus = false, plus = false;
        if (q > start && s_[q - 1] == '-') minus = true;
        else if (q > start && s_[q - 1] == '+') plus = true;
        return close(q + 2, minus, plus, true);
    }

    // {% raw %} (or {%- raw -%}): pos_ is after "{%" and its sign.
    bool raw_begin() {
        size_t p = pos_;
        while (p < s_.size() && is_space(s_[p])) ++p;
        if (s_.compare(p, 3, "raw") != 0) return false;
        p += 3;
        if (p < s_.size() && is_name_char(s_[p])) return false;
        while (p < s_.size() && is_space(s_[p])) ++p;
        if (s_.compare(p, 3, "-%}") == 0) {
            p += 3;
            while (p < s_.size() && is_space(s_[p])) ++p;
        } else if (s_.compare(p, 2, "%}") == 0) {
            p += 2;
        } else {
            return false;
        }
        count_lines(pos_, p);
        pos_ = p;
        return true;
    }

    bool raw() {
        const bool line_starting = pos_ > 0 && s_[pos_ - 1] == '\n';
        for (size_t q = s_.find("{%", pos_); q != std::string::npos; q = s_.find("{%", q + 1)) {
            size_t p = q + 2;
            char sign = 0;
            if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
            while (p < s_.size() && is_space(s_[p])) ++p;
            if (s_.compare(p, 6, "endraw") != 0) continue;
            p += 6;
            while (p < s_.size() && is_space(s_[p])) ++p;
            bool minus = false, plus = false;
            if (s_.compare(p, 3, "+%}") == 0) { plus = true; p += 3; }
            else if (s_.compare(p, 3, "-%}") == 0) { minus = true; p += 3; }
            else if (s_.compare(p, 2, "%}") == 0) p += 2;
            else continue;
            std::string text = s_.substr(pos_, q - pos_);
            strip_text(text, sign, true, line_starting);
            const int line = line_;
            if (!text.empty()) emit(tok::data, std::move(text), line);
            return close(p, minus, plus, true);
        }
        throw error("Missing end of raw directive", line_);
    }

    // Expression tokens up to the tag's end.
    bool tag(bool block) {
        emit(block ? tok::block_begin : tok::var_begin, {}, line_);
        std::vector<char> balance;
        for (;;) {
            if (pos_ >= s_.size()) throw error(block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", line_);
            if (balance.empty()) {
                const char e = block ? '%' : '}';
                if (s_[pos_] == '-' && s_.compare(pos_ + 1, 2, std::string{e, '}'}) == 0) {
                    emit(block ? tok::block_end : tok::var_end, {}, line_);
                    return close(pos_ + 3, true, false, block);
                }
                if (block && s_.compare(pos_, 3, "+%}") == 0) {
                    emit(tok::block_end, {}, line_);
                    return close(pos_ + 3, false, true, block);
                }
                if (s_.compare(pos_, 2, std::string{e, '}'}) == 0) {
                    emit(block ? tok::block_end : tok::var_end, {}, line_);
                    return close(pos_ + 2, false, false, block);
                }
            }
            const char c = s_[pos_];
            if (is_space(c)) {
                if (c == '\n') ++line_;
                ++pos_;
                continue;
            }
            if (is_name_start(c)) {
                size_t p = pos_;
                while (p < s_.size() && is_name_char(s_[p])) ++p;
                emit(tok::name, s_.substr(pos_, p - pos_), line_);
                pos_ = p;
                continue;
            }
            if (is_digit(c)) { number(); continue; }
            if (c == '\'' || c == '"') { string_literal(c); continue; }
            static const char* ops2[] = {"//", "**", "==", "!=", ">=", "<="};
            bool two = false;
            for (const char* o : ops2)
                if (s_.compare(pos_, 2, o) == 0) {
                    emit(tok::op, o, line_);
                    pos_ += 2;
                    two = true;
                    break;
                }
            if (two) continue;
            if (std::strchr("+-*/%~()[]{}.,:|=<>;", c) == nullptr)
                throw error(std::string("unexpected char '") + c + "'", line_);
            if (c == '(' || c == '[' || c == '{') balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
            if (c == ')' || c == ']' || c == '}') {
                if (balance.empty()) throw error(std::string("unexpected '") + c + "'", line_);
                if (balance.back() != c)
                    throw error(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", line_);
                balance.pop_back();
            }
            emit(tok::op, std::string(1, c), line_);
            ++pos_;
        }
    }

    void number() {
        size_t p = pos_;
        auto digits = [&] {
            while (p < s_.size() && (is_digit(s_[p]) || (s_[p] == '_' && p + 1 < s_.size() && is_digit(s_[p + 1]))))
                ++p;
        };
        digits();
        bool is_float = false;
        if (p + 1 < s_.size() && s_[p] == '.' && is_digit(s_[p + 1])) {
            is_float = true;
            ++p;
            digits();
        }
        if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
            size_t q = p + 1;
            if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
            if (q < s_.size() && is_digit(s_[q])) {
                is_float = true;
                p = q;
                digits();
            }
        }
        std::string text;
        for (size_t i = pos_; i < p; ++i)
            if (s_[i] != '_') text.push_back(s_[i]);
        emit(is_float ? tok::floating : tok::integer, std::move(text), line_);
        pos_ = p;
    }

    void string_literal(char q) {
        std::string out;
        size_t p = pos_ + 1;
        const int line = line_;
        for (;;) {
            if (p >= s_.size()) throw error("unexpected end of string", line);
            const char c = s_[p];
            if (c == q) break;
            if (c == '\n') ++line_;
            if (c != '\\') {
                out.push_back(c);
                ++p;
                continue;
            }
            if (p + 1 >= s_.size()) throw error("unexpected end of string", line);
            const char e = s_[p + 1];
            p += 2;
            auto hex = [&](int n) {
                if (p + size_t(n) > s_.size()) throw error("truncated \\x escape in a string", line);
                uint32_t v = 0;
                for (int i = 0; i < n; ++i) {
                    const char h = s_[p + size_t(i)];
                    v <<= 4;
                    if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
                    else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
                    else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
                    else throw error("bad escape in a string", line);
                }
                p += size_t(n);
                if (v > 0x10FFFF) throw error("bad escape in a string", line);
                append_utf8(out, v);
            };
            switch (e) {
            case 'n': out.push_back('\n'); break;
            case 't': out.push_back('\t'); break;
            case 'r': out.push_back('\r'); break;
            case 'b': out.push_back('\b'); break;
            case 'f': out.push_back('\f'); break;
            case 'v': out.push_back('\v'); break;
            case 'a': out.push_back('\a'); break;
            case '0': out.push_back('\0'); break;
            case '\\': out.push_back('\\'); break;
            case '\'': out.push_back('\''); break;
            case '"': out.push_back('"'); break;
            case '\n': ++line_; break; // line continuation
            case 'x': hex(2); break;
            case 'u': hex(4); break;
            case 'U': hex(8); break;
            default: out.push_back('\\'); out.push_back(e); break;
            }
        }
        emit(tok::string, std::move(out), line);
        pos_ = p + 1;
    }
};

} // namespace

std::vector<token> lex(std::string_view source, const lex_options& opt) {
    return lexer(normalize(source, opt.keep_trailing_newline), opt).run();
}

} // namespace tandem::jinja
