// libFuzzer target for guided generation's compilers and matchers (runtime/grammar). The first
// byte picks the constraint kind (GBNF, regex in each mode, JSON Schema, choice, json_object,
// tools) or the tool-call parser, the second what to check; the text up to the first NUL is
// the constraint, the bytes after it drive the matcher. A constraint must compile or be
// refused with a grammar_error (the one exception the daemon turns into a 400); what compiles
// is driven byte by byte, and the fast matcher must agree with the reference (Earley) matcher
// on every byte's acceptance and on where the text may end; undo marks must restore the
// state; the token masks of the mask cache, on stories260K's vocabulary, must equal every
// token tried on the reference.
#include "runtime/gguf.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/grammar/matcher.hpp"
#include "runtime/grammar/reference.hpp"
#include "runtime/grammar/regex.hpp"
#include "runtime/grammar/token_mask.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "runtime/tokenizer.hpp"
#include "tests/test_util.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace tandem::grammar;

std::shared_ptr<const vocab_trie>* vocab = nullptr; // stories260K's, for the lifetime of the process

void require(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "fuzz_grammar: %s\n", what);
    std::abort();
}

std::shared_ptr<const compiled> compile_input(unsigned kind, const std::string& text) {
    const auto budget = std::chrono::milliseconds(1000);
    if (kind >= 1 && kind <= 3) { // regex in each mode (compile() has the whole-text one only)
        builder b;
        const rule_id root = b.add("root", regex_expr(b, text, {.search = kind == 2, .json_string = kind == 3}));
        build_limits lim;
        lim.deadline = std::chrono::steady_clock::now() + budget;
        return std::make_shared<const compiled>(b.build(root, lim));
    }
    constexpr constraint::kind kinds[] = {constraint::kind::gbnf,   constraint::kind::regex,
                                          constraint::kind::regex,  constraint::kind::regex,
                                          constraint::kind::json_schema, constraint::kind::choice,
                                          constraint::kind::json_object, constraint::kind::tools};
    return compile({kinds[kind], text}, budget);
}

// The bytes the fast matcher takes next (each tried and undone), checked against the reference.
std::vector<uint8_t> next_bytes(matcher& m, const reference_matcher& ref, bool check) {
    std::vector<uint8_t> out;
    for (int b = 0; b < 256; ++b) {
        const auto mk = m.checkpoint();
        const bool ok = m.advance(uint8_t(b));
        m.rollback(mk);
        m.drop(mk);
        if (check) require(ok == ref.can_feed(std::string_view(reinterpret_cast<const char*>(&b), 1)),
                           "the matcher and the reference disagree on a next byte");
        if (ok) out.push_back(uint8_t(b));
    }
    return out;
}

// The cache's mask against every token of the vocabulary tried on the reference.
void check_mask(mask_cache& cache, matcher& m, const reference_matcher& ref) {
    token_set got((*vocab)->n_vocab());
    cache.fill(m, got);
    const vocab_trie& v = **vocab;
    for (tandem::token_id t = 0; t < v.n_vocab(); ++t) {
        bool want = !v.piece(t).empty() && ref.can_feed(v.piece(t));
        for (const tandem::token_id e : v.end_tokens()) want |= t == e && ref.can_end();
        require(got.has(t) == want, "a token mask differs from the reference's");
    }
}

// Tool-call parsing: the same reply fed whole or in pieces reads the same.
struct reading {
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls; // name, arguments
    bool complete = false;
    bool operator==(const reading&) const = default;
};

reading read_calls(tool_syntax s, std::string_view reply, size_t piece) {
    tool_call_parser p(s);
    std::vector<tool_call_parser::event> events;
    for (size_t at = 0; at < reply.size(); at += piece) p.feed(reply.substr(at, piece), events);
    p.finish(events);
    reading r;
    for (const auto& ev : events) {
        using kind = tool_call_parser::event::kind;
        if (ev.k == kind::content) r.content += ev.text;
        else if (ev.k == kind::call) r.calls.push_back({ev.text, ""});
        else {
            require(ev.index >= 0 && size_t(ev.index) < r.calls.size(), "arguments of a call not opened");
            r.calls[size_t(ev.index)].second += ev.text;
        }
    }
    r.complete = p.calls_complete();
    require(int32_t(r.calls.size()) == p.n_calls(), "n_calls counts the calls");
    return r;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const auto tok = tandem::tokenizer::from_gguf(tandem::gguf::file::open(tandem::test::model_path("stories260K.gguf")));
    vocab = new std::shared_ptr<const vocab_trie>(vocab_trie::of(tok));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const unsigned kind = data[0] % 9, flags = data[1];
    const std::string_view in(reinterpret_cast<const char*>(data + 2), size - 2);
    const size_t cut = std::min(in.size(), in.find('\0'));
    const std::string text(in.substr(0, cut));
    const std::string_view drive = in.substr(std::min(in.size(), cut + 1));

    if (kind == 8) { // the tool-call parser, on the text as a reply
        const tool_syntax s = tool_syntax(flags % 3);
        const reading whole = read_calls(s, text, text.size() + 1);
        require(read_calls(s, text, 1) == whole, "a reply read byte by byte reads as it does whole");
        require(read_calls(s, text, 1 + flags / 3 % 7) == whole, "a reply read in pieces reads as it does whole");
        return 0;
    }

    std::shared_ptr<const compiled> g;
    try {
        g = compile_input(kind, text);
    } catch (const grammar_error&) {
        return 0; // refused, with a message: what a request gets back as a 400
    }
    (void)g->dump();
    matcher m(g);
    reference_matcher ref(*g);
    require(m.can_end() == ref.can_end(), "can_end differs at the start");
    std::unique_ptr<mask_cache> cache;
    if (flags & 1) cache = std::make_unique<mask_cache>(g, *vocab, std::chrono::microseconds(flags & 2 ? 2000 : 0));
    std::vector<matcher::mark> marks;
    std::vector<std::vector<matcher::stack>> saved;
    for (size_t step = 0; step < drive.size() && step < 32; ++step) {
        const uint8_t d = uint8_t(drive[step]);
        if (cache && (step == 0 || step == 3)) check_mask(*cache, m, ref);
        // Mostly a byte the matcher allows (chosen by d), sometimes d itself (often refused).
        const auto next = next_bytes(m, ref, step % 16 == 0);
        if (next.empty() && !(d & 0x80)) break;
        const uint8_t b = d & 0x80 || next.empty() ? d : next[d % next.size()];
        if ((flags & 4) && step % 5 == 0) { // an undo mark here, returned to below
            marks.push_back(m.checkpoint());
            saved.push_back(m.stacks());
        }
        const bool ok = ref.feed(std::string_view(reinterpret_cast<const char*>(&b), 1));
        require(m.advance(b) == ok, "the matcher and the reference disagree on a byte");
        require(m.can_end() == ref.can_end(), "the matcher and the reference disagree on the end");
    }
    for (size_t i = marks.size(); i-- > 0;) { // newest first, as marks are LIFO
        m.rollback(marks[i]);
        require(m.stacks() == saved[i], "rollback restores the stacks");
        m.drop(marks[i]);
    }
    return 0;
}
