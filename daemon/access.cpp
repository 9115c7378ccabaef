// Request identity and the TCP listener's checks (daemon/access.hpp).
#include "daemon/access.hpp"

#include "runtime/error.hpp"

#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace tandem::daemon {

principal principal::of_uid(uid_t uid) {
    return {fmt::format("uid:{}", uid), uid == 0 || uid == ::geteuid()};
}

api_keys api_keys::load(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) fail("{}: cannot read the API keys file", path);
    if ((st.st_mode & 0007) != 0)
        fail("{}: the API keys file may be read by every user (mode {:o}): chmod o-rwx it", path, st.st_mode & 0777);
    std::ifstream in(path);
    if (!in) fail("{}: cannot read the API keys file", path);
    api_keys k;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        const auto b = line.find_first_not_of(" \t\r");
        if (b == std::string::npos) continue;
        const auto e = line.find_first_of(" \t\r", b);
        std::string key = line.substr(b, e == std::string::npos ? std::string::npos : e - b);
        std::string owner;
        if (e != std::string::npos) {
            const auto ob = line.find_first_not_of(" \t\r", e);
            if (ob != std::string::npos) owner = line.substr(ob, line.find_last_not_of(" \t\r") - ob + 1);
        }
        if (key.size() < 16) fail("{}:{}: an API key must be at least 16 characters long", path, n);
        if (owner.empty()) owner = fmt::format("line{}", n);
        k.keys_.emplace_back(std::move(key), std::move(owner));
    }
    if (k.keys_.empty()) fail("{}: the API keys file holds no key", path);
    return k;
}

std::optional<std::string> api_keys::owner_of(std::string_view key) const {
    // Every key is compared whole, whatever matched before, and each comparison reads every
    // byte of the longer text: the time says nothing of which key, or how much of it, matched.
    std::optional<std::string> found;
    for (const auto& [k, owner] : keys_) {
        const size_t n = std::max(k.size(), key.size());
        unsigned diff = unsigned(k.size() != key.size());
        for (size_t i = 0; i < n; ++i)
            diff |= unsigned(uint8_t(i < k.size() ? k[i] : 0) ^ uint8_t(i < key.size() ? key[i] : 0));
        if (diff == 0 && !found) found = owner;
    }
    return found;
}

tcp_policy make_tcp_policy(const config& cfg, const std::string& address, int port, const api_keys* keys) {
    tcp_policy p;
    p.keys = keys && !keys->empty() ? keys : nullptr;
    const std::string bare = address.find(':') != std::string::npos ? "[" + address + "]" : address;
    p.own_hosts.push_back(fmt::format("{}:{}", bare, port));
    p.loopback = address == "127.0.0.1" || address == "::1" || address.starts_with("127.");
    if (p.loopback) p.own_hosts.push_back(fmt::format("localhost:{}", port));
    p.allowed_origins = cfg.tcp_allowed_origins;
    for (const std::string& h : cfg.tcp_allowed_hosts) p.allowed_hosts.push_back(h);
    return p;
}

namespace {

api_error forbidden(std::string message, std::string code) {
    return api_error{403, std::move(message), "permission_error", "", std::move(code)};
}

bool iequal(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

} // namespace

std::variant<principal, api_error> check_tcp_request(const tcp_policy& p, std::string_view host,
                                                     std::string_view origin, std::string_view authorization,
                                                     std::string_view x_api_key) {
    // A browser sends Origin on every cross-site POST (and a simple one needs no preflight):
    // a page the user visits must not drive the daemon.
    if (!origin.empty() &&
        std::none_of(p.allowed_origins.begin(), p.allowed_origins.end(),
                     [&](const std::string& o) { return o == "*" || iequal(o, origin); }))
        return forbidden(fmt::format("requests from web pages (Origin: {}) are refused on this TCP listener; "
                                     "tcp_allowed_origins in tandemd.conf lists those allowed",
                                     origin),
                         "origin_not_allowed");
    // DNS rebinding: a page's own name resolved to 127.0.0.1 arrives with that name as Host.
    const auto named = [&](const std::string& h) { return iequal(h, host); };
    if (std::none_of(p.own_hosts.begin(), p.own_hosts.end(), named) &&
        std::none_of(p.allowed_hosts.begin(), p.allowed_hosts.end(), named))
        return forbidden(fmt::format("Host '{}' is not this listener's address ({}); tcp_allowed_hosts in "
                                     "tandemd.conf lists other names clients may use",
                                     host, p.own_hosts.front()),
                         "host_not_allowed");
    if (!p.keys) return principal{"tcp", false};
    std::string_view key = x_api_key;
    if (key.empty() && authorization.size() > 7 && iequal(authorization.substr(0, 7), "Bearer "))
        key = authorization.substr(7);
    const std::optional<std::string> owner = key.empty() ? std::nullopt : p.keys->owner_of(key);
    if (!owner)
        return api_error{401,
                         key.empty() ? "this listener needs an API key: send Authorization: Bearer KEY"
                                     : "the API key is not known to this daemon",
                         "authentication_error", "", "invalid_api_key"};
    return principal{"key:" + *owner, false};
}

} // namespace tandem::daemon
