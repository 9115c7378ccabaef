// The completion handler: owns a generation request's choices from submission to the last
// byte. It retrieves passages for documents too long for the context, submits the plan's
// engine requests, turns their events into choice state (text, tool calls, citations,
// metrics), and hands each step to the surface's encoder, which writes what the client sees:
// chunks of a stream, or the whole response.
#pragma once

#include "daemon/encoder.hpp"
#include "daemon/exchange.hpp"
#include "daemon/generation.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <string>
#include <string_view>

namespace tandem::daemon {

// Runs `plan` (its metrics under `route`; response ids "PREFIX-...") and answers through `enc`.
// Returns whether the connection may take another request.
asio::awaitable<bool> run_completion(exchange& x, const std::string& route, std::string_view id_prefix,
                                     generation_plan plan, encoder& enc);

// A generation route of one API surface: its body parsed (off the io thread, as planning
// is) into the internal request, planned, and run through run_completion with the surface's
// encoder; errors before the encoder exists in the surface's shape.
struct parsed_request {
    generation_request req;
    std::unique_ptr<encoder> enc;     // how the reply is written
};
struct surface {
    std::function<std::variant<parsed_request, api_error>(const json& body, const exchange& x)> parse;
    std::function<reply(const api_error& e)> error = [](const api_error& e) { return reply::of(e); };
    std::string id_prefix;            // response ids "PREFIX-..."
    // A reply that needs no generation (Ollama's generate with no prompt), or nullopt.
    std::function<std::optional<reply>(const json& body, const exchange& x)> shortcut;
};
handler_fn generation_route(surface s);

// Documents too long for the context (plan.retrieval): ranks their passages against the
// question by the model's embeddings and completes the plan with the best that fit.
asio::awaitable<std::optional<api_error>> retrieve(exchange& x, generation_plan& plan);

} // namespace tandem::daemon
