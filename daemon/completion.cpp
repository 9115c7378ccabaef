// The completion handler (daemon/completion.hpp): a generation request from its plan to the
// last byte.
#include "daemon/completion.hpp"

#include "daemon/embedding.hpp"
#include "daemon/fields.hpp"
#include "daemon/model_host.hpp"
#include "daemon/upstream.hpp"
#include "daemon/retrieval.hpp"
#include "runtime/log.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

namespace tandem::daemon {
namespace {

using clock_type = std::chrono::steady_clock;

double secs(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

std::string new_id(std::string_view prefix) {
    static std::atomic<uint64_t> n{0};
    static const uint64_t salt = uint64_t(clock_type::now().time_since_epoch().count());
    return fmt::format("{}-{:x}{:06x}", prefix, salt & 0xffffffffffull, ++n);
}

} // namespace

asio::awaitable<std::optional<api_error>> retrieve(exchange& x, generation_plan& plan) {
    model_state& ms = model_of(x);
    const tokenizer& tok = *ms.bundle.tok;
    const pending_grounding& g = *plan.retrieval;
    const std::vector<document>& docs = g.ground.documents;
    if (auto e = embeddings_unavailable(ms)) { // passages are ranked by embeddings
        e->param = "documents";
        co_return e;
    }
    // Passages of a quarter of the room the messages leave (16 to 256 tokens).
    const int32_t room = g.budget - int32_t(grounded_prompt(g, {}, ms).size());
    constexpr int32_t min_passage = 16, max_passage = 256, tags = 24; // a passage's <document> tags, at most
    if (room < min_passage + tags) {
        co_return api_error{400,
                            fmt::format("the documents do not fit in the context ({} tokens for the prompt), and the "
                                        "messages leave no room for passages of them",
                                        g.budget),
                            "invalid_request_error", "documents", "context_length_exceeded"};
    }
    const int32_t passage_tokens = std::clamp(room / 4, min_passage, max_passage);
    const std::vector<passage> passages =
        co_await off_io(x.st.blocking.get(), [&] { return split_passages(docs, tok, passage_tokens); });
    if (int64_t(passages.size()) > x.st.cfg.max_passages) // each is embedded: bounded work per request
        co_return api_error{400,
                            fmt::format("the documents split into {} passages, more than the {} this daemon embeds "
                                        "for one request (max_passages in tandemd.conf): send fewer or shorter "
                                        "documents",
                                        passages.size(), x.st.cfg.max_passages),
                            "invalid_request_error", "documents", "too_many_passages"};
    if (!ms.passage_embeddings) // at most 64 MiB of vectors
        ms.passage_embeddings = std::make_unique<embedding_cache>(
            std::max<size_t>(256, (size_t(64) << 20) / (sizeof(float) * size_t(ms.bundle.cfg.n_embd))));
    embedding_cache& cache = *ms.passage_embeddings;
    const auto text_of = [&](const passage& p) {
        return docs[size_t(p.document)].text.substr(size_t(p.begin), size_t(p.end - p.begin));
    };
    // The question (its last max_prompt_tokens tokens) and every passage not embedded before.
    std::vector<std::vector<token_id>> inputs{tok.encode(g.query, true, false)};
    if (int32_t(inputs[0].size()) > ms.max_prompt_tokens)
        inputs[0].erase(inputs[0].begin(), inputs[0].end() - ms.max_prompt_tokens);
    if (inputs[0].empty()) inputs[0].push_back(tok.bos() >= 0 ? tok.bos() : 0);
    std::vector<size_t> missing;
    std::vector<std::vector<float>> embedded(passages.size());
    for (size_t i = 0; i < passages.size(); ++i) {
        if (const auto* known = cache.find(text_of(passages[i]))) {
            embedded[i] = *known;
            continue;
        }
        missing.push_back(i);
        inputs.push_back(tok.encode(text_of(passages[i]), true, false));
    }
    auto vectors = co_await embed(x, std::move(inputs), g.base.priority);
    if (auto* e = std::get_if<api_error>(&vectors)) co_return *e;
    auto& v = std::get<0>(vectors);
    for (size_t k = 0; k < missing.size(); ++k) { // (more passages than the cache holds: the vectors are kept here)
        embedded[missing[k]] = v[k + 1];
        cache.put(text_of(passages[missing[k]]), std::move(v[k + 1]));
    }

    // The best-ranked passages that fit, rendered in document order; while the prompt is over
    // the budget (the tags' estimate was short), the lowest-ranked goes.
    std::vector<size_t> chosen;
    int32_t used = 0;
    for (size_t i : rank_passages(v[0], embedded))
        if (used + passages[i].n_tokens + tags <= room) {
            chosen.push_back(i);
            used += passages[i].n_tokens + tags;
        }
    std::vector<document> shown;
    std::vector<token_id> prompt;
    for (; !chosen.empty(); chosen.pop_back()) {
        std::vector<size_t> order = chosen;
        std::sort(order.begin(), order.end()); // passages are in document order
        shown.clear();
        plan.passages.clear();
        for (size_t i : order) {
            const passage& p = passages[i];
            shown.push_back(passage_document(p, docs));
            plan.passages.push_back({docs[size_t(p.document)].id, p.document, p.start, p.stop});
        }
        prompt = grounded_prompt(g, shown, ms);
        if (int32_t(prompt.size()) <= g.budget) break;
    }
    if (chosen.empty()) {
        co_return api_error{400, "no passage of the documents fits beside the messages", "invalid_request_error",
                            "documents", "context_length_exceeded"};
    }
    logger("server")->debug("retrieval: {} of {} passages ({} embedded now) in a prompt of {} tokens", chosen.size(),
                            passages.size(), missing.size(), prompt.size());
    const pending_grounding pending = std::move(*plan.retrieval);
    plan.retrieval.reset();
    ground_plan(plan, pending, std::move(shown), std::move(prompt), ms);
    co_return std::nullopt;
}

handler_fn generation_route(surface s) {
    return [s = std::move(s)](exchange& x) -> asio::awaitable<bool> {
        struct planned {
            generation_plan plan;
            std::unique_ptr<encoder> enc;
            std::optional<reply> shortcut;
        };
        auto parsed = co_await off_io(x.st.blocking.get(), [&]() -> std::variant<planned, api_error> {
            auto body = parse_request_body(x.req.http.body(), x.st.cfg.max_json_depth);
            if (auto* e = std::get_if<api_error>(&body)) return *e;
            if (s.shortcut)
                if (auto r = s.shortcut(std::get<json>(body), x)) return planned{{}, nullptr, std::move(r)};
            auto parsed_req = s.parse(std::get<json>(body), x);
            if (auto* e = std::get_if<api_error>(&parsed_req)) return *e;
            parsed_request& pr = std::get<parsed_request>(parsed_req);
            auto plan = plan_generation(std::move(pr.req), model_of(x), x.st.cfg);
            if (auto* e = std::get_if<api_error>(&plan)) return *e;
            return planned{std::move(std::get<generation_plan>(plan)), std::move(pr.enc), std::nullopt};
        });
        if (auto* e = std::get_if<api_error>(&parsed)) {
            x.st.met.request_done(x.label, e->status);
            const reply r = s.error(*e);
            co_return co_await x.out.send(r);
        }
        planned& p = std::get<planned>(parsed);
        if (p.shortcut) {
            x.st.met.request_done(x.label, p.shortcut->status);
            co_return co_await x.out.send(*p.shortcut);
        }
        co_return co_await run_completion(x, x.label, s.id_prefix, std::move(p.plan), *p.enc);
    };
}

asio::awaitable<bool> run_completion(exchange& x, const std::string& route, std::string_view id_prefix,
                                     generation_plan plan, encoder& enc) {
    model_state& ms = model_of(x);
    metrics& met = x.st.met;
    auto fail_with = [&](const api_error& e) -> asio::awaitable<bool> {
        met.request_done(route, e.status);
        const reply r = enc.error(e);
        co_return co_await x.out.send(r);
    };
    if (plan.retrieval) {
        const std::optional<api_error> e = co_await retrieve(x, plan);
        if (e && e->status == 499) { // the client left while its passages were embedded
            met.request_done(route, 499);
            co_return false;
        }
        if (e) co_return co_await fail_with(*e);
    }

    // Submitted: every prompt's request, or none (a refusal cancels those already in).
    auto ch = generation_channel::make(x.out.executor());
    std::vector<uint64_t> ids;
    for (size_t k = 0; k < plan.requests.size(); ++k) {
        const int first = int(k) * plan.n_seqs; // the request's sequence i is first + i
        const submit_result r = ms.eng->submit(plan.requests[k], [ch, first](engine_event&& ev) {
            const int choice = first + ev.index;
            ch->push(choice, std::move(ev));
        });
        if (r.status == submit_status::ok) {
            ids.push_back(r.id);
            continue;
        }
        for (uint64_t id : ids) ms.eng->cancel(id);
        ch->finished = true;
        if (r.status == submit_status::queue_full && x.overflow && forwardable_path(x.req.path)) {
            // the model's `overflow`: its upstream takes what its queue cannot (instead of a 429)
            if (x.st.models) x.st.models->count_forward(x.overflow->name, true);
            co_return co_await forward_upstream(x, *x.overflow);
        }
        api_error e = submit_error(r.status);
        if (r.status == submit_status::too_long) e.message = too_long_message(plan.requests[k], ms);
        co_return co_await fail_with(e);
    }
    x.out.current(ch);
    x.out.watch_peer(ch);

    const std::string id = new_id(id_prefix);
    std::vector<choice_state> cs(plan.n_sequences()); // the choices, when nothing ranks them
    for (auto& c : cs) {
        if (plan.tools) c.parser.emplace(*plan.tools);
        if (plan.reasoning) c.splitter.emplace(*plan.reasoning, plan.reasoning_from);
    }
    completion_view view{id, ms.id, plan, cs, *ms.bundle.tok};
    std::vector<clock_type::time_point> last_t(plan.n_sequences());
    size_t n_done = 0;
    bool write_failed = false;
    auto send = [&](const std::string& data) -> asio::awaitable<void> {
        if (data.empty() || write_failed || x.out.closed()) co_return;
        if (!co_await x.out.send_piece(data)) write_failed = true;
    };
    if (plan.stream) {
        if (!co_await x.out.open_stream(enc.content_type())) write_failed = true;
        const std::string opening = enc.open(view);
        co_await send(opening);
    }
    // echo: each choice starts with its prompt's text (with logprobs, when the prompt is scored)
    const auto echo_of = [&](size_t i) -> const std::string& { return plan.echo[i / size_t(plan.n_seqs)]; };
    if (!plan.echo.empty() && !plan.logprobs)
        for (size_t i = 0; i < cs.size(); ++i) {
            cs[i].text = echo_of(i);
            const reply_delta d{echo_of(i), nullptr};
            const choice_step step{nullptr, d, json::array(), true};
            const std::string piece = enc.step(view, i, step); // (named: GCC 12 mishandles temporaries in co_await)
            co_await send(piece);
        }

    boost::system::error_code ec;
    while (n_done < cs.size()) {
        if (ch->peer_gone || write_failed || x.out.closed()) {
            for (uint64_t rid : ids) ms.eng->cancel(rid);
            for (const auto& c : cs)
                if (!c.done) met.finished("cancelled");
            ch->finished = true;
            x.out.current(nullptr);
            met.request_done(route, 499); // nginx's "client closed request"
            logger("server")->debug("client went away; generation {} cancelled", id);
            co_return false;
        }
        // Wait only with the queue seen empty: a wake-up posted while we were writing is spent.
        auto batch = ch->take();
        if (batch.empty()) {
            ch->timer.expires_at(clock_type::time_point::max());
            co_await ch->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
        }
        for (auto& [i, ev] : batch) {
            choice_state& c = cs[size_t(i)];
            if (!ev.prompt.empty()) { // the prompt scored (echo with logprobs): every sequence of it starts so
                if (plan.echo.empty() || !plan.logprobs) continue;
                for (int j = i; j < i + plan.n_seqs; ++j) {
                    const std::string piece = enc.prompt_scored(view, size_t(j), ev, echo_of(size_t(j)));
                    co_await send(piece);
                }
                continue;
            }
            if (!ev.done) {
                if (c.n_generated == 0 && last_t[size_t(i)] == clock_type::time_point{})
                    met.ttft(secs(ev.t - x.req.received));
                else
                    met.inter_token(secs(ev.t - last_t[size_t(i)]));
                last_t[size_t(i)] = ev.t;
                const reply_delta d = read_reply(c, ev.text, false);
                const json cites = add_citations(c, ev, plan); // (closed spans: their text was sent before)
                const choice_step step{&ev, d, cites, false};
                const std::string piece = enc.step(view, size_t(i), step);
                c.text += ev.text;
                co_await send(piece);
                continue;
            }
            const reply_delta d = read_reply(c, ev.text, true);
            c.text += ev.text;
            c.finish(ev);
            ++n_done;
            if (ev.t_admitted != clock_type::time_point{}) met.queue_time(secs(ev.t_admitted - x.req.received));
            met.finished(ev.finish_reason);
            const json cites = add_citations(c, ev, plan);
            const choice_step step{&ev, d, cites, false};
            const std::string piece = enc.finish(view, size_t(i), step);
            co_await send(piece);
        }
    }
    ch->finished = true;
    x.out.current(nullptr);

    const json usage = usage_json(cs, plan);
    met.tokens(usage["prompt_tokens"].get<int64_t>(), usage["completion_tokens"].get<int64_t>());
    const auto failed = std::find_if(cs.begin(), cs.end(), [](const choice_state& c) { return c.finish_reason == "error"; });
    if (failed != cs.end() && !plan.stream) {
        api_error e{500,
                    fmt::format("the engine failed while generating{}",
                                failed->error.empty() ? " (see the daemon's log)" : ": " + failed->error),
                    "server_error"};
        met.request_done(route, 500);
        const reply failure = enc.error(e);
        co_return co_await x.out.send(failure, true);
    }
    met.request_done(route, 200);
    if (!plan.stream) {
        const reply whole = reply::of_json(enc.whole(view));
        co_return co_await x.out.send(whole);
    }
    const std::string closing = enc.close(view);
    co_await send(closing);
    if (write_failed || x.out.closed()) co_return false;
    co_return co_await x.out.close_stream();
}

} // namespace tandem::daemon
