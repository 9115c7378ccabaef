// The batch type: building it sequence by sequence, and checking it against a pool.
#include "runtime/batch.hpp"

#include "runtime/error.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace tandem {

std::span<const token_id> batch::seq_tokens(int32_t i) const {
    return std::span(tokens).subspan(size_t(tok_begin[size_t(i)]), size_t(n_new(i)));
}

std::span<const int32_t> batch::table(int32_t i) const {
    const size_t b = size_t(table_begin[size_t(i)]), e = size_t(table_begin[size_t(i) + 1]);
    return std::span(tables).subspan(b, e - b);
}

std::span<const uint32_t> batch::table_generations(int32_t i) const {
    if (generations.empty()) return {};
    const size_t b = size_t(table_begin[size_t(i)]), e = size_t(table_begin[size_t(i) + 1]);
    return std::span(generations).subspan(b, e - b);
}

void batch::clear() {
    tokens.clear();
    pos.clear();
    seq.clear();
    wants_row.clear();
    seq_id.clear();
    tok_begin.assign(1, 0);
    table_begin.assign(1, 0);
    logits_begin.assign(1, 0);
    tables.clear();
    generations.clear();
}

void batch::add_seq(uint64_t id, int32_t n_past, std::span<const token_id> new_tokens, std::span<const int32_t> table,
                    std::span<const uint32_t> gens, int32_t logits_from, row_kind kind) {
    TANDEM_ASSERT(kind != row_kind::none);
    const size_t at = wants_row.size();
    add_seq(id, n_past, new_tokens, table, gens, std::span<const uint8_t>{});
    int32_t n = 0;
    for (size_t t = 0; t < new_tokens.size(); ++t) {
        const bool w = n_past + int32_t(t) >= logits_from;
        wants_row[at + t] = w ? uint8_t(kind) : uint8_t(row_kind::none);
        n += w;
    }
    if (kind == row_kind::pooled) n = std::min(n, 1);
    logits_begin.back() += n;
}

void batch::add_seq(uint64_t id, int32_t n_past, std::span<const token_id> new_tokens, std::span<const int32_t> table,
                    std::span<const uint32_t> gens, std::span<const uint8_t> wants) {
    TANDEM_ASSERT(!new_tokens.empty() && (wants.empty() || wants.size() == new_tokens.size()));
    TANDEM_ASSERT(rows_valid(wants), "a sequence's row kinds");
    // One batch has generations for every sequence or for none.
    const bool known = gens.size() == table.size() && generations.size() == tables.size();
    TANDEM_CHECK(known || (gens.empty() && generations.empty()), "generations for {} of {} pages", gens.size(),
                 table.size());
    const int32_t i = n_seqs();
    int32_t n_logits = 0;
    for (size_t t = 0; t < new_tokens.size(); ++t) {
        tokens.push_back(new_tokens[t]);
        pos.push_back(n_past + int32_t(t));
        seq.push_back(i);
        const uint8_t w = wants.empty() ? uint8_t(row_kind::none) : wants[t];
        wants_row.push_back(w);
        n_logits += w != 0 && (w != uint8_t(row_kind::pooled) || n_logits == 0);
    }
    seq_id.push_back(id);
    tables.insert(tables.end(), table.begin(), table.end());
    generations.insert(generations.end(), gens.begin(), gens.end());
    tok_begin.push_back(n_tokens());
    table_begin.push_back(int32_t(tables.size()));
    logits_begin.push_back(logits_begin.back() + n_logits);
}

bool batch::rows_valid(std::span<const uint8_t> wants) {
    bool pooled = false, other = false;
    for (uint8_t w : wants) {
        if (w > uint8_t(row_kind::pooled)) return false;
        pooled = pooled || w == uint8_t(row_kind::pooled);
        other = other || w == uint8_t(row_kind::logits) || w == uint8_t(row_kind::hidden);
    }
    return !(pooled && other);
}

std::optional<std::string> batch::check(int32_t page_size, int32_t n_pages, int32_t n_vocab) const {
    if (seq_id.empty()) return "empty batch";
    for (int32_t i = 0; i < n_seqs(); ++i) {
        const uint64_t id = seq_id[size_t(i)];
        const int64_t end = int64_t(n_past(i)) + n_new(i);
        const auto t = table(i);
        if (n_past(i) < 0 || int64_t(t.size()) * page_size < end)
            return fmt::format("sequence {}: {} pages cannot hold {} positions", id, t.size(), end);
        for (size_t j = 0; j < t.size(); ++j) {
            if (t[j] == no_page) {
                if (int64_t(j + 1) * page_size > n_past(i))
                    return fmt::format("sequence {}: no page for a new position in page {}", id, j);
                continue;
            }
            if (t[j] < 0 || t[j] >= n_pages) return fmt::format("sequence {}: page {} out of range", id, t[j]);
        }
        for (token_id tok : seq_tokens(i))
            if (tok < 0 || tok >= n_vocab) return fmt::format("sequence {}: token {} out of range", id, tok);
    }
    return std::nullopt;
}

batch one_sequence(std::span<const token_id> new_tokens, int32_t n_past, std::span<const int32_t> table) {
    batch b;
    b.add_seq(0, n_past, new_tokens, table, {}, n_past + int32_t(new_tokens.size()) - 1);
    return b;
}

} // namespace tandem
