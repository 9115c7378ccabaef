// The worker's command line.
#include "daemon/worker_spec.hpp"

#include "ipc/worker_process.hpp"

#include <fmt/format.h>

#include <unistd.h>

namespace tandem::daemon {

std::vector<std::string> worker_args(const worker_spec& s, const std::vector<int>& fds) {
    return {s.exe.empty() ? ipc::self_exe() : s.exe,
            "--worker", s.role,
            "--fds", fmt::format("{},{},{}", fds.at(0), fds.at(1), fds.at(2)),
            "--parent", std::to_string(::getpid()),
            "--device", s.device,
            "--threads", std::to_string(s.n_threads),
            "--model", s.model,
            "--pool", s.pool,
            "--weights", s.weights == weight_format::int8 ? "int8" : "f32",
            "--kv", std::string(name_of(s.kv)),
            "--page-size", std::to_string(s.page_size),
            "--n-pages", std::to_string(s.n_pages),
            "--fingerprint", fmt::format("{:016x}", s.fingerprint),
            "--max-rows", std::to_string(s.max_rows),
            "--log", s.log_level};
}

} // namespace tandem::daemon
