// Test helpers for tandemd: start the real daemon, talk raw HTTP/1.1 to its Unix socket.
#pragma once

#include "test_util.hpp"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tandem::test {

using json = nlohmann::json;

// A free loopback TCP port (bound, read, closed: another process could take it in between,
// which no test here does).
inline int free_port() {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&in), sizeof in);
    socklen_t len = sizeof in;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&in), &len);
    ::close(s);
    return ntohs(in.sin_port);
}

inline int connect_unix(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

inline bool send_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return false;
        off += size_t(n);
    }
    return true;
}

// Reads what arrives within `timeout_ms` of silence, until EOF; returns it.
inline std::string read_until_eof(int fd, int timeout_ms = 30000) {
    std::string out;
    char buf[65536];
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) <= 0) break;
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    return out;
}

struct http_response {
    int status = 0;
    std::map<std::string, std::string> headers; // lower-case names
    std::string body;                            // de-chunked
    json j() const { return json::parse(body, nullptr, false); }
};

inline std::string dechunk(const std::string& s) {
    std::string out;
    size_t pos = 0;
    for (;;) {
        const size_t eol = s.find("\r\n", pos);
        if (eol == std::string::npos) break;
        const size_t n = std::stoul(s.substr(pos, eol - pos), nullptr, 16);
        if (n == 0) break;
        out += s.substr(eol + 2, n);
        pos = eol + 2 + n + 2;
    }
    return out;
}

inline http_response parse_response(const std::string& raw) {
    http_response r;
    const size_t head_end = raw.find("\r\n\r\n");
    if (raw.size() < 12 || head_end == std::string::npos) return r;
    r.status = std::stoi(raw.substr(9, 3));
    size_t pos = raw.find("\r\n") + 2;
    while (pos < head_end) {
        const size_t eol = raw.find("\r\n", pos);
        const std::string line = raw.substr(pos, eol - pos);
        const size_t colon = line.find(':');
        std::string name = line.substr(0, colon);
        for (auto& c : name) c = char(std::tolower(c));
        r.headers[name] = line.substr(colon + 2);
        pos = eol + 2;
    }
    r.body = raw.substr(head_end + 4);
    if (r.headers["transfer-encoding"] == "chunked") r.body = dechunk(r.body);
    return r;
}

inline std::string make_request(const std::string& method, const std::string& target, const std::string& body,
                                bool close = true) {
    std::string s = method + " " + target + " HTTP/1.1\r\nHost: tandem\r\n";
    if (!body.empty() || method == "POST")
        s += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    if (close) s += "Connection: close\r\n";
    return s + "\r\n" + body;
}

// One request on a fresh connection (Connection: close).
inline http_response request(const std::string& sock, const std::string& method, const std::string& target,
                             const std::string& body = "") {
    const int fd = connect_unix(sock);
    if (fd < 0) return {};
    send_all(fd, make_request(method, target, body));
    const std::string raw = read_until_eof(fd);
    ::close(fd);
    return parse_response(raw);
}

inline http_response post(const std::string& sock, const std::string& target, const json& body) {
    return request(sock, "POST", target, body.dump());
}

// The named events of an SSE body ("event: NAME" then "data: {...}", as Anthropic's and the
// Responses API's streams frame them): (name, data) pairs; `well_formed` false on a frame
// without both lines, or whose data's "type" is not its event's name.
inline std::vector<std::pair<std::string, json>> named_events(const std::string& body, bool& well_formed) {
    std::vector<std::pair<std::string, json>> out;
    well_formed = true;
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t end = body.find("\n\n", pos);
        if (end == std::string::npos) {
            well_formed = false;
            break;
        }
        const std::string frame = body.substr(pos, end - pos);
        pos = end + 2;
        const size_t nl = frame.find('\n');
        if (frame.rfind("event: ", 0) != 0 || nl == std::string::npos || frame.compare(nl + 1, 6, "data: ") != 0) {
            well_formed = false;
            continue;
        }
        const std::string name = frame.substr(7, nl - 7);
        json data = json::parse(frame.substr(nl + 7), nullptr, false);
        if (data.is_discarded() || data.value("type", "") != name) well_formed = false;
        out.emplace_back(name, data);
    }
    return out;
}

// The JSON payloads of an SSE body ("data: {...}" events); `done` tells whether [DONE] ended it.
inline std::vector<json> sse_events(const std::string& body, bool* done = nullptr, bool* well_formed = nullptr) {
    std::vector<json> out;
    bool ok = true, saw_done = false;
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t end = body.find("\n\n", pos);
        if (end == std::string::npos) {
            ok = false;
            break;
        }
        const std::string ev = body.substr(pos, end - pos);
        pos = end + 2;
        if (ev.rfind("data: ", 0) != 0 || saw_done) {
            ok = false;
            continue;
        }
        const std::string data = ev.substr(6);
        if (data == "[DONE]") {
            saw_done = true;
            continue;
        }
        json j = json::parse(data, nullptr, false);
        if (j.is_discarded()) ok = false;
        out.push_back(j);
    }
    if (done) *done = saw_done;
    if (well_formed) *well_formed = ok;
    return out;
}

// A metric's value from Prometheus text (the first line starting with `name` + ' ' or '{...} ').
inline double metric(const std::string& text, const std::string& name_and_labels) {
    size_t pos = 0;
    while ((pos = text.find(name_and_labels + " ", pos)) != std::string::npos) {
        if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + name_and_labels.size() + 1));
        ++pos;
    }
    return -1;
}

// The daemon the suites start: the build's tandemd, or the one TANDEM_TANDEMD names (a suite
// built against the emulated CUDA device starts tandemd_emulated).
inline std::string default_tandemd() {
#ifdef TANDEM_TANDEMD
    return TANDEM_TANDEMD;
#else
    return binary_dir() + "/daemon/tandemd";
#endif
}

// A tandemd child process on a scratch socket.
struct daemon_process {
    pid_t pid = -1;
    std::string sock;
    std::string log; // when set before spawn: the daemon's stderr (its log) is appended to this file
    // Its state directory (batch jobs): $STATE_DIRECTORY, a fresh one made at the first spawn and
    // removed at the end unless set before (so the tests' daemons never share the user's).
    std::string state_dir;
    bool own_state_dir = false;

    // argv after the binary (tandemd unless `binary` names another); env entries ("K=V") added to ours.
    void spawn(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
               const std::string& binary = "") {
        std::vector<std::string> argv_s;
        argv_s.push_back(binary.empty() ? default_tandemd() : binary);
        for (const auto& a : args) argv_s.push_back(a);
        std::vector<char*> argv;
        for (auto& a : argv_s) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::vector<std::string> env_s;
        for (char** e = environ; *e; ++e) {
            const std::string kv = *e;
            if (kv.rfind("NOTIFY_SOCKET=", 0) == 0 || kv.rfind("LISTEN_", 0) == 0 || kv.rfind("WATCHDOG_", 0) == 0 ||
                kv.rfind("STATE_DIRECTORY=", 0) == 0)
                continue;
            env_s.push_back(kv);
        }
        if (state_dir.empty()) {
            std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-test-state.XXXXXX").string();
            if (::mkdtemp(tmpl.data()) != nullptr) {
                state_dir = tmpl;
                own_state_dir = true;
            }
        }
        env_s.push_back("STATE_DIRECTORY=" + state_dir);
        for (const auto& e : env) env_s.push_back(e);
        std::vector<char*> envp;
        for (auto& e : env_s) envp.push_back(e.data());
        envp.push_back(nullptr);
        const std::string exe = argv_s[0];
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        if (!log.empty()) posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (posix_spawnp(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
        posix_spawn_file_actions_destroy(&fa);
    }

    void start(const std::string& socket_path, const std::vector<std::string>& extra = {},
               const std::vector<std::string>& env = {}) {
        sock = socket_path;
        // the shared KV pool next to the socket (removed with the scratch dir), not in /dev/shm
        std::vector<std::string> args = {"--model", model_path("stories260K.gguf"), "--socket", sock, "--threads", "1",
                                         "--log", "warn", "--set", "kv_pool=" + sock + ".kv"};
        for (const auto& a : extra) args.push_back(a);
        spawn(args, env);
    }

    // Polls /health until 200 (true) or the deadline.
    bool wait_ready(double seconds = 20) const {
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (std::chrono::steady_clock::now() < until) {
            if (request(sock, "GET", "/health").status == 200) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }

    // SIGTERM, then the exit code (128 + signal when killed; -1 if it did not exit in time).
    int stop(double seconds = 30) {
        if (pid <= 0) return -1;
        ::kill(pid, SIGTERM);
        return wait_exit(seconds);
    }

    int wait_exit(double seconds) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (std::chrono::steady_clock::now() < until) {
            int st = 0;
            if (::waitpid(pid, &st, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return -1;
    }

    ~daemon_process() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
        if (own_state_dir) {
            std::error_code ec;
            std::filesystem::remove_all(state_dir, ec);
        }
    }
};

} // namespace tandem::test
