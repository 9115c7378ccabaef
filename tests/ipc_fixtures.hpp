// Forked children and thrown messages shared by the IPC suites (test_kv_pool, test_ipc_shm).
#pragma once

#include "runtime/error.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

namespace tandem::test {

using clock_type = std::chrono::steady_clock;

// Runs `body` in a forked child (no exec) whose exit code is what body returns; exceptions
// and doctest stay out of the child.
inline pid_t fork_child(const std::function<int()>& body) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int rc = 99;
        try {
            rc = body();
        } catch (...) {
            rc = 98;
        }
        ::_exit(rc);
    }
    return pid;
}

// The wait status of `pid`, killing it if it runs past `limit`.
inline int wait_child(pid_t pid, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    const auto end = clock_type::now() + limit;
    int st = 0;
    for (;;) {
        const pid_t r = ::waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        if (r < 0 && errno != EINTR) return -1;
        if (clock_type::now() > end) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &st, 0);
            FAIL_CHECK("child ", pid, " ran past its time limit");
            return st;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

inline int exit_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0); }

inline std::string thrown_by(const std::function<void()>& f) {
    try {
        f();
    } catch (const tandem::error& e) {
        return e.what();
    }
    return "(nothing thrown)";
}

} // namespace tandem::test
