// Session bookkeeping, all on the io thread.
#include "daemon/session_manager.hpp"

#include "daemon/session.hpp"

#include <vector>

namespace tandem::daemon {

void session_manager::start(std::shared_ptr<session> s) {
    sessions_.insert(s);
    s->start();
}

void session_manager::remove(const std::shared_ptr<session>& s) {
    sessions_.erase(s);
    draining_.erase(s);
    check_empty();
}

void session_manager::stop_all() {
    const std::vector<std::shared_ptr<session>> all(sessions_.begin(), sessions_.end());
    for (const auto& s : all) s->stop();
}

void session_manager::drain(std::function<void()> on_empty) {
    on_empty_ = std::move(on_empty);
    for (const auto& s : sessions_)
        if (s->busy()) draining_.insert(s);
    check_empty();
}

void session_manager::state_changed() {
    const std::vector<std::shared_ptr<session>> all(sessions_.begin(), sessions_.end());
    for (const auto& s : all) s->state_changed();
}

void session_manager::check_empty() {
    if (draining_.empty() && on_empty_) {
        auto fn = std::move(on_empty_);
        on_empty_ = nullptr;
        fn();
    }
}

} // namespace tandem::daemon
