// Embeddings (POST /v1/embeddings): the request, the response, and running inputs through the
// engine a window at a time (daemon/embedding.hpp).
#include "daemon/embedding.hpp"

#include "daemon/openai_fields.hpp"
#include "runtime/tokenizer.hpp"

#include <boost/asio/redirect_error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>

namespace tandem::daemon {

std::variant<embedding_plan, api_error> parse_embeddings(const json& body, const model_state& ms, const config& cfg) {
    if (!body.is_object()) return bad("the request body must be a JSON object");
    TANDEM_TRY(check_keys(body, "", {"model", "input", "encoding_format", "dimensions", "user", "priority",
                              "truncate_prompt_tokens"}));
    const tokenizer& tok = *ms.bundle.tok;
    TANDEM_TRY(read_model(body));
    if (auto e = embeddings_unavailable(ms)) return *e;
    embedding_plan plan;
    if (auto it = body.find("input"); it != body.end()) { // (nothing to embed: OpenAI refuses it too)
        const auto empty = [](const json& x) { return x == ""; };
        if (empty(*it) || (it->is_array() && std::any_of(it->begin(), it->end(), empty)))
            return bad("an 'input' must not be an empty string", "input");
    }
    auto inputs = read_prompt_inputs(body, "input", tok.n_vocab());
    if (auto* e = std::get_if<api_error>(&inputs)) return *e;
    for (const prompt_input& p : std::get<0>(inputs)) {
        plan.inputs.push_back(p.is_text ? tok.encode(p.text, true, false) : p.ids);
        if (plan.inputs.back().empty()) plan.inputs.back().push_back(tok.bos() >= 0 ? tok.bos() : 0);
    }
    constexpr size_t max_inputs = 2048; // OpenAI's limit
    if (plan.inputs.size() > max_inputs)
        return bad(fmt::format("'input' has {} items; at most {} are accepted", plan.inputs.size(), max_inputs), "input");
    int32_t truncate = 0;
    TANDEM_TRY(read_truncation(body, ms, truncate));
    if (truncate > 0) { // each input's last tokens, as they are (a BOS at the start is not added back)
        plan.truncate = true;
        for (auto& in : plan.inputs) {
            const int32_t cut = std::max<int32_t>(0, int32_t(in.size()) - truncate);
            in.erase(in.begin(), in.begin() + cut);
            plan.n_truncated += cut;
        }
    }
    for (size_t i = 0; i < plan.inputs.size(); ++i)
        if (int32_t(plan.inputs[i].size()) > ms.max_prompt_tokens)
            return prompt_too_long(fmt::format("input {}", i), plan.inputs[i].size(), ms, "input");
    // The reply holds inputs x n_embd numbers as text (a short body could ask for gigabytes).
    if (const int64_t n = int64_t(plan.inputs.size()) * ms.bundle.cfg.n_embd; n > cfg.max_embedding_floats)
        return bad(fmt::format("'input' has {} items of {} dimensions each: {} numbers, more than the {} one reply "
                               "holds (max_embedding_floats in tandemd.conf); send fewer inputs a request",
                               plan.inputs.size(), ms.bundle.cfg.n_embd, n, cfg.max_embedding_floats),
                   "input");
    if (auto it = body.find("encoding_format"); it != body.end() && !it->is_null()) {
        if (*it != "float" && *it != "base64")
            return bad("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
        plan.base64 = *it == "base64";
    }
    const int64_t n_embd = ms.bundle.cfg.n_embd;
    int64_t dims = n_embd;
    TANDEM_TRY(read_int(body, "dimensions", 1, std::numeric_limits<int32_t>::max(), dims));
    if (dims != n_embd) // a model not trained for shorter vectors (Matryoshka) has no meaningful prefix
        return bad(fmt::format("this model's embeddings have {} dimensions; 'dimensions' can only be {}", n_embd, n_embd),
                   "dimensions");
    std::string user;
    TANDEM_TRY(read_string(body, "user", user));
    int64_t priority = 0;
    TANDEM_TRY(read_int(body, "priority", -1000, 1000, priority));
    plan.priority = int32_t(priority);
    return plan;
}

namespace {

// RFC 4648 base64 of raw bytes (OpenAI's encoding_format "base64": the float32 array's bytes).
std::string base64(std::span<const uint8_t> in) {
    static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    for (size_t i = 0; i < in.size(); i += 3) {
        const uint32_t n = uint32_t(in[i]) << 16 | (i + 1 < in.size() ? uint32_t(in[i + 1]) << 8 : 0) |
                           (i + 2 < in.size() ? uint32_t(in[i + 2]) : 0);
        out += digits[n >> 18 & 63];
        out += digits[n >> 12 & 63];
        out += i + 1 < in.size() ? digits[n >> 6 & 63] : '=';
        out += i + 2 < in.size() ? digits[n & 63] : '=';
    }
    return out;
}

} // namespace

json embeddings_response(const embedding_plan& plan, const std::vector<std::vector<float>>& vectors,
                         const std::string& model) {
    static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
    json data = json::array();
    int64_t n_tokens = 0;
    for (size_t i = 0; i < vectors.size(); ++i) {
        json v = plan.base64 ? json(base64({reinterpret_cast<const uint8_t*>(vectors[i].data()),
                                            vectors[i].size() * sizeof(float)}))
                             : json(vectors[i]);
        data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(v)}});
        n_tokens += int64_t(plan.inputs[i].size());
    }
    json usage = {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}};
    if (plan.truncate) usage["truncated_prompt_tokens"] = plan.n_truncated;
    return json{{"object", "list"}, {"data", std::move(data)}, {"model", model}, {"usage", std::move(usage)}};
}

std::optional<api_error> embeddings_unavailable(const model_state& ms) {
    const model_config& c = ms.bundle.cfg;
    if (c.n_embd <= c.n_vocab) return std::nullopt;
    api_error e{400,
                fmt::format("this model's hidden states ({} floats) are wider than its output rows ({} logits), which "
                            "carry them: it has no embeddings here",
                            c.n_embd, c.n_vocab),
                "invalid_request_error", "", "embeddings_unavailable"};
    return e;
}

asio::awaitable<std::variant<std::vector<std::vector<float>>, api_error>>
embed(exchange& x, std::vector<std::vector<token_id>> inputs, int32_t priority) {
    model_state& ms = model_of(x);
    auto ch = generation_channel::make(x.out.executor());
    std::vector<uint64_t> ids;
    auto cancel_all = [&] {
        for (uint64_t id : ids) ms.eng->cancel(id); // (those done already are no longer known: no-ops)
        ch->finished = true;
        x.out.current(nullptr);
    };
    // A window of inputs in the engine at a time, the next as each one finishes: the engine's
    // queue is bounded (max_waiting), and a list of 2,048 inputs is not a daemon at capacity.
    const size_t window = size_t(std::max(1, x.st.cfg.engine.sched.max_running));
    size_t next = 0, n_live = 0;
    auto submit_more = [&]() -> std::optional<api_error> {
        for (; next < inputs.size() && n_live < window; ++next, ++n_live) {
            engine_request r;
            r.prompt = inputs[next]; // (kept: a refused one is submitted again)
            r.embed = ms.bundle.cfg.pooling;
            r.priority = priority;
            const size_t i = next;
            const submit_result sr =
                ms.eng->submit(std::move(r), [ch, i](engine_event&& ev) { ch->push(int(i), std::move(ev)); });
            if (sr.status == submit_status::ok) {
                ids.push_back(sr.id);
                continue;
            }
            if (sr.status == submit_status::queue_full && n_live > 0) break; // again when one of ours ends
            api_error e = submit_error(sr.status);
            if (sr.status == submit_status::too_long) {
                e.message = fmt::format("input {} does not fit in the context or the KV cache", i);
                e.param = "input";
            }
            return e;
        }
        return std::nullopt;
    };
    if (auto e = submit_more()) {
        cancel_all();
        co_return *e;
    }
    x.out.current(ch);
    x.out.watch_peer(ch);
    std::vector<std::vector<float>> out(inputs.size());
    size_t n_done = 0;
    boost::system::error_code ec;
    while (n_done < out.size()) {
        if (ch->peer_gone || x.out.closed()) {
            cancel_all();
            co_return api_error{499, "the client went away", "server_error"};
        }
        auto events = ch->take();
        if (events.empty()) {
            ch->timer.expires_at(std::chrono::steady_clock::time_point::max());
            co_await ch->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
        }
        for (auto& [i, ev] : events) {
            if (!ev.done) continue;
            ++n_done;
            --n_live;
            if (ev.finish_reason != "stop" || ev.embedding.empty()) {
                cancel_all();
                co_return api_error{500, fmt::format("the engine failed while embedding input {}{}", i,
                                                     ev.error.empty() ? "" : ": " + ev.error),
                                    "server_error"};
            }
            out[size_t(i)] = std::move(ev.embedding);
        }
        if (auto e = submit_more()) {
            cancel_all();
            co_return *e;
        }
    }
    ch->finished = true;
    x.out.current(nullptr);
    co_return out;
}

asio::awaitable<bool> handle_embeddings(exchange& x) {
    const std::string route = "/v1/embeddings";
    std::variant<embedding_plan, api_error> parsed =
        co_await off_io(x.st.blocking.get(), [&]() -> std::variant<embedding_plan, api_error> {
            auto body = parse_request_body(x.req.http.body(), x.st.cfg.max_json_depth);
            if (auto* e = std::get_if<api_error>(&body)) return *e;
            return parse_embeddings(std::get<json>(body), model_of(x), x.st.cfg);
        });
    if (auto* e = std::get_if<api_error>(&parsed)) {
        x.st.met.request_done(route, e->status);
        const reply r = reply::of(*e);
        co_return co_await x.out.send(r);
    }
    const embedding_plan& plan = std::get<embedding_plan>(parsed);
    auto vectors = co_await embed(x, plan.inputs, plan.priority);
    if (auto* e = std::get_if<api_error>(&vectors)) {
        x.st.met.request_done(route, e->status);
        if (e->status == 499) co_return false; // nobody to answer
        const reply r = reply::of(*e);
        co_return co_await x.out.send(r);
    }
    int64_t n_tokens = 0;
    for (const auto& in : plan.inputs) n_tokens += int64_t(in.size());
    x.st.met.tokens(n_tokens, 0);
    x.st.met.request_done(route, 200);
    const reply r = reply::of_json(embeddings_response(plan, std::get<0>(vectors), model_of(x).id));
    co_return co_await x.out.send(r);
}

} // namespace tandem::daemon
