// Forwarding to an upstream: a request for a model an [upstream NAME] section serves (or the
// overflow of a busy local model) goes to that OpenAI-compatible server over libcurl, its reply
// passed through as it comes (a stream piece by piece), errors mapped, a client that hangs up
// cancelling the upstream request.
#pragma once

#include "daemon/config.hpp"
#include "daemon/exchange.hpp"

#include <optional>

namespace tandem::daemon {

// The paths an upstream takes (OpenAI's): /v1/chat/completions, /v1/completions, /v1/embeddings.
bool forwardable_path(std::string_view path);

// A field of `body` only Tandem honours (grounding, its constraint and beam extensions), which
// an upstream would drop or refuse: the 400 naming it, or nullopt.
std::optional<api_error> tandem_only_field(const json& body, const upstream_section& u);

// Forwards x's request (its path and body) to `u` and answers with what comes back. The peer
// and the limits were checked before (the session). Returns whether the connection may take
// another request.
asio::awaitable<bool> forward_upstream(exchange& x, const upstream_section& u);

} // namespace tandem::daemon
