// Grounding's strict mode: the quote mask against a readable reference (every quotation of the
// reply, the open one included, found in a document by brute force), over random replies on
// stories260K's vocabulary; the unsupported sentences.
#include "daemon/grounding.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <random>

using namespace tandem;
using namespace tandem::daemon;

namespace {

// The reference: may `reply` (text, quotes toggled by '"') be written under strict mode? Every
// quotation, the last one possibly still open, is a substring of a document.
bool quotes_in_documents(const std::string& reply, const std::vector<std::string>& docs) {
    size_t open = reply.find('"');
    while (open != std::string::npos) {
        const size_t close = reply.find('"', open + 1);
        const std::string q = reply.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
        bool found = false;
        for (const auto& d : docs) found = found || d.find(q) != std::string::npos;
        if (!found) return false;
        open = close == std::string::npos ? close : reply.find('"', close + 1);
    }
    return true;
}

bool quote_open(const std::string& reply) { return std::count(reply.begin(), reply.end(), '"') % 2 == 1; }

} // namespace

TEST_CASE("strict quotes: the mask allows exactly what the reference allows") {
    model_bundle b = load_model(test::model_path("stories260K.gguf"));
    const tokenizer& tok = *b.tok;
    const auto vocab = grammar::vocab_trie::of(tok);
    const std::vector<std::string> docs{"Lily said, \"I want to play with the ball.\" Her mom said, \"Yes, you can.\"",
                                        "Tom saw a big dog. \"Hello, dog!\" he said."};
    auto strict = make_strict_quotes(std::make_shared<const document_index>(docs, true), *vocab);
    std::mt19937 rng(5);
    int n_inside = 0, n_steps = 0;
    for (int round = 0; round < 6; ++round) {
        auto p = strict->clone(); // a fresh sequence's (the prototype accepted nothing)
        std::string reply;
        std::vector<std::vector<float>> masks;
        for (int step = 0; step < 40; ++step) {
            std::vector<float> logits(size_t(tok.n_vocab()), 0.0f);
            p->apply(logits, {});
            masks.push_back(logits);
            std::vector<token_id> allowed;
            const bool inside = quote_open(reply);
            for (token_id t = 0; t < tok.n_vocab(); ++t) {
                const std::string piece = vocab->piece(t);
                // inside a quote only text may come (no end, no control token)
                const bool want = inside ? !piece.empty() && quotes_in_documents(reply + piece, docs)
                                         : quotes_in_documents(reply + piece, docs);
                CAPTURE(reply);
                CAPTURE(piece);
                REQUIRE((logits[size_t(t)] == 0.0f) == want);
                if (want && !piece.empty()) allowed.push_back(t);
            }
            n_inside += inside;
            ++n_steps;
            REQUIRE(!allowed.empty());
            // half the time a token with a quote, so quotes open often
            std::vector<token_id> quoting;
            for (token_id t : allowed)
                if (vocab->piece(t).find('"') != std::string::npos) quoting.push_back(t);
            const auto& pool = !quoting.empty() && rng() % 2 ? quoting : allowed;
            const token_id t = pool[rng() % pool.size()];
            p->accept(t);
            reply += vocab->piece(t);
        }
        CHECK(quotes_in_documents(reply, docs));
        // rewound by two tokens (rejected drafts), it masks as it did two steps back
        p->rewind(2);
        std::vector<float> logits(size_t(tok.n_vocab()), 0.0f);
        p->apply(logits, {});
        CHECK(logits == masks[masks.size() - 2]);
    }
    CHECK(n_inside > 20);
    CHECK(n_steps == 240);
}

TEST_CASE("unsupported sentences: those no citation overlaps, in code points") {
    const std::string reply = "Été is here. The fox jumps!\nNothing else? Yes";
    nlohmann::ordered_json cites = nlohmann::ordered_json::array();
    cites.push_back({{"start", 13}, {"end", 20}}); // "The fox"
    const auto u = unsupported_sentences(reply, cites);
    REQUIRE(u.size() == 3);
    CHECK(u[0]["text"] == "Été is here.");
    CHECK(u[0]["start"] == 0);
    CHECK(u[0]["end"] == 12);
    CHECK(u[1]["text"] == "Nothing else?");
    CHECK(u[1]["start"] == 28);
    CHECK(u[2]["text"] == "Yes");
}
