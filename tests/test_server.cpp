// tandemd end to end: the real daemon on a scratch socket with stories260K, driven over HTTP.
#include "cpu/thread_pool.hpp"
#include "daemon_client.hpp"
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

using namespace tandem;
using namespace tandem::test;

namespace {

scratch_dir& scratch() {
    static scratch_dir d("server");
    return d;
}

// One daemon shared by the tests that do not stop it: short read timeout, small body limit.
const std::string& shared_socket() {
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
std::string offline_text(const std::string& prompt, int n, bool ignore_eos = false) {
    static model_bundle b = load_model(model_path("stories260K.gguf"));
    static cpu::thread_pool pool(1);
    generate_params p;
    p.n_predict = n;
    p.sampling.temperature = 0;
    p.ignore_eos = ignore_eos;
    return generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, b.tok->encode(prompt, true, false), p).text;
}

// The in-process engine's embedding of a text (the model's pooling): what the daemon must return.
std::vector<float> offline_embedding(const std::string& text) {
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

double max_diff(const json& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    double d = 0;
    for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::abs(got[i].get<double>() - double(want[i])));
    return d;
}

// t[a:b] in code points (as citations count), a <= b checked.
std::string slice(const std::string& t, int64_t a, int64_t b) {
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
std::string norm(const std::string& t) {
    normalized_text n;
    n.append(t);
    n.flush();
    return n.text;
}

std::string stream_text(const std::vector<json>& events, bool chat, int index = 0);

// A completions stream of "Once upon a time" read to its end from fd (then closed): whole,
// [DONE] included, choice `index` the offline loop's n_tokens.
void check_whole_stream(int fd, int index, int n_tokens) {
    const auto r = parse_response(read_until_eof(fd));
    ::close(fd);
    REQUIRE(r.status == 200);
    bool done = false, ok = false;
    const auto ev = sse_events(r.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    CHECK(stream_text(ev, false, index) == offline_text("Once upon a time", n_tokens, true));
}

std::string stream_text(const std::vector<json>& events, bool chat, int index) {
    std::string s;
    for (const auto& e : events)
        for (const auto& c : e["choices"])
            if (c["index"] == index) {
                if (chat && c["delta"].contains("content")) s += c["delta"]["content"].get<std::string>();
                if (!chat) s += c["text"].get<std::string>();
            }
    return s;
}

} // namespace

TEST_CASE("health, models, metrics, status") {
    const auto& s = shared_socket();
    auto h = request(s, "GET", "/health");
    CHECK(h.status == 200);
    CHECK(h.j()["status"] == "ok");
    auto m = request(s, "GET", "/v1/models");
    REQUIRE(m.status == 200);
    CHECK(m.j()["data"][0]["id"] == "stories260K");
    CHECK(request(s, "GET", "/v1/models/stories260K").status == 200);
    CHECK(request(s, "GET", "/v1/models/other").status == 404);
    auto st = request(s, "GET", "/v1/tandem/status");
    REQUIRE(st.status == 200);
    CHECK(st.j()["status"] == "ready");
    CHECK(st.j()["kv_pages_total"].get<int>() > 0);
    for (const char* k : {"kv_tokens_stored", "kv_pages_cached", "kv_pages_peak", "prefix_cache_hit_tokens", "preemptions",
                          "worker_restarts", "kv_device_upload_bytes", "kv_device_kept_bytes"})
        CHECK_MESSAGE((st.j().contains(k) && st.j()[k].is_number_integer() && st.j()[k].get<int64_t>() >= 0), k);
    auto met = request(s, "GET", "/metrics");
    REQUIRE(met.status == 200);
    CHECK(met.headers["content-type"].find("text/plain") == 0);
    for (const char* name : {"tandem_requests_running", "tandem_requests_waiting", "tandem_kv_pages_used", "tandem_kv_pages_peak",
                             "tandem_kv_pages_total", "tandem_prefix_cache_hits_total", "tandem_prompt_tokens_total",
                             "tandem_generation_tokens_total", "tandem_time_to_first_token_seconds_count",
                             "tandem_inter_token_latency_seconds_count", "tandem_queue_time_seconds_count",
                             "tandem_kv_tokens_stored", "tandem_kv_pages_cached", "tandem_preemptions_total",
                             "tandem_worker_restarts_total", "tandem_kv_device_upload_bytes_total",
                             "tandem_kv_device_kept_bytes_total", "tandem_speculative_draft_tokens_total",
                             "tandem_speculative_accepted_tokens_total"})
        CHECK_MESSAGE(metric(met.body, name) >= 0, name);
    CHECK(metric(met.body, "tandem_prefix_cache_hits_total") == 0);
}

TEST_CASE("completions at temperature 0 equal the offline loop; usage counts tokens") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions", {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 40},
                                         {"temperature", 0}});
    REQUIRE(r.status == 200);
    const json j = r.j();
    CHECK(j["object"] == "text_completion");
    CHECK(j["choices"][0]["text"] == offline_text("Once upon a time", 40));
    CHECK(j["choices"][0]["finish_reason"] == "length");
    CHECK(j["usage"]["completion_tokens"] == 40);
    CHECK(j["usage"]["prompt_tokens"].get<int>() > 0);
    CHECK(j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"].get<int>() + 40);

    // stop strings cut the text; n gives several choices
    auto st = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0},
                                          {"stop", "Lily"}, {"n", 2}});
    REQUIRE(st.status == 200);
    const std::string full = offline_text("Once upon a time", 40);
    REQUIRE(full.find("Lily") != std::string::npos);
    CHECK(st.j()["choices"].size() == 2);
    CHECK(st.j()["choices"][0]["text"] == full.substr(0, full.find("Lily")));
    CHECK(st.j()["choices"][1]["text"] == full.substr(0, full.find("Lily")));
    CHECK(st.j()["choices"][0]["finish_reason"] == "stop");

    // This daemon has speculative decoding off (draft_tokens 0): asking for it is a 400 that says
    // so; "off" is what it does anyway.
    auto spec = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"speculative", {{"method", "ngram"}}}});
    CHECK(spec.status == 400);
    CHECK(spec.body.find("draft_tokens") != std::string::npos);
    CHECK(post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"speculative", {{"method", "off"}}}})
              .status == 200);
}

TEST_CASE("a field the daemon does not honour is a 400 that names it") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"unknown_field", {1, 2}}});
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["param"] == "unknown_field");
    auto c = post(s, "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"echo", true}});
    CHECK(c.status == 400); // a completions field, not a chat one
    CHECK(c.j()["error"]["param"] == "echo");
    // inside an object too (found by scripts/soak.sh: stream_options' other keys were ignored)
    auto so = post(s, "/v1/completions",
                   {{"prompt", "Once"}, {"max_tokens", 2}, {"stream", true},
                    {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
    CHECK(so.status == 400);
    CHECK(so.j()["error"]["param"] == "stream_options.continuous_usage_stats");
    CHECK(so.j()["error"]["message"].get<std::string>().find("(include_usage)") != std::string::npos);
}

TEST_CASE("a key the daemon does not honour inside a message, part, tool call or tool choice is a 400 naming its path") {
    const auto& s = shared_socket();
    const json user = {{"role", "user"}, {"content", "hi"}};
    const json call = {{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
    const json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
    const auto answer = [&](const std::string& route, json body) {
        if (route == "/v1/chat/completions") body["max_tokens"] = 2;
        return post(s, route, body);
    };
    const auto refused = [&](const std::string& route, const json& body, const std::string& param) {
        auto r = answer(route, body);
        CAPTURE(body.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
        CHECK(r.j()["error"]["message"].get<std::string>().find("'" + param + "' is not supported (") != std::string::npos);
    };
    const std::string chat = "/v1/chat/completions";
    refused(chat, {{"messages", {{{"role", "user"}, {"content", "hi"}, {"name", "ann"}}}}}, "messages[0].name");
    refused(chat, {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}, {"cache_control", {{"type", "x"}}}}}}}}}},
            "messages[0].content[0].cache_control");
    refused(chat, {{"messages", {user, {{"role", "assistant"}, {"content", "x"}, {"refusal", "no"}}}}}, "messages[1].refusal");
    json extra_call = call;
    extra_call["function"]["strict"] = true;
    refused(chat, {{"messages", {user, {{"role", "assistant"}, {"tool_calls", {extra_call}}}}}},
            "messages[1].tool_calls[0].function.strict");
    refused(chat, {{"messages", {user, {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "x"}, {"name", "f"}}}}},
            "messages[1].name");
    refused(chat, {{"messages", {user}}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}, {"strict", true}}}}}},
            "tool_choice.function.strict");
    refused(chat, {{"messages", {user}}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"returns", 1}}}}}}},
            "tools[0].function.returns");
    refused("/tokenize", {{"content", "hi"}, {"with_pieces", true}}, "with_pieces");
    refused("/detokenize", {{"tokens", {1}}, {"special", true}}, "special");
    refused("/v1/tandem/apply-template", {{"messages", {user}}, {"parallel_tool_calls", false}}, "parallel_tool_calls");
    // An assistant reply echoed back whole passes: its empty OpenAI fields, Tandem's citations,
    // and the index a streamed tool call carries.
    json echoed_call = call;
    echoed_call["index"] = 0;
    const json history = {user,
                          {{"role", "assistant"}, {"content", "x"}, {"refusal", nullptr}, {"annotations", json::array()},
                           {"audio", nullptr}, {"citations", json::array()}},
                          {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {echoed_call}}},
                          {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "ok"}}, user};
    CHECK(answer(chat, {{"messages", history}}).status == 200);
    CHECK(answer("/tokenize", {{"text", "hi"}}).status == 200);
    CHECK(answer("/tokenize", {{"text", "hi"}, {"content", "hi"}}).status == 400);
}

TEST_CASE("embeddings: OpenAI's shape, the engine's unit vectors, a list equal to its items alone; base64; errors name what") {
    const auto& s = shared_socket();
    const std::string a = "Once upon a time, there was a little girl named Lily.", b = "The dog ran to the park.";
    auto one = post(s, "/v1/embeddings", {{"model", "stories260K"}, {"input", a}});
    REQUIRE(one.status == 200);
    const json j = one.j();
    CHECK(j["object"] == "list");
    CHECK(j["model"] == "stories260K");
    REQUIRE(j["data"].size() == 1);
    CHECK(j["data"][0]["object"] == "embedding");
    CHECK(j["data"][0]["index"] == 0);
    const json& va = j["data"][0]["embedding"];
    REQUIRE(va.size() == 64); // stories260K's n_embd
    double norm = 0;
    for (const auto& x : va) norm += x.get<double>() * x.get<double>();
    CHECK(std::abs(norm - 1) < 1e-5);
    CHECK(max_diff(va, offline_embedding(a)) < 1e-5);
    const int n_a = int(request(s, "POST", "/tokenize", json{{"content", a}}.dump()).j()["count"].get<int>());
    CHECK(j["usage"]["prompt_tokens"] == n_a);
    CHECK(j["usage"]["total_tokens"] == n_a);

    // a list: one vector each, in order, as each alone; token ids embed as their text does
    const auto ids = request(s, "POST", "/tokenize", json{{"content", b}}.dump()).j()["tokens"];
    auto list = post(s, "/v1/embeddings", {{"input", json::array({b, a})}});
    REQUIRE(list.status == 200);
    REQUIRE(list.j()["data"].size() == 2);
    CHECK(list.j()["data"][1]["index"] == 1);
    CHECK(max_diff(list.j()["data"][1]["embedding"], offline_embedding(a)) < 1e-5);
    CHECK(max_diff(list.j()["data"][0]["embedding"], offline_embedding(b)) < 1e-5);
    CHECK(max_diff(list.j()["data"][0]["embedding"], offline_embedding(a)) > 1e-2);
    auto tok = post(s, "/v1/embeddings", {{"input", json::array({ids})}});
    REQUIRE(tok.status == 200);
    CHECK(max_diff(tok.j()["data"][0]["embedding"], offline_embedding(b)) < 1e-5);

    // more inputs than the engine queues at once (max_waiting 64 + 16 running): fed a window at a time
    json many = json::array();
    for (int i = 0; i < 300; ++i) many.push_back(i % 2 ? a : b);
    auto lots = post(s, "/v1/embeddings", {{"input", many}});
    REQUIRE(lots.status == 200);
    REQUIRE(lots.j()["data"].size() == 300);
    CHECK(lots.j()["data"][299]["index"] == 299);
    CHECK(max_diff(lots.j()["data"][299]["embedding"], offline_embedding(a)) < 1e-5);
    CHECK(max_diff(lots.j()["data"][200]["embedding"], offline_embedding(b)) < 1e-5);

    // base64: the float32 array's little-endian bytes
    auto b64 = post(s, "/v1/embeddings", {{"input", a}, {"encoding_format", "base64"}});
    REQUIRE(b64.status == 200);
    const std::string enc = b64.j()["data"][0]["embedding"].get<std::string>();
    REQUIRE(enc.size() == 344); // ceil(256 / 3) * 4
    std::vector<uint8_t> bytes;
    const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i + 3 < enc.size(); i += 4) {
        uint32_t n = 0;
        int pad = 0;
        for (size_t k = 0; k < 4; ++k) {
            const char ch = enc[i + k];
            pad += ch == '=';
            n = n << 6 | uint32_t(ch == '=' ? 0 : digits.find(ch));
        }
        for (int k = 0; k < 3 - pad; ++k) bytes.push_back(uint8_t(n >> (16 - 8 * k)));
    }
    REQUIRE(bytes.size() == 256);
    std::vector<float> floats(64);
    std::memcpy(floats.data(), bytes.data(), bytes.size());
    CHECK(max_diff(va, floats) == 0.0);

    // what it does not do is a 400 that names it
    const std::pair<json, std::string> bad_requests[] = {
        {{{"input", a}, {"dimensions", 32}}, "dimensions"},
        {{{"input", a}, {"encoding_format", "int8"}}, "encoding_format"},
        {{{"input", ""}}, "input"},
        {{{"input", json::array({a, ""})}}, "input"},
        {{{"input", json::array()}}, "input"},
        {{{"input", 5}}, "input"},
        {{{"input", a}, {"truncate", true}}, "truncate"},
        {json::object(), "input"},
    };
    for (const auto& req : bad_requests) {
        auto r = post(s, "/v1/embeddings", req.first);
        CAPTURE(req.first.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == req.second);
    }
    CHECK(post(s, "/v1/embeddings", {{"input", a}, {"dimensions", 64}}).status == 200);
    std::string long_text;
    for (int i = 0; i < 800; ++i) long_text += "Lily saw a dog. ";
    auto too_long = post(s, "/v1/embeddings", {{"input", long_text}});
    CHECK(too_long.status == 400);
    CHECK(too_long.j()["error"]["code"] == "context_length_exceeded");
    CHECK(post(s, "/v1/embeddings", {{"input", a}, {"model", "other"}}).status == 404);
    CHECK(request(s, "GET", "/v1/embeddings").status == 405);

    // tandem embed: one vector a line, from the daemon or offline (-m), the same as the API's
    for (const bool offline : {false, true}) {
        CAPTURE(offline);
        std::vector<std::string> args{"embed", b, a};
        if (offline) args.insert(args.end(), {"-m", model_path("stories260K.gguf"), "-t", "1"});
        else args.insert(args.end(), {"--socket", s});
        const auto r = run_tandem(args);
        INFO(r.err);
        REQUIRE(r.rc == 0);
        std::istringstream lines(r.out);
        std::vector<json> got;
        for (std::string line; std::getline(lines, line);) got.push_back(json::parse(line));
        REQUIRE(got.size() == 2);
        CHECK(max_diff(got[0], offline_embedding(b)) < 1e-5);
        CHECK(max_diff(got[1], offline_embedding(a)) < 1e-5);
    }
    const auto piped = run_tandem({"embed", "--json", "--socket", s}, a + "\n\n" + b + "\n"); // stdin: a text a line
    REQUIRE(piped.rc == 0);
    const json pj = json::parse(piped.out);
    REQUIRE(pj["data"].size() == 2);
    CHECK(max_diff(pj["data"][1]["embedding"], offline_embedding(b)) < 1e-5);
    CHECK(run_tandem({"embed", "--socket", s}, "").rc == 2);           // no text
    CHECK(run_tandem({"embed", "--socket", s, long_text}).rc == 4);    // the daemon's 400
}

TEST_CASE("embeddings: a model whose hidden states are wider than its vocabulary has none: a 400 that says so") {
    const std::string path = scratch().file("wide.gguf");
    const auto syn = run_tandem({"synth", "-o", path, "--dim", "512", "--vocab", "300", "--heads", "8", "--layers", "1",
                                 "--ff", "64", "--ctx", "256"});
    INFO(syn.err);
    REQUIRE(syn.rc == 0);
    daemon_process d;
    d.sock = scratch().file("wide.sock");
    d.spawn({"--model", path, "--socket", d.sock, "--threads", "1", "--log", "warn", "--set", "kv_pool=" + d.sock + ".kv"});
    REQUIRE(d.wait_ready());
    auto r = post(d.sock, "/v1/embeddings", {{"input", "hello"}});
    CHECK(r.status == 400);
    CHECK(r.j()["error"]["code"] == "embeddings_unavailable");
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 2}}).status == 200); // it still generates
    CHECK(d.stop() == 0);
}

TEST_CASE("guided generation: response_format, structured_outputs, llama.cpp's fields; errors name what") {
    const auto& s = shared_socket();
    const json schema = {{"type", "object"},
                         {"properties", {{"name", {{"type", "string"}, {"maxLength", 10}}},
                                         {"n", {{"type", "integer"}, {"minimum", 1}, {"maximum", 9}}}}},
                         {"required", {"name", "n"}}};
    const json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}, {"strict", true}}}};
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        auto r = post(s, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "Give me a record"}}}}, {"max_tokens", 200},
                       {"temperature", 1}, {"seed", seed}, {"response_format", rf}});
        REQUIRE(r.status == 200);
        const json out = json::parse(r.j()["choices"][0]["message"]["content"].get<std::string>());
        CHECK(out["name"].is_string());
        CHECK(out["name"].get<std::string>().size() <= 40); // 10 code points, at most 4 bytes each
        CHECK(out["n"].get<int>() >= 1);
        CHECK(out["n"].get<int>() <= 9);
        CHECK(r.j()["choices"][0]["finish_reason"] == "stop");
    }
    // Streamed: the deltas add up to the same kind of object.
    auto st = post(s, "/v1/completions",
                   {{"prompt", "Once"}, {"max_tokens", 100}, {"seed", 3}, {"stream", true},
                    {"structured_outputs", {{"choice", {"yes", "no", "maybe"}}}}});
    REQUIRE(st.status == 200);
    const std::string text = stream_text(sse_events(st.body), false);
    CHECK((text == "yes" || text == "no" || text == "maybe"));
    auto rx = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 30}, {"seed", 2}, {"grammar", "root ::= [0-9]{2} \"-\" [a-z]{3}"}});
    REQUIRE(rx.status == 200);
    const std::string g = rx.j()["choices"][0]["text"];
    CHECK(g.size() == 6);
    CHECK(g[2] == '-');
    auto obj = post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 200}, {"seed", 5},
                                           {"response_format", {{"type", "json_object"}}}});
    REQUIRE(obj.status == 200);
    if (obj.j()["choices"][0]["finish_reason"] == "stop")
        CHECK(json::parse(obj.j()["choices"][0]["text"].get<std::string>()).is_object());

    const auto refused = [&](const json& body, const std::string& param, const std::string& says) {
        json b = body;
        b["prompt"] = "Once";
        auto r = post(s, "/v1/completions", b);
        CAPTURE(body.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
        CHECK(r.j()["error"]["message"].get<std::string>().find(says) != std::string::npos);
    };
    refused({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}},
            "response_format", "uniqueItems");
    refused({{"response_format", {{"type", "json_object"}}}, {"grammar", "root ::= \"x\""}}, "grammar", "one output constraint");
    refused({{"structured_outputs", {{"regex", "(a)\\1"}}}}, "structured_outputs.regex", "backreference");
    refused({{"structured_outputs", {{"structural_tag", "x"}}}}, "structured_outputs.structural_tag", "not supported");
    refused({{"response_format", {{"type", "xml"}}}}, "response_format.type", "xml");
    refused({{"json_schema", "not a schema"}}, "json_schema", "JSON Schema");
}

namespace {

// A streamed reply's tool calls put together as a client does: by index, the id, type and
// name from the first delta, the arguments concatenated.
json streamed_calls(const std::vector<json>& events) {
    json calls = json::array();
    for (const auto& e : events)
        for (const auto& c : e["choices"])
            for (const auto& d : c["delta"].value("tool_calls", json::array())) {
                const size_t i = d["index"].get<size_t>();
                if (i == calls.size()) {
                    REQUIRE(d.contains("id"));
                    calls.push_back({{"id", d["id"]}, {"type", d["type"]},
                                     {"function", {{"name", d["function"]["name"]}, {"arguments", ""}}}});
                }
                REQUIRE(i < calls.size());
                if (d["function"].contains("arguments"))
                    calls[i]["function"]["arguments"] =
                        calls[i]["function"]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
            }
    return calls;
}

} // namespace

TEST_CASE("tool calling: tool_calls in the reply and streamed as deltas; histories with calls; errors name what") {
    const auto& s = shared_socket();
    const json tools = json::array(
        {{{"type", "function"},
          {"function", {{"name", "get_weather"}, {"description", "Weather now"},
                        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                                        {"required", {"city"}}}}}}},
         {{"type", "function"}, {"function", {{"name", "get_time"}}}}});
    const json ask = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
    int n_called = 0;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        json body = {{"messages", ask}, {"tools", tools}, {"tool_choice", "required"}, {"parallel_tool_calls", false},
                     {"max_tokens", 120}, {"temperature", 1}, {"seed", seed}};
        auto r = post(s, "/v1/chat/completions", body);
        REQUIRE(r.status == 200);
        const json choice = r.j()["choices"][0];
        CAPTURE(choice.dump());
        if (choice["finish_reason"] != "tool_calls") {
            CHECK(choice["finish_reason"] == "length");
            continue;
        }
        ++n_called;
        CHECK(choice["message"]["content"].is_null());
        const json calls = choice["message"]["tool_calls"];
        REQUIRE(calls.size() == 1);
        CHECK(calls[0]["id"].get<std::string>().starts_with("call_"));
        CHECK(calls[0]["type"] == "function");
        const std::string name = calls[0]["function"]["name"];
        CHECK((name == "get_weather" || name == "get_time"));
        const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>());
        REQUIRE(args.is_object());
        if (name == "get_weather") CHECK(args["city"].is_string());

        // Streamed with the same seed: the deltas add up to the same call.
        body["stream"] = true;
        auto st = post(s, "/v1/chat/completions", body);
        REQUIRE(st.status == 200);
        const auto events = sse_events(st.body);
        const json got = streamed_calls(events);
        REQUIRE(got.size() == 1);
        CHECK(got[0]["function"] == calls[0]["function"]);
        CHECK(events.back()["choices"][0]["finish_reason"] == "tool_calls");
    }
    CHECK(n_called >= 1);

    // A named function; a history with a call and its result; auto.
    auto named = post(s, "/v1/chat/completions",
                      {{"messages", ask}, {"tools", tools}, {"max_tokens", 120}, {"seed", 4},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}});
    REQUIRE(named.status == 200);
    if (named.j()["choices"][0]["finish_reason"] == "tool_calls")
        CHECK(named.j()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time");
    json history = ask;
    history.push_back({{"role", "assistant"}, {"content", nullptr},
                       {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                        {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}});
    history.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}});
    auto followed = post(s, "/v1/chat/completions", {{"messages", history}, {"tools", tools}, {"max_tokens", 8}});
    CHECK(followed.status == 200);
    auto shown = post(s, "/v1/tandem/apply-template", {{"messages", history}, {"tools", tools}});
    REQUIRE(shown.status == 200);
    CHECK(shown.j()["prompt"].get<std::string>().find("<tool_response>\n18 C\n</tool_response>") != std::string::npos);

    const auto refused = [&](json body, const std::string& param, const std::string& says) {
        if (!body.contains("messages")) body["messages"] = ask;
        auto r = post(s, "/v1/chat/completions", body);
        CAPTURE(body.dump());
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == param);
        CHECK(r.j()["error"]["message"].get<std::string>().find(says) != std::string::npos);
    };
    refused({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "tool_choice", "nope");
    refused({{"tool_choice", "required"}}, "tool_choice", "needs 'tools'");
    refused({{"tools", tools}, {"tool_choice", "sometimes"}}, "tool_choice", "sometimes");
    refused({{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}}, "tools[0].function.name", "a-z");
    refused({{"tools", {tools[1], tools[1]}}}, "tools[1].function.name", "get_time");
    refused({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"returns", 1}}}}}}}, "tools[0].function.returns", "returns");
    refused({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "array"}}}}}}}}},
            "tools", "object");
    refused({{"tools", tools}, {"response_format", {{"type", "json_object"}}}}, "response_format", "'tools'");
    refused({{"messages", {ask[0], {{"role", "tool"}, {"content", "x"}}}}}, "messages[1].tool_call_id", "tool_call_id");
    refused({{"functions", {{{"name", "f"}}}}}, "functions", "use 'tools'");
    auto completions = post(s, "/v1/completions", {{"prompt", "Once"}, {"tools", tools}});
    CHECK(completions.status == 400);
    CHECK(completions.j()["error"]["param"] == "tools");
}

TEST_CASE("seeded sampling is reproducible; choice i of n uses seed + i") {
    const auto& s = shared_socket();
    const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0.9}, {"top_k", 40}};
    json a = base, b = base, two = base;
    a["seed"] = 42;
    b["seed"] = 43;
    two["seed"] = 42;
    two["n"] = 2;
    const auto ra = post(s, "/v1/completions", a), ra2 = post(s, "/v1/completions", a);
    const auto rb = post(s, "/v1/completions", b), rtwo = post(s, "/v1/completions", two);
    REQUIRE(ra.status == 200);
    REQUIRE(rtwo.status == 200);
    CHECK(ra.j()["choices"][0]["text"] == ra2.j()["choices"][0]["text"]);
    CHECK(rtwo.j()["choices"][0]["text"] == ra.j()["choices"][0]["text"]);
    CHECK(rtwo.j()["choices"][1]["text"] == rb.j()["choices"][0]["text"]);
}

TEST_CASE("chat completions render the template; tokenize, detokenize, apply-template") {
    const auto& s = shared_socket();
    const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                       {{"role", "user"}, {"content", "Tell me about a cat."}}});
    auto t = post(s, "/v1/tandem/apply-template", {{"messages", messages}});
    REQUIRE(t.status == 200);
    CHECK(t.j()["prompt"].get<std::string>().find("Tell me about a cat.") != std::string::npos);
    const json ids = t.j()["tokens"];

    auto chat = post(s, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 30}, {"temperature", 0}});
    REQUIRE(chat.status == 200);
    const json cj = chat.j();
    CHECK(cj["object"] == "chat.completion");
    CHECK(cj["choices"][0]["message"]["role"] == "assistant");
    CHECK_FALSE(cj["choices"][0].contains("text")); // a completions field, not a chat one
    CHECK(cj["usage"]["prompt_tokens"] == ids.size());
    // the same tokens as a completions prompt give the same text (plain template: no stop hit)
    auto comp = post(s, "/v1/completions", {{"prompt", ids}, {"max_tokens", 30}, {"temperature", 0},
                                            {"stop", t.j()["stop"]}});
    REQUIRE(comp.status == 200);
    CHECK(comp.j()["choices"][0]["text"] == cj["choices"][0]["message"]["content"]);

    auto tok = post(s, "/tokenize", {{"content", "Once upon a time"}});
    REQUIRE(tok.status == 200);
    auto de = post(s, "/detokenize", {{"tokens", tok.j()["tokens"]}});
    REQUIRE(de.status == 200);
    CHECK(de.j()["content"] == "Once upon a time");
}

TEST_CASE("streaming: SSE chunks then [DONE], same text as the plain reply, usage when asked") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0},
                                         {"stream", true}, {"stream_options", {{"include_usage", true}}}});
    REQUIRE(r.status == 200);
    CHECK(r.headers["content-type"] == "text/event-stream");
    bool done = false, ok = false;
    auto ev = sse_events(r.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    REQUIRE(ev.size() >= 3);
    CHECK(stream_text(ev, false) == offline_text("Once upon a time", 30));
    CHECK(ev.back()["choices"].empty());
    CHECK(ev.back()["usage"]["completion_tokens"] == 30);
    CHECK(ev[ev.size() - 2]["choices"][0]["finish_reason"] == "length");
    for (size_t i = 0; i + 2 < ev.size(); ++i) CHECK(ev[i]["choices"][0]["finish_reason"].is_null());

    auto c = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                              {"max_tokens", 20}, {"temperature", 0}, {"stream", true}});
    REQUIRE(c.status == 200);
    auto cev = sse_events(c.body, &done, &ok);
    CHECK(done);
    CHECK(ok);
    REQUIRE(!cev.empty());
    CHECK(cev[0]["object"] == "chat.completion.chunk");
    CHECK(cev[0]["choices"][0]["delta"]["role"] == "assistant");
    auto plain = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                                  {"max_tokens", 20}, {"temperature", 0}});
    CHECK(stream_text(cev, true) == plain.j()["choices"][0]["message"]["content"]);
}

TEST_CASE("logprobs: completions (int) and chat (bool + top_logprobs)") {
    const auto& s = shared_socket();
    auto r = post(s, "/v1/completions",
                  {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 3}});
    REQUIRE(r.status == 200);
    const json lp = r.j()["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"].size() == 10);
    CHECK(lp["token_logprobs"].size() == 10);
    CHECK(lp["text_offset"].size() == 10);
    std::string joined;
    for (size_t i = 0; i < 10; ++i) {
        const double chosen = lp["token_logprobs"][i];
        CHECK(chosen <= 0);
        REQUIRE(lp["top_logprobs"][i].size() == 3);
        double best = -1e30;
        for (const auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
        CHECK(chosen == doctest::Approx(best)); // greedy picks the most likely
        joined += lp["tokens"][i].get<std::string>();
    }
    CHECK(joined == r.j()["choices"][0]["text"]);

    auto c = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                              {"max_tokens", 5}, {"temperature", 0}, {"logprobs", true},
                                              {"top_logprobs", 2}});
    REQUIRE(c.status == 200);
    const json content = c.j()["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == 5);
    CHECK(content[0]["top_logprobs"].size() == 2);
    CHECK(content[0].contains("bytes"));
    CHECK(post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                           {"top_logprobs", 2}})
              .status == 400);
}

TEST_CASE("beam search over the API: best first with scores, as the offline search; streamed at the end; errors say why") {
    const auto& s = shared_socket();
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"use_beam_search", true}, {"n", 2},
                       {"best_of", 4}, {"length_penalty", 0.5}, {"early_stopping", "never"}};
    auto r = post(s, "/v1/completions", body);
    REQUIRE(r.status == 200);
    const json ch = r.j()["choices"];
    REQUIRE(ch.size() == 2);
    // The offline search (the same engine path in-process) with the same width and knobs.
    static model_bundle b = load_model(model_path("stories260K.gguf"));
    cpu::thread_pool pool(1);
    generate_params p;
    p.n_predict = 12;
    p.beam = {4, 0.5f, beam_params::stopping::never};
    p.n_beams = 2;
    const generate_result off =
        generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, b.tok->encode("Once upon a time", true, false), p);
    REQUIRE(off.beams.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
        CAPTURE(k);
        CHECK(ch[k]["index"] == k);
        CHECK(ch[k]["text"] == off.beams[k].text);
        CHECK(ch[k]["score"].get<double>() == doctest::Approx(off.beams[k].score));
        CHECK(ch[k]["cumulative_logprob"].get<double>() == doctest::Approx(off.beams[k].cumulative_logprob));
    }
    CHECK(ch[0]["score"].get<double>() >= ch[1]["score"].get<double>());

    // Streamed: the same choices, sent when the search ends; the last chunk of each has its score.
    json sb = body;
    sb["stream"] = true;
    auto st = post(s, "/v1/completions", sb);
    REQUIRE(st.status == 200);
    bool done = false;
    const auto events = sse_events(st.body, &done);
    CHECK(done);
    int n_scored = 0;
    for (const auto& e : events)
        for (const auto& c : e["choices"]) n_scored += c.contains("score");
    CHECK(n_scored == 2);
    for (int k = 0; k < 2; ++k) CHECK(stream_text(events, false, k) == ch[size_t(k)]["text"]);

    // Chat: the same fields.
    auto c = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}},
                                              {"max_tokens", 8}, {"use_beam_search", true}, {"n", 3}});
    REQUIRE(c.status == 200);
    const json cc = c.j()["choices"];
    REQUIRE(cc.size() == 3);
    for (const auto& x : cc) {
        CHECK(x["message"]["content"].is_string());
        CHECK(x["cumulative_logprob"].get<double>() < 0);
    }

    // Guided beams: each beam's processors fork with it, and banned tokens are never proposed,
    // so every beam is one of the choices (beams are token sequences: two may spell one text).
    const std::vector<std::string> options{"a cat", "a dog", "the sun"};
    auto g = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"use_beam_search", true},
                                         {"n", 3}, {"structured_outputs", {{"choice", options}}}});
    REQUIRE(g.status == 200);
    const json gc = g.j()["choices"];
    REQUIRE(gc.size() == 3);
    for (const auto& x : gc) {
        CHECK(std::find(options.begin(), options.end(), x["text"].get<std::string>()) != options.end());
        CHECK(x["finish_reason"] == "stop");
    }

    // Wrong combinations: a 400 that names the field and says why.
    const auto refused = [&](json extra, const std::string& param, const std::string& says) {
        json q = body;
        for (const auto& [k, v] : extra.items()) q[k] = v;
        auto e = post(s, "/v1/completions", q);
        CAPTURE(extra.dump());
        CHECK(e.status == 400);
        CHECK(e.j()["error"]["param"] == param);
        CHECK(e.j()["error"]["message"].get<std::string>().find(says) != std::string::npos);
    };
    refused({{"temperature", 0.7}}, "temperature", "deterministic");
    refused({{"top_p", 0.9}}, "top_p", "deterministic");
    refused({{"n", 5}}, "best_of", "at least 'n'");
    refused({{"best_of", 9}}, "best_of", "max_n");
    refused({{"early_stopping", "sometimes"}}, "early_stopping", "\"never\"");
    refused({{"use_beam_search", false}}, "length_penalty", "only to beam search");
    CHECK(post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}, {"use_beam_search", true}, {"temperature", 0}})
              .status == 200);
}

TEST_CASE("best_of samples more than it returns; echo returns the prompt, with logprobs the prompt's; max_tokens 0 scores it") {
    const auto& s = shared_socket();
    // best_of 3, n 1: the returned choice is the one of the three (seeds s, s+1, s+2) with the
    // highest mean token logprob; usage counts all three.
    const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"seed", 7}, {"ignore_eos", true}};
    json all = base;
    all["n"] = 3;
    all["logprobs"] = 0;
    auto a = post(s, "/v1/completions", all);
    REQUIRE(a.status == 200);
    const json aj = a.j();
    size_t best = 0;
    double best_mean = -1e30;
    for (size_t k = 0; k < 3; ++k) {
        double sum = 0;
        for (const auto& x : aj["choices"][k]["logprobs"]["token_logprobs"]) sum += x.get<double>();
        if (sum / 10 > best_mean) {
            best_mean = sum / 10;
            best = k;
        }
    }
    CHECK(best != 0); // (seed 7: the first is not the best, so ranking is seen to happen)
    json one = base;
    one["best_of"] = 3;
    auto r = post(s, "/v1/completions", one);
    REQUIRE(r.status == 200);
    REQUIRE(r.j()["choices"].size() == 1);
    CHECK(r.j()["choices"][0]["index"] == 0);
    CHECK(r.j()["choices"][0]["text"] == aj["choices"][best]["text"]);
    CHECK(r.j()["usage"]["completion_tokens"] == 30);
    one["stream"] = true;
    CHECK(post(s, "/v1/completions", one).status == 400); // the best are known only at the end

    // echo: the prompt's text first; with logprobs its tokens too, the first with none.
    auto e = post(s, "/v1/completions",
                  {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true}});
    REQUIRE(e.status == 200);
    CHECK(e.j()["choices"][0]["text"] == "Once upon a time" + offline_text("Once upon a time", 5));
    auto tk = post(s, "/tokenize", {{"content", "Once upon a time"}, {"add_special", true}});
    REQUIRE(tk.status == 200);
    const size_t n_prompt = tk.j()["tokens"].size();
    REQUIRE(n_prompt > 2);
    json scored = {{"prompt", "Once upon a time"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}};
    auto sc = post(s, "/v1/completions", scored);
    REQUIRE(sc.status == 200);
    const json lp = sc.j()["choices"][0]["logprobs"];
    CHECK(sc.j()["choices"][0]["text"] == "Once upon a time");
    CHECK(sc.j()["usage"]["completion_tokens"] == 0);
    REQUIRE(lp["tokens"].size() == n_prompt);
    CHECK(lp["token_logprobs"][0].is_null());
    CHECK(lp["top_logprobs"][0].is_null());
    for (size_t i = 1; i < n_prompt; ++i) {
        CHECK(lp["token_logprobs"][i].get<double>() < 0);
        CHECK(lp["top_logprobs"][i].size() == 2);
        CHECK(lp["text_offset"][i].get<int>() >= lp["text_offset"][i - 1].get<int>());
    }
    // The prompt's scores are the model's: "upon" after "Once" is likelier than after "Twice".
    scored["prompt"] = "Twice upon a time";
    auto other = post(s, "/v1/completions", scored);
    REQUIRE(other.status == 200);
    CHECK(other.j()["choices"][0]["logprobs"]["token_logprobs"].back().get<double>() !=
          lp["token_logprobs"].back().get<double>());
    // Streamed, echo and logprobs: the same text.
    json stream = {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true},
                   {"logprobs", 1}, {"stream", true}, {"n", 2}};
    auto ss = post(s, "/v1/completions", stream);
    REQUIRE(ss.status == 200);
    const auto events = sse_events(ss.body);
    for (int k = 0; k < 2; ++k) CHECK(stream_text(events, false, k) == e.j()["choices"][0]["text"]);
    CHECK(post(s, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 0}}).status == 400); // 0 needs echo
}

TEST_CASE("grounding: citations index the reply and the documents in code points, plain and streamed; the documents are a cached prefix") {
    const auto& s = shared_socket();
    // A document holding the model's own story (so replies copy from it), after multi-byte text
    // (so code points and bytes differ); replies start with multi-byte text too (a regex).
    const std::string story = offline_text("Once upon a time", 200);
    const std::vector<std::string> docs{"Zoë's café: crème brûlée 🍰 on Sundays.", "Crème brûlée 🍰 for Zoë." + story};
    json documents = json::array();
    documents.push_back({{"id", "menu"}, {"text", docs[0]}});
    documents.push_back({{"text", docs[1]}, {"title", "A story"}});
    const auto request = [&](int seed, bool stream) {
        json b = {{"messages", {{{"role", "user"}, {"content", "Tell me the story."}}}},
                  {"max_tokens", 120},
                  {"documents", documents},
                  {"citation_options", {{"min_tokens", 3}}},
                  {"structured_outputs", {{"regex", "Été 🍰, [a-zA-Z ,.'!]+"}}}};
        if (seed >= 0) b["seed"] = seed;
        else b["temperature"] = 0;
        if (stream) b["stream"] = true;
        return post(s, "/v1/chat/completions", b);
    };
    int n_citations = 0;
    for (int seed : {-1, 1, 2, 3, 4, 5}) {
        CAPTURE(seed);
        auto r = request(seed, false);
        REQUIRE(r.status == 200);
        const json m = r.j()["choices"][0]["message"];
        const std::string content = m["content"];
        REQUIRE(content.starts_with("Été 🍰, "));
        for (const auto& c : m["citations"]) {
            CAPTURE(c.dump());
            CHECK(slice(content, c["start"], c["end"]) == c["text"].get<std::string>());
            const int d = c["document_index"];
            REQUIRE((d == 0 || d == 1));
            CHECK(c["document_id"] == (d == 0 ? "menu" : "1"));
            CHECK(norm(slice(docs[size_t(d)], c["document_start"], c["document_end"])) == norm(c["text"]));
            ++n_citations;
        }
        // Streamed: the same reply; each citation comes in the chunk where its span closed, and
        // the last chunk lists them all.
        auto st = request(seed, true);
        REQUIRE(st.status == 200);
        json streamed = json::array(), listed;
        for (const auto& e : sse_events(st.body))
            for (const auto& c : e["choices"]) {
                if (c["delta"].contains("citations"))
                    for (const auto& x : c["delta"]["citations"]) streamed.push_back(x);
                if (c.contains("citations")) listed = c["citations"];
            }
        CHECK(stream_text(sse_events(st.body), true) == content);
        CHECK(streamed == m["citations"]);
        CHECK(listed == m["citations"]);
    }
    CHECK(n_citations >= 6);

    // The second question about the same documents reuses their pages.
    json q = {{"messages", {{{"role", "user"}, {"content", "Who had the café?"}}}}, {"max_tokens", 4},
              {"documents", documents}};
    auto first = post(s, "/v1/chat/completions", q);
    q["messages"][0]["content"] = "What happened on Sundays?";
    auto second = post(s, "/v1/chat/completions", q);
    REQUIRE(second.status == 200);
    const json u = second.j()["usage"];
    CHECK(u["prompt_tokens_details"]["cached_tokens"].get<int>() > u["prompt_tokens"].get<int>() / 2);

    // mode "off": no citations field; what is not built or not allowed is a 400 naming it.
    q["citation_options"] = {{"mode", "off"}};
    auto off = post(s, "/v1/chat/completions", q);
    REQUIRE(off.status == 200);
    CHECK_FALSE(off.j()["choices"][0]["message"].contains("citations"));
    const auto refused = [&](const json& body, const std::string& route, const std::string& param) {
        auto e = post(s, route, body);
        CAPTURE(body.dump());
        CHECK(e.status == 400);
        CHECK(e.j()["error"]["param"] == param);
    };
    const json msgs = {{{"role", "user"}, {"content", "Hi"}}};
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}}}}, {"citation_options", {{"mode", "exact"}}}},
            "/v1/chat/completions", "citation_options.mode");
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}}}}, {"citation_options", {{"mode", "strict"}}},
             {"structured_outputs", {{"regex", "a+"}}}},
            "/v1/chat/completions", "structured_outputs.regex");
    refused({{"messages", msgs}, {"citation_options", {{"mode", "fast"}}}}, "/v1/chat/completions", "citation_options");
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}}}}, {"citation_options", {{"mode", "off"}, {"min_tokens", 4}}}},
            "/v1/chat/completions", "citation_options.min_tokens");
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}, {"url", "y"}}}}}, "/v1/chat/completions", "documents[0].url");
    refused({{"messages", msgs}, {"documents", {{{"title", "x"}}}}}, "/v1/chat/completions", "documents[0].text");
    refused({{"prompt", "Hi"}, {"documents", {{{"text", "x"}}}}}, "/v1/completions", "documents");
}

TEST_CASE("grounding, documents larger than the context: the passages most like the question, citations into the originals") {
    daemon_process d;
    d.start(scratch().file("retrieval.sock"), {"--set", "n_ctx=256"});
    REQUIRE(d.wait_ready());
    // Two long documents of the model's own stories (replies copy them), the first after
    // multi-byte text (code points and bytes differ), and between them a short one that is the
    // question word for word: its passage embeds as the question does, so it ranks first.
    std::string story;
    for (const char* start : {"Once upon a time", "One day, Tom", "Lily and her mom", "The little dog"})
        story += std::string(start) + offline_text(start, 60) + "\n\n";
    const std::string needle = "Sue went to the beach with her mom and dad.";
    const std::vector<std::string> docs{"Zoë's café: crème brûlée 🍰 on Sundays.\n\n" + story, needle, story + story};
    json documents = json::array();
    documents.push_back({{"id", "long"}, {"text", docs[0]}});
    documents.push_back({{"id", "needle"}, {"text", docs[1]}});
    documents.push_back({{"text", docs[2]}});
    const auto engine_prompt_tokens = [&] {
        return metric(request(d.sock, "GET", "/metrics").body, "tandem_engine_prompt_tokens_total");
    };
    json q = {{"messages", {{{"role", "user"}, {"content", needle}}}},
              {"max_tokens", 30},
              {"documents", documents},
              {"citation_options", {{"min_tokens", 3}}}};
    int n_citations = 0;
    json first_passages;
    double first_cost = 0;
    for (int seed : {-1, 1, 2, 3}) {
        CAPTURE(seed);
        if (seed < 0) q["temperature"] = 0;
        else q["seed"] = seed, q["temperature"] = 1;
        const double before = engine_prompt_tokens();
        auto r = post(d.sock, "/v1/chat/completions", q);
        REQUIRE(r.status == 200);
        const json j = r.j();
        REQUIRE(j.contains("passages"));
        const json& ps = j["passages"];
        REQUIRE(ps.size() >= 2);
        CHECK(j["usage"]["prompt_tokens"].get<int>() <= 256 - 30);
        bool needle_found = false;
        for (const auto& p : ps) {
            const int di = p["document_index"];
            REQUIRE((di >= 0 && di < 3));
            CHECK(p["document_id"] == (di == 0 ? "long" : di == 1 ? "needle" : "2"));
            const std::string text = slice(docs[size_t(di)], p["start"], p["end"]);
            REQUIRE(!text.empty());
            CHECK(text.front() != ' ');
            needle_found |= di == 1 && text == needle;
        }
        CHECK(needle_found);
        if (seed < 0) { // the first request embeds every passage; later ones only their question
            first_passages = ps;
            first_cost = engine_prompt_tokens() - before;
        } else {
            CHECK(engine_prompt_tokens() - before < first_cost / 2);
            CHECK(ps == first_passages); // the same question ranks the same passages
        }
        const json m = j["choices"][0]["message"];
        const std::string content = m["content"];
        for (const auto& c : m["citations"]) {
            CAPTURE(c.dump());
            CHECK(slice(content, c["start"], c["end"]) == c["text"].get<std::string>());
            const int di = c["document_index"];
            REQUIRE((di >= 0 && di < 3));
            CHECK(norm(slice(docs[size_t(di)], c["document_start"], c["document_end"])) == norm(c["text"]));
            ++n_citations;
        }
    }
    CHECK(n_citations >= 1);
    // streamed: the last chunk lists the passages
    q["stream"] = true;
    q["temperature"] = 0;
    q.erase("seed");
    auto st = post(d.sock, "/v1/chat/completions", q);
    REQUIRE(st.status == 200);
    json listed;
    for (const auto& e : sse_events(st.body))
        if (e.contains("passages")) listed = e["passages"];
    CHECK(listed == first_passages);
    // documents that fit are rendered whole: no passages
    auto whole = post(d.sock, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4},
                       {"documents", {{{"text", needle}}}}});
    REQUIRE(whole.status == 200);
    CHECK_FALSE(whole.j().contains("passages"));
    // a question that leaves no room for passages is a 400 that says so
    std::string long_question;
    for (int i = 0; i < 40; ++i) long_question += "Why did Sue go? ";
    auto no_room = post(d.sock, "/v1/chat/completions",
                        {{"messages", {{{"role", "user"}, {"content", long_question}}}}, {"max_tokens", 30},
                         {"documents", documents}});
    CHECK(no_room.status == 400);
    CHECK(no_room.j()["error"]["param"] == "documents");
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["kv_pages_used"] == 0);
    CHECK(d.stop() == 0);
}

TEST_CASE("grounding, strict mode: every quotation of sampled replies is document text; unsupported sentences carry no citation") {
    const auto& s = shared_socket();
    const std::string story = offline_text("Once upon a time", 300);
    const std::vector<std::string> docs{story, "Ben said, \"The sun is hot today.\" Mia said, \"Let us swim.\""};
    json documents = json::array();
    for (const auto& d : docs) documents.push_back({{"text", d}});
    int n_quotes = 0;
    for (int seed = 1; seed <= 12; ++seed) {
        CAPTURE(seed);
        auto r = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Tell me the story."}}}},
                                                  {"max_tokens", 150}, {"seed", seed}, {"temperature", 1},
                                                  {"documents", documents},
                                                  {"citation_options", {{"mode", "strict"}, {"min_tokens", 4}}}});
        REQUIRE(r.status == 200);
        const json m = r.j()["choices"][0]["message"];
        const std::string content = m["content"];
        // the text between the 1st and 2nd, 3rd and 4th, ... double quote (the last may be cut
        // by max_tokens: a prefix of document text is document text too)
        size_t open = content.find('"');
        while (open != std::string::npos) {
            const size_t close = content.find('"', open + 1);
            const std::string quoted = content.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
            CAPTURE(quoted);
            CHECK((docs[0].find(quoted) != std::string::npos || docs[1].find(quoted) != std::string::npos));
            ++n_quotes;
            open = close == std::string::npos ? close : content.find('"', close + 1);
        }
        for (const auto& u : m["unsupported"]) {
            for (const auto& c : m["citations"])
                CHECK((c["end"].get<int64_t>() <= u["start"].get<int64_t>() || c["start"].get<int64_t>() >= u["end"].get<int64_t>()));
            CHECK(content.find(u["text"].get<std::string>()) != std::string::npos);
        }
    }
    CHECK(n_quotes >= 5); // stories260K writes dialogue: quotes happen
}

TEST_CASE("16 concurrent streams all complete, each equal to its solo output at temperature 0") {
    const auto& s = shared_socket();
    const char* starts[] = {"Once upon a time", "The cat", "One day", "Tom and Sue", "A little bird", "The sun",
                            "Lily saw", "There was a", "Ben had a", "In the park", "The dog", "Mom said",
                            "A big red", "They went", "She was", "He liked"};
    const int n = 16;
    std::vector<std::string> solo(n), together(n);
    for (int i = 0; i < n; ++i) {
        auto r = post(s, "/v1/completions", {{"prompt", starts[i]}, {"max_tokens", 48}, {"temperature", 0}});
        REQUIRE(r.status == 200);
        solo[size_t(i)] = r.j()["choices"][0]["text"];
    }
    const double steps0 = metric(request(s, "GET", "/metrics").body, "tandem_engine_steps_total");
    std::vector<std::thread> threads;
    std::vector<int> status(n);
    std::vector<char> complete(n); // not vector<bool>: its elements share words, written from other threads
    std::latch all_connected(n); // send together, so they overlap even on a busy machine
    for (int i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            const int fd = connect_unix(s);
            all_connected.arrive_and_wait();
            send_all(fd, make_request("POST", "/v1/completions",
                                      json{{"prompt", starts[i]}, {"max_tokens", 48}, {"temperature", 0},
                                           {"stream", true}}.dump()));
            const auto r = parse_response(read_until_eof(fd));
            ::close(fd);
            status[size_t(i)] = r.status;
            bool done = false, ok = false;
            auto ev = sse_events(r.body, &done, &ok);
            complete[size_t(i)] = done && ok;
            together[size_t(i)] = stream_text(ev, false);
        });
    for (auto& t : threads) t.join();
    const double steps1 = metric(request(s, "GET", "/metrics").body, "tandem_engine_steps_total");
    int n_tokens = 0;
    for (int i = 0; i < n; ++i) {
        CHECK(status[size_t(i)] == 200);
        CHECK(complete[size_t(i)]);
        CHECK_MESSAGE(together[size_t(i)] == solo[size_t(i)], "stream ", i);
        n_tokens += 48;
    }
    // batched: far fewer steps than tokens
    CHECK(steps1 - steps0 < n_tokens / 2);
}

TEST_CASE("tandem bench --serve: throughput, TTFT, inter-token latency and KV waste per level, prefix TTFT") {
    const auto& s = shared_socket();
    // --kv-interval-ms 1: these levels last milliseconds; the default 20 ms would see nothing.
    const auto r = run_tandem({"bench", "--serve", "--socket", s, "--concurrency", "1,2", "--requests", "2",
                               "--max-tokens", "4", "--shared-prefix", "64", "--kv-interval-ms", "1", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json j = json::parse(r.out);
    CHECK(j["model"] == "stories260K");
    CHECK(j["prompt_tokens"] == 128);
    CHECK(j["max_tokens"] == 4);
    REQUIRE(j["levels"].size() == 2);
    for (int li = 0; li < 2; ++li) {
        const json& l = j["levels"][size_t(li)];
        CAPTURE(l.dump());
        CHECK(l["concurrency"] == li + 1);
        CHECK(l["requests"] == 2);
        CHECK(l["errors"] == 0);
        CHECK(l["generated_tokens"] == 8); // ignore_eos: exactly max_tokens each
        CHECK(l["tok_s"].get<double>() > 0);
        CHECK(l["wall_s"].get<double>() > 0);
        for (const char* k : {"ttft_ms", "itl_ms"}) {
            const json& lat = l[k];
            REQUIRE(lat["p50"].is_number());
            CHECK(lat["p50"].get<double>() >= 0);
            CHECK(lat["p99"].get<double>() >= lat["p50"].get<double>());
        }
        CHECK(l["ttft_ms"]["n"] == 2);
        CHECK(l["itl_ms"]["n"] == 6); // 3 gaps per 4-token stream
        // a sample sees the pages of a running request: pages are taken as positions are
        // computed, so at least the prompt's ceil(128 / 16) = 8 once it is prefilled (a 9th
        // only from the first decode step on, which a sample may miss)
        REQUIRE(l["kv_samples"].get<int>() > 0);
        CHECK(l["kv_pages_used_max"].get<int>() >= 8);
        const double w = l["kv_waste"].get<double>();
        CHECK(w >= 0);
        CHECK(w <= 1);
        CHECK(l["kv_waste_max"].get<double>() >= w);
    }
    const json& p = j["prefix"];
    CHECK(p["prefix_tokens"] == 64);
    CHECK(p["cold_ttft_ms"].get<double>() > 0);
    CHECK(p["warm_ttft_ms"].get<double>() > 0);
    CHECK(p["warm_hit_tokens"].get<int64_t>() >= 0);

    // the table form, and usage errors
    const auto t = run_tandem({"bench", "--serve", "--socket", s, "--concurrency", "1", "--requests", "1",
                               "--max-tokens", "2", "--shared-prefix", "0"});
    CHECK(t.rc == 0);
    CHECK(t.out.find("concurrency") != std::string::npos);
    CHECK(run_tandem({"bench", "--concurrency", "2"}).rc == 2); // serve flags need --serve
    CHECK(run_tandem({"bench", "--serve", "--socket", s, "--requests", "1", "--duration", "1"}).rc == 2);
    CHECK(run_tandem({"bench", "--serve", "--socket", scratch().file("nobody.sock")}).rc == 3);
}

TEST_CASE("a client that disconnects cancels its request: compute stops and pages are freed") {
    const auto& s = shared_socket();
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"n", 4},
                       {"temperature", 0}, {"stream", true}};
    // (the shared daemon's counter holds what earlier tests generated)
    const double gen_before = metric(request(s, "GET", "/metrics").body, "tandem_engine_generated_tokens_total");
    send_all(fd, make_request("POST", "/v1/completions", body.dump()));
    const auto cancelled = [&] {
        return metric(request(s, "GET", "/metrics").body, "tandem_generations_finished_total{reason=\"cancelled\"}");
    };
    const double cancelled0 = std::max(0.0, cancelled());
    std::string got;
    char buf[4096];
    while (got.find("data: ") == std::string::npos) { // tokens are flowing
        pollfd p{fd, POLLIN, 0};
        REQUIRE(::poll(&p, 1, 10000) == 1);
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        REQUIRE(n > 0);
        got.append(buf, size_t(n));
    }
    ::close(fd);

    // the session notices at once and cancels all 4 choices; the engine drops them at the next step
    for (int i = 0; i < 500 && cancelled() < cancelled0 + 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(cancelled() == cancelled0 + 4);
    auto m = request(s, "GET", "/metrics").body;
    for (int i = 0; i < 200 && (metric(m, "tandem_requests_running") != 0 || metric(m, "tandem_kv_pages_used") != 0); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        m = request(s, "GET", "/metrics").body;
    }
    CHECK(metric(m, "tandem_requests_running") == 0);
    CHECK(metric(m, "tandem_kv_pages_used") == 0);
    const double gen0 = metric(m, "tandem_engine_generated_tokens_total");
    CHECK(gen0 - gen_before < 4000); // far from the 8000 asked for
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double gen1 = metric(request(s, "GET", "/metrics").body, "tandem_engine_generated_tokens_total");
    CHECK(gen1 == gen0); // nothing is computed for it any more

    // a plain (non-streaming) request is cancelled too, as soon as the client hangs up
    const int fd2 = connect_unix(s);
    send_all(fd2, make_request("POST", "/v1/completions", json{{"prompt", "The cat"}, {"max_tokens", 2000},
                                                               {"ignore_eos", true}, {"n", 4}}.dump()));
    for (int i = 0; i < 500 && metric(request(s, "GET", "/metrics").body, "tandem_requests_running") == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10)); // until it runs
    ::close(fd2);
    for (int i = 0; i < 200 && metric(request(s, "GET", "/metrics").body, "tandem_requests_running") != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = request(s, "GET", "/metrics").body;
    CHECK(metric(m, "tandem_requests_running") == 0);
    CHECK(metric(m, "tandem_kv_pages_used") == 0);
    CHECK(cancelled() == cancelled0 + 8);
}

TEST_CASE("malformed input gets the right error while the daemon keeps serving") {
    const auto& s = shared_socket();
    auto expect = [&](const std::string& target, const std::string& body, int status, const char* what) {
        auto r = request(s, "POST", target, body);
        CHECK_MESSAGE(r.status == status, what, ": ", r.body);
        if (r.status >= 400) {
            const json j = r.j();
            CHECK_MESSAGE((j.contains("error") && j["error"].contains("message") && j["error"].contains("type")),
                          what);
        }
    };
    expect("/v1/completions", "{\"prompt\": \"x\", ", 400, "truncated JSON");
    expect("/v1/completions", "not json", 400, "not JSON");
    expect("/v1/completions", "[1,2]", 400, "not an object");
    expect("/v1/completions", R"({"max_tokens": 5})", 400, "no prompt");
    expect("/v1/completions", R"({"prompt": 5})", 400, "prompt of the wrong type");
    expect("/v1/completions", R"({"prompt": [1, 99999]})", 400, "token id out of range");
    expect("/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature a string");
    expect("/v1/completions", R"({"prompt": "x", "temperature": 7})", 400, "temperature out of range");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens a string");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": -1})", 400, "negative max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "zero max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 1e30})", 400, "huge float max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 99999999999999999999})", 400, "huge max_tokens");
    expect("/v1/completions", R"({"prompt": "x", "max_tokens": 1000000})", 400, "max_tokens over the limit");
    expect("/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "stream a string");
    expect("/v1/completions", R"({"prompt": "x", "stop": [1]})", 400, "stop of numbers");
    expect("/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 1}})", 400, "logit_bias key");
    expect("/v1/completions", R"({"prompt": "x", "n": 1000})", 400, "n too large");
    expect("/v1/completions", R"({"prompt": "x", "logprobs": 50})", 400, "logprobs too large");
    expect("/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404, "unknown model");
    expect("/v1/completions", "{\"prompt\": \"\xff\xfe bad utf-8\"}", 400, "invalid UTF-8");
    expect("/v1/chat/completions", R"({"messages": "hi"})", 400, "messages a string");
    expect("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "unknown role");
    expect("/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400, "content a number");
    expect("/v1/nope", "{}", 404, "unknown route");
    expect("/tokenize", R"({"content": 5})", 400, "tokenize content a number");
    expect("/detokenize", R"({"tokens": [-1]})", 400, "detokenize bad id");
    CHECK(request(s, "GET", "/v1/completions").status == 405);

    // oversized body: 413 before the body is read
    auto big = request(s, "POST", "/v1/completions",
                       json{{"prompt", std::string(100000, 'a')}}.dump());
    CHECK(big.status == 413);
    CHECK(big.j()["error"]["code"] == "request_too_large");

    // garbage instead of HTTP
    {
        const int fd = connect_unix(s);
        send_all(fd, "\x01\x02 nonsense\r\n\r\n");
        const auto r = parse_response(read_until_eof(fd, 5000));
        ::close(fd);
        CHECK(r.status == 400);
    }

    // slowloris: a request that never completes is dropped after request_timeout_s (1 s here)
    {
        const int fd = connect_unix(s);
        send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
        const auto t0 = std::chrono::steady_clock::now();
        const std::string rest = read_until_eof(fd, 10000);
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ::close(fd);
        CHECK(rest.empty());
        CHECK(waited < 5);
        CHECK(waited > 0.5);
    }
    // and a stalled body too
    {
        const int fd = connect_unix(s);
        send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");
        const auto t0 = std::chrono::steady_clock::now();
        read_until_eof(fd, 10000);
        ::close(fd);
        CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5);
    }

    // still serving
    CHECK(request(s, "GET", "/health").status == 200);
    auto ok = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}});
    CHECK(ok.status == 200);
    CHECK(ok.j()["choices"][0]["text"] == offline_text("Once upon a time", 5));
}

TEST_CASE("keep-alive: several requests on one connection") {
    const auto& s = shared_socket();
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    std::string reqs = make_request("GET", "/health", "", false) +
                       make_request("POST", "/tokenize", R"({"content":"hi"})", false) +
                       make_request("GET", "/health", "", true);
    send_all(fd, reqs);
    const std::string raw = read_until_eof(fd, 5000);
    ::close(fd);
    size_t n = 0;
    for (size_t pos = 0; (pos = raw.find("HTTP/1.1 200", pos)) != std::string::npos; ++pos) ++n;
    CHECK(n == 3);
}

TEST_CASE("Expect: 100-continue gets an interim 100 before the body is sent") {
    const auto& s = shared_socket();
    const int fd = connect_unix(s);
    REQUIRE(fd >= 0);
    const std::string body = json{{"content", "Once upon a time"}}.dump();
    send_all(fd, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                 "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n");
    char buf[256];
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    CHECK(std::string(buf, size_t(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0);
    send_all(fd, body);
    const auto r = parse_response(read_until_eof(fd, 5000));
    ::close(fd);
    CHECK(r.status == 200);
    CHECK(r.j()["count"].get<int>() > 0);
}

TEST_CASE("SIGTERM drains in-flight requests, then tandemd exits 0; sd_notify messages") {
    // a test NOTIFY_SOCKET: a datagram socket we read
    const std::string notify_path = scratch().file("notify.sock");
    const int nfd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, notify_path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::bind(nfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    // read continuously, as systemd does: a full queue would block the daemon's sd_notify
    std::mutex mu;
    std::string notes;
    std::atomic<bool> reading{true};
    std::thread reader([&] {
        char buf[4096];
        while (reading) {
            pollfd p{nfd, POLLIN, 0};
            if (::poll(&p, 1, 50) != 1) continue;
            const ssize_t n = ::recv(nfd, buf, sizeof buf, 0);
            if (n <= 0) continue;
            std::lock_guard lock(mu);
            notes.append(buf, size_t(n)).push_back('\n');
        }
    });
    auto read_notify = [&](int wait_ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        std::lock_guard lock(mu);
        return notes;
    };

    daemon_process d;
    d.start(scratch().file("drain.sock"), {}, {"NOTIFY_SOCKET=" + notify_path, "WATCHDOG_USEC=200000"});
    REQUIRE(d.wait_ready());
    std::string msgs = read_notify(500);
    CHECK(msgs.find("READY=1") != std::string::npos);
    CHECK(msgs.find("STATUS=") != std::string::npos);
    CHECK(msgs.find("WATCHDOG=1") != std::string::npos);

    // a long streaming request is in flight when SIGTERM comes
    const int fd = connect_unix(d.sock);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 600}, {"ignore_eos", true}, {"n", 2},
                       {"temperature", 0}, {"stream", true}};
    send_all(fd, make_request("POST", "/v1/completions", body.dump()));
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    ::kill(d.pid, SIGTERM);
    check_whole_stream(fd, 0, 600);
    CHECK(d.wait_exit(30) == 0);
    CHECK_FALSE(std::filesystem::exists(d.sock)); // the socket file is removed
    msgs = read_notify(500);
    CHECK(msgs.find("STOPPING=1") != std::string::npos);
    reading = false;
    reader.join();
    ::close(nfd);
}

TEST_CASE("while the model loads: /health answers 503 at once, a completion is held until it has loaded; READY=1 after") {
    const std::string notify_path = scratch().file("notify-load.sock");
    const int nfd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, notify_path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::bind(nfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    daemon_process d;
    d.start(scratch().file("loading.sock"), {}, {"NOTIFY_SOCKET=" + notify_path, "TANDEMD_TEST_LOAD_DELAY_MS=1500"});
    http_response h;
    for (int i = 0; i < 200 && h.status == 0; ++i) { // the socket is up before the model
        h = request(d.sock, "GET", "/health");
        if (h.status == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(h.status == 503);
    CHECK(h.j()["status"] == "loading");
    CHECK(h.headers.count("retry-after") == 1);
    char buf[512];
    std::string notes;
    for (ssize_t n; (n = ::recv(nfd, buf, sizeof buf, MSG_DONTWAIT)) > 0;) notes.append(buf, size_t(n));
    CHECK(notes.find("READY=1") == std::string::npos);
    // sent during the load (load_wait_s, 30 s by default): answered once the model is there
    const auto t0 = std::chrono::steady_clock::now();
    std::atomic<bool> answered{false};
    http_response c;
    std::thread client([&] {
        c = post(d.sock, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}});
        answered = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(answered); // held
    // meanwhile /health and the status answer at once, still loading
    const auto th = std::chrono::steady_clock::now();
    CHECK(request(d.sock, "GET", "/health").j()["status"] == "loading");
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["status"] == "loading");
    CHECK(std::chrono::steady_clock::now() - th < std::chrono::milliseconds(500));
    client.join();
    CHECK(c.status == 200);
    CHECK(c.j()["choices"][0]["text"] == offline_text("Once upon a time", 8));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
    REQUIRE(d.wait_ready());
    pollfd p{nfd, POLLIN, 0};
    std::string ready;
    while (ready.find("READY=1") == std::string::npos && ::poll(&p, 1, 2000) == 1) {
        const ssize_t n = ::recv(nfd, buf, sizeof buf, 0);
        if (n <= 0) break;
        ready.append(buf, size_t(n));
    }
    CHECK(ready.find("READY=1") != std::string::npos);
    CHECK(d.stop() == 0);
    ::close(nfd);
}

namespace {

// Whether something accepts connections at `sock` within a few seconds.
bool listening(const std::string& sock) {
    for (int i = 0; i < 500; ++i) {
        if (const int fd = connect_unix(sock); fd >= 0) {
            ::close(fd);
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

} // namespace

TEST_CASE("a request held for the model gets 503 with Retry-After after load_wait_s") {
    daemon_process d;
    d.start(scratch().file("load-wait.sock"), {"--set", "load_wait_s=0.3"}, {"TANDEMD_TEST_LOAD_DELAY_MS=3000"});
    REQUIRE(listening(d.sock));
    const auto t0 = std::chrono::steady_clock::now();
    auto c = post(d.sock, "/v1/completions", {{"prompt", "x"}});
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(c.status == 503);
    CHECK(c.j()["error"]["code"] == "model_loading");
    CHECK(c.headers.count("retry-after") == 1);
    CHECK(waited >= std::chrono::milliseconds(280));
    CHECK(waited < std::chrono::milliseconds(2500));
    // 0: no wait at all
    daemon_process d0;
    d0.start(scratch().file("load-wait0.sock"), {"--set", "load_wait_s=0"}, {"TANDEMD_TEST_LOAD_DELAY_MS=3000"});
    REQUIRE(listening(d0.sock));
    const auto t1 = std::chrono::steady_clock::now();
    CHECK(post(d0.sock, "/v1/models", {}).status == 405); // POST on a GET route: an error that needs no model
    CHECK(request(d0.sock, "GET", "/v1/models").status == 503);
    CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(1000));
    // SIGTERM while a request is held: it gets its 503 at once, and the daemon exits 0
    http_response held;
    std::thread client([&] { held = post(d0.sock, "/v1/completions", {{"prompt", "x"}}); });
    daemon_process d2;
    d2.start(scratch().file("load-wait2.sock"), {}, {"TANDEMD_TEST_LOAD_DELAY_MS=3000"});
    REQUIRE(listening(d2.sock));
    http_response held2;
    std::thread client2([&] { held2 = post(d2.sock, "/v1/completions", {{"prompt", "x"}}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t2 = std::chrono::steady_clock::now();
    ::kill(d2.pid, SIGTERM);
    client2.join();
    CHECK(std::chrono::steady_clock::now() - t2 < std::chrono::milliseconds(2000));
    CHECK(held2.status == 503);
    CHECK(held2.j()["error"]["code"] == "shutting_down");
    CHECK(d2.wait_exit(10) == 0);
    client.join();
    CHECK(held.status == 503); // load_wait_s = 0
    CHECK(d.stop() == 0);
    CHECK(d0.stop() == 0);
}

namespace {

// tandemd under `systemd-socket-activate -l SOCK` (started by the first connection), with the
// default KV pool (no kv_pool key); false when systemd-socket-activate is not installed.
bool spawn_activated(daemon_process& d, const std::string& sock, const std::vector<std::string>& env = {}) {
    if (std::system("command -v systemd-socket-activate >/dev/null 2>&1") != 0) return false;
    d.sock = sock;
    d.spawn({"-l", d.sock, binary_dir() + "/daemon/tandemd", "--model", model_path("stories260K.gguf"), "--threads",
             "1", "--log", "warn"},
            env, "systemd-socket-activate");
    for (int i = 0; i < 500 && !std::filesystem::exists(d.sock); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return std::filesystem::exists(d.sock);
}

} // namespace

TEST_CASE("socket activation: the request that starts tandemd gets 200; daemons on two sockets each have their own KV pool") {
    daemon_process a, b;
    if (!spawn_activated(a, scratch().file("activated-a.sock"))) {
        MESSAGE("systemd-socket-activate not installed: skipped");
        return;
    }
    REQUIRE(spawn_activated(b, scratch().file("activated-b.sock")));
    // the first connection starts tandemd (systemd holds it in the backlog until then), and
    // its request is answered, not refused as "still loading"
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    auto ra = post(a.sock, "/v1/completions", body);
    CHECK(ra.status == 200);
    CHECK(ra.j()["choices"][0]["text"] == offline_text("Once upon a time", 8));
    auto rb = post(b.sock, "/v1/completions", body);
    CHECK(rb.status == 200);
    // the same model, the same user, no kv_pool set: two pools, named by socket (and model)
    const json sa = request(a.sock, "GET", "/v1/tandem/status").j(), sb = request(b.sock, "GET", "/v1/tandem/status").j();
    const std::string pa = sa["kv_pool"]["path"], pb = sb["kv_pool"]["path"];
    CHECK(pa != pb);
    CHECK(std::filesystem::path(pa).filename().string().rfind("tandem-kv-", 0) == 0);
    CHECK(std::filesystem::exists(pa));
    CHECK(std::filesystem::exists(pb));
    CHECK(sa["kv_pool"]["bytes"].get<int64_t>() == int64_t(std::filesystem::file_size(pa)));
    CHECK(sa["kv_pool"]["persist"] == false);
    CHECK(a.stop() == 0);
    CHECK(b.stop() == 0);
    // not kept by default: nothing accumulates in /dev/shm
    CHECK_FALSE(std::filesystem::exists(pa));
    CHECK_FALSE(std::filesystem::exists(pb));
}

TEST_CASE("a start that fails after its KV pool was made leaves no pool file, unless kv_pool_persist") {
    // the default pool goes to $RUNTIME_DIRECTORY: a scratch one here
    const std::string rt = scratch().file("failed-start-rt");
    std::filesystem::create_directories(rt);
    auto pools = [&] { // every file but the socket: whatever its name, a pool file is one
        std::vector<std::string> out;
        for (const auto& e : std::filesystem::directory_iterator(rt))
            if (e.is_regular_file()) out.push_back(e.path().string());
        return out;
    };
    auto start_failing = [&](const std::string& model, std::vector<std::string> extra) {
        daemon_process d;
        std::vector<std::string> args = {"--model", model, "--socket", rt + "/tandem.sock", "--threads", "1", "--log",
                                         "off"};
        args.insert(args.end(), extra.begin(), extra.end());
        d.spawn(args, {"RUNTIME_DIRECTORY=" + rt});
        return d.wait_exit(60);
    };
    // no room for the pool: the file is made, then refused
    CHECK(start_failing(model_path("stories260K.gguf"), {"--set", "kv_cache_mb=16000000"}) == 1);
    CHECK(pools().empty());
    // the workers cannot load the weights (a tensor is missing), after the daemon made the pool
    // from the model's header
    std::string bytes;
    {
        std::ifstream in(model_path("stories260K.gguf"), std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto at = bytes.find("output_norm.weight");
    REQUIRE(at != std::string::npos);
    bytes.replace(at, 18, "output_norm.wxyzzy");
    const std::string broken = scratch().file("no-output-norm.gguf");
    std::ofstream(broken, std::ios::binary) << bytes;
    CHECK(start_failing(broken, {}) == 1);
    CHECK(pools().empty());
    // kv_pool_persist keeps it, as asked
    CHECK(start_failing(broken, {"--set", "kv_pool_persist=true"}) == 1);
    CHECK(pools().size() == 1);
}

TEST_CASE("SIGTERM: while the drain lasts /health says stopping and new requests get 503; the running stream finishes") {
    daemon_process d;
    d.start(scratch().file("stopping.sock"));
    REQUIRE(d.wait_ready());
    // a stream longer than the socket buffers hold: unread, it is still running below
    const int fd = connect_unix(d.sock);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 1000}, {"ignore_eos", true}, {"n", 4},
                       {"temperature", 0}, {"stream", true}};
    send_all(fd, make_request("POST", "/v1/completions", body.dump()));
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
    ::kill(d.pid, SIGTERM);
    http_response h;
    for (int i = 0; i < 200; ++i) { // 200 until the signal is handled
        h = request(d.sock, "GET", "/health");
        if (h.status != 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(h.status == 503);
    CHECK(h.j()["status"] == "stopping");
    CHECK(h.headers.count("retry-after") == 1);
    auto c = post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
    CHECK(c.status == 503);
    CHECK(c.j()["error"]["code"] == "shutting_down");
    CHECK(c.headers.count("retry-after") == 1);
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["status"] == "stopping");
    check_whole_stream(fd, 3, 1000);
    CHECK(d.wait_exit(30) == 0);
}

TEST_CASE("a bad config or a missing model fails clearly") {
    daemon_process d;
    d.spawn({"--model", model_path("stories260K.gguf"), "--set", "max_running=zero"});
    CHECK(d.wait_exit(10) == 2);
    const std::string conf = scratch().file("bad.conf");
    {
        std::ofstream f(conf);
        f << "# comment\nthreads = 1\nno_such_key = 3\n";
    }
    daemon_process d2;
    d2.spawn({"--config", conf, "--model", model_path("stories260K.gguf")});
    CHECK(d2.wait_exit(10) == 2);
    daemon_process d3;
    d3.spawn({"--model", scratch().file("missing.gguf"), "--socket", scratch().file("missing.sock"), "--log", "off"});
    CHECK(d3.wait_exit(10) == 1);
}

TEST_CASE("many slow clients: past max_connections a 503, idle ones dropped after request_timeout_s; a reader that stops is dropped and its request cancelled") {
    daemon_process d;
    d.start(scratch().file("slow.sock"), {"--set", "max_connections=8", "--set", "request_timeout_s=1"});
    REQUIRE(d.wait_ready());
    auto running = [&] { return metric(request(d.sock, "GET", "/metrics").body, "tandem_requests_running"); };
    // eight clients that connect and send nothing hold every place
    std::vector<int> idle;
    for (int i = 0; i < 8; ++i) idle.push_back(connect_unix(d.sock));
    for (int fd : idle) REQUIRE(fd >= 0);
    const auto full = request(d.sock, "GET", "/health");
    CHECK(full.status == 503);
    CHECK(full.headers.count("retry-after") == 1);
    CHECK(full.j()["error"]["code"] == "too_many_connections");
    // their read deadline frees the places: each sees its connection closed
    for (int fd : idle) {
        CHECK(read_until_eof(fd, 5000).empty());
        ::close(fd);
    }
    CHECK(request(d.sock, "GET", "/health").status == 200);

    // A client that asks for a long stream and stops reading: once the socket's buffer is full
    // (logprobs make every chunk large) the daemon's writes stall, and after request_timeout_s
    // it drops the connection mid-stream instead of holding it (and the stream) for good.
    const int stuck = connect_unix(d.sock);
    REQUIRE(stuck >= 0);
    send_all(stuck, make_request("POST", "/v1/completions",
                                 json{{"prompt", "Once upon a time"}, {"max_tokens", 1500}, {"ignore_eos", true},
                                      {"logprobs", 5}, {"stream", true}}.dump()));
    // others are served meanwhile
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}, {"temperature", 0}}).status == 200);
    std::this_thread::sleep_for(std::chrono::seconds(3)); // not reading, past the deadline
    const auto t_read = std::chrono::steady_clock::now();
    const std::string got = read_until_eof(stuck, 10000); // what the buffer held, then the close
    ::close(stuck);
    CHECK(std::chrono::steady_clock::now() - t_read < std::chrono::seconds(5)); // closed, not timed out
    MESSAGE(got.size(), " bytes reached the client before it was dropped");
    CHECK(got.size() > 10000);
    CHECK(got.find("[DONE]") == std::string::npos); // cut, not finished
    CHECK(running() == 0);
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["kv_pages_used"] == 0);
    CHECK(d.stop() == 0);
}

TEST_CASE("limits: over capacity is 429 with Retry-After; socket mode; TCP listener; peers that are not allowed get 403") {
    CHECK((std::filesystem::status(shared_socket()).permissions() & std::filesystem::perms::all) ==
          std::filesystem::perms(0660));

    const int port = 20000 + int(::getpid() % 20000);
    const public_scratch_dir reachable("limits"); // the 403 check connects as another user
    daemon_process d;
    d.start(reachable.file("limits.sock"), {"--set", "max_running=1", "--set", "max_waiting=0", "--set",
                                            "socket_mode=0666", "--listen-tcp", "127.0.0.1:" + std::to_string(port)});
    REQUIRE(d.wait_ready());

    // the optional loopback TCP listener serves the same API
    {
        const int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in in{};
        in.sin_family = AF_INET;
        in.sin_port = htons(uint16_t(port));
        in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(t, reinterpret_cast<sockaddr*>(&in), sizeof in) == 0);
        std::string health = make_request("GET", "/health", "");
        health.replace(health.find("Host: tandem"), 12, "Host: 127.0.0.1:" + std::to_string(port));
        send_all(t, health);
        CHECK(parse_response(read_until_eof(t, 5000)).status == 200);
        ::close(t);
    }
    CHECK((std::filesystem::status(d.sock).permissions() & std::filesystem::perms::all) == std::filesystem::perms(0666));

    // one long request holds the only batch slot
    const int fd = connect_unix(d.sock);
    send_all(fd, make_request("POST", "/v1/completions",
                              json{{"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"ignore_eos", true},
                                   {"stream", true}}.dump()));
    for (int i = 0; i < 500 && metric(request(d.sock, "GET", "/metrics").body, "tandem_requests_running") != 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto busy = post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
    CHECK(busy.status == 429);
    CHECK(busy.headers.count("retry-after") == 1);
    CHECK(busy.j()["error"]["code"] == "server_busy");
    ::close(fd);
    for (int i = 0; i < 500 && metric(request(d.sock, "GET", "/metrics").body, "tandem_requests_running") != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(post(d.sock, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}).status == 200);

    // SO_PEERCRED: a user that is neither root, the daemon's user, nor allowed gets 403
    if (::geteuid() == 0) {
        const pid_t child = ::fork();
        if (child == 0) {
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
            const int c = connect_unix(d.sock);
            if (c < 0) ::_exit(4);
            send_all(c, make_request("GET", "/health", ""));
            const auto r = parse_response(read_until_eof(c, 5000));
            ::_exit(r.status == 403 ? 0 : 1);
        }
        int st = 0;
        ::waitpid(child, &st, 0);
        CHECK(WIFEXITED(st));
        CHECK(WEXITSTATUS(st) == 0);
    } else {
        MESSAGE("not root: the 403 check for another user is skipped");
    }
    CHECK(d.stop() == 0);
}

namespace {

// The token ids tandemd makes of a completions prompt (BOS as the model asks).
std::vector<int> prompt_ids(const std::string& sock, const std::string& text) {
    const auto r = post(sock, "/tokenize", {{"content", text}});
    REQUIRE(r.status == 200);
    return r.j()["tokens"].get<std::vector<int>>();
}

std::string many_words(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "Lily saw a dog. ";
    return s;
}

// A 400 context_length_exceeded naming `param` whose message has every one of `parts`.
void check_too_long(const http_response& r, const std::string& param, std::initializer_list<std::string> parts) {
    CHECK(r.status == 400);
    const json j = r.j();
    CHECK(j["error"]["code"] == "context_length_exceeded");
    CHECK(j["error"]["param"] == param);
    const std::string m = j["error"]["message"];
    for (const std::string& p : parts) CHECK_MESSAGE(m.find(p) != std::string::npos, "'", p, "' in: ", m);
}

} // namespace

TEST_CASE("context limits: a prompt over the limit is a 400 with both numbers and what to change, on every route") {
    const auto& s = shared_socket(); // n_ctx 2048 (stories260K's training context): prompts up to 2047
    const std::string text = many_words(500);
    const auto ids = prompt_ids(s, text);
    REQUIRE(ids.size() > 2047);
    const std::string n = std::to_string(ids.size()) + " tokens";
    check_too_long(post(s, "/v1/completions", {{"prompt", text}, {"max_tokens", 4}}), "prompt",
                   {"the prompt has " + n, "more than the 2047 this daemon accepts", "n_ctx 2048",
                    "'truncate_prompt_tokens' (1 to 2047)", "shorten it"});
    // token ids as given, and the second of several prompts
    check_too_long(post(s, "/v1/completions", {{"prompt", json::array({json::array({1, 2}), ids})}, {"max_tokens", 4}}),
                   "prompt", {"prompt 1 has " + n, "2047"});
    // chat: the messages as the template renders them
    const json messages = json::array({{{"role", "user"}, {"content", text}}});
    const auto rendered = post(s, "/v1/tandem/apply-template", {{"messages", messages}});
    REQUIRE(rendered.status == 200);
    check_too_long(post(s, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4}}), "messages",
                   {"has " + std::to_string(rendered.j()["tokens"].size()) + " tokens", "2047"});
    check_too_long(post(s, "/v1/embeddings", {{"input", json::array({"Lily", text})}}), "input",
                   {"input 1 has " + n, "2047", "truncate_prompt_tokens"});
    // a prompt that fits with max_tokens past the context: the reply stops at the context's end
    // (finish_reason length), the prompt whole
    const std::vector<int> fits(ids.end() - 2040, ids.end());
    const auto r = post(s, "/v1/completions", {{"prompt", fits}, {"max_tokens", 100}, {"ignore_eos", true}});
    REQUIRE(r.status == 200);
    CHECK(r.j()["usage"]["prompt_tokens"] == 2040);
    CHECK(r.j()["usage"]["completion_tokens"] == 8);
    CHECK(r.j()["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("truncate_prompt_tokens keeps each prompt's last N tokens, as sending them would; usage says what it dropped") {
    const auto& s = shared_socket();
    const std::string text = many_words(500);
    const auto ids = prompt_ids(s, text);
    const int keep = 100;
    const std::vector<int> last(ids.end() - keep, ids.end());
    const int dropped = int(ids.size()) - keep;

    const json ask = {{"max_tokens", 12}, {"temperature", 0}};
    json cut = ask, own = ask;
    cut["prompt"] = text;
    cut["truncate_prompt_tokens"] = keep;
    own["prompt"] = last;
    const auto a = post(s, "/v1/completions", cut);
    const auto b = post(s, "/v1/completions", own);
    REQUIRE(a.status == 200);
    REQUIRE(b.status == 200);
    CHECK(a.j()["choices"][0]["text"] == b.j()["choices"][0]["text"]);
    CHECK(a.j()["usage"]["prompt_tokens"] == keep);
    CHECK(a.j()["usage"]["truncated_prompt_tokens"] == dropped);
    CHECK_FALSE(b.j()["usage"].contains("truncated_prompt_tokens")); // not asked, nothing to say
    // a prompt shorter than N is whole; the field is still there, 0; several prompts add up
    json two = cut;
    two["prompt"] = json::array({text, "Once upon a time"});
    const auto t = post(s, "/v1/completions", two);
    REQUIRE(t.status == 200);
    CHECK(t.j()["usage"]["truncated_prompt_tokens"] == dropped);
    CHECK(t.j()["choices"][1]["text"] == offline_text("Once upon a time", 12));

    // streamed: the usage chunk (include_usage), and each choice's last chunk, say it too
    json streamed = cut;
    streamed["stream"] = true;
    streamed["stream_options"] = {{"include_usage", true}};
    const auto st = post(s, "/v1/completions", streamed);
    REQUIRE(st.status == 200);
    const auto events = sse_events(st.body);
    REQUIRE(events.size() >= 2);
    CHECK(stream_text(events, false) == b.j()["choices"][0]["text"]);
    CHECK(events.back()["usage"]["truncated_prompt_tokens"] == dropped);
    const json& last_choice = events[events.size() - 2]["choices"][0];
    CHECK(last_choice["finish_reason"] == "length");
    CHECK(last_choice["truncated_prompt_tokens"] == dropped);

    // chat: the last N tokens of the rendered messages
    const json messages = json::array({{{"role", "user"}, {"content", text}}});
    const auto rendered = post(s, "/v1/tandem/apply-template", {{"messages", messages}});
    REQUIRE(rendered.status == 200);
    const auto chat_ids = rendered.j()["tokens"].get<std::vector<int>>();
    json chat = ask;
    chat["messages"] = messages;
    chat["truncate_prompt_tokens"] = keep;
    const auto c = post(s, "/v1/chat/completions", chat);
    REQUIRE(c.status == 200);
    json same = ask;
    same["prompt"] = std::vector<int>(chat_ids.end() - keep, chat_ids.end());
    CHECK(c.j()["choices"][0]["message"]["content"] == post(s, "/v1/completions", same).j()["choices"][0]["text"]);
    CHECK(c.j()["usage"]["truncated_prompt_tokens"] == int(chat_ids.size()) - keep);

    // embeddings: the same vector as the last N tokens given as ids
    const auto e = post(s, "/v1/embeddings", {{"input", text}, {"truncate_prompt_tokens", keep}});
    const auto f = post(s, "/v1/embeddings", {{"input", last}});
    REQUIRE(e.status == 200);
    REQUIRE(f.status == 200);
    CHECK(e.j()["data"][0]["embedding"] == f.j()["data"][0]["embedding"]);
    CHECK(e.j()["usage"]["prompt_tokens"] == keep);
    CHECK(e.j()["usage"]["truncated_prompt_tokens"] == dropped);

    // refused values name the field; it does not go with documents
    for (const json& v : {json(0), json(-1), json(2048), json("100"), json(1.5)}) {
        CAPTURE(v.dump());
        json bad = cut;
        bad["truncate_prompt_tokens"] = v;
        const auto r = post(s, "/v1/completions", bad);
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == "truncate_prompt_tokens");
        const auto r2 = post(s, "/v1/embeddings", {{"input", "Lily"}, {"truncate_prompt_tokens", v}});
        CHECK(r2.status == 400);
        CHECK(r2.j()["error"]["param"] == "truncate_prompt_tokens");
    }
    CHECK(post(s, "/v1/completions", {{"prompt", "x"}, {"truncate_prompt_tokens", 2047}}).status == 200);
    const auto docs = post(s, "/v1/chat/completions", {{"messages", messages},
                                                       {"documents", {{{"text", "Lily saw a dog."}}}},
                                                       {"truncate_prompt_tokens", keep}});
    CHECK(docs.status == 400);
    CHECK(docs.j()["error"]["param"] == "truncate_prompt_tokens");
}

TEST_CASE("context limits: n_ctx capped by the KV memory, logged; an explicit n_ctx grows the pool, above training is refused") {
    // kv_pages 8 of 16 tokens: the context is 128 tokens, not the training 2048, and the log says why
    daemon_process a;
    a.log = scratch().file("kv-cap.log");
    a.start(scratch().file("kv-cap.sock"), {"--set", "kv_pages=8"}, {"TANDEM_LOG=info"});
    REQUIRE(a.wait_ready());
    auto m = request(a.sock, "GET", "/v1/models");
    REQUIRE(m.status == 200);
    CHECK(m.j()["data"][0]["meta"]["n_ctx"] == 128);
    CHECK(m.j()["data"][0]["meta"]["n_ctx_train"] == 2048);
    auto st = request(a.sock, "GET", "/v1/tandem/status").j();
    CHECK(st["model"]["meta"]["n_ctx"] == 128);
    CHECK(st["kv_pages_total"] == 8);
    CHECK(st["limits"]["max_prompt_tokens"] == 127);
    const std::string text = many_words(40);
    const auto ids = prompt_ids(a.sock, text);
    REQUIRE(ids.size() > 127);
    check_too_long(post(a.sock, "/v1/completions", {{"prompt", text}}), "prompt",
                   {"has " + std::to_string(ids.size()) + " tokens", "more than the 127", "n_ctx 128 less one",
                    "raise n_ctx in tandemd.conf (the model's training context is 2048)"});
    CHECK(a.stop() == 0);
    {
        std::ifstream in(a.log);
        const std::string log((std::istreambuf_iterator<char>(in)), {});
        INFO(log);
        CHECK(log.find("n_ctx 128: the model's training context is 2048 tokens, but kv_pages 8 holds 128 tokens") !=
              std::string::npos);
        CHECK(log.find("raise kv_cache_mb (or kv_pages), or set n_ctx") != std::string::npos);
    }

    // an explicit n_ctx the pool cannot hold: the pool grows to one full context; max_prompt_tokens binds
    daemon_process b;
    b.start(scratch().file("kv-grow.sock"),
            {"--set", "kv_pages=8", "--set", "n_ctx=512", "--set", "max_prompt_tokens=100"});
    REQUIRE(b.wait_ready());
    st = request(b.sock, "GET", "/v1/tandem/status").j();
    CHECK(st["model"]["meta"]["n_ctx"] == 512);
    CHECK(st["kv_pages_total"] == 32);
    CHECK(st["limits"]["max_prompt_tokens"] == 100);
    check_too_long(post(b.sock, "/v1/completions", {{"prompt", text}}), "prompt",
                   {"more than the 100 this daemon accepts", "max_prompt_tokens in tandemd.conf; the context is 512",
                    "raise max_prompt_tokens in tandemd.conf", "'truncate_prompt_tokens' (1 to 100)"});
    CHECK(post(b.sock, "/v1/completions", {{"prompt", text}, {"truncate_prompt_tokens", 101}}).status == 400);
    const auto r = post(b.sock, "/v1/completions", {{"prompt", text}, {"truncate_prompt_tokens", 100}, {"max_tokens", 2}});
    CHECK(r.status == 200);
    CHECK(r.j()["usage"]["prompt_tokens"] == 100);
    CHECK(b.stop() == 0);

    // past the training context: the daemon does not start, and says what to set
    daemon_process c;
    c.log = scratch().file("n-ctx-train.log");
    c.start(scratch().file("n-ctx-train.sock"), {"--set", "n_ctx=4096"});
    CHECK(c.wait_exit(30) == 1);
    std::ifstream in(c.log);
    const std::string log((std::istreambuf_iterator<char>(in)), {});
    INFO(log);
    CHECK(log.find("n_ctx 4096 (--set) is more than the model's training context, 2048 tokens") != std::string::npos);
    CHECK(log.find("set n_ctx to 2048 or less") != std::string::npos);
}
