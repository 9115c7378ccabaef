// Worker processes: the supervisor's executor that drives one, and the worker's main loop.
#include "daemon/worker.hpp"

#include "ipc/channel.hpp"
#include "ipc/kv_pool.hpp"
#include "ipc/wire.hpp"
#include "ipc/worker_process.hpp"
#include "runtime/error.hpp"
#include "runtime/fingerprint.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"
#include "runtime/runner.hpp"
#ifdef TANDEM_HAVE_CUDA
#include "cuda/device.hpp"
#include "cuda/runner.hpp"
#endif

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

namespace tandem::daemon {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::vector<std::string> worker_args(const worker_spec& s, const std::vector<int>& fds) {
    return {ipc::self_exe(),
            "--worker", s.role,
            "--fds", fmt::format("{},{},{}", fds.at(0), fds.at(1), fds.at(2)),
            "--parent", std::to_string(::getpid()),
            "--device", s.device,
            "--threads", std::to_string(s.n_threads),
            "--model", s.model,
            "--pool", s.pool,
            "--weights", s.weights == weight_format::int8 ? "int8" : "f32",
            "--kv", std::string(name_of(s.kv)),
            "--page-size", std::to_string(s.page_size),
            "--n-pages", std::to_string(s.n_pages),
            "--fingerprint", fmt::format("{:016x}", s.fingerprint),
            "--max-rows", std::to_string(s.max_rows),
            "--log", s.log_level};
}

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
            // cannot happen with one batch in flight and a ring sized for the largest one
            pending_ = outcome{false, false, fmt::format("batch of {} bytes does not fit the {} worker's ring",
                                                         buf_.size(), spec_.role)};
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
        if (!proc_) {
            if (failure_.empty() && clock_type::now() >= next_spawn_) spawn();
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
        return std::nullopt;
    }

    std::span<const float> logits(int32_t row) override {
        TANDEM_ASSERT(row >= 0 && row < n_rows_);
        return {ch_->logits_row(row), size_t(spec_.n_vocab)};
    }

    std::vector<int> wait_fds() override {
        if (!proc_) return {};
        return {ch_->supervisor_wait_fd(), proc_->pidfd()};
    }

    std::chrono::milliseconds poll_interval() const override {
        if (!proc_ && failure_.empty()) return std::max(1ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                 next_spawn_ - clock_type::now()));
        if (in_flight_) // wake up in time to notice a hung worker
            return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(t_start_ + timeout() - clock_type::now()),
                              1ms, 1000ms);
        return 1000ms;
    }

    void shutdown() override {
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
    clock_type::duration timeout() const {
        return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(spec_.timeout_s));
    }

    void spawn() {
        ipc::channel_config cc;
        cc.max_rows = spec_.max_rows;
        cc.n_vocab = spec_.n_vocab;
        cc.command_bytes = uint64_t(4) << 20;
        ch_ = ipc::channel::create(cc);
        const auto fds = ch_->child_fds();
        proc_ = ipc::worker_process::spawn(worker_args(spec_, fds), fds);
        t_spawn_ = clock_type::now();
        hello_ = false;
        log_->debug("{} worker started: pid {}", spec_.role, proc_->pid());
    }

    // The worker is gone (or broken): kill what is left, plan a restart, and fail its batch.
    std::optional<outcome> died(const std::string& why) {
        const int pid = proc_->pid();
        proc_->kill_now();
        proc_->try_reap();
        proc_.reset();
        ch_.reset();
        const auto now = clock_type::now();
        // Back off when it keeps dying soon after starting; a worker that never came up at
        // all fails the daemon's start (the engine reports failure()).
        if (!up_) {
            failure_ = fmt::format("the {} worker exited during start-up ({})", spec_.role, why);
            log_->error("{}", failure_);
        } else {
            n_early_deaths_ = hello_ && now - t_hello_ > 30s ? 0 : n_early_deaths_ + 1;
            const auto delay = std::min<std::chrono::milliseconds>(10000ms, 100ms * (1 << std::min(n_early_deaths_, 7)));
            next_spawn_ = now + (n_early_deaths_ <= 1 ? 0ms : delay);
            ++n_restarts_;
            log_->warn("{} worker (pid {}) {}; restarting it{}", spec_.role, pid, why,
                       n_early_deaths_ <= 1 ? "" : fmt::format(" in {} ms", delay.count()));
        }
        hello_ = false;
        if (!in_flight_) return std::nullopt;
        in_flight_ = false;
        return outcome{false, true, fmt::format("the {} worker died ({})", spec_.role, why)};
    }

    worker_spec spec_;
    work_kind kind_;
    std::shared_ptr<spdlog::logger> log_;
    std::unique_ptr<ipc::channel> ch_;
    std::unique_ptr<ipc::worker_process> proc_;
    bool hello_ = false, up_ = false, in_flight_ = false;
    std::optional<outcome> pending_;
    std::string failure_;
    uint64_t batch_id_ = 0, n_restarts_ = 0;
    uint64_t kv_upload_bytes_ = 0, kv_kept_bytes_ = 0; // summed over ok batches, across restarts
    int n_early_deaths_ = 0;
    int32_t n_rows_ = 0;                            // logits rows of the batch in flight
    std::vector<uint8_t> buf_, msg_;
    clock_type::time_point t_spawn_{}, t_hello_{}, t_start_{}, next_spawn_{};
};

// The worker process ---------------------------------------------------------------------

struct worker_args_parsed {
    worker_spec spec;
    std::string fds;
    int parent = 0;
};

// Checks a batch against the pool before any page is touched: the supervisor is trusted,
// but a bug there must end as an error message, not as a write out of the segment.
std::optional<std::string> check_batch(const batch& b, const worker_spec& s) {
    if (auto bad = b.check(s.page_size, s.n_pages, s.n_vocab)) return bad;
    if (b.n_logits() > s.max_rows) return fmt::format("{} logits rows, the channel holds {}", b.n_logits(), s.max_rows);
    return std::nullopt;
}

int run_worker(const worker_args_parsed& a) {
    const worker_spec& s = a.spec;
    auto log = logger(s.role);
    int memfd = -1, to_w = -1, to_s = -1;
    if (std::sscanf(a.fds.c_str(), "%d,%d,%d", &memfd, &to_w, &to_s) != 3) throw error("--fds: expected M,A,B");
    auto ch = ipc::channel::attach(memfd, to_w, to_s);
    // The supervisor's pidfd: its exit wakes us even if the parent-death signal was missed.
    const int parent_fd = int(::syscall(SYS_pidfd_open, a.parent, 0));
    TANDEM_CHECK(parent_fd >= 0 && ::getppid() == a.parent, "the supervisor (pid {}) is gone", a.parent);

    load_options lo;
    lo.weights = s.weights;
    lo.kv = s.kv;
    lo.n_threads = s.n_threads;
    model_bundle b = load_model(s.model, lo);
    const uint64_t fp = model_fingerprint(*b.file, s.weights, s.kv);
    TANDEM_CHECK(fp == s.fingerprint, "{}: the model file changed since the daemon read it (fingerprint {:016x}, expected {:016x})",
                 s.model, fp, s.fingerprint);
    const kv_layout layout = b.mdl->make_kv_layout(s.page_size);
    auto pool = ipc::kv_pool::attach(s.pool, {fp, layout, s.n_pages});
    kv_cache kv(layout, s.n_pages, pool->pages());
    std::unique_ptr<runner> run;
    if (s.device == "cpu") {
        run = make_cpu_runner(*b.mdl, s.n_threads);
    } else {
#ifdef TANDEM_HAVE_CUDA
        const int dev = s.device.size() > 5 ? std::atoi(s.device.c_str() + 5) : 0;
        // The decode worker keeps its pages on the device between steps (a step then uploads
        // only what the device lacks); the prefill worker's forwards read little of the past
        // and it may share the device, so it uploads into scratch.
        cuda_runner_options ro;
        ro.keep_pages = s.role == "decode";
        run = make_cuda_runner(*b.mdl, dev, ro);
        // Pinned pages: K/V copies to and from the pool run asynchronously at full bus speed.
        // (This makes the whole pool resident; the worker keeps it registered until it exits.)
        cuda::register_host(pool->pages(), size_t(kv.bytes()));
#else
        fail("device {}: this build has no CUDA runner", s.device);
#endif
    }

    std::vector<uint8_t> buf, msg;
    ipc::hello_msg h;
    h.pid = ::getpid();
    h.n_threads = s.n_threads;
    h.fingerprint = fp;
    h.device = run->device();
    ipc::encode(h, buf);
    TANDEM_CHECK(ch->results().push(uint32_t(ipc::msg_type::hello), buf), "cannot post hello");
    ch->notify_supervisor();

    [[maybe_unused]] int32_t mirror_pages = 0; // device pages the CUDA runner holds (logged when it changes)
    for (;;) {
        const auto ready = ipc::wait_readable({ch->worker_wait_fd(), parent_fd}, 1000ms);
        if (std::find(ready.begin(), ready.end(), size_t(1)) != ready.end()) {
            log->info("the supervisor is gone; exiting");
            return 0;
        }
        ipc::channel::consume(ch->worker_wait_fd());
        uint32_t type;
        while (ch->commands().pop(type, msg)) {
            if (type == uint32_t(ipc::msg_type::shutdown)) return 0;
            TANDEM_CHECK(type == uint32_t(ipc::msg_type::run), "unknown command type {}", type);
            auto m = ipc::decode_run(msg);
            TANDEM_CHECK(m.has_value(), "malformed batch command");
            ipc::done_msg d;
            d.batch_id = m->batch_id;
            if (auto bad = check_batch(m->b, s)) {
                d.ok = false;
                d.error = "bad batch: " + *bad;
            } else {
                const auto t0 = clock_type::now();
                try {
                    // The rows go straight into the shared logits area, in the batch's order.
                    run->forward(m->b, kv, ch->logits_row(0));
                } catch (const std::exception& e) {
                    d.ok = false;
                    d.error = e.what();
                    log->error("batch {} failed: {}", m->batch_id, e.what());
                }
                d.compute_s = std::chrono::duration<double>(clock_type::now() - t0).count();
#ifdef TANDEM_HAVE_CUDA
                if (const auto* st = cuda::stats_of(*run); st && d.ok) {
                    if (st->mirror_pages != mirror_pages) {
                        mirror_pages = st->mirror_pages;
                        const char* use = s.role != "decode" ? "scratch for each batch"
                                          : mirror_pages < s.n_pages
                                              ? "kept between batches, least recently used evicted"
                                              : "kept between batches";
                        log->info("device KV pages: {} of the pool's {} ({} MiB), {}", mirror_pages, s.n_pages,
                                  (int64_t(mirror_pages) * layout.page_bytes()) >> 20, use);
                    }
                    d.kv_upload_bytes = st->upload_bytes;
                    d.kv_kept_bytes = st->kept_bytes;
                }
#endif
            }
            buf.clear();
            ipc::encode(d, buf);
            TANDEM_CHECK(ch->results().push(uint32_t(ipc::msg_type::done), buf), "cannot post a result");
            ch->notify_supervisor();
        }
        TANDEM_CHECK(!ch->commands().corrupt(), "the command ring is corrupt");
    }
}

class pool_store final : public page_store {
public:
    explicit pool_store(ipc::kv_pool& pool) : pool_(pool) {
        // the LRU clock goes on from the last run's entries
        for (int32_t p = 0; p < pool.info().n_pages; ++p)
            if (pool.entry(p).state.load(std::memory_order_acquire) == 1) clock_ = std::max(clock_, pool.entry(p).last_use);
    }
    void published(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) override {
        pool_.publish_entry(page, hash, parent, tokens, ++clock_);
    }
    void cleared(int32_t page) override { pool_.clear_entry(page); }
    void copy_page(int32_t src, int32_t dst) override {
        const int64_t pb = pool_.info().layout.page_bytes();
        pool_.clear_entry(dst);
        std::memcpy(pool_.pages() + dst * pb, pool_.pages() + src * pb, size_t(pb));
    }

private:
    ipc::kv_pool& pool_;
    uint64_t clock_ = 0;
};

} // namespace

std::unique_ptr<page_store> make_pool_store(ipc::kv_pool& pool) {
    return std::make_unique<pool_store>(pool);
}

int32_t restore_prefix_cache(ipc::kv_pool& pool, scheduler& s) {
    const int32_t ps = pool.info().layout.page_size;
    struct cached {
        uint64_t last_use;
        int32_t page;
    };
    std::vector<cached> valid;
    for (int32_t p = 0; p < pool.info().n_pages; ++p) {
        const auto& e = pool.entry(p);
        if (e.state.load(std::memory_order_acquire) == 1 && e.n_tokens == ps) valid.push_back({e.last_use, p});
        else if (e.state.load(std::memory_order_relaxed) != 0) pool.clear_entry(p);
    }
    std::sort(valid.begin(), valid.end(), [](const cached& a, const cached& b) { return a.last_use < b.last_use; });
    int32_t n = 0;
    for (const auto& c : valid) {
        const auto& e = pool.entry(c.page);
        if (s.restore(c.page, e.hash, e.parent, pool.entry_tokens(c.page))) ++n;
        else pool.clear_entry(c.page); // unusable (a duplicate, or not what its hash says)
    }
    return n;
}

std::unique_ptr<executor> make_worker_executor(const worker_spec& spec, work_kind kind) {
    return std::make_unique<worker_executor>(spec, kind);
}

int worker_main(int argc, char** argv) {
    CLI::App app{"tandemd worker (started by tandemd itself)"};
    worker_args_parsed a;
    worker_spec& s = a.spec;
    std::string weights = "int8", kv = "f16", fp;
    app.add_option("--worker", s.role)->required();
    app.add_option("--fds", a.fds)->required();
    app.add_option("--parent", a.parent)->required();
    app.add_option("--device", s.device);
    app.add_option("--threads", s.n_threads);
    app.add_option("--model", s.model)->required();
    app.add_option("--pool", s.pool)->required();
    app.add_option("--weights", weights);
    app.add_option("--kv", kv);
    app.add_option("--page-size", s.page_size);
    app.add_option("--n-pages", s.n_pages)->required();
    app.add_option("--fingerprint", fp)->required();
    app.add_option("--max-rows", s.max_rows);
    app.add_option("--log", s.log_level);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    init_logging(s.log_level);
    auto log = logger(s.role);
    try {
        s.weights = weights == "f32" ? weight_format::f32 : weight_format::int8;
        auto k = parse_kv_dtype(kv);
        TANDEM_CHECK(k.has_value(), "--kv {}: expected f32, f16 or int8", kv);
        s.kv = *k;
        s.fingerprint = std::stoull(fp, nullptr, 16);
        // n_vocab is checked against the model once loaded; take it from the file here.
        s.n_vocab = open_model_metadata(s.model).cfg.n_vocab;
        return run_worker(a);
    } catch (const std::exception& e) {
        log->error("{}", e.what());
        return 1;
    }
}

} // namespace tandem::daemon
