// Messages between the supervisor and its workers (payloads of the channel's rings).
#pragma once

#include "runtime/batch.hpp"

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

// A batch to run (runtime/batch.hpp): per sequence its id, n_past, new tokens with their
// wants-logits flags, block table and page generations (a worker that keeps device copies of
// pages knows by them what it still holds: runtime/page_mirror.hpp). Logits rows go to the
// channel's logits area in the batch's row order.
struct run_msg {
    uint64_t batch_id = 0;
    batch b;
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
// trailing bytes, negative or oversized counts, negative n_past, page numbers below no_page,
// flags not one per token, generations not one per page, a bool not 0/1) and never read past
// `in`. (The channel's version changes with the encoding: both ends are one build.)
void encode(const hello_msg& m, std::vector<uint8_t>& out);
void encode(const run_msg& m, std::vector<uint8_t>& out);
// encode(run_msg{id, b}) without copying the batch.
void encode_run(uint64_t batch_id, const batch& b, std::vector<uint8_t>& out);
void encode(const done_msg& m, std::vector<uint8_t>& out);
std::optional<hello_msg> decode_hello(std::span<const uint8_t> in);

// The largest encodings, which size the channel's rings: a run_msg of n_seqs sequences with
// n_tokens tokens and n_blocks block-table entries in all (exact), and the largest hello and
// done (their strings at wire_max_string).
uint64_t run_bytes(int64_t n_seqs, int64_t n_tokens, int64_t n_blocks);
uint64_t result_bytes_max();

std::optional<run_msg> decode_run(std::span<const uint8_t> in);
std::optional<done_msg> decode_done(std::span<const uint8_t> in);

} // namespace tandem::ipc
