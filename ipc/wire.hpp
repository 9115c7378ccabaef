// Messages between the supervisor and its workers (payloads of the channel's rings).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem::ipc {

enum class msg_type : uint32_t {
    hello = 1,     // worker -> supervisor once it has loaded and attached: hello_msg
    run = 2,       // supervisor -> worker: run_msg
    done = 3,      // worker -> supervisor: done_msg (ok or failed)
    shutdown = 4,  // supervisor -> worker: exit now (no payload)
};

struct hello_msg {
    int32_t pid = 0;
    int32_t n_threads = 0;
    uint64_t fingerprint = 0;
    std::string device;        // "cpu (avx512_vnni)", "cuda:0 NVIDIA H200", ...
};

// One sequence's share of a batch: the tokens to compute at positions n_past.., the pages
// that hold positions 0..n_past+tokens (block table) with their generations (a worker that
// keeps device copies of pages knows by them what it still holds: runtime/page_mirror.hpp),
// and where its last token's logits go.
struct seq_work {
    uint64_t seq_id = 0;
    int32_t n_past = 0;
    int32_t logits_row = -1;   // -1: no logits wanted (a prefill chunk that is not the last)
    std::vector<int32_t> tokens;
    std::vector<int32_t> block_table;
    std::vector<uint32_t> generations; // [block_table.size()] block_pool::generation of each page
};

struct run_msg {
    uint64_t batch_id = 0;
    std::vector<seq_work> seqs;
};

struct done_msg {
    uint64_t batch_id = 0;
    bool ok = true;
    std::string error;         // when !ok: one line
    double compute_s = 0;      // time in the forward pass
    // A GPU worker's past K/V for this batch: bytes copied from the pool's pages to the device,
    // and bytes its device pages held already (0 and 0 on a CPU worker, or when !ok).
    int64_t kv_upload_bytes = 0;
    int64_t kv_kept_bytes = 0;
};

// What a decoder accepts. Encoders assert the counts and cut longer strings.
inline constexpr uint32_t wire_max_seqs = 65536;         // seqs in one run_msg
inline constexpr uint32_t wire_max_tokens = 1u << 24;    // tokens, and block-table entries, per seq
inline constexpr uint32_t wire_max_string = 64 * 1024;   // bytes of a string

// Encoders append to `out`; decoders return nullopt on any malformed payload (short,
// trailing bytes, negative or oversized counts, negative n_past or page numbers, a
// logits_row below -1, generations not one per page, a bool not 0/1) and never read past
// `in`. (The channel's version changes with the encoding: both ends are one build.)
void encode(const hello_msg& m, std::vector<uint8_t>& out);
void encode(const run_msg& m, std::vector<uint8_t>& out);
void encode(const done_msg& m, std::vector<uint8_t>& out);
std::optional<hello_msg> decode_hello(std::span<const uint8_t> in);
std::optional<run_msg> decode_run(std::span<const uint8_t> in);
std::optional<done_msg> decode_done(std::span<const uint8_t> in);

} // namespace tandem::ipc
