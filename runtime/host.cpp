// The host CPU's context (runtime/host.hpp).
#include "runtime/host.hpp"

#include "cpu/dnnl_matmul.hpp"
#include "cpu/isa.hpp"
#include "cpu/peak.hpp"
#include "cpu/thread_pool.hpp"

namespace tandem {

void prepare_inference_process() { cpu::ensure_passive_openmp(); }

host_threads::host_threads(int n_threads) : pool_(std::make_unique<cpu::thread_pool>(n_threads)) {}
host_threads::~host_threads() = default;
exec_ctx host_threads::ctx() const { return exec_ctx{backend::cpu, pool_.get()}; }
int host_threads::size() const { return pool_->n_threads(); }


host_threads::int8_peak host_threads::measure_int8_peak(double seconds) const {
    const cpu::isa level = cpu::active_isa();
    int8_peak r{std::string(cpu::name_of(level)), 0};
    if (level != cpu::isa::scalar) r.tops = cpu::measure_int8_peak(*pool_, level, seconds).tops();
    return r;
}

double host_threads::read_bandwidth_gbs(std::span<const std::span<const uint8_t>> ranges) const {
    return cpu::measure_read_bandwidth_gbs(*pool_, ranges);
}

double host_matmul_gops(int n_threads, int64_t m, int64_t k, int64_t n, int reps) {
    return cpu::dnnl_matmul_gops(n_threads, m, k, n, reps);
}

std::string host_matmul_impl(int64_t m, int64_t k, int64_t n) { return cpu::dnnl_impl_name(m, k, n); }

} // namespace tandem
