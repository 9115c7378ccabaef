// What a handler answers: an error in OpenAI's shape, or a whole reply (JSON, text, a file).
#pragma once

#include <nlohmann/json.hpp>

#include <exception>
#include <string>
#include <string_view>

namespace tandem::daemon {

using json = nlohmann::ordered_json; // keys in the order the client wrote them (schemas: properties in order)

// An error: {"error": {"message", "type", "param", "code"}} with its status. `param` names the
// place of the field at fault as the API writes it ("messages[0].tool_calls[0].id").
struct api_error {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;
    std::string code;
    int retry_after_s = 0;            // > 0: a Retry-After header
};

// A 400 invalid_request_error.
api_error bad(std::string message, std::string param = {});

std::string error_body(const api_error& e);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const json& j);

// A plain reply: status, content type and body, plus an optional Retry-After (and, on a
// 405, the Allow header's methods).
struct reply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    int retry_after_s = 0;
    std::string allow;
    std::string file;                 // not empty: the body is this file's bytes, sent from the disk

    static reply of(const api_error& e);
    static reply of_json(const json& j, int status = 200);
};

// The reply to a request whose handler threw: a field of the wrong type read unchecked
// (nlohmann's type_error) is a 400, anything else a 500; both say what happened, and the
// daemon's log has the route.
reply reply_for_exception(std::exception_ptr e, std::string_view method, std::string_view target);

} // namespace tandem::daemon
