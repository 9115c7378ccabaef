// Who may talk to the daemon: SO_PEERCRED of a Unix-socket peer against allowed uids/gids.
#pragma once

#include "daemon/config.hpp"

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>

namespace tandem::daemon {

struct peer_policy {
    std::set<uid_t> uids;            // root and the daemon's own uid are always in it
    std::set<gid_t> gids;
};

// Resolves the config's user and group names; throws tandem::error for an unknown one.
peer_policy make_peer_policy(const config& cfg);

// A user or group name, or a number; nullopt when no such name exists.
std::optional<uid_t> lookup_user(const std::string& name_or_id);
std::optional<gid_t> lookup_group(const std::string& name_or_id);

// Resolves a group name or number; throws tandem::error when unknown.
gid_t resolve_group(const std::string& name_or_id);

struct peer_check {
    bool allowed = false;
    bool has_creds = false;          // false for TCP peers (no credentials to check)
    uid_t uid = 0;
    pid_t pid = 0;
};

// Unix sockets: checks the peer's uid, primary gid and supplementary groups. Other
// families are allowed (the TCP listener is loopback-only and opt-in).
peer_check check_peer(int fd, const peer_policy& policy);

} // namespace tandem::daemon
