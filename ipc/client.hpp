// Client library for tandemd: HTTP/1.1 over its Unix socket, with Server-Sent Events streaming.
#pragma once

#include "ipc/sse.hpp"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::ipc {

// Why a request got no HTTP response. Not an exception: a daemon that is not running is an
// outcome the caller reports, not a failure of the client.
// no_socket, refused, denied: the connect failed (refused covers every other reason);
// io: the connection broke after it was made.
enum class transport { ok, no_socket, refused, denied, io };

struct response {
    transport net = transport::ok;
    std::string net_error;    // what failed, when net != ok
    int status = 0;           // HTTP status, when net == ok
    std::string content_type;
    std::string retry_after;  // the Retry-After header, if any
    std::string body;         // the whole body (a streamed body only when it was not SSE)
    bool cancelled = false;   // the caller's callback stopped the stream

    bool reached() const { return net == transport::ok; }
    bool ok() const { return reached() && status >= 200 && status < 300; }
};

// The socket path a client uses: `flag` when given, else $TANDEM_SOCKET, else
// $XDG_RUNTIME_DIR/tandem/tandem.sock when that directory's socket exists or the variable
// is set for a user session, else /run/tandem/tandem.sock.
std::string default_socket_path(const std::string& flag = "");

class client {
public:
    explicit client(std::string socket_path) : path_(std::move(socket_path)) {}

    const std::string& socket_path() const { return path_; }

    // One request on a fresh connection; the whole response is read.
    response get(std::string_view target) const;
    response post(std::string_view target, std::string_view json_body) const;

    // POST that expects an event stream: each event's data goes to `on_data` as it arrives
    // (the "[DONE]" sentinel included); returning false closes the connection, which is how
    // a request is cancelled. A response that is not a 2xx event stream is read whole into
    // body instead (an error JSON, or a plain reply).
    response post_stream(std::string_view target, std::string_view json_body,
                         const std::function<bool(std::string_view data)>& on_data) const;

private:
    response exchange(std::string_view method, std::string_view target, std::string_view body,
                      const std::function<bool(std::string_view)>* on_data) const;

    std::string path_;
};

} // namespace tandem::ipc
