// The worker executor: spawns a worker process, runs batches through its channel, notices
// crashes and hangs, restarts it.
#include "daemon/worker_executor.hpp"

#include "ipc/channel.hpp"
#include "ipc/wire.hpp"
#include "ipc/worker_process.hpp"
#include "runtime/error.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <memory>
#include <vector>

namespace tandem::daemon {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

class worker_executor final : public executor {
public:
    worker_executor(const worker_spec& spec, work_kind kind) : spec_(spec), kind_(kind), log_(logger("workers")) {}

    ~worker_executor() override { shutdown(); }

    std::string name() const override { return fmt::format("{} worker on {}", spec_.role, spec_.device); }
    work_kind kind() const override { return kind_; }
    bool ready() override { return proc_ && hello_ && !in_flight_; }
    bool up() const override { return up_; }
    std::string failure() const override { return failure_; }
    uint64_t n_restarts() const override { return n_restarts_; }
    device_kv_bytes device_kv() const override { return {kv_upload_bytes_, kv_kept_bytes_}; }

    void start(const batch& b) override {
        TANDEM_ASSERT(ready());
        TANDEM_ASSERT(b.n_logits() <= spec_.max_rows, "{} logits rows, the channel holds {}", b.n_logits(),
                      spec_.max_rows);
        n_rows_ = b.n_logits();
        buf_.clear();
        ipc::encode_run(++batch_id_, b, buf_);
        in_flight_ = true;
        t_start_ = clock_type::now();
        if (!ch_->commands().push(uint32_t(ipc::msg_type::run), buf_)) {
            // The worker broke the ring (it writes the read position): restart it, and the
            // batch is retried. Otherwise the batch is larger than command_ring_bytes allowed
            // for (a planning bug): it fails, the next one may fit.
            if (ch_->commands().corrupt()) pending_ = died("corrupted its command ring");
            else
                pending_ = outcome{false, false, fmt::format("a batch of {} bytes does not fit the {} worker's ring of {}",
                                                             buf_.size(), spec_.role, spec_.command_bytes)};
            return;
        }
        ch_->notify_worker();
    }

    std::optional<outcome> poll() override {
        if (pending_) {
            in_flight_ = false;
            auto r = pending_;
            pending_.reset();
            return r;
        }
        reap_dying();
        if (!proc_) {
            if (failure_.empty() && clock_type::now() >= next_spawn_ && may_spawn()) {
                // A failed fork, memfd or eventfd (EAGAIN, EMFILE, ENOMEM) must not leave the
                // engine thread: it is a worker that could not start, tried again later.
                // Files changed under the daemon would fail the worker's load or fault it: no
                // restart can help, the executor fails for good (the engine ends its
                // requests with why, the daemon exits for its service manager to restart it).
                if (const std::string why = files_changed(spec_); !why.empty()) {
                    failure_ = fmt::format("the {} worker cannot be started: {}", spec_.role, why);
                    log_->error("{}", failure_);
                    return std::nullopt;
                }
                try {
                    spawn();
                } catch (const std::exception& e) {
                    ch_.reset();
                    gone(fmt::format("could not be started ({})", e.what()), -1);
                }
            }
            return std::nullopt;
        }
        ipc::channel::consume(ch_->supervisor_wait_fd());
        uint32_t type;
        while (ch_->results().pop(type, msg_)) {
            if (type == uint32_t(ipc::msg_type::hello)) {
                auto h = ipc::decode_hello(msg_);
                if (!h) return died("sent a malformed hello");
                hello_ = true;
                up_ = true;
                t_hello_ = clock_type::now();
                log_->info("{} worker ready: pid {}, {}, in {:.2f} s", spec_.role, h->pid, h->device,
                           std::chrono::duration<double>(t_hello_ - t_spawn_).count());
            } else if (type == uint32_t(ipc::msg_type::done)) {
                auto d = ipc::decode_done(msg_);
                if (!d || !in_flight_ || d->batch_id != batch_id_) return died("sent a result out of turn");
                in_flight_ = false;
                if (!d->ok) return outcome{false, false, d->error};
                kv_upload_bytes_ += uint64_t(d->kv_upload_bytes);
                kv_kept_bytes_ += uint64_t(d->kv_kept_bytes);
                return outcome{};
            } else {
                return died(fmt::format("sent an unknown message type {}", type));
            }
        }
        if (ch_->results().corrupt()) return died("corrupted its result ring");
        if (auto st = proc_->try_reap()) return died(ipc::worker_process::describe(*st));
        if (in_flight_ && clock_type::now() - t_start_ > timeout())
            return died(fmt::format("did not answer a batch within {} s (hung)", spec_.timeout_s));
        if (!hello_ && clock_type::now() - t_spawn_ > timeout())
            return died(fmt::format("was not ready within {} s of its start (hung while loading)", spec_.timeout_s));
        if (const uint64_t n = ch_->beats(); n != beats_) {
            beats_ = n;
            t_beat_ = clock_type::now();
        } else if (clock_type::now() - t_beat_ > seconds(spec_.heartbeat_s)) {
            return died(fmt::format("stopped: no heartbeat for {} s", spec_.heartbeat_s));
        }
        return std::nullopt;
    }

    std::span<const float> logits(int32_t row) override {
        TANDEM_ASSERT(row >= 0 && row < n_rows_);
        return {ch_->logits_row(row), size_t(spec_.n_vocab)};
    }

    std::vector<int> wait_fds() override {
        std::vector<int> fds;
        for (const auto& p : dying_) fds.push_back(p->pidfd());
        if (proc_) fds.insert(fds.end(), {ch_->supervisor_wait_fd(), proc_->pidfd()});
        return fds;
    }

    std::chrono::milliseconds poll_interval() const override {
        if (!proc_ && !dying_.empty()) return 100ms; // their pidfds wake the engine when they exit
        if (!proc_ && failure_.empty()) return std::max(1ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                 next_spawn_ - clock_type::now()));
        // wake up in time to notice a hung batch, or a heartbeat that stopped
        auto due = t_beat_ + seconds(spec_.heartbeat_s);
        if (in_flight_) due = std::min(due, t_start_ + timeout());
        if (!hello_) due = std::min(due, t_spawn_ + timeout());
        return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(due - clock_type::now()), 1ms, 1000ms);
    }

    void shutdown() override {
        dying_.clear(); // reaped now (their destructors wait): the daemon is stopping
        if (!proc_) return;
        ch_->commands().push(uint32_t(ipc::msg_type::shutdown), {});
        ch_->notify_worker();
        const int st = proc_->stop(3000ms);
        log_->debug("{} worker (pid {}) {}", spec_.role, proc_->pid(), ipc::worker_process::describe(st));
        proc_.reset();
        ch_.reset();
        failure_ = "stopped";
    }

private:
    static clock_type::duration seconds(double s) {
        return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
    }
    clock_type::duration timeout() const { return seconds(spec_.timeout_s); }

    void spawn() {
        ipc::channel_config cc;
        cc.max_rows = spec_.max_rows;
        cc.n_vocab = spec_.n_vocab;
        cc.command_bytes = spec_.command_bytes;
        cc.result_bytes = ipc::ring::capacity_for(ipc::result_bytes_max()); // an error text at its longest
        ch_ = ipc::channel::create(cc);
        const auto fds = ch_->child_fds();
        std::vector<int> keep = fds; // the channel, and the files the worker loads and maps
        for (const int fd : {spec_.model_fd, spec_.pool_fd})
            if (fd >= 0) keep.push_back(fd);
        // the program this daemon runs, even after its file was replaced (a package upgrade)
        proc_ = ipc::worker_process::spawn(worker_args(spec_, fds), keep, spec_.exe.empty() ? ipc::self_exe_fd() : "");
        t_spawn_ = t_beat_ = clock_type::now();
        beats_ = 0;
        hello_ = false;
        log_->debug("{} worker started: pid {}", spec_.role, proc_->pid());
    }

    // Reaps the killed workers that have exited since.
    void reap_dying() {
        std::erase_if(dying_, [&](const std::unique_ptr<ipc::worker_process>& p) {
            const auto st = p->try_reap();
            if (st) log_->debug("{} worker (pid {}) {}", spec_.role, p->pid(), ipc::worker_process::describe(*st));
            return st.has_value();
        });
    }

    // A new worker waits for the one killed before it to be gone (its device memory free),
    // but not for longer than dying_grace: a process stuck in teardown does not keep the role
    // empty for good.
    bool may_spawn() {
        if (dying_.empty()) return true;
        if (clock_type::now() - t_killed_ < dying_grace) return false;
        if (!dying_warned_) {
            log_->warn("{} worker (pid {}) has not exited {} s after SIGKILL; starting its successor anyway",
                       spec_.role, dying_.back()->pid(), std::chrono::duration<double>(dying_grace).count());
            dying_warned_ = true;
        }
        return true;
    }

    // The worker is gone (or broken): kill what is left, plan a restart, and fail its batch.
    std::optional<outcome> died(const std::string& why) {
        const int pid = proc_->pid();
        proc_->kill_now();
        // Reaped later, never waited for here on the engine thread: a GPU worker can take
        // seconds to leave its driver's teardown.
        if (!proc_->try_reap()) dying_.push_back(std::move(proc_));
        proc_.reset();
        ch_.reset();
        t_killed_ = clock_type::now();
        dying_warned_ = false;
        gone(why, pid);
        if (!in_flight_) return std::nullopt;
        in_flight_ = false;
        return outcome{false, true, fmt::format("the {} worker died ({})", spec_.role, why)};
    }

    // The worker (pid, or -1 when it never started) is gone: plan a restart, backing off when
    // it keeps dying soon after starting; a worker that never came up at all fails the
    // daemon's start (the engine reports failure()).
    void gone(const std::string& why, int pid) {
        const auto now = clock_type::now();
        if (!up_) {
            failure_ = pid < 0 ? fmt::format("the {} worker {}", spec_.role, why)
                               : fmt::format("the {} worker exited during start-up ({})", spec_.role, why);
            log_->error("{}", failure_);
        } else {
            n_early_deaths_ = hello_ && now - t_hello_ > 30s ? 0 : n_early_deaths_ + 1;
            const auto delay = std::min<std::chrono::milliseconds>(10000ms, 100ms * (1 << std::min(n_early_deaths_, 7)));
            next_spawn_ = now + (n_early_deaths_ <= 1 ? 0ms : delay);
            ++n_restarts_;
            log_->warn("{} worker{} {}; restarting it{}", spec_.role, pid < 0 ? "" : fmt::format(" (pid {})", pid), why,
                       n_early_deaths_ <= 1 ? "" : fmt::format(" in {} ms", delay.count()));
        }
        hello_ = false;
    }

    worker_spec spec_;
    work_kind kind_;
    std::shared_ptr<spdlog::logger> log_;
    std::unique_ptr<ipc::channel> ch_;
    std::unique_ptr<ipc::worker_process> proc_;
    std::vector<std::unique_ptr<ipc::worker_process>> dying_; // killed, not yet reaped
    clock_type::time_point t_killed_{};
    bool dying_warned_ = false;
    static constexpr clock_type::duration dying_grace = std::chrono::seconds(10);
    bool hello_ = false, up_ = false, in_flight_ = false;
    std::optional<outcome> pending_;
    std::string failure_;
    uint64_t batch_id_ = 0, n_restarts_ = 0;
    uint64_t kv_upload_bytes_ = 0, kv_kept_bytes_ = 0; // summed over ok batches, across restarts
    int n_early_deaths_ = 0;
    int32_t n_rows_ = 0;                            // logits rows of the batch in flight
    std::vector<uint8_t> buf_, msg_;
    clock_type::time_point t_spawn_{}, t_hello_{}, t_start_{}, next_spawn_{};
    uint64_t beats_ = 0;                            // the heartbeat counter as last seen
    clock_type::time_point t_beat_{};               // when it last changed (or the worker started)
};

} // namespace

std::unique_ptr<executor> make_worker_executor(const worker_spec& spec, work_kind kind) {
    return std::make_unique<worker_executor>(spec, kind);
}

} // namespace tandem::daemon
