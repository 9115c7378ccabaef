// Writes the fuzz_gguf seed corpus: 64 KiB prefixes of real models and small valid files.
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

using namespace tandem;
namespace fs = std::filesystem;

namespace {

constexpr size_t max_seed = 64 * 1024; // the smoke run's -max_len

void save(const fs::path& path, std::span<const uint8_t> bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!out) fail("{}: cannot write", path.string());
}

// Real metadata is mostly long token arrays; a few items keep the structure and stay small.
gguf::value shorten(gguf::value v) {
    if (auto* a = std::get_if<gguf::array_value>(&v.v)) {
        if (a->items.size() > 16) a->items.resize(16);
        for (auto& item : a->items) item = shorten(std::move(item));
    }
    return v;
}

// The model's metadata and tensor list, each tensor cut to its first block or row.
std::vector<uint8_t> shrink(const gguf::file& f) {
    gguf::writer w;
    for (const auto& e : f.metadata()) w.set(e.key, shorten(e.val));
    for (const auto& t : f.tensors()) {
        const auto traits = traits_of(uint32_t(t.type));
        const int64_t n = t.ne[0] <= 64 ? t.ne[0] : traits->block;
        const size_t n_bytes = size_t(n / traits->block) * traits->block_bytes;
        w.add_tensor(t.name, t.type, {n}, {t.data, n_bytes});
    }
    return w.serialize();
}

// Every value type, nested arrays and every tensor type in one small file.
std::vector<uint8_t> rich() {
    using vt = gguf::value_type;
    auto make = [](vt t, decltype(gguf::value::v) v) {
        gguf::value out;
        out.type = t;
        out.v = std::move(v);
        return out;
    };
    gguf::writer w;
    w.set("u8", make(vt::u8, uint64_t(1)));
    w.set("i8", make(vt::i8, int64_t(-1)));
    w.set("u16", make(vt::u16, uint64_t(2)));
    w.set("i16", make(vt::i16, int64_t(-2)));
    w.set_u32("u32", 3);
    w.set_i32("i32", -3);
    w.set_f32("f32", 0.5f);
    w.set_bool("bool", true);
    w.set_string("string", "text");
    w.set_u64("u64", 4);
    w.set("i64", make(vt::i64, int64_t(-4)));
    w.set("f64", make(vt::f64, 0.25));
    w.set_string_array("strings", {"a", "bc"});
    gguf::array_value inner{vt::u8, {make(vt::u8, uint64_t(5))}};
    gguf::array_value outer{vt::array, {make(vt::array, inner), make(vt::array, inner)}};
    w.set("nested", make(vt::array, outer));
    w.set_alignment(64);
    const std::vector<uint8_t> data(256, 0x3c);
    w.add_tensor("f32", dtype::f32, {2, 2}, {data.data(), 16});
    w.add_tensor("f16", dtype::f16, {4}, {data.data(), 8});
    w.add_tensor("bf16", dtype::bf16, {1, 2, 1, 2}, {data.data(), 8});
    w.add_tensor("q8_0", dtype::q8_0, {32, 2}, {data.data(), 68});
    w.add_tensor("i8", dtype::i8, {3}, {data.data(), 3});
    return w.serialize();
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: make_gguf_seeds OUT_DIR [MODEL.gguf ...]\n");
        return 2;
    }
    try {
        const fs::path out = argv[1];
        fs::create_directories(out);
        save(out / "rich.gguf", rich());
        for (int i = 2; i < argc; ++i) {
            const std::string name = fs::path(argv[i]).filename().string();
            const auto bytes = read_file(argv[i]);
            save(out / (name + ".64k"), std::span(bytes).first(std::min(bytes.size(), max_seed)));
            const auto small = shrink(gguf::file::parse(bytes, argv[i]));
            if (small.size() <= max_seed) save(out / (name + ".small"), small);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "make_gguf_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
