// Python's str methods for the Jinja engine.
#include "runtime/jinja/strings.hpp"

#include "runtime/jinja/evaluator.hpp"

#include <cctype>
#include <cstdio>
#include <cstring>

namespace tandem::jinja {

bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

namespace {
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
char up(char c) { return char(std::toupper(static_cast<unsigned char>(c))); }
char low(char c) { return char(std::tolower(static_cast<unsigned char>(c))); }
} // namespace

namespace {

// The length of the Unicode whitespace (Python's str.isspace) starting at s[i], or 0.
size_t space_at(const std::string& s, size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (py_space(char(c)) || (c >= 0x1c && c <= 0x1f)) return 1;
    auto is = [&](std::initializer_list<unsigned char> seq) {
        if (i + seq.size() > s.size()) return false;
        size_t k = 0;
        for (unsigned char b : seq)
            if (static_cast<unsigned char>(s[i + k++]) != b) return false;
        return true;
    };
    if (c == 0xC2 && (is({0xC2, 0x85}) || is({0xC2, 0xA0}))) return 2;
    if (c == 0xE1 && is({0xE1, 0x9A, 0x80})) return 3;
    if (c == 0xE2 && i + 2 < s.size()) {
        const auto b1 = static_cast<unsigned char>(s[i + 1]), b2 = static_cast<unsigned char>(s[i + 2]);
        if (b1 == 0x80 && ((b2 >= 0x80 && b2 <= 0x8A) || b2 == 0xA8 || b2 == 0xA9 || b2 == 0xAF)) return 3;
        if (b1 == 0x81 && b2 == 0x9F) return 3;
    }
    if (c == 0xE3 && is({0xE3, 0x80, 0x80})) return 3;
    return 0;
}

// The length of the Unicode whitespace ending at s[e-1], or 0.
size_t space_before(const std::string& s, size_t e) {
    for (size_t n = 1; n <= 3 && n <= e; ++n)
        if (space_at(s, e - n) == n) return n;
    return 0;
}

} // namespace

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (chars) {
        auto strip_me = [&](char c) { return chars->find(c) != std::string::npos; };
        if (left)
            while (b < e && strip_me(s[b])) ++b;
        if (right)
            while (e > b && strip_me(s[e - 1])) --e;
        return s.substr(b, e - b);
    }
    if (left)
        for (size_t n; b < e && (n = space_at(s, b)) > 0;) b += n;
    if (right)
        for (size_t n; e > b && (n = space_before(s, e)) > 0;) e -= n;
    return s.substr(b, e - b);
}

std::vector<std::string> py_split(const std::string& s, const std::string& sep, int64_t maxsplit) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t p = s.find(sep); p != std::string::npos && (maxsplit < 0 || int64_t(out.size()) < maxsplit);
         p = s.find(sep, start)) {
        out.push_back(s.substr(start, p - start));
        start = p + sep.size();
    }
    out.push_back(s.substr(start));
    return out;
}

std::vector<std::string> py_rsplit(const std::string& s, const std::string& sep, int64_t maxsplit) {
    if (maxsplit < 0) return py_split(s, sep, -1);
    std::vector<std::string> rev;
    size_t end = s.size();
    while (int64_t(rev.size()) < maxsplit) {
        if (end < sep.size()) break;
        const size_t p = s.rfind(sep, end - sep.size());
        if (p == std::string::npos) break;
        rev.push_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
    }
    rev.push_back(s.substr(0, end));
    return {rev.rbegin(), rev.rend()};
}

std::vector<std::string> py_split_ws(const std::string& s, int64_t maxsplit, bool from_right) {
    std::vector<std::string> words;
    if (!from_right || maxsplit < 0) {
        size_t i = 0;
        while (i < s.size()) {
            while (i < s.size() && py_space(s[i])) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && int64_t(words.size()) == maxsplit) {
                size_t e = s.size();
                while (e > i && py_space(s[e - 1])) --e;
                words.push_back(s.substr(i, e - i));
                break;
            }
            size_t j = i;
            while (j < s.size() && !py_space(s[j])) ++j;
            words.push_back(s.substr(i, j - i));
            i = j;
        }
        return words;
    }
    std::vector<std::string> rev;
    size_t e = s.size();
    while (e > 0) {
        while (e > 0 && py_space(s[e - 1])) --e;
        if (e == 0) break;
        if (int64_t(rev.size()) == maxsplit) {
            size_t b = 0;
            while (b < e && py_space(s[b])) ++b;
            rev.push_back(s.substr(b, e - b));
            break;
        }
        size_t b = e;
        while (b > 0 && !py_space(s[b - 1])) --b;
        rev.push_back(s.substr(b, e - b));
        e = b;
    }
    return {rev.rbegin(), rev.rend()};
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& neu, int64_t count,
                       size_t max_size) {
    std::string out;
    int64_t n = 0;
    if (old.empty()) {
        // Python inserts `neu` between every code point (and at both ends)
        auto cps = code_points(s);
        for (size_t i = 0; i <= cps.size(); ++i) {
            if (count < 0 || n < count) {
                out += neu;
                ++n;
            }
            if (i < cps.size()) out += cps[i];
            if (out.size() > max_size) throw error("template output exceeded " + std::to_string(max_size) + " bytes");
        }
        return out;
    }
    size_t start = 0;
    for (size_t p = s.find(old); p != std::string::npos && (count < 0 || n < count); p = s.find(old, start)) {
        out.append(s, start, p - start);
        out += neu;
        start = p + old.size();
        ++n;
        if (out.size() > max_size) throw error("template output exceeded " + std::to_string(max_size) + " bytes");
    }
    out.append(s, start);
    return out;
}

std::string ascii_upper(std::string s) {
    for (char& c : s) c = up(c);
    return s;
}

std::string ascii_lower(std::string s) {
    for (char& c : s) c = low(c);
    return s;
}

std::string py_title(const std::string& s) {
    std::string out = s;
    bool prev_cased = false;
    for (char& c : out) {
        if (is_alpha(c)) {
            c = prev_cased ? low(c) : up(c);
            prev_cased = true;
        } else {
            prev_cased = false;
        }
    }
    return out;
}

std::string py_capitalize(const std::string& s) {
    std::string out = ascii_lower(s);
    if (!out.empty()) out[0] = up(out[0]);
    return out;
}

std::string jinja_title(const std::string& s) {
    // re.split(r"([-\s({\[<]+)") and each piece's first char upper, the rest lower
    auto is_sep = [](char c) { return c == '-' || py_space(c) || c == '(' || c == '{' || c == '[' || c == '<'; };
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = i;
        const bool sep = is_sep(s[i]);
        while (j < s.size() && is_sep(s[j]) == sep) ++j;
        std::string piece = s.substr(i, j - i);
        if (!sep) {
            piece = ascii_lower(piece);
            piece[0] = up(piece[0]);
        } else {
            piece[0] = up(piece[0]);
        }
        out += piece;
        i = j;
    }
    return out;
}

bool py_is(const std::string& s, const std::string& what) {
    if (s.empty()) return false;
    bool any_cased = false;
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (what == "isdigit" || what == "isnumeric" || what == "isdecimal") {
            if (!std::isdigit(u)) return false;
        } else if (what == "isalpha") {
            if (!std::isalpha(u)) return false;
        } else if (what == "isalnum") {
            if (!std::isalnum(u)) return false;
        } else if (what == "isspace") {
            if (!py_space(c)) return false;
        } else if (what == "isupper") {
            if (std::islower(u)) return false;
            any_cased |= std::isupper(u) != 0;
        } else if (what == "islower") {
            if (std::isupper(u)) return false;
            any_cased |= std::islower(u) != 0;
        }
    }
    return (what == "isupper" || what == "islower") ? any_cased : true;
}

std::string format_spec(const value& v, const std::string& spec) {
    // [[fill]align][sign][0][width][.precision][type]
    size_t i = 0;
    char fill = ' ', align = 0, sign = '-';
    if (spec.size() >= 2 && std::strchr("<>^", spec[1])) {
        fill = spec[0];
        align = spec[1];
        i = 2;
    } else if (!spec.empty() && std::strchr("<>^", spec[0])) {
        align = spec[0];
        i = 1;
    }
    if (i < spec.size() && std::strchr("+- ", spec[i])) sign = spec[i++];
    bool zero = false;
    if (i < spec.size() && spec[i] == '0') {
        zero = true;
        ++i;
    }
    int width = 0, precision = -1;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) width = std::min(width * 10 + (spec[i++] - '0'), 4096);
    if (i < spec.size() && spec[i] == '.') {
        precision = 0;
        ++i;
        while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i])))
            precision = std::min(precision * 10 + (spec[i++] - '0'), 300);
    }
    char type = i < spec.size() ? spec[i++] : 0;
    if (i != spec.size()) throw error("Invalid format specifier '" + spec + "'");
    std::string body;
    const bool numeric = v.is_number() && !v.is_bool();
    if (type == 0 && numeric) type = v.is_float() ? (precision >= 0 ? 'g' : 0) : 'd';
    if (type == 0 || type == 's') {
        if (type == 's' && !v.is_string()) throw error("Unknown format code 's' for object of type '" + type_name(v) + "'");
        body = to_str(v);
        if (precision >= 0) {
            auto cps = code_points(body);
            if (cps.size() > size_t(precision)) {
                body.clear();
                for (int k = 0; k < precision; ++k) body += cps[size_t(k)];
            }
        }
    } else if (std::strchr("dfFeEgG%xXob", type)) {
        if (!v.is_number()) throw error(std::string("Unknown format code '") + type + "' for object of type '" + type_name(v) + "'");
        char buf[512];
        std::string f = "%";
        if (sign != '-') f += sign;
        if (type == 'd' || type == 'x' || type == 'X' || type == 'o') {
            if (v.is_float()) throw error(std::string("Unknown format code '") + type + "' for object of type 'float'");
            f += std::string("ll") + (type == 'd' ? 'd' : type);
            std::snprintf(buf, sizeof buf, f.c_str(), static_cast<long long>(v.as_int()));
        } else if (type == '%') {
            f += "." + std::to_string(precision < 0 ? 6 : precision) + "f%%";
            std::snprintf(buf, sizeof buf, f.c_str(), v.as_double() * 100);
        } else {
            f += "." + std::to_string(precision < 0 ? 6 : precision) + type;
            std::snprintf(buf, sizeof buf, f.c_str(), v.as_double());
        }
        body = buf;
    } else {
        throw error(std::string("Unknown format code '") + type + "'");
    }
    const int n = int(n_code_points(body));
    if (width > n) {
        const size_t pad = size_t(width - n);
        if (!align) align = numeric ? '>' : '<';
        if (zero && numeric && align == '>') {
            const size_t at = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
            body.insert(at, pad, '0');
        } else if (align == '<') body += std::string(pad, fill);
        else if (align == '>') body = std::string(pad, fill) + body;
        else body = std::string(pad / 2, fill) + body + std::string(pad - pad / 2, fill);
    }
    return body;
}

std::string py_str_format(evaluator& ev, const std::string& fmt, const call_args& args) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
            else throw error("Single '}' encountered in format string");
            out.push_back('}');
            continue;
        }
        if (c != '{') {
            out.push_back(c);
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out.push_back('{');
            ++i;
            continue;
        }
        const size_t close = fmt.find('}', i);
        if (close == std::string::npos) throw error("Single '{' encountered in format string");
        std::string field = fmt.substr(i + 1, close - i - 1);
        std::string spec;
        const size_t colon = field.find(':');
        if (colon != std::string::npos) {
            spec = field.substr(colon + 1);
            field.resize(colon);
        }
        const value* v = nullptr;
        if (field.empty()) {
            if (auto_idx >= args.pos.size()) throw error("Replacement index out of range for positional args tuple");
            v = &args.pos[auto_idx++];
        } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
            const size_t k = size_t(std::stoul(field));
            if (k >= args.pos.size()) throw error("Replacement index out of range for positional args tuple");
            v = &args.pos[k];
        } else {
            for (const auto& kw : args.kw)
                if (kw.name == field) v = &kw.v;
            if (!v) throw error("KeyError: '" + field + "'");
        }
        out += spec.empty() ? to_str(*v) : format_spec(*v, spec);
        ev.check_size(out.size());
        i = close;
    }
    return out;
}

} // namespace tandem::jinja
