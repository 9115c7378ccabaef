// libFuzzer target for the API's request parsers, structure-aware: the input is a program of
// edits to one of the valid requests of tests/api_requests.hpp (every route, every documented
// field), applied to the parsed value, so that every mutation reaches the field readers:
// a value swapped for one of another type (null, booleans, huge and negative numbers, floats
// where integers go, strings, arrays, objects), nesting deepened past max_json_depth, keys
// dropped or added, subtrees copied elsewhere. The result is parsed as tandemd parses a body
// (parse_request_body, then parse_generation / parse_embeddings, or the route's own handler
// for the other routes) against stories260K's model state. What must hold: nothing throws; every
// refusal is a 4xx api_error with a message and, for a field, a param that names a place the
// body has (or one of its parents, or a required one it lacks).
#include "runtime/prelude.hpp"

#include "daemon/embedding.hpp"
#include "daemon/fields.hpp"
#include "daemon/openai_request.hpp"
#include "daemon/routes.hpp"
#include "daemon/server.hpp"
#include "runtime/log.hpp"
#include "tests/api_requests.hpp"
#include "tests/test_util.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using namespace tandem::daemon;
using tandem::test::json;

daemon_state* st = nullptr; // for the lifetime of the process
std::vector<tandem::test::base_request>* bases = nullptr;

void require(bool ok, const char* what, const std::string& body, const std::string& detail = {}) {
    if (ok) return;
    std::fprintf(stderr, "fuzz_json_api: %s (%s)\n--- body ---\n%.*s\n", what, detail.c_str(),
                 int(std::min<size_t>(body.size(), 4096)), body.c_str());
    std::abort();
}

// Reads the edit program.
struct reader {
    const uint8_t* p;
    size_t n;
    uint8_t next() { return n ? (--n, *p++) : 0; }
    bool more() const { return n > 0; }
};

// A value of another kind, from the program.
json replacement(reader& r) {
    switch (r.next() % 12) {
    case 0: return nullptr;
    case 1: return r.next() % 2 == 0;
    case 2: return int64_t(r.next()) - 128;
    case 3: return 1e300;
    case 4: return -9223372036854775807LL - 1;
    case 5: return 18446744073709551615ULL;
    case 6: return 0.5 + r.next();
    case 7: return std::string(r.next() % 8, char('a' + r.next() % 26));
    case 8: return json::array({r.next()});
    case 9: return json::object({{"k", r.next()}});
    case 10: return "\xF0\x9F\x98\x80<|im_end|>\n";
    default: return std::string(size_t(r.next()) * 16, '[');
    }
}

// The value at a place picked from the program (the whole body for an empty pointer).
json::json_pointer pick(reader& r, const json& body) {
    std::vector<std::pair<std::string, json::json_pointer>> paths;
    tandem::test::paths_of(body, "", paths);
    if (paths.empty()) return json::json_pointer();
    return paths[r.next() % paths.size()].second;
}

void edit(reader& r, json& body) {
    const json::json_pointer at = pick(r, body);
    switch (r.next() % 6) {
    case 0: // another kind of value
        body[at] = replacement(r);
        break;
    case 1: { // nested deeper, past the limit or just under it
        const int depth = r.next() % 2 ? 70 : int(r.next() % 60);
        json v = body[at];
        for (int i = 0; i < depth; ++i) v = json::array({std::move(v)});
        body[at] = std::move(v);
        break;
    }
    case 2: // dropped
        if (!at.empty()) body[at.parent_pointer()].is_object() ? (void)body[at.parent_pointer()].erase(at.back())
                                                                : (void)(body[at] = nullptr);
        break;
    case 3: // a key nobody knows beside it
        if (body[at].is_object()) body[at]["x_unknown_" + std::to_string(r.next())] = replacement(r);
        break;
    case 4: { // a copy of another subtree
        const json::json_pointer from = pick(r, body);
        body[at] = json(body[from]);
        break;
    }
    default: // a string's length as a number, a number as its text
        if (body[at].is_string()) body[at] = body[at].get<std::string>().size();
        else if (body[at].is_number()) body[at] = body[at].dump();
        break;
    }
}

// A responder that keeps the reply a handler sends (the simple routes answer at once).
class capture final : public responder {
public:
    explicit capture(asio::io_context& io) : io_(io) {}
    std::optional<reply> got;
    asio::any_io_executor executor() override { return io_.get_executor(); }
    asio::awaitable<bool> send(const reply& r, bool) override {
        got = r;
        co_return true;
    }
    asio::awaitable<bool> open_stream(std::string_view) override { co_return false; }
    asio::awaitable<bool> send_piece(const std::string&) override { co_return false; }
    asio::awaitable<bool> close_stream() override { co_return false; }
    void watch_peer(std::shared_ptr<generation_channel>) override {}
    void current(std::shared_ptr<generation_channel>) override {}
    bool closed() const override { return false; }

private:
    asio::io_context& io_;
};

// The reply of the route's own handler for POST `route` with `body`.
std::optional<reply> answer(const std::string& route, const std::string& body) {
    const auto rows = match_routes(route);
    const auto row = std::find_if(rows.begin(), rows.end(), [](const route_match& m) { return m.row->method == "POST"; });
    if (row == rows.end()) return std::nullopt;
    http::request<http::string_body> req{http::verb::post, route, 11};
    req.body() = body;
    const principal who{"uid:0", true};
    const std::string no_upload;
    const request_view view{req, "POST", route, {}, row->params, who, no_upload, std::chrono::steady_clock::now()};
    asio::io_context io;
    capture out(io);
    exchange x{view, out, *st, std::string(row->row->label)};
    std::exception_ptr thrown;
    asio::co_spawn(io, row->row->handle(x), [&](std::exception_ptr e, bool) { thrown = e; });
    io.run();
    if (thrown) std::rethrow_exception(thrown); // (a crash: libFuzzer reports it)
    return out.got;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    tandem::init_logging("off");
    config cfg;
    const std::pair<const char*, std::string> settings[] = {
        {"model", tandem::test::model_path("stories260K.gguf")},
        {"placement", "local"},
        {"threads", "1"},
        {"n_ctx", "512"},
        {"max_n", "4"},
        {"draft_tokens", "2"},
    };
    for (const auto& [key, value] : settings)
        if (auto err = cfg.set(key, value)) {
            std::fprintf(stderr, "fuzz_json_api: %s: %s\n", key, err->c_str());
            std::abort();
        }
    st = new daemon_state;
    st->cfg = cfg;
    const std::atomic<bool> never{false};
    st->ms = load_model_state(cfg, "", never);
    bases = new std::vector<tandem::test::base_request>(tandem::test::base_requests());
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    reader r{data + 1, size - 1};
    const tandem::test::base_request& base = (*bases)[data[0] % bases->size()];
    tandem::test::json body = base.body;
    for (int i = 0; i < 8 && r.more(); ++i) edit(r, body);
    const std::string text = body.dump();
    const model_state& ms = *st->ms;
    std::optional<api_error> refused;
    auto parsed = parse_request_body(text, st->cfg.max_json_depth);
    if (auto* e = std::get_if<api_error>(&parsed)) {
        refused = *e;
    } else if (base.route == "/v1/chat/completions" || base.route == "/v1/completions") {
        auto plan = parse_generation(std::get<0>(parsed), base.route == "/v1/chat/completions", ms, st->cfg);
        if (auto* e = std::get_if<api_error>(&plan)) refused = *e;
    } else if (base.route == "/v1/embeddings") {
        auto plan = parse_embeddings(std::get<0>(parsed), ms, st->cfg);
        if (auto* e = std::get_if<api_error>(&plan)) refused = *e;
    } else {
        const std::optional<reply> rep = answer(base.route, text);
        require(rep.has_value(), "a simple route gave no reply", text);
        require(rep->status == 200 || (rep->status >= 400 && rep->status < 500), "a simple route failed", text,
                std::to_string(rep->status) + " " + rep->body);
    }
    if (refused) {
        require(refused->status >= 400 && refused->status < 500, "a refusal that is not a 4xx", text,
                std::to_string(refused->status));
        require(!refused->message.empty(), "a refusal without a message", text);
        // (or of the request it was made from: a required field dropped is named; or a key the
        // edited body now needs, of an object it has: a message whose role became "tool" lacks
        // its tool_call_id)
        const size_t dot = refused->param.rfind('.');
        const bool needed_key =
            dot != std::string::npos && tandem::test::names_a_place(refused->param.substr(0, dot), body);
        require(needed_key || tandem::test::names_a_place(refused->param, body) ||
                    tandem::test::names_a_place(refused->param, base.body),
                "a refusal's param names no place of the body", text, refused->param + ": " + refused->message);
    }
    return 0;
}
