// The CPU runner: model::forward on a thread pool of its own.
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
    void forward(std::span<const batch_seq> batch, kv_cache& kv, float* logits) override {
        mdl_.forward(exec_ctx{backend::cpu, &pool_}, batch, kv, logits);
    }

private:
    model& mdl_;
    cpu::thread_pool pool_;
};

} // namespace

std::unique_ptr<runner> make_cpu_runner(model& mdl, int n_threads) {
    return std::make_unique<cpu_runner>(mdl, n_threads);
}

} // namespace tandem
