// The daemon's one route table: every path pattern and method it serves, the label its
// requests count under in /metrics, what it needs (the model loaded, the daemon not stopping),
// and its handler. The session dispatches through it (404 for an unknown path, 405 with Allow
// for a known one asked with another method), and nothing else knows the routes.
#pragma once

#include "daemon/exchange.hpp"

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::daemon {

struct route {
    std::string_view pattern;         // "/v1/files/{id}/content": {name} matches one path segment,
                                      // a last {name...} the rest of the path
    std::string_view method;          // GET also answers HEAD (the session sends no body)
    std::string_view label;           // tandem_requests_total{route=...}
    bool needs_model = false;         // held while the model loads (up to load_wait_s), then 503
    bool generates = false;           // new work for the engine: 503 while the daemon drains
    handler_fn handle;
};

const std::vector<route>& routes();

// What the table has for `path`: the rows whose pattern matches (none: 404), each with the
// pattern's {placeholders} taken from the path.
struct route_match {
    const route* row = nullptr;
    std::map<std::string, std::string> params;
};
std::vector<route_match> match_routes(std::string_view path);

// An error refused before a route's handler runs (unknown path, wrong method, 401, 503 while
// loading) in the shape of the API the path belongs to: Anthropic's under /v1/messages,
// Ollama's under /api/, else OpenAI's.
reply error_reply(std::string_view path, const api_error& e);

// The metrics label of a request target ("other" for paths no route has).
std::string route_label(std::string_view target);

// A query string's parameters, %-decoded ("+" a space).
std::map<std::string, std::string> parse_query(std::string_view q);

} // namespace tandem::daemon
