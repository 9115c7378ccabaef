// systemd glue: sd_notify messages, the watchdog interval, and sockets passed by activation.
#pragma once

#include <chrono>
#include <string_view>
#include <vector>

namespace tandem::daemon::systemd {

// Each is a no-op without NOTIFY_SOCKET.
void notify_ready(std::string_view status);
void notify_status(std::string_view status);
void notify_stopping();
void notify_watchdog();

// How often to send WATCHDOG=1 (half of WatchdogSec), or zero when no watchdog is set.
std::chrono::microseconds watchdog_interval();

// Listening stream sockets systemd passed (LISTEN_FDS), made close-on-exec; empty when none.
std::vector<int> listen_fds();

} // namespace tandem::daemon::systemd
