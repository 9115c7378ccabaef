// Tokenizers read from GGUF metadata: SentencePiece-style (`llama`) and byte-level BPE (`gpt2`).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace gguf { class file; }

using token_id = int32_t;

// GGUF tokenizer.ggml.token_type values.
enum class token_type : int32_t {
    undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6,
};

class tokenizer {
public:
    // Reads tokenizer.ggml.* keys; throws tandem::error for a missing or inconsistent vocab.
    static tokenizer from_gguf(const gguf::file& f);

    tokenizer(tokenizer&&) noexcept;
    tokenizer& operator=(tokenizer&&) noexcept;
    ~tokenizer();

    // add_special: BOS/EOS as the model's metadata asks (add_bos_token/add_eos_token, with
    // llama.cpp's defaults per tokenizer kind). parse_special: text of control and
    // user-defined tokens ("<s>", "<|im_start|>") becomes those tokens instead of plain text.
    std::vector<token_id> encode(std::string_view text, bool add_special = false,
                                 bool parse_special = false) const;

    // The text of a token sequence. Control tokens (BOS, EOS, ...) decode to nothing unless
    // `render_special`; byte tokens become their bytes; the space prefix that encode adds
    // to the first piece is removed when `strip_space_prefix` (round trip: decode(encode(t)) == t).
    std::string decode(std::span<const token_id> ids, bool render_special = false,
                       bool strip_space_prefix = true) const;

    // Raw bytes of one token as it appears inside a text (no prefix stripping); may be a
    // partial UTF-8 sequence for byte tokens or byte-level BPE pieces.
    std::string piece(token_id id, bool render_special = false) const;

    // The words a byte-level BPE pre-tokenizer (a tokenizer.ggml.pre name) splits text into,
    // before merges; for tests and diagnostics. Throws tandem::error for an unknown name.
    static std::vector<std::string> pre_tokenize(std::string_view pre, std::string_view text);

    std::string_view kind() const;        // "llama" or "gpt2"
    std::string_view pre() const;         // pre-tokenizer name ("default", "llama-bpe", ...)
    int32_t n_vocab() const;
    const std::string& token_text(token_id id) const; // as stored in the vocab
    token_type type_of(token_id id) const;
    std::optional<token_id> find(std::string_view token_text) const;

    token_id bos() const;                 // -1 when the model has none
    token_id eos() const;
    token_id unk() const;
    token_id pad() const;
    bool add_bos() const;
    bool add_eos() const;
    bool add_space_prefix() const;        // SentencePiece: a space goes in front of the text
    bool is_eog(token_id id) const;       // EOS, EOT and other end-of-generation tokens

private:
    tokenizer();
    struct impl;
    std::unique_ptr<impl> impl_;
};

// Streamed decoding for generation: push tokens one at a time; the text returned is always
// complete UTF-8 (bytes of an unfinished sequence are held back until it completes). Pieces
// are taken as they appear inside a text: no space prefix is stripped.
class stream_decoder {
public:
    explicit stream_decoder(const tokenizer& tok, bool render_special = false);
    std::string push(token_id id);
    // What is still held back, invalid sequences replaced by U+FFFD.
    std::string flush();

private:
    const tokenizer* tok_;
    bool render_special_;
    std::string pending_;
};

} // namespace tandem
