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
    // With the daemon stopping (each session closes after its current reply): `on_empty`
    // runs once the sessions busy now are done (at once when none is). Idle ones, and those
    // started later, do not hold it up: they answer what they still receive (503 "stopping")
    // until the daemon exits.
    void drain(std::function<void()> on_empty);
    // Tells every session that the model loaded or the daemon is stopping.
    void state_changed();
    size_t size() const { return sessions_.size(); }

private:
    void check_empty();

    std::set<std::shared_ptr<session>> sessions_;
    std::set<std::shared_ptr<session>> draining_; // those busy when the drain began
    std::function<void()> on_empty_;
};

} // namespace tandem::daemon
