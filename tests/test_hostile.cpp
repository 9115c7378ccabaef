// Hostile requests against the real daemon: JSON nested far deeper than anything copies or
// prints safely, every field of every route given the wrong type, batch lines and metadata
// that do the same; the daemon answers each with a 400 that names the place, and lives on.
#include "api_requests.hpp"
#include "batch_http.hpp"
#include "batch_lines.hpp"
#include "daemon_client.hpp"
#include "runtime/json_limits.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

using namespace tandem;
using namespace tandem::test;

namespace {

scratch_dir& scratch() {
    static scratch_dir d("hostile");
    return d;
}

// `n` arrays inside each other around `inner`: 2n + |inner| bytes, never built as a value.
std::string nested(size_t n, const std::string& inner = "1") {
    return std::string(n, '[') + inner + std::string(n, ']');
}

constexpr size_t deep = 200000; // 400 KB: under the default max_body_bytes (1 MiB)

// The daemon answered (a status line came back) and is still there and healthy.
void check_alive(const daemon_process& d) {
    REQUIRE(d.pid > 0);
    CHECK(::kill(d.pid, 0) == 0);
    CHECK(request(d.sock, "GET", "/health").status == 200);
}

} // namespace

TEST_CASE("json_too_deep counts containers outside strings, escapes included") {
    CHECK_FALSE(json_too_deep("[[1]]", 2));
    CHECK(json_too_deep("[[[1]]]", 2)->offset == 2);
    CHECK_FALSE(json_too_deep(R"({"a": "[[[[[[", "b": [{}]})", 3));  // brackets in a string do not count
    CHECK_FALSE(json_too_deep(R"(["\"[[[[", 1])", 1));              // nor after an escaped quote
    CHECK(json_too_deep(R"(["\\", [[1]]])", 2)->offset == 8);        // an escaped backslash ends its escape
    CHECK_FALSE(json_too_deep("[1],[2],[3]", 1));                     // siblings are not deeper
    CHECK(json_too_deep(nested(deep), 64)->offset == 64);
    // where it goes too deep, as the API names places
    CHECK(json_too_deep(R"({"a": [1, {"b": [[1]]}]})", 3)->path == "a[1].b");
    CHECK(json_too_deep(R"({"x": "}", "m": [{"c": "a,b"}, {"c": [[[0]]]}]})", 4)->path == "m[1].c[0]");
    std::string why;
    CHECK_FALSE(parse_json_limited(nested(65), 64, why));
    CHECK(why.find("nested deeper than 64 levels") != std::string::npos);
    CHECK(parse_json_limited(nested(64), 64, why));
    CHECK_FALSE(parse_json_limited("{\"a\": ", 64, why));
    CHECK(why.find("not valid JSON") != std::string::npos);
}

TEST_CASE("tandemd: JSON nested 200,000 deep anywhere in a request is a 400, and the daemon lives on") {
    daemon_process d;
    d.start(scratch().file("deep.sock"));
    REQUIRE(d.wait_ready());
    const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, )";
    const std::string schema_at = R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )";
    const std::vector<std::pair<std::string, std::string>> bodies = {
        {"schema default", chat + schema_at + R"({"type": "array", "default": )" + nested(deep) + "}}}}"},
        {"schema const", chat + schema_at + R"({"const": )" + nested(deep) + "}}}}"},
        {"schema enum", chat + schema_at + R"({"enum": [)" + nested(deep) + "]}}}}"},
        {"tool parameters", chat + R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"default": )" +
                                nested(deep) + "}}}}}]}"},
        {"message content", R"({"messages": [{"role": "user", "content": )" + nested(deep) + "}]}"},
        {"the body itself", nested(deep)},
        {"a completion prompt", R"({"prompt": )" + nested(deep) + "}"},
        {"embedding input", R"({"input": )" + nested(deep) + "}"},
    };
    for (const auto& entry : bodies) {
        const std::string& what = entry.first; // (a name, not a structured binding: CAPTURE's lambda takes it)
        const std::string& body = entry.second;
        CAPTURE(what);
        const std::string route = what == "a completion prompt" ? "/v1/completions"
                                  : what == "embedding input"   ? "/v1/embeddings"
                                                                : "/v1/chat/completions";
        const http_response r = request(d.sock, "POST", route, body);
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["code"] == "json_too_deep");
        check_alive(d);
    }
    // A schema given as JSON text is parsed under the same limit.
    const json as_text = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                          {"response_format",
                           {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", nested(deep)}}}}}};
    const http_response r = post(d.sock, "/v1/chat/completions", as_text);
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["message"].get<std::string>().find("nested deeper than") != std::string::npos);
    check_alive(d);
}

TEST_CASE("tandemd: a batch whose line or metadata nests 200,000 deep fails that line alone, also after a restart") {
    daemon_process d;
    d.start(scratch().file("deep-batch.sock"));
    REQUIRE(d.wait_ready());
    const std::string deep_line = R"({"custom_id": "deep", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "stop": )" +
                                  nested(deep) + "}}\n";
    const std::string content = line("before", "/v1/completions", completion("Once", 2)).dump() + "\n" + deep_line +
                                line("after", "/v1/completions", completion("Once", 2)).dump() + "\n";
    const http_response up = upload(d.sock, content);
    REQUIRE(up.status == 200);
    const std::string file_id = json::parse(up.body)["id"];

    const std::string create = R"({"input_file_id": ")" + file_id +
                               R"(", "endpoint": "/v1/completions", "completion_window": "24h", "metadata": )";
    const http_response meta = request(d.sock, "POST", "/v1/batches", create + nested(deep) + "}");
    CHECK(meta.status == 400);
    CHECK(meta.j()["error"]["code"] == "json_too_deep");
    check_alive(d);

    const http_response made = request(d.sock, "POST", "/v1/batches", create + "null}");
    REQUIRE(made.status == 200);
    const std::string batch_id = json::parse(made.body)["id"];
    const json b = poll_batch(d.sock, batch_id, ended);
    CHECK(b["status"] == "completed");
    CHECK(b["request_counts"] == json{{"total", 3}, {"completed", 2}, {"failed", 1}});
    const std::vector<json> errors = file_lines(d.sock, b["error_file_id"]);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0]["error"]["code"] == "invalid_json");
    CHECK(errors[0]["error"]["message"].get<std::string>().find("nested deeper than") != std::string::npos);
    check_alive(d);

    // The daemon comes back on the same state: the job is done, nothing runs it again.
    const std::string state = d.state_dir;
    CHECK(d.stop() == 0);
    daemon_process again;
    again.state_dir = state;
    again.start(scratch().file("deep-batch2.sock"));
    REQUIRE(again.wait_ready());
    const http_response after = request(again.sock, "GET", "/v1/batches/" + batch_id);
    REQUIRE(after.status == 200);
    CHECK(after.j()["status"] == "completed");
    check_alive(again);
}

TEST_CASE("tandemd: every field of every route given the wrong type is a 400 that names its place") {
    daemon_process d;
    d.start(scratch().file("types.sock"), {"--set", "draft_tokens=2"});
    REQUIRE(d.wait_ready());
    const std::vector<json> wrong = {5, -1, 1.5, "x", true, nullptr, json::array(), json::object(),
                                     json::parse(nested(70)), json{{"a", json::array({1})}}};
    int n_requests = 0, n_refused = 0;
    for (const base_request& base : base_requests()) {
        CAPTURE(base.route);
        {
            const http_response ok = post(d.sock, base.route, base.body);
            INFO(base.body.dump(), " -> ", ok.body);
            REQUIRE(ok.status == 200); // the base is a valid request: each change below is the only fault
        }
        std::vector<std::pair<std::string, json::json_pointer>> paths;
        paths_of(base.body, "", paths);
        for (const auto& path_ptr : paths) {
            const auto& path = path_ptr.first;
            const auto& ptr = path_ptr.second;
            for (const json& w : wrong) {
                if (w.type() == base.body.at(ptr).type() && !w.is_array()) continue;
                json body = base.body;
                body.at(ptr) = w;
                CAPTURE(path);
                CAPTURE(w.dump());
                const http_response r = post(d.sock, base.route, body);
                ++n_requests;
                REQUIRE(r.status != 0); // an answer, never a dropped connection
                CHECK(r.status < 500);
                if (r.status == 400) {
                    ++n_refused;
                    const json e = r.j();
                    REQUIRE(e.contains("error"));
                    const std::string param = e["error"]["param"].is_string() ? e["error"]["param"].get<std::string>() : "";
                    INFO("message: ", e["error"]["message"].dump(), ", param: ", param);
                    // The field itself, or a place inside it (too deep), or, for a value that asks
                    // for nothing (null, empty), the field whose meaning it changed.
                    const bool asks_nothing = w.is_null() || ((w.is_array() || w.is_object()) && w.empty());
                    CHECK((names(param, path) || names(path, param) || (asks_nothing && names_a_place(param, body))));
                }
            }
        }
        check_alive(d);
    }
    MESSAGE(n_requests, " requests with a field of the wrong type, ", n_refused, " refused");
    CHECK(n_refused > n_requests / 2);
}

namespace {

// Runs `body` in a child process as uid `uid` (gid too) and returns its exit code (0 = passed);
// a test as root only.
int as_user(uid_t uid, const std::function<int()>& body) {
    const pid_t child = ::fork();
    if (child == 0) {
        if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(90);
        ::_exit(body());
    }
    int st = 0;
    ::waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

std::string id_of(const http_response& r) { return r.status == 200 ? r.j().value("id", "") : ""; }

// The ids a list route shows.
std::set<std::string> listed(const std::string& sock, const std::string& route) {
    std::set<std::string> ids;
    const http_response r = request(sock, "GET", route);
    if (r.status != 200) return ids;
    const json list = r.j();
    for (const json& item : list["data"]) ids.insert(item["id"].get<std::string>());
    return ids;
}

} // namespace

TEST_CASE("tandemd: users see only their own files and batches (404 for others'); root sees all") {
    if (::geteuid() != 0) {
        MESSAGE("not root: two users cannot be had; skipped");
        return;
    }
    public_scratch_dir dir("owners");
    daemon_process d;
    d.start(dir.file("owners.sock"), {"--set", "socket_mode=0666", "--set", "allowed_users=65534,65533"});
    REQUIRE(d.wait_ready());
    const std::string content = line("a", "/v1/completions", completion("Once", 2)).dump() + "\n";
    // Each user uploads a file and starts a batch on it, and writes the ids to a file of its own.
    const auto make_own = [&](uid_t uid) {
        const std::string out = dir.file("ids-" + std::to_string(uid));
        std::ofstream{out}; // (made here, given to the user: the directory is root's)
        REQUIRE(::chown(out.c_str(), uid, uid) == 0);
        const int rc = as_user(uid, [&] {
            const std::string file = id_of(upload(d.sock, content));
            if (file.empty()) return 1;
            const std::string batch = id_of(request(d.sock, "POST", "/v1/batches",
                                                    json{{"input_file_id", file},
                                                         {"endpoint", "/v1/completions"},
                                                         {"completion_window", "24h"}}.dump()));
            if (batch.empty()) return 2;
            std::ofstream ids(out);
            ids << file << "\n" << batch << "\n";
            return ids.good() ? 0 : 3;
        });
        REQUIRE(rc == 0);
        std::ifstream in(out);
        std::string file, batch;
        in >> file >> batch;
        return std::pair{file, batch};
    };
    // (names, not structured bindings: the lambdas below capture them)
    const auto own_a = make_own(65534), own_b = make_own(65533);
    const std::string file_a = own_a.first, batch_a = own_a.second, file_b = own_b.first, batch_b = own_b.second;
    // 65533 sees its own and not 65534's: 404 on every route, absent from the lists.
    CHECK(as_user(65533, [&] {
              int bad = 0;
              bad += request(d.sock, "GET", "/v1/files/" + file_b).status != 200;
              bad += request(d.sock, "GET", "/v1/files/" + file_a).status != 404;
              bad += request(d.sock, "GET", "/v1/files/" + file_a + "/content").status != 404;
              bad += request(d.sock, "DELETE", "/v1/files/" + file_a).status != 404;
              bad += request(d.sock, "GET", "/v1/batches/" + batch_a).status != 404;
              bad += request(d.sock, "POST", "/v1/batches/" + batch_a + "/cancel").status != 404;
              bad += request(d.sock, "POST", "/v1/batches",
                             json{{"input_file_id", file_a}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}}
                                 .dump())
                         .status != 404;
              const std::set<std::string> files = listed(d.sock, "/v1/files"), batches = listed(d.sock, "/v1/batches");
              bad += files.contains(file_a) || !files.contains(file_b);
              bad += batches.contains(batch_a) || !batches.contains(batch_b);
              return bad;
          }) == 0);
    // Root sees both; the batches' results belong to their owners.
    const std::set<std::string> all = listed(d.sock, "/v1/batches");
    CHECK(all.contains(batch_a));
    CHECK(all.contains(batch_b));
    const json done = poll_batch(d.sock, batch_a, ended);
    REQUIRE(done["output_file_id"].is_string());
    const std::string output_a = done["output_file_id"];
    CHECK(as_user(65534, [&] { return request(d.sock, "GET", "/v1/files/" + output_a + "/content").status == 200 ? 0 : 1; }) == 0);
    CHECK(as_user(65533, [&] { return request(d.sock, "GET", "/v1/files/" + output_a).status == 404 ? 0 : 1; }) == 0);
    check_alive(d);
}

TEST_CASE("tandemd: a planted KV pool file or link is left untouched and refused by name") {
    const std::string victim = scratch().file("victim");
    std::ofstream(victim) << "precious";
    const auto refused = [&](const std::string& pool, const std::string& expect) {
        daemon_process d;
        d.log = scratch().file("planted.log");
        std::filesystem::remove(d.log);
        d.spawn({"--model", model_path("stories260K.gguf"), "--socket", scratch().file("planted.sock"), "--threads", "1",
                 "--set", "kv_pool=" + pool});
        CHECK(d.wait_exit(60) == 1);
        const std::string log = read_text(d.log);
        INFO(log);
        CHECK(log.find(pool) != std::string::npos);
        CHECK(log.find(expect) != std::string::npos);
        CHECK(read_text(victim) == "precious");
    };
    const std::string link = scratch().file("pool-link");
    std::filesystem::create_symlink(victim, link);
    refused(link, "a symbolic link");
    const std::string wide = scratch().file("pool-wide");
    std::ofstream(wide) << "precious";
    std::filesystem::permissions(wide, std::filesystem::perms(0644));
    refused(wide, "mode 0644 is wider than 0600");
    CHECK(read_text(wide) == "precious");
    if (::geteuid() == 0) {
        const std::string theirs = scratch().file("pool-theirs");
        std::ofstream(theirs) << "precious";
        std::filesystem::permissions(theirs, std::filesystem::perms(0600));
        REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
        refused(theirs, "owned by uid 65534");
        CHECK(read_text(theirs) == "precious");
    }
    // The default pool's directory (here the unit's RuntimeDirectory) planted as a link.
    const std::string runtime_link = scratch().file("runtime-link");
    std::filesystem::create_directory(scratch().file("elsewhere"));
    std::filesystem::create_directory_symlink(scratch().file("elsewhere"), runtime_link);
    daemon_process d;
    d.log = scratch().file("planted-dir.log");
    d.spawn({"--model", model_path("stories260K.gguf"), "--socket", scratch().file("planted-dir.sock"), "--threads", "1"},
            {"RUNTIME_DIRECTORY=" + runtime_link});
    CHECK(d.wait_exit(60) == 1);
    CHECK(read_text(d.log).find("a symbolic link") != std::string::npos);
    CHECK(std::filesystem::is_empty(scratch().file("elsewhere")));
}

namespace {


// GET /health over TCP with these extra header lines ("Host: ..." among them).
http_response tcp_get(int port, const std::string& headers) {
    const int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(uint16_t(port));
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(t, reinterpret_cast<sockaddr*>(&in), sizeof in) != 0) {
        ::close(t);
        return {};
    }
    send_all(t, "GET /health HTTP/1.1\r\n" + headers + "Connection: close\r\n\r\n");
    const http_response r = parse_response(read_until_eof(t, 5000));
    ::close(t);
    return r;
}

} // namespace

TEST_CASE("tandemd over TCP: browsers' requests (Origin) and foreign Hosts get 403; keys where configured") {
    const int port = free_port();
    const std::string host = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    {
        daemon_process d;
        d.start(scratch().file("tcp.sock"), {"--set", "listen_tcp=127.0.0.1:" + std::to_string(port)});
        REQUIRE(d.wait_ready());
        CHECK(tcp_get(port, host).status == 200);
        CHECK(tcp_get(port, "Host: localhost:" + std::to_string(port) + "\r\n").status == 200);
        http_response r = tcp_get(port, host + "Origin: http://evil.example\r\n");
        CHECK(r.status == 403);
        CHECK(r.j()["error"]["code"] == "origin_not_allowed");
        r = tcp_get(port, "Host: evil.example:" + std::to_string(port) + "\r\n"); // DNS rebinding
        CHECK(r.status == 403);
        CHECK(r.j()["error"]["code"] == "host_not_allowed");
        CHECK(tcp_get(port, "").status == 403); // no Host at all
        // The Unix socket takes no such checks (its peers are known by their credentials).
        CHECK(request(d.sock, "GET", "/health").status == 200);
        CHECK(d.stop() == 0);
    }
    // With keys: none or a wrong one is a 401; the right one passes; Origin is still refused.
    const std::string keys = scratch().file("keys");
    std::ofstream(keys) << "# keys\nsk-tandem-test-0123456789 alice\n\nsk-tandem-test-abcdefghij\n";
    std::filesystem::permissions(keys, std::filesystem::perms(0600));
    const int port2 = free_port();
    const std::string host2 = "Host: 127.0.0.1:" + std::to_string(port2) + "\r\n";
    daemon_process d;
    d.start(scratch().file("tcp-keys.sock"),
            {"--set", "listen_tcp=127.0.0.1:" + std::to_string(port2), "--set", "api_keys_file=" + keys,
             "--set", "tcp_allowed_origins=http://app.example"});
    REQUIRE(d.wait_ready());
    http_response r = tcp_get(port2, host2);
    CHECK(r.status == 401);
    CHECK(r.j()["error"]["code"] == "invalid_api_key");
    CHECK(tcp_get(port2, host2 + "Authorization: Bearer sk-tandem-test-0123456788\r\n").status == 401);
    CHECK(tcp_get(port2, host2 + "Authorization: Bearer sk-tandem-test-0123456789\r\n").status == 200);
    CHECK(tcp_get(port2, host2 + "x-api-key: sk-tandem-test-abcdefghij\r\n").status == 200);
    CHECK(tcp_get(port2, host2 + "Authorization: Bearer sk-tandem-test-0123456789\r\nOrigin: http://evil.example\r\n")
              .status == 403);
    CHECK(tcp_get(port2, host2 + "Authorization: Bearer sk-tandem-test-0123456789\r\nOrigin: http://app.example\r\n")
              .status == 200);
    CHECK(request(d.sock, "GET", "/health").status == 200);
}

namespace {

// The daemon's peak resident memory so far (VmHWM), in KiB.
long peak_rss_kib(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string l; std::getline(in, l);)
        if (l.rfind("VmHWM:", 0) == 0) return std::stol(l.substr(6));
    return -1;
}

} // namespace

TEST_CASE("tandemd: requests that would amplify work or memory are refused by their limits, quickly") {
    daemon_process d;
    d.start(scratch().file("amplify.sock"), {"--set", "max_body_bytes=4194304", "--set", "max_embedding_floats=100000"});
    REQUIRE(d.wait_ready());
    const long rss_before = peak_rss_kib(d.pid);
    const auto timed = [&](const std::string& route, const std::string& body) {
        const auto t0 = std::chrono::steady_clock::now();
        http_response r = request(d.sock, "POST", route, body);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(s < 10);
        return r;
    };
    // 1 MiB of documents without a space: over max_document_bytes (512 KiB).
    const std::string words(1 << 20, 'x');
    json chat = {{"messages", {{{"role", "user"}, {"content", "what?"}}}}, {"max_tokens", 2},
                 {"documents", {{{"text", words}}}}};
    http_response r = timed("/v1/chat/completions", chat.dump());
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["code"] == "documents_too_large");
    // Under it, but splitting into more passages than max_passages: refused before any is embedded.
    chat["documents"][0]["text"] = std::string(500 << 10, 'x');
    r = timed("/v1/chat/completions", chat.dump());
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["code"] == "too_many_passages");
    // 2,048 one-token inputs: more numbers than max_embedding_floats in one reply.
    json embed = {{"input", json::array()}};
    for (int i = 0; i < 2048; ++i) embed["input"].push_back("a");
    r = timed("/v1/embeddings", embed.dump());
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["param"] == "input");
    // A stop string over max_stop_bytes.
    r = timed("/v1/completions", json{{"prompt", "x"}, {"stop", std::string(2000, 'y')}}.dump());
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["param"] == "stop");
    const long rss_after = peak_rss_kib(d.pid);
    INFO("peak RSS ", rss_before, " KiB before, ", rss_after, " KiB after");
    CHECK(rss_after - rss_before < 200 * 1024); // bodies of 1 MiB: never hundreds of MiB more
    check_alive(d);
}
