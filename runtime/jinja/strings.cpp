// Python's str methods for the Jinja engine.
#include "runtime/jinja/strings.hpp"

#include "runtime/jinja/evaluator.hpp"

#include <cctype>

namespace tandem::jinja {

bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

namespace {
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
char up(char c) { return char(std::toupper(static_cast<unsigned char>(c))); }
char low(char c) { return char(std::tolower(static_cast<unsigned char>(c))); }
} // namespace

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
    auto strip_me = [&](char c) { return chars ? chars->find(c) != std::string::npos : py_space(c); };
    size_t b = 0, e = s.size();
    if (left)
        while (b < e && strip_me(s[b])) ++b;
    if (right)
        while (e > b && strip_me(s[e - 1])) --e;
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
        const size_t colon = field.find(':');
        if (colon != std::string::npos) {
            if (colon + 1 != field.size()) throw error("format specs in str.format are not supported");
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
        out += to_str(*v);
        ev.check_size(out.size());
        i = close;
    }
    return out;
}

} // namespace tandem::jinja
