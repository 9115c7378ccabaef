// libFuzzer target for the tokenizers of every shared vocabulary (../shared/models: the
// vocab-only files and the models' own, SentencePiece and byte-level BPE, loaded once). The
// first byte picks the vocabulary and the mode, the rest is text or token ids. What must hold
// (tests/test_tokenizer.cpp's round trips):
// - decode(encode(text)) == text, with or without BOS/EOS, for valid UTF-8 that the vocabulary
//   can spell; a character it cannot spell (a vocabulary without byte tokens, as
//   TinyStories-656K's: "café", CJK, emoji) becomes its unknown token, so the text comes back
//   with that token's text in its place when special tokens are rendered (and without it
//   otherwise); and for any bytes on a vocabulary that can spell every byte (the SPM ones fall back to byte tokens, GPT-2's
//   byte-level BPE has all 256; deepseek-coder's has no token for the bytes valid UTF-8 never
//   holds, C0 C1 F5-FF, whose letters, "À" and so on, are user-defined tokens of that text);
//   (SentencePiece writes a space as U+2581 and cannot tell the two apart: a U+2581 in the text
//   is encoded as a space, with the same ids as llama.cpp and SentencePiece give, and comes
//   back as one);
// - with special tokens parsed, a BPE vocabulary's decode rendering them gives the text back
//   (SentencePiece adds a space after each, so there it need only not crash);
// - decoding any ids of the vocabulary is the concatenation of their pieces, its text round
//   trips too, and the stream decoder's pieces are valid UTF-8 and add up to the same text
//   when that is valid UTF-8.
#include "runtime/gguf.hpp"
#include "runtime/tokenizer.hpp"
#include "runtime/unicode.hpp"
#include "tests/test_util.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

using tandem::token_id;
using tandem::tokenizer;

struct vocab {
    tokenizer tok;
    bool every_byte; // each byte alone round trips: so does any text
    std::unordered_map<char32_t, bool> spells = {}; // a character alone encodes without the unknown token (memo)

    bool can_spell(char32_t cpt) {
        if (every_byte || tok.unk() < 0) return true;
        const auto [it, fresh] = spells.try_emplace(cpt, true);
        if (fresh) {
            const auto ids = tok.encode(tandem::unicode::to_utf8(cpt), false, false);
            it->second = std::find(ids.begin(), ids.end(), tok.unk()) == ids.end();
        }
        return it->second;
    }
};
std::vector<vocab>* vocabs = nullptr; // never freed: the process's lifetime

void require(bool ok, const char* what, std::string_view text) {
    if (ok) return;
    std::fprintf(stderr, "fuzz_tokenizer: %s fails for %zu bytes\n", what, text.size());
    std::abort();
}

// The stream decoder's pieces are valid UTF-8; when the whole is, they add up to it.
void check_stream(const tokenizer& tok, const std::vector<token_id>& ids, bool render_special) {
    tandem::stream_decoder sd(tok, render_special);
    std::string all;
    for (const token_id id : ids) {
        const std::string out = sd.push(id);
        require(tandem::unicode::is_valid_utf8(out), "a stream piece is valid UTF-8", out);
        all += out;
    }
    all += sd.flush();
    const std::string whole = tok.decode(ids, render_special, false);
    require(tandem::unicode::is_valid_utf8(all), "the stream's end is valid UTF-8", all);
    if (tandem::unicode::is_valid_utf8(whole)) require(all == whole, "stream == decode", whole);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    std::vector<std::string> paths;
    for (const auto& e : std::filesystem::recursive_directory_iterator(tandem::test::shared_dir() / "models"))
        if (e.path().extension() == ".gguf") paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end()); // the first byte picks the same vocabulary every run
    vocabs = new std::vector<vocab>;
    for (const auto& p : paths) {
        vocab v{tokenizer::from_gguf(tandem::gguf::file::open(p)), true};
        for (int b = 0; b < 256; ++b) {
            const std::string one(1, char(b));
            v.every_byte &= v.tok.decode(v.tok.encode(one)) == one;
        }
        std::fprintf(stderr, "fuzz_tokenizer: %s, %s\n", p.c_str(), v.every_byte ? "every byte" : "valid UTF-8 only");
        vocabs->push_back(std::move(v));
    }
    if (vocabs->empty()) {
        std::fprintf(stderr, "fuzz_tokenizer: no vocabulary under %s\n", (tandem::test::shared_dir() / "models").c_str());
        std::abort();
    }
    return 0;
}

// What a round trip gives back: the text, with each U+2581 a space on SentencePiece vocabularies.
std::string round_tripped(std::string_view text, bool bpe) {
    std::string out(text);
    if (bpe) return out;
    const std::string_view marker = "\xE2\x96\x81";
    for (size_t at = out.find(marker); at != std::string::npos; at = out.find(marker, at + 1)) out.replace(at, marker.size(), " ");
    return out;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    vocab& v = (*vocabs)[data[0] % vocabs->size()];
    const tokenizer& tok = v.tok;
    const unsigned mode = data[0] / vocabs->size();
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const bool bpe = tok.kind() == "gpt2";

    if (mode % 2 == 0) { // the input is text
        const bool must = v.every_byte || tandem::unicode::is_valid_utf8(text);
        const auto ids = tok.encode(text, false, false);
        // What comes back: the text, each character the vocabulary cannot spell in the
        // unknown token's place (its text where special tokens are rendered, else nothing).
        std::string spelled(text), with_unk(text);
        bool all_spelled = true;
        if (must && !v.every_byte) {
            spelled.clear();
            with_unk.clear();
            for (size_t at = 0; at < text.size();) {
                const auto d = tandem::unicode::decode_utf8(text, at);
                const std::string_view ch = text.substr(at, d.len);
                const bool ok = v.can_spell(d.cpt);
                all_spelled &= ok;
                spelled += ok ? ch : std::string_view{};
                with_unk += ok ? ch : std::string_view(tok.piece(tok.unk(), true));
                at += d.len;
            }
        }
        const std::string back = round_tripped(spelled, bpe);
        require(!must || tok.decode(ids) == back, "decode(encode(text)) == text, unspellable characters dropped", text);
        require(!must || all_spelled || tok.decode(ids, true) == round_tripped(with_unk, bpe),
                "decode(encode(text), render_special) == text with <unk> for what the vocabulary cannot spell", text);
        const auto with = tok.encode(text, true, false);
        require(!must || tok.decode(with) == back, "decode(encode(text, BOS/EOS)) == text", text);
        const auto special = tok.encode(text, false, true);
        const std::string rendered = tok.decode(special, true);
        if (bpe) require(!must || !all_spelled || rendered == text,
                         "decode(encode(text, parse_special), render_special) == text", text);
        check_stream(tok, ids, false);
        return 0;
    }
    // The input is token ids (two bytes each, taken modulo the vocabulary).
    std::vector<token_id> ids;
    for (size_t i = 0; i + 1 < text.size(); i += 2)
        ids.push_back(token_id((uint8_t(text[i]) | uint8_t(text[i + 1]) << 8) % uint32_t(tok.n_vocab())));
    const bool render = mode & 2;
    std::string pieces;
    for (const token_id id : ids) pieces += tok.piece(id, render);
    require(tok.decode(ids, render, false) == pieces, "decode == the pieces", pieces);
    const std::string decoded = tok.decode(ids, render);
    // (A vocabulary without byte tokens may have pieces of characters it cannot spell alone.)
    bool spellable = v.every_byte || tandem::unicode::is_valid_utf8(decoded);
    for (size_t at = 0; spellable && !v.every_byte && at < decoded.size();) {
        const auto d = tandem::unicode::decode_utf8(decoded, at);
        spellable = v.can_spell(d.cpt);
        at += d.len;
    }
    if (spellable)
        require(tok.decode(tok.encode(decoded)) == round_tripped(decoded, bpe), "decode(encode(decode(ids))) round trips",
                decoded);
    check_stream(tok, ids, render);
    return 0;
}
