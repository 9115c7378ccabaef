// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}): its request
// translated into the internal request (daemon/generation.hpp), its encoder (output items,
// the response.* event stream), and the stored responses a later request continues from
// (previous_response_id), kept in the daemon's state directory per owner.
#pragma once

#include "daemon/access.hpp"
#include "daemon/encoder.hpp"
#include "daemon/generation.hpp"

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>

namespace tandem::daemon {

// Stored responses: STATE_DIR/responses/ID.json, {"owner", "messages" (the conversation
// through this response, in the internal form), "response"}. Thread-safe.
class response_store {
public:
    // Made (0700) when missing; throws tandem::error. Responses older than ttl are gone (found
    // absent, and their files removed when next looked at or when another is stored).
    response_store(std::string dir, std::chrono::seconds ttl);
    struct stored {
        std::vector<chat_message> messages;
        json response;
    };
    // The response `id` as `who` may see it, or nullopt (absent, or another owner's).
    std::optional<stored> find(const std::string& id, const principal& who) const;
    void put(const std::string& id, const std::string& owner, const std::vector<chat_message>& messages,
             const json& response);
    bool remove(const std::string& id, const principal& who);

private:
    std::string path(const std::string& id) const;
    bool expired(const std::string& file) const;
    void sweep(); // removes the expired (under mu_)
    std::string dir_;
    std::chrono::seconds ttl_;
    uint64_t n_puts_ = 0;
    mutable std::mutex mu_;
};

// What a Responses request carries besides the internal request: the echo of its settings in
// the response object, and what storing it needs.
struct responses_context {
    json settings;                    // instructions, tools, tool_choice, text, temperature, ... as the response echoes them
    bool store = true;
    std::string previous_id;
    std::vector<chat_message> messages; // the conversation the reply continues (stored with it)
    std::string owner;
    std::shared_ptr<response_store> store_to; // null: not stored
};

// Every field checked; built-in tools, images and files, background mode and the other fields
// Tandem does not honour are 400s that name them. A previous_response_id the caller may not
// see is a 404.
std::variant<generation_request, api_error> parse_responses(const json& body, const model_state& ms,
                                                            const config& cfg, const response_store* store,
                                                            const principal& who, responses_context& ctx);

std::unique_ptr<encoder> make_responses_encoder(responses_context ctx);

} // namespace tandem::daemon
