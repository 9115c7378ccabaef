// Citations: normalisation, the documents' suffix automaton, and the finder that walks it with
// the reply's bytes (the longest suffix of the reply that some document contains, kept up to
// date a byte at a time; when the next byte cannot extend it, that match was maximal).
#include "runtime/citations.hpp"

#include "runtime/unicode.hpp"

#include <algorithm>
#include <utility>

namespace tandem {
namespace {

// Whether a span may not start (or end) at byte i: it would cut a word, word bytes on both sides.
bool inside_word(const normalized_text& t, int64_t i) {
    return i > 0 && i < int64_t(t.text.size()) && t.word[size_t(i) - 1] && t.word[size_t(i)];
}

constexpr uint8_t separator = 0; // between documents: normalisation turns a reply's NULs into spaces

} // namespace

void normalized_text::append(std::string_view original) {
    pending_ += original;
    size_t i = 0;
    const size_t complete = pending_.size() - unicode::incomplete_tail(pending_);
    while (i < complete) {
        const unicode::decoded d = unicode::decode_utf8(pending_, i);
        add(std::string_view(pending_).substr(i, d.len), d.cpt, d.valid);
        i += d.len;
    }
    pending_.erase(0, i);
}

void normalized_text::flush() {
    for (char ch : std::exchange(pending_, {})) add(std::string_view(&ch, 1), unicode::replacement, false);
}

void normalized_text::add(std::string_view ch, char32_t cpt, bool valid) {
    const int64_t cp = n_code_points++, begin = n_bytes, end = (n_bytes += int64_t(ch.size()));
    const size_t from = text.size();
    if (verbatim) {
        text += ch;
    } else if (cpt == 0 || unicode::is_whitespace(cpt)) {
        if (in_space_) return;
        in_space_ = true;
        text.push_back(' ');
    } else {
        in_space_ = false;
        if (valid) unicode::append_utf8(text, unicode::to_lower(cpt));
        else text += ch; // as it is
    }
    const bool is_word = valid && (cpt == '_' || (unicode::flags_of(cpt) & (unicode::letter | unicode::number | unicode::mark)));
    for (size_t k = from; k < text.size(); ++k) {
        code_point.push_back(cp);
        byte.push_back(begin);
        byte_end.push_back(end);
        word.push_back(is_word);
    }
}

document_index::document_index(const std::vector<std::string>& documents, bool verbatim) {
    std::vector<std::vector<std::pair<uint8_t, int32_t>>> out(1); // each state's transitions while building
    states_.push_back({});
    int32_t last = 0, pos = 0;
    for (size_t d = 0; d < documents.size(); ++d) {
        normalized_text n;
        n.verbatim = verbatim;
        n.append(documents[d]);
        n.flush();
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
    match(out);
    return out;
}

std::vector<citation> citation_finder::finish() {
    std::vector<citation> out;
    reply_.flush(); // (a split sequence still waiting: part of the last token)
    if (!token_end_.empty()) token_end_.back() = int64_t(reply_.text.size());
    match(out);
    close(int64_t(reply_.text.size()), out);
    state_ = 0;
    length_ = 0;
    return out;
}

void citation_finder::match(std::vector<citation>& out) {
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
}

void citation_finder::close(int64_t end, std::vector<citation>& out) {
    if (length_ == 0) return;
    const normalized_text& r = reply_;
    // Reply bytes [s0, end) are document d's bytes from d_s0 on.
    const int64_t s0 = end - length_;
    int64_t at = int64_t(docs_->at(state_).first_end) - length_ + 1;
    int32_t d = docs_->document_of(at);
    int64_t d_s0 = docs_->document_offset(at);
    const auto doc_at = [&](int64_t i) { return i - s0 + d_s0; }; // reply byte i -> document d's byte
    int64_t s = std::max(s0, last_end_), e = end;                  // not over an earlier citation
    // whole words: from a word's first byte to a word's last, in the reply and the document
    while (s < e && (!r.word[size_t(s)] || inside_word(r, s) || inside_word(docs_->document(d), doc_at(s)))) ++s;
    while (e > s && (!r.word[size_t(e) - 1] || inside_word(r, e) || inside_word(docs_->document(d), doc_at(e)))) --e;
    if (s >= e) return;
    // tokens whose text overlaps [s, e)
    const auto first = std::upper_bound(token_end_.begin(), token_end_.end(), s);
    const auto last = std::lower_bound(token_end_.begin(), token_end_.end(), e);
    if (last - first + 1 < min_tokens_) return;
    // The span's first occurrence (the earliest document) when it is whole words there too.
    int32_t st = 0;
    for (int64_t i = s; i < e; ++i) st = docs_->next(st, uint8_t(r.text[size_t(i)]));
    at = int64_t(docs_->at(st).first_end) - (e - s) + 1;
    const int32_t fd = docs_->document_of(at);
    const int64_t f_s = docs_->document_offset(at);
    if (!inside_word(docs_->document(fd), f_s) && !inside_word(docs_->document(fd), f_s + (e - s))) {
        d = fd;
        d_s0 = f_s - (s - s0);
    }
    const normalized_text& doc = docs_->document(d);
    citation c;
    c.start = r.code_point[size_t(s)];
    c.end = r.code_point[size_t(e) - 1] + 1;
    c.text = original_.substr(size_t(r.byte[size_t(s)]), size_t(r.byte_end[size_t(e) - 1] - r.byte[size_t(s)]));
    c.document = d;
    c.document_start = doc.code_point[size_t(doc_at(s))];
    c.document_end = doc.code_point[size_t(doc_at(e) - 1)] + 1;
    last_end_ = e;
    found_.push_back(c);
    out.push_back(std::move(c));
}

} // namespace tandem
