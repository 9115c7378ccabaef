// How one API surface writes a generation: the stream's events and the whole response. The
// completion handler (daemon/completion.hpp) owns the request and its choices and calls its
// surface's encoder at each step; a new surface is an encoder and a request parser, never a
// loop of its own.
#pragma once

#include "daemon/choices.hpp"

#include <memory>
#include <string>

namespace tandem::daemon {

// What an encoder sees of the generation.
struct completion_view {
    const std::string& id;            // the response's id
    const std::string& model;         // the model's id
    const generation_plan& plan;
    std::vector<choice_state>& choices;
    const tokenizer& tok;
};

// One step of choice i: the text it released read as the client sees it, and what came with it.
struct choice_step {
    const engine_event* ev = nullptr; // the token event (null for echoed text)
    const reply_delta& delta;
    json citations = json::array();   // citations that closed with this step
    bool echo = false;                // the prompt's text (completions' echo), not generated
};

class encoder {
public:
    virtual ~encoder() = default;
    // The stream's content type (server-sent events, or NDJSON).
    virtual std::string content_type() const { return "text/event-stream"; }
    // What goes out when the stream opens, before any token.
    virtual std::string open(completion_view& v) { (void)v; return {}; }
    // Streaming: the bytes for one step of choice i (empty: nothing to send).
    virtual std::string step(completion_view& v, size_t i, const choice_step& s) = 0;
    // Streaming: the bytes for the end of choice i (its done event, `last`: its final piece).
    virtual std::string finish(completion_view& v, size_t i, const choice_step& last) = 0;
    // Streaming: the bytes that end the stream (usage, the end marker).
    virtual std::string close(completion_view& v) = 0;
    // Not streaming: the response body.
    virtual json whole(completion_view& v) = 0;
    // An error before anything was sent, in the surface's own shape.
    virtual reply error(const api_error& e) { return reply::of(e); }
    // Takes a scored prompt (echo with logprobs) for choice i, whose text starts with `echo`;
    // returns the bytes to stream.
    virtual std::string prompt_scored(completion_view& v, size_t i, const engine_event& ev, const std::string& echo) {
        (void)v, (void)i, (void)ev, (void)echo;
        return {};
    }
};

// OpenAI's Chat Completions (`chat`) or Completions: chunks as server-sent events ending with
// data: [DONE], the chat.completion / text_completion object.
std::unique_ptr<encoder> make_openai_encoder(bool chat);

} // namespace tandem::daemon
