// Who is asking, and may they: the owner a request acts as (a Unix peer's uid, a TCP client's
// API key), the API keys file, and the checks a TCP request passes before any handler runs
// (no browser origin, the listener's own Host, a key where one is required).
#pragma once

#include "daemon/reply.hpp"
#include "daemon/config.hpp"

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tandem::daemon {

// The identity files and batches belong to: "uid:1000" for a Unix-socket peer, "key:NAME" for
// a TCP client by its API key's owner, "tcp" for a loopback TCP client without keys (all such
// clients are one owner: nothing tells them apart). `sees_all`: root and the daemon's own
// user, who see and manage everyone's.
struct principal {
    std::string owner;
    bool sees_all = false;
    static principal of_uid(uid_t uid);
    // What another principal's object looks like to this one: visible, or 404.
    bool may_see(const std::string& object_owner) const { return sees_all || object_owner == owner; }
};

// The api_keys_file: one key a line, optionally followed by whitespace and the owner's name
// (else the key's line number names it: "line3"); blank lines and `#` comments skipped.
class api_keys {
public:
    api_keys() = default;
    // Reads `path`; throws tandem::error "PATH:LINE: problem" (a key shorter than 16 bytes, a
    // file others may read or write).
    static api_keys load(const std::string& path);
    bool empty() const { return keys_.empty(); }
    // The owner of `key`, compared in constant time against every key; nullopt when none.
    std::optional<std::string> owner_of(std::string_view key) const;

private:
    std::vector<std::pair<std::string, std::string>> keys_; // (key, owner)
};

// A TCP listener as the checks see it: its address as clients name it ("127.0.0.1:8080"),
// whether it is loopback, and the configured exceptions.
struct tcp_policy {
    std::vector<std::string> own_hosts;    // Host values that name this listener
    bool loopback = true;
    std::vector<std::string> allowed_origins; // tcp_allowed_origins: "*" allows every Origin
    std::vector<std::string> allowed_hosts;   // tcp_allowed_hosts: other names clients may use
    const api_keys* keys = nullptr;
};

// The listener's policy from the config and its bound address and port.
tcp_policy make_tcp_policy(const config& cfg, const std::string& address, int port, const api_keys* keys);

// Checks a request that came over TCP: a browser's (an Origin header not allowed) or one with
// a foreign Host (DNS rebinding) gets 403; where keys are configured, a request without a
// known one (Authorization: Bearer KEY, or x-api-key) gets 401. On success, who it acts as.
std::variant<principal, api_error> check_tcp_request(const tcp_policy& p, std::string_view host,
                                                     std::string_view origin, std::string_view authorization,
                                                     std::string_view x_api_key);

} // namespace tandem::daemon
