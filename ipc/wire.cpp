// Wire encoding of the worker messages: fixed-size host-order fields, bounds-checked decoding.
#include "ipc/wire.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

namespace tandem::ipc {

namespace {

constexpr uint32_t max_seqs = wire_max_seqs;
constexpr uint32_t max_seq_tokens = wire_max_tokens;
constexpr uint32_t max_blocks = wire_max_tokens;
constexpr uint32_t max_string = wire_max_string;

// Both ends are the same build on the same host: fields are memcpy'd in host order.
template <class T>
void put(std::vector<uint8_t>& out, T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
    // Longer text (an exception message, a device name) is cut rather than refused.
    const uint32_t n = uint32_t(std::min<size_t>(s.size(), max_string));
    put(out, n);
    out.insert(out.end(), s.begin(), s.begin() + n);
}

// A count-prefixed array of 4-byte values.
template <class T>
void put_span(std::vector<uint8_t>& out, std::span<const T> v) {
    static_assert(sizeof(T) == 4 && std::is_trivially_copyable_v<T>);
    put(out, uint32_t(v.size()));
    const size_t at = out.size();
    out.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(T));
}

// A count-prefixed array of bytes.
void put_bytes(std::vector<uint8_t>& out, std::span<const uint8_t> v) {
    put(out, uint32_t(v.size()));
    out.insert(out.end(), v.begin(), v.end());
}

// A cursor over the input; every get fails (and stays failed) rather than read past the end.
struct reader {
    std::span<const uint8_t> in;
    size_t at = 0;
    bool ok = true;

    size_t left() const { return in.size() - at; }

    template <class T>
    T get() {
        static_assert(std::is_trivially_copyable_v<T>);
        T v{};
        if (!ok || left() < sizeof v) {
            ok = false;
            return v;
        }
        std::memcpy(&v, in.data() + at, sizeof v);
        at += sizeof v;
        return v;
    }

    bool get_bool() {
        const uint8_t b = get<uint8_t>();
        if (b > 1) ok = false;
        return b == 1;
    }

    std::string get_string() {
        const uint32_t n = get<uint32_t>();
        if (!ok || n > max_string || n > left()) {
            ok = false;
            return {};
        }
        std::string s(reinterpret_cast<const char*>(in.data() + at), n);
        at += n;
        return s;
    }

    // A count-prefixed array of 1- or 4-byte values, at most `cap` of them.
    template <class T>
    std::vector<T> get_array(uint32_t cap) {
        static_assert((sizeof(T) == 4 || sizeof(T) == 1) && std::is_trivially_copyable_v<T>);
        const uint32_t n = get<uint32_t>();
        // Checked against the bytes left before allocating: garbage cannot ask for gigabytes.
        if (!ok || n > cap || uint64_t(n) * sizeof(T) > left()) {
            ok = false;
            return {};
        }
        std::vector<T> v(n);
        if (n) std::memcpy(v.data(), in.data() + at, size_t(n) * sizeof(T));
        at += size_t(n) * sizeof(T);
        return v;
    }

    // A count-prefixed int32 array of at most `cap` elements, each >= `min_value`.
    std::vector<int32_t> get_i32s(uint32_t cap, int32_t min_value) {
        std::vector<int32_t> v = get_array<int32_t>(cap);
        for (int32_t x : v)
            if (x < min_value) {
                ok = false;
                return {};
            }
        return v;
    }

    bool finished() const { return ok && at == in.size(); } // trailing bytes are an error
};

} // namespace

void encode(const hello_msg& m, std::vector<uint8_t>& out) {
    put(out, m.pid);
    put(out, m.n_threads);
    put(out, m.fingerprint);
    put_string(out, m.device);
}

void encode(const run_msg& m, std::vector<uint8_t>& out) { encode_run(m.batch_id, m.b, out); }

void encode_run(uint64_t batch_id, const batch& b, std::vector<uint8_t>& out) {
    TANDEM_ASSERT(uint32_t(b.n_seqs()) <= max_seqs, "run_msg with {} sequences", b.n_seqs());
    TANDEM_ASSERT(b.generations.size() == b.tables.size(), "a batch on the wire carries every page's generation");
    put(out, batch_id);
    put(out, uint32_t(b.n_seqs()));
    for (int32_t i = 0; i < b.n_seqs(); ++i) {
        const auto toks = b.seq_tokens(i);
        const auto table = b.table(i);
        TANDEM_ASSERT(toks.size() <= max_seq_tokens && table.size() <= max_blocks, "sequence with {} tokens, {} blocks",
                      toks.size(), table.size());
        put(out, b.seq_id[size_t(i)]);
        put(out, b.n_past(i));
        put_span(out, toks);
        put_bytes(out, std::span(b.wants_row).subspan(size_t(b.tok_begin[size_t(i)]), toks.size()));
        put_span(out, table);
        put_span(out, b.table_generations(i));
    }
}

uint64_t run_bytes(int64_t n_seqs, int64_t n_tokens, int64_t n_blocks) {
    // batch_id, n_seqs; per sequence: seq_id, n_past, four counts; 4 + 1 bytes a token (its
    // id and its row flag), 4 + 4 a block (page and generation)
    constexpr uint64_t head = 8 + 4, per_seq = 8 + 4 + 4 * 4;
    return head + per_seq * uint64_t(n_seqs) + 5 * uint64_t(n_tokens) + 8 * uint64_t(n_blocks);
}

uint64_t result_bytes_max() {
    constexpr uint64_t hello = 4 + 4 + 8 + 4 + max_string, done = 8 + 1 + 4 + max_string + 8 + 8 + 8;
    return std::max(hello, done);
}

void encode(const done_msg& m, std::vector<uint8_t>& out) {
    put(out, m.batch_id);
    put(out, uint8_t(m.ok ? 1 : 0));
    put_string(out, m.error);
    put(out, m.compute_s);
    put(out, m.kv_upload_bytes);
    put(out, m.kv_kept_bytes);
}

std::optional<hello_msg> decode_hello(std::span<const uint8_t> in) {
    reader r{in};
    hello_msg m;
    m.pid = r.get<int32_t>();
    m.n_threads = r.get<int32_t>();
    m.fingerprint = r.get<uint64_t>();
    m.device = r.get_string();
    if (!r.finished() || m.pid <= 0 || m.n_threads < 0) return std::nullopt;
    return m;
}

std::optional<run_msg> decode_run(std::span<const uint8_t> in) {
    reader r{in};
    run_msg m;
    m.batch_id = r.get<uint64_t>();
    const uint32_t n_seqs = r.get<uint32_t>();
    // Each sequence takes at least 28 bytes, so a count the input cannot hold fails here.
    if (!r.ok || n_seqs > max_seqs || uint64_t(n_seqs) * 28 > r.left()) return std::nullopt;
    for (uint32_t i = 0; i < n_seqs; ++i) {
        const uint64_t id = r.get<uint64_t>();
        const int32_t n_past = r.get<int32_t>();
        const auto tokens = r.get_i32s(max_seq_tokens, std::numeric_limits<int32_t>::min());
        const auto wants = r.get_array<uint8_t>(max_seq_tokens);
        const auto table = r.get_i32s(max_blocks, no_page);
        const auto gens = r.get_array<uint32_t>(max_blocks);
        r.ok = r.ok && batch::rows_valid(wants);
        if (!r.ok || n_past < 0 || int64_t(n_past) + int64_t(tokens.size()) > std::numeric_limits<int32_t>::max() ||
            tokens.empty() || wants.size() != tokens.size() || gens.size() != table.size())
            return std::nullopt;
        m.b.add_seq(id, n_past, tokens, table, gens, wants);
    }
    if (!r.finished()) return std::nullopt;
    return m;
}

std::optional<done_msg> decode_done(std::span<const uint8_t> in) {
    reader r{in};
    done_msg m;
    m.batch_id = r.get<uint64_t>();
    m.ok = r.get_bool();
    m.error = r.get_string();
    m.compute_s = r.get<double>();
    m.kv_upload_bytes = r.get<int64_t>();
    m.kv_kept_bytes = r.get<int64_t>();
    if (!r.finished() || m.kv_upload_bytes < 0 || m.kv_kept_bytes < 0) return std::nullopt;
    return m;
}

} // namespace tandem::ipc
