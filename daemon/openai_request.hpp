// The OpenAI Chat Completions (POST /v1/chat/completions) and Completions (POST
// /v1/completions) request bodies, translated into the internal request.
#pragma once

#include "daemon/generation.hpp"

#include <variant>

namespace tandem::daemon {

// Every field checked (types, ranges, the daemon's limits on them); unknown fields are a 400
// that names them.
std::variant<generation_request, api_error> parse_openai_generation(const json& body, bool chat, const model_state& ms,
                                                                    const config& cfg);
// The same, planned (daemon/generation.hpp plan_generation).
std::variant<generation_plan, api_error> parse_generation(const json& body, bool chat, const model_state& ms,
                                                          const config& cfg);

} // namespace tandem::daemon
