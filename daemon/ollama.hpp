// Ollama's API under /api/: chat and generate translated into the internal request
// (daemon/generation.hpp) and written back as NDJSON (or one object), its options mapped to
// Tandem's sampling fields; the model routes (tags, show, ps, version) and embeddings.
#pragma once

#include "daemon/encoder.hpp"
#include "daemon/exchange.hpp"
#include "daemon/fields.hpp"
#include "daemon/generation.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <variant>

namespace tandem::daemon {

// POST /api/chat (`generate` false) or /api/generate: every field checked; stream defaults to
// true, as Ollama's does; images, suffix, template and context are 400s that name them.
std::variant<generation_request, api_error> parse_ollama(const json& body, const model_state& ms, const config& cfg,
                                                         bool generate);

// `keep_alive`: how long the model stays loaded after the request (a duration or seconds; 0:
// unloaded once the request ends, negative: for good); the session applies it (model_host).
field_error read_keep_alive(const json& body);

// The encoder: {"model", "created_at", "message" | "response", "done"} lines, the last with
// done_reason and the counts and durations (nanoseconds) Ollama reports.
std::unique_ptr<encoder> make_ollama_encoder(bool generate, std::chrono::steady_clock::time_point received);

// {"error": "..."} with the status.
reply ollama_error(const api_error& e);

// The model's name as Ollama lists it ("NAME:latest" unless the id has a tag).
std::string ollama_name(const model_state& ms);

// GET /api/tags, POST /api/show, GET /api/ps, GET /api/version.
reply ollama_tags(const exchange& x);
reply ollama_show(const exchange& x);
reply ollama_ps(const exchange& x);
reply ollama_version(const exchange& x);
// POST /api/embed and the older /api/embeddings (`legacy`).
handler_fn ollama_embed(bool legacy);
// pull, push, create, copy, delete: 501, the model host's commands being elsewhere.
reply ollama_unsupported(const exchange& x);

} // namespace tandem::daemon
