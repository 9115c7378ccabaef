// Grounding: the documents' block in the prompt and the citation observer.
#include "daemon/grounding.hpp"

#include <fmt/format.h>

#include <cctype>
#include <limits>
#include <map>

namespace tandem::daemon {

void add_documents(const std::vector<document>& docs, std::vector<chat_message>& messages) {
    std::string block = "Answer from the documents below; quote them exactly where you use them.\n";
    for (size_t i = 0; i < docs.size(); ++i) {
        const document& d = docs[i];
        block += fmt::format("\n<document index=\"{}\" id=\"{}\"{}>\n{}\n</document>\n", i, d.id,
                             d.title.empty() ? "" : fmt::format(" title=\"{}\"", d.title), d.text);
    }
    if (!messages.empty() && messages.front().role == "system") {
        messages.front().content = block + "\n" + messages.front().content;
        return;
    }
    messages.insert(messages.begin(), chat_message{"system", block, {}, {}});
}

namespace {

class citation_observer final : public output_observer {
public:
    explicit citation_observer(const grounding& g) : min_tokens_(g.min_tokens) {
        std::vector<std::string> texts;
        for (const document& d : g.documents) texts.push_back(d.text);
        docs_ = std::make_shared<const document_index>(texts);
    }

    bool on_token(engine_event& ev) override {
        ev.citations = finder(ev.index).push(ev.text);
        return true;
    }

    void on_done(engine_event& ev) override {
        citation_finder& f = finder(ev.index);
        ev.citations = f.push(ev.text);
        for (citation& c : f.finish()) ev.citations.push_back(std::move(c));
        finders_.erase(ev.index);
    }

private:
    citation_finder& finder(int32_t index) {
        auto it = finders_.find(index);
        if (it == finders_.end()) it = finders_.emplace(index, citation_finder(docs_, min_tokens_)).first;
        return it->second;
    }

    std::shared_ptr<const document_index> docs_;
    int32_t min_tokens_;
    std::map<int32_t, citation_finder> finders_; // [sequence]; the engine thread's alone
};

class strict_quotes final : public logits_processor {
public:
    strict_quotes(std::shared_ptr<const document_index> docs, const grammar::vocab_trie& vocab)
        : docs_(std::move(docs)), vocab_(&vocab) {
        // Outside a quote the automaton starts over at each quote: whether a token is fine
        // there does not depend on the reply, so it is worked out once.
        for (uint32_t k = 0; k < vocab.n_tokens(); ++k) {
            const token_id t = vocab.token(k);
            if (vocab.piece(t).find('"') == std::string::npos) continue;
            quote q;
            for (char c : vocab.piece(t)) q.step(*docs_, uint8_t(c));
            if (q.dead) banned_outside_.push_back(t);
        }
    }

    std::string_view name() const override { return "strict_quotes"; }

    void apply(std::span<float> logits, std::span<const token_id>) override {
        constexpr float banned = -std::numeric_limits<float>::infinity();
        if (!q_.open) {
            for (token_id t : banned_outside_) logits[size_t(t)] = banned;
            return;
        }
        // Allowed: a token whose bytes continue the quote in the automaton, or close it (and
        // open no other after).
        std::vector<uint8_t> ok(size_t(vocab_->n_vocab()), 0);
        const auto& nodes = vocab_->nodes();
        std::vector<int32_t> state(vocab_->max_depth() + 1, 0);
        state[0] = q_.state;
        for (uint32_t i = 1; i < nodes.size();) {
            const auto& n = nodes[i];
            if (n.byte == '"') { // the quote closes in every token of this subtree
                for (uint32_t k = n.tok_begin; k < n.tok_skip; ++k) {
                    const token_id t = vocab_->token(k);
                    ok[size_t(t)] = vocab_->piece(t).find('"', n.depth) == std::string::npos;
                }
                i = n.skip;
                continue;
            }
            const int32_t next = n.byte == 0 ? -1 : docs_->next(state[n.depth - 1u], n.byte); // (0: between documents)
            if (next < 0) {
                i = n.skip;
                continue;
            }
            state[n.depth] = next;
            for (uint32_t k = n.tok_begin; k < n.tok_end; ++k) ok[size_t(vocab_->token(k))] = 1;
            ++i;
        }
        for (size_t t = 0; t < logits.size() && t < ok.size(); ++t)
            if (!ok[t]) logits[t] = banned;
    }

    void accept(token_id t) override {
        trail_.push_back(q_);
        for (char c : vocab_->piece(t)) q_.step(*docs_, uint8_t(c));
    }

    void rewind(int32_t n) override {
        for (; n > 0 && !trail_.empty(); --n) {
            q_ = trail_.back();
            trail_.pop_back();
        }
    }

    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<strict_quotes>(*this); }

private:
    struct quote {
        bool open = false;
        bool dead = false;            // a quote left the documents (only ever outside the mask)
        int32_t state = 0;            // the quote's text so far, in the automaton
        void step(const document_index& docs, uint8_t b) {
            if (b == '"') {
                open = !open;
                state = 0;
                return;
            }
            if (!open) return;
            state = b == 0 ? -1 : docs.next(state, b); // (0 separates the documents)
            if (state < 0) {
                dead = true;
                open = false;
                state = 0;
            }
        }
    };

    std::shared_ptr<const document_index> docs_;
    const grammar::vocab_trie* vocab_;
    std::vector<token_id> banned_outside_;
    quote q_;
    std::vector<quote> trail_;        // the state before each accepted token (rewind)
};

} // namespace

std::unique_ptr<logits_processor> make_strict_quotes(std::shared_ptr<const document_index> verbatim,
                                                     const grammar::vocab_trie& vocab) {
    return std::make_unique<strict_quotes>(std::move(verbatim), vocab);
}

nlohmann::ordered_json unsupported_sentences(const std::string& reply, const nlohmann::ordered_json& citations) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    // Sentences end after . ! ? followed by whitespace (or the end), and at line breaks.
    int64_t cp = 0;
    size_t begin = 0;
    int64_t begin_cp = 0;
    const auto emit = [&](size_t end, int64_t end_cp) {
        // trim whitespace
        size_t b = begin, e = end;
        int64_t bc = begin_cp, ec = end_cp;
        while (b < e && std::isspace(uint8_t(reply[b]))) ++b, ++bc;
        while (e > b && std::isspace(uint8_t(reply[e - 1]))) --e, --ec;
        if (b == e) return;
        bool cited = false;
        for (const auto& c : citations) cited = cited || (c["start"].get<int64_t>() < ec && c["end"].get<int64_t>() > bc);
        if (!cited) out.push_back({{"start", bc}, {"end", ec}, {"text", reply.substr(b, e - b)}});
    };
    for (size_t i = 0; i < reply.size(); ++i) {
        const uint8_t b = uint8_t(reply[i]);
        if ((b & 0xC0) != 0x80) ++cp;
        const bool stop = b == '\n' || ((b == '.' || b == '!' || b == '?') &&
                                        (i + 1 == reply.size() || std::isspace(uint8_t(reply[i + 1]))));
        if (stop) {
            emit(i + 1, cp);
            begin = i + 1;
            begin_cp = cp;
        }
    }
    emit(reply.size(), cp);
    return out;
}

std::shared_ptr<output_observer> make_citation_observer(const grounding& g) {
    return std::make_shared<citation_observer>(g);
}

nlohmann::ordered_json citation_json(const citation& c, const std::vector<document>& docs) {
    const document& d = docs[size_t(c.document)]; // a passage's citation points into its document
    return {{"start", c.start},
            {"end", c.end},
            {"text", c.text},
            {"document_id", d.id},
            {"document_index", d.source >= 0 ? d.source : c.document},
            {"document_start", d.source_start + c.document_start},
            {"document_end", d.source_start + c.document_end}};
}

} // namespace tandem::daemon
