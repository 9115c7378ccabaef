// Running a batch file's lines against a tandemd: the output file that takes result lines
// whole, and the sender that posts lines from several threads. `tandem batch` and tandemd's
// batch jobs (daemon/batch_jobs.hpp) both run their lines with these.
#pragma once

#include "daemon/batch_file.hpp"
#include "ipc/client.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::daemon::batch {

// Sorts lines by the text requests sharing a prefix have in common (their messages, prompt
// or input), file order within it: sent in that order, the prefix cache serves the later ones.
void sort_by_prefix(std::vector<request_line>& lines);

// Appends whole lines to a file: each one a single write of the line and its newline, after
// cutting off a line a crash left half written (at `whole_bytes`, from read_done). A new
// file gets `mode` (less the umask). The file must be this user's own regular file, not a link
// (runtime/owned_file.hpp), with no permission bit beyond `max_mode`. Lines reach the disk at
// least every 64 lines and every second (fdatasync), so a power cut loses at most that much.
class output_file {
public:
    output_file(const std::string& path, uint64_t whole_bytes, unsigned mode = 0644, unsigned max_mode = 0666);
    ~output_file();
    output_file(const output_file&) = delete;
    output_file& operator=(const output_file&) = delete;

    void write(const json& line);
    void sync();

private:
    std::string path_;
    int fd_ = -1;
    std::mutex mu_;
    int n_unsynced_ = 0;                            // lines written since the last fdatasync
    std::chrono::steady_clock::time_point synced_;  // when that was
};

// Posts the lines todo[0..] from several threads, each answer to `on_answer` as it comes (any
// HTTP status: a 400 is the line's result too). A busy or loading daemon (429, 503) is waited
// for as Retry-After asks, up to `wait_s` a line; a line still refused then, or whose
// connection broke, is left (a rerun sends it again). Three broken connections in a row stop
// the run (the daemon went away), as `stop` does: no new line is taken.
class sender {
public:
    using answer_fn = std::function<void(const request_line&, int status, const std::string& body)>;
    sender(const ipc::client& c, std::vector<request_line>& todo, answer_fn on_answer, const std::atomic<bool>& stop,
           double wait_s);
    ~sender();

    void run(int n_threads);
    // True once every thread is done; waits up to `d` for that.
    bool wait_for(std::chrono::milliseconds d);
    void join();
    // Lets the threads go on their own (they end with the process).
    void detach();
    // Why sending stopped early (the daemon went away), or empty.
    std::string failure();
    // Lines left unanswered so far.
    int64_t left() const { return left_; }

private:
    void loop();
    void send(const request_line& r);
    bool stopped() const { return stop_ || stop_all_; }

    const ipc::client& c_;
    std::vector<request_line>& todo_;
    answer_fn on_answer_;
    const std::atomic<bool>& stop_;
    double wait_s_;
    std::atomic<size_t> next_{0};
    std::atomic<bool> stop_all_{false};
    std::atomic<int> net_failures_{0};
    std::atomic<int64_t> left_{0};
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    int running_ = 0;                 // threads not done yet (guarded by mu_)
    std::string failure_;
};

} // namespace tandem::daemon::batch
