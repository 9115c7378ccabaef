// What the daemon's client commands share: options, exit codes, the terminal, sending a request.
#pragma once

#include "daemon/cli.hpp"
#include "ipc/client.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tandem::cli::client {

using json = nlohmann::json;

// Exit codes of the daemon commands (README "The tandem client" lists them too; usage
// mistakes are cli::exit_usage).
enum exit_code : int {
    exit_ok = 0,
    exit_error = 1,       // anything else: a broken stream, a bad reply, a local failure
    exit_unreachable = 3, // no daemon on the socket, or this user may not use it (no permission, HTTP 401/403)
    exit_rejected = 4,    // the daemon answered with an error (4xx/5xx other than these)
    exit_busy = 5,        // 429/503: over capacity or still loading, after waiting up to --wait
    exit_interrupted = 130,
};

struct client_opts {
    std::string socket, model, system;
    std::vector<std::string> prompt; // words, joined by spaces
    std::optional<double> temp, top_p;
    std::optional<int64_t> top_k, seed, max_tokens;
    std::vector<std::string> stop;
    double wait_s = 60; // how long a busy or loading daemon (429/503 with Retry-After) is waited for
    bool json = false, raw = false, chat = false;
    // status --watch
    bool watch = false;
    double interval_s = 2;
    int64_t count = 0; // samples to print; 0: until Ctrl-C
};

// Colour and the spinner only when a person is watching: a TTY, and NO_COLOR unset.
struct terminal {
    bool in_tty, out_tty, err_tty, colour_ok;
    terminal();

    std::string out(std::string_view code, std::string_view text) const { return paint(out_tty, code, text); }
    std::string err(std::string_view code, std::string_view text) const { return paint(err_tty, code, text); }

private:
    std::string paint(bool tty, std::string_view code, std::string_view text) const;
};

inline constexpr std::string_view bold = "1", dim = "2", red = "31", green = "32", yellow = "33";

// Set by SIGINT while `tandem chat` or `tandem status --watch` runs (install_sigint).
extern std::atomic<bool> interrupted;
// SIGINT sets `interrupted` instead of ending the process. No SA_RESTART: a blocked read
// returns and sees the flag.
void install_sigint();
// Sleeps up to `seconds`; false when interrupted first.
bool sleep_unless_interrupted(double seconds);

// A spinner on stderr until the first token arrives (or the request ends).
class spinner {
public:
    explicit spinner(bool enabled);
    ~spinner() { stop(); }
    void stop();
    // A line of its own above the spinner (on a terminal the frame is redrawn below it).
    void say(const std::string& line);

private:
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
};

// "tandem: <text>" on stderr, the prefix in red on a terminal.
void message(const terminal& t, std::string_view text);
// No daemon on the socket, or no permission to use it: what to do, exit_unreachable.
int report_unreachable(const terminal& t, const ipc::client& c, const ipc::response& r);
// An HTTP error from the daemon: its message, and the exit code its status means.
int report_http_error(const terminal& t, const ipc::response& r);

json request_body(const client_opts& o, bool chat, const std::vector<json>& messages, const std::string& prompt);

struct reply {
    int rc = exit_ok;
    std::string text;
};

// POSTs a JSON body and reads the whole reply, waiting for a busy or loading daemon (--wait);
// rc is exit_ok with a 2xx reply, else the exit code (the problem already reported).
struct posted {
    int rc = exit_ok;
    ipc::response r;
};
posted post_json(const ipc::client& c, const terminal& t, const client_opts& o, std::string_view target,
                 const json& body);

// Sends one request and prints the reply: streamed token by token, or with --json the
// daemon's response object as it is. A busy or loading daemon is waited for (--wait).
reply send(const ipc::client& c, const terminal& t, const client_opts& o, const json& body, bool chat);

// --socket, as every daemon command takes it.
void add_socket(CLI::App& a, client_opts& o);

int cmd_chat(const client_opts& o);   // cli_chat.cpp
int cmd_status(const client_opts& o); // cli_status.cpp: once, or --watch

} // namespace tandem::cli::client
