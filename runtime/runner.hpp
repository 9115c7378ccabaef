// A model forward on one device, as a worker process runs it: batches in, logits out, K/V
// written into (host) KV pages that other processes read.
#pragma once

#include "runtime/model.hpp"

#include <memory>
#include <span>
#include <string>

namespace tandem {

class runner {
public:
    virtual ~runner() = default;
    // "cpu (avx512_vnni, 2 threads)", "cuda:0 NVIDIA H200", ...
    virtual std::string device() const = 0;
    // model::forward's contract: every new token of every sequence as one batch; the K/V of
    // the new positions written into the pages of `kv` (host memory, possibly a view of the
    // shared pool); logits [b.n_logits(), n_vocab] of the tokens that want them into `logits`
    // (host memory). Throws tandem::error on a device failure.
    virtual void forward(const batch& b, kv_cache& kv, float* logits) = 0;
    // Builds ahead what forwards of up to max_tokens tokens and max_rows rows would build on
    // first use (model::prepare), so a resident process stops growing once it is up.
    virtual void prepare(int32_t /*max_tokens*/, int32_t /*max_rows*/) {}
};

// The CPU forward (model::forward on its own thread pool).
std::unique_ptr<runner> make_cpu_runner(model& mdl, int n_threads);
// model::forward on an execution context the caller owns (and keeps alive): any backend
// with host memory (the reference, or the CPU on the caller's thread pool).
std::unique_ptr<runner> make_runner(model& mdl, const exec_ctx& ctx);

} // namespace tandem
