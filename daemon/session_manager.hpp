// The set of open sessions: starts them, stops one or all, and drains them on shutdown.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <set>

namespace tandem::daemon {

class session;

class session_manager {
public:
    void start(std::shared_ptr<session> s);
    // Called by a session when it ends.
    void remove(const std::shared_ptr<session>& s);
    void stop_all();
    // Idle sessions close now, busy ones after their current response; `on_empty` runs
    // once no session is left (at once when there are none).
    void drain(std::function<void()> on_empty);
    size_t size() const { return sessions_.size(); }

private:
    void check_empty();

    std::set<std::shared_ptr<session>> sessions_;
    std::function<void()> on_empty_;
};

} // namespace tandem::daemon
