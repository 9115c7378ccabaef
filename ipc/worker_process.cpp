// Worker processes: fork + execv with only async-signal-safe calls between, pidfd to watch and signal.
#include "ipc/worker_process.hpp"

#include "runtime/error.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tandem::ipc {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// The child between fork and exec: async-signal-safe calls only (no allocation, no locks,
// no logging). Every failure before exec reads as exit 127 in the parent, like exec's own.
// It starts with every signal blocked (the parent blocks them around fork), so none of the
// parent's handlers can run in it: they are reset to the default before the mask is
// restored, and a signal sent meanwhile (stop's SIGTERM) acts on it then, as on the worker.
[[noreturn]] void exec_child(const char* program, char* const* args, const int* keep, size_t n_keep, pid_t parent,
                             const sigset_t* unblocked) {
    for (int sig = 1; sig < NSIG; ++sig) {
        struct sigaction sa {};
        if (::sigaction(sig, nullptr, &sa) != 0 || sa.sa_handler == SIG_IGN || sa.sa_handler == SIG_DFL) continue;
        sa = {};
        sa.sa_handler = SIG_DFL;
        (void)::sigaction(sig, &sa, nullptr); // SIGKILL/SIGSTOP and glibc's internal ones refuse: fine
    }
    // SIGKILL when the parent (the forking thread) dies; if it died before this line the
    // signal will never come, and we were reparented: give up.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ::_exit(127);
    if (::getppid() != parent) ::_exit(1);
    // Every inherited fd >= 3 closes at exec, except the ones the worker is handed.
    if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
        rlimit lim{};
        const rlim_t n = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 65536 ? lim.rlim_cur : 65536;
        for (int fd = 3; fd < int(n); ++fd) {
            const int fl = ::fcntl(fd, F_GETFD);
            if (fl >= 0) (void)::fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
        }
    }
    for (size_t i = 0; i < n_keep; ++i) {
        const int fl = ::fcntl(keep[i], F_GETFD);
        if (fl < 0 || ::fcntl(keep[i], F_SETFD, fl & ~FD_CLOEXEC) != 0) ::_exit(127);
    }
    // The signal mask survives exec: the worker starts with nothing blocked, whatever the
    // forking thread blocks.
    (void)::sigprocmask(SIG_SETMASK, unblocked, nullptr);
    ::execv(program, args);
    ::_exit(127);
}

int pidfd_open(pid_t pid) { return int(::syscall(SYS_pidfd_open, pid, 0)); }

} // namespace

std::unique_ptr<worker_process> worker_process::spawn(const std::vector<std::string>& argv,
                                                      std::span<const int> keep_fds, const std::string& program) {
    TANDEM_CHECK(!argv.empty() && !argv[0].empty(), "worker_process: no program to start");
    // Everything the child needs is built before fork: it must not allocate.
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::vector<int> keep(keep_fds.begin(), keep_fds.end());
    sigset_t unblocked;
    sigemptyset(&unblocked);
    const pid_t parent = ::getpid();

    sigset_t all, old;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(program.empty() ? args[0] : program.c_str(), args.data(), keep.data(), keep.size(), parent,
                             &unblocked);
    const int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) fail("worker_process: fork for {}: {}", argv[0], errno_text(fork_errno));

    std::unique_ptr<worker_process> w(new worker_process());
    w->pid_ = pid;
    w->pidfd_ = pidfd_open(pid); // close-on-exec by the kernel's rule for pidfds
    if (w->pidfd_ < 0) {
        const int e = errno;
        ::kill(pid, SIGKILL); // not reaped yet, so the pid is still this child
        int st = 0;
        while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        w->reaped_ = true;
        fail("worker_process: pidfd_open for {} (pid {}): {}", argv[0], pid, errno_text(e));
    }
    return w;
}

worker_process::~worker_process() {
    if (pid_ > 0 && !reaped_) {
        kill_now();
        reap(true);
    }
    if (pidfd_ >= 0) ::close(pidfd_);
}

void worker_process::send_signal(int sig) {
    if (reaped_ || pidfd_ < 0) return;
    // Through the pidfd: it cannot reach another process that reuses the pid.
    if (::syscall(SYS_pidfd_send_signal, pidfd_, sig, nullptr, 0) != 0 && errno != ESRCH)
        logger("ipc")->warn("worker {}: cannot send signal {}: {}", pid_, sig, errno_text(errno));
}

void worker_process::kill_now() { send_signal(SIGKILL); }

std::optional<int> worker_process::reap(bool block) {
    if (reaped_) return status_;
    int st = 0;
    for (;;) {
        const pid_t r = ::waitpid(pid_, &st, block ? 0 : WNOHANG);
        if (r == pid_) {
            reaped_ = true;
            status_ = st;
            return st;
        }
        if (r == 0) return std::nullopt;
        if (errno == EINTR) continue;
        // ECHILD: something else reaped it (SIGCHLD ignored, a stray waitpid(-1)); the
        // status is lost.
        logger("ipc")->warn("worker {}: reaped elsewhere ({}), its exit status is unknown", pid_, errno_text(errno));
        reaped_ = true;
        status_ = 255 << 8;
        return status_;
    }
}

std::optional<int> worker_process::try_reap() { return reap(false); }

int worker_process::stop(std::chrono::milliseconds grace) {
    if (auto st = try_reap()) return *st;
    send_signal(SIGTERM);
    pollfd p{pidfd_, POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        const int n = ::poll(&p, 1, int(std::max<int64_t>(0, std::min<int64_t>(left.count(), 1 << 30))));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) send_signal(SIGKILL); // grace is over (or poll failed: do not wait on it)
        break;
    }
    return *reap(true);
}

std::string worker_process::describe(int st) {
    if (WIFEXITED(st)) return fmt::format("exited with status {}", WEXITSTATUS(st));
    if (WIFSIGNALED(st)) {
        const int sig = WTERMSIG(st);
        const char* what = ::sigdescr_np(sig);
        return fmt::format("killed by signal {}{}{}", sig, what ? fmt::format(" ({})", what) : std::string(),
                           WCOREDUMP(st) ? " (core dumped)" : "");
    }
    if (WIFSTOPPED(st)) return fmt::format("stopped by signal {}", WSTOPSIG(st));
    return fmt::format("wait status {:#x}", st);
}

std::string self_exe_fd() {
    static const int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open /proc/self/exe: {}", errno_text(errno));
    return "/proc/self/fd/" + std::to_string(fd);
}

std::string self_exe() {
    std::string buf(256, '\0');
    for (;;) {
        const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size());
        if (n < 0) fail("cannot read /proc/self/exe: {}", errno_text(errno));
        if (size_t(n) < buf.size()) {
            buf.resize(size_t(n));
            return buf;
        }
        buf.resize(buf.size() * 2);
    }
}

} // namespace tandem::ipc
