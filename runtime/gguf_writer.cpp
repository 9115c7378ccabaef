// GGUF v3 writer: metadata and tensors in memory or streamed from sources, written atomically.
#include "runtime/gguf.hpp"

#include "runtime/checked.hpp"
#include "runtime/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

namespace tandem::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is written in host byte order");

constexpr int max_depth = 16; // as the reader accepts
constexpr uint32_t default_alignment = 32;
constexpr std::string_view alignment_key = "general.alignment";

// resize + memcpy rather than insert: GCC 12 warns falsely (-Warray-bounds) on small inserts.
void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
    put_bytes(out, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
    put<uint64_t>(out, s.size());
    put_bytes(out, s.data(), s.size());
}

// Reads an integer held either way, nullopt for a non-integer.
std::optional<uint64_t> as_u64(const value& v) {
    if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
    if (const auto* i = std::get_if<int64_t>(&v.v); i && *i >= 0) return uint64_t(*i);
    return std::nullopt;
}

std::optional<int64_t> as_i64(const value& v) {
    if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
    if (const auto* u = std::get_if<uint64_t>(&v.v); u && *u <= uint64_t(std::numeric_limits<int64_t>::max()))
        return int64_t(*u);
    return std::nullopt;
}

// Checks that the held alternative fits `type` before anything is written.
void check_value(const std::string& key, const value& v, int depth) {
    auto bad = [&](std::string_view why) {
        fail("gguf writer: metadata key {}: {} value {}", key, type_name(v.type), why);
    };
    auto check_unsigned = [&](uint64_t max) {
        const auto u = as_u64(v);
        if (!u || *u > max) bad("is not an integer in range");
    };
    auto check_signed = [&](int64_t min, int64_t max) {
        const auto i = as_i64(v);
        if (!i || *i < min || *i > max) bad("is not an integer in range");
    };
    switch (v.type) {
    case value_type::u8: check_unsigned(UINT8_MAX); return;
    case value_type::u16: check_unsigned(UINT16_MAX); return;
    case value_type::u32: check_unsigned(UINT32_MAX); return;
    case value_type::u64: check_unsigned(UINT64_MAX); return;
    case value_type::i8: check_signed(INT8_MIN, INT8_MAX); return;
    case value_type::i16: check_signed(INT16_MIN, INT16_MAX); return;
    case value_type::i32: check_signed(INT32_MIN, INT32_MAX); return;
    case value_type::i64: check_signed(INT64_MIN, INT64_MAX); return;
    case value_type::f32:
    case value_type::f64:
        if (!std::holds_alternative<double>(v.v)) bad("does not hold a double");
        return;
    case value_type::boolean:
        if (!std::holds_alternative<bool>(v.v)) bad("does not hold a bool");
        return;
    case value_type::string:
        if (!std::holds_alternative<std::string>(v.v)) bad("does not hold a string");
        return;
    case value_type::array: {
        const auto* a = std::get_if<array_value>(&v.v);
        if (!a) bad("does not hold an array");
        if (depth + 1 >= max_depth && a->elem_type == value_type::array)
            bad(fmt::format("nests arrays deeper than {} levels", max_depth));
        for (const value& item : a->items) {
            if (item.type != a->elem_type)
                fail("gguf writer: metadata key {}: array of {} holds a {}", key, type_name(a->elem_type),
                     type_name(item.type));
            check_value(key, item, depth + 1);
        }
        return;
    }
    }
    fail("gguf writer: metadata key {}: unknown value type {}", key, uint32_t(v.type));
}

void put_value(std::vector<uint8_t>& out, const value& v) {
    switch (v.type) {
    case value_type::u8: put<uint8_t>(out, uint8_t(*as_u64(v))); return;
    case value_type::u16: put<uint16_t>(out, uint16_t(*as_u64(v))); return;
    case value_type::u32: put<uint32_t>(out, uint32_t(*as_u64(v))); return;
    case value_type::u64: put<uint64_t>(out, *as_u64(v)); return;
    case value_type::i8: put<int8_t>(out, int8_t(*as_i64(v))); return;
    case value_type::i16: put<int16_t>(out, int16_t(*as_i64(v))); return;
    case value_type::i32: put<int32_t>(out, int32_t(*as_i64(v))); return;
    case value_type::i64: put<int64_t>(out, *as_i64(v)); return;
    case value_type::f32: put<float>(out, float(std::get<double>(v.v))); return;
    case value_type::f64: put<double>(out, std::get<double>(v.v)); return;
    case value_type::boolean: put<uint8_t>(out, std::get<bool>(v.v) ? 1 : 0); return;
    case value_type::string: put_string(out, std::get<std::string>(v.v)); return;
    case value_type::array: {
        const auto& a = std::get<array_value>(v.v);
        put<uint32_t>(out, uint32_t(a.elem_type));
        put<uint64_t>(out, a.items.size());
        for (const value& item : a.items) put_value(out, item);
        return;
    }
    }
}

value scalar(value_type t, decltype(value::v) v) {
    value out;
    out.type = t;
    out.v = std::move(v);
    return out;
}

template <class T>
value array_of(value_type et, std::vector<T> items) {
    array_value a;
    a.elem_type = et;
    a.items.reserve(items.size());
    for (auto& x : items) {
        if constexpr (std::is_same_v<T, std::string>) a.items.push_back(scalar(et, std::move(x)));
        else if constexpr (std::is_same_v<T, float>) a.items.push_back(scalar(et, double(x)));
        else a.items.push_back(scalar(et, int64_t(x)));
    }
    return scalar(value_type::array, std::move(a));
}

// Writes all of [p, p+n) to fd, retrying short writes.
void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail("{}: write failed: {}", path, std::strerror(errno));
        }
        p += w;
        n -= size_t(w);
    }
}

} // namespace

void writer::set_u32(std::string key, uint32_t v) { set(std::move(key), scalar(value_type::u32, uint64_t(v))); }
void writer::set_i32(std::string key, int32_t v) { set(std::move(key), scalar(value_type::i32, int64_t(v))); }
void writer::set_u64(std::string key, uint64_t v) { set(std::move(key), scalar(value_type::u64, v)); }
void writer::set_f32(std::string key, float v) { set(std::move(key), scalar(value_type::f32, double(v))); }
void writer::set_bool(std::string key, bool v) { set(std::move(key), scalar(value_type::boolean, v)); }
void writer::set_string(std::string key, std::string v) {
    set(std::move(key), scalar(value_type::string, std::move(v)));
}
void writer::set_string_array(std::string key, std::vector<std::string> v) {
    set(std::move(key), array_of(value_type::string, std::move(v)));
}
void writer::set_f32_array(std::string key, std::vector<float> v) {
    set(std::move(key), array_of(value_type::f32, std::move(v)));
}
void writer::set_i32_array(std::string key, std::vector<int32_t> v) {
    set(std::move(key), array_of(value_type::i32, std::move(v)));
}

void writer::set(std::string key, value v) {
    TANDEM_CHECK(!key.empty(), "gguf writer: empty metadata key");
    check_value(key, v, 0);
    for (const kv& e : kvs_) TANDEM_CHECK(e.key != key, "gguf writer: metadata key {} is set twice", key);
    if (key == alignment_key) {
        // The reader takes the alignment from this key, so it must agree with the layout.
        TANDEM_CHECK(v.type == value_type::u32, "gguf writer: general.alignment must be uint32");
        const uint64_t a = *as_u64(v);
        TANDEM_CHECK(a > 0 && std::has_single_bit(a), "gguf writer: general.alignment {} is not a power of two", a);
        alignment_ = uint32_t(a);
    }
    kvs_.push_back({std::move(key), std::move(v)});
}

void writer::set_alignment(uint32_t a) {
    TANDEM_CHECK(a > 0 && std::has_single_bit(a), "gguf writer: alignment {} is not a power of two", a);
    alignment_ = a;
    for (kv& e : kvs_)
        if (e.key == alignment_key) {
            e.val = scalar(value_type::u32, uint64_t(a));
            return;
        }
    if (a != default_alignment) kvs_.push_back({std::string(alignment_key), scalar(value_type::u32, uint64_t(a))});
}

uint64_t writer::check_tensor(const std::string& name, dtype type, const std::vector<int64_t>& ne) const {
    TANDEM_CHECK(!name.empty(), "gguf writer: empty tensor name");
    for (const pending_tensor& t : tensors_)
        TANDEM_CHECK(t.name != name, "gguf writer: tensor {} is added twice", name);
    TANDEM_CHECK(!ne.empty() && ne.size() <= 4, "gguf writer: tensor {} has {} dimensions, expected 1 to 4", name,
                 ne.size());
    const auto traits = traits_of(uint32_t(type));
    TANDEM_CHECK(traits.has_value(), "gguf writer: tensor {} has unsupported type {}", name, name_of(type));
    uint64_t n = 1;
    for (int64_t d : ne) {
        TANDEM_CHECK(d >= 1, "gguf writer: tensor {} has a dimension {} < 1", name, d);
        const auto p = checked_mul(n, uint64_t(d));
        TANDEM_CHECK(p && *p <= uint64_t(std::numeric_limits<int64_t>::max()),
                     "gguf writer: tensor {} has too many elements", name);
        n = *p;
    }
    TANDEM_CHECK(ne[0] % traits->block == 0, "gguf writer: tensor {} has ne[0] = {}, not a multiple of {}", name,
                 ne[0], traits->block);
    const auto nb = checked_mul(n / uint64_t(traits->block), traits->block_bytes);
    TANDEM_CHECK(nb.has_value(), "gguf writer: tensor {} is too large", name);
    return *nb;
}

void writer::add_tensor(std::string name, dtype type, std::vector<int64_t> ne, std::span<const uint8_t> data) {
    const uint64_t n_bytes = check_tensor(name, type, ne);
    TANDEM_CHECK(data.size() == n_bytes, "gguf writer: tensor {} has {} bytes of data, its shape needs {}", name,
                 data.size(), n_bytes);
    tensors_.push_back({std::move(name), type, std::move(ne), n_bytes, {data.begin(), data.end()}, {}});
}

void writer::add_tensor(std::string name, dtype type, std::vector<int64_t> ne, tensor_source source) {
    const uint64_t n_bytes = check_tensor(name, type, ne);
    TANDEM_CHECK(bool(source), "gguf writer: tensor {} has an empty source", name);
    tensors_.push_back({std::move(name), type, std::move(ne), n_bytes, {}, std::move(source)});
}

void writer::emit(const std::function<void(const uint8_t*, size_t)>& sink) const {
    std::vector<uint8_t> h;
    put_bytes(h, "GGUF", 4);
    put<uint32_t>(h, 3);
    put<uint64_t>(h, tensors_.size());
    put<uint64_t>(h, kvs_.size());
    for (const kv& e : kvs_) {
        put_string(h, e.key);
        put<uint32_t>(h, uint32_t(e.val.type));
        put_value(h, e.val);
    }
    uint64_t offset = 0;
    for (const pending_tensor& t : tensors_) {
        put_string(h, t.name);
        put<uint32_t>(h, uint32_t(t.ne.size()));
        for (int64_t d : t.ne) put<uint64_t>(h, uint64_t(d));
        put<uint32_t>(h, uint32_t(t.type));
        put<uint64_t>(h, offset);
        const auto next = checked_align(offset + t.n_bytes, alignment_);
        TANDEM_CHECK(next.has_value(), "gguf writer: tensor data exceeds 2^64 bytes");
        offset = *next;
    }
    h.resize(*checked_align(h.size(), alignment_), 0);
    sink(h.data(), h.size());

    const std::vector<uint8_t> zeros(alignment_, 0);
    std::vector<uint8_t> buf;
    for (const pending_tensor& t : tensors_) {
        if (t.source) {
            buf.assign(size_t(t.n_bytes), 0);
            t.source(std::span<uint8_t>(buf));
            sink(buf.data(), buf.size());
        } else {
            sink(t.data.data(), t.data.size());
        }
        sink(zeros.data(), size_t((alignment_ - t.n_bytes % alignment_) % alignment_));
    }
}

std::vector<uint8_t> writer::serialize() const {
    std::vector<uint8_t> out;
    emit([&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
    return out;
}

void writer::write(const std::string& path) const {
    // A reader never sees a half-written model: write a temp file beside it, then rename.
    std::string tmp = path + ".tmp-XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) fail("{}: cannot create a temporary file beside it: {}", path, std::strerror(errno));
    bool is_open = true;
    try {
        ::fchmod(fd, 0644); // mkstemp makes 0600; models are meant to be shared
        emit([&](const uint8_t* p, size_t n) { write_all(fd, p, n, path); });
        if (::fsync(fd) != 0) fail("{}: fsync failed: {}", path, std::strerror(errno));
        is_open = false;
        if (::close(fd) != 0) fail("{}: close failed: {}", path, std::strerror(errno));
    } catch (...) {
        if (is_open) ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        fail("{}: cannot rename the temporary file into place: {}", path, std::strerror(e));
    }
}

} // namespace tandem::gguf
