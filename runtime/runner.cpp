// The CPU runners: model::forward on a thread pool of their own or the caller's context. Each
// runner has its own scratch arena, so runners of one model (two engines, or a reference
// beside an engine in a test) may run at once: the weights are only read.
#include "runtime/runner.hpp"

#include "cpu/isa.hpp"
#include "cpu/thread_pool.hpp"

#include <fmt/format.h>

namespace tandem {
namespace {

class cpu_runner final : public runner {
public:
    cpu_runner(model& mdl, int n_threads) : mdl_(mdl), pool_(std::max(1, n_threads)) {}
    std::string device() const override {
        return fmt::format("cpu ({}, {} threads)", cpu::name_of(cpu::active_isa()), pool_.n_threads());
    }
    void forward(const batch& b, kv_cache& kv, float* logits) override {
        exec_ctx ctx{backend::cpu, &pool_};
        ctx.scratch = &scratch_;
        mdl_.forward(ctx, b, kv, logits);
    }
    void prepare(int32_t max_tokens, int32_t max_rows) override {
        exec_ctx ctx{backend::cpu, &pool_};
        ctx.scratch = &scratch_;
        mdl_.prepare(ctx, max_tokens, max_rows);
    }

private:
    model& mdl_;
    cpu::thread_pool pool_;
    scratch_arena scratch_ = scratch_arena::host();
};

// model::forward on the caller's context.
class ctx_runner final : public runner {
public:
    ctx_runner(model& mdl, const exec_ctx& ctx) : mdl_(mdl), ctx_(ctx) {
        if (ctx_.scratch == nullptr) ctx_.scratch = &scratch_;
    }
    std::string device() const override { return std::string(name_of(ctx_.be)); }
    void forward(const batch& b, kv_cache& kv, float* logits) override { mdl_.forward(ctx_, b, kv, logits); }
    void prepare(int32_t max_tokens, int32_t max_rows) override { mdl_.prepare(ctx_, max_tokens, max_rows); }

private:
    model& mdl_;
    exec_ctx ctx_;
    scratch_arena scratch_ = scratch_arena::host(); // unless the context brings one
};

} // namespace

std::unique_ptr<runner> make_runner(model& mdl, const exec_ctx& ctx) {
    TANDEM_CHECK(ctx.be != backend::cuda, "a CUDA forward runs through make_cuda_runner");
    return std::make_unique<ctx_runner>(mdl, ctx);
}

std::unique_ptr<runner> make_cpu_runner(model& mdl, int n_threads) {
    return std::make_unique<cpu_runner>(mdl, n_threads);
}

} // namespace tandem
