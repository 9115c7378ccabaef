// A single-producer single-consumer message ring in shared memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

namespace tandem::ipc {

// Lives inside a shared mapping; both sides use it through a `ring` view. Messages are
// [u32 size][u32 type][payload][pad to 8], written in place and published by one release
// store of `tail`: a producer that dies mid-write never publishes a partial message. A
// message that would straddle the end wraps to the start (a pad record fills the gap).
struct ring_header {
    alignas(64) std::atomic<uint64_t> head;  // consumer position (bytes, monotonic)
    alignas(64) std::atomic<uint64_t> tail;  // producer position (bytes, monotonic)
    alignas(64) uint64_t capacity;           // bytes of the data area, a power of two
    uint32_t magic;
};

class ring {
public:
    static constexpr uint64_t min_capacity = 64;
    static constexpr uint64_t max_capacity = uint64_t(1) << 32;
    static constexpr uint32_t pad_type = 0xffffffffu; // reserved for the wrap record

    // `mem` (64-byte aligned) points at a ring_header followed by `capacity` bytes, a power
    // of two in [min_capacity, max_capacity]. init() formats it (the creator, before the
    // peer starts); attach() checks the magic and capacity. Both throw tandem::error.
    static ring init(void* mem, uint64_t capacity);
    static ring attach(void* mem, uint64_t capacity);
    static uint64_t bytes_for(uint64_t capacity) { return sizeof(ring_header) + capacity; }
    // The capacity at which a message of up to `payload_bytes` always fits when the ring is
    // empty, wherever the last message left the position (twice its record, so it fits
    // either before the end or, after the wrap, at the start). Throws tandem::error past
    // max_capacity.
    static uint64_t capacity_for(uint64_t payload_bytes);

    // False when the message does not fit now (the ring is full) or ever (too big, or
    // type == pad_type). A message that fits only after the wrap may publish the pad record
    // alone and return false: it fits once the consumer has read up to the wrap.
    bool push(uint32_t type, std::span<const uint8_t> payload);
    // Copies the next message out; false when the ring is empty. Every shared field is
    // checked against this view's capacity: a corrupt ring (size past the published tail,
    // positions further apart than the capacity, capacity changed) marks the view corrupt,
    // and it stays so (push and pop return false): the caller treats the peer as broken.
    bool pop(uint32_t& type, std::vector<uint8_t>& payload);
    bool empty() const;
    bool corrupt() const { return corrupt_; }

private:
    bool broken(); // marks corrupt, returns false
    ring_header* h_ = nullptr;
    uint8_t* data_ = nullptr;
    uint64_t cap_ = 0; // this side's copy: the shared field is only checked against it
    bool corrupt_ = false;
};

} // namespace tandem::ipc
