// Errors and replies (daemon/reply.hpp).
#include "daemon/reply.hpp"

#include "runtime/log.hpp"

#include <fmt/format.h>

namespace tandem::daemon {

api_error bad(std::string message, std::string param) {
    api_error e;
    e.message = std::move(message);
    e.param = std::move(param);
    return e;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const api_error& e) {
    json j = {{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
    return dump(j);
}

reply reply::of(const api_error& e) { return {e.status, "application/json", error_body(e), e.retry_after_s}; }
reply reply::of_json(const json& j, int status) { return {status, "application/json", dump(j), 0}; }

reply reply_for_exception(std::exception_ptr e, std::string_view method, std::string_view target) {
    api_error err{500, "the daemon failed on this request (see its log)", "server_error"};
    try {
        std::rethrow_exception(e);
    } catch (const nlohmann::json::type_error& x) { // a value of the wrong type, read before it was checked
        err = bad(fmt::format("a field of the request has the wrong type ({})", x.what()));
    } catch (const std::exception& x) {
        err.message = fmt::format("the daemon failed on this request: {}", x.what());
    } catch (...) {
    }
    const std::string path(target.substr(0, target.find('?')));
    logger("server")->error("{} {}: {} ({})", method, path, err.message, err.status);
    return reply::of(err);
}

} // namespace tandem::daemon
