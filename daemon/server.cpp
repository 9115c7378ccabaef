// The server's life: listen (or take systemd's sockets), load the model in the background,
// accept sessions, drain on SIGTERM, clean up.
#include "daemon/server.hpp"

#include "daemon/batch_jobs.hpp"
#include "daemon/responses.hpp"
#include "daemon/session.hpp"
#include "daemon/systemd.hpp"
#include "daemon/deployment.hpp"
#include "daemon/pool_store.hpp"
#include "ipc/kv_pool.hpp"
#include "runtime/fingerprint.hpp"
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"
#include "runtime/owned_file.hpp"
#include "runtime/model.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <cstdlib>
#include <filesystem>

namespace tandem::daemon {

using boost::system::error_code;
namespace fs = std::filesystem;

namespace {

// True when something accepts connections at `path` (another daemon is running).
bool someone_listens(const std::string& path) {
    error_code ec;
    asio::io_context io;
    asio::local::stream_protocol::socket s(io);
    s.connect(asio::local::stream_protocol::endpoint(path), ec);
    return !ec;
}

// The path of a listening Unix socket ("@name" for an abstract one), "" for another kind.
std::string unix_socket_path(const sockaddr_storage& addr, socklen_t len) {
    if (addr.ss_family != AF_UNIX) return {};
    const auto& un = reinterpret_cast<const sockaddr_un&>(addr);
    const size_t n = len > offsetof(sockaddr_un, sun_path) ? size_t(len) - offsetof(sockaddr_un, sun_path) : 0;
    if (n == 0) return {};
    if (un.sun_path[0] == '\0') return "@" + std::string(un.sun_path + 1, n - 1);
    return std::string(un.sun_path, ::strnlen(un.sun_path, n));
}

} // namespace

model_state::~model_state() {
    eng.reset();
    if (pool && unlink_pool) pool->unlink_file();
    if (model_fd >= 0) ::close(model_fd);
}

server::server(config cfg, bool embedded)
    : policy_(make_peer_policy(cfg)), signals_(io_), drain_timer_(io_), watchdog_timer_(io_), status_timer_(io_),
      managed_(!embedded) {
    st_.cfg = std::move(cfg);
    st_.blocking = std::make_unique<asio::thread_pool>(2);
    if (!st_.cfg.api_keys_file.empty()) keys_ = api_keys::load(st_.cfg.api_keys_file);
    if (managed_) {
        signals_.add(SIGTERM);
        signals_.add(SIGINT);
    }
}

server::~server() {
    if (host_) host_->stop_all();
    if (st_.blocking) st_.blocking->join(); // (its work may use the batch jobs, which go next)
}

void server::listen() {
    auto log = logger("server");
    const std::vector<int> fds = managed_ ? systemd::listen_fds() : std::vector<int>{};
    for (int fd : fds) {
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        TANDEM_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "fd {}: getsockname failed", fd);
        auto acc = std::make_unique<acceptor_type>(io_);
        acc->assign(asio::generic::stream_protocol(addr.ss_family, SOCK_STREAM), fd);
        acceptors_.push_back(std::move(acc));
        tcp_.push_back(addr.ss_family == AF_UNIX ? nullptr : tcp_policy_of(addr));
        if (socket_name_.empty()) socket_name_ = unix_socket_path(addr, len);
        log->info("listening on the socket systemd passed (fd {})", fd);
    }
    n_passed_ = acceptors_.size();
    if (socket_name_.empty()) socket_name_ = st_.cfg.socket.empty() ? default_socket_path() : st_.cfg.socket;
    if (fds.empty()) {
        const std::string path = socket_name_;
        TANDEM_CHECK(path.size() < sizeof(sockaddr_un::sun_path), "socket path too long: {}", path);
        const fs::path dir = fs::path(path).parent_path();
        std::error_code fec;
        // The default socket's directory is this user's, and nobody else may write in it
        // (replace the socket): made so, or refused. A user's own is private (0700); root's and
        // systemd's are open for the socket group to reach the socket (0755, 0750). A configured
        // socket's directory is the admin's choice: only made when missing.
        if (!dir.empty() && st_.cfg.socket.empty())
            ensure_owned_dir(dir.string(), ::geteuid() == 0 ? 0755 : 0700,
                             ::geteuid() == 0 || under_systemd_runtime() ? 0755 : 0700);
        else if (!dir.empty() && !fs::exists(dir))
            ensure_owned_dir(dir.string(), ::geteuid() == 0 ? 0755 : 0700);
        if (struct stat old {}; ::lstat(path.c_str(), &old) == 0) {
            TANDEM_CHECK(S_ISSOCK(old.st_mode), "{} exists and is not a socket", path);
            TANDEM_CHECK(old.st_uid == ::geteuid(), "{} is a socket of uid {}, not this user's: refusing to remove it",
                         path, old.st_uid);
            TANDEM_CHECK(!someone_listens(path), "another daemon is already listening on {}", path);
            fs::remove(path, fec);
        }
        auto acc = std::make_unique<acceptor_type>(io_);
        const asio::generic::stream_protocol::endpoint ep{asio::local::stream_protocol::endpoint(path)};
        acc->open(ep.protocol());
        const mode_t old = ::umask(0177); // nobody else may connect before the chmod below
        error_code ec;
        acc->bind(ep, ec);
        ::umask(old);
        TANDEM_CHECK(!ec, "cannot bind {}: {}", path, ec.message());
        socket_path_ = path;
        if (!st_.cfg.socket_group.empty())
            TANDEM_CHECK(::chown(path.c_str(), uid_t(-1), resolve_group(st_.cfg.socket_group)) == 0,
                         "cannot give {} to group {}", path, st_.cfg.socket_group);
        TANDEM_CHECK(::chmod(path.c_str(), mode_t(st_.cfg.socket_mode)) == 0, "cannot chmod {}", path);
        acc->listen(asio::socket_base::max_listen_connections);
        acceptors_.push_back(std::move(acc));
        tcp_.push_back(nullptr);
        log->info("listening on {}", path);
    }
    if (!st_.cfg.listen_tcp.empty()) {
        const auto colon = st_.cfg.listen_tcp.rfind(':');
        std::string host = st_.cfg.listen_tcp.substr(0, colon);
        if (host == "localhost") host = "127.0.0.1";
        if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
        const int port = std::stoi(st_.cfg.listen_tcp.substr(colon + 1));
        const asio::ip::tcp::endpoint tep(asio::ip::make_address(host), uint16_t(port));
        const asio::generic::stream_protocol::endpoint ep{tep};
        auto acc = std::make_unique<acceptor_type>(io_);
        acc->open(ep.protocol());
        acc->set_option(asio::socket_base::reuse_address(true));
        acc->bind(ep);
        acc->listen();
        sockaddr_storage addr{};
        socklen_t len = sizeof addr;
        TANDEM_CHECK(::getsockname(acc->native_handle(), reinterpret_cast<sockaddr*>(&addr), &len) == 0,
                     "listen_tcp: getsockname failed");
        acceptors_.push_back(std::move(acc));
        tcp_.push_back(tcp_policy_of(addr));
        log->info("listening on tcp {}{}", st_.cfg.listen_tcp, tcp_.back()->keys ? " (API keys required)" : "");
    }
}

// Loads the model (or, with workers, only its tokenizer and shape), sizes and maps the KV
// pool, and starts the engine; with workers, waits until both have loaded the weights.
std::unique_ptr<model_state> load_model_state(const config& cfg, const std::string& socket_name,
                                              const std::atomic<bool>& abort) {
    auto log = logger("server");
    auto state = std::make_unique<model_state>();
    model_state& ms = *state;
    ms.path = cfg.model;
    ms.id = cfg.model_id.empty() ? fs::path(cfg.model).stem().string() : cfg.model_id;
    const kv_dtype kv = *parse_kv_dtype(cfg.kv_dtype);
    const weight_format wf = *parse_weight_format(cfg.weights);
    if (cfg.workers) {
        // Opened once: the workers load the file this descriptor has open (they inherit it),
        // so a model renamed over or removed on disk leaves their restarts alone.
        ms.model_fd = ::open(cfg.model.c_str(), O_RDONLY | O_CLOEXEC);
        if (ms.model_fd < 0) fail("{}: cannot open: {}", cfg.model, std::strerror(errno));
        ms.bundle = open_model_metadata(cfg.model, ms.model_fd);
    } else ms.bundle = load_model(cfg.model, load_options{wf, kv, 0});
    std::string template_src; // the config's chat_template file, which replaces the model's
    if (!cfg.chat_template.empty()) {
        std::ifstream in(cfg.chat_template, std::ios::binary);
        if (!in) fail("chat_template: cannot read {}", cfg.chat_template);
        std::stringstream ss;
        ss << in.rdbuf();
        template_src = ss.str();
        if (template_src.empty()) fail("chat_template: {} is empty", cfg.chat_template);
    }
    ms.tmpl = chat_template::from_gguf(*ms.bundle.file, *ms.bundle.tok, template_src);
    log->info("chat template: {}{}{}", ms.tmpl.renderer_name(),
              cfg.chat_template.empty() ? "" : " from " + cfg.chat_template,
              ms.tmpl.uses_jinja() ? "" : " (" + ms.tmpl.jinja_error() + ")");
    {
        // The thinking's markers: from the template in use (the config's or the file's) and
        // the vocabulary.
        if (!template_src.empty()) {
            ms.template_source = template_src;
        } else {
            const auto* src = ms.bundle.file->find("tokenizer.chat_template");
            const std::string* text = src ? src->as_string() : nullptr;
            if (text) ms.template_source = *text; // (the file is closed once loaded)
        }
        ms.reasoning = find_reasoning(ms.template_source, *ms.bundle.tok);
    }
    const model_config& mc = ms.bundle.cfg;
    const int n_threads = cfg.threads > 0 ? cfg.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    engine_options eo = cfg.engine; // (the settings from the config; what follows is derived)
    eo.n_threads = n_threads;
    // The context and the KV pool (config.hpp plan_context): n_ctx defaults to the training
    // context as far as the KV memory holds it; the notes say what was chosen and why.
    const kv_layout layout{mc.n_layer, mc.n_head_kv, mc.head_dim, eo.sched.page_size, kv};
    const context_plan cp = plan_context(cfg, mc.n_ctx_train, layout.page_bytes());
    if (!cp.error.empty()) fail("{}", cp.error);
    for (const context_plan::note& n : cp.notes) {
        if (n.warn) log->warn("{}", n.text);
        else log->info("{}", n.text);
    }
    eo.n_ctx = cp.n_ctx;
    eo.max_draft_tokens = cfg.speculative_tokens();
    if (!cfg.draft_model.empty()) { // runs in this process, on the engine's thread (runtime/draft_model.hpp)
        ms.draft = load_draft_model(cfg.draft_model, *ms.bundle.tok, load_options{wf, kv, 0});
        eo.draft_model = ms.draft->mdl.get();
    }
    // The channel's logits area: one row per decoding sequence, and the drafts' rows of the
    // sequences that may draft at once.
    eo.sched.max_logits =
        std::max(1, eo.sched.max_running) + std::min(eo.sched.max_running, eo.max_draft_batch) * eo.max_draft_tokens;
    eo.sched.n_pages = int32_t(cp.n_pages);
    ms.n_ctx = eo.n_ctx;
    ms.threads = n_threads;
    ms.max_prompt_tokens = cp.max_prompt_tokens;
    ms.max_tokens_limit = cp.max_tokens_limit;
    ms.guides = std::make_unique<grammar::guide_registry>(grammar::vocab_trie::of(*ms.bundle.tok));
    if (!cfg.workers) {
        ms.prefill_device = ms.decode_device = "cpu (in-process)";
        ms.eng = make_local_engine(*ms.bundle.mdl, *ms.bundle.tok, eo);
        return state;
    }

    const uint64_t fp = model_fingerprint(*ms.bundle.file, wf, kv);
    // Nothing here reads the file again: its mapping goes, so a file truncated on disk cannot
    // fault this process (the workers', in use, are restarted; worker_spec's file checks).
    ms.bundle.file.reset();
    eo.sched.prefix_seed = fp;
    // One pool per socket and model (the socket systemd passed, under activation): daemons
    // side by side never share one.
    const std::string pool_path =
        cfg.kv_pool.empty() ? ipc::default_kv_pool_path(socket_name, fs::absolute(cfg.model).lexically_normal().string())
                            : cfg.kv_pool;
    // The default's directory is this user's own: /dev/shm/tandem-UID (0700), or the unit's
    // RuntimeDirectory (systemd made it this user's).
    if (cfg.kv_pool.empty())
        ensure_owned_dir(fs::path(pool_path).parent_path().string(), 0700, under_systemd_runtime() ? 0755 : 0700);
    std::string why;
    ms.pool = ipc::kv_pool::create_or_adopt(pool_path, {fp, layout, eo.sched.n_pages}, &why);
    ms.unlink_pool = !cfg.kv_pool_persist;
    ms.store = make_pool_store(*ms.pool);
    worker_spec base;
    base.model = cfg.model;
    base.pool = pool_path;
    base.model_fd = ms.model_fd;
    base.pool_fd = ms.pool->fd();
    base.model_stat = file_stamp::of(ms.model_fd);
    base.pool_bytes = ms.pool->bytes();
    base.kv = kv;
    base.weights = wf;
    base.page_size = eo.sched.page_size;
    base.n_pages = eo.sched.n_pages;
    base.fingerprint = fp;
    base.max_rows = eo.sched.max_logits;
    base.max_tokens = resolve_options(eo, mc).sched.step_tokens; // the largest batch
    base.command_bytes = command_ring_bytes(eo, cfg.max_n);
    base.n_vocab = mc.n_vocab;
    base.log_level = cfg.log_level;
    base.timeout_s = cfg.worker_timeout_s;
    base.heartbeat_s = cfg.worker_heartbeat_s;
    deployment dep = deploy_workers(cfg, base, n_threads);
    ms.prefill_device = dep.prefill_device;
    ms.decode_device = dep.decode_device;
    engine_parts parts;
    parts.executors = std::move(dep.executors);
    parts.store = ms.store.get();
    ipc::kv_pool& pool = *ms.pool;
    parts.restore = [&pool, log, why](scheduler& s) {
        const int32_t n = why.empty() ? restore_prefix_cache(pool, s) : 0;
        if (why.empty()) log->info("KV pool {}: kept from the last run, {} cached pages", pool.path(), n);
        else log->info("KV pool {}: new ({})", pool.path(), why);
    };
    ms.eng = make_engine(mc, *ms.bundle.tok, eo, std::move(parts));
    for (;;) {
        std::string failure;
        if (ms.eng->wait_ready(std::chrono::milliseconds(250), failure)) break;
        if (!failure.empty()) fail("{}", failure);
        if (abort) fail("stopped while loading");
    }
    return state;
}

void server::start_loading() {
    if (managed_) systemd::notify_status("loading " + default_model_name(st_.cfg));
    const std::string socket_name = socket_name_;
    auto load = [socket_name](const model_source& src, const std::atomic<bool>& abort) {
        // Tests stretch the load to observe the loading state; nothing else sets this.
        if (const char* d = std::getenv("TANDEMD_TEST_LOAD_DELAY_MS"); d && *d)
            for (int ms = std::atoi(d); ms > 0 && !abort; ms -= 10)
                std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, 10)));
        // The default model's pool is named as before (after the socket); a section's also
        // after its name, so that two names of one file never share a pool.
        return load_model_state(src.cfg, src.is_default ? socket_name : socket_name + "#" + src.name, abort);
    };
    host_ = std::make_unique<model_host>(st_, io_.get_executor(), std::move(load), [this] { models_changed(); });
    st_.models = host_.get();
    const model_pick p = host_->load(""); // the default model, at start
    if (p.error) { // (it cannot be had: no room is not possible here)
        load_error_ = p.error->message;
        exit_code_ = 1;
        begin_drain();
    }
}

void server::models_changed() {
    auto log = logger("server");
    sessions_.state_changed(); // requests held for a model look again
    if (st_.stopping || st_.serving) return;
    if (st_.ms) { // the default model is in: the daemon is ready
        st_.serving = true;
        const std::string status =
            fmt::format("serving {} ({} threads, context {})", st_.ms->id, st_.ms->threads, st_.ms->n_ctx);
        log->info("ready: {}", status);
        ready_ = true;
        if (managed_) systemd::notify_ready(status);
        return;
    }
    if (auto err = host_->default_failure()) {
        log->error("cannot load the model: {}", *err);
        exit_code_ = 1;
        load_error_ = *err;
        begin_drain(); // requests held for the model get 503, then the daemon exits
        if (managed_) systemd::notify_status("failed: " + *err);
    }
}

std::unique_ptr<tcp_policy> server::tcp_policy_of(const sockaddr_storage& addr) {
    char text[INET6_ADDRSTRLEN] = {};
    int port = 0;
    if (addr.ss_family == AF_INET) {
        const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
        ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
        port = ntohs(a.sin_port);
    } else if (addr.ss_family == AF_INET6) {
        const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
        ::inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof text);
        port = ntohs(a.sin6_port);
    }
    auto p = std::make_unique<tcp_policy>(make_tcp_policy(st_.cfg, text, port, &keys_));
    // Beyond this machine, every client shows a key (and TLS belongs in front: docs/config.md).
    TANDEM_CHECK(p->loopback || p->keys, "the TCP listener on {}:{} is not on a loopback address: it needs "
                                         "api_keys_file in tandemd.conf", text, port);
    return p;
}

asio::awaitable<void> server::accept_loop(acceptor_type& acc, const tcp_policy* tcp) {
    for (;;) {
        error_code ec;
        auto sock = co_await acc.async_accept(asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {
            if (!acc.is_open() || ec == asio::error::operation_aborted) co_return;
            logger("server")->warn("accept failed: {}", ec.message());
            // e.g. out of file descriptors: back off instead of spinning
            asio::steady_timer t(io_, std::chrono::milliseconds(100));
            co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
        }
        // During the drain too: new requests get 503 "stopping" rather than a refused connection.
        sessions_.start(std::make_shared<session>(std::move(sock), st_, sessions_, policy_, tcp));
    }
}

asio::awaitable<void> server::watchdog_loop() {
    const auto interval = systemd::watchdog_interval();
    while (!finished_) {
        systemd::notify_watchdog();
        watchdog_timer_.expires_after(interval);
        error_code ec;
        co_await watchdog_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
}

// Once serving, every second: an engine that failed for good (a worker that cannot start
// again: its model or pool file changed under the daemon) ends the daemon with status 1, for
// its service manager to start it anew; every few seconds, STATUS= for `systemctl status`.
asio::awaitable<void> server::status_loop() {
    std::string last;
    const bool notify = managed_ && std::getenv("NOTIFY_SOCKET") != nullptr;
    for (int tick = 1; !finished_; ++tick) {
        status_timer_.expires_after(std::chrono::seconds(1));
        error_code ec;
        co_await status_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (host_ && !finished_ && !st_.stopping) host_->tick(); // idle models go (keep_alive)
        if (finished_ || st_.stopping || !st_.ms) continue;
        if (std::string failure; !st_.ms->eng->wait_ready(std::chrono::milliseconds(0), failure) && !failure.empty()) {
            logger("server")->error("cannot serve any more: {}; exiting", failure);
            if (managed_) systemd::notify_status("failed: " + failure);
            exit_code_ = 1;
            begin_drain();
            continue;
        }
        if (!notify || tick % 5 != 0) continue;
        const engine_stats es = st_.ms->eng->stats();
        const auto tot = st_.met.totals();
        std::string s = fmt::format("serving {}: {} running, {} waiting, KV {}/{} pages, {} requests", st_.ms->id,
                                    es.n_running, es.n_waiting, es.n_pages_used, es.n_pages_total, tot.n_requests);
        if (s != last) systemd::notify_status(s);
        last = std::move(s);
    }
}

void server::on_signal(int signo) {
    if (finished_) return;
    if (st_.stopping) { // a second signal: stop now
        logger("server")->info("signal {} again: cancelling what is left", signo);
        sessions_.stop_all();
        finish();
        return;
    }
    logger("server")->info("signal {}: draining in-flight requests", signo);
    begin_drain();
    signals_.async_wait([this](const error_code& ec, int s) {
        if (!ec) on_signal(s);
    });
}

void server::begin_drain() {
    st_.stopping = true;
    if (jobs_) jobs_->stop(); // no new line; those in flight are answered in the drain
    abort_loading_ = true;
    if (host_) host_->abort_loading();
    if (managed_) systemd::notify_stopping();
    // Our own listeners keep accepting while the drain lasts (new requests get 503 "stopping"
    // with Retry-After). The sockets systemd passed are closed: their new connections wait in
    // systemd's queue for the next instance, which it starts once this one is gone.
    for (size_t i = 0; i < n_passed_; ++i) {
        error_code ec;
        acceptors_[i]->close(ec);
    }
    sessions_.state_changed(); // requests held for the model get their 503 now
    drain_timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(st_.cfg.drain_timeout_s)));
    drain_timer_.async_wait([this](const error_code& ec) {
        if (ec) return;
        logger("server")->warn("drain timed out after {} s: cancelling what is left", st_.cfg.drain_timeout_s);
        sessions_.stop_all();
        finish();
    });
    sessions_.drain([this] { finish(); });
}

void server::finish() {
    if (finished_) return;
    finished_ = true;
    error_code ec;
    signals_.cancel(ec);
    drain_timer_.cancel();
    watchdog_timer_.cancel();
    status_timer_.cancel();
    for (auto& acc : acceptors_) acc->close(ec);
    sessions_.stop_all(); // any that came during the drain
    io_.stop();
}

void server::start_batch_jobs() {
    if (!managed_) return; // tandem batch's own daemon: its client has the file
    const config& c = st_.cfg;
    batch_settings s;
    s.dir = c.state_dir.empty() ? default_state_dir() : c.state_dir;
    s.socket = socket_name_;
    s.max_file_bytes = c.max_file_bytes;
    s.max_json_depth = c.max_json_depth;
    s.max_files = c.max_files;
    s.concurrency = c.batch_concurrency > 0 ? c.batch_concurrency : c.engine.sched.max_running;
    try { // stored Responses (previous_response_id) beside the batch jobs
        st_.responses =
            std::make_shared<response_store>(s.dir + "/responses", std::chrono::hours(c.responses_ttl_h));
    } catch (const std::exception& e) {
        logger("server")->warn("stored responses are off (/v1/responses store): {}", e.what());
    }
    try {
        jobs_ = std::make_unique<batch_jobs>(s);
    } catch (const std::exception& e) {
        logger("server")->warn("batch jobs are off (/v1/files, /v1/batches): {}", e.what());
        return;
    }
    st_.jobs = jobs_.get();
    jobs_->start();
}

void server::stop() {
    asio::post(io_, [this] {
        if (!st_.stopping && !finished_) begin_drain();
    });
}

int server::run() {
    std::signal(SIGPIPE, SIG_IGN);
    listen();
    for (size_t i = 0; i < acceptors_.size(); ++i)
        asio::co_spawn(io_, accept_loop(*acceptors_[i], tcp_[i].get()), asio::detached);
    if (managed_)
        signals_.async_wait([this](const error_code& ec, int s) {
            if (!ec) on_signal(s);
        });
    if (managed_ && systemd::watchdog_interval().count() > 0) asio::co_spawn(io_, watchdog_loop(), asio::detached);
    asio::co_spawn(io_, status_loop(), asio::detached);
    start_batch_jobs();
    start_loading();
    io_.run();
    jobs_.reset(); // (its lines in flight were answered in the drain, or their connections closed)

    // The engines go first: their last events are posted to io_, which must still exist.
    abort_loading_ = true;
    if (host_) host_->stop_all(); // every engine and its workers, then the pools' files unless kept
    st_.ms.reset();
    if (!socket_path_.empty()) {
        std::error_code fec;
        fs::remove(socket_path_, fec);
    }
    logger("server")->info("stopped");
    return exit_code_;
}

} // namespace tandem::daemon
