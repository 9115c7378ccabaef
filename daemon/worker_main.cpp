// The worker process: attach to the channel and pool, load the model, answer batches.
#include "daemon/worker_main.hpp"

#include "daemon/deployment.hpp"
#include "daemon/worker_spec.hpp"
#include "ipc/channel.hpp"
#include "ipc/kv_pool.hpp"
#include "ipc/wire.hpp"
#include "runtime/error.hpp"
#include "runtime/fingerprint.hpp"
#include "runtime/model_loader.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"
#include "runtime/runner.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stop_token>
#include <thread>
#include <sys/syscall.h>
#include <unistd.h>

namespace tandem::daemon {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int max_failed_batches = 3; // in a row, before the worker exits to be restarted

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
    // The heartbeat, from the start (loading the model included): it stops only when the
    // whole process does (SIGSTOP, a frozen machine), which the supervisor tells from a batch
    // that takes long.
    std::jthread heartbeat([&ch](std::stop_token stop) {
        std::mutex mu;
        std::condition_variable_any cv;
        std::unique_lock lock(mu);
        while (!stop.stop_requested()) {
            ch->beat();
            cv.wait_for(lock, stop, 200ms, [] { return false; });
        }
    });
    // The supervisor's pidfd: its exit wakes us even if the parent-death signal was missed.
    const int parent_fd = int(::syscall(SYS_pidfd_open, a.parent, 0));
    TANDEM_CHECK(parent_fd >= 0 && ::getppid() == a.parent, "the supervisor (pid {}) is gone", a.parent);

    load_options lo;
    lo.weights = s.weights;
    lo.kv = s.kv;
    lo.n_threads = s.n_threads;
    lo.fd = s.model_fd;
    lo.cpu_layout = s.device == "cpu";
    model_bundle b = load_model(s.model, lo);
    const uint64_t fp = model_fingerprint(*b.file, s.weights, s.kv);
    TANDEM_CHECK(fp == s.fingerprint, "{}: the model file changed since the daemon read it (fingerprint {:016x}, expected {:016x})",
                 s.model, fp, s.fingerprint);
    const kv_layout layout = b.mdl->make_kv_layout(s.page_size);
    auto pool = ipc::kv_pool::attach(s.pool, {fp, layout, s.n_pages}, s.pool_fd);
    kv_cache kv(layout, s.n_pages, pool->pages());
    std::unique_ptr<runner> run = make_worker_runner(s, *b.mdl, kv);
    // Everything the batches to come would build on first use is built now, so the worker's
    // memory does not grow in steps under a server's batches of every size (issue 19's soak).
    const auto t_prepare = clock_type::now();
    run->prepare(s.max_tokens, s.max_rows);
    log->debug("prepared for batches of up to {} tokens in {:.3f} s", s.max_tokens,
               std::chrono::duration<double>(clock_type::now() - t_prepare).count());

    std::vector<uint8_t> buf, msg;
    ipc::hello_msg h;
    h.pid = ::getpid();
    h.n_threads = s.n_threads;
    h.fingerprint = fp;
    h.device = run->device();
    ipc::encode(h, buf);
    TANDEM_CHECK(ch->results().push(uint32_t(ipc::msg_type::hello), buf), "cannot post hello");
    ch->notify_supervisor();

    int32_t mirror_pages = 0; // device pages a GPU runner holds (logged when it changes)
    int n_failed = 0;         // batches whose forward failed in a row
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
                n_failed = d.ok ? 0 : n_failed + 1;
                d.compute_s = std::chrono::duration<double>(clock_type::now() - t0).count();
                if (const auto st = device_kv_of(*run); st && d.ok) {
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
            }
            buf.clear();
            ipc::encode(d, buf);
            TANDEM_CHECK(ch->results().push(uint32_t(ipc::msg_type::done), buf), "cannot post a result");
            ch->notify_supervisor();
            // A failure that stays (a sticky CUDA error: every later call fails too) would fail
            // every batch from now on; a fresh process gets a fresh device context.
            if (n_failed >= max_failed_batches) {
                log->error("{} batches failed in a row; exiting to be restarted", n_failed);
                return 1;
            }
        }
        TANDEM_CHECK(!ch->commands().corrupt(), "the command ring is corrupt");
    }
}

} // namespace

int worker_main(int argc, char** argv) {
    CLI::App app{"tandemd worker (started by tandemd itself)"};
    worker_args_parsed a;
    worker_spec& s = a.spec;
    std::string weights = "auto", kv = "f16", fp;
    app.add_option("--worker", s.role)->required();
    app.add_option("--fds", a.fds)->required();
    app.add_option("--parent", a.parent)->required();
    app.add_option("--device", s.device);
    app.add_option("--threads", s.n_threads);
    app.add_option("--model", s.model)->required();
    app.add_option("--pool", s.pool)->required();
    app.add_option("--model-fd", s.model_fd);
    app.add_option("--pool-fd", s.pool_fd);
    app.add_option("--weights", weights);
    app.add_option("--kv", kv);
    app.add_option("--page-size", s.page_size);
    app.add_option("--n-pages", s.n_pages)->required();
    app.add_option("--fingerprint", fp)->required();
    app.add_option("--max-rows", s.max_rows);
    app.add_option("--max-tokens", s.max_tokens);
    app.add_option("--log", s.log_level);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    init_logging(s.log_level);
    auto log = logger(s.role);
    try {
        const auto wf = parse_weight_format(weights);
        TANDEM_CHECK(wf.has_value(), "--weights {}: expected auto, int8 or f32", weights);
        s.weights = *wf;
        auto k = parse_kv_dtype(kv);
        TANDEM_CHECK(k.has_value(), "--kv {}: expected f32, f16 or int8", kv);
        s.kv = *k;
        s.fingerprint = std::stoull(fp, nullptr, 16);
        // n_vocab is checked against the model once loaded; take it from the file here.
        s.n_vocab = open_model_metadata(s.model, s.model_fd).cfg.n_vocab;
        return run_worker(a);
    } catch (const std::exception& e) {
        log->error("{}", e.what());
        return 1;
    }
}

} // namespace tandem::daemon
