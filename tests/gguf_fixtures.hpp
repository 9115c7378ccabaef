// GGUF values and files shared by the GGUF suites (test_gguf, test_gguf_hostile): a file with
// every value and tensor type, nested arrays, the end of the tensor data.
#pragma once

#include "runtime/gguf.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::test {

inline gguf::value make(gguf::value_type t, decltype(gguf::value::v) v) {
    gguf::value out;
    out.type = t;
    out.v = std::move(v);
    return out;
}

inline gguf::value make_array(gguf::value_type et, std::vector<gguf::value> items) {
    gguf::array_value a;
    a.elem_type = et;
    a.items = std::move(items);
    return make(gguf::value_type::array, std::move(a));
}

// `depth` levels of single-element arrays around an array of one u8.
inline gguf::value nested(int depth) {
    gguf::value v = make_array(gguf::value_type::u8, {make(gguf::value_type::u8, uint64_t(7))});
    for (int i = 1; i < depth; ++i) v = make_array(gguf::value_type::array, {v});
    return v;
}

inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = uint8_t(seed + i * 31);
    return d;
}

// A small file with every value type, nested arrays and every tensor type: the mutation base.
inline gguf::writer rich_writer() {
    using vt = gguf::value_type;
    gguf::writer w;
    w.set("u8", make(vt::u8, uint64_t(200)));
    w.set("i8", make(vt::i8, int64_t(-100)));
    w.set("u16", make(vt::u16, uint64_t(60000)));
    w.set("i16", make(vt::i16, int64_t(-30000)));
    w.set_u32("u32", 4000000000u);
    w.set_i32("i32", -2000000000);
    w.set_f32("f32", 1.5f);
    w.set_bool("bool", true);
    w.set_string("string", std::string("bytes \0\xff\xfe ok", 12));
    w.set_u64("u64", ~uint64_t(0));
    w.set("i64", make(vt::i64, int64_t(INT64_MIN)));
    w.set("f64", make(vt::f64, 2.0e300));
    w.set_string_array("strings", {"", "a", "\xe2\x96\x81the", std::string(1, '\0')});
    w.set_f32_array("floats", {0.0f, -1.0f, 3.25f});
    w.set_i32_array("ints", {1, -2, 3});
    w.set("nested", make_array(vt::array, {make_array(vt::string, {make(vt::string, std::string("x"))}),
                                           make_array(vt::i16, {make(vt::i16, int64_t(-5))}),
                                           make_array(vt::u8, {})}));
    w.set("empty", make_array(vt::f64, {}));
    w.add_tensor("t.f32", dtype::f32, {4, 2}, pattern(32, 1));
    w.add_tensor("t.f16", dtype::f16, {3}, pattern(6, 2));
    w.add_tensor("t.bf16", dtype::bf16, {1, 1, 2, 2}, pattern(8, 3));
    w.add_tensor("t.q8_0", dtype::q8_0, {64, 1, 1}, pattern(68, 4));
    w.add_tensor("t.i8", dtype::i8, {5, 1}, pattern(5, 5));
    return w;
}

// The end of the last tensor's data: every shorter prefix must be rejected.
inline uint64_t required_end(const gguf::file& f) {
    uint64_t end = 0;
    for (const auto& t : f.tensors())
        end = std::max<uint64_t>(end, uint64_t(t.data - f.bytes().data()) + t.n_bytes);
    return end;
}

} // namespace tandem::test
