// Retrieval's pieces: passages cover each document in order within their token budget, cut at
// the coarsest boundary that fits (paragraphs, sentences, words, bytes at character boundaries),
// with code point offsets; ranking; the embedding cache's least-recently-used order.
#include "daemon/retrieval.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <cctype>

using namespace tandem;
using namespace tandem::daemon;

namespace {

std::string squeeze(const std::string& t) { // the text without whitespace: what passages must cover
    std::string out;
    for (char c : t)
        if (!std::isspace(static_cast<unsigned char>(c))) out += c;
    return out;
}

int64_t code_points(const std::string& t) {
    return std::count_if(t.begin(), t.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; });
}

} // namespace

TEST_CASE("retrieval: passages cover the documents in order, within the budget, cut at the coarsest boundary") {
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    const tokenizer& tok = *b.tok;
    const std::string para1 = "Lily had a red ball. She liked to play with it in the park every day.";
    const std::string para2 = "Tom saw a big dog! The dog was brown. It barked at the cat, and the cat ran away.";
    const std::string word = std::string(300, 'z') + "éé" + std::string(100, 'q'); // no boundary but bytes
    std::vector<document> docs(3);
    docs[0].text = para1 + "\n\n" + para2;
    docs[1].text = "  Zoë's café 🍰.\n\n\n" + para2 + " " + word + "  ";
    docs[2].text = ""; // nothing to split
    for (int32_t max_tokens : {16, 24, 40, 1000}) {
        CAPTURE(max_tokens);
        const auto ps = split_passages(docs, tok, max_tokens);
        REQUIRE(!ps.empty());
        std::vector<std::string> covered(docs.size());
        int64_t last_end = -1;
        int32_t last_doc = -1;
        for (const passage& p : ps) {
            const std::string& t = docs[size_t(p.document)].text;
            REQUIRE(p.begin < p.end);
            REQUIRE(size_t(p.end) <= t.size());
            const std::string text = t.substr(size_t(p.begin), size_t(p.end - p.begin));
            CAPTURE(text);
            CHECK(!std::isspace(static_cast<unsigned char>(text.front())));
            CHECK(!std::isspace(static_cast<unsigned char>(text.back())));
            CHECK((uint8_t(text.front()) & 0xC0) != 0x80); // whole characters
            CHECK(p.n_tokens <= max_tokens);
            CHECK(int32_t(tok.encode(text).size()) <= max_tokens + 2); // (a packed sum, re-encoded)
            CHECK(p.start == code_points(t.substr(0, size_t(p.begin))));
            CHECK(p.stop - p.start == code_points(text));
            if (p.document == last_doc) CHECK(p.begin >= last_end); // in order, no overlap
            last_doc = p.document;
            last_end = p.end;
            covered[size_t(p.document)] += text;
        }
        for (size_t d = 0; d < docs.size(); ++d) CHECK(squeeze(covered[d]) == squeeze(docs[d].text));
        if (max_tokens == 1000) { // everything fits: one passage a document, trimmed
            REQUIRE(ps.size() == 2);
            CHECK(docs[1].text.substr(size_t(ps[1].begin), size_t(ps[1].end - ps[1].begin)) ==
                  docs[1].text.substr(2, docs[1].text.size() - 4));
        }
        if (max_tokens == 40) { // each paragraph fits alone, the two together do not: cut at the blank line
            const std::string first = docs[0].text.substr(size_t(ps[0].begin), size_t(ps[0].end - ps[0].begin));
            CHECK(first == para1);
        }
        if (max_tokens == 16) // paragraphs too long for one passage are cut between words
            for (const passage& p : ps)
                if (p.document == 0)
                    CHECK((size_t(p.end) == docs[0].text.size() || std::isspace(uint8_t(docs[0].text[size_t(p.end)]))));
    }
    // a passage as a document: the original's id and title, where it starts in code points
    docs[1].id = "menu";
    docs[1].title = "Café";
    const auto ps = split_passages(docs, tok, 16);
    for (const passage& p : ps) {
        const document d = passage_document(p, docs);
        CHECK(d.id == docs[size_t(p.document)].id);
        CHECK(d.title == docs[size_t(p.document)].title);
        CHECK(d.source == p.document);
        CHECK(d.source_start == p.start);
        CHECK(d.text == docs[size_t(p.document)].text.substr(size_t(p.begin), size_t(p.end - p.begin)));
    }
}

TEST_CASE("retrieval: ranking by cosine, ties in document order; the cache drops the least recently used") {
    const std::vector<std::vector<float>> e{{1, 0}, {0.6f, 0.8f}, {0.8f, 0.6f}, {0.6f, 0.8f}, {-1, 0}};
    const std::vector<float> q{0, 1};
    CHECK(rank_passages(q, e) == std::vector<size_t>{1, 3, 2, 0, 4});
    embedding_cache c(2);
    c.put("a", {1});
    c.put("b", {2});
    REQUIRE(c.find("a") != nullptr); // a is now the most recent
    c.put("c", {3});                 // b goes
    CHECK(c.find("b") == nullptr);
    REQUIRE(c.find("a") != nullptr);
    CHECK((*c.find("a"))[0] == 1);
    REQUIRE(c.find("c") != nullptr);
    CHECK(c.size() == 2);
    c.put("c", {4}); // already there: kept as it was
    CHECK((*c.find("c"))[0] == 3);
}
