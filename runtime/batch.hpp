// One step's work for a runner: flat per-token arrays and per-sequence offsets into one
// block-table array. The scheduler plans it, the wire carries it, model::forward reads it.
#pragma once

#include "runtime/attn_params.hpp" // no_page
#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem {

// What a token's row of a forward's output holds: its logits [n_vocab], or its final hidden
// state (after the output norm) in the row's first n_embd floats, which embeddings pool. The
// pooled tokens of a sequence share one row, the sum of their hidden states (mean pooling
// over a prompt computed in chunks: one row a chunk); such a sequence has no other rows.
enum class row_kind : uint8_t { none = 0, logits = 1, hidden = 2, pooled = 3 };

// Each sequence's new tokens are contiguous in the token arrays and sit at consecutive
// positions from its n_past; its block table covers every position up to its last new one.
// Output rows (n_vocab floats each) are the wanting tokens in token order: row r of a
// forward's output is the r-th token whose wants_row is not none, a sequence's pooled tokens
// counting as one. Built only through add_seq, so the offsets hold.
struct batch {
    // [n_tokens]
    std::vector<token_id> tokens;
    std::vector<int32_t> pos;
    std::vector<int32_t> seq;             // index of the token's sequence in this batch
    std::vector<uint8_t> wants_row;    // row_kind: a row for this token, and what it holds
    // [n_seqs]
    std::vector<uint64_t> seq_id;
    // [n_seqs + 1] offsets
    std::vector<int32_t> tok_begin{0};    // into the token arrays
    std::vector<int32_t> table_begin{0};  // into tables and generations
    std::vector<int32_t> logits_begin{0}; // into the logits rows
    std::vector<int32_t> tables;          // every sequence's block table, concatenated
    std::vector<uint32_t> generations;    // [tables.size()] each page's block_pool generation

    int32_t n_tokens() const { return int32_t(tokens.size()); }
    int32_t n_seqs() const { return int32_t(seq_id.size()); }
    int32_t n_logits() const { return logits_begin.back(); }
    bool empty() const { return tokens.empty(); }

    int32_t n_past(int32_t i) const { return pos[size_t(tok_begin[size_t(i)])]; }
    int32_t n_new(int32_t i) const { return tok_begin[size_t(i) + 1] - tok_begin[size_t(i)]; }
    std::span<const token_id> seq_tokens(int32_t i) const;
    std::span<const int32_t> table(int32_t i) const;
    std::span<const uint32_t> table_generations(int32_t i) const;
    // Logits rows [logits_begin(i), logits_begin(i + 1)) belong to sequence i.
    int32_t n_seq_logits(int32_t i) const { return logits_begin[size_t(i) + 1] - logits_begin[size_t(i)]; }

    void clear();
    bool operator==(const batch&) const = default;
    // Appends a sequence: tokens at positions n_past.., the token at position p wanting a
    // row of `kind` when p >= logits_from (the last new token when logits_from is its position).
    // generations is empty (unknown) or one per table entry, for every sequence of the batch
    // or for none (else tandem::error).
    void add_seq(uint64_t id, int32_t n_past, std::span<const token_id> new_tokens, std::span<const int32_t> table,
                 std::span<const uint32_t> generations, int32_t logits_from, row_kind kind = row_kind::logits);
    // The same with explicit per-token flags (the wire's decoder).
    void add_seq(uint64_t id, int32_t n_past, std::span<const token_id> new_tokens, std::span<const int32_t> table,
                 std::span<const uint32_t> generations, std::span<const uint8_t> wants);

    // Whether one sequence's per-token row kinds can be added: known kinds, and pooled tokens
    // only beside tokens without rows.
    static bool rows_valid(std::span<const uint8_t> wants);

    // Why the batch cannot run over a pool of n_pages pages of page_size positions with a
    // vocabulary of n_vocab (empty sequence, token out of range, a page out of the pool, a
    // table too short, or no page where a new position goes), or nullopt when it can.
    // Attention reads are checked by the ops, which know the window.
    std::optional<std::string> check(int32_t page_size, int32_t n_pages, int32_t n_vocab) const;
};

// A batch of one sequence (id 0) whose last new token wants logits: offline loops and tests.
batch one_sequence(std::span<const token_id> new_tokens, int32_t n_past, std::span<const int32_t> table);

} // namespace tandem
