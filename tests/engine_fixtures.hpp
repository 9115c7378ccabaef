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

// Collects one request's events; wait() blocks until its done event.
struct collector {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<token_id> ids;
    std::string text;
    std::string finish;
    int32_t n_generated = -1;
    int32_t n_draft_tokens = 0, n_accepted_tokens = 0;
    bool done = false;

    engine_sink sink() {
        return [this](engine_event&& ev) {
            std::lock_guard lock(mu);
            text += ev.text;
            if (!ev.done) {
                ids.push_back(ev.id);
                return;
            }
            finish = ev.finish_reason;
            n_generated = ev.n_generated;
            n_draft_tokens = ev.n_draft_tokens;
            n_accepted_tokens = ev.n_accepted_tokens;
            done = true;
            cv.notify_all();
        };
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
