// The constraint engine on its own, as `tandem guide check|bench` and the tests run it: a
// JSON text's tokens walked through a compiled schema's masks (does each token pass its mask,
// and does the text end where the grammar may), with the time of each mask; and MaskBench's
// files (jsonschemabench, maskbench/data) read and run schema by schema.
#pragma once

#include "runtime/grammar/json_schema.hpp"
#include "runtime/grammar/token_mask.hpp"
#include "runtime/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace tandem::grammar {

// A value as Python's json.dumps writes it by default: ", " and ": " separators, keys in the
// object's order, ensure_ascii (\uXXXX for every character outside space..~, lower-case hex,
// surrogate pairs past U+FFFF; \" \\ \n \r \t \b \f), floats as repr (shortest round trip,
// "1.0" for integral values, exponent form below 1e-4 and from 1e16).
std::string python_json_dumps(const nlohmann::ordered_json& v);

// The tokens of `text` whose pieces are exactly its bytes: the tokenizer's own encoding when
// its pieces spell the text (a SentencePiece space prefix taken off the first token), else the
// longest piece at each position.
std::vector<token_id> tokens_of(const tokenizer& tok, const vocab_trie& vocab, std::string_view text);

struct walk_result {
    bool accepted = false;  // every token passed its mask and the end was allowed after the last
    int32_t n_tokens = 0;
    int32_t rejected_at = -1; // the token that failed its mask (n_tokens: the end was not allowed)
    std::vector<double> mask_us; // one per mask computed
};

// Walks `tokens` from the grammar's start: a mask before each token and one for the end.
walk_result walk_tokens(mask_cache& cache, const std::vector<token_id>& tokens);

struct bench_options {
    whitespace ws = whitespace::bounded;
    int32_t max_tokens = 4096; // tokens of an instance walked at most (the rest counts as passed)
};

struct schema_run {
    std::string id;
    bool compiled = false;
    std::string error;         // why not
    double compile_us = 0;     // the schema to its mask cache
    double ttfm_us = 0;        // compile and the first mask
    size_t n_rules = 0, n_elems = 0;
    int32_t n_valid = 0, n_invalid = 0;
    int32_t valid_rejected = 0, invalid_accepted = 0;
    std::vector<std::string> failures; // which instances, and where
    std::vector<double> mask_us;       // every mask after the first
};

// One MaskBench entry ({"schema", "tests": [{"valid", "data", "description"}]}, `id` from the
// entry or given).
schema_run run_schema(const nlohmann::ordered_json& entry, const std::string& id, const tokenizer& tok,
                      const std::shared_ptr<const vocab_trie>& vocab, const bench_options& opt = {});

// The entries of a MaskBench file: one entry, or an array of them (the development set's form,
// each with an "id").
std::vector<std::pair<std::string, nlohmann::ordered_json>> read_maskbench(const std::string& path);

// p in [0, 1] of sorted values (0 when empty).
double percentile(const std::vector<double>& sorted, double p);

} // namespace tandem::grammar
