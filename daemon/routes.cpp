// The route table and its handlers (daemon/routes.hpp).
#include "daemon/routes.hpp"

#include "daemon/anthropic.hpp"
#include "daemon/batch_jobs.hpp"
#include "daemon/completion.hpp"
#include "daemon/embedding.hpp"
#include "daemon/model_host.hpp"
#include "daemon/openai_fields.hpp"
#include "daemon/ollama.hpp"
#include "daemon/openai_request.hpp"
#include "daemon/responses.hpp"
#include "daemon/state.hpp"
#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

namespace tandem::daemon {
namespace {

using reply_fn = std::function<reply(exchange&)>;

// A handler whose reply is ready at once (counted under the route's label).
handler_fn simple(reply_fn fn) {
    return [fn = std::move(fn)](exchange& x) -> asio::awaitable<bool> {
        const reply r = fn(x);
        x.st.met.request_done(x.label, r.status);
        co_return co_await x.out.send(r);
    };
}

// The same, computed off the io thread (the disk, tokenizing).
handler_fn blocking(reply_fn fn) {
    return [fn = std::move(fn)](exchange& x) -> asio::awaitable<bool> {
        const reply r = co_await off_io(x.st.blocking.get(), [&] { return fn(x); });
        x.st.met.request_done(x.label, r.status);
        co_return co_await x.out.send(r);
    };
}

// A body the route reads as JSON: the object, or the 400 it gets.
std::variant<json, api_error> body_of(exchange& x) {
    return parse_request_body(x.req.http.body(), x.st.cfg.max_json_depth);
}

reply health(exchange& x) {
    if (x.st.stopping) return reply{503, "application/json", R"({"status":"stopping"})", 5};
    if (!x.st.ms && !x.st.serving) return reply{503, "application/json", R"({"status":"loading"})", 2};
    return reply{200, "application/json", R"({"status":"ok"})", 0};
}

reply metrics_text(exchange& x) {
    const model_state* ms = x.st.ms.get();
    engine_stats es;
    if (ms) es = ms->eng->stats();
    std::string text = x.st.met.render(ms ? &es : nullptr);
    if (ms && ms->guides) render_guide_metrics(text, ms->guides->stats());
    if (x.st.models) x.st.models->render_metrics(text); // every model's state, by its name
    return reply{200, "text/plain; version=0.0.4; charset=utf-8", std::move(text), 0};
}

reply model(exchange& x) {
    const std::string& id = x.req.params.at("id");
    if (x.st.models) {
        if (auto card = x.st.models->card(id)) return reply::of_json(*card);
        return reply::of(x.st.models->not_found(id));
    }
    if (id == model_of(x).id) return reply::of_json(model_card(model_of(x), x.st));
    api_error e = bad(fmt::format("The model '{}' does not exist", id), "model");
    e.status = 404;
    e.code = "model_not_found";
    return reply::of(e);
}

reply status(exchange& x) {
    const daemon_state& st = x.st;
    const model_state* ms = st.ms.get();
    const auto tot = st.met.totals();
    json j = {{"status", st.stopping ? "stopping" : ms || st.serving ? "ready" : "loading"},
              {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - st.started).count()},
              {"requests_total", tot.n_requests},
              {"prompt_tokens_total", tot.n_prompt_tokens},
              {"completion_tokens_total", tot.n_completion_tokens}};
    if (st.models) j["models"] = st.models->status(); // every model: state, memory, requests
    if (!ms) return reply::of_json(j);
    const engine_stats es = ms->eng->stats();
    j["model"] = model_card(*ms, st);
    j["placement"] = {
        {"policy", st.cfg.placement}, {"prefill", ms->prefill_device}, {"decode", ms->decode_device}, {"workers", st.cfg.workers}};
    j["threads"] = ms->threads;
    j["running"] = es.n_running;
    j["waiting"] = es.n_waiting;
    j["kv_pages_used"] = es.n_pages_used;
    j["kv_pages_peak"] = es.n_pages_peak;
    j["kv_pages_total"] = es.n_pages_total;
    j["kv_page_size"] = es.page_size;
    j["kv_tokens_stored"] = es.n_kv_tokens;
    j["kv_pages_cached"] = es.n_pages_cached;
    if (ms->pool) // the shared pool's file (worker processes): where its memory is, and how much
        j["kv_pool"] = {{"path", ms->pool->path()}, {"bytes", ms->pool->bytes()}, {"persist", !ms->unlink_pool}};
    j["prefix_cache_hit_tokens"] = es.n_prefix_hits;
    j["preemptions"] = es.n_preemptions;
    j["worker_restarts"] = es.n_worker_restarts;
    j["kv_device_upload_bytes"] = es.n_kv_upload_bytes;
    j["kv_device_kept_bytes"] = es.n_kv_kept_bytes;
    j["speculative"] = {{"draft_tokens", st.cfg.speculative_tokens()},
                        {"method", st.cfg.speculative_tokens() == 0 ? "off"
                                   : st.cfg.draft_model.empty()     ? "ngram"
                                                                    : "draft"},
                        {"draft_model", st.cfg.draft_model.empty() ? json(nullptr) : json(st.cfg.draft_model)},
                        {"draft_device", es.draft_device.empty() ? json(nullptr) : json(es.draft_device)},
                        {"drafted_tokens", es.n_draft_tokens},
                        {"accepted_tokens", es.n_accepted_tokens}};
    j["limits"] = {{"max_running", st.cfg.engine.sched.max_running},
                   {"max_waiting", st.cfg.engine.max_waiting},
                   {"max_prompt_tokens", ms->max_prompt_tokens},
                   {"max_tokens", ms->max_tokens_limit},
                   {"max_body_bytes", st.cfg.max_body_bytes}};
    return reply::of_json(j);
}

// POST /v1/tandem/models/{id}/load: the session loaded it (held for this request, waiting up to
// load_wait_s); it stays for its keep_alive.
reply load_model(exchange& x) {
    const std::string& id = x.req.params.at("id");
    if (!x.st.models) return reply::of_json(model_card(model_of(x), x.st));
    auto card = x.st.models->card(id);
    if (!card) return reply::of(x.st.models->not_found(id));
    return reply::of_json(*card);
}

// POST /v1/tandem/models/{id}/unload: unloaded now, or when its running requests end.
reply unload_model(exchange& x) {
    const std::string& id = x.req.params.at("id");
    if (!x.st.models) return reply::of(bad("this daemon serves one model and does not unload it", "id"));
    if (auto e = x.st.models->unload(id)) return reply::of(*e);
    return reply::of_json(*x.st.models->card(id));
}

reply tokenize(exchange& x) {
    auto parsed = body_of(x);
    if (auto* e = std::get_if<api_error>(&parsed)) return reply::of(*e);
    const json& j = std::get<json>(parsed);
    if (auto e = check_keys(j, "", {"content", "text", "add_special", "parse_special"})) return reply::of(*e);
    if (j.contains("content") && j.contains("text")) return reply::of(bad("give 'content' or 'text', not both", "text"));
    const char* key = j.contains("text") ? "text" : "content";
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return reply::of(bad(fmt::format("'{}' must be a string", key), key));
    const std::string& text = it->get_ref<const std::string&>();
    bool add_special = true, parse_special = false;
    if (auto e = read_bool(j, "add_special", add_special)) return reply::of(*e);
    if (auto e = read_bool(j, "parse_special", parse_special)) return reply::of(*e);
    const auto ids = model_of(x).bundle.tok->encode(text, add_special, parse_special);
    return reply::of_json({{"tokens", ids}, {"count", ids.size()}});
}

reply detokenize(exchange& x) {
    auto parsed = body_of(x);
    if (auto* e = std::get_if<api_error>(&parsed)) return reply::of(*e);
    const json& j = std::get<json>(parsed);
    if (auto e = check_keys(j, "", {"tokens"})) return reply::of(*e);
    const tokenizer& tok = *model_of(x).bundle.tok;
    auto it = j.find("tokens");
    if (it == j.end() || !it->is_array() || !all_ints(*it))
        return reply::of(bad("'tokens' must be an array of token ids", "tokens"));
    std::vector<token_id> ids;
    for (size_t i = 0; i < it->size(); ++i) {
        const json& v = (*it)[i];
        const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : v.get<int64_t>();
        if (id < 0 || id >= tok.n_vocab())
            return reply::of(bad(fmt::format("token id {} is out of range", v.dump()), place("tokens", i)));
        ids.push_back(token_id(id));
    }
    return reply::of_json({{"content", tok.decode(ids)}});
}

reply apply_template(exchange& x) {
    auto parsed = body_of(x);
    if (auto* e = std::get_if<api_error>(&parsed)) return reply::of(*e);
    const json& j = std::get<json>(parsed);
    if (auto e = check_keys(j, "", {"messages", "tools", "tool_choice", "add_generation_prompt", "chat_template_kwargs"}))
        return reply::of(*e);
    const model_state& ms = model_of(x);
    std::vector<chat_message> messages;
    if (auto e = read_messages(j, messages)) return reply::of(*e);
    tools_request tools;
    if (auto e = read_tools(j, tools)) return reply::of(*e);
    bool add_gen = true;
    if (auto e = read_bool(j, "add_generation_prompt", add_gen)) return reply::of(*e);
    nlohmann::ordered_json kwargs;
    if (auto e = read_template_kwargs(j, kwargs)) return reply::of(*e);
    const std::string text = ms.tmpl.render(
        messages, add_gen, tools.active() ? std::span(tools.defs) : std::span<const std::string>{}, &kwargs);
    return reply::of_json({{"prompt", text},
                           {"tokens", ms.bundle.tok->encode(text, false, true)},
                           {"template", std::string(name_of(ms.tmpl.family()))},
                           {"renderer", ms.tmpl.renderer_name()},
                           {"stop", ms.tmpl.stop_strings()}});
}

// POST /v1/chat/completions and /v1/completions: parsed and planned off the io thread (the
// chat template, tokenizing up to max_body_bytes of text and compiling a constraint would
// stall every other client), then the completion handler.
handler_fn openai_generation(bool chat) {
    return [chat](exchange& x) -> asio::awaitable<bool> {
        auto parsed = co_await off_io(x.st.blocking.get(), [&]() -> std::variant<generation_plan, api_error> {
            auto body = body_of(x);
            if (auto* e = std::get_if<api_error>(&body)) return *e;
            return parse_generation(std::get<json>(body), chat, model_of(x), x.st.cfg);
        });
        if (auto* e = std::get_if<api_error>(&parsed)) {
            x.st.met.request_done(x.label, e->status);
            const reply r = reply::of(*e);
        co_return co_await x.out.send(r);
        }
        const auto enc = make_openai_encoder(chat);
        co_return co_await run_completion(x, x.label, chat ? "chatcmpl" : "cmpl",
                                          std::move(std::get<generation_plan>(parsed)), *enc);
    };
}

// POST /v1/messages: Anthropic's Messages API through the completion handler.
handler_fn anthropic_messages() {
    surface s;
    s.parse = [](const json& body, const exchange& x) -> std::variant<parsed_request, api_error> {
        auto req = parse_anthropic(body, model_of(x), x.st.cfg);
        if (auto* e = std::get_if<api_error>(&req)) return *e;
        auto enc = make_anthropic_encoder(std::get<generation_request>(req).base.stop);
        return parsed_request{std::move(std::get<generation_request>(req)), std::move(enc)};
    };
    s.error = anthropic_error;
    s.id_prefix = "msg";
    return generation_route(std::move(s));
}

// POST /v1/messages/count_tokens: the prompt's tokens as the chat template renders the request.
reply anthropic_count_tokens(exchange& x) {
    auto body = body_of(x);
    if (auto* e = std::get_if<api_error>(&body)) return anthropic_error(*e);
    const model_state& ms = model_of(x);
    auto parsed = parse_anthropic(std::get<json>(body), ms, x.st.cfg, true);
    if (auto* e = std::get_if<api_error>(&parsed)) return anthropic_error(*e);
    const generation_request& req = std::get<generation_request>(parsed);
    std::string text = ms.tmpl.render(req.messages, true,
                                      req.tools.active() ? std::span(req.tools.defs) : std::span<const std::string>{});
    if (ms.reasoning && req.reasoning.enable == false && ms.reasoning->can_disable &&
        start_of(*ms.reasoning, text) != reasoning_start::content)
        text += ms.reasoning->disabled_suffix();
    return reply::of_json({{"input_tokens", ms.bundle.tok->encode(text, false, true).size()}});
}

// POST /v1/responses: OpenAI's Responses API through the completion handler.
handler_fn openai_responses() {
    surface s;
    s.parse = [](const json& body, const exchange& x) -> std::variant<parsed_request, api_error> {
        responses_context ctx;
        auto req = parse_responses(body, model_of(x), x.st.cfg, x.st.responses.get(), x.req.who, ctx);
        if (auto* e = std::get_if<api_error>(&req)) return *e;
        ctx.store_to = x.st.responses;
        return parsed_request{std::move(std::get<generation_request>(req)), make_responses_encoder(std::move(ctx))};
    };
    s.id_prefix = "resp";
    return generation_route(std::move(s));
}

// GET and DELETE /v1/responses/{id}: the caller's own stored responses (another's are a 404).
reply stored_response(exchange& x, bool remove) {
    const std::string& id = x.req.params.at("id");
    api_error missing{404, fmt::format("Response with id '{}' not found.", id), "invalid_request_error", "id",
                      "not_found"};
    if (!x.st.responses) return reply::of(missing);
    if (remove) {
        if (!x.st.responses->remove(id, x.req.who)) return reply::of(missing);
        return reply::of_json({{"id", id}, {"object", "response"}, {"deleted", true}});
    }
    auto found = x.st.responses->find(id, x.req.who);
    if (!found) return reply::of(missing);
    return reply::of_json(found->response);
}

// POST /api/chat and /api/generate: Ollama's API through the completion handler.
handler_fn ollama_generation(bool generate) {
    surface s;
    s.parse = [generate](const json& body, const exchange& x) -> std::variant<parsed_request, api_error> {
        auto req = parse_ollama(body, model_of(x), x.st.cfg, generate);
        if (auto* e = std::get_if<api_error>(&req)) return *e;
        return parsed_request{std::move(std::get<generation_request>(req)), make_ollama_encoder(generate, x.req.received)};
    };
    s.error = ollama_error;
    s.id_prefix = generate ? "gen" : "chat";
    if (generate) // no prompt: Ollama loads the model and answers done (the model here is loaded)
        s.shortcut = [](const json& body, const exchange& x) -> std::optional<reply> {
            if (!body.is_object() || body.contains("prompt") || !body.value("model", json()).is_string()) return std::nullopt;
            if (body["model"] != model_of(x).id && body["model"] != ollama_name(model_of(x))) return std::nullopt;
            return reply::of_json({{"model", ollama_name(model_of(x))}, {"response", ""}, {"done", true}, {"done_reason", "load"}});
        };
    return generation_route(std::move(s));
}

// The batch routes (404 when the daemon runs no batch jobs), their disk work off the io thread.
handler_fn jobs(std::function<reply(batch_jobs&, exchange&)> fn) {
    return blocking([fn = std::move(fn)](exchange& x) {
        if (!x.st.jobs)
            return reply::of(api_error{404,
                                       "batch jobs are off in this daemon: tandem batch's own, or one whose "
                                       "state_dir could not be had (its log says why)",
                                       "invalid_request_error", "", "not_found"});
        return fn(*x.st.jobs, x);
    });
}

std::string header_text(const exchange& x, std::string_view name) { return std::string(x.req.header(name)); }

std::vector<route> make_routes() {
    using jobs_t = batch_jobs;
    return {
        {"/health", "GET", "/health", false, false, simple(health)},
        {"/metrics", "GET", "/metrics", false, false, simple(metrics_text)},
        {"/v1/tandem/status", "GET", "/v1/tandem/status", false, false, simple(status)},
        {"/v1/models", "GET", "/v1/models", true, false,
         simple([](exchange& x) {
             if (x.st.models) return reply::of_json({{"object", "list"}, {"data", x.st.models->cards()}});
             return reply::of_json({{"object", "list"}, {"data", json::array({model_card(model_of(x), x.st)})}});
         })},
        {"/v1/models/{id...}", "GET", "/v1/models", true, false, simple(model)},
        {"/v1/tandem/models/{id}/load", "POST", "/v1/tandem/models", true, false, simple(load_model)},
        {"/v1/tandem/models/{id}/unload", "POST", "/v1/tandem/models", false, false, simple(unload_model)},
        {"/tokenize", "POST", "/tokenize", true, false, blocking(tokenize)},
        {"/detokenize", "POST", "/detokenize", true, false, simple(detokenize)},
        {"/v1/tandem/apply-template", "POST", "/v1/tandem/apply-template", true, false, blocking(apply_template)},
        {"/v1/chat/completions", "POST", "/v1/chat/completions", true, true, openai_generation(true)},
        {"/v1/completions", "POST", "/v1/completions", true, true, openai_generation(false)},
        {"/v1/embeddings", "POST", "/v1/embeddings", true, true, handle_embeddings},
        {"/v1/messages", "POST", "/v1/messages", true, true, anthropic_messages()},
        {"/v1/responses", "POST", "/v1/responses", true, true, openai_responses()},
        {"/v1/responses/{id}", "GET", "/v1/responses", false, false,
         blocking([](exchange& x) { return stored_response(x, false); })},
        {"/v1/responses/{id}", "DELETE", "/v1/responses", false, false,
         blocking([](exchange& x) { return stored_response(x, true); })},
        {"/v1/messages/count_tokens", "POST", "/v1/messages/count_tokens", true, false, blocking(anthropic_count_tokens)},
        {"/api/chat", "POST", "/api/chat", true, true, ollama_generation(false)},
        {"/api/generate", "POST", "/api/generate", true, true, ollama_generation(true)},
        {"/api/embed", "POST", "/api/embed", true, true, ollama_embed(false)},
        {"/api/embeddings", "POST", "/api/embeddings", true, true, ollama_embed(true)},
        {"/api/tags", "GET", "/api/tags", true, false, simple(ollama_tags)},
        {"/api/show", "POST", "/api/show", true, false, simple(ollama_show)},
        {"/api/ps", "GET", "/api/ps", true, false, simple(ollama_ps)},
        {"/api/version", "GET", "/api/version", false, false, simple(ollama_version)},
        {"/api/pull", "POST", "/api/pull", false, false, simple(ollama_unsupported)},
        {"/api/push", "POST", "/api/push", false, false, simple(ollama_unsupported)},
        {"/api/create", "POST", "/api/create", false, false, simple(ollama_unsupported)},
        {"/api/copy", "POST", "/api/copy", false, false, simple(ollama_unsupported)},
        {"/api/delete", "DELETE", "/api/delete", false, false, simple(ollama_unsupported)},
        {"/v1/files", "GET", "/v1/files", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.list_files(x.req.query, x.req.who); })},
        {"/v1/files", "POST", "/v1/files", false, false,
         jobs([](jobs_t& j, exchange& x) {
             return j.upload(header_text(x, "Content-Type"), x.req.http.body(), x.req.upload_file, x.req.who);
         })},
        {"/v1/files/{id}", "GET", "/v1/files", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.file(x.req.params.at("id"), false, x.req.query, x.req.who); })},
        {"/v1/files/{id}", "DELETE", "/v1/files", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.remove_file(x.req.params.at("id"), x.req.query, x.req.who); })},
        {"/v1/files/{id}/content", "GET", "/v1/files", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.file(x.req.params.at("id"), true, x.req.query, x.req.who); })},
        {"/v1/batches", "GET", "/v1/batches", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.list_batches(x.req.query, x.req.who); })},
        {"/v1/batches", "POST", "/v1/batches", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.create_batch(x.req.http.body(), x.req.who); })},
        {"/v1/batches/{id}", "GET", "/v1/batches", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.batch(x.req.params.at("id"), false, x.req.query, x.req.who); })},
        {"/v1/batches/{id}/cancel", "POST", "/v1/batches", false, false,
         jobs([](jobs_t& j, exchange& x) { return j.batch(x.req.params.at("id"), true, x.req.query, x.req.who); })},
    };
}

// Whether `pattern` matches `path` segment by segment; its {name}s into `params`.
bool matches(std::string_view pattern, std::string_view path, std::map<std::string, std::string>& params) {
    while (!pattern.empty() || !path.empty()) {
        if (pattern.empty() || path.empty() || pattern[0] != '/' || path[0] != '/') return false;
        pattern.remove_prefix(1);
        path.remove_prefix(1);
        const std::string_view p = pattern.substr(0, pattern.find('/')), s = path.substr(0, path.find('/'));
        if (p.size() > 5 && p.front() == '{' && p.ends_with("...}")) { // the rest of the path, slashes and all
            if (path.empty()) return false;
            params[std::string(p.substr(1, p.size() - 5))] = std::string(path);
            return pattern.size() == p.size();
        }
        if (p.size() > 2 && p.front() == '{' && p.back() == '}') {
            if (s.empty()) return false;
            params[std::string(p.substr(1, p.size() - 2))] = std::string(s);
        } else if (p != s) {
            return false;
        }
        pattern.remove_prefix(p.size());
        path.remove_prefix(s.size());
    }
    return true;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

std::string url_decode(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '+') {
            out += ' ';
        } else if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
            out += char(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
            i += 2;
        } else {
            out += s[i];
        }
    }
    return out;
}

} // namespace

model_state& model_of(const exchange& x) { return x.ms ? *x.ms : *x.st.ms; }

const std::vector<route>& routes() {
    static const std::vector<route> table = make_routes();
    return table;
}

std::vector<route_match> match_routes(std::string_view path) {
    std::vector<route_match> out;
    for (const route& r : routes()) {
        route_match m{&r, {}};
        if (matches(r.pattern, path, m.params)) out.push_back(std::move(m));
    }
    return out;
}

reply error_reply(std::string_view path, const api_error& e) {
    if (path == "/v1/messages" || path.starts_with("/v1/messages/")) return anthropic_error(e);
    if (path.starts_with("/api/")) return ollama_error(e);
    return reply::of(e);
}

std::string route_label(std::string_view target) {
    const auto rows = match_routes(target.substr(0, target.find('?')));
    return rows.empty() ? std::string("other") : std::string(rows.front().row->label);
}

std::map<std::string, std::string> parse_query(std::string_view q) {
    std::map<std::string, std::string> out;
    while (!q.empty()) {
        const size_t amp = q.find('&');
        const std::string_view kv = q.substr(0, amp);
        const size_t eq = kv.find('=');
        if (!kv.empty()) out[url_decode(kv.substr(0, eq))] = eq == std::string_view::npos ? "" : url_decode(kv.substr(eq + 1));
        q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    }
    return out;
}

} // namespace tandem::daemon
