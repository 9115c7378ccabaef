// Documents larger than the context: split into passages, ranked against the question with
// the loaded model's own embeddings, the best that fit rendered in their place.
#pragma once

#include "daemon/grounding.hpp"
#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem::daemon {

// A piece of one document: whole paragraphs while they fit, else sentences, else words (else
// bytes), packed up to a token budget and trimmed of surrounding whitespace.
struct passage {
    int32_t document = 0;             // its index in the request's documents
    int64_t begin = 0, end = 0;       // bytes of the document's text
    int64_t start = 0, stop = 0;      // the same in code points (what the API reports)
    int32_t n_tokens = 0;             // its text's tokens (no BOS)
};

// Every document's passages, in document order, each of at most max_tokens tokens.
std::vector<passage> split_passages(const std::vector<document>& docs, const tokenizer& tok, int32_t max_tokens);

// Passage p as a document to render: the original's id and title, its text, and where it
// sits in the original (citations point into the original documents).
document passage_document(const passage& p, const std::vector<document>& docs);

// The passages' indices, most similar to the query first (embeddings are unit vectors: the
// dot product is the cosine); ties keep document order.
std::vector<size_t> rank_passages(std::span<const float> query, const std::vector<std::vector<float>>& embeddings);

// Embeddings of texts already embedded (a passage asked about again), least recently used
// dropped past max_entries. The io thread's alone.
class embedding_cache {
public:
    explicit embedding_cache(size_t max_entries) : max_(max_entries) {}
    const std::vector<float>* find(const std::string& text);
    void put(const std::string& text, std::vector<float> v);
    size_t size() const { return map_.size(); }

private:
    using entry = std::pair<std::string, std::vector<float>>;
    size_t max_;
    std::list<entry> lru_; // most recent first
    std::unordered_map<std::string_view, std::list<entry>::iterator> map_; // keys view lru_'s strings
};

} // namespace tandem::daemon
