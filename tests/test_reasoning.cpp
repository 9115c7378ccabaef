// Reasoning replies (runtime/reasoning.hpp): the splitter over every way of cutting a reply
// into pieces (markers split across them), where a reply starts, and the processor that bounds
// the thinking and applies an output constraint only after it.
#include "runtime/reasoning.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace tandem;

namespace {

struct split {
    std::string reasoning, content;
};

// The reply fed in pieces of `step` bytes (the last piece marked last).
split feed_in_steps(std::string_view reply, size_t step, reasoning_start start) {
    reasoning_splitter s(reasoning_format{}, start);
    split out;
    for (size_t i = 0; i < reply.size(); i += step) {
        const bool last = i + step >= reply.size();
        const auto p = s.feed(reply.substr(i, step), last);
        out.reasoning += p.reasoning;
        out.content += p.content;
    }
    if (reply.empty()) {
        const auto p = s.feed("", true);
        out.reasoning += p.reasoning;
        out.content += p.content;
    }
    return out;
}

void check_all_steps(std::string_view reply, reasoning_start start, const std::string& reasoning,
                     const std::string& content) {
    for (size_t step = 1; step <= reply.size() + 1; ++step) {
        CAPTURE(step);
        const split s = feed_in_steps(reply, step, start);
        CHECK(s.reasoning == reasoning);
        CHECK(s.content == content);
    }
}

} // namespace

TEST_CASE("a reply's thinking and content split the same however the reply is cut") {
    check_all_steps("<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.", reasoning_start::maybe, "Let me see: 2+2.\n",
                    "It is 4.");
    // the template opened the thinking (DeepSeek-R1's generation prompt)
    check_all_steps("I add them.</think>4", reasoning_start::thinking, "I add them.", "4");
    // no thinking: all content, the leading whitespace kept
    check_all_steps("  Hello <think> there", reasoning_start::maybe, "", "  Hello <think> there");
    // thinking turned off: the prompt closed it; a marker in the reply is only text
    check_all_steps("\n<think>x</think>y", reasoning_start::content, "", "<think>x</think>y");
    // a reply cut off while it thinks: everything is thinking, a partial marker included
    check_all_steps("<think>still thinking </thi", reasoning_start::maybe, "still thinking </thi", "");
    // the start of a marker that is not one
    check_all_steps("<thin>k", reasoning_start::maybe, "", "<thin>k");
    check_all_steps("<think>a </thin b</think>c", reasoning_start::maybe, "a </thin b", "c");
    check_all_steps("", reasoning_start::maybe, "", "");
}

TEST_CASE("where a reply starts is read from the prompt's end") {
    const reasoning_format f;
    CHECK(start_of(f, "<|im_start|>assistant\n") == reasoning_start::maybe);
    CHECK(start_of(f, "<|Assistant|><think>\n") == reasoning_start::thinking);
    CHECK(start_of(f, "<|im_start|>assistant\n<think>\n\n</think>\n\n") == reasoning_start::content);
    CHECK(start_of(f, f.disabled_suffix()) == reasoning_start::content);
}

namespace {

constexpr token_id open_tok = 5, close_tok = 6, a_tok = 1, b_tok = 2;
constexpr float ban = -std::numeric_limits<float>::infinity();

// An inner constraint that allows only token b, and counts what it was told.
struct only_b final : logits_processor {
    int* n_accepted;
    explicit only_b(int* n) : n_accepted(n) {}
    std::string_view name() const override { return "only_b"; }
    void apply(std::span<float> logits, std::span<const token_id>) override {
        for (size_t i = 0; i < logits.size(); ++i)
            if (token_id(i) != b_tok) logits[i] = ban;
    }
    void accept(token_id) override { ++*n_accepted; }
    void rewind(int32_t n) override { *n_accepted -= n; }
    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<only_b>(n_accepted); }
};

reasoning_format token_format() {
    reasoning_format f;
    f.open_id = open_tok;
    f.close_id = close_tok;
    return f;
}

std::vector<float> applied(logits_processor& p) {
    std::vector<float> l(8, 1.0f);
    p.apply(l, {});
    return l;
}

} // namespace

TEST_CASE("the thinking is bounded, and a constraint applies only after it") {
    int n_inner = 0;
    auto p = make_reasoning_processor(token_format(), reasoning_start::maybe, 2, std::make_unique<only_b>(&n_inner));
    // before: the constraint's tokens, and the open marker
    auto l = applied(*p);
    CHECK(l[open_tok] == 1.0f);
    CHECK(l[b_tok] == 1.0f);
    CHECK(l[a_tok] == ban);
    p->accept(open_tok);
    // thinking: free, but the open marker cannot come again
    l = applied(*p);
    CHECK(l[a_tok] == 1.0f);
    CHECK(l[open_tok] == ban);
    p->accept(a_tok);
    p->accept(a_tok);
    // the budget (2) is spent: only the close marker
    l = applied(*p);
    CHECK(l[close_tok] == 1.0f);
    CHECK(l[a_tok] == ban);
    CHECK(l[b_tok] == ban);
    p->accept(close_tok);
    CHECK(n_inner == 0); // the constraint saw none of the thinking
    l = applied(*p);
    CHECK(l[b_tok] == 1.0f);
    CHECK(l[a_tok] == ban);
    p->accept(b_tok);
    CHECK(n_inner == 1);
    // rejected drafts: back into the thinking, the budget's count restored
    p->rewind(3);
    CHECK(n_inner == 0);
    l = applied(*p);
    CHECK(l[a_tok] == 1.0f);
    CHECK(l[close_tok] == 1.0f);
    p->accept(a_tok);
    auto copy = p->clone();
    l = applied(*copy);
    CHECK(l[a_tok] == ban); // the copy's budget is spent too
    CHECK(l[close_tok] == 1.0f);
}

TEST_CASE("a reply that does not think goes to its constraint from its first token") {
    int n_inner = 0;
    auto p = make_reasoning_processor(token_format(), reasoning_start::maybe, -1, std::make_unique<only_b>(&n_inner));
    p->accept(b_tok);
    CHECK(n_inner == 1);
    const auto l = applied(*p);
    CHECK(l[open_tok] == ban);
    CHECK(l[b_tok] == 1.0f);
    // unbounded thinking is never closed by force
    auto q = make_reasoning_processor(token_format(), reasoning_start::thinking, -1, nullptr);
    for (int i = 0; i < 100; ++i) q->accept(a_tok);
    CHECK(applied(*q)[a_tok] == 1.0f);
    // a budget of 0 closes at once
    auto z = make_reasoning_processor(token_format(), reasoning_start::thinking, 0, nullptr);
    CHECK(applied(*z)[a_tok] == ban);
}
