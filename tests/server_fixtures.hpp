// What the tandemd end-to-end suites share (test_server_api, test_server_grounding,
// test_server_lifecycle): a scratch directory, one daemon shared by the tests that do not stop
// it, and the offline loop's outputs the daemon must reproduce.
#pragma once

#include "cpu/thread_pool.hpp"
#include "daemon_client.hpp"
#include "offline_reference.hpp"
#include "runtime/citations.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <mutex>
#include <filesystem>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>

namespace tandem::test {

inline scratch_dir& scratch() {
    static scratch_dir d("server");
    return d;
}

// One daemon shared by the tests that do not stop it: short read timeout, small body limit.
inline const std::string& shared_socket() {
    static daemon_process d;
    static const bool started = [] {
        d.start(scratch().file("shared.sock"),
                {"--set", "request_timeout_s=1", "--set", "max_body_bytes=65536", "--set", "max_running=16"});
        return d.wait_ready();
    }();
    REQUIRE(started);
    return d.sock;
}

// The offline loop's greedy text for a completions prompt: what the daemon must reproduce.
inline std::string offline_text(const std::string& prompt, int n, bool ignore_eos = false) {
    return offline_run(prompt, n, ignore_eos).text;
}

// The in-process engine's embedding of a text (the model's pooling): what the daemon must return.
inline std::vector<float> offline_embedding(const std::string& text) {
    static model_bundle b = load_model(model_path("stories260K.gguf"));
    auto eng = make_local_engine(*b.mdl, *b.tok, engine_options{});
    engine_request r;
    r.prompt = b.tok->encode(text, true, false);
    r.embed = b.cfg.pooling;
    std::vector<float> out;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    REQUIRE(eng->submit(std::move(r), [&](engine_event&& ev) {
                    if (!ev.done) return;
                    std::lock_guard lock(mu);
                    out = std::move(ev.embedding);
                    done = true;
                    cv.notify_all();
                }).status == submit_status::ok);
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
    return out;
}

inline double max_diff(const json& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    double d = 0;
    for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::abs(got[i].get<double>() - double(want[i])));
    return d;
}

// t[a:b] in code points (as citations count), a <= b checked.
inline std::string slice(const std::string& t, int64_t a, int64_t b) {
    std::vector<size_t> at; // each code point's first byte
    for (size_t i = 0; i < t.size(); ++i)
        if ((uint8_t(t[i]) & 0xC0) != 0x80) at.push_back(i);
    at.push_back(t.size());
    REQUIRE(a >= 0);
    REQUIRE(a <= b);
    REQUIRE(size_t(b) < at.size());
    return t.substr(at[size_t(a)], at[size_t(b)] - at[size_t(a)]);
}

// Text as citations match it (runtime/citations.hpp normalized_text).
inline std::string norm(const std::string& t) {
    normalized_text n;
    n.append(t);
    n.flush();
    return n.text;
}

inline std::string stream_text(const std::vector<json>& events, bool chat, int index = 0);

// A completions stream of "Once upon a time" read to its end from fd (then closed): whole,
// [DONE] included, choice `index` the offline loop's n_tokens.
inline void check_whole_stream(int fd, int index, int n_tokens) {
    const auto r = parse_response(read_until_eof(fd));
    ::close(fd);
    REQUIRE(r.status == 200);
    bool done = false, ok = false;
    const auto ev = sse_events(r.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    CHECK(stream_text(ev, false, index) == offline_text("Once upon a time", n_tokens, true));
}

inline std::string stream_text(const std::vector<json>& events, bool chat, int index) {
    std::string s;
    for (const auto& e : events)
        for (const auto& c : e["choices"])
            if (c["index"] == index) {
                if (chat && c["delta"].contains("content")) s += c["delta"]["content"].get<std::string>();
                if (!chat) s += c["text"].get<std::string>();
            }
    return s;
}


} // namespace tandem::test
