// Unicode look-ups over the generated range tables, strict UTF-8 coding, GPT-2 byte map.
#include "runtime/unicode.hpp"

#include <algorithm>
#include <array>

namespace tandem::unicode {
namespace {

constexpr uint8_t flags_of_category(category c) {
    switch (c) {
    case category::lu: case category::ll: case category::lt: case category::lm: case category::lo:
        return letter;
    case category::mn: case category::mc: case category::me:
        return mark;
    case category::nd: case category::nl: case category::no:
        return number;
    case category::pc: case category::pd: case category::ps: case category::pe:
    case category::pi: case category::pf: case category::po:
        return punctuation;
    case category::sm: case category::sc: case category::sk: case category::so:
        return symbol;
    case category::zs: case category::zl: case category::zp:
        return separator;
    case category::cc: case category::cf: case category::cs: case category::co:
        return other;
    case category::cn:
        return 0;
    }
    return 0;
}

category lookup_category(char32_t cpt) {
    if (cpt > 0x10FFFF) return category::cn;
    const uint32_t* first = detail::category_runs;
    const uint32_t* last = first + detail::n_category_runs;
    // The last run starting at or before cpt.
    const uint32_t* it = std::upper_bound(first, last, uint32_t(cpt) << 8 | 0xFF);
    return category((it[-1]) & 0xFF);
}

bool lookup_whitespace(char32_t cpt) {
    for (size_t i = 0; i < detail::n_whitespace_ranges; ++i) {
        if (cpt < detail::whitespace_ranges[i][0]) return false;
        if (cpt <= detail::whitespace_ranges[i][1]) return true;
    }
    return false;
}

// Text is mostly ASCII and Latin: the first 256 code points skip the binary search.
struct latin1_table {
    std::array<uint8_t, 256> flags{};
    latin1_table() {
        for (char32_t c = 0; c < 256; ++c) {
            flags[c] = flags_of_category(lookup_category(c)) | (lookup_whitespace(c) ? whitespace : 0);
        }
    }
};

const latin1_table& latin1() {
    static const latin1_table t;
    return t;
}

struct byte_map {
    std::array<std::string, 256> piece;
    std::array<int16_t, 324> byte_of; // code points 0..323 cover the whole map
    byte_map() {
        byte_of.fill(-1);
        int n_shifted = 0;
        for (int b = 0; b < 256; ++b) {
            // Printable Latin-1 stands for itself; control bytes, space, DEL..NBSP and the
            // soft hyphen move to U+0100 upwards, in byte order.
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            const char32_t cpt = printable ? char32_t(b) : char32_t(256 + n_shifted++);
            piece[b] = to_utf8(cpt);
            byte_of[cpt] = int16_t(b);
        }
    }
};

const byte_map& bytes() {
    static const byte_map m;
    return m;
}

} // namespace

category category_of(char32_t cpt) {
    return lookup_category(cpt);
}

uint8_t flags_of(char32_t cpt) {
    if (cpt < 256) return latin1().flags[cpt];
    return flags_of_category(lookup_category(cpt)) | (lookup_whitespace(cpt) ? whitespace : 0);
}

bool is_whitespace(char32_t cpt) {
    return cpt < 256 ? (latin1().flags[cpt] & whitespace) != 0 : lookup_whitespace(cpt);
}

char32_t to_lower(char32_t cpt) {
    if (cpt < 0x80) return cpt >= 'A' && cpt <= 'Z' ? cpt + 32 : cpt;
    const auto* first = detail::lowercase_pairs;
    const auto* last = first + detail::n_lowercase_pairs;
    const auto* it = std::lower_bound(first, last, cpt, [](const char32_t (&p)[2], char32_t c) { return p[0] < c; });
    return it != last && (*it)[0] == cpt ? (*it)[1] : cpt;
}

std::string_view unicode_version() {
    return detail::unicode_version;
}

decoded decode_utf8(std::string_view s, size_t pos) {
    const auto at = [&](size_t i) { return uint8_t(s[i]); };
    const uint8_t b0 = at(pos);
    if (b0 < 0x80) return {b0, 1, true};
    uint32_t n;
    char32_t cpt;
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2; cpt = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3; cpt = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;      // overlong
        if (b0 == 0xED) hi = 0x9F;      // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4; cpt = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;      // overlong
        if (b0 == 0xF4) hi = 0x8F;      // past U+10FFFF
    } else {
        return {replacement, 1, false};
    }
    for (uint32_t i = 1; i < n; ++i) {
        if (pos + i >= s.size()) return {replacement, i, false};
        const uint8_t b = at(pos + i);
        const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return {replacement, i, false};
        cpt = cpt << 6 | (b & 0x3F);
    }
    return {cpt, n, true};
}

void append_utf8(std::string& out, char32_t cpt) {
    if (cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) cpt = replacement;
    if (cpt < 0x80) {
        out += char(cpt);
    } else if (cpt < 0x800) {
        out += char(0xC0 | cpt >> 6);
        out += char(0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        out += char(0xE0 | cpt >> 12);
        out += char(0x80 | (cpt >> 6 & 0x3F));
        out += char(0x80 | (cpt & 0x3F));
    } else {
        out += char(0xF0 | cpt >> 18);
        out += char(0x80 | (cpt >> 12 & 0x3F));
        out += char(0x80 | (cpt >> 6 & 0x3F));
        out += char(0x80 | (cpt & 0x3F));
    }
}

std::string to_utf8(char32_t cpt) {
    std::string s;
    append_utf8(s, cpt);
    return s;
}

bool is_valid_utf8(std::string_view s) {
    for (size_t pos = 0; pos < s.size();) {
        const decoded d = decode_utf8(s, pos);
        if (!d.valid) return false;
        pos += d.len;
    }
    return true;
}

size_t incomplete_tail(std::string_view s) {
    // Only the last sequence can be unfinished; it starts at most 3 bytes from the end.
    const size_t from = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t start = from; start < s.size(); ++start) {
        const decoded d = decode_utf8(s, start);
        // Invalid only because the bytes ran out: a prefix that may still complete.
        const uint8_t lead = uint8_t(s[start]);
        if (!d.valid && start + d.len == s.size() && lead >= 0xC2 && lead <= 0xF4) {
            return s.size() - start;
        }
    }
    return 0;
}

std::string sanitize_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t pos = 0; pos < s.size();) {
        const decoded d = decode_utf8(s, pos);
        if (d.valid) {
            out.append(s.substr(pos, d.len));
        } else {
            append_utf8(out, replacement);
        }
        pos += d.len;
    }
    return out;
}

std::string_view byte_to_piece(uint8_t b) {
    return bytes().piece[b];
}

int piece_to_byte(char32_t cpt) {
    return cpt < bytes().byte_of.size() ? bytes().byte_of[cpt] : -1;
}

} // namespace tandem::unicode
