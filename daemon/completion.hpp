// The completion handler: owns a generation request's choices from submission to the last
// byte. It retrieves passages for documents too long for the context, submits the plan's
// engine requests, turns their events into choice state (text, tool calls, citations,
// metrics), and hands each step to the surface's encoder, which writes what the client sees:
// chunks of a stream, or the whole response.
#pragma once

#include "daemon/encoder.hpp"
#include "daemon/exchange.hpp"
#include "daemon/generation.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace tandem::daemon {

// Runs `plan` (its metrics under `route`; response ids "PREFIX-...") and answers through `enc`.
// Returns whether the connection may take another request.
asio::awaitable<bool> run_completion(exchange& x, const std::string& route, std::string_view id_prefix,
                                     generation_plan plan, encoder& enc);

// Documents too long for the context (plan.retrieval): ranks their passages against the
// question by the model's embeddings and completes the plan with the best that fit.
asio::awaitable<std::optional<api_error>> retrieve(exchange& x, generation_plan& plan);

} // namespace tandem::daemon
