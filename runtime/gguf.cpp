// GGUF v2/v3 reader: maps the file read-only and checks every count, size and offset.
#include "runtime/gguf.hpp"

#include "runtime/checked.hpp"
#include "runtime/error.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

namespace tandem::gguf {
namespace {

// Deeper nesting has no use in models; the limit keeps recursion bounded on hostile input.
constexpr int max_depth = 16;
constexpr int max_dims = 4; // GGML_MAX_DIMS
// Each parsed item costs ~50 bytes however small it is in the file, so a cap on array items
// bounds memory; real vocabularies (tokens + merges) stay far below it.
constexpr uint64_t max_items = uint64_t(1) << 24;

// Fewest bytes one value of each type takes in a file, so a count read from the file can be
// bounded by the bytes that remain before anything is reserved or looped over.
constexpr uint64_t min_value_size(value_type t) {
    switch (t) {
    case value_type::u8: case value_type::i8: case value_type::boolean: return 1;
    case value_type::u16: case value_type::i16: return 2;
    case value_type::u32: case value_type::i32: case value_type::f32: return 4;
    case value_type::u64: case value_type::i64: case value_type::f64: return 8;
    case value_type::string: return 8;      // length
    case value_type::array: return 4 + 8;   // element type + count
    }
    return 1;
}

constexpr uint64_t min_kv_size = 8 + 1 + 4 + 1;              // key length, 1-byte key, type, value
constexpr uint64_t min_tensor_info_size = 8 + 1 + 4 + 8 + 4 + 8; // name, n_dims, ne[0], type, offset

bool valid_type(uint32_t t) { return t <= uint32_t(value_type::f64); }

std::string printable(std::string_view s) {
    // Names go into one-line messages: escape control bytes and cap the length.
    std::string out;
    for (unsigned char c : s.substr(0, 80)) {
        if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
        else out += char(c);
    }
    if (s.size() > 80) out += "...";
    return out;
}

// Little-endian cursor over the file; every failure names the file and what was being read.
class reader {
public:
    reader(std::span<const uint8_t> b, const std::string& path) : b_(b), path_(path) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return b_.size() - pos_; }
    void set_context(std::string c) { context_ = std::move(c); }

    template <class... Args>
    [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
        throw error(fmt::format("{}: {}", path_, fmt::format(f, std::forward<Args>(args)...)));
    }

    void need(uint64_t n, std::string_view what) const {
        if (n > remaining())
            fail("truncated: {} of {} needs {} bytes at offset {}, but the file ends at {}", what, context_, n,
                 pos_, b_.size());
    }

    template <class T>
    T read(std::string_view what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, b_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(std::string_view what) {
        const uint64_t n = read<uint64_t>(what);
        if (n > remaining())
            fail("truncated: {} of {} claims {} bytes at offset {}, but the file ends at {}", what, context_, n,
                 pos_, b_.size());
        std::string s(reinterpret_cast<const char*>(b_.data() + pos_), size_t(n));
        pos_ += n;
        return s;
    }

    // Rejects a count that the rest of the file cannot hold at `min_each` bytes per item.
    void bound_count(uint64_t n, uint64_t min_each, std::string_view what) const {
        if (n > remaining() / min_each)
            fail("{} of {} is {}, more than the {} bytes left at offset {} can hold", what, context_, n, remaining(),
                 pos_);
    }

    value read_value(value_type t, int depth) {
        value v;
        v.type = t;
        switch (t) {
        case value_type::u8: v.v = uint64_t(read<uint8_t>("uint8 value")); break;
        case value_type::i8: v.v = int64_t(read<int8_t>("int8 value")); break;
        case value_type::u16: v.v = uint64_t(read<uint16_t>("uint16 value")); break;
        case value_type::i16: v.v = int64_t(read<int16_t>("int16 value")); break;
        case value_type::u32: v.v = uint64_t(read<uint32_t>("uint32 value")); break;
        case value_type::i32: v.v = int64_t(read<int32_t>("int32 value")); break;
        case value_type::u64: v.v = read<uint64_t>("uint64 value"); break;
        case value_type::i64: v.v = read<int64_t>("int64 value"); break;
        case value_type::f32: v.v = double(read<float>("float32 value")); break;
        case value_type::f64: v.v = read<double>("float64 value"); break;
        case value_type::boolean: {
            const uint8_t b = read<uint8_t>("bool value");
            if (b > 1) fail("bool value {} of {} at offset {} is neither 0 nor 1", b, context_, pos_ - 1);
            v.v = b == 1;
            break;
        }
        case value_type::string: v.v = read_string("string value"); break;
        case value_type::array: v.v = read_array(depth); break;
        }
        return v;
    }

private:
    array_value read_array(int depth) {
        const uint32_t et = read<uint32_t>("array element type");
        if (!valid_type(et)) fail("array in {} has unknown element type {} at offset {}", context_, et, pos_ - 4);
        array_value a;
        a.elem_type = value_type(et);
        if (a.elem_type == value_type::array && depth + 1 >= max_depth)
            fail("arrays in {} are nested deeper than {} levels", context_, max_depth);
        const uint64_t n = read<uint64_t>("array length");
        bound_count(n, min_value_size(a.elem_type), "array length");
        if (n > max_items - n_items_)
            fail("arrays in the metadata hold more than {} items in all (at {})", max_items, context_);
        n_items_ += n;
        a.items.reserve(size_t(n));
        for (uint64_t i = 0; i < n; ++i) a.items.push_back(read_value(a.elem_type, depth + 1));
        return a;
    }

    std::span<const uint8_t> b_;
    const std::string& path_;
    uint64_t pos_ = 0;
    uint64_t n_items_ = 0; // array items so far, all arrays together
    std::string context_ = "the header";
};

} // namespace

std::string_view type_name(value_type t) {
    switch (t) {
    case value_type::u8: return "uint8";
    case value_type::i8: return "int8";
    case value_type::u16: return "uint16";
    case value_type::i16: return "int16";
    case value_type::u32: return "uint32";
    case value_type::i32: return "int32";
    case value_type::f32: return "float32";
    case value_type::boolean: return "bool";
    case value_type::string: return "string";
    case value_type::array: return "array";
    case value_type::u64: return "uint64";
    case value_type::i64: return "int64";
    case value_type::f64: return "float64";
    }
    return "unknown";
}

std::optional<int64_t> value::as_int() const {
    if (const auto* u = std::get_if<uint64_t>(&v)) {
        if (*u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
        return int64_t(*u);
    }
    if (const auto* i = std::get_if<int64_t>(&v)) return *i;
    return std::nullopt;
}

std::optional<double> value::as_float() const {
    if (const auto* d = std::get_if<double>(&v)) return *d;
    if (const auto* u = std::get_if<uint64_t>(&v)) return double(*u);
    if (const auto* i = std::get_if<int64_t>(&v)) return double(*i);
    return std::nullopt;
}

std::optional<bool> value::as_bool() const {
    if (const auto* b = std::get_if<bool>(&v)) return *b;
    return std::nullopt;
}

const std::string* value::as_string() const { return std::get_if<std::string>(&v); }
const array_value* value::as_array() const { return std::get_if<array_value>(&v); }

int64_t tensor_info::n_elements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

file file::open(const std::string& path) { return open(path, -1); }

file file::open(const std::string& path, int given_fd) {
    file f;
    f.path_ = path;
    const int fd = given_fd >= 0 ? ::fcntl(given_fd, F_DUPFD_CLOEXEC, 0) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        fail("{}: cannot stat: {}", path, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail("{}: {}", path, S_ISDIR(st.st_mode) ? "is a directory, not a GGUF file" : "is not a regular file");
    }
    if (st.st_size == 0) {
        ::close(fd);
        fail("{}: empty file, not a GGUF file", path);
    }
    void* m = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd); // the mapping keeps the file alive
    if (m == MAP_FAILED) fail("{}: cannot map {} bytes: {}", path, st.st_size, std::strerror(e));
    f.map_ = m;
    f.map_len_ = size_t(st.st_size);
    f.bytes_ = {static_cast<const uint8_t*>(m), f.map_len_};
    f.parse_all(); // on failure f's destructor unmaps
    return f;
}

file file::parse(std::span<const uint8_t> bytes, std::string name) {
    file f;
    f.path_ = std::move(name);
    f.bytes_ = bytes;
    f.parse_all();
    return f;
}

file::file(file&& o) noexcept
    : path_(std::move(o.path_)), bytes_(o.bytes_), map_(std::exchange(o.map_, nullptr)),
      map_len_(std::exchange(o.map_len_, 0)), version_(o.version_), alignment_(o.alignment_),
      kvs_(std::move(o.kvs_)), tensors_(std::move(o.tensors_)), kv_index_(std::move(o.kv_index_)),
      tensor_index_(std::move(o.tensor_index_)) {
    o.bytes_ = {};
}

file& file::operator=(file&& o) noexcept {
    if (this == &o) return *this;
    if (map_) ::munmap(map_, map_len_);
    path_ = std::move(o.path_);
    bytes_ = std::exchange(o.bytes_, {});
    map_ = std::exchange(o.map_, nullptr);
    map_len_ = std::exchange(o.map_len_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    kvs_ = std::move(o.kvs_);
    tensors_ = std::move(o.tensors_);
    kv_index_ = std::move(o.kv_index_);
    tensor_index_ = std::move(o.tensor_index_);
    return *this;
}

file::~file() {
    if (map_) ::munmap(map_, map_len_);
}

void file::parse_all() {
    reader r(bytes_, path_);
    const uint64_t size = bytes_.size();

    // Header. The magic bytes are "GGUF"; a big-endian writer stores the same u32 swapped.
    if (size < 4) r.fail("{} bytes, too short to be a GGUF file", size);
    const std::string_view magic(reinterpret_cast<const char*>(bytes_.data()), 4);
    if (magic == "FUGG") r.fail("big-endian GGUF file; only little-endian files are supported");
    if (magic != "GGUF") {
        if (magic == "lmgg" || magic == "fmgg" || magic == "tjgg")
            r.fail("old GGML/GGMF/GGJT file, not GGUF; convert it with llama.cpp's tools first");
        r.fail("not a GGUF file (magic {:02x} {:02x} {:02x} {:02x})", bytes_[0], bytes_[1], bytes_[2], bytes_[3]);
    }
    r.read<uint32_t>("magic");
    const uint32_t version = r.read<uint32_t>("version");
    if (version == 1) r.fail("GGUF v1 is not supported (v2 and v3 are); re-convert the model");
    if (const uint32_t swapped = __builtin_bswap32(version); swapped >= 1 && swapped <= 3)
        r.fail("big-endian GGUF v{} file; only little-endian files are supported", swapped);
    if (version != 2 && version != 3) r.fail("unsupported GGUF version {} (v2 and v3 are supported)", version);
    version_ = version;

    const uint64_t n_tensors = r.read<uint64_t>("tensor count");
    const uint64_t n_kv = r.read<uint64_t>("metadata count");
    r.bound_count(n_kv, min_kv_size, "metadata count");
    r.bound_count(n_tensors, min_tensor_info_size, "tensor count");

    // Metadata. The index holds views of the keys, so kvs_ must never reallocate: reserve first.
    kvs_.reserve(size_t(n_kv));
    kv_index_.reserve(size_t(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        r.set_context(fmt::format("metadata entry {}", i));
        kv e;
        e.key = r.read_string("key");
        if (e.key.empty()) r.fail("metadata entry {} has an empty key", i);
        r.set_context(fmt::format("metadata key '{}'", printable(e.key)));
        const uint32_t t = r.read<uint32_t>("value type");
        if (!valid_type(t)) r.fail("metadata key '{}' has unknown value type {}", printable(e.key), t);
        e.val = r.read_value(value_type(t), 0);
        kvs_.push_back(std::move(e));
        if (!kv_index_.emplace(kvs_.back().key, kvs_.size() - 1).second)
            r.fail("metadata key '{}' appears twice", printable(kvs_.back().key));
    }

    if (const value* a = find("general.alignment")) {
        const auto n = a->as_int();
        if (!n) r.fail("general.alignment is {}, expected an integer", type_name(a->type));
        if (*n <= 0 || !std::has_single_bit(uint64_t(*n)))
            r.fail("general.alignment is {}, expected a nonzero power of two", *n);
        alignment_ = uint64_t(*n);
    }

    // Tensor infos (reserved for the same reason).
    tensors_.reserve(size_t(n_tensors));
    tensor_index_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        r.set_context(fmt::format("tensor info {}", i));
        tensor_info t;
        t.name = r.read_string("name");
        if (t.name.empty()) r.fail("tensor info {} has an empty name", i);
        const std::string name = printable(t.name);
        r.set_context(fmt::format("tensor {}", name));
        const uint32_t n_dims = r.read<uint32_t>("dimension count");
        if (n_dims < 1 || n_dims > uint32_t(max_dims))
            r.fail("tensor {} has {} dimensions, expected 1 to {}", name, n_dims, max_dims);
        uint64_t n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne = r.read<uint64_t>("dimension");
            if (ne == 0 || ne > uint64_t(std::numeric_limits<int64_t>::max()))
                r.fail("tensor {} has dimension {} = {}, expected 1 to 2^63-1", name, d, ne);
            const auto p = checked_mul(n_elements, ne);
            if (!p || *p > uint64_t(std::numeric_limits<int64_t>::max()))
                r.fail("tensor {} has more than 2^63-1 elements", name);
            n_elements = *p;
            t.ne.push_back(int64_t(ne));
        }
        const uint32_t type = r.read<uint32_t>("type");
        const auto traits = traits_of(type);
        if (!traits) {
            const std::string_view tn = ggml_type_name(type);
            if (tn == "unknown") r.fail("tensor {} has unknown type {}", name, type);
            r.fail("tensor {} has type {}, which Tandem does not support (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, I8)", name, tn);
        }
        t.type = dtype(type);
        if (uint64_t(t.ne[0]) % uint64_t(traits->block) != 0)
            r.fail("tensor {} has ne[0] = {}, not a multiple of the {} block size {}", name, t.ne[0],
                   ggml_type_name(type), traits->block);
        const auto nb = checked_mul(n_elements / uint64_t(traits->block), traits->block_bytes);
        if (!nb || *nb > size) r.fail("tensor {} needs more bytes than the file has ({})", name, size);
        t.n_bytes = *nb;
        t.offset = r.read<uint64_t>("data offset");
        if (t.offset % alignment_ != 0)
            r.fail("tensor {} has data offset {}, not a multiple of the alignment {}", name, t.offset, alignment_);
        tensors_.push_back(std::move(t));
        if (!tensor_index_.emplace(tensors_.back().name, tensors_.size() - 1).second)
            r.fail("tensor {} appears twice", name);
    }

    // Tensor data: the section starts at the next aligned offset after the infos.
    if (tensors_.empty()) return;
    const auto data_start = checked_align(r.pos(), alignment_);
    if (!data_start || *data_start > size)
        r.fail("truncated: the tensor data section would start at offset {} (alignment {}), past the end at {}",
               r.pos(), alignment_, size);
    for (tensor_info& t : tensors_) {
        const auto begin = checked_add(*data_start, t.offset);
        const auto end = begin ? checked_add(*begin, t.n_bytes) : std::nullopt;
        if (!end || *end > size)
            r.fail("truncated: tensor {} data ({} bytes at offset {} of the data section, which starts at {}) "
                   "runs past the end of the file at {}",
                   printable(t.name), t.n_bytes, t.offset, *data_start, size);
        t.data = bytes_.data() + *begin;
    }

    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
        const tensor_info& prev = tensors_[order[i - 1]];
        const tensor_info& cur = tensors_[order[i]];
        if (prev.offset + prev.n_bytes > cur.offset) // both in bounds, so no overflow
            r.fail("tensors {} and {} overlap in the data section", printable(prev.name), printable(cur.name));
    }
}

const value* file::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].val;
}

const tensor_info* file::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<int64_t> file::get_int(std::string_view key) const {
    const value* v = find(key);
    if (!v) return std::nullopt;
    auto i = v->as_int();
    TANDEM_CHECK(i.has_value(), "{}: metadata key {} is {}{}, expected an integer", path_, key, type_name(v->type),
                 std::holds_alternative<uint64_t>(v->v) ? " too large for int64" : "");
    return i;
}

std::optional<double> file::get_float(std::string_view key) const {
    const value* v = find(key);
    if (!v) return std::nullopt;
    auto d = v->as_float();
    TANDEM_CHECK(d.has_value(), "{}: metadata key {} is {}, expected a number", path_, key, type_name(v->type));
    return d;
}

std::optional<bool> file::get_bool(std::string_view key) const {
    const value* v = find(key);
    if (!v) return std::nullopt;
    auto b = v->as_bool();
    TANDEM_CHECK(b.has_value(), "{}: metadata key {} is {}, expected a bool", path_, key, type_name(v->type));
    return b;
}

std::optional<std::string> file::get_string(std::string_view key) const {
    const value* v = find(key);
    if (!v) return std::nullopt;
    const std::string* s = v->as_string();
    TANDEM_CHECK(s != nullptr, "{}: metadata key {} is {}, expected a string", path_, key, type_name(v->type));
    return *s;
}

const array_value* file::get_array(std::string_view key) const {
    const value* v = find(key);
    if (!v) return nullptr;
    const array_value* a = v->as_array();
    TANDEM_CHECK(a != nullptr, "{}: metadata key {} is {}, expected an array", path_, key, type_name(v->type));
    return a;
}

std::vector<std::string> file::get_string_array(std::string_view key) const {
    const array_value* a = get_array(key);
    if (!a) return {};
    TANDEM_CHECK(a->elem_type == value_type::string, "{}: metadata key {} is an array of {}, expected strings",
                 path_, key, type_name(a->elem_type));
    std::vector<std::string> out;
    out.reserve(a->items.size());
    for (const value& v : a->items) out.push_back(*v.as_string());
    return out;
}

std::vector<float> file::get_f32_array(std::string_view key) const {
    const array_value* a = get_array(key);
    if (!a) return {};
    std::vector<float> out;
    out.reserve(a->items.size());
    for (const value& v : a->items) {
        auto d = v.as_float();
        TANDEM_CHECK(d.has_value(), "{}: metadata key {} is an array of {}, expected numbers", path_, key,
                     type_name(a->elem_type));
        out.push_back(float(*d));
    }
    return out;
}

std::vector<int32_t> file::get_i32_array(std::string_view key) const {
    const array_value* a = get_array(key);
    if (!a) return {};
    std::vector<int32_t> out;
    out.reserve(a->items.size());
    for (size_t i = 0; i < a->items.size(); ++i) {
        auto n = a->items[i].as_int();
        TANDEM_CHECK(n.has_value(), "{}: metadata key {} is an array of {}, expected integers", path_, key,
                     type_name(a->elem_type));
        TANDEM_CHECK(*n >= std::numeric_limits<int32_t>::min() && *n <= std::numeric_limits<int32_t>::max(),
                     "{}: metadata key {}[{}] = {} does not fit in int32", path_, key, i, *n);
        out.push_back(int32_t(*n));
    }
    return out;
}

} // namespace tandem::gguf
