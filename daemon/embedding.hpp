// Embeddings (POST /v1/embeddings): the request parsed into token ids, the response, and the
// engine's pooled hidden states of many inputs, a window of them at a time (also how
// retrieval embeds passages).
#pragma once

#include "daemon/exchange.hpp"
#include "daemon/generation.hpp"
#include "daemon/state.hpp"

#include <variant>
#include <vector>

namespace tandem::daemon {

// An embeddings request, parsed: each input's tokens, embedded with the model's pooling
// (runtime/model_config.hpp pooling_type).
struct embedding_plan {
    std::vector<std::vector<token_id>> inputs;
    bool base64 = false;              // encoding_format "base64": each vector's little-endian float32 bytes
    int32_t priority = 0;
    bool truncate = false;            // truncate_prompt_tokens was given
    int64_t n_truncated = 0;          // the input tokens it dropped, all inputs together
};

std::variant<embedding_plan, api_error> parse_embeddings(const json& body, const model_state& ms, const config& cfg);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
json embeddings_response(const embedding_plan& plan, const std::vector<std::vector<float>>& vectors,
                         const std::string& model);

// Why this model has no embeddings (its hidden states do not fit the rows that carry them,
// n_embd > n_vocab: no real model), or nullopt.
std::optional<api_error> embeddings_unavailable(const model_state& ms);

// Each input's embedding through the engine (the model's pooling), in order; cancelled when
// the client goes away (a 499 error: nobody to answer).
asio::awaitable<std::variant<std::vector<std::vector<float>>, api_error>>
embed(exchange& x, std::vector<std::vector<token_id>> inputs, int32_t priority);

// POST /v1/embeddings.
asio::awaitable<bool> handle_embeddings(exchange& x);

} // namespace tandem::daemon
