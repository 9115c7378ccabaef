// The output file and the sender of batch lines (daemon/batch_run.hpp).
#include "daemon/batch_run.hpp"

#include "runtime/error.hpp"
#include "runtime/owned_file.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem::daemon::batch {

using clock_type = std::chrono::steady_clock;

namespace {

std::string prefix_key(const request_line& r) {
    for (const char* k : {"messages", "prompt", "input"})
        if (auto it = r.body.find(k); it != r.body.end()) return r.url + '\n' + it->dump();
    return r.url;
}

} // namespace

void sort_by_prefix(std::vector<request_line>& lines) {
    std::vector<std::pair<std::string, size_t>> keys;
    for (size_t i = 0; i < lines.size(); ++i) keys.emplace_back(prefix_key(lines[i]), i);
    std::sort(keys.begin(), keys.end()); // (the index breaks ties: file order)
    std::vector<request_line> sorted;
    sorted.reserve(lines.size());
    for (const auto& k : keys) sorted.push_back(std::move(lines[k.second]));
    lines = std::move(sorted);
}

output_file::output_file(const std::string& path, uint64_t whole_bytes, unsigned mode, unsigned max_mode)
    : path_(path), synced_(clock_type::now()) {
    fd_ = open_owned_file(path, O_WRONLY | O_CREAT, mode_t(mode), mode_t(max_mode));
    struct stat st{};
    if (::fstat(fd_, &st) == 0 && uint64_t(st.st_size) > whole_bytes && ::ftruncate(fd_, off_t(whole_bytes)) != 0)
        throw error(fmt::format("cannot truncate {}: {}", path, std::strerror(errno)));
    if (::lseek(fd_, 0, SEEK_END) < 0) throw error(fmt::format("cannot seek in {}: {}", path, std::strerror(errno)));
}

output_file::~output_file() {
    if (fd_ >= 0) ::close(fd_);
}

void output_file::write(const json& line) {
    const std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    std::lock_guard lock(mu_);
    for (size_t at = 0; at < text.size();) {
        const ssize_t n = ::write(fd_, text.data() + at, text.size() - at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw error(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
        at += size_t(n);
    }
    if (++n_unsynced_ >= 64 || clock_type::now() - synced_ >= std::chrono::seconds(1)) {
        ::fdatasync(fd_);
        n_unsynced_ = 0;
        synced_ = clock_type::now();
    }
}

void output_file::sync() {
    std::lock_guard lock(mu_);
    ::fdatasync(fd_);
    n_unsynced_ = 0;
    synced_ = clock_type::now();
}

sender::sender(const ipc::client& c, std::vector<request_line>& todo, answer_fn on_answer,
               const std::atomic<bool>& stop, double wait_s)
    : c_(c), todo_(todo), on_answer_(std::move(on_answer)), stop_(stop), wait_s_(wait_s) {}

sender::~sender() {
    for (auto& th : threads_)
        if (th.joinable()) th.join();
}

void sender::run(int n_threads) {
    running_ = n_threads;
    for (int i = 0; i < n_threads; ++i) threads_.emplace_back([this] { loop(); });
}

bool sender::wait_for(std::chrono::milliseconds d) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, d, [&] { return running_ == 0; });
}

void sender::join() {
    for (auto& th : threads_)
        if (th.joinable()) th.join();
}

void sender::detach() {
    for (auto& th : threads_)
        if (th.joinable()) th.detach();
}

std::string sender::failure() {
    std::lock_guard lock(mu_);
    return failure_;
}

void sender::loop() {
    for (size_t i; !stopped() && (i = next_++) < todo_.size();) send(todo_[i]);
    std::lock_guard lock(mu_);
    if (--running_ == 0) cv_.notify_all();
}

void sender::send(const request_line& r) {
    const std::string body = r.body.dump(-1, ' ', false, json::error_handler_t::replace);
    const auto give_up =
        clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(wait_s_));
    for (;;) {
        const ipc::response res = c_.post(r.url, body);
        if (!res.reached()) { // the daemon went away: the line stays undone, for a rerun
            ++left_;
            if (!stopped() && ++net_failures_ >= 3) {
                std::lock_guard lock(mu_);
                if (failure_.empty()) failure_ = res.net_error;
                stop_all_ = true;
            }
            return;
        }
        net_failures_ = 0;
        if (res.status == 429 || res.status == 503) { // busy or loading: wait as it asks, up to wait_s
            double after = 1;
            try {
                if (!res.retry_after.empty()) after = std::clamp(std::stod(res.retry_after), 0.05, 30.0);
            } catch (const std::exception&) {
            }
            const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                       std::chrono::duration<double>(after));
            while (!stopped() && clock_type::now() < std::min(until, give_up))
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (!stopped() && clock_type::now() < give_up) continue;
            ++left_;
            return;
        }
        on_answer_(r, res.status, res.body);
        return;
    }
}

} // namespace tandem::daemon::batch
