// Tokenizer and Unicode tests: llama.cpp's vocab test vectors, round trips, special tokens,
// streaming, malformed vocabularies.
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/tokenizer.hpp"
#include "runtime/unicode.hpp"
#include "tests/test_util.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <chrono>
#include <random>
#include <sstream>

using namespace tandem;
namespace uni = tandem::unicode;

namespace {

tokenizer load(const std::string& name) {
    return tokenizer::from_gguf(gguf::file::open(test::model_path(name)));
}

std::string escape(std::string_view s) {
    std::string out;
    for (const char ch : s) {
        if (ch == '\n') out += "\\n";
        else if (ch == '\t') out += "\\t";
        else out += ch;
    }
    return out;
}

std::string ids_str(const std::vector<token_id>& ids) {
    return fmt::format("[{}]", fmt::join(ids, " "));
}

struct vector_case {
    std::string text;
    std::vector<token_id> ids;
};

// .inp holds texts each followed by "\n__ggml_vocab_test__\n" (the generator writes the
// separator after every text, the last included); .out one line of ids per text.
std::vector<vector_case> read_vectors(const std::string& vocab) {
    const std::string inp = test::read_text(test::model_path("vocab/" + vocab + ".inp"));
    const std::string out = test::read_text(test::model_path("vocab/" + vocab + ".out"));
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<vector_case> cases;
    for (size_t pos = 0; pos < inp.size();) {
        const size_t next = inp.find(sep, pos);
        if (next == std::string::npos) {
            cases.push_back({inp.substr(pos), {}});
            break;
        }
        cases.push_back({inp.substr(pos, next - pos), {}});
        pos = next + sep.size();
    }
    std::istringstream lines(out);
    std::string line;
    size_t i = 0;
    for (; std::getline(lines, line); ++i) {
        REQUIRE(i < cases.size());
        std::istringstream nums(line);
        for (token_id id; nums >> id;) cases[i].ids.push_back(id);
    }
    REQUIRE(i == cases.size());
    return cases;
}

// Encodes every case as llama.cpp's test-tokenizer-0 does; returns the number that match.
size_t check_vectors(const tokenizer& tok, const std::string& vocab) {
    const auto cases = read_vectors(vocab);
    CHECK(cases.size() == 46);
    size_t n_pass = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const auto got = tok.encode(cases[i].text, false, false);
        const bool ok = got == cases[i].ids;
        n_pass += ok;
        CHECK_MESSAGE(ok, fmt::format("{} case {} '{}': want {} got {}", vocab, i, escape(cases[i].text),
                                      ids_str(cases[i].ids), ids_str(got)));
    }
    MESSAGE(fmt::format("{}: {}/{} cases match", vocab, n_pass, cases.size()));
    return n_pass;
}

const char* const vocabs[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",
                              "ggml-vocab-deepseek-coder.gguf"};

// Valid UTF-8 mixing ASCII words and punctuation, whitespace runs, Latin-1, combining
// marks, Cyrillic, CJK, Hangul, emoji and joiners.
std::string random_text(std::mt19937& rng, size_t n_cpts) {
    static const char32_t pool[] = {
        'a', 'b', 'e', 'H', 'z', '0', '7', ' ', ' ', ' ', '\n', '\t', '\r', '\'', '.', ',', '!', '?',
        '<', '>', '|', '$', '_', '-', 0xA0, 0xBD, 0xE9, 0xFC, 0x301, 0x416, 0x44F, 0x17B6, 0x2028,
        0x3000, 0x4E2D, 0x6587, 0xAC00, 0xFF5E, 0x1F600, 0x1F999, 0x200D, 0xFE0F, 0x10400,
    };
    std::uniform_int_distribution<size_t> pick(0, std::size(pool) - 1);
    std::string s;
    for (size_t i = 0; i < n_cpts; ++i) uni::append_utf8(s, pool[pick(rng)]);
    return s;
}

} // namespace

TEST_CASE("unicode categories") {
    CHECK(uni::unicode_version() == "14.0.0");
    CHECK(uni::category_of('A') == uni::category::lu);
    CHECK(uni::category_of('z') == uni::category::ll);
    CHECK(uni::category_of('5') == uni::category::nd);
    CHECK(uni::category_of('!') == uni::category::po);
    CHECK(uni::category_of('$') == uni::category::sc);
    CHECK(uni::category_of('+') == uni::category::sm);
    CHECK(uni::category_of(0x00BD) == uni::category::no);   // ½
    CHECK(uni::category_of(0x0301) == uni::category::mn);   // combining acute
    CHECK(uni::category_of(0x17B6) == uni::category::mc);   // Khmer vowel sign aa
    CHECK(uni::category_of(0x4E2D) == uni::category::lo);   // 中
    CHECK(uni::category_of(0x1F600) == uni::category::so);  // 😀
    CHECK(uni::category_of(0x01C5) == uni::category::lt);   // ǅ
    CHECK(uni::category_of(0x2028) == uni::category::zl);
    CHECK(uni::category_of(0x0378) == uni::category::cn);   // unassigned
    CHECK(uni::category_of(0xE000) == uni::category::co);
    CHECK(uni::category_of(0xD800) == uni::category::cs);
    CHECK(uni::category_of(0x10FFFF) == uni::category::cn);
    CHECK(uni::category_of(0x110000) == uni::category::cn);

    CHECK(uni::is_letter(0x00E9));
    CHECK(uni::is_number(0x2167));         // Ⅷ, Nl
    CHECK(uni::is_punctuation(0x3002));    // 。
    CHECK(uni::is_symbol('^'));
    CHECK(uni::is_mark(0x0301));
    CHECK_FALSE(uni::is_letter('_'));
    CHECK(uni::flags_of(0x1F600) == uni::symbol);

    for (const char32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u,
                             0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
        CHECK_MESSAGE(uni::is_whitespace(c), fmt::format("U+{:04X}", uint32_t(c)));
    }
    for (const char32_t c : {0x1Cu, 0x1Fu, 0x200Bu, 0x180Eu, 0xFEFFu, 0x61u}) {
        CHECK_FALSE_MESSAGE(uni::is_whitespace(c), fmt::format("U+{:04X}", uint32_t(c)));
    }
}

TEST_CASE("unicode lowercase: the simple mapping") {
    CHECK(uni::to_lower('A') == 'a');
    CHECK(uni::to_lower('a') == 'a');
    CHECK(uni::to_lower('1') == '1');
    CHECK(uni::to_lower(0x00C9) == 0x00E9);   // É
    CHECK(uni::to_lower(0x0416) == 0x0436);   // Ж
    CHECK(uni::to_lower(0x03A3) == 0x03C3);   // Σ: σ (the final form is context's, not the mapping's)
    CHECK(uni::to_lower(0x1E9E) == 0x00DF);   // ẞ
    CHECK(uni::to_lower(0x0130) == 0x0130);   // İ lowercases to two code points: left as it is
    CHECK(uni::to_lower(0x4E2D) == 0x4E2D);   // 中
    CHECK(uni::to_lower(0x1F600) == 0x1F600);
    CHECK(uni::to_lower(0x10400) == 0x10428); // Deseret, past the BMP
    int n_changed = 0;
    for (char32_t c = 0; c < 0x10000; ++c) n_changed += uni::to_lower(c) != c;
    CHECK(n_changed > 1000);
}

TEST_CASE("utf-8 coding") {
    const auto d = uni::decode_utf8("\xF0\x9F\xA6\x99", 0); // 🦙
    CHECK(d.valid);
    CHECK(d.cpt == 0x1F999);
    CHECK(d.len == 4);
    CHECK(uni::to_utf8(0x1F999) == "\xF0\x9F\xA6\x99");
    CHECK(uni::to_utf8(0xD800) == "\xEF\xBF\xBD");

    CHECK_FALSE(uni::decode_utf8("\xC0\x80", 0).valid); // overlong
    CHECK_FALSE(uni::decode_utf8("\xE0\x80\x80", 0).valid);
    CHECK_FALSE(uni::decode_utf8("\xED\xA0\x80", 0).valid); // surrogate
    CHECK_FALSE(uni::decode_utf8("\xF4\x90\x80\x80", 0).valid); // past U+10FFFF
    CHECK(uni::decode_utf8("\xE2\x82" "A", 0).len == 2);  // maximal subpart
    CHECK(uni::is_valid_utf8("h\xC3\xA9llo \xE4\xB8\xAD"));
    CHECK_FALSE(uni::is_valid_utf8("\xFF"));

    CHECK(uni::incomplete_tail("ab") == 0);
    CHECK(uni::incomplete_tail("a\xE2\x82") == 2);
    CHECK(uni::incomplete_tail("a\xF0\x9F\xA6") == 3);
    CHECK(uni::incomplete_tail("a\xF0\x9F\xA6\x99") == 0);
    CHECK(uni::incomplete_tail("a\x80") == 0);  // invalid, not unfinished
    CHECK(uni::incomplete_tail("a\xC0") == 0);  // can never complete
    CHECK(uni::incomplete_tail("a\xFF") == 0);
    CHECK(uni::incomplete_tail("\xE2\x82\xAC\xE2") == 1);
    CHECK(uni::sanitize_utf8("a\xFF" "b\xE2\x82") == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");

    // GPT-2's byte map is a bijection onto printable code points.
    CHECK(uni::byte_to_piece(' ') == "\xC4\xA0");  // Ġ
    CHECK(uni::byte_to_piece('\n') == "\xC4\x8A"); // Ċ
    CHECK(uni::byte_to_piece('a') == "a");
    for (int b = 0; b < 256; ++b) {
        const auto piece = uni::byte_to_piece(uint8_t(b));
        const auto dd = uni::decode_utf8(piece, 0);
        REQUIRE(dd.len == piece.size());
        CHECK(uni::piece_to_byte(dd.cpt) == b);
        CHECK_FALSE(uni::is_whitespace(dd.cpt));
    }
    CHECK(uni::piece_to_byte(0x4E2D) == -1);
}

TEST_CASE("llama.cpp vocab test vectors") {
    for (const char* vocab : vocabs) {
        SUBCASE(vocab) {
            const auto start = std::chrono::steady_clock::now();
            const tokenizer tok = load(std::string("vocab/") + vocab);
            const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            MESSAGE(fmt::format("{}: loaded {} tokens in {:.3f} s", vocab, tok.n_vocab(), load_s));
            CHECK(load_s < 2.0); // hash maps, not scans: well under a second unloaded
            CHECK(check_vectors(tok, vocab) == 46);
        }
    }
    SUBCASE("llama-2-tiny-random shares the llama-spm vocab") {
        const tokenizer tok = load("llama-2-tiny-random.gguf");
        CHECK(tok.kind() == "llama");
        CHECK(tok.n_vocab() == 32000);
        CHECK(check_vectors(tok, "ggml-vocab-llama-spm.gguf") == 46);
    }
}

TEST_CASE("vocab metadata") {
    const tokenizer spm = load("vocab/ggml-vocab-llama-spm.gguf");
    CHECK(spm.kind() == "llama");
    CHECK(spm.pre() == "default");
    CHECK(spm.bos() == 1);
    CHECK(spm.eos() == 2);
    CHECK(spm.unk() == 0);
    CHECK(spm.add_bos());
    CHECK_FALSE(spm.add_eos());
    CHECK(spm.add_space_prefix());
    CHECK(spm.type_of(1) == token_type::control);
    CHECK(spm.type_of(3) == token_type::byte);
    CHECK(spm.token_text(15043) == "\xE2\x96\x81Hello");
    CHECK(spm.find("\xE2\x96\x81Hello") == 15043);
    CHECK_FALSE(spm.find("no such token").has_value());
    CHECK(spm.is_eog(2));
    CHECK_FALSE(spm.is_eog(1));
    CHECK_THROWS_AS(spm.token_text(32000), tandem::error);

    const tokenizer gpt2 = load("vocab/ggml-vocab-gpt-2.gguf");
    CHECK(gpt2.kind() == "gpt2");
    CHECK(gpt2.pre() == "gpt-2");
    CHECK(gpt2.bos() == 50256);
    CHECK(gpt2.eos() == 50256);
    CHECK_FALSE(gpt2.add_bos());
    CHECK_FALSE(gpt2.add_space_prefix());
    CHECK(gpt2.is_eog(50256));

    const tokenizer ds = load("vocab/ggml-vocab-deepseek-coder.gguf");
    CHECK(ds.pre() == "deepseek-coder");
    CHECK(ds.bos() == 32013);
    CHECK(ds.eos() == 32014);
    CHECK(ds.pad() == 32014);
    CHECK(ds.add_bos());
    CHECK(ds.is_eog(32014));
    CHECK_FALSE(ds.is_eog(32021)); // <|EOT|> is not one of the end-of-turn texts

    const tokenizer stories = load("stories260K.gguf");
    CHECK(stories.kind() == "llama");
    CHECK(stories.n_vocab() == 512);
    CHECK(stories.add_bos()); // no add_bos_token key: SentencePiece default
    CHECK(stories.pad() == -1); // 4294967295 in the file is outside the vocabulary
    const auto ids = stories.encode("Once upon a time, there was a little girl.", true);
    REQUIRE(!ids.empty());
    CHECK(ids.front() == 1);
    CHECK(stories.decode(ids) == "Once upon a time, there was a little girl.");
}

TEST_CASE("round trip") {
    for (const char* name : {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                             "vocab/ggml-vocab-deepseek-coder.gguf", "stories260K.gguf"}) {
        SUBCASE(name) {
            const tokenizer tok = load(name);
            const auto cases = read_vectors("ggml-vocab-gpt-2.gguf"); // the three .inp are identical
            for (size_t i = 0; i < cases.size(); ++i) {
                const std::string& t = cases[i].text;
                CHECK_MESSAGE(tok.decode(tok.encode(t)) == t, fmt::format("{} case {} '{}'", name, i, escape(t)));
                CHECK_MESSAGE(tok.decode(tok.encode(t, true)) == t, fmt::format("{} case {} with BOS", name, i));
            }
            std::mt19937 rng(1234);
            for (int i = 0; i < 200; ++i) {
                const std::string t = random_text(rng, 1 + rng() % 60);
                const auto ids = tok.encode(t);
                CHECK_MESSAGE(tok.decode(ids) == t, fmt::format("{} random '{}' -> {}", name, escape(t), ids_str(ids)));
            }
        }
    }
}

TEST_CASE("special tokens") {
    SUBCASE("spm") {
        const tokenizer tok = load("vocab/ggml-vocab-llama-spm.gguf");
        CHECK(tok.encode("<s>", false, true) == std::vector<token_id>{1});
        const auto plain = tok.encode("<s>", false, false);
        CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
        CHECK(tok.decode(plain) == "<s>");
        // Text after a special token gets the space prefix again.
        CHECK(tok.encode("<s>Hello", false, true) == std::vector<token_id>{1, 15043});
        CHECK(tok.encode("Hello</s>", false, true) == std::vector<token_id>{15043, 2});
        CHECK(tok.encode("Hello", true) == std::vector<token_id>{1, 15043});
        CHECK(tok.encode("", true) == std::vector<token_id>{1});
        CHECK(tok.encode("").empty());

        const std::vector<token_id> ids{1, 15043, 3186, 2};
        CHECK(tok.decode(ids) == "Hello world");
        CHECK(tok.decode(ids, true) == "<s> Hello world</s>");
        CHECK(tok.decode(ids, false, false) == " Hello world");
        CHECK(tok.piece(15043) == " Hello");
        CHECK(tok.piece(1).empty());
        CHECK(tok.piece(1, true) == "<s>");
        CHECK(tok.piece(0x0A + 3) == "\n"); // <0x0A>
        CHECK_THROWS_AS(tok.decode(std::vector<token_id>{-1}), tandem::error);
        CHECK_THROWS_AS(tok.decode(std::vector<token_id>{32000}), tandem::error);
    }
    SUBCASE("gpt2") {
        const tokenizer tok = load("vocab/ggml-vocab-gpt-2.gguf");
        CHECK(tok.encode("<|endoftext|>", false, true) == std::vector<token_id>{50256});
        const auto plain = tok.encode("<|endoftext|>", false, false);
        CHECK(plain.size() > 1);
        CHECK(tok.decode(plain) == "<|endoftext|>");
        CHECK(tok.encode("a<|endoftext|>b", false, true) ==
              std::vector<token_id>{tok.encode("a")[0], 50256, tok.encode("b")[0]});
        CHECK(tok.encode("Hello", true) == tok.encode("Hello")); // gpt2 adds no BOS by default
        CHECK(tok.decode(std::vector<token_id>{50256}).empty());
        CHECK(tok.decode(std::vector<token_id>{50256}, true) == "<|endoftext|>");
    }
    SUBCASE("user-defined tokens are split out even without parse_special") {
        const tokenizer tok = load("vocab/ggml-vocab-deepseek-coder.gguf");
        CHECK(tok.type_of(32021) == token_type::user_defined);
        CHECK(tok.encode("<|EOT|>") == std::vector<token_id>{32021});
        CHECK(tok.encode("x<|EOT|>", false, false) == std::vector<token_id>{tok.encode("x")[0], 32021});
        // Control tokens only with parse_special.
        const std::string bos_text = tok.token_text(32013);
        CHECK(tok.encode(bos_text, false, true) == std::vector<token_id>{32013});
        CHECK(tok.encode(bos_text, false, false).size() > 1);
        CHECK(tok.encode("hi", true).front() == 32013);
        CHECK(tok.decode(tok.encode("hi", true)) == "hi");
    }
}

TEST_CASE("stream decoder") {
    // Each piece of the stream is valid UTF-8, at least one piece was held back, and the
    // concatenation is the whole decode.
    const auto check_stream = [](const tokenizer& tok, const std::vector<token_id>& ids) {
        stream_decoder sd(tok);
        std::string all;
        int n_held = 0;
        for (const token_id id : ids) {
            const std::string piece = tok.piece(id);
            const std::string out = sd.push(id);
            CHECK(uni::is_valid_utf8(out));
            n_held += !piece.empty() && out.empty();
            all += out;
        }
        all += sd.flush();
        CHECK(n_held > 0);
        CHECK(all == tok.decode(ids, false, false));
    };
    const std::string text = " this is \xF0\x9F\xA6\x99.cpp \xE1\x9E\x80\xE1\x9E\xB6\xE1\x9E\x93 \xE4\xB8\xAD";
    SUBCASE("spm byte fallback") {
        const tokenizer tok = load("vocab/ggml-vocab-llama-spm.gguf");
        const auto ids = tok.encode(text);
        CHECK(std::count_if(ids.begin(), ids.end(), [&](token_id id) { return tok.type_of(id) == token_type::byte; }) >= 4);
        check_stream(tok, ids);
    }
    SUBCASE("byte-level bpe") {
        const tokenizer tok = load("vocab/ggml-vocab-gpt-2.gguf");
        check_stream(tok, tok.encode(text));
    }
    SUBCASE("unfinished and invalid bytes") {
        const tokenizer tok = load("vocab/ggml-vocab-llama-spm.gguf");
        const auto byte = [&](uint8_t b) { return token_id(3 + b); }; // <0x00> is id 3
        stream_decoder sd(tok);
        CHECK(sd.push(byte(0xF0)).empty());
        CHECK(sd.push(byte(0x9F)).empty());
        CHECK(sd.flush() == "\xEF\xBF\xBD"); // one maximal subpart, one U+FFFD
        CHECK(sd.flush().empty());
        CHECK(sd.push(byte(0xFF)) == "\xEF\xBF\xBD");
        CHECK(sd.push(byte(0xE2)).empty());
        CHECK(sd.push(*tok.find("A")) == "\xEF\xBF\xBD" "A"); // 'A' breaks the sequence
        CHECK(sd.push(byte(0xE2)).empty());
        CHECK(sd.push(byte(0x82)).empty());
        CHECK(sd.push(byte(0xAC)) == "\xE2\x82\xAC"); // €
    }
}

namespace {

// A vocabulary written as GGUF in memory; `edit` adjusts it before parsing.
tokenizer synth(const std::function<void(gguf::writer&)>& edit) {
    gguf::writer w;
    edit(w);
    const std::vector<uint8_t> bytes = w.serialize();
    return tokenizer::from_gguf(gguf::file::parse(bytes, "synth.gguf"));
}

void spm_vocab(gguf::writer& w, std::vector<std::string> tokens, std::vector<float> scores) {
    std::vector<int32_t> types(tokens.size(), int32_t(token_type::normal));
    types[0] = int32_t(token_type::unknown);
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
    w.set_f32_array("tokenizer.ggml.scores", std::move(scores));
    w.set_i32_array("tokenizer.ggml.token_type", std::move(types));
    w.set_bool("tokenizer.ggml.add_space_prefix", false);
}

} // namespace

TEST_CASE("merge order") {
    SUBCASE("spm merges the best-scoring pair first, not the leftmost") {
        // ab scores below bc: "abc" must become a + bc, which a left-to-right greedy gets wrong.
        const tokenizer tok = synth([](gguf::writer& w) {
            spm_vocab(w, {"<unk>", "a", "b", "c", "ab", "bc"}, {0, -5, -5, -5, -2, -1});
        });
        CHECK(tok.encode("abc") == std::vector<token_id>{1, 5});
        CHECK(tok.encode("abcabc") == std::vector<token_id>{1, 5, 1, 5});
        CHECK(tok.encode("d") == std::vector<token_id>{0}); // no byte tokens: unknown
        CHECK_FALSE(tok.add_space_prefix());
    }
    SUBCASE("spm stale queue entries are skipped") {
        // The left aa merges first, so the queued middle aa pair goes stale.
        const tokenizer tok = synth([](gguf::writer& w) {
            spm_vocab(w, {"<unk>", "a", "aa"}, {0, -5, -1});
        });
        CHECK(tok.encode("aaa") == std::vector<token_id>{2, 1});
        CHECK(tok.encode("aaaa") == std::vector<token_id>{2, 2});
    }
    SUBCASE("bpe applies merges by rank") {
        const tokenizer tok = synth([](gguf::writer& w) {
            w.set_string("tokenizer.ggml.model", "gpt2");
            w.set_string("tokenizer.ggml.pre", "gpt-2");
            w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "c", "bc", "ab", "abc"});
            w.set_string_array("tokenizer.ggml.merges", {"b c", "a b", "a bc"});
        });
        CHECK(tok.encode("abc") == std::vector<token_id>{5}); // b c first, then a bc
        CHECK(tok.encode("ab") == std::vector<token_id>{4});
        CHECK(tok.encode("cab") == std::vector<token_id>{2, 4});
        CHECK(tok.pre() == "gpt-2");
    }
}

TEST_CASE("malformed vocabularies throw tandem::error") {
    const auto base = [](gguf::writer& w) {
        spm_vocab(w, {"<unk>", "a", "b"}, {0, -1, -2});
    };
    CHECK_NOTHROW(synth(base));
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        spm_vocab(w, {"<unk>", "a", "b"}, {0, -1}); // scores length != tokens length
    }), tandem::error);
    CHECK_THROWS_WITH_AS(synth([](gguf::writer& w) {
        w.set_string_array("tokenizer.ggml.tokens", {"a"});
    }), doctest::Contains("tokenizer.ggml.model"), tandem::error);
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "llama");
    }), tandem::error); // no tokens
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "a"});
        w.set_i32_array("tokenizer.ggml.token_type", {2, 1, 1});
    }), tandem::error);
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "bert");
        w.set_string_array("tokenizer.ggml.tokens", {"a"});
    }), tandem::error);
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string_array("tokenizer.ggml.tokens", {"a"});
    }), tandem::error); // no merges
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string("tokenizer.ggml.pre", "no-such-pre");
        w.set_string_array("tokenizer.ggml.tokens", {"a"});
        w.set_string_array("tokenizer.ggml.merges", {});
    }), tandem::error);
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
        w.set_string_array("tokenizer.ggml.merges", {"ab"});
    }), tandem::error); // a merge without its space
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<0xZZ>"});
        w.set_i32_array("tokenizer.ggml.token_type", {2, 6});
    }), tandem::error);
    CHECK_THROWS_AS(synth([](gguf::writer& w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_f32_array("tokenizer.ggml.tokens", {1.0f});
    }), tandem::error); // tokens of the wrong type
    CHECK_THROWS_AS(gguf::file::open(test::model_path("vocab/no-such-vocab.gguf")), tandem::error);
}

TEST_CASE("pre-tokenizers split like their regexes") {
    // Expected words from the regexes themselves (Python's re with the same classes spelled
    // out); every family also agreed with it on thousands of random strings while developing.
    const auto words = [](std::string_view pre, std::string_view text) {
        return tokenizer::pre_tokenize(pre, text);
    };
    CHECK(words("gpt-2", "Hello world") == std::vector<std::string>{"Hello", " world"});
    CHECK(words("gpt-2", "   Hello") == std::vector<std::string>{"  ", " Hello"});
    CHECK(words("gpt-2", "a   ") == std::vector<std::string>{"a", "   "});
    CHECK(words("gpt-2", "I've 12345!!") == std::vector<std::string>{"I", "'ve", " 12345", "!!"});
    CHECK(words("gpt-2", "\t!x") == std::vector<std::string>{"\t", "!", "x"});
    CHECK(words("gpt-2", "x\n\n y") == std::vector<std::string>{"x", "\n\n", " y"});
    CHECK(words("llama-bpe", "I'VE 12345") == std::vector<std::string>{"I", "'VE", " ", "123", "45"});
    CHECK(words("llama-bpe", " \n\n  x") == std::vector<std::string>{" \n\n", " ", " x"});
    CHECK(words("llama-bpe", "a\tb  \n c") == std::vector<std::string>{"a", "\tb", "  \n", " c"});
    CHECK(words("llama-bpe", "...\n\nok") == std::vector<std::string>{"...\n\n", "ok"});
    CHECK(words("qwen2", "123 ab") == std::vector<std::string>{"1", "2", "3", " ab"});
    // SmolLM (and StarCoder's family): each digit apart, then GPT-2's pattern on the rest.
    CHECK(words("smollm", "I've 12345!!") ==
          std::vector<std::string>{"I", "'ve", " ", "1", "2", "3", "4", "5", "!!"});
    CHECK(words("smollm", "x2 y") == std::vector<std::string>{"x", "2", " y"});
    CHECK(words("deepseek-coder", "\xE2\x98\x83\xF0\x9F\x98\x80") == std::vector<std::string>{"\xE2\x98\x83", "\xF0\x9F\x98\x80"});
    CHECK(words("deepseek-coder", "a\xE3\x80\x80\xE2\x98\x83") == std::vector<std::string>{"a", "\xE3\x80\x80", "\xE2\x98\x83"});
    CHECK(words("deepseek-coder", "x 12") == std::vector<std::string>{"x", " ", "1", "2"});
    CHECK(words("deepseek-coder", "\xE4\xB8\xAD\xE6\x96\x87,\xE6\xB5\x8B\xE8\xAF\x95") == std::vector<std::string>{"\xE4\xB8\xAD\xE6\x96\x87", ",", "\xE6\xB5\x8B\xE8\xAF\x95"});
    CHECK(words("deepseek-llm", "Hello \xE4\xB8\xAD\xE6\x96\x87  ") == std::vector<std::string>{"Hello", " ", "\xE4\xB8\xAD\xE6\x96\x87", "  "});
    CHECK(words("deepseek-llm", "ab,cd  \n") == std::vector<std::string>{"ab", ",", "cd", "  ", "\n"});
    CHECK(words("deepseek-llm", "\xC2\xB5\xE2\x84\xAA 42x") == std::vector<std::string>{"\xC2\xB5", "\xE2\x84\xAA", " ", "42", "x"});
    CHECK(words("default", "a+=b 12345") == std::vector<std::string>{"a", "+=", "b", " ", "123", "45"});
    CHECK(words("default", "x...y") == std::vector<std::string>{"x", "...", "y"});
    CHECK(words("llama3", "").empty());
    CHECK_THROWS_AS(words("no-such-pre", "x"), tandem::error);
}

TEST_CASE("pre-tokenizer edge cases") {
    const tokenizer gpt2 = load("vocab/ggml-vocab-gpt-2.gguf");
    // \s+(?!\S) leaves the last space for the word; a space run at the end stays whole.
    const auto sp = gpt2.encode("   Hello");
    REQUIRE(sp.size() == 3);
    CHECK(gpt2.piece(sp[0]) == " ");
    CHECK(gpt2.piece(sp[1]) == " ");
    CHECK(gpt2.piece(sp[2]) == " Hello");
    const tokenizer ds = load("vocab/ggml-vocab-deepseek-coder.gguf");
    const auto tail = ds.encode("a   ");
    REQUIRE(tail.size() == 2);
    CHECK(ds.piece(tail[1]) == "   ");
    CHECK(gpt2.encode("I've").size() == 2); // contraction split off
    CHECK(gpt2.decode(gpt2.encode("I've")) == "I've");
    // Invalid UTF-8 survives byte-level BPE byte for byte.
    const std::string bad = "a\xFF\xC3(b\xE2\x82";
    CHECK(gpt2.decode(gpt2.encode(bad)) == bad);
    const tokenizer spm = load("vocab/ggml-vocab-llama-spm.gguf");
    CHECK(spm.decode(spm.encode(bad)) == bad);
}

TEST_CASE("long inputs stay fast") {
    // Quadratic pre-tokenizing or merging would take minutes here.
    const std::string letters(200000, 'a');
    const std::string spaces = std::string(200000, ' ') + "x";
    std::string mixed;
    while (mixed.size() < 200000) mixed += "Hello, y'all! \xE4\xB8\xAD\xE6\x96\x87 123456 \t\n ";
    for (const char* vocab : vocabs) {
        const tokenizer tok = load(std::string("vocab/") + vocab);
        for (const std::string* s : std::initializer_list<const std::string*>{&letters, &spaces, &mixed}) {
            const auto start = std::chrono::steady_clock::now();
            const auto ids = tok.encode(*s);
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            CHECK(tok.decode(ids) == *s);
            CHECK_MESSAGE(secs < 5.0, fmt::format("{}: {} bytes took {:.2f} s", vocab, s->size(), secs));
        }
    }
}
