// tandemd's server: owns the io_context, signals, listeners, the session manager, and the
// model loader; shaped like Asio's HTTP server example.
#pragma once

#include "runtime/prelude.hpp"

#include "daemon/access.hpp"
#include "daemon/model_host.hpp"
#include "daemon/peer_cred.hpp"
#include "daemon/session_manager.hpp"
#include "daemon/state.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace tandem::daemon {

namespace asio = boost::asio;

// The model cfg names, loaded, and its engine started: in this process (workers = false),
// or in its workers around a KV pool named after `socket_name` (the socket served), waiting
// until they are ready unless `abort` is set. Throws tandem::error; a state that failed half
// way is gone, its pool file with it (unless kv_pool_persist). The server's loader runs it;
// tests and the fuzzer serve its result without a server.
std::unique_ptr<model_state> load_model_state(const config& cfg, const std::string& socket_name,
                                              const std::atomic<bool>& abort);

class server {
public:
    // embedded: serves a command of this process (`tandem batch`), which handles its signals:
    // no SIGTERM/SIGINT handling here and nothing to or from systemd (no passed sockets, no
    // notifications, no watchdog).
    explicit server(config cfg, bool embedded = false);
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    // Listens, loads the model in the background, serves until SIGTERM/SIGINT has drained
    // the in-flight requests. Returns the exit code (0 after a clean drain, 1 when the
    // model failed to load). Throws tandem::error when it cannot listen.
    int run();
    // Drains and stops, as SIGTERM does; from any thread, before or while run() runs.
    void stop();
    // Why the model did not load, once run() has returned 1 for that.
    const std::string& load_error() const { return load_error_; }
    // The model is loaded and the socket listening; from any thread.
    bool ready() const { return ready_; }

private:
    using acceptor_type = asio::basic_socket_acceptor<asio::generic::stream_protocol>;

    void listen();
    void start_loading();
    void models_changed(); // a model loaded, failed or went (io thread)
    // /v1/files and /v1/batches, their runner started (a warning and none when the state
    // directory cannot be had).
    void start_batch_jobs();
    // A TCP acceptor's checks (access.hpp), from the address it is bound to.
    std::unique_ptr<tcp_policy> tcp_policy_of(const sockaddr_storage& addr);
    asio::awaitable<void> accept_loop(acceptor_type& acc, const tcp_policy* tcp);
    asio::awaitable<void> watchdog_loop();
    asio::awaitable<void> status_loop();
    void on_signal(int signo);
    void begin_drain();
    void finish();

    daemon_state st_;
    peer_policy policy_;
    std::unique_ptr<model_host> host_; // (before io_: requests' frames release their models into it)
    asio::io_context io_{1};
    asio::signal_set signals_;
    std::vector<std::unique_ptr<acceptor_type>> acceptors_;
    std::vector<std::unique_ptr<tcp_policy>> tcp_; // per acceptor: its TCP checks, null for a Unix socket
    api_keys keys_;                                // api_keys_file's, for the TCP listeners
    session_manager sessions_;
    asio::steady_timer drain_timer_;
    asio::steady_timer watchdog_timer_;
    asio::steady_timer status_timer_;
    std::unique_ptr<batch_jobs> jobs_; // (after loader_: it goes first)
    std::atomic<bool> abort_loading_{false}; // set on SIGTERM: a loader waiting for workers gives up
    std::atomic<bool> ready_{false};
    std::string socket_path_;      // the file we created (removed on exit); "" under activation
    std::string socket_name_;      // the Unix socket served (systemd's, under activation): names the KV pool
    size_t n_passed_ = 0;          // acceptors_[0, n_passed_) are the sockets systemd passed
    int exit_code_ = 0;
    bool finished_ = false;
    bool managed_ = true;          // talks to systemd and handles signals (not embedded)
    std::string load_error_;
};

} // namespace tandem::daemon
