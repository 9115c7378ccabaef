// Engine test fixtures: the stories260K bundle, a request's event collector, greedy requests.
#pragma once

#include "runtime/engine.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "test_util.hpp"

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::test {

inline model_bundle& stories() {
    static model_bundle b = load_model(test::model_path("stories260K.gguf"));
    return b;
}

// Collects one request's events; wait() blocks until its sequences' done events.
struct collector {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<token_id> ids;                 // every sequence's, as they came
    std::vector<std::vector<token_id>> by_seq; // [index] each sequence's
    std::vector<std::vector<float>> logprobs;  // [index] each sequence's chosen tokens' (with logprobs)
    std::string text;
    std::string finish;
    std::string error;                         // the done event's, with finish "error"
    int32_t n_generated = -1;
    int32_t n_draft_tokens = 0, n_accepted_tokens = 0; // summed over the sequences
    std::vector<std::string> finishes;         // [index] each sequence's finish reason
    std::vector<token_id> final_tokens;        // [index] the EOS that ended it, or -1
    std::vector<double> scores, sums;          // [index] beam search's score; cumulative logprob
    std::vector<prompt_token> prompt;          // score_prompt: the scored prompt
    std::vector<float> embedding;              // embed: the done event's embedding
    int32_t n_cached = -1;                     // the done event's prefix-cache reuse
    int32_t n_seqs = 1, n_done = 0;            // done once n_seqs done events came (a request's n)
    bool done = false;

    engine_sink sink() {
        return [this](engine_event&& ev) {
            std::lock_guard lock(mu);
            text += ev.text;
            if (!ev.prompt.empty()) { // the scored prompt (score_prompt): not a token
                prompt = ev.prompt;
                return;
            }
            if (!ev.done) {
                ids.push_back(ev.id);
                if (by_seq.size() <= size_t(ev.index)) {
                    by_seq.resize(size_t(ev.index) + 1);
                    logprobs.resize(size_t(ev.index) + 1);
                }
                by_seq[size_t(ev.index)].push_back(ev.id);
                logprobs[size_t(ev.index)].push_back(ev.logprob);
                cv.notify_all();
                return;
            }
            finish = ev.finish_reason;
            error = ev.error;
            n_generated = ev.n_generated;
            n_cached = ev.n_cached;
            if (!ev.embedding.empty()) embedding = ev.embedding;
            const size_t k = size_t(ev.index);
            if (finishes.size() <= k) {
                finishes.resize(k + 1);
                final_tokens.resize(k + 1, -1);
                scores.resize(k + 1);
                sums.resize(k + 1);
            }
            finishes[k] = ev.finish_reason;
            final_tokens[k] = ev.final_token;
            scores[k] = ev.score;
            sums[k] = ev.cumulative_logprob;
            n_draft_tokens += ev.n_draft_tokens;
            n_accepted_tokens += ev.n_accepted_tokens;
            if (++n_done < n_seqs) return;
            done = true;
            cv.notify_all();
        };
    }
    // Until `n` tokens came (of any sequence), or the request ended.
    bool wait_tokens(size_t n, double seconds = 60) {
        std::unique_lock lock(mu);
        return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done || ids.size() >= n; }) &&
               ids.size() >= n;
    }
    bool wait(double seconds = 60) {
        std::unique_lock lock(mu);
        return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; });
    }
};

inline engine_request greedy(const std::string& prompt, int32_t n, bool ignore_eos = true) {
    engine_request r;
    r.prompt = stories().tok->encode(prompt, true, false);
    r.max_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = ignore_eos;
    return r;
}

} // namespace tandem::test
