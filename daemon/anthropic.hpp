// Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens): its request
// translated into the internal request (daemon/generation.hpp), its encoder (content blocks,
// stop_reason, usage; the event stream message_start .. message_stop), its error shape.
#pragma once

#include "daemon/encoder.hpp"
#include "daemon/generation.hpp"

#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace tandem::daemon {

// A Messages request (or with count_only, a count_tokens request: no max_tokens, no sampling).
// Every field checked; unknown ones and what Tandem does not do (images, documents, prompt
// caching, server tools) are 400s that name them.
std::variant<generation_request, api_error> parse_anthropic(const json& body, const model_state& ms,
                                                            const config& cfg, bool count_only = false);

// The encoder of a Messages reply; `stops` are the request's stop_sequences (stop_reason
// "stop_sequence" names the one that ended it).
std::unique_ptr<encoder> make_anthropic_encoder(std::vector<std::string> stops);

// {"type": "error", "error": {"type", "message"}} with the status.
reply anthropic_error(const api_error& e);

} // namespace tandem::daemon
