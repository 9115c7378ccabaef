// `tandem batch IN.jsonl -o OUT.jsonl`: a file of OpenAI Batch requests, answered into an
// output file. With -m the engine runs in this process: an embedded tandemd (one process, no
// workers) on a private socket, so every line is served by the same code as a live request.
// With --socket a running tandemd answers. Output lines are written whole, one write each; a
// rerun with the same output file skips what it holds (daemon/batch_file.hpp).
#include "daemon/batch_file.hpp"
#include "daemon/batch_run.hpp"
#include "daemon/cli.hpp"
#include "daemon/cli_client.hpp"
#include "daemon/server.hpp"
#include "daemon/tandemd_args.hpp"
#include "runtime/error.hpp"

#include <fmt/format.h>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

namespace tandem::cli {
namespace {

namespace batch = daemon::batch;
using namespace client;
using clock_type = std::chrono::steady_clock;

struct batch_opts {
    std::string input, output, model, config_file;
    std::vector<std::string> settings; // --set KEY=VALUE: tandemd's configuration keys
    int threads = 0;
    int32_t n_ctx = 0, max_running = 32;
    int concurrency = 0;               // requests in flight; 0: 2 x max_running in-process, 16 to a daemon
    std::optional<int> priority;       // for bodies without one; unset: -1 to a daemon (background), none in-process
    client_opts daemon;                // --socket, --wait
};

// What the run did, for the progress line and the summary; updated by the sending threads.
struct tally {
    std::atomic<int64_t> answered{0}, errors{0}, prompt_tokens{0}, completion_tokens{0};
    int64_t total = 0, skipped = 0;   // lines in the input; answered by an earlier run
    clock_type::time_point start = clock_type::now();

    int64_t done() const { return answered + errors; }
    std::string progress(int64_t todo) const {
        const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
        const int64_t d = done(), n = todo;
        const int width = 24;
        const int filled = n > 0 ? int(double(width) * double(d) / double(n)) : width;
        std::string bar = std::string(size_t(filled), '#') + std::string(size_t(width - filled), '.');
        std::string eta = "--:--";
        if (d > 0 && d < n) {
            const auto left_s = int64_t(secs / double(d) * double(n - d));
            eta = fmt::format("{}:{:02}", left_s / 60, left_s % 60);
        }
        return fmt::format("[{}] {}/{} done, {} errors, {:.0f} tok/s, ETA {}", bar, d, n, errors.load(),
                           secs > 0 ? double(completion_tokens) / secs : 0.0, eta);
    }
};

// Threads started while this lives do not take SIGINT (they inherit the mask): it reaches the
// main thread, which polls `interrupted`, instead of interrupting a system call of the engine
// or the server at random.
class sigint_blocked {
public:
    sigint_blocked() {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGINT);
        pthread_sigmask(SIG_BLOCK, &s, &old_);
    }
    ~sigint_blocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
    sigint_blocked(const sigint_blocked&) = delete;
    sigint_blocked& operator=(const sigint_blocked&) = delete;

private:
    sigset_t old_;
};

// The embedded tandemd: the engine in this process, serving a private socket (a 0700
// directory of its own) until stopped. It logs through this process's logger (--log).
class embedded_daemon {
    // A fresh 0700 directory under $TMPDIR, removed with its contents when this goes.
    struct private_dir {
        std::string path = (std::filesystem::temp_directory_path() / "tandem-batch.XXXXXX").string();
        private_dir() {
            if (::mkdtemp(path.data()) == nullptr)
                throw error(fmt::format("cannot make a directory like {}: {}", path, std::strerror(errno)));
        }
        ~private_dir() {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
        }
        private_dir(const private_dir&) = delete;
        private_dir& operator=(const private_dir&) = delete;
    };

public:
    explicit embedded_daemon(const batch_opts& o) {
        daemon::config cfg;
        if (!o.config_file.empty()) cfg.load_file(o.config_file);
        const auto set = [&](const std::string& key, const std::string& value, const std::string& from) {
            if (auto err = cfg.set(key, value)) throw error(fmt::format("{}: {}: {}", from, key, *err));
            cfg.origin[key] = from;
        };
        daemon::apply_sets(o.settings, cfg);
        if (cfg.placement != "auto" && cfg.placement != "local")
            throw error(fmt::format("placement {} ({}): an in-process batch runs in one process; to use workers, "
                                    "start tandemd with it and pass --socket",
                                    cfg.placement, cfg.origin.count("placement") ? cfg.origin.at("placement") : "?"));
        set("model", resolve_model(o.model), "-m");
        set("placement", "local", "tandem batch");
        set("workers", "false", "tandem batch");
        set("socket", dir_.path + "/tandem.sock", "tandem batch");
        if (o.threads > 0) set("threads", std::to_string(o.threads), "--threads");
        if (o.n_ctx > 0) set("n_ctx", std::to_string(o.n_ctx), "--ctx");
        if (!cfg.origin.count("max_running")) set("max_running", std::to_string(o.max_running), "--max-running");
        concurrency_ = o.concurrency > 0 ? o.concurrency : 2 * cfg.engine.sched.max_running;
        // Every request in flight waits in the engine's queue rather than getting a 429.
        set("max_waiting", std::to_string(std::max(cfg.engine.max_waiting, concurrency_)), "tandem batch");
        set("max_connections", std::to_string(std::max(cfg.max_connections, concurrency_ + 4)), "tandem batch");
        cfg.validate();
        socket_ = cfg.socket;
        srv_ = std::make_unique<daemon::server>(cfg, true);
        thread_ = std::thread([this] {
            try {
                rc_ = srv_->run();
            } catch (const std::exception& e) {
                failure_ = e.what();
                rc_ = 1;
            }
            ended_ = true;
        });
    }
    ~embedded_daemon() {
        if (thread_.joinable()) {
            srv_->stop();
            thread_.join();
        }
    }
    embedded_daemon(const embedded_daemon&) = delete;
    embedded_daemon& operator=(const embedded_daemon&) = delete;

    const std::string& socket() const { return socket_; }
    int concurrency() const { return concurrency_; }
    const std::string& dir() const { return dir_.path; }

    // Waits until the model is loaded and the socket listens (true), or Ctrl-C (false);
    // throws why it never will. It asks the server, not its socket: a server that failed
    // leaves a connection it accepted in its last moment open and unanswered (its io
    // context has stopped), and a probe on it would wait for ever.
    bool wait_ready() {
        for (;;) {
            if (srv_->ready()) return true;
            if (ended_) {
                thread_.join();
                throw error(fmt::format("the model did not load: {}",
                                        !failure_.empty() ? failure_ : srv_->load_error()));
            }
            if (interrupted) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

private:
    private_dir dir_; // (first: goes last)
    std::string socket_, failure_;
    int concurrency_ = 0;
    std::unique_ptr<daemon::server> srv_;
    std::thread thread_;
    std::atomic<bool> ended_{false};
    int rc_ = 0;
};

int cmd_batch(const batch_opts& o) {
    const terminal term;
    const bool in_process = !o.model.empty() || (o.daemon.socket.empty() && std::getenv("TANDEM_MODEL") &&
                                                 *std::getenv("TANDEM_MODEL"));
    // Everything that can be refused is refused before the model loads.
    batch::input in = batch::read_input(batch::read_file(o.input));
    const batch::done_set done = batch::read_done(o.output);
    batch::output_file out(o.output, done.whole_bytes);
    tally t;
    t.total = int64_t(in.requests.size() + in.errors.size());
    for (const batch::line_error& e : in.errors) {
        if (done.has(e)) {
            ++t.skipped;
            continue;
        }
        out.write(batch::error_line(e));
        ++t.errors;
    }
    // To a daemon the lines are background work unless they say otherwise: live requests go
    // first (runtime/scheduler.hpp admit).
    const bool set_priority = o.priority.has_value() || !in_process;
    const int priority = o.priority.value_or(-1);
    std::vector<batch::request_line> todo;
    for (batch::request_line& r : in.requests) {
        if (done.has(r)) {
            ++t.skipped;
            continue;
        }
        if (set_priority && !r.body.contains("priority")) r.body["priority"] = priority;
        todo.push_back(std::move(r));
    }
    batch::sort_by_prefix(todo);
    if (t.skipped > 0)
        message(term, fmt::format("{} of {} lines were answered in {} before: skipping them", t.skipped, t.total, o.output));

    install_sigint();
    std::unique_ptr<embedded_daemon> local;
    std::string socket = ipc::default_socket_path(o.daemon.socket);
    int concurrency = o.concurrency > 0 ? o.concurrency : 16;
    if (in_process && !todo.empty()) {
        {
            const sigint_blocked quiet;
            local = std::make_unique<embedded_daemon>(o);
        }
        if (!local->wait_ready()) {
            message(term, "interrupted while the model loaded; nothing was sent");
            return exit_interrupted;
        }
        socket = local->socket();
        concurrency = local->concurrency();
    }
    const ipc::client c(socket);
    if (!in_process && !todo.empty()) {
        const ipc::response r = c.get("/health");
        if (!r.reached()) return report_unreachable(term, c, r);
    }

    batch::sender s(
        c, todo,
        [&](const batch::request_line& r, int status, const std::string& body) {
            out.write(batch::result_line(r.custom_id, status, body));
            if (status < 200 || status >= 300) {
                ++t.errors;
                return;
            }
            ++t.answered;
            try {
                const auto j = batch::json::parse(body);
                if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
                    t.prompt_tokens += u->value("prompt_tokens", int64_t(0));
                    t.completion_tokens += u->value("completion_tokens", int64_t(0));
                }
            } catch (const std::exception&) {
            }
        },
        interrupted, o.daemon.wait_s);
    t.start = clock_type::now();
    const int64_t n_todo = int64_t(todo.size()) + t.errors;
    {
        const sigint_blocked quiet;
        s.run(std::max(1, std::min<int>(concurrency, int(todo.size()))));
    }
    const auto show = [&](bool final_line) {
        if (!term.err_tty) return;
        std::fprintf(stderr, "\r\033[K%s%s", t.progress(n_todo).c_str(), final_line ? "\n" : "");
        std::fflush(stderr);
    };
    while (!todo.empty() && !s.wait_for(std::chrono::milliseconds(250)) && !interrupted) show(false);
    const bool stopped = interrupted; // (the senders stop taking lines at once too)
    if (!stopped) s.join();
    show(true);
    const double secs = std::chrono::duration<double>(clock_type::now() - t.start).count();
    const int64_t left = n_todo - t.done();
    std::fprintf(stderr,
                 "tandem batch: %lld lines: %lld answered, %lld errors, %lld skipped (done before), %lld left; "
                 "%lld prompt and %lld generated tokens in %.1f s (%.0f generated tok/s)\n",
                 (long long)t.total, (long long)t.answered.load(), (long long)t.errors.load(), (long long)t.skipped,
                 (long long)left, (long long)t.prompt_tokens.load(), (long long)t.completion_tokens.load(), secs,
                 secs > 0 ? double(t.completion_tokens) / secs : 0.0);
    out.sync();
    if (stopped) {
        // Lines in flight are dropped unanswered (a rerun sends them again); the threads
        // blocked on them go with the process.
        message(term, fmt::format("interrupted: {} lines left; rerun the same command to go on", left));
        s.detach();
        if (local) std::filesystem::remove_all(local->dir());
        std::fflush(nullptr);
        std::_Exit(exit_interrupted);
    }
    if (const std::string f = s.failure(); !f.empty()) {
        message(term, fmt::format("the daemon went away ({}): {} lines left; rerun the same command to go on", f, left));
        return in_process ? exit_error : exit_unreachable;
    }
    if (left > 0) {
        message(term, fmt::format("{} lines left unanswered (the daemon stayed busy past --wait, or a connection "
                                  "broke); rerun the same command to go on", left));
        return exit_error;
    }
    return exit_ok;
}

} // namespace

void register_batch(CLI::App& app, registry& reg) {
    auto o = std::make_shared<batch_opts>();
    auto* sub = app.add_subcommand(
        "batch", "run a file of OpenAI Batch requests (JSONL) into an output file; offline with -m, else by the daemon");
    sub->add_option("input", o->input, "the requests: one {custom_id, method, url, body} a line")
        ->required()
        ->check(existing_file());
    sub->add_option("-o,--output", o->output,
                    "the results, one a line; an existing file is resumed (its custom_ids are skipped)")
        ->required();
    auto* model = sub->add_option("-m,--model", o->model,
                                  "run the engine in this process on this GGUF (default without --socket: $TANDEM_MODEL)");
    sub->add_option("-t,--threads", o->threads, "threads, in-process (default: every core)")->check(at_least(1));
    sub->add_option("-c,--ctx", o->n_ctx, "context length, in-process (default: the model's)")->check(at_least(16));
    sub->add_option("--max-running", o->max_running, "sequences in one batch, in-process (default 32)")
        ->check(between(1, 4096));
    sub->add_option("--concurrency", o->concurrency,
                    "requests in flight (default: twice --max-running in-process, 16 to a daemon)")
        ->check(between(1, 4096));
    sub->add_option("--config", o->config_file, "tandemd's configuration file, in-process (tandemd.conf(5))")
        ->check(existing_file());
    sub->add_option("--set", o->settings, "a tandemd configuration key, in-process: --set KEY=VALUE (repeatable)");
    sub->add_option("--priority", o->priority,
                    "scheduling priority of lines that set none (default: -1 to a daemon, so live requests go first)")
        ->check(between(-1000, 1000));
    client::add_socket(*sub, o->daemon);
    sub->get_option("--socket")->excludes(model);
    o->daemon.wait_s = 300;
    sub->add_option("--wait", o->daemon.wait_s,
                    "seconds a line waits for a daemon that is busy or still loading before it is left for a rerun "
                    "(default 300)")
        ->check(between(0, 86400, number::real));
    reg.push_back({sub, [o] { return cmd_batch(*o); }});
}

} // namespace tandem::cli
