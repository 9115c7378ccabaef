// The SPSC message ring: records published by release stores of tail, every shared field checked.
#include "ipc/ring.hpp"

#include "runtime/error.hpp"

#include <cstring>
#include <limits>
#include <new>

namespace tandem::ipc {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring positions are shared between processes");
static_assert(sizeof(ring_header) % 64 == 0);

namespace {

constexpr uint32_t ring_magic = 0x474e4952; // "RING"
constexpr uint64_t record_header = 8;       // u32 size, u32 type

uint64_t record_bytes(uint64_t payload) { return record_header + ((payload + 7) & ~uint64_t(7)); }

bool valid_capacity(uint64_t c) { return c >= ring::min_capacity && c <= ring::max_capacity && (c & (c - 1)) == 0; }

} // namespace

uint64_t ring::capacity_for(uint64_t payload_bytes) {
    TANDEM_CHECK(payload_bytes <= std::numeric_limits<uint32_t>::max(), "a ring message of {} bytes", payload_bytes);
    const uint64_t need = 2 * record_bytes(payload_bytes);
    uint64_t c = min_capacity;
    while (c < need) c <<= 1;
    TANDEM_CHECK(c <= max_capacity, "a ring for messages of {} bytes would need {} bytes", payload_bytes, c);
    return c;
}

ring ring::init(void* mem, uint64_t capacity) {
    TANDEM_CHECK(valid_capacity(capacity), "ring capacity {} is not a power of two in [{}, {}]", capacity,
                 min_capacity, max_capacity);
    TANDEM_CHECK(reinterpret_cast<uintptr_t>(mem) % 64 == 0, "ring memory is not 64-byte aligned");
    auto* h = new (mem) ring_header;
    h->head.store(0, std::memory_order_relaxed);
    h->tail.store(0, std::memory_order_relaxed);
    h->capacity = capacity;
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = ring_magic;
    ring r;
    r.h_ = h;
    r.data_ = static_cast<uint8_t*>(mem) + sizeof(ring_header);
    r.cap_ = capacity;
    return r;
}

ring ring::attach(void* mem, uint64_t capacity) {
    TANDEM_CHECK(valid_capacity(capacity), "ring capacity {} is not a power of two in [{}, {}]", capacity,
                 min_capacity, max_capacity);
    TANDEM_CHECK(reinterpret_cast<uintptr_t>(mem) % 64 == 0, "ring memory is not 64-byte aligned");
    auto* h = static_cast<ring_header*>(mem);
    TANDEM_CHECK(h->magic == ring_magic, "ring: bad magic {:#x}", h->magic);
    TANDEM_CHECK(h->capacity == capacity, "ring: capacity {} where {} was expected", h->capacity, capacity);
    ring r;
    r.h_ = h;
    r.data_ = static_cast<uint8_t*>(mem) + sizeof(ring_header);
    r.cap_ = capacity;
    return r;
}

bool ring::broken() {
    corrupt_ = true;
    return false;
}

bool ring::push(uint32_t type, std::span<const uint8_t> payload) {
    if (!h_ || corrupt_) return false;
    if (h_->capacity != cap_) return broken();
    if (type == pad_type || payload.size() > std::numeric_limits<uint32_t>::max()) return false;
    const uint64_t rec = record_bytes(payload.size());
    if (rec > cap_) return false; // never fits

    uint64_t tail = h_->tail.load(std::memory_order_relaxed); // only we write it
    const uint64_t head = h_->head.load(std::memory_order_acquire);
    if (tail - head > cap_ || ((head | tail) & 7) != 0) return broken();
    uint64_t free = cap_ - (tail - head);
    uint64_t pos = tail & (cap_ - 1);
    const uint64_t to_end = cap_ - pos;
    if (rec > to_end) {
        // Straddles the end: a pad record covers the rest of the area, the message goes at 0.
        if (to_end > free) return false;
        const uint32_t pad[2] = {uint32_t(to_end - record_header), pad_type};
        std::memcpy(data_ + pos, pad, sizeof pad);
        tail += to_end;
        free -= to_end;
        pos = 0;
        if (rec > free) {
            // Publish the pad alone: once the consumer passes it the message fits at the
            // start, even one that could never fit at this position.
            h_->tail.store(tail, std::memory_order_release);
            return false;
        }
    }
    if (rec > free) return false;
    const uint32_t hdr[2] = {uint32_t(payload.size()), type};
    std::memcpy(data_ + pos, hdr, sizeof hdr);
    if (!payload.empty()) std::memcpy(data_ + pos + record_header, payload.data(), payload.size());
    h_->tail.store(tail + rec, std::memory_order_release);
    return true;
}

bool ring::pop(uint32_t& type, std::vector<uint8_t>& payload) {
    if (!h_ || corrupt_) return false;
    if (h_->capacity != cap_) return broken();
    uint64_t head = h_->head.load(std::memory_order_relaxed); // only we write it
    const uint64_t tail = h_->tail.load(std::memory_order_acquire);
    if (tail - head > cap_ || ((head | tail) & 7) != 0) return broken();
    while (head != tail) {
        const uint64_t pos = head & (cap_ - 1);
        const uint64_t to_end = cap_ - pos; // >= 8: pos and cap_ are multiples of 8
        uint32_t hdr[2];
        std::memcpy(hdr, data_ + pos, sizeof hdr);
        const uint64_t rec = record_bytes(hdr[0]);
        if (rec > to_end || rec > tail - head) return broken();
        if (hdr[1] == pad_type) {
            if (rec != to_end) return broken();
            head += rec;
            h_->head.store(head, std::memory_order_release);
            continue;
        }
        const uint8_t* p = data_ + pos + record_header;
        payload.assign(p, p + hdr[0]);
        type = hdr[1];
        h_->head.store(head + rec, std::memory_order_release);
        return true;
    }
    return false;
}

bool ring::empty() const {
    if (!h_) return true;
    return h_->head.load(std::memory_order_acquire) == h_->tail.load(std::memory_order_acquire);
}

} // namespace tandem::ipc
