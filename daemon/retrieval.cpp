// Passages of documents larger than the context, their ranking, and the embedding cache.
#include "daemon/retrieval.hpp"

#include <algorithm>
#include <cctype>
#include <numeric>

namespace tandem::daemon {
namespace {

struct unit {
    int64_t begin, end;
    int32_t n_tokens;
};

bool space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Where a piece may be cut at each level: after a blank line (paragraphs), after the space
// that follows a sentence's end, before a word.
bool cut_before(const std::string& t, int64_t i, int level) {
    if (level == 0) return t[size_t(i - 1)] == '\n' && t[size_t(i - 2)] == '\n';
    if (level == 1) return space(t[size_t(i - 1)]) && std::string_view(".!?").find(t[size_t(i - 2)]) != std::string_view::npos;
    return space(t[size_t(i - 1)]) && !space(t[size_t(i)]);
}

// Splits t[b, e) into units of at most max_tokens tokens, each level finer than the last; a
// piece no level can cut (one long word) is cut every max_tokens bytes at character
// boundaries (a token covers at least one byte).
void split(const std::string& t, int64_t b, int64_t e, int level, const tokenizer& tok, int32_t max_tokens,
           std::vector<unit>& out) {
    const int32_t n = int32_t(tok.encode(std::string_view(t).substr(size_t(b), size_t(e - b))).size());
    if (n <= max_tokens) {
        out.push_back({b, e, n});
        return;
    }
    std::vector<int64_t> cuts{b};
    if (level < 3) {
        for (int64_t i = b + 2; i < e; ++i)
            if (cut_before(t, i, level)) cuts.push_back(i);
    } else {
        for (int64_t i = b + 1; i < e; ++i)
            if (i - cuts.back() >= max_tokens && !continuation(t[size_t(i)])) cuts.push_back(i);
    }
    cuts.push_back(e);
    if (cuts.size() == 2 && level < 3) { // nothing to cut at this level: the next
        split(t, b, e, level + 1, tok, max_tokens, out);
        return;
    }
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        if (level == 3) out.push_back({cuts[k], cuts[k + 1], max_tokens});
        else split(t, cuts[k], cuts[k + 1], level + 1, tok, max_tokens, out);
    }
}

int64_t code_points(std::string_view s) {
    return std::count_if(s.begin(), s.end(), [](char c) { return !continuation(c); });
}

} // namespace

std::vector<passage> split_passages(const std::vector<document>& docs, const tokenizer& tok, int32_t max_tokens) {
    std::vector<passage> out;
    for (size_t d = 0; d < docs.size(); ++d) {
        const std::string& t = docs[d].text;
        std::vector<unit> units;
        if (!t.empty()) split(t, 0, int64_t(t.size()), 0, tok, max_tokens, units);
        // Packs consecutive units while the sum of their tokens fits, then trims the whitespace
        // at the ends (a passage of only whitespace is dropped). Code points are counted on
        // from the last passage's start (passages come in order): linear in the text.
        int64_t counted_bytes = 0, counted = 0;
        auto emit = [&](int64_t b, int64_t e, int32_t n) {
            while (b < e && space(t[size_t(b)])) ++b;
            while (e > b && space(t[size_t(e - 1)])) --e;
            if (b == e) return;
            passage p{int32_t(d), b, e, 0, 0, n};
            counted += code_points(std::string_view(t).substr(size_t(counted_bytes), size_t(b - counted_bytes)));
            counted_bytes = b;
            p.start = counted;
            p.stop = p.start + code_points(std::string_view(t).substr(size_t(b), size_t(e - b)));
            out.push_back(p);
        };
        int64_t b = 0, e = 0;
        int32_t n = 0;
        for (const unit& u : units) {
            if (n > 0 && n + u.n_tokens > max_tokens) {
                emit(b, e, n);
                b = u.begin;
                n = 0;
            }
            e = u.end;
            n += u.n_tokens;
        }
        if (e > b) emit(b, e, n);
    }
    return out;
}

document passage_document(const passage& p, const std::vector<document>& docs) {
    const document& d = docs[size_t(p.document)];
    document out;
    out.id = d.id;
    out.title = d.title;
    out.text = d.text.substr(size_t(p.begin), size_t(p.end - p.begin));
    out.source = p.document;
    out.source_start = p.start;
    return out;
}

std::vector<size_t> rank_passages(std::span<const float> query, const std::vector<std::vector<float>>& embeddings) {
    std::vector<double> sim(embeddings.size());
    for (size_t i = 0; i < embeddings.size(); ++i)
        for (size_t j = 0; j < query.size() && j < embeddings[i].size(); ++j) sim[i] += double(query[j]) * embeddings[i][j];
    std::vector<size_t> order(embeddings.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sim[a] > sim[b]; });
    return order;
}

const std::vector<float>* embedding_cache::find(const std::string& text) {
    auto it = map_.find(text);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return &it->second->second;
}

void embedding_cache::put(const std::string& text, std::vector<float> v) {
    if (max_ == 0 || find(text)) return;
    lru_.emplace_front(text, std::move(v));
    map_.emplace(lru_.front().first, lru_.begin());
    if (lru_.size() > max_) {
        map_.erase(lru_.back().first);
        lru_.pop_back();
    }
}

} // namespace tandem::daemon
