// SentencePiece-style (`llama`) and byte-level BPE (`gpt2`) tokenizers over GGUF vocabularies,
// matching llama.cpp's token ids (tests/test_tokenizer.cpp checks its published test vectors).
#include "runtime/tokenizer.hpp"

#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"
#include "runtime/pre_tokenizer.hpp"
#include "runtime/unicode.hpp"

#include <algorithm>
#include <array>
#include <bitset>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace tandem {
namespace {

namespace uni = tandem::unicode;

// find(string_view) without building a std::string.
struct string_hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

constexpr std::string_view space_marker = "\xe2\x96\x81"; // U+2581, SentencePiece's space

// Separates the two halves of a merge key; 0xFF never occurs in UTF-8.
constexpr char merge_sep = '\xff';

// Texts that end generation when the vocabulary has them as control or user-defined tokens.
constexpr std::string_view eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

enum class vocab_kind { spm, bpe };

// A symbol of the merge loops: a byte range of the text, linked to its live neighbours.
struct symbol {
    uint32_t start, n; // n == 0: merged away
    int32_t prev, next;
};

struct spm_bigram {
    float score;
    int32_t left, right;
    uint32_t size; // bytes of both symbols when queued: a stale entry no longer adds up
};

// Highest score first; among equals the leftmost.
struct spm_order {
    bool operator()(const spm_bigram& a, const spm_bigram& b) const {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
};

struct bpe_bigram {
    int32_t rank;
    int32_t left, right;
    uint32_t size;
};

// Lowest rank first; among equals the leftmost.
struct bpe_order {
    bool operator()(const bpe_bigram& a, const bpe_bigram& b) const {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
};

// Removes a merged right symbol from the chain.
void merge_symbols(std::vector<symbol>& syms, int32_t left, int32_t right) {
    symbol& l = syms[left];
    symbol& r = syms[right];
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = left;
}

// Offers every adjacent pair, then merges the best queued pair until none is left, offering
// the two pairs each merge makes. try_pair(left, right) queues a pair (with .left, .right and
// .size, the two symbols' total length) when the vocabulary has it. Symbols only grow, so a
// pair whose sizes no longer add up is stale.
template <class Queue, class TryPair>
void merge_best_pairs(std::vector<symbol>& syms, Queue& queue, TryPair& try_pair) {
    for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_pair(i - 1, i);
    while (!queue.empty()) {
        const auto b = queue.top();
        queue.pop();
        const symbol& l = syms[b.left];
        const symbol& r = syms[b.right];
        if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
        merge_symbols(syms, b.left, b.right);
        try_pair(syms[b.left].prev, b.left);
        try_pair(b.left, syms[b.left].next);
    }
}

// Splits `s` into one symbol per UTF-8 character (an invalid sequence is one symbol).
std::vector<symbol> char_symbols(std::string_view s) {
    std::vector<symbol> syms;
    syms.reserve(s.size());
    for (size_t pos = 0; pos < s.size();) {
        const uint32_t len = uni::decode_utf8(s, pos).len;
        const int32_t i = int32_t(syms.size());
        syms.push_back({uint32_t(pos), len, i - 1, pos + len < s.size() ? i + 1 : -1});
        pos += len;
    }
    return syms;
}

} // namespace

struct tokenizer::impl {
    vocab_kind kind = vocab_kind::spm;
    std::string kind_name;
    std::string pre_name;
    pre_kind pre = pre_kind::gpt2;

    std::vector<std::string> texts;
    std::vector<float> scores;
    std::vector<token_type> types;
    std::vector<std::string> pieces; // decoded bytes of each token, special ones as their text
    string_map<token_id> ids;        // text -> id; a repeated text keeps its last id, like llama.cpp
    string_map<int32_t> merge_ranks; // left + merge_sep + right -> rank
    std::array<token_id, 256> byte_ids{};

    // Control, user-defined and unknown tokens by text length, longest first, for splitting
    // the text before tokenizing.
    std::vector<token_id> specials;

    token_id bos = -1, eos = -1, unk = -1, pad = -1;
    bool add_bos = false, add_eos = false, add_space_prefix = false;
    bool ignore_merges = false; // llama3: a word that is a token is taken whole
    std::unordered_set<token_id> eog;

    std::optional<token_id> lookup(std::string_view s) const {
        const auto it = ids.find(s);
        if (it == ids.end()) return std::nullopt;
        return it->second;
    }

    bool is_special(token_id id) const {
        const token_type t = types[id];
        return t == token_type::control || t == token_type::unknown;
    }

    // Empty for control/unknown tokens unless rendered, and for unused/undefined ones.
    std::string_view piece_view(token_id id, bool render_special) const {
        if (!render_special && is_special(id)) return {};
        return pieces[id];
    }

    struct fragment {
        token_id id; // >= 0: a special token; -1: text [begin, end)
        size_t begin, end;
    };
    std::vector<fragment> partition(std::string_view text, bool parse_special) const;

    void encode_spm(std::string_view text, std::vector<token_id>& out) const;
    void encode_bpe(std::string_view text, std::vector<token_id>& out) const;
    void bpe_word(std::string_view bytes, std::vector<token_id>& out) const;
    void push_bytes(std::string_view bytes, std::vector<token_id>& out) const;
};

// Splits text on special tokens the way llama.cpp does: token by token, longest first, every
// occurrence in every remaining text fragment. Without parse_special only user-defined tokens
// are split out (as Hugging Face tokenizers do with added tokens).
std::vector<tokenizer::impl::fragment> tokenizer::impl::partition(std::string_view text,
                                                                  bool parse_special) const {
    std::vector<fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, 0, text.size()});

    std::bitset<256> present;
    for (const char ch : text) present.set(uint8_t(ch));

    std::vector<fragment> next;
    for (const token_id id : specials) {
        if (!parse_special && is_special(id)) continue;
        const std::string& s = texts[id];
        if (!present.test(uint8_t(s[0])) || s.size() > text.size()) continue;

        bool found = false;
        next.clear();
        for (const fragment& f : frags) {
            if (f.id >= 0) {
                next.push_back(f);
                continue;
            }
            size_t begin = f.begin;
            while (true) {
                const size_t at = text.substr(0, f.end).find(s, begin);
                if (at == std::string_view::npos) break;
                found = true;
                if (at > begin) next.push_back({-1, begin, at});
                next.push_back({id, 0, 0});
                begin = at + s.size();
            }
            if (begin < f.end) next.push_back({-1, begin, f.end});
        }
        if (found) frags.swap(next);
    }
    return frags;
}

void tokenizer::impl::push_bytes(std::string_view bytes, std::vector<token_id>& out) const {
    for (const char ch : bytes) {
        const token_id id = byte_ids[uint8_t(ch)];
        if (id < 0) {
            // No byte token for it: the whole piece is unknown.
            if (unk >= 0) out.push_back(unk);
            return;
        }
    }
    for (const char ch : bytes) out.push_back(byte_ids[uint8_t(ch)]);
}

// SentencePiece BPE: start from characters and keep merging the adjacent pair whose
// concatenation is the vocabulary token with the highest score.
void tokenizer::impl::encode_spm(std::string_view text, std::vector<token_id>& out) const {
    std::vector<symbol> syms = char_symbols(text);
    if (syms.empty()) return;

    std::priority_queue<spm_bigram, std::vector<spm_bigram>, spm_order> queue;
    const auto try_pair = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const uint32_t size = syms[left].n + syms[right].n;
        const auto id = lookup(text.substr(syms[left].start, size));
        if (!id) return;
        queue.push({scores[*id], left, right, size});
    };
    merge_best_pairs(syms, queue, try_pair);

    for (int32_t i = 0; i != -1; i = syms[i].next) {
        const std::string_view s = text.substr(syms[i].start, syms[i].n);
        if (const auto id = lookup(s)) {
            out.push_back(*id);
        } else {
            push_bytes(s, out); // a character outside the vocabulary: byte fallback
        }
    }
}

// Byte-level BPE of one pre-tokenized word: its bytes as GPT-2's printable code points,
// then the merges in rank order.
void tokenizer::impl::bpe_word(std::string_view bytes, std::vector<token_id>& out) const {
    std::string word;
    word.reserve(bytes.size() * 2);
    for (const char ch : bytes) word += uni::byte_to_piece(uint8_t(ch));

    if (ignore_merges) {
        if (const auto id = lookup(word)) {
            out.push_back(*id);
            return;
        }
    }

    std::vector<symbol> syms = char_symbols(word); // one symbol per original byte
    std::priority_queue<bpe_bigram, std::vector<bpe_bigram>, bpe_order> queue;
    std::string key;
    const auto try_pair = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const symbol& l = syms[left];
        const symbol& r = syms[right];
        key.assign(word, l.start, l.n);
        key += merge_sep;
        key.append(word, r.start, r.n);
        const auto it = merge_ranks.find(key);
        if (it == merge_ranks.end()) return;
        queue.push({it->second, left, right, l.n + r.n});
    };
    merge_best_pairs(syms, queue, try_pair);

    for (int32_t i = 0; i != -1 && !syms.empty(); i = syms[i].next) {
        const std::string_view s = std::string_view(word).substr(syms[i].start, syms[i].n);
        if (const auto id = lookup(s)) {
            out.push_back(*id);
            continue;
        }
        // A merge result outside the vocabulary: llama.cpp falls back to its single bytes.
        for (const char ch : s) {
            if (const auto id = lookup(std::string_view(&ch, 1))) out.push_back(*id);
        }
    }
}


void tokenizer::impl::encode_bpe(std::string_view text, std::vector<token_id>& out) const {
    for (const auto& [at, len] : pre_split(pre, text)) bpe_word(text.substr(at, len), out);
}

tokenizer::tokenizer() : impl_(std::make_unique<impl>()) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

tokenizer tokenizer::from_gguf(const gguf::file& f) {
    const std::string& path = f.path();
    tokenizer tok;
    impl& v = *tok.impl_;

    const auto model = f.get_string("tokenizer.ggml.model");
    TANDEM_CHECK(model.has_value(), "{}: no tokenizer.ggml.model", path);
    v.kind_name = *model;
    if (*model == "llama") {
        v.kind = vocab_kind::spm;
    } else if (*model == "gpt2") {
        v.kind = vocab_kind::bpe;
    } else {
        fail("{}: tokenizer.ggml.model '{}' is not supported (only 'llama' and 'gpt2')", path, *model);
    }

    v.texts = f.get_string_array("tokenizer.ggml.tokens");
    const size_t n = v.texts.size();
    TANDEM_CHECK(n > 0, "{}: no tokenizer.ggml.tokens", path);
    TANDEM_CHECK(n <= size_t(std::numeric_limits<int32_t>::max()), "{}: {} tokens is too many", path, n);

    v.scores = f.get_f32_array("tokenizer.ggml.scores");
    TANDEM_CHECK(v.scores.empty() || v.scores.size() == n,
                 "{}: tokenizer.ggml.scores has {} entries for {} tokens", path, v.scores.size(), n);
    v.scores.resize(n, 0.0f);

    const std::vector<int32_t> types = f.get_i32_array("tokenizer.ggml.token_type");
    TANDEM_CHECK(types.empty() || types.size() == n,
                 "{}: tokenizer.ggml.token_type has {} entries for {} tokens", path, types.size(), n);
    v.types.resize(n, token_type::normal);
    for (size_t i = 0; i < types.size(); ++i) {
        v.types[i] = types[i] >= 0 && types[i] <= 6 ? token_type(types[i]) : token_type::undefined;
    }

    v.ids.reserve(n);
    for (size_t i = 0; i < n; ++i) v.ids.insert_or_assign(v.texts[i], token_id(i));

    // Byte tokens, <0xNN>.
    const auto parse_byte = [](std::string_view s) -> int {
        if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
        int b = 0;
        for (const char ch : s.substr(3, 2)) {
            const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                        : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
            if (d < 0) return -1;
            b = b * 16 + d;
        }
        return b;
    };
    for (size_t i = 0; i < n; ++i) {
        if (v.types[i] == token_type::byte) {
            TANDEM_CHECK(parse_byte(v.texts[i]) >= 0, "{}: byte token {} is '{}', not <0xNN>", path, i,
                         v.texts[i]);
        }
    }
    v.byte_ids.fill(-1);
    for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        if (auto id = v.lookup(hex)) {
            v.byte_ids[b] = *id;
        } else if (auto id1 = v.lookup(std::string(1, char(b)))) {
            v.byte_ids[b] = *id1;
        }
    }

    const auto pre = f.get_string("tokenizer.ggml.pre");
    if (v.kind == vocab_kind::spm) {
        v.pre_name = pre.value_or("default"); // SentencePiece has no pre-tokenizer regex
        v.add_bos = true;
        v.add_space_prefix = true;
        v.bos = 1;
        v.eos = 2;
        v.unk = 0;
    } else {
        v.pre_name = pre.value_or("gpt-2");
        const auto k = pre_from_name(v.pre_name);
        TANDEM_CHECK(k.has_value(), "{}: tokenizer.ggml.pre '{}' is not supported", path, v.pre_name);
        v.pre = *k;
        if (v.pre == pre_kind::llama3) {
            v.ignore_merges = true;
            v.add_bos = true;
        }

        const gguf::value* merges_key = f.find("tokenizer.ggml.merges");
        TANDEM_CHECK(merges_key != nullptr, "{}: gpt2 tokenizer without tokenizer.ggml.merges", path);
        const std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
        v.merge_ranks.reserve(merges.size());
        std::string key;
        for (size_t i = 0; i < merges.size(); ++i) {
            const std::string& m = merges[i];
            // The first space after the first character splits it, as llama.cpp reads it.
            const size_t sp = m.find(' ', 1);
            TANDEM_CHECK(sp != std::string::npos, "{}: merge {} '{}' is not 'left right'", path, i, m);
            key.assign(m, 0, sp);
            key += merge_sep;
            key.append(m, sp + 1);
            v.merge_ranks.emplace(key, int32_t(i)); // a repeated pair keeps its first rank
        }
    }
    if (v.unk >= int64_t(n)) v.unk = -1;
    if (v.bos >= int64_t(n)) v.bos = -1;
    if (v.eos >= int64_t(n)) v.eos = -1;

    // Special token ids; an id outside the vocabulary keeps the default, as in llama.cpp.
    token_id eot = -1, eom = -1;
    const std::pair<const char*, token_id*> id_keys[] = {
        {"tokenizer.ggml.bos_token_id", &v.bos}, {"tokenizer.ggml.eos_token_id", &v.eos},
        {"tokenizer.ggml.unknown_token_id", &v.unk}, {"tokenizer.ggml.padding_token_id", &v.pad},
        {"tokenizer.ggml.eot_token_id", &eot}, {"tokenizer.ggml.eom_token_id", &eom},
    };
    for (const auto& [key, id] : id_keys) {
        const auto val = f.get_int(key);
        if (!val) continue;
        if (*val >= 0 && *val < int64_t(n)) {
            *id = token_id(*val);
        } else if (*val == -1 || *val == 0xFFFFFFFF) {
            continue; // "none" as converters write it; the default stays, as in llama.cpp
        } else {
            logger("tokenizer")->warn("{}: {} = {} is outside the vocabulary, using {}", path, key, *val, *id);
        }
    }
    if (const auto b = f.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
    if (const auto b = f.get_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
    if (const auto b = f.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;

    for (const token_id id : {v.eos, eot, eom}) {
        if (id >= 0) v.eog.insert(id);
    }
    for (const std::string_view s : eog_texts) {
        if (const auto id = v.lookup(s)) {
            const token_type t = v.types[*id];
            if (t == token_type::control || t == token_type::user_defined) v.eog.insert(*id);
        }
    }

    for (size_t i = 0; i < n; ++i) {
        const token_type t = v.types[i];
        if ((t == token_type::control || t == token_type::user_defined || t == token_type::unknown) &&
            !v.texts[i].empty()) {
            v.specials.push_back(token_id(i));
        }
    }
    std::stable_sort(v.specials.begin(), v.specials.end(), [&](token_id a, token_id b) {
        return v.texts[a].size() > v.texts[b].size();
    });

    // What each token decodes to.
    v.pieces.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string& s = v.texts[i];
        std::string& p = v.pieces[i];
        switch (v.types[i]) {
        case token_type::control:
        case token_type::unknown:
        case token_type::user_defined:
            p = s;
            break;
        case token_type::byte:
            p = std::string(1, char(parse_byte(s)));
            break;
        case token_type::normal:
            if (v.kind == vocab_kind::spm) {
                for (size_t pos = 0; pos < s.size();) {
                    if (s.compare(pos, space_marker.size(), space_marker) == 0) {
                        p += ' ';
                        pos += space_marker.size();
                    } else {
                        p += s[pos++];
                    }
                }
            } else {
                for (size_t pos = 0; pos < s.size();) {
                    const uni::decoded d = uni::decode_utf8(s, pos);
                    const int b = d.valid ? uni::piece_to_byte(d.cpt) : -1;
                    if (b >= 0) {
                        p += char(b);
                    } else {
                        p.append(s, pos, d.len); // outside the byte map: kept as written
                    }
                    pos += d.len;
                }
            }
            break;
        case token_type::undefined:
        case token_type::unused:
            break; // decode to nothing, as in llama.cpp
        }
    }
    return tok;
}

std::vector<token_id> tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    const impl& v = *impl_;
    std::vector<token_id> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && v.add_bos && v.bos >= 0) out.push_back(v.bos);

    // SentencePiece prefixes a space to text at the start and after every special token.
    bool after_special = true;
    std::string buf;
    for (const impl::fragment& f : v.partition(text, parse_special)) {
        if (f.id >= 0) {
            out.push_back(f.id);
            after_special = true;
            continue;
        }
        const std::string_view s = text.substr(f.begin, f.end - f.begin);
        if (v.kind == vocab_kind::bpe) {
            v.encode_bpe(s, out);
            continue;
        }
        buf.clear();
        if (v.add_space_prefix && after_special) buf += space_marker;
        for (const char ch : s) {
            if (ch == ' ') {
                buf += space_marker;
            } else {
                buf += ch;
            }
        }
        v.encode_spm(buf, out);
        after_special = false;
    }

    if (add_special && v.add_eos && v.eos >= 0) out.push_back(v.eos);
    return out;
}

std::string tokenizer::decode(std::span<const token_id> ids, bool render_special, bool strip_space_prefix) const {
    const impl& v = *impl_;
    std::string out;
    // Only the space that encode put in front of the text: the first piece that shows.
    bool strip = strip_space_prefix && v.kind == vocab_kind::spm && v.add_space_prefix;
    for (const token_id id : ids) {
        TANDEM_CHECK(id >= 0 && id < n_vocab(), "decode: token id {} outside the vocabulary of {}", id, n_vocab());
        std::string_view p = v.piece_view(id, render_special);
        if (strip && !p.empty()) {
            if (p.front() == ' ') p.remove_prefix(1);
            strip = false;
        }
        out += p;
    }
    return out;
}

std::string tokenizer::piece(token_id id, bool render_special) const {
    TANDEM_CHECK(id >= 0 && id < n_vocab(), "piece: token id {} outside the vocabulary of {}", id, n_vocab());
    return std::string(impl_->piece_view(id, render_special));
}

std::vector<std::string> tokenizer::pre_tokenize(std::string_view pre, std::string_view text) {
    const auto k = pre_from_name(pre);
    TANDEM_CHECK(k.has_value(), "pre-tokenizer '{}' is not supported", pre);
    std::vector<std::string> words;
    for (const auto& [at, len] : pre_split(*k, text)) words.emplace_back(text.substr(at, len));
    return words;
}

std::string_view tokenizer::kind() const { return impl_->kind_name; }
std::string_view tokenizer::pre() const { return impl_->pre_name; }
int32_t tokenizer::n_vocab() const { return int32_t(impl_->texts.size()); }

const std::string& tokenizer::token_text(token_id id) const {
    TANDEM_CHECK(id >= 0 && id < n_vocab(), "token_text: token id {} outside the vocabulary of {}", id, n_vocab());
    return impl_->texts[id];
}

token_type tokenizer::type_of(token_id id) const {
    TANDEM_CHECK(id >= 0 && id < n_vocab(), "type_of: token id {} outside the vocabulary of {}", id, n_vocab());
    return impl_->types[id];
}

std::optional<token_id> tokenizer::find(std::string_view text) const { return impl_->lookup(text); }

token_id tokenizer::bos() const { return impl_->bos; }
token_id tokenizer::eos() const { return impl_->eos; }
token_id tokenizer::unk() const { return impl_->unk; }
token_id tokenizer::pad() const { return impl_->pad; }
bool tokenizer::add_bos() const { return impl_->add_bos; }
bool tokenizer::add_eos() const { return impl_->add_eos; }
bool tokenizer::add_space_prefix() const { return impl_->add_space_prefix; }
bool tokenizer::is_eog(token_id id) const { return impl_->eog.count(id) > 0; }

stream_decoder::stream_decoder(const tokenizer& tok, bool render_special)
    : tok_(&tok), render_special_(render_special) {}

std::string stream_decoder::push(token_id id) {
    pending_ += tok_->piece(id, render_special_);
    const size_t ready = pending_.size() - unicode::incomplete_tail(pending_);
    std::string out = unicode::sanitize_utf8(std::string_view(pending_).substr(0, ready));
    pending_.erase(0, ready);
    return out;
}

std::string stream_decoder::flush() {
    std::string out = unicode::sanitize_utf8(pending_);
    pending_.clear();
    return out;
}

} // namespace tandem
