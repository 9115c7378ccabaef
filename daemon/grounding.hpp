// Grounding: documents supplied with a chat request, rendered into its prompt, and the
// citations the engine finds while the reply is generated (runtime/citations).
#pragma once

#include "runtime/chat_template.hpp"
#include "runtime/citations.hpp"
#include "runtime/engine.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tandem::daemon {

struct document {
    std::string id;                   // the client's, or its index
    std::string title;
    std::string text;
};

struct grounding {
    std::vector<document> documents;
    bool cite = true;                 // citation_options.mode "fast" (the default) or "off"
    int32_t min_tokens = 8;           // a citation's least length, in generated tokens
};

// The documents as a block of text at the head of the system message (a new first message
// when there is none), so every question about the same documents shares that prefix and the
// prefix cache serves it. The block's form is the same for every template family.
void add_documents(const std::vector<document>& docs, std::vector<chat_message>& messages);

// An observer that finds each sequence's citations as its text is released: token and done
// events carry the citations that closed with them.
std::shared_ptr<output_observer> make_citation_observer(const grounding& g);

// A citation as the API returns it (offsets in code points of the reply and the document).
nlohmann::ordered_json citation_json(const citation& c, const std::vector<document>& docs);

} // namespace tandem::daemon
