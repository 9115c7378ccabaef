// Guided generation's seam to the engine: a request's constraint, compiled once per distinct
// constraint (a cache shared by the requests), and the logits processor that masks each
// sequence's next token with it.
#pragma once

#include "runtime/grammar/json_schema.hpp"
#include "runtime/grammar/token_mask.hpp"
#include "runtime/logits_processor.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::grammar {

// What a request constrains its output to. `text` is the schema (JSON text), the regular
// expression, the GBNF grammar, the choices (a JSON array of strings), or the tools
// (tools_constraint_text: calls to the request's functions). `ws` is the whitespace JSON
// may have between tokens (json_object, json_schema and tools), `closed_objects` whether
// objects that list properties may have others (json_schema and tools; json_schema.hpp).
struct constraint {
    enum class kind : uint8_t { json_object, json_schema, regex, gbnf, choice, tools };
    kind k = kind::json_object;
    std::string text;
    whitespace ws = whitespace::bounded;
    bool closed_objects = false; // json_options::closed_objects (json_schema and tools)
    bool operator<(const constraint& o) const {
        return std::tie(k, text, ws, closed_objects) < std::tie(o.k, o.text, o.ws, o.closed_objects);
    }
};

std::string_view kind_name(constraint::kind k);

// The compiled grammar of a constraint (grammar_error when it cannot be honoured, or its
// compilation goes past `budget`).
std::shared_ptr<const compiled> compile(const constraint& c,
                                        std::chrono::milliseconds budget = std::chrono::milliseconds(2000));

// Counters for the metrics: compile and mask times in microseconds, bucketed.
struct guide_stats {
    static constexpr std::array<double, 10> bounds_us{10, 25, 50, 100, 250, 500, 1000, 10000, 100000, 1000000};
    struct hist {
        std::array<std::atomic<uint64_t>, bounds_us.size() + 1> counts{};
        std::atomic<uint64_t> n{0}, sum_us{0};
        void observe(double us);
    };
    hist compile_us, mask_us;
    std::atomic<uint64_t> n_compile_cache_hits{0};
};

// For each partial match of a trigger (its first j bytes matched, j < its length), the
// tokens that would complete it and where in the token the trigger ends.
struct trigger_table {
    std::string trigger;
    bool anchored = false;
    std::vector<std::vector<std::pair<token_id, uint32_t>>> completing; // [j]: (token, end offset)

    trigger_table(const vocab_trie& vocab, std::string trigger, bool anchored);
    // The partial match after byte c from partial match j; -1: an anchored trigger can no
    // longer match. Returns the trigger's length when c completes it.
    int32_t step(int32_t j, uint8_t c) const;

private:
    std::vector<int32_t> fail_; // KMP failure function (unanchored)
};

// Compiled constraints and their mask caches for one vocabulary, the most recently used kept.
class guide_registry {
public:
    explicit guide_registry(std::shared_ptr<const vocab_trie> vocab, size_t capacity = 32);

    // The mask cache for c, compiled on first use; throws grammar_error.
    std::shared_ptr<mask_cache> get(const constraint& c,
                                    std::chrono::milliseconds budget = std::chrono::milliseconds(2000));
    // A processor for one sequence, at the grammar's start. With a trigger, the text is free
    // until the trigger appears (anywhere, or only at the start when anchored) and the
    // grammar's from there, the grammar starting with the trigger: tool calls with
    // tool_choice "auto". A token that would complete the trigger is allowed only when the
    // grammar accepts the rest of it.
    std::unique_ptr<logits_processor> make_processor(const std::shared_ptr<mask_cache>& cache,
                                                     std::string_view trigger = {}, bool anchored = false);

    const vocab_trie& vocab() const { return *vocab_; }
    guide_stats& stats() { return stats_; }

private:
    std::shared_ptr<const vocab_trie> vocab_;
    size_t capacity_;
    std::map<std::pair<std::string, bool>, std::shared_ptr<const trigger_table>> triggers_; // under mu_
    std::mutex mu_;
    std::list<constraint> lru_; // most recent first
    std::map<constraint, std::pair<std::shared_ptr<mask_cache>, std::list<constraint>::iterator>> map_;
    static constexpr size_t max_preparing = 2;
    std::vector<std::future<void>> preparing_; // classifications ahead running (a future's end waits for it)
    guide_stats stats_;
};

// The processor alone (tests and the offline CLI build it without a registry). `trigger`
// as guide_registry::make_processor's (null: the grammar applies from the start).
std::unique_ptr<logits_processor> make_grammar_processor(std::shared_ptr<mask_cache> cache,
                                                         guide_stats* stats = nullptr,
                                                         std::shared_ptr<const trigger_table> trigger = nullptr);

} // namespace tandem::grammar
