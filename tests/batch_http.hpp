// Batch jobs over HTTP for the suites: raw requests with a content type, multipart uploads,
// creating and polling batches, reading result files back.
#pragma once

#include "daemon_client.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tandem::test {

// A raw request with its own content type, on a fresh connection.
inline http_response raw_request(const std::string& sock, const std::string& method, const std::string& target,
                                const std::string& content_type, const std::string& body) {
    const int fd = connect_unix(sock);
    if (fd < 0) return {};
    send_all(fd, method + " " + target + " HTTP/1.1\r\nHost: tandem\r\nContent-Type: " + content_type +
                           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    const std::string raw = read_until_eof(fd);
    ::close(fd);
    return parse_response(raw);
}

inline const std::string boundary = "----tandem-test-7f3a";

inline std::string form_body(const std::vector<std::pair<std::string, std::string>>& fields, const std::string& file) {
    std::string b;
    for (const auto& [name, value] : fields)
        b += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n";
    if (!file.empty() || fields.empty())
        b += "--" + boundary +
             "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: "
             "application/jsonl\r\n\r\n" +
             file + "\r\n";
    return b + "--" + boundary + "--\r\n";
}

inline http_response upload(const std::string& sock, const std::string& content, const std::string& purpose = "batch") {
    return raw_request(sock, "POST", "/v1/files", "multipart/form-data; boundary=" + boundary,
                       form_body({{"purpose", purpose}}, content));
}

inline json body_of(const http_response& r) {
    INFO(r.body);
    return json::parse(r.body);
}

inline json create_batch(const std::string& sock, const std::string& file_id, const std::string& endpoint = "/v1/completions") {
    const auto r = post(sock, "/v1/batches",
                              {{"input_file_id", file_id}, {"endpoint", endpoint}, {"completion_window", "24h"}});
    INFO(r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body);
}

// Polls the batch until `done` holds for it (or a minute passes); returns its last state.
template <class Pred>
inline json poll_batch(const std::string& sock, const std::string& id, Pred done) {
    json b;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
        const auto r = request(sock, "GET", "/v1/batches/" + id);
        if (r.status == 200) {
            b = json::parse(r.body);
            if (done(b)) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return b;
}

inline bool ended(const json& b) {
    const std::string s = b.value("status", "");
    return s == "completed" || s == "failed" || s == "cancelled" || s == "expired";
}

// The lines of a file the daemon keeps, or none when `id` is null.
inline std::vector<json> file_lines(const std::string& sock, const json& id) {
    std::vector<json> out;
    if (!id.is_string()) return out;
    const auto r = request(sock, "GET", "/v1/files/" + id.get<std::string>() + "/content");
    REQUIRE(r.status == 200);
    std::istringstream in(r.body);
    for (std::string l; std::getline(in, l);) out.push_back(json::parse(l));
    return out;
}

} // namespace tandem::test
