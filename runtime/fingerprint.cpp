// Model fingerprint for the shared KV pool and the prefix cache.
#include "runtime/fingerprint.hpp"

#include "runtime/gguf.hpp"

#include <algorithm>
#include <cstring>

namespace tandem {
namespace {

// 64-bit multiply-xorshift over 8-byte words (not cryptographic: it tells models apart).
class hasher {
public:
    void add(std::span<const uint8_t> b) {
        size_t i = 0;
        for (; i + 8 <= b.size(); i += 8) {
            uint64_t w;
            std::memcpy(&w, b.data() + i, 8);
            word(w);
        }
        uint64_t tail = 0;
        std::memcpy(&tail, b.data() + i, b.size() - i);
        word(tail ^ (uint64_t(b.size() - i) << 56));
    }
    void word(uint64_t w) {
        h_ ^= w + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2);
        h_ *= 0xff51afd7ed558ccdull;
        h_ ^= h_ >> 33;
    }
    uint64_t value() const {
        uint64_t h = h_;
        h ^= h >> 29;
        h *= 0xc4ceb9fe1a85ec53ull;
        return h ^ (h >> 32);
    }

private:
    uint64_t h_ = 0x74616e64656d6b76ull; // "tandemkv"
};

} // namespace

uint64_t model_fingerprint(const gguf::file& f, weight_format weights, kv_dtype kv) {
    hasher h;
    const auto bytes = f.bytes();
    h.word(bytes.size());
    h.word(uint64_t(weights));
    h.word(uint64_t(kv));
    // Everything before the first tensor's data: header, metadata, tensor table.
    size_t data_begin = bytes.size();
    for (const auto& t : f.tensors())
        if (t.data) data_begin = std::min(data_begin, size_t(t.data - bytes.data()));
    h.add(bytes.subspan(0, data_begin));
    constexpr size_t sample = 4096;
    for (const auto& t : f.tensors()) {
        if (!t.data) continue;
        const size_t off = size_t(t.data - bytes.data());
        const size_t n = std::min<size_t>(t.n_bytes, bytes.size() - off);
        const auto data = bytes.subspan(off, n);
        h.add(data.first(std::min(n, sample)));
        if (n > sample) h.add(data.last(std::min(n - sample, sample)));
    }
    return h.value();
}

} // namespace tandem
