// Citations: the documents' suffix automaton against brute-force matching, the finder's
// invariants over many random replies fed in random pieces (multi-byte text split anywhere),
// worked examples, and precision and recall on a hand-labelled set (tests/data/citations.json).
#include "runtime/citations.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>

using namespace tandem;

namespace {

std::string normalise(std::string_view s) {
    normalized_text n;
    n.append(s);
    n.flush();
    return n.text;
}

// Code points [a, b) of UTF-8 text.
std::string cp_slice(const std::string& s, int64_t a, int64_t b) {
    std::vector<size_t> at; // byte offset of each code point, and the end
    for (size_t i = 0; i < s.size(); ++i)
        if ((uint8_t(s[i]) & 0xC0) != 0x80) at.push_back(i);
    at.push_back(s.size());
    REQUIRE(a >= 0);
    REQUIRE(a <= b);
    REQUIRE(size_t(b) < at.size());
    return s.substr(at[size_t(a)], at[size_t(b)] - at[size_t(a)]);
}

bool word_byte(char c) { return std::isalnum(uint8_t(c)) || c == '_' || uint8_t(c) >= 0x80; }

// Everything a citation promises, checked against the reply and the documents as given.
void check_citations(const std::vector<citation>& cs, const std::string& reply, const std::vector<std::string>& docs) {
    int64_t last_end = 0;
    for (const citation& c : cs) {
        CAPTURE(c.text);
        CHECK(c.start >= last_end); // in order, never overlapping
        last_end = c.end;
        CHECK(cp_slice(reply, c.start, c.end) == c.text);
        REQUIRE(c.document >= 0);
        REQUIRE(size_t(c.document) < docs.size());
        const std::string quoted = cp_slice(docs[size_t(c.document)], c.document_start, c.document_end);
        CHECK(normalise(quoted) == normalise(c.text));
        // from a word's start to a word's end
        REQUIRE(!c.text.empty());
        CHECK(word_byte(c.text.front()));
        CHECK(word_byte(c.text.back()));
        const std::string before = cp_slice(reply, 0, c.start), after = reply.substr(before.size() + c.text.size());
        CHECK_FALSE((!before.empty() && word_byte(before.back()) && word_byte(c.text.front())));
        CHECK_FALSE((!after.empty() && word_byte(after.front()) && word_byte(c.text.back())));
    }
}

// Feeds `reply` to a finder in pieces of random sizes (UTF-8 sequences split anywhere).
std::vector<citation> find_all(const std::vector<std::string>& docs, const std::string& reply, int32_t min_tokens,
                               std::mt19937& rng) {
    citation_finder f(std::make_shared<document_index>(docs), min_tokens);
    std::vector<citation> streamed;
    for (size_t i = 0; i < reply.size();) {
        const size_t n = std::min(reply.size() - i, size_t(rng() % 6));
        for (auto& c : f.push(std::string_view(reply).substr(i, n))) streamed.push_back(c);
        i += n;
    }
    for (auto& c : f.finish()) streamed.push_back(c);
    REQUIRE(streamed.size() == f.all().size());
    return streamed;
}

} // namespace

TEST_CASE("citations: the suffix automaton finds the longest suffix a document contains, as brute force does") {
    std::mt19937 rng(7);
    const std::string alphabet = "ab c\xc3\xa9"; // a multi-byte letter among them
    for (int round = 0; round < 200; ++round) {
        std::vector<std::string> docs(1 + rng() % 3);
        for (auto& d : docs)
            for (int i = int(rng() % 40); i > 0; --i) d += alphabet[rng() % alphabet.size()];
        std::string text;
        for (int i = 0; i < 60; ++i) text += alphabet[rng() % alphabet.size()];
        const document_index idx(docs);
        std::vector<std::string> norm;
        for (const auto& d : docs) norm.push_back(normalise(d));
        const std::string t = normalise(text);
        int32_t s = 0, len = 0;
        for (size_t i = 0; i < t.size(); ++i) {
            const uint8_t c = uint8_t(t[i]);
            if (const int32_t next = idx.next(s, c); next >= 0) {
                s = next;
                ++len;
            } else {
                while (s != -1 && idx.next(s, c) < 0) s = idx.at(s).link;
                len = s == -1 ? 0 : idx.at(s).length + 1;
                s = s == -1 ? 0 : idx.next(s, c);
            }
            // brute force: the longest suffix of t[0..i] in a document
            int32_t want = 0;
            for (int32_t l = int32_t(i) + 1; l > 0 && want == 0; --l)
                for (const auto& d : norm)
                    if (d.find(t.substr(i + 1 - size_t(l), size_t(l))) != std::string::npos) want = l;
            CAPTURE(round);
            CAPTURE(i);
            REQUIRE(len == want);
            if (len > 0) { // and where it first ends is an occurrence
                const int64_t end = idx.at(s).first_end, begin = end - len + 1;
                const int32_t d = idx.document_of(begin);
                CHECK(idx.document(d).text.substr(size_t(idx.document_offset(begin)), size_t(len)) ==
                      t.substr(i + 1 - size_t(len), size_t(len)));
            }
        }
    }
}

TEST_CASE("citations: a copy across case and whitespace changes, in code points, whole words") {
    const std::vector<std::string> docs{"Nothing to see here.",
                                        "Caf\xc3\xa9 notes: The quick brown fox  jumps over\nthe lazy dog near the river. "
                                        "It was 3 o'clock."};
    const std::string reply = "\xc3\x89t\xc3\xa9: the Quick brown fox jumps over the lazy dog, then it was 3 o'clock.";
    std::mt19937 rng(1);
    // pieces of at most 5 bytes: the 43-byte copy is at least 9 of them, "it was 3 o'clock" may
    // be fewer
    const auto cs = find_all(docs, reply, 9, rng);
    check_citations(cs, reply, docs);
    REQUIRE(cs.size() == 1);
    CHECK(cs[0].text == "the Quick brown fox jumps over the lazy dog"); // no ": " before, no "," after
    CHECK(cs[0].start == 5); // "Été: " is five code points
    CHECK(cs[0].document == 1);
    CHECK(cp_slice(docs[1], cs[0].document_start, cs[0].document_end) == "The quick brown fox  jumps over\nthe lazy dog");
    // min_tokens counts pieces pushed: one word a piece here, so "it was 3 o'clock" (4) counts
    citation_finder f(std::make_shared<document_index>(docs), 4);
    std::vector<citation> all;
    std::string word;
    for (char c : reply + " ") {
        word += c;
        if (c == ' ')
            for (auto& x : f.push(std::exchange(word, ""))) all.push_back(x);
    }
    for (auto& x : f.finish()) all.push_back(x);
    REQUIRE(all.size() == 2);
    CHECK(all[1].text == "it was 3 o'clock"); // a word's end: the period is left out
    // fewer tokens than min_tokens: no citation
    citation_finder g(std::make_shared<document_index>(docs), 40);
    CHECK(g.push(reply).empty());
    CHECK(g.finish().empty());
}

TEST_CASE("citations: random replies spliced from documents keep every promise, pushed in any pieces") {
    std::mt19937 rng(42);
    const std::vector<std::string> words{"the",  "cat",   "sat", "on",     "mat",       "\xc3\xa9t\xc3\xa9", "\xf0\x9f\x98\x80",
                                         "RIVER", "river", "a,",  "dog.",  "\xd0\x9c\xd0\xb8\xd1\x80", "42",  "x_y"};
    const std::vector<std::string> spaces{" ", "  ", "\n", " \t "};
    const auto text_of = [&](int n) {
        std::string t;
        for (int i = 0; i < n; ++i) t += (i ? spaces[rng() % spaces.size()] : "") + words[rng() % words.size()];
        return t;
    };
    int n_citations = 0;
    for (int round = 0; round < 300; ++round) {
        std::vector<std::string> docs(1 + rng() % 3);
        for (auto& d : docs) d = text_of(20 + int(rng() % 40));
        // a reply of random words and pieces of the documents, with case and spacing changed
        std::string reply;
        for (int part = 0; part < 6; ++part) {
            if (rng() % 2) {
                reply += text_of(1 + int(rng() % 4)) + " ";
                continue;
            }
            const std::string& d = docs[rng() % docs.size()];
            size_t a = rng() % d.size(), b = std::min(d.size(), a + 10 + rng() % 60);
            while (a > 0 && (uint8_t(d[a]) & 0xC0) == 0x80) --a; // whole characters: the engine sends valid UTF-8
            while (b < d.size() && (uint8_t(d[b]) & 0xC0) == 0x80) ++b;
            std::string piece = d.substr(a, b - a);
            for (char& c : piece)
                if (rng() % 5 == 0 && std::isalpha(uint8_t(c))) c = char(std::toupper(uint8_t(c)));
            reply += piece + " ";
        }
        CAPTURE(round);
        const auto cs = find_all(docs, reply, 1 + int(rng() % 4), rng);
        check_citations(cs, reply, docs);
        n_citations += int(cs.size());
    }
    CHECK(n_citations > 300);
}

TEST_CASE("citations: precision and recall on the hand-labelled set (tests/data/citations.json) are at least 0.95") {
    std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/tests/data/citations.json");
    REQUIRE(in);
    const nlohmann::json set = nlohmann::json::parse(in);
    REQUIRE(set["cases"].size() >= 30);
    // Character overlap (bytes of the reply) between what the finder marks and what a person
    // marked, over every case: precision = right / found, recall = right / marked. The reply is
    // pushed a word (and its following space) at a time, like tokens, and the labels' least
    // span is 6 words.
    int64_t found = 0, marked = 0, right = 0;
    for (const auto& c : set["cases"]) {
        CAPTURE(c["name"].get<std::string>());
        const auto docs = c["documents"].get<std::vector<std::string>>();
        const std::string reply = c["reply"];
        std::vector<char> want(reply.size(), 0), got(reply.size(), 0);
        for (const auto& s : c["spans"]) {
            const std::string text = s["text"];
            const size_t at = reply.find(text);
            REQUIRE(at != std::string::npos);
            std::fill(want.begin() + ptrdiff_t(at), want.begin() + ptrdiff_t(at + text.size()), char(1 + s["document"].get<int>()));
        }
        citation_finder f(std::make_shared<document_index>(docs), 6);
        std::vector<citation> cs;
        size_t from = 0;
        for (size_t i = 0; i <= reply.size(); ++i)
            if (i == reply.size() || (std::isspace(uint8_t(reply[i])) && i + 1 < reply.size() && !std::isspace(uint8_t(reply[i + 1])))) {
                for (auto& x : f.push(std::string_view(reply).substr(from, i + 1 - from - (i == reply.size())))) cs.push_back(x);
                from = i + 1;
            }
        for (auto& x : f.finish()) cs.push_back(x);
        check_citations(cs, reply, docs);
        for (const citation& x : cs) {
            const size_t at = cp_slice(reply, 0, x.start).size();
            std::fill(got.begin() + ptrdiff_t(at), got.begin() + ptrdiff_t(at + x.text.size()), char(1 + x.document));
        }
        for (size_t i = 0; i < reply.size(); ++i) {
            found += got[i] != 0;
            marked += want[i] != 0;
            right += got[i] != 0 && got[i] == want[i]; // the right document too
        }
    }
    const double precision = double(right) / double(std::max<int64_t>(found, 1)),
                 recall = double(right) / double(std::max<int64_t>(marked, 1));
    MESSAGE("citations on ", set["cases"].size(), " labelled cases: precision ", precision, ", recall ", recall);
    CHECK(marked > 1000);
    CHECK(precision >= 0.95);
    CHECK(recall >= 0.95);
}
