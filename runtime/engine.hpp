// The engine service: requests in, token events out; continuous batching behind an interface.
#pragma once

#include "runtime/citations.hpp"
#include "runtime/logits_processor.hpp"
#include "runtime/model_config.hpp"
#include "runtime/sampler.hpp"
#include "runtime/scheduler.hpp"
#include "runtime/tokenizer.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem {

class kv_cache;
class model;
class runner;
struct batch;

using steady_time = std::chrono::steady_clock::time_point;

struct engine_event;

// Where a sequence's drafts come from.
enum class draft_source : uint8_t {
    automatic, // the engine's draft model when it has one, else prompt lookup
    ngram,     // prompt lookup
    model,     // the draft model
    replay,    // engine_request::replay: a benchmark's upper bound (drafts that are the output)
};

// Watches one request's output as the engine accepts it (citations, tool-call parsing): called
// on the engine thread before each of the request's events goes to its sink, it may amend the
// event and end a sequence. It must be quick and not throw.
class output_observer {
public:
    virtual ~output_observer() = default;
    // Sequence ev.index accepted token ev.id (its text so far released in ev.text). False ends
    // the sequence after it (finish_reason "stop").
    virtual bool on_token(engine_event& ev) = 0;
    // The sequence's done event.
    virtual void on_done(engine_event& ev) { (void)ev; }
};

// Beam search: the `width` likeliest continuations are searched together, each a sequence of
// the request's group, all of them in every decode step; after each step the best `width`
// of their extensions go on (a beam chosen twice forks, sharing its pages; one not chosen is
// removed at once). A beam ends at EOS (unless ignore_eos), a stop string or max_tokens, and
// then scores sum(logprob) / length^length_penalty (EOS's logprob counted, not its length).
// The request's n best finished beams come back, best first, when the search ends.
struct beam_params {
    int32_t width = 0;                // beams searched (>= the request's n); 0: no beam search
    float length_penalty = 1.0f;
    // When the search ends, with `width` beams finished (Hugging Face's early_stopping):
    // early (true) at once; heuristic (false) when no live beam, scored at its length now,
    // beats the worst finished one; never when none could at max_tokens (length_penalty > 0).
    enum class stopping : uint8_t { heuristic, early, never } early_stopping = stopping::heuristic;
};

// One generation: everything the engine needs, already validated by the front end.
struct engine_request {
    std::vector<token_id> prompt;     // non-empty
    int32_t max_tokens = 16;          // >= 1 (0 with score_prompt: the prompt only); cut to what the context holds
    sampling_params sampling;
    std::vector<std::string> stop;    // stop strings (not part of the output)
    bool ignore_eos = false;
    int32_t n_top_logprobs = -1;      // -1: no logprobs; 0: the chosen token's; n: and the top n
    // Prompt scoring: every prompt token's logprob given the tokens before it (and the top
    // n_top_logprobs alternatives), sent as one event (engine_event::prompt) once the prompt
    // is computed. Its positions are computed, never taken from the prefix cache.
    bool score_prompt = false;
    // Embedding: the prompt's final hidden states (after the output norm) pooled so and
    // L2-normalised, carried by the done event (engine_event::embedding); nothing is generated
    // (max_tokens, n, beams, drafts and score_prompt do not apply). Mean pooling computes every
    // position, never taking one from the prefix cache.
    std::optional<pooling_type> embed;
    int32_t priority = 0;             // higher joins first; waiting raises it (no starvation)
    int32_t n = 1;                    // sequences sampled from the prompt (computed once, its pages shared);
                                      // sequence k samples with seed + k when a seed is set; with
                                      // beam search, the beams returned
    beam_params beam;                 // beam search (greedy: no temperature, top_k/p, min_p)
    // Makes one more logits processor for each sequence (a grammar mask), applied after the
    // sampling parameters' own and told each token the sequence accepts. Called by submit(),
    // once per sequence.
    std::function<std::unique_ptr<logits_processor>()> make_processor;
    std::shared_ptr<output_observer> observer; // optional; shared by the request's sequences
    // Speculative decoding (runtime/speculation.hpp): after each sampled token, up to this many
    // drafts (from the sequence's own tokens, or the draft model) are computed with it in one
    // step and verified row by row, so the output is distributed as plain decoding's (and is
    // plain decoding's, token for token, when greedy or with prompt lookup). 0: off; -1:
    // engine_options::max_draft_tokens (the daemon's draft_tokens); cut to that. How many are
    // proposed adapts to how many were accepted (fewer while they fail, a pause when none are).
    int32_t draft_tokens = -1;
    draft_source drafts = draft_source::automatic; // model: ngram when the engine has no draft model
    std::vector<token_id> replay;     // draft_source::replay: the drafts after generated token i are replay[i + 1 ..]
};

// A prompt token scored (engine_request::score_prompt).
struct prompt_token {
    token_id id = -1;
    float logprob = 0;                // NaN for the first token: nothing predicts it
    std::vector<token_logprob> top;   // the likeliest tokens at its position (none for the first)
};

// What the engine reports about one request, per sequence (index) in order: zero or more
// token events, then exactly one event with done set. The request is over when each of its
// n sequences has sent its done event. Beam search sends every event when the search ends,
// index k being the k-th best beam. With score_prompt, sequence 0's first event carries the
// scored prompt (not a token: id -1) for all of them.
struct engine_event {
    bool done = false;
    int32_t index = 0;                // the sequence of the request (0..n-1)
    token_id id = -1;                 // the generated token (token events)
    std::string text;                 // text released now: complete UTF-8, stop strings cut
    float logprob = 0;                // when logprobs were asked for
    std::vector<token_logprob> top;   // the top n alternatives, highest first
    steady_time t{};                  // when it was produced
    // done events only:
    std::string finish_reason;        // "stop", "length", "cancelled", "error"
    std::string error;                // with "error": what went wrong, one line
    int32_t n_prompt = 0;
    int32_t n_cached = 0;             // of n_prompt, tokens reused from the prefix cache (not computed)
    int32_t n_generated = 0;          // sampled tokens, a final EOS included
    token_id final_token = -1;        // the end-of-generation token that ended it (sent as no token event)
    std::string stop_string;          // the stop string that ended it (finish_reason "stop"), if one did
    int32_t n_draft_tokens = 0;       // speculative drafts computed for the sequence
    int32_t n_accepted_tokens = 0;    // of those, accepted
    double score = 0;                 // beam search: the beam's score (its rank's order)
    double cumulative_logprob = 0;    // the sum of its tokens' logprobs, EOS included (done events)
    std::vector<prompt_token> prompt; // score_prompt: the prompt scored (index 0, before any token event; id -1)
    std::vector<citation> citations;  // set by a citation observer: the citations that closed with this event
    std::vector<float> embedding;     // embed: the prompt's embedding [n_embd] (its done event, when it ended "stop")
    steady_time t_admitted{};         // when the request joined the batch (zero if it never did)
};

// Called on an engine thread, in order, for one request; it must be quick and not throw
// (the daemon posts the event to its io_context).
using engine_sink = std::function<void(engine_event&&)>;

enum class submit_status {
    ok,
    queue_full,   // over capacity: try again later
    too_long,     // the prompt does not fit in the context or the KV pool, ever
    stopped,      // the engine is shutting down
};

struct submit_result {
    submit_status status = submit_status::ok;
    uint64_t id = 0;                  // valid when ok
};

// The sequences of a request, as batches name them: (request id << 16) | index (its n
// choices or beams), so a sequence names its owner.
constexpr int seq_bits = 16;
constexpr uint64_t seq_id_of(uint64_t request, int32_t index) { return request << seq_bits | uint64_t(index); }
constexpr uint64_t request_of(uint64_t seq) { return seq >> seq_bits; }
constexpr int32_t index_of(uint64_t seq) { return int32_t(seq & ((uint64_t(1) << seq_bits) - 1)); }

struct engine_stats {
    int32_t n_running = 0;
    int32_t n_waiting = 0;
    int32_t n_pages_used = 0;
    int32_t n_pages_peak = 0;         // the most pages in use at once since the engine started
    int32_t n_pages_total = 0;
    int32_t page_size = 0;
    int32_t n_ctx = 0;
    uint64_t n_steps = 0;
    uint64_t n_prompt_tokens = 0;     // prompt tokens of admitted requests
    uint64_t n_generated_tokens = 0;  // tokens sampled
    uint64_t n_prefix_hits = 0;       // prompt tokens reused from the prefix cache
    int64_t n_kv_tokens = 0;          // positions stored (or being written) in referenced pages, shared pages once
    int32_t n_pages_cached = 0;       // free pages still holding a cached prefix
    uint64_t n_preemptions = 0;       // sequences sent back to wait (pages freed, recomputed later)
    uint64_t n_worker_restarts = 0;   // worker processes restarted after a crash
    uint64_t n_kv_upload_bytes = 0;   // past K/V GPU workers copied from the pool's pages to the device
    uint64_t n_kv_kept_bytes = 0;     // past K/V GPU workers read from device pages they held already
    uint64_t n_drafts = 0;            // speculative steps: a sequence's drafts verified together
    uint64_t n_draft_tokens = 0;      // speculative drafts computed
    uint64_t n_accepted_tokens = 0;   // of those, accepted
    static constexpr int max_draft_positions = 16;
    std::array<uint64_t, max_draft_positions> n_accepted_at{}; // accepted drafts by position in their step (0: the first)
    std::string draft_device;         // where the draft model runs; empty without one
};

// The interface the daemon uses, whatever computes behind it (one process, or prefill and
// decode worker processes: make_engine with their executors).
class engine {
public:
    virtual ~engine() = default;
    // Queues a request; its events go to `sink`. A rejection is a value, never an exception.
    virtual submit_result submit(engine_request req, engine_sink sink) = 0;
    // Stops a request at the next step boundary and frees its pages; its sink then gets a
    // done event with "cancelled" (unless it had already finished). Unknown ids are ignored.
    virtual void cancel(uint64_t id) = 0;
    virtual engine_stats stats() const = 0;
    // Waits up to `timeout` for every executor to be up (workers have loaded the model):
    // true when they are; false on timeout, or with `failure` set when one cannot start.
    virtual bool wait_ready(std::chrono::milliseconds timeout, std::string& failure) {
        (void)timeout;
        failure.clear();
        return true;
    }
    // Cancels everything still queued or running and joins the engine's threads.
    virtual void stop() = 0;
};

struct engine_options {
    int n_threads = 1;
    int32_t n_ctx = 0;                // 0: the model's training context
    // The scheduler's own: page_size, n_pages (the KV pool; 0: enough for max_running full
    // contexts), max_running (sequences in one batch), step_tokens (a step's token budget,
    // prefill chunked to fit), decode_tokens, max_logits (0: max_running * decode_tokens),
    // prefix_cache, prefix_seed (the model fingerprint), priority_aging_s,
    // background_step_tokens. The engine sets kv_window from the model.
    scheduler_options sched;
    int32_t max_waiting = 64;         // queued requests beyond a full batch; more are refused
    int32_t max_draft_tokens = 0;     // drafts a request may ask for; decode_tokens becomes at least 1 + this
    int32_t max_draft_batch = 4;      // drafts only while at most this many sequences run (a larger
                                      // step is compute-bound: a draft costs about what a token does)
    double draft_cost = 0;            // a draft token's cost over a decode step, which the policy weighs
                                      // (runtime/speculation.hpp drafts_worth); 0: measured from the decode steps
    // A draft model (same vocabulary; not owned, outlives the engine): the engine runs it on
    // its own thread, with its own page pool of n_pages pages, for requests that draft from it.
    model* draft_model = nullptr;
};

// The options an engine runs with: the defaults filled in (the model's context, a pool of
// max_running full contexts and never less than one, so any request the context allows can
// run), step_tokens raised to hold a full decode step and one more token.
engine_options resolve_options(engine_options o, const model_config& c);

// Runs planned batches somewhere: on the engine thread (in-process), or in a worker process.
// One batch at a time; the engine plans a new one when the executor is ready again.
class executor {
public:
    struct outcome {
        bool ok = true;
        bool crashed = false;         // the worker died: its batch may be retried
        std::string error;            // when !ok
    };
    virtual ~executor() = default;
    virtual std::string name() const = 0;
    // Which work it takes: prefill chunks, decode steps, or both in one flat batch.
    virtual work_kind kind() const = 0;
    // Alive and without a batch in flight.
    virtual bool ready() = 0;
    // Starts running `b` (it stays valid until the outcome is taken).
    virtual void start(const batch& b) = 0;
    // The outcome of the batch in flight once there is one (never blocks); also does the
    // executor's housekeeping (restarting a dead worker).
    virtual std::optional<outcome> poll() = 0;
    // After an ok outcome: logits row `row` of the batch (the row-th token that wanted
    // logits), valid until the next start().
    virtual std::span<const float> logits(int32_t row) = 0;
    // Fds that become readable when poll() has news; empty when poll() never waits.
    virtual std::vector<int> wait_fds() = 0;
    // Longest wait before poll() must be called again (a restart backoff, a start timeout).
    virtual std::chrono::milliseconds poll_interval() const { return std::chrono::milliseconds(1000); }
    virtual uint64_t n_restarts() const { return 0; }
    // Past K/V bytes a GPU worker uploaded and found on the device already, over its life.
    struct device_kv_bytes {
        uint64_t uploaded = 0, kept = 0;
    };
    virtual device_kv_bytes device_kv() const { return {}; }
    // Has been ready once (a worker loaded its model and said hello).
    virtual bool up() const { return true; }
    // Non-empty when it cannot work at all (its worker died while starting, or cannot be
    // started again); the engine then ends every request with it.
    virtual std::string failure() const { return {}; }
    // Ends the executor (workers exit); called from the engine thread as it stops.
    virtual void shutdown() {}
};

// What an engine runs on, besides the model's shape: its executors, where the prefix
// cache's page table is kept (may be null), and the cached pages to restore first.
struct engine_parts {
    std::vector<std::unique_ptr<executor>> executors;
    page_store* store = nullptr;                       // not owned; outlives the engine
    std::function<void(scheduler&)> restore;           // called once, before any request
};

// Pages of a private kv_cache (the in-process engine's): copy-on-write is a memcpy, nothing
// is persisted.
std::unique_ptr<page_store> make_local_store(kv_cache& kv);

// The engine: continuous batching over a scheduler (prefix cache, chunked prefill,
// preemption) and any set of executors, on one engine thread.
std::unique_ptr<engine> make_engine(const model_config& cfg, const tokenizer& tok, const engine_options& opts,
                                    engine_parts parts);

// The in-process engine: one executor on the engine thread runs every running sequence's
// next tokens (decodes and prefill chunks) as one flat batch through model::forward over a
// private page pool. Greedy outputs equal the solo outputs because every token's row is
// computed the same way whatever else is in the batch.
std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts);
// The same on a given runner (make_runner: the caller's execution context).
std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts,
                                          std::unique_ptr<runner> r);

} // namespace tandem
