// Planning a generation request (daemon/generation.hpp): prompts rendered and tokenized,
// limits, the output constraint, grounding.
#include "daemon/generation.hpp"

#include "runtime/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace tandem::daemon {
namespace {

// Applies truncate_prompt_tokens n (> 0) to each prompt: its last n tokens, as they are (a BOS
// at the start is not added back). Returns the tokens dropped from each.
std::vector<int32_t> truncate_prompts(std::vector<std::vector<token_id>>& prompts, int32_t n) {
    std::vector<int32_t> dropped;
    for (auto& p : prompts) {
        const int32_t cut = std::max<int32_t>(0, int32_t(p.size()) - n);
        p.erase(p.begin(), p.begin() + cut);
        dropped.push_back(cut);
    }
    return dropped;
}

// The output constraint of the request: its own, or its tools' (calls in the template's
// syntax), or strict citations' mask; at most one of them.
std::optional<api_error> plan_constraint(const generation_request& req, const model_state& ms, const config& cfg,
                                         engine_request& base, generation_plan& plan) {
    std::optional<found_constraint> constraint = req.constraint;
    if (constraint && (constraint->second.k == grammar::constraint::kind::json_object ||
                       constraint->second.k == grammar::constraint::kind::json_schema))
        constraint->second.ws = req.ws;
    std::string trigger; // tool_choice auto: free text until the model opens a call
    bool anchored = false;
    if (req.tools.active()) {
        if (constraint)
            return bad(fmt::format("'{}' and '{}' cannot be used together (with tool_choice \"none\" they can)",
                                   constraint->first, req.tools.field),
                       constraint->first);
        const grammar::tool_syntax syntax = ms.tmpl.tool_syntax();
        std::vector<grammar::tool_function> offered;
        for (const auto& f : req.tools.functions)
            if (req.tools.choice != "function" || f.name == req.tools.named) offered.push_back(f);
        // A call's arguments are the function's named parameters (its schema's other keys,
        // which JSON Schema would tolerate, are not written: closed objects).
        constraint = found_constraint{
            req.tools.field,
            {grammar::constraint::kind::tools,
             grammar::tools_constraint_text(syntax, offered, req.tools.parallel && req.tools.choice != "function"),
             req.ws, true}};
        if (req.tools.choice == "auto") {
            trigger = grammar::layout_of(syntax).trigger;
            anchored = grammar::layout_of(syntax).anchored;
        }
        plan.tools = syntax;
    }
    // (strict citations mask the quotes to document text: the one processor a request may add)
    if (!req.ground.documents.empty() && req.ground.strict && constraint)
        return bad(fmt::format("'{}' and strict citations cannot be used together", constraint->first),
                   constraint->first);
    if (!constraint) return std::nullopt;
    try {
        const auto budget = std::chrono::milliseconds(cfg.grammar_compile_ms);
        base.make_processor = [guides = ms.guides.get(), cache = ms.guides->get(constraint->second, budget), trigger,
                               anchored] { return guides->make_processor(cache, trigger, anchored); };
    } catch (const grammar::grammar_error& e) {
        api_error err = bad(fmt::format("'{}' cannot be used: {}", constraint->first, e.what()), constraint->first);
        err.code = "invalid_constraint";
        return err;
    }
    return std::nullopt;
}

} // namespace

api_error prompt_too_long(const std::string& what, size_t n_tokens, const model_state& ms, const std::string& param) {
    const int32_t n_train = ms.bundle.cfg.n_ctx_train;
    std::string limit, change;
    if (ms.max_prompt_tokens < ms.n_ctx - 1) { // the config's own limit binds
        limit = fmt::format("max_prompt_tokens in tandemd.conf; the context is {}", ms.n_ctx);
        change = "raise max_prompt_tokens in tandemd.conf";
    } else if (ms.n_ctx < n_train) {
        limit = fmt::format("n_ctx {} less one", ms.n_ctx);
        change = fmt::format("raise n_ctx in tandemd.conf (the model's training context is {})", n_train);
    } else {
        limit = fmt::format("n_ctx {}, the model's training context, less one", ms.n_ctx);
    }
    api_error e = bad(fmt::format("{} has {} tokens, more than the {} this daemon accepts ({}): shorten it, send "
                                  "'truncate_prompt_tokens' (1 to {}) to keep its last tokens{}",
                                  what, n_tokens, ms.max_prompt_tokens, limit, ms.max_prompt_tokens,
                                  change.empty() ? "" : ", or " + change),
                      param);
    e.code = "context_length_exceeded";
    return e;
}

std::variant<generation_plan, api_error> plan_generation(generation_request req, const model_state& ms,
                                                         const config& cfg) {
    const tokenizer& tok = *ms.bundle.tok;
    generation_plan plan;
    plan.chat = req.chat;
    plan.stream = req.stream;
    plan.include_usage = req.include_usage;
    plan.logprobs = req.logprobs;
    for (const auto& [key, v] : {std::pair{"n", req.n}, std::pair{"best_of", req.best_of}})
        if (v > cfg.max_n)
            return bad(fmt::format("'{}' ({}) is over this daemon's limit of {} sequences a prompt (max_n in "
                                   "tandemd.conf; a beam search's width is best_of, or n)",
                                   key, v, cfg.max_n),
                       key);

    // The prompts: a chat's messages through the model's template (with the documents, or the
    // tools it is told of), or the completion prompts.
    std::vector<std::vector<token_id>> prompts;
    std::optional<pending_grounding> grounded; // chat with documents
    if (req.chat) {
        const reasoning_request& rq = req.reasoning;
        const bool thinks = ms.reasoning && rq.enable != false; // (documents: citations would run over the thinking)
        // enable_thinking is a template variable: a Jinja template reads it (honoured, whatever
        // the vocabulary); a family renderer would drop it, and a budget needs the markers.
        const bool enable_dropped = rq.enable && !ms.tmpl.uses_jinja();
        if (!ms.reasoning && (enable_dropped || rq.budget >= 0))
            return bad(fmt::format("'{}' needs a reasoning model: this model's chat template has no thinking markers",
                                   rq.budget >= 0 ? rq.budget_field : rq.enable_field),
                       rq.budget >= 0 ? rq.budget_field : rq.enable_field);
        if (!req.ground.documents.empty() && thinks)
            return bad("'documents' with a reasoning model need its thinking off (chat_template_kwargs.enable_thinking "
                       "false): citations are not kept apart from the thinking yet",
                       "documents");
        if (!req.ground.documents.empty()) {
            if (req.tools.active())
                return bad(fmt::format("'documents' and '{}' cannot be used together yet", req.tools.field), "documents");
            grounded.emplace();
            grounded->messages = req.messages;
            grounded->ground = req.ground;
            prompts.push_back(grounded_prompt(*grounded, grounded->ground.documents, ms)); // all of them, if they fit
        } else {
            // tool_choice "none": the model is not told of the tools, so it writes a message
            std::string text = ms.tmpl.render(req.messages, true,
                                              req.tools.active() ? std::span(req.tools.defs)
                                                                 : std::span<const std::string>{},
                                              &req.template_kwargs);
            if (ms.reasoning) {
                const reasoning_format& f = *ms.reasoning;
                if (rq.enable == false && start_of(f, text) != reasoning_start::content) {
                    if (!f.can_disable)
                        return bad(fmt::format("'{}': this model's chat template cannot turn its thinking off (it "
                                               "has no enable_thinking)",
                                               rq.enable_field),
                                   rq.enable_field);
                    text += f.disabled_suffix(); // as the template renders enable_thinking false
                }
                plan.reasoning = f;
                plan.reasoning_from = start_of(f, text);
                if (rq.budget >= 0 && plan.reasoning_from != reasoning_start::content && f.close_id < 0)
                    return bad(fmt::format("'{}' needs the thinking's end marker as one token, which this model's "
                                           "vocabulary lacks",
                                           rq.budget_field),
                               rq.budget_field);
            }
            prompts.push_back(tok.encode(text, false, true));
        }
        for (const std::string& s : ms.tmpl.stop_strings()) req.base.stop.push_back(s);
    } else {
        for (const prompt_input& p : req.prompts) {
            prompts.push_back(p.is_text ? tok.encode(p.text, true, false) : p.ids);
            if (prompts.back().empty()) prompts.back().push_back(tok.bos() >= 0 ? tok.bos() : 0); // "" still needs a token
        }
    }
    if (req.truncate > 0) {
        if (grounded) // (documents that do not fit are retrieved from instead: a cut prompt would lose them)
            return bad("'truncate_prompt_tokens' does not apply with 'documents': documents that do not fit the "
                       "context are retrieved from (passages)",
                       "truncate_prompt_tokens");
        plan.truncated = truncate_prompts(prompts, req.truncate);
        plan.truncate = true;
    }
    for (size_t k = 0; k < prompts.size(); ++k)
        if (int32_t(prompts[k].size()) > ms.max_prompt_tokens && !grounded) // (documents too long are retrieved from)
            return prompt_too_long(req.chat              ? std::string("the prompt (the messages in the chat template)")
                                   : prompts.size() > 1 ? fmt::format("prompt {}", k)
                                                        : std::string("the prompt"),
                                   prompts[k].size(), ms, req.prompt_param);

    engine_request base = std::move(req.base);
    if (auto e = plan_constraint(req, ms, cfg, base, plan)) return *e;
    // A reply that may think: the thinking is bounded, and the constraint (tools too) applies to
    // what follows it.
    if (plan.reasoning && plan.reasoning_from != reasoning_start::content &&
        (req.reasoning.budget >= 0 || base.make_processor)) {
        const reasoning_format& f = *plan.reasoning;
        if (f.open_id < 0 || f.close_id < 0)
            return bad("an output constraint or tools with a reasoning model need its thinking markers as tokens of "
                       "their own, which this model's vocabulary lacks: turn the thinking off",
                       req.constraint ? req.constraint->first : req.tools.field);
        base.make_processor = [inner = std::move(base.make_processor), f, from = plan.reasoning_from,
                               budget = req.reasoning.budget] {
            return make_reasoning_processor(f, from, budget, inner ? inner() : nullptr);
        };
    }

    plan.n = req.n;
    plan.beam = base.beam.width > 0;
    plan.n_seqs = plan.beam ? req.n : req.best_of; // beams come back ranked by the engine
    base.n = plan.n_seqs;
    // echo with logprobs scores the prompt (and with max_tokens 0 is only that)
    base.score_prompt = req.echo && (req.logprobs || base.max_tokens == 0);
    if (grounded) {
        // The documents are retrieved from when, rendered whole, they leave the reply less than
        // min(max_tokens, a quarter of the context).
        grounded->base = std::move(base);
        grounded->budget =
            std::min(ms.max_prompt_tokens, ms.n_ctx - std::min<int32_t>(grounded->base.max_tokens, ms.n_ctx / 4));
        grounded->query = question_of(grounded->messages);
        if (int32_t(prompts[0].size()) <= grounded->budget) {
            const std::vector<document> docs = grounded->ground.documents;
            ground_plan(plan, *grounded, docs, std::move(prompts[0]), ms);
        } else {
            plan.retrieval = std::move(grounded);
        }
        return plan;
    }
    for (auto& p : prompts) {
        engine_request r = base;
        if (req.echo) plan.echo.push_back(tok.decode(p));
        r.prompt = std::move(p);
        plan.requests.push_back(std::move(r));
    }
    return plan;
}

std::vector<token_id> grounded_prompt(const pending_grounding& g, const std::vector<document>& docs,
                                      const model_state& ms) {
    std::vector<chat_message> messages = g.messages;
    add_documents(docs, messages);
    return ms.bundle.tok->encode(ms.tmpl.render(messages, true, {}), false, true);
}

void ground_plan(generation_plan& plan, const pending_grounding& g, std::vector<document> docs,
                 std::vector<token_id> prompt, const model_state& ms) {
    engine_request r = g.base;
    r.prompt = std::move(prompt);
    if (g.ground.strict) {
        std::vector<std::string> texts;
        for (const document& d : docs) texts.push_back(d.text);
        // built once (its table of tokens that open a quote too); each sequence gets a copy
        std::shared_ptr<const logits_processor> strict =
            make_strict_quotes(std::make_shared<const document_index>(texts, true), ms.guides->vocab());
        r.make_processor = [strict] { return strict->clone(); };
        plan.strict = true;
    }
    if (g.ground.cite) {
        grounding shown = g.ground;
        shown.documents = docs;
        r.observer = make_citation_observer(shown);
        plan.documents = std::move(docs);
    }
    plan.requests.push_back(std::move(r));
}

std::string question_of(const std::vector<chat_message>& messages) {
    for (auto it = messages.rbegin(); it != messages.rend(); ++it)
        if (it->role == "user") return it->content;
    return messages.empty() ? std::string() : messages.back().content;
}

api_error submit_error(submit_status s) {
    if (s == submit_status::queue_full)
        return {429, "the daemon is at capacity; try again shortly", "server_error", "", "server_busy", 1};
    if (s == submit_status::too_long)
        return {400, "the prompt and max_tokens do not fit in the context or the KV cache", "invalid_request_error",
                "max_tokens", "context_length_exceeded"};
    return {503, "the daemon is shutting down", "server_error", "", "shutting_down", 5};
}

std::string too_long_message(const engine_request& r, const model_state& ms) {
    const int64_t n_prompt = int64_t(r.prompt.size());
    const int64_t max_tokens = std::clamp<int64_t>(r.max_tokens, 0, ms.n_ctx - n_prompt);
    const engine_stats es = ms.eng->stats();
    return fmt::format("the prompt ({} tokens) with {} sequence(s) of up to {} tokens each does not fit in the KV pool "
                       "({} pages of {} tokens) even with nothing else running: lower n, best_of or max_tokens, or "
                       "raise kv_cache_mb in tandemd.conf",
                       n_prompt, std::max(r.n, r.beam.width), max_tokens, es.n_pages_total, es.page_size);
}

} // namespace tandem::daemon
