// libFuzzer target for the shared-memory ring's reader, facing a corrupt or hostile peer: the
// input is the ring as the peer left it (header fields and data area), then a script of what
// happens next, each step either our pop (or push) or the peer overwriting part of the shared
// memory. The area is allocated to its exact size, so a read or write past it is an ASan report;
// every pop must return false or a record that lies inside the area, and a view marked corrupt
// stays so.
#include "ipc/ring.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

namespace {

// Bytes from the input, in order; zeros once it is used up.
struct reader {
    const uint8_t* p;
    size_t n;
    uint8_t byte() { return n ? (--n, *p++) : 0; }
    uint64_t u64() {
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= uint64_t(byte()) << (8 * i);
        return v;
    }
    std::span<const uint8_t> take(size_t k) {
        k = std::min(k, n);
        const std::span<const uint8_t> s(p, k);
        p += k;
        n -= k;
        return s;
    }
};

struct area_free {
    void operator()(void* p) const { std::free(p); }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using tandem::ipc::ring;
    using tandem::ipc::ring_header;
    reader in{data, size};
    const uint64_t cap = ring::min_capacity << (in.byte() % 6); // 64 .. 2048 bytes
    const size_t bytes = ring::bytes_for(cap);                  // a multiple of 64: aligned_alloc's size is exact
    const std::unique_ptr<void, area_free> mem(std::aligned_alloc(64, bytes));
    auto* h = static_cast<ring_header*>(mem.get());
    uint8_t* area = static_cast<uint8_t*>(mem.get()) + sizeof(ring_header);

    // The ring as the peer left it: formatted, then its positions (and, by a flag, its
    // capacity or magic) overwritten, and the data area filled from the input.
    ring::init(mem.get(), cap);
    const uint8_t flags = in.byte();
    h->head.store(in.u64());
    h->tail.store(in.u64());
    if (flags & 1) h->capacity = in.u64();
    if (flags & 2) h->magic = uint32_t(in.u64());
    const auto fill = in.take(size_t(cap));
    std::memset(area, 0, size_t(cap));
    std::memcpy(area, fill.data(), fill.size());

    ring r;
    try {
        r = ring::attach(mem.get(), cap);
    } catch (const tandem::error&) {
        return 0; // a bad magic or capacity is refused at attach
    }
    std::vector<uint8_t> payload;
    for (int step = 0; step < 256 && in.n; ++step) {
        switch (in.byte() % 6) {
        case 0:
        case 1: { // our pop
            const bool was_corrupt = r.corrupt();
            const uint64_t head = h->head.load(), tail = h->tail.load();
            uint32_t type = 0;
            payload.clear();
            const bool ok = r.pop(type, payload);
            if (was_corrupt && (ok || !r.corrupt())) std::abort(); // corrupt stays corrupt, and refuses
            if (ok) {
                // The record lay between the old head and the tail, its payload inside the area.
                const uint64_t moved = h->head.load() - head;
                if (moved < 8 + payload.size() || moved > tail - head || moved > cap) std::abort();
                if (type == ring::pad_type) std::abort(); // pads are skipped, never returned
            } else if (!r.corrupt() && h->head.load() != tail) {
                std::abort(); // "empty" must mean read up to the tail
            }
            break;
        }
        case 2: { // our push (the peer may have left our side's positions anywhere)
            const auto msg = in.take(in.byte() % 200);
            const bool was_corrupt = r.corrupt();
            if (r.push(in.byte(), msg) && was_corrupt) std::abort();
            break;
        }
        case 3: h->tail.store(in.u64()); break;        // the peer moves a position
        case 4: h->head.store(h->head.load() + (in.byte() % 64)); break;
        default: { // the peer writes into the data area (or the capacity field)
            const uint64_t at = in.u64() % (cap + 1);
            const auto bytes_in = in.take(std::min<size_t>(16, size_t(cap - at)));
            if (at == cap) h->capacity = cap + in.byte() % 2;
            else std::memcpy(area + at, bytes_in.data(), bytes_in.size());
            break;
        }
        }
        (void)r.empty();
    }
    return 0;
}
