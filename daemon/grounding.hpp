// Grounding: documents supplied with a chat request, rendered into its prompt, and the
// citations the engine finds while the reply is generated (runtime/citations).
#pragma once

#include "runtime/chat_template.hpp"
#include "runtime/citations.hpp"
#include "runtime/engine.hpp"
#include "runtime/grammar/token_mask.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tandem::daemon {

struct document {
    std::string id;                   // the client's, or its index
    std::string title;
    std::string text;
    int32_t source = -1;              // a passage (daemon/retrieval.hpp): the document it is from
    int64_t source_start = 0;         // a passage: where it starts there, in code points
};

struct grounding {
    std::vector<document> documents;
    bool cite = true;                 // citation_options.mode "fast" (the default) or "strict"; not "off"
    bool strict = false;              // "strict": quotations are verbatim document text
    int32_t min_tokens = 8;           // a citation's least length, in generated tokens
};

// The documents as a block of text at the head of the system message (a new first message
// when there is none), so every question about the same documents shares that prefix and the
// prefix cache serves it. The block's form is the same for every template family.
void add_documents(const std::vector<document>& docs, std::vector<chat_message>& messages);

// An observer that finds each sequence's citations as its text is released: token and done
// events carry the citations that closed with them.
std::shared_ptr<output_observer> make_citation_observer(const grounding& g);

// Strict mode's mask for one sequence: between ASCII double quotes the reply can only write
// text that continues a verbatim substring of one document (each token's bytes walked through
// a suffix automaton of the documents as they are, the vocabulary's trie pruning the walk),
// and cannot end; outside them, a token that opens a quote must start one that exists.
std::unique_ptr<logits_processor> make_strict_quotes(std::shared_ptr<const document_index> verbatim,
                                                     const grammar::vocab_trie& vocab);

// Strict mode's `unsupported`: the reply's sentences that no citation overlaps, as
// {start, end, text} in code points.
nlohmann::ordered_json unsupported_sentences(const std::string& reply, const nlohmann::ordered_json& citations);

// A citation as the API returns it (offsets in code points of the reply and the document).
nlohmann::ordered_json citation_json(const citation& c, const std::vector<document>& docs);

} // namespace tandem::daemon
