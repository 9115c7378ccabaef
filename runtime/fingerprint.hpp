// A model's identity for cached K/V: what must be equal for pages written by one process to
// be read by another, or by the next run of the daemon.
#pragma once

#include "runtime/kv_layout.hpp"
#include "runtime/weights.hpp"

#include <cstdint>

namespace tandem {

namespace gguf { class file; }

// Hashes the file's header, metadata and tensor table, its size, and the first and last
// 4 KiB of every tensor's data (a fine-tune of the same shape differs there), together
// with how the weights are held (INT8 K/V differ from F32 ones) and the KV element type.
// Cheap: it reads a few MB at most, not the weights.
uint64_t model_fingerprint(const gguf::file& f, weight_format weights, kv_dtype kv);

} // namespace tandem
