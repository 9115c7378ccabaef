// Grounding: the documents' block in the prompt and the citation observer.
#include "daemon/grounding.hpp"

#include <fmt/format.h>

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

} // namespace

std::shared_ptr<output_observer> make_citation_observer(const grounding& g) {
    return std::make_shared<citation_observer>(g);
}

nlohmann::ordered_json citation_json(const citation& c, const std::vector<document>& docs) {
    return {{"start", c.start},
            {"end", c.end},
            {"text", c.text},
            {"document_id", docs[size_t(c.document)].id},
            {"document_index", c.document},
            {"document_start", c.document_start},
            {"document_end", c.document_end}};
}

} // namespace tandem::daemon
