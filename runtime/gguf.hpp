// GGUF v2/v3 reader (mmap, every size checked) and writer.
#pragma once

#include "runtime/dtype.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace tandem::gguf {

// GGUF metadata value types, numbered as in the file format.
enum class value_type : uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
    string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

std::string_view type_name(value_type t);

struct value;

struct array_value {
    value_type elem_type = value_type::u8;
    std::vector<value> items; // nested arrays allowed
};

// One metadata value. Integers of every width are held as int64_t/uint64_t,
// floats as double; `type` keeps the type the file used.
struct value {
    value_type type = value_type::u8;
    std::variant<uint64_t, int64_t, double, bool, std::string, array_value> v;

    std::optional<int64_t> as_int() const;     // any integer type, if it fits in int64_t
    std::optional<double> as_float() const;    // f32/f64, or any integer
    std::optional<bool> as_bool() const;
    const std::string* as_string() const;
    const array_value* as_array() const;
};

struct kv {
    std::string key;
    value val;
};

struct tensor_info {
    std::string name;
    dtype type = dtype::f32;
    std::vector<int64_t> ne;   // dims, ne[0] is the contiguous (fastest) one
    uint64_t offset = 0;       // from the start of the data section
    uint64_t n_bytes = 0;
    const uint8_t* data = nullptr; // into the mapped file

    int64_t n_elements() const;
};

// A parsed GGUF file. open() maps the file read-only; the tensors point into the mapping,
// which lives as long as the file object (move-only). Every malformed input throws
// tandem::error with one line "<path>: <problem>", never crashes or allocates without bound.
class file {
public:
    static file open(const std::string& path);
    // The same, reading the file that `fd` has open (it may have been renamed over or
    // deleted since); messages name `path`. `fd` stays open.
    static file open(const std::string& path, int fd);
    // Parses bytes the caller keeps alive (tests, fuzzing). `name` prefixes error messages.
    static file parse(std::span<const uint8_t> bytes, std::string name);

    file(file&&) noexcept;
    file& operator=(file&&) noexcept;
    ~file();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    std::span<const uint8_t> bytes() const { return bytes_; }

    const std::vector<kv>& metadata() const { return kvs_; }
    const value* find(std::string_view key) const;

    // Typed look-ups: nullopt when the key is absent; tandem::error when present with a
    // type that cannot convert.
    std::optional<int64_t> get_int(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string> get_string(std::string_view key) const;
    // Arrays: nullptr when absent; tandem::error when present but not an array.
    const array_value* get_array(std::string_view key) const;
    std::vector<std::string> get_string_array(std::string_view key) const; // empty when absent
    std::vector<float> get_f32_array(std::string_view key) const;          // numeric elements
    std::vector<int32_t> get_i32_array(std::string_view key) const;        // integer elements

    const std::vector<tensor_info>& tensors() const { return tensors_; }
    const tensor_info* find_tensor(std::string_view name) const;

private:
    file() = default;
    void parse_all();

    std::string path_;
    std::span<const uint8_t> bytes_;
    void* map_ = nullptr;
    size_t map_len_ = 0;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    std::vector<kv> kvs_;
    std::vector<tensor_info> tensors_;
    // Views into kvs_/tensors_ names; a vector move keeps its elements in place.
    std::unordered_map<std::string_view, size_t> kv_index_;
    std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Builds a GGUF v3 file in memory and writes it. Keys and tensor names must be unique.
class writer {
public:
    void set_u32(std::string key, uint32_t v);
    void set_i32(std::string key, int32_t v);
    void set_u64(std::string key, uint64_t v);
    void set_f32(std::string key, float v);
    void set_bool(std::string key, bool v);
    void set_string(std::string key, std::string v);
    void set_string_array(std::string key, std::vector<std::string> v);
    void set_f32_array(std::string key, std::vector<float> v);
    void set_i32_array(std::string key, std::vector<int32_t> v);
    void set(std::string key, value v); // any value, arrays included

    // `data` is copied; its size must equal the size implied by type and ne.
    void add_tensor(std::string name, dtype type, std::vector<int64_t> ne,
                    std::span<const uint8_t> data);

    // Fills a tensor's bytes (out.size() == its byte size, zeroed) when the file is written,
    // so a model larger than memory streams out one tensor at a time. It is called once per
    // serialize()/write() and must give the same bytes each time.
    using tensor_source = std::function<void(std::span<uint8_t> out)>;
    void add_tensor(std::string name, dtype type, std::vector<int64_t> ne, tensor_source source);

    void set_alignment(uint32_t a); // default 32, also written as general.alignment when != 32
    std::vector<uint8_t> serialize() const;
    void write(const std::string& path) const; // atomically: temp file then rename

private:
    struct pending_tensor {
        std::string name;
        dtype type;
        std::vector<int64_t> ne;
        uint64_t n_bytes = 0;
        std::vector<uint8_t> data; // empty when `source` produces the bytes
        tensor_source source;
    };
    uint64_t check_tensor(const std::string& name, dtype type, const std::vector<int64_t>& ne) const;
    void emit(const std::function<void(const uint8_t*, size_t)>& sink) const;

    std::vector<kv> kvs_;
    std::vector<pending_tensor> tensors_;
    uint32_t alignment_ = 32;
};

} // namespace tandem::gguf
