// The host CPU's context (runtime/host.hpp).
#include "runtime/host.hpp"

#include "cpu/dnnl_matmul.hpp"
#include "cpu/thread_pool.hpp"

namespace tandem {

void prepare_inference_process() { cpu::ensure_passive_openmp(); }

host_threads::host_threads(int n_threads) : pool_(std::make_unique<cpu::thread_pool>(n_threads)) {}
host_threads::~host_threads() = default;
exec_ctx host_threads::ctx() const { return exec_ctx{backend::cpu, pool_.get()}; }
int host_threads::size() const { return pool_->n_threads(); }

} // namespace tandem
