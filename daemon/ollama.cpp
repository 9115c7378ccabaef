// Ollama's replies (daemon/ollama.hpp): chat and generate as NDJSON lines or one object, the
// model routes and embeddings.
#include "daemon/ollama.hpp"

#include "daemon/embedding.hpp"
#include "daemon/fields.hpp"
#include "daemon/model_host.hpp"
#include "daemon/state.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace tandem::daemon {
namespace {

using clock_type = std::chrono::steady_clock;

int64_t nanos(clock_type::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); }

// RFC 3339 with nanoseconds, as Ollama writes created_at.
std::string now_rfc3339() {
    const auto now = std::chrono::system_clock::now();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count() % 1000000000;
    return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:09d}Z", fmt::gmtime(std::chrono::system_clock::to_time_t(now)), ns);
}

json tool_calls_json(const choice_state& c) {
    json calls = json::array();
    for (const auto& call : c.calls) {
        json args = json::parse(call.arguments, nullptr, false);
        if (!args.is_object()) args = json::object();
        calls.push_back({{"function", {{"name", call.name}, {"arguments", args}}}});
    }
    return calls;
}

class ollama_encoder final : public encoder {
public:
    ollama_encoder(bool generate, clock_type::time_point received) : generate_(generate), received_(received) {}

    std::string content_type() const override { return "application/x-ndjson"; }

    std::string step(completion_view& v, size_t, const choice_step& s) override {
        if (first_token_ == clock_type::time_point{}) first_token_ = clock_type::now();
        if (!v.plan.stream) return {};
        const reply_delta& d = s.delta;
        if (d.content.empty() && d.reasoning.empty()) return {}; // (calls come whole, on the last line)
        return line(piece(v, d.content, d.reasoning));
    }

    std::string finish(completion_view& v, size_t i, const choice_step& s) override {
        if (!v.plan.stream) return {};
        return step(v, i, s);
    }

    std::string close(completion_view& v) override {
        json last = piece(v, "", "");
        if (!generate_ && !v.choices[0].calls.empty()) last["message"]["tool_calls"] = tool_calls_json(v.choices[0]);
        add_stats(last, v.choices[0]);
        return line(last);
    }

    json whole(completion_view& v) override {
        const choice_state& c = v.choices[0];
        json out = piece(v, c.content, c.reasoning);
        if (!generate_ && !c.calls.empty()) out["message"]["tool_calls"] = tool_calls_json(c);
        add_stats(out, c);
        return out;
    }

    reply error(const api_error& e) override { return ollama_error(e); }

private:
    json piece(const completion_view& v, const std::string& content, const std::string& thinking) const {
        json j = {{"model", model_name(v)}, {"created_at", now_rfc3339()}};
        if (generate_) {
            j["response"] = content;
            if (!thinking.empty()) j["thinking"] = thinking;
        } else {
            j["message"] = {{"role", "assistant"}, {"content", content}};
            if (!thinking.empty()) j["message"]["thinking"] = thinking;
        }
        j["done"] = false;
        return j;
    }

    static std::string model_name(const completion_view& v) {
        return v.model.find(':') == std::string::npos ? v.model + ":latest" : v.model;
    }

    void add_stats(json& j, const choice_state& c) const {
        const auto end = clock_type::now();
        const auto first = first_token_ == clock_type::time_point{} ? end : first_token_;
        j["done"] = true;
        j["done_reason"] = c.finish_reason == "length" ? "length" : c.finish_reason == "error" ? "error" : "stop";
        j["total_duration"] = nanos(end - received_);
        j["load_duration"] = 0;
        j["prompt_eval_count"] = c.n_prompt;
        j["prompt_eval_duration"] = nanos(first - received_);
        j["eval_count"] = c.n_generated;
        j["eval_duration"] = nanos(end - first);
    }

    static std::string line(const json& j) { return dump(j) + "\n"; }

    bool generate_;
    clock_type::time_point received_;
    clock_type::time_point first_token_{};
};

json details_json(const model_state& ms) {
    const auto& c = ms.bundle.cfg;
    return {{"parent_model", ""},
            {"format", "gguf"},
            {"family", c.arch},
            {"families", json::array({c.arch})},
            {"parameter_size", ""},
            {"quantization_level", ""}};
}

json model_entry(const model_state& ms) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(ms.path, ec);
    return {{"name", ollama_name(ms)},
            {"model", ollama_name(ms)},
            {"size", ec ? 0 : int64_t(size)},
            {"digest", ""},
            {"details", details_json(ms)}};
}

} // namespace

std::unique_ptr<encoder> make_ollama_encoder(bool generate, clock_type::time_point received) {
    return std::make_unique<ollama_encoder>(generate, received);
}

reply ollama_error(const api_error& e) {
    reply r = reply::of(e);
    std::string message = e.message;
    if (!e.param.empty() && message.find(e.param) == std::string::npos) message += " (" + e.param + ")";
    r.body = dump(json{{"error", message}});
    return r;
}

std::string ollama_name(const model_state& ms) {
    return ms.id.find(':') == std::string::npos ? ms.id + ":latest" : ms.id;
}

reply ollama_tags(const exchange& x) {
    json models = json::array();
    if (!x.st.models) models.push_back(model_entry(model_of(x)));
    else {
        const auto loaded = x.st.models->loaded();
        for (const json& c : x.st.models->cards()) { // every local model, loaded or not
            if (c["state"] == "upstream") continue;
            const std::string id = c["id"].get<std::string>();
            const auto it = std::find_if(loaded.begin(), loaded.end(), [&](const auto& ms) { return ms->id == id; });
            if (it != loaded.end()) {
                models.push_back(model_entry(**it));
                continue;
            }
            const std::string name = id.find(':') == std::string::npos ? id + ":latest" : id;
            models.push_back({{"name", name}, {"model", name}, {"size", c["memory_bytes"]}, {"digest", ""},
                              {"details", {{"parent_model", ""}, {"format", "gguf"}}}});
        }
    }
    for (json& m : models) m["modified_at"] = now_rfc3339();
    return reply::of_json({{"models", std::move(models)}});
}

reply ollama_ps(const exchange& x) {
    std::vector<std::shared_ptr<model_state>> loaded;
    if (x.st.models) loaded = x.st.models->loaded();
    json models = json::array();
    const auto add = [&](const model_state& ms) {
        json m = model_entry(ms);
        m["expires_at"] = "2262-04-11T23:47:16.854775807Z"; // (Go's latest time, as Ollama writes keep_alive -1)
        m["size_vram"] = 0;
        models.push_back(std::move(m));
    };
    if (!x.st.models) add(model_of(x));
    for (const auto& ms : loaded) add(*ms);
    return reply::of_json({{"models", std::move(models)}});
}

reply ollama_version(const exchange&) { return reply::of_json({{"version", TANDEM_VERSION}}); }

reply ollama_show(const exchange& x) {
    auto parsed = parse_request_body(x.req.http.body(), x.st.cfg.max_json_depth);
    if (auto* e = std::get_if<api_error>(&parsed)) return ollama_error(*e);
    const json& body = std::get<json>(parsed);
    if (auto e = check_keys(body, "", {"model", "name", "verbose"})) return ollama_error(*e);
    const model_state& ms = model_of(x);
    const json name = body.contains("model") ? body["model"] : body.value("name", json());
    if (!name.is_string()) return ollama_error(bad("'model' is required", "model"));
    if (name != ms.id && name != ollama_name(ms)) {
        api_error e = bad(fmt::format("model '{}' not found", name.get<std::string>()), "model");
        e.status = 404;
        return ollama_error(e);
    }
    json caps = json::array({"completion", "tools"});
    if (ms.reasoning) caps.push_back("thinking");
    if (!embeddings_unavailable(ms)) caps.push_back("embedding");
    const auto& c = ms.bundle.cfg;
    return reply::of_json({{"modelfile", ""},
                           {"parameters", ""},
                           {"template", ms.template_source},
                           {"details", details_json(ms)},
                           {"model_info",
                            {{"general.architecture", c.arch},
                             {c.arch + ".context_length", c.n_ctx_train},
                             {c.arch + ".embedding_length", c.n_embd},
                             {c.arch + ".block_count", c.n_layer}}},
                           {"capabilities", caps},
                           {"modified_at", now_rfc3339()}});
}

reply ollama_unsupported(const exchange& x) {
    api_error e{501,
                fmt::format("{} is not served by tandemd: it serves the one model it loaded (tandemd.conf's model); "
                            "manage model files with `tandem` and the daemon's config",
                            x.req.path),
                "not_implemented"};
    return ollama_error(e);
}

handler_fn ollama_embed(bool legacy) {
    return [legacy](exchange& x) -> asio::awaitable<bool> {
        std::variant<embedding_plan, api_error> parsed =
            co_await off_io(x.st.blocking.get(), [&]() -> std::variant<embedding_plan, api_error> {
                auto body = parse_request_body(x.req.http.body(), x.st.cfg.max_json_depth);
                if (auto* e = std::get_if<api_error>(&body)) return *e;
                const json& b = std::get<json>(body);
                const model_state& ms = model_of(x);
                if (legacy) TANDEM_TRY(check_keys(b, "", {"model", "prompt", "options", "keep_alive"}, true));
                else TANDEM_TRY(check_keys(b, "", {"model", "input", "truncate", "keep_alive"}, true));
                TANDEM_TRY(read_keep_alive(b));
                // (Ollama's options are sampling and context settings: none applies to an
                // embedding, so any is named rather than dropped)
                if (const auto o = b.find("options"); o != b.end() && !o->is_null()) {
                    if (!o->is_object()) return bad("'options' must be an object", "options");
                    if (!o->empty())
                        return bad(fmt::format("'options.{}' does not apply to embeddings", o->begin().key()),
                                   "options." + o->begin().key());
                }
                const json model = b.value("model", json());
                if (!model.is_string()) return bad("'model' is required", "model");
                if (model != ms.id && model != ollama_name(ms)) {
                    api_error e = bad(fmt::format("model '{}' not found", model.get<std::string>()), "model");
                    e.status = 404;
                    return e;
                }
                json openai = {{"input", legacy ? b.value("prompt", json()) : b.value("input", json())}};
                bool truncate = true;
                if (!legacy) TANDEM_TRY(read_bool(b, "truncate", truncate));
                if (truncate) openai["truncate_prompt_tokens"] = ms.max_prompt_tokens;
                auto plan = parse_embeddings(openai, ms, x.st.cfg);
                if (auto* e = std::get_if<api_error>(&plan)) {
                    if (e->param.starts_with("input") && legacy) e->param = "prompt";
                }
                return plan;
            });
        const auto fail = [&](const api_error& e) -> asio::awaitable<bool> {
            x.st.met.request_done(x.label, e.status);
            const reply r = ollama_error(e);
            co_return co_await x.out.send(r);
        };
        if (auto* e = std::get_if<api_error>(&parsed)) co_return co_await fail(*e);
        const embedding_plan& plan = std::get<embedding_plan>(parsed);
        auto vectors = co_await embed(x, plan.inputs, plan.priority);
        if (auto* e = std::get_if<api_error>(&vectors)) {
            if (e->status == 499) {
                x.st.met.request_done(x.label, 499);
                co_return false;
            }
            co_return co_await fail(*e);
        }
        int64_t n_tokens = 0;
        for (const auto& in : plan.inputs) n_tokens += int64_t(in.size());
        x.st.met.tokens(n_tokens, 0);
        x.st.met.request_done(x.label, 200);
        auto& v = std::get<0>(vectors);
        json out;
        if (legacy) {
            out = {{"embedding", v.empty() ? json::array() : json(v[0])}};
        } else {
            out = {{"model", ollama_name(model_of(x))},
                   {"embeddings", v},
                   {"total_duration", nanos(clock_type::now() - x.req.received)},
                   {"load_duration", 0},
                   {"prompt_eval_count", n_tokens}};
        }
        const reply r = reply::of_json(out);
        co_return co_await x.out.send(r);
    };
}

} // namespace tandem::daemon
