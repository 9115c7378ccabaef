// Peer credential checks with SO_PEERCRED, getpwuid_r and getgrouplist.
#include "daemon/peer_cred.hpp"

#include "runtime/error.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <optional>
#include <vector>

namespace tandem::daemon {
namespace {

bool parse_id(const std::string& s, unsigned& out) {
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && p == s.data() + s.size();
}

} // namespace

std::optional<uid_t> lookup_user(const std::string& s) {
    unsigned id = 0;
    if (parse_id(s, id)) return uid_t(id);
    std::vector<char> buf(16384);
    passwd pw{}, *res = nullptr;
    if (getpwnam_r(s.c_str(), &pw, buf.data(), buf.size(), &res) != 0 || !res) return std::nullopt;
    return pw.pw_uid;
}

std::optional<gid_t> lookup_group(const std::string& s) {
    unsigned id = 0;
    if (parse_id(s, id)) return gid_t(id);
    std::vector<char> buf(65536);
    group gr{}, *res = nullptr;
    if (getgrnam_r(s.c_str(), &gr, buf.data(), buf.size(), &res) != 0 || !res) return std::nullopt;
    return gr.gr_gid;
}

gid_t resolve_group(const std::string& s) {
    const auto g = lookup_group(s);
    if (!g) fail("no group '{}'", s);
    return *g;
}

peer_policy make_peer_policy(const config& cfg) {
    peer_policy p;
    p.uids.insert(0);
    p.uids.insert(::geteuid());
    for (const auto& u : cfg.allowed_users) {
        const auto uid = lookup_user(u);
        if (!uid) fail("allowed_users: no user '{}'", u);
        p.uids.insert(*uid);
    }
    for (const auto& g : cfg.allowed_groups) p.gids.insert(resolve_group(g));
    // The socket's group may use it: socket_group, else the daemon's own group (the group a
    // socket it creates gets, and the unit's Group=).
    p.gids.insert(cfg.socket_group.empty() ? ::getegid() : resolve_group(cfg.socket_group));
    return p;
}

peer_check check_peer(int fd, const peer_policy& policy) {
    peer_check r;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return r;
    if (addr.ss_family != AF_UNIX) {
        r.allowed = true;
        return r;
    }
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) return r;
    r.has_creds = true;
    r.uid = cred.uid;
    r.pid = cred.pid;
    if (policy.uids.contains(cred.uid) || policy.gids.contains(cred.gid)) {
        r.allowed = true;
        return r;
    }
    if (policy.gids.empty()) return r;
    // The peer's supplementary groups as the kernel recorded them at connect (Linux 4.13 and
    // later): no NSS look-up on the io thread, and exactly the groups the peer process had.
    {
        std::vector<gid_t> groups(64);
        socklen_t glen = socklen_t(groups.size() * sizeof(gid_t));
        int rc = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen);
        if (rc != 0 && errno == ERANGE) { // more than 64: glen says how many
            groups.resize(glen / sizeof(gid_t));
            rc = ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen);
        }
        if (rc == 0) {
            groups.resize(glen / sizeof(gid_t));
            for (gid_t g : groups)
                if (policy.gids.contains(g)) r.allowed = true;
            return r;
        }
        if (errno != ENOPROTOOPT) return r;
    }
    // an older kernel: the supplementary groups of the peer's user, from NSS
    std::vector<char> buf(16384);
    passwd pw{}, *res = nullptr;
    if (getpwuid_r(cred.uid, &pw, buf.data(), buf.size(), &res) != 0 || !res) return r;
    int n = 64;
    std::vector<gid_t> groups(static_cast<size_t>(n), 0);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
        groups.resize(size_t(n));
        if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) return r;
    }
    groups.resize(size_t(n));
    for (gid_t g : groups)
        if (policy.gids.contains(g)) r.allowed = true;
    return r;
}

} // namespace tandem::daemon
