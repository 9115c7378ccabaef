// libFuzzer target: arbitrary bytes through the GGUF reader, then a writer round trip.
#include "runtime/error.hpp"
#include "runtime/gguf.hpp"

#include <cstdio>
#include <cstdlib>

using namespace tandem;

namespace {

[[noreturn]] void broken(const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "fuzz_gguf: invariant broken: %s %s\n", what, detail.c_str());
    std::abort();
}

uint64_t walk_value(const gguf::value& v) {
    uint64_t h = uint64_t(v.type);
    if (const auto* a = v.as_array()) {
        for (const auto& item : a->items) {
            if (item.type != a->elem_type) broken("array item type differs from the element type");
            h += walk_value(item);
        }
    } else if (const auto* s = v.as_string()) {
        for (char c : *s) h += uint8_t(c);
    } else if (auto i = v.as_int()) {
        h += uint64_t(*i);
    } else if (auto b = v.as_bool()) {
        h += *b;
    } else if (auto d = v.as_float()) {
        h += *d > 0;
    }
    return h;
}

// Reads everything the parse returned: ASan flags any view that escaped the input.
uint64_t walk(const gguf::file& f) {
    uint64_t h = 0;
    for (const auto& e : f.metadata()) {
        if (e.key.empty()) broken("empty key");
        if (f.find(e.key) != &e.val) broken("find() misses key", e.key);
        h += walk_value(e.val);
        // Typed getters either convert or throw tandem::error.
        try { h += uint64_t(f.get_int(e.key).value_or(0)); } catch (const error&) {}
        try { h += f.get_float(e.key).value_or(0) > 0; } catch (const error&) {}
        try { h += f.get_string(e.key).value_or("").size(); } catch (const error&) {}
        try { h += f.get_string_array(e.key).size(); } catch (const error&) {}
        try { h += f.get_f32_array(e.key).size(); } catch (const error&) {}
        try { h += f.get_i32_array(e.key).size(); } catch (const error&) {}
    }
    const uint8_t* begin = f.bytes().data();
    const uint8_t* end = begin + f.bytes().size();
    for (const auto& t : f.tensors()) {
        if (f.find_tensor(t.name) != &t) broken("find_tensor() misses tensor", t.name);
        if (t.n_bytes == 0 || t.data < begin || t.n_bytes > uint64_t(end - t.data)) broken("tensor data outside the input", t.name);
        if (t.offset % f.alignment() != 0) broken("misaligned tensor", t.name);
        h += t.data[0] + t.data[t.n_bytes - 1] + uint64_t(t.n_elements());
    }
    return h;
}

gguf::writer rewrite(const gguf::file& f) {
    gguf::writer w;
    for (const auto& e : f.metadata()) w.set(e.key, e.val);
    for (const auto& t : f.tensors()) w.add_tensor(t.name, t.type, t.ne, {t.data, size_t(t.n_bytes)});
    return w;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::optional<gguf::file> f;
    try {
        f.emplace(gguf::file::parse({data, size}, "fuzz"));
    } catch (const error& e) {
        const std::string m = e.what();
        if (m.rfind("fuzz: ", 0) != 0 || m.find('\n') != std::string::npos) broken("malformed error message", m);
        return 0;
    }
    [[maybe_unused]] volatile uint64_t h = walk(*f); // volatile: the walk must not be optimised away

    // Whatever parses must write back and re-read to the same bytes. The one thing the
    // writer refuses that the reader takes is a general.alignment stored as another type.
    const gguf::value* a = f->find("general.alignment");
    if (a && a->type != gguf::value_type::u32) return 0;
    std::vector<uint8_t> once;
    try {
        once = rewrite(*f).serialize();
        const gguf::file g = gguf::file::parse(once, "rewritten");
        if (g.metadata().size() != f->metadata().size() || g.tensors().size() != f->tensors().size())
            broken("round trip changed the counts");
        if (rewrite(g).serialize() != once) broken("round trip is not stable");
    } catch (const error& e) {
        broken("round trip failed:", e.what());
    }
    return 0;
}
