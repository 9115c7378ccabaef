// Prompt rows as an engine policy: requests whose answer is about the prompt itself, read
// from the rows of its positions as the prompt is computed: every token's logprob (prompt
// scoring, engine_request::score_prompt) or the pooled hidden states (embeddings,
// engine_request::embed).
#pragma once

#include "runtime/batch.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/scheduler.hpp"

namespace tandem {

// Batch row i (sequence 0 of r, computing its prompt) has rows for prompt positions: each
// scores the next prompt token. Positions scored before (recomputed after a preemption) are
// passed over.
void score_prompt(request_state& r, const batch& b, int32_t i, executor& ex);
// r's prompt is computed and scored: the event with its scores goes, and from here only the
// last token of sequence `sid` wants a row.
void send_prompt_scores(request_state& r, uint64_t sid, scheduler& sched);
// Batch sequence i computed a chunk of embedding request r's prompt: its rows pooled into r
// (mean: summed in order; cls and last: the first or last position's row).
void pool_rows(request_state& r, const batch& b, int32_t i, executor& ex, int32_t n_embd);
// r's prompt is computed: its pooled hidden state, L2-normalised, is its embedding.
void finish_embedding(request_state& r);

} // namespace tandem
