// libFuzzer target for the tokenizers of every shared vocabulary (../shared/models: the
// vocab-only files and the models' own, SentencePiece and byte-level BPE, loaded once). The
// first byte picks the vocabulary and the mode, the rest is text or token ids. What must hold
// (tests/test_tokenizer.cpp's round trips, for any bytes, invalid UTF-8 included: the SPM
// vocabularies fall back to byte tokens, BPE is byte-level):
// - decode(encode(text)) == text, with or without BOS/EOS;
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
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

using tandem::token_id;
using tandem::tokenizer;

std::vector<std::unique_ptr<tokenizer>>* vocabs = nullptr; // never freed: the process's lifetime

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
    vocabs = new std::vector<std::unique_ptr<tokenizer>>;
    for (const auto& p : paths)
        vocabs->push_back(std::make_unique<tokenizer>(tokenizer::from_gguf(tandem::gguf::file::open(p))));
    if (vocabs->empty()) {
        std::fprintf(stderr, "fuzz_tokenizer: no vocabulary under %s\n", (tandem::test::shared_dir() / "models").c_str());
        std::abort();
    }
    std::fprintf(stderr, "fuzz_tokenizer: %zu vocabularies\n", vocabs->size());
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const tokenizer& tok = *(*vocabs)[data[0] % vocabs->size()];
    const unsigned mode = data[0] / vocabs->size();
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const bool bpe = tok.kind() == "gpt2";

    if (mode % 2 == 0) { // the input is text
        const auto ids = tok.encode(text, false, false);
        require(tok.decode(ids) == text, "decode(encode(text)) == text", text);
        const auto with = tok.encode(text, true, false);
        require(tok.decode(with) == text, "decode(encode(text, BOS/EOS)) == text", text);
        const auto special = tok.encode(text, false, true);
        const std::string rendered = tok.decode(special, true);
        if (bpe) require(rendered == text, "decode(encode(text, parse_special), render_special) == text", text);
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
    require(tok.decode(tok.encode(decoded)) == decoded, "decode(encode(decode(ids))) round trips", decoded);
    check_stream(tok, ids, render);
    return 0;
}
