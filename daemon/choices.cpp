// The choices' state and OpenAI's logprob formats (daemon/choices.hpp).
#include "daemon/choices.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace tandem::daemon {

json add_prompt_logprobs(choice_state& c, std::span<const prompt_token> prompt, const std::string& echo,
                         const tokenizer& tok) {
    // Offsets: where each token's text starts in echo, which is the concatenated pieces less
    // the space prefix that decoding strips (so a stripped token starts at the text's start).
    const int64_t base = c.n_chars();
    stream_decoder dec(tok);
    std::string pieces;
    std::vector<size_t> starts;
    for (const prompt_token& t : prompt) {
        starts.push_back(pieces.size());
        pieces += dec.push(t.id);
    }
    pieces += dec.flush();
    const size_t stripped = pieces.size() >= echo.size() ? pieces.size() - echo.size() : 0;
    const auto chars = [](std::string_view s) {
        return int64_t(std::count_if(s.begin(), s.end(), [](char ch) { return (uint8_t(ch) & 0xC0) != 0x80; }));
    };
    json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
    for (size_t j = 0; j < prompt.size(); ++j) {
        const prompt_token& t = prompt[j];
        json top = nullptr;
        if (j > 0 && !t.top.empty()) {
            top = json::object();
            for (const auto& a : t.top) top[tok.piece(a.id)] = a.logprob;
        }
        const size_t at = std::max(starts[j], stripped) - stripped;
        const int64_t offset = base + chars(std::string_view(echo).substr(0, std::min(at, echo.size())));
        lp["tokens"].push_back(tok.piece(t.id));
        lp["token_logprobs"].push_back(std::isnan(t.logprob) ? json(nullptr) : json(t.logprob));
        lp["top_logprobs"].push_back(top);
        lp["text_offset"].push_back(offset);
        c.lp_tokens.push_back(lp["tokens"].back());
        c.lp_token_logprobs.push_back(lp["token_logprobs"].back());
        c.lp_top.push_back(top);
        c.lp_offsets.push_back(offset);
    }
    c.text += echo;
    return lp;
}

json add_logprobs(choice_state& c, const engine_event& ev, bool chat, const tokenizer& tok) {
    const std::string piece = tok.piece(ev.id);
    auto bytes_of = [](const std::string& s) {
        json b = json::array();
        for (unsigned char ch : s) b.push_back(int(ch));
        return b;
    };
    if (chat) {
        json top = json::array();
        for (const auto& t : ev.top) {
            const std::string p = tok.piece(t.id);
            top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", bytes_of(p)}});
        }
        json entry = {{"token", piece}, {"logprob", ev.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}};
        c.logprobs_content.push_back(entry);
        return json{{"content", json::array({entry})}};
    }
    json top = json::object();
    for (const auto& t : ev.top) top[tok.piece(t.id)] = t.logprob;
    c.lp_tokens.push_back(piece);
    c.lp_token_logprobs.push_back(ev.logprob);
    c.lp_top.push_back(ev.top.empty() ? json(nullptr) : top);
    c.lp_offsets.push_back(c.n_chars());
    return json{{"tokens", json::array({piece})},
                {"token_logprobs", json::array({ev.logprob})},
                {"top_logprobs", json::array({c.lp_top.back()})},
                {"text_offset", json::array({c.lp_offsets.back()})}};
}

namespace {

// "call_" and 24 letters and digits, as OpenAI's; Mistral's templates want exactly 9.
std::string new_call_id(grammar::tool_syntax syntax) {
    static constexpr std::string_view alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const bool mistral = syntax == grammar::tool_syntax::mistral;
    std::string id = mistral ? "" : "call_";
    for (int i = 0; i < (mistral ? 9 : 24); ++i) id.push_back(alnum[rng() % alnum.size()]);
    return id;
}

} // namespace

reply_delta read_reply(choice_state& c, std::string_view text, bool ended) {
    reply_delta d;
    std::string rest; // the text less its thinking
    if (c.splitter) {
        const bool was_thinking = c.splitter->thinking();
        auto p = c.splitter->feed(text, ended);
        if (!ended && (was_thinking || c.splitter->thinking())) ++c.n_reasoning;
        d.reasoning = std::move(p.reasoning);
        c.reasoning += d.reasoning;
        rest = std::move(p.content);
        text = rest;
    }
    if (!c.parser) {
        d.content = text;
        c.content += d.content;
        return d;
    }
    std::vector<grammar::tool_call_parser::event> events;
    c.parser->feed(text, events);
    if (ended) c.parser->finish(events);
    for (auto& ev : events) {
        using kind = grammar::tool_call_parser::event::kind;
        if (ev.k == kind::content) {
            d.content += ev.text;
            continue;
        }
        if (ev.k == kind::call) {
            c.calls.push_back({new_call_id(c.parser->syntax()), ev.text, ""});
            if (d.tool_calls.is_null()) d.tool_calls = json::array();
            d.tool_calls.push_back({{"index", ev.index},
                                    {"id", c.calls.back().id},
                                    {"type", "function"},
                                    {"function", {{"name", ev.text}, {"arguments", ""}}}});
            continue;
        }
        c.calls[size_t(ev.index)].arguments += ev.text;
        if (d.tool_calls.is_null()) d.tool_calls = json::array();
        if (!d.tool_calls.empty() && d.tool_calls.back()["index"] == ev.index)
            d.tool_calls.back()["function"]["arguments"] =
                d.tool_calls.back()["function"].value("arguments", "") + ev.text;
        else
            d.tool_calls.push_back({{"index", ev.index}, {"function", {{"arguments", ev.text}}}});
    }
    c.content += d.content;
    return d;
}

std::string client_finish_reason(const choice_state& c) {
    return !c.calls.empty() && c.finish_reason == "stop" ? "tool_calls" : c.finish_reason;
}

int64_t choice_state::n_chars() {
    for (; n_bytes_counted_ < text.size(); ++n_bytes_counted_)
        if ((static_cast<unsigned char>(text[n_bytes_counted_]) & 0xC0) != 0x80) ++n_chars_; // not a continuation byte
    return n_chars_;
}

std::vector<size_t> returned_sequences(const generation_plan& plan, const std::vector<choice_state>& cs) {
    std::vector<size_t> out;
    const size_t m = size_t(plan.n_seqs);
    for (size_t k = 0; k < plan.requests.size(); ++k) {
        std::vector<size_t> group(m);
        for (size_t i = 0; i < m; ++i) group[i] = k * m + i;
        if (plan.ranked()) // OpenAI's best_of: the highest log probability per token
            std::stable_sort(group.begin(), group.end(), [&](size_t a, size_t b) {
                const auto mean = [&](size_t i) { return cs[i].cumulative_logprob / std::max(1, cs[i].n_generated); };
                return mean(a) > mean(b);
            });
        out.insert(out.end(), group.begin(), group.begin() + plan.n);
    }
    return out;
}

json add_citations(choice_state& c, const engine_event& ev, const generation_plan& plan) {
    json out = json::array();
    for (const citation& x : ev.citations) out.push_back(citation_json(x, plan.documents));
    for (const json& x : out) c.citations.push_back(x);
    return out;
}

void add_beam_fields(json& choice, const choice_state& c) {
    choice["score"] = c.score;
    choice["cumulative_logprob"] = c.cumulative_logprob;
}

json usage_json(const std::vector<choice_state>& cs, const generation_plan& plan) {
    int64_t prompt = 0, cached = 0, completion = 0, drafted = 0, accepted = 0;
    for (size_t i = 0; i < cs.size(); ++i) { // every sequence's tokens count, returned or not
        if (i % size_t(plan.n_seqs) == 0) { // each prompt once
            prompt += cs[i].n_prompt;
            cached += cs[i].n_cached;
        }
        completion += cs[i].n_generated;
        drafted += cs[i].n_drafted;
        accepted += cs[i].n_accepted;
    }
    json u{{"prompt_tokens", prompt},
           {"completion_tokens", completion},
           {"total_tokens", prompt + completion},
           {"prompt_tokens_details", {{"cached_tokens", cached}}}};
    if (plan.truncate) { // truncate_prompt_tokens: the prompt tokens it dropped (each prompt once)
        int64_t dropped = 0;
        for (const int32_t n : plan.truncated) dropped += n;
        u["truncated_prompt_tokens"] = dropped;
    }
    // Speculative drafts, in the fields OpenAI reports predicted outputs with.
    if (drafted > 0)
        u["completion_tokens_details"] = {{"accepted_prediction_tokens", accepted},
                                          {"rejected_prediction_tokens", drafted - accepted}};
    if (plan.reasoning) {
        int64_t thought = 0;
        for (const choice_state& c : cs) thought += c.n_reasoning;
        u["completion_tokens_details"]["reasoning_tokens"] = thought;
    }
    return u;
}

json passages_json(const generation_plan& plan) {
    json out = json::array();
    for (const passage_used& p : plan.passages)
        out.push_back({{"document_id", p.document_id},
                       {"document_index", p.document_index},
                       {"start", p.start},
                       {"end", p.end}});
    return out;
}

void choice_state::finish(const engine_event& ev) {
    finish_reason = ev.finish_reason;
    stop_string = ev.stop_string;
    error = ev.error;
    n_prompt = ev.n_prompt;
    n_cached = ev.n_cached;
    n_generated = ev.n_generated;
    n_drafted = ev.n_draft_tokens;
    n_accepted = ev.n_accepted_tokens;
    score = ev.score;
    cumulative_logprob = ev.cumulative_logprob;
    done = true;
}

} // namespace tandem::daemon
