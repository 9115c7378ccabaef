// sd_notify and sd_listen_fds wrappers.
#include "daemon/systemd.hpp"

#include <fcntl.h>
#include <systemd/sd-daemon.h>

#include <string>

namespace tandem::daemon::systemd {
namespace {

void send(const std::string& msg) { (void)sd_notify(0, msg.c_str()); }

} // namespace

void notify_ready(std::string_view status) { send("READY=1\nSTATUS=" + std::string(status)); }
void notify_status(std::string_view status) { send("STATUS=" + std::string(status)); }
void notify_stopping() { send("STOPPING=1\nSTATUS=draining requests"); }
void notify_watchdog() { send("WATCHDOG=1"); }

std::chrono::microseconds watchdog_interval() {
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0) return {};
    return std::chrono::microseconds(usec / 2);
}

std::vector<int> listen_fds() {
    std::vector<int> out;
    const int n = sd_listen_fds(1); // unsets LISTEN_* so children do not inherit them
    for (int i = 0; i < n; ++i) {
        const int fd = SD_LISTEN_FDS_START + i;
        if (sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1) <= 0) continue;
        ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        out.push_back(fd);
    }
    return out;
}

} // namespace tandem::daemon::systemd
