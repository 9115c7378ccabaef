// A child process started by fork + exec that dies with its parent, watched through a pidfd.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem::ipc {

class worker_process {
public:
    // Starts argv[0] (a path: no PATH search) with argv. In the child, before exec:
    // PR_SET_PDEATHSIG(SIGKILL) (exits if the parent is already gone), every fd >= 3
    // close-on-exec except `keep_fds`, the parent's signal handlers reset and no signal
    // blocked. Only async-signal-safe calls run between fork and exec. PR_SET_PDEATHSIG
    // fires when the *thread* that forked exits, so call this from a thread that outlives
    // the child.
    // Throws tandem::error when fork or pidfd_open fails; exec failure shows as exit 127.
    // `program`, when given, is what runs (argv[0] is then only its name, as ps shows it).
    static std::unique_ptr<worker_process> spawn(const std::vector<std::string>& argv, std::span<const int> keep_fds,
                                                 const std::string& program = {});
    ~worker_process(); // kills (SIGKILL) and reaps a child still running

    int pid() const { return pid_; }
    int pidfd() const { return pidfd_; }  // readable once the child has exited
    // Reaps without blocking: the wait status once the child has exited, else nullopt.
    std::optional<int> try_reap();
    // SIGTERM, up to `grace` for it to exit, then SIGKILL; reaps. Returns the wait status.
    int stop(std::chrono::milliseconds grace);
    void kill_now(); // SIGKILL (tests and fault handling)
    // "exited with status 3", "killed by signal 9 (Killed)".
    static std::string describe(int wait_status);

private:
    worker_process() = default;
    void send_signal(int sig);              // through the pidfd; nothing once reaped
    std::optional<int> reap(bool block);
    int pid_ = -1;
    int pidfd_ = -1;
    bool reaped_ = false;
    int status_ = 0;
};

// The path of the running executable (/proc/self/exe resolved), for re-exec as a worker.
std::string self_exe();
// The running executable as a path that stays valid when its file is replaced or removed (a
// package upgrade under a running daemon): /proc/self/fd/N of a descriptor opened on the first
// call (close-on-exec; the exec opens the file before it closes the descriptor).
std::string self_exe_fd();

} // namespace tandem::ipc
