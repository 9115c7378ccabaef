// Citations: normalisation, the documents' suffix automaton, and the finder that walks it with
// the reply's bytes (the longest suffix of the reply that some document contains, kept up to
// date a byte at a time; when the next byte cannot extend it, that match was maximal).
#include "runtime/citations.hpp"

#include "runtime/error.hpp"

#include <algorithm>

namespace tandem {
namespace {

bool is_space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\f' || b == '\v' || b == 0; }

// Letters, digits, '_' and every byte of a multi-byte character: a span never starts or ends
// inside a run of them.
bool is_word(uint8_t b) {
    return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_' || b >= 0x80;
}

// Whether a span may not start at byte i of s (it would cut a word: word bytes on both sides).
bool inside_word(std::string_view s, int64_t i) {
    return i > 0 && i < int64_t(s.size()) && is_word(uint8_t(s[size_t(i) - 1])) && is_word(uint8_t(s[size_t(i)]));
}

constexpr uint8_t separator = 0; // between documents: normalisation turns a reply's NULs into spaces

} // namespace

void normalized_text::append(std::string_view original) {
    for (char ch : original) {
        const uint8_t b = uint8_t(ch);
        if ((b & 0xC0) != 0x80 || n_code_points == 0) ++n_code_points; // a character starts here (or a stray byte)
        const int64_t cp = n_code_points - 1, at = n_bytes++;
        if (is_space(b)) {
            if (in_space) continue;
            in_space = true;
            text.push_back(' ');
        } else {
            in_space = false;
            text.push_back(b >= 'A' && b <= 'Z' ? char(b - 'A' + 'a') : ch);
        }
        code_point.push_back(cp);
        byte.push_back(at);
    }
}

document_index::document_index(const std::vector<std::string>& documents) {
    std::vector<std::vector<std::pair<uint8_t, int32_t>>> out(1); // each state's transitions while building
    states_.push_back({});
    int32_t last = 0, pos = 0;
    for (size_t d = 0; d < documents.size(); ++d) {
        normalized_text n;
        n.append(documents[d]);
        if (d > 0) extend(out, last, separator, pos++);
        begin_.push_back(pos);
        for (char c : n.text) extend(out, last, uint8_t(c), pos++);
        docs_.push_back(std::move(n));
    }
    for (size_t s = 0; s < out.size(); ++s)
        for (auto [c, t] : out[s]) edges_.emplace_back(uint64_t(s) << 8 | c, t);
    std::sort(edges_.begin(), edges_.end());
}

// The suffix automaton's online construction (Blumer et al.): one more byte at position pos.
void document_index::extend(std::vector<std::vector<std::pair<uint8_t, int32_t>>>& out, int32_t& last, uint8_t c,
                            int32_t pos) {
    const auto find = [&](int32_t s) -> std::pair<uint8_t, int32_t>* {
        for (auto& e : out[size_t(s)])
            if (e.first == c) return &e;
        return nullptr;
    };
    const int32_t cur = int32_t(states_.size());
    states_.push_back({-1, states_[size_t(last)].length + 1, pos});
    out.emplace_back();
    int32_t p = last;
    for (; p != -1 && !find(p); p = states_[size_t(p)].link) out[size_t(p)].emplace_back(c, cur);
    if (p == -1) {
        states_[size_t(cur)].link = 0;
    } else {
        const int32_t q = find(p)->second;
        if (states_[size_t(p)].length + 1 == states_[size_t(q)].length) {
            states_[size_t(cur)].link = q;
        } else {
            const int32_t clone = int32_t(states_.size());
            states_.push_back({states_[size_t(q)].link, states_[size_t(p)].length + 1, states_[size_t(q)].first_end});
            out.push_back(out[size_t(q)]);
            for (std::pair<uint8_t, int32_t>* e; p != -1 && (e = find(p)) && e->second == q; p = states_[size_t(p)].link)
                e->second = clone;
            states_[size_t(q)].link = clone;
            states_[size_t(cur)].link = clone;
        }
    }
    last = cur;
}

int32_t document_index::next(int32_t s, uint8_t c) const {
    const uint64_t key = uint64_t(s) << 8 | c;
    const auto it = std::lower_bound(edges_.begin(), edges_.end(), std::pair<uint64_t, int32_t>(key, -1));
    return it != edges_.end() && it->first == key ? it->second : -1;
}

int32_t document_index::document_of(int64_t p) const {
    return int32_t(std::upper_bound(begin_.begin(), begin_.end(), p) - begin_.begin()) - 1;
}

citation_finder::citation_finder(std::shared_ptr<const document_index> docs, int32_t min_tokens)
    : docs_(std::move(docs)), min_tokens_(std::max(1, min_tokens)) {}

std::vector<citation> citation_finder::push(std::string_view text) {
    std::vector<citation> out;
    original_ += text;
    reply_.append(text);
    token_end_.push_back(int64_t(reply_.text.size()));
    for (; n_matched_ < reply_.text.size(); ++n_matched_) {
        const uint8_t c = uint8_t(reply_.text[n_matched_]);
        if (const int32_t t = docs_->next(state_, c); t >= 0) { // the match goes on
            state_ = t;
            ++length_;
            continue;
        }
        close(int64_t(n_matched_), out); // it ended at the byte before: it was maximal
        int32_t s = state_;
        while (s != -1 && docs_->next(s, c) < 0) s = docs_->at(s).link;
        state_ = s == -1 ? 0 : docs_->next(s, c);
        length_ = s == -1 ? 0 : docs_->at(s).length + 1;
    }
    return out;
}

std::vector<citation> citation_finder::finish() {
    std::vector<citation> out;
    close(int64_t(reply_.text.size()), out);
    state_ = 0;
    length_ = 0;
    return out;
}

void citation_finder::close(int64_t end, std::vector<citation>& out) {
    if (length_ == 0) return;
    const std::string_view r = reply_.text;
    // reply bytes [s0, end) equal document bytes [d0, d0 + length) of the concatenation
    const int64_t s0 = end - length_, d0 = int64_t(docs_->at(state_).first_end) - length_ + 1;
    const int32_t d = docs_->document_of(d0);
    const int64_t doc_begin = d0 - docs_->document_offset(d0);
    const std::string_view doc = docs_->document(d).text;
    const auto doc_at = [&](int64_t i) { return i - s0 + d0 - doc_begin; }; // reply byte i -> document byte
    int64_t s = std::max(s0, last_end_), e = end;                           // not over an earlier citation
    // whole words: from a word's first byte to a word's last, in the reply and the document
    while (s < e && (!is_word(uint8_t(r[size_t(s)])) || inside_word(r, s) || inside_word(doc, doc_at(s)))) ++s;
    while (e > s && (!is_word(uint8_t(r[size_t(e) - 1])) || inside_word(r, e) || inside_word(doc, doc_at(e)))) --e;
    if (s >= e) return;
    // tokens whose text overlaps [s, e)
    const auto first = std::upper_bound(token_end_.begin(), token_end_.end(), s);
    const auto last = std::lower_bound(token_end_.begin(), token_end_.end(), e);
    if (last - first + 1 < min_tokens_) return;
    citation c;
    c.start = reply_.code_point[size_t(s)];
    c.end = reply_.code_point[size_t(e) - 1] + 1;
    c.text = original_.substr(size_t(reply_.byte[size_t(s)]), size_t(reply_.byte[size_t(e) - 1] + 1 - reply_.byte[size_t(s)]));
    c.document = d;
    const normalized_text& nd = docs_->document(d);
    c.document_start = nd.code_point[size_t(doc_at(s))];
    c.document_end = nd.code_point[size_t(doc_at(e) - 1)] + 1;
    last_end_ = e;
    found_.push_back(c);
    out.push_back(std::move(c));
}

} // namespace tandem
