// Citations: the spans of a reply that copy a supplied document, found while the reply is
// generated. Matching ignores letter case and collapses whitespace, so a copy is seen whatever
// tokens spelled it; every span runs from a word's start to a word's end (punctuation around
// it is left out), and the longest copy at each point wins.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// A span of the reply copied from a document. Offsets count Unicode code points (as Python
// and OpenAI do), end exclusive: reply[start, end) is `text`, and document[document_start,
// document_end) is the same text after normalisation.
struct citation {
    int64_t start = 0, end = 0;
    std::string text;
    int32_t document = 0;
    int64_t document_start = 0, document_end = 0;
};

// Text as matching sees it: lowercased (Unicode's simple mapping), each run of whitespace one
// space. Every byte of it remembers the character of the original it came from (a collapsed
// run: its first whitespace character): its code point index, its bytes, and whether it is
// part of a word (a letter, digit, mark or '_').
struct normalized_text {
    std::string text;
    std::vector<int64_t> code_point;  // [text.size()]
    std::vector<int64_t> byte, byte_end; // [text.size()] the character's bytes in the original
    std::vector<uint8_t> word;        // [text.size()]
    int64_t n_code_points = 0;        // of the original, so far
    int64_t n_bytes = 0;
    bool verbatim = false;            // keep case and whitespace (the text is the original's)

    // Appends the next piece of the original. A UTF-8 sequence split between pieces waits for
    // its last byte; an invalid one counts a character a byte.
    void append(std::string_view original);
    // The original ended: a sequence still waiting goes in as it is.
    void flush();

private:
    std::string pending_;             // the start of a split sequence
    bool in_space_ = false;           // the last character was whitespace
    void add(std::string_view ch, char32_t cpt, bool valid);
};

// The documents, indexed for matching: a suffix automaton over their normalised texts (or,
// verbatim, their texts as they are), one after another with a separator no reply contains.
// Built once per request (shared by its sequences), read-only after.
class document_index {
public:
    explicit document_index(const std::vector<std::string>& documents, bool verbatim = false);

    struct state {
        int32_t link = -1;            // the suffix link
        int32_t length = 0;           // longest string of the state
        int32_t first_end = 0;        // where its first occurrence ends (the last byte's index)
    };
    // The transition from state s by byte c, or -1.
    int32_t next(int32_t s, uint8_t c) const;
    const state& at(int32_t s) const { return states_[size_t(s)]; }

    // Where byte p of the concatenation is: its document, and that document's normalised text.
    int32_t document_of(int64_t p) const;
    int64_t document_offset(int64_t p) const { return p - begin_[size_t(document_of(p))]; }
    const normalized_text& document(int32_t d) const { return docs_[size_t(d)]; }
    size_t n_documents() const { return docs_.size(); }

private:
    std::vector<normalized_text> docs_;
    std::vector<int64_t> begin_;      // [n_documents] where each starts in the concatenation
    std::vector<state> states_;
    std::vector<std::pair<uint64_t, int32_t>> edges_; // (state << 8 | byte, target), sorted

    void extend(std::vector<std::vector<std::pair<uint8_t, int32_t>>>& out, int32_t& last, uint8_t c, int32_t pos);
};

// Follows one reply: push() each piece of text as the engine releases it (one generated
// token's), finish() at its end. Each returns the citations that closed with it, in order.
// A citation is a maximal match (the longest copy ending where the next byte breaks it),
// trimmed to whole words in the reply and the document, of at least min_tokens tokens; a match
// that overlaps an earlier citation starts after it (overlapping copies of one place would
// have been one match), so citations never overlap.
class citation_finder {
public:
    citation_finder(std::shared_ptr<const document_index> docs, int32_t min_tokens);

    std::vector<citation> push(std::string_view text);
    std::vector<citation> finish();
    const std::vector<citation>& all() const { return found_; }

private:
    std::shared_ptr<const document_index> docs_;
    int32_t min_tokens_;
    normalized_text reply_;
    std::string original_;             // the reply as released
    std::vector<int64_t> token_end_;   // [tokens] where each token's text ends in reply_.text
    size_t n_matched_ = 0;             // bytes of reply_.text fed to the automaton
    int32_t state_ = 0, length_ = 0;   // the longest suffix matched so far: its state and length
    std::vector<citation> found_;
    int64_t last_end_ = 0;             // in reply_.text bytes: where the last citation ends

    void match(std::vector<citation>& out);             // walks the reply's new bytes
    void close(int64_t end, std::vector<citation>& out); // the match ending before byte `end` broke
};

} // namespace tandem
