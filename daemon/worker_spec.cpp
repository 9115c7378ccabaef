// The worker's command line.
#include "daemon/worker_spec.hpp"

#include "ipc/ring.hpp"
#include "ipc/wire.hpp"
#include "ipc/worker_process.hpp"

#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace tandem::daemon {

uint64_t command_ring_bytes(const engine_options& eo, int32_t max_n) {
    const int64_t decode_tokens = 1 + std::max(0, eo.max_draft_tokens);
    // every decoding sequence asks for a row, every prefill chunk takes a token of the budget
    const int64_t n_seqs = std::min<int64_t>(int64_t(eo.sched.max_logits) + eo.sched.step_tokens,
                                             int64_t(eo.sched.max_running) * std::max(1, max_n));
    const int64_t n_tokens = eo.sched.step_tokens + n_seqs * decode_tokens;
    const int64_t pages_per_seq =
        std::min<int64_t>(eo.sched.n_pages, (int64_t(eo.n_ctx) + decode_tokens + eo.sched.page_size - 1) / eo.sched.page_size);
    return ipc::ring::capacity_for(ipc::run_bytes(n_seqs, n_tokens, n_seqs * pages_per_seq));
}

file_stamp file_stamp::of(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return {};
    return {int64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::string files_changed(const worker_spec& s) {
    if (s.model_fd >= 0) {
        if (const file_stamp now = file_stamp::of(s.model_fd); now != s.model_stat)
            return fmt::format("the model file {} changed on disk while tandemd served it ({} bytes then, {} now; "
                               "rewritten in place, not replaced): restart tandemd to load it",
                               s.model, s.model_stat.size, now.size);
    }
    if (s.pool_fd >= 0) {
        if (const file_stamp now = file_stamp::of(s.pool_fd); now.size < s.pool_bytes)
            return fmt::format("the KV pool file {} was truncated by another process ({} of its {} bytes left): "
                               "restart tandemd to rebuild it",
                               s.pool, now.size, s.pool_bytes);
    }
    return "";
}

std::vector<std::string> worker_args(const worker_spec& s, const std::vector<int>& fds) {
    std::vector<std::string> args = {s.exe.empty() ? ipc::self_exe() : s.exe,
                                     "--worker", s.role,
                                     "--fds", fmt::format("{},{},{}", fds.at(0), fds.at(1), fds.at(2)),
                                     "--parent", std::to_string(::getpid()),
                                     "--device", s.device,
                                     "--threads", std::to_string(s.n_threads),
                                     "--model", s.model,
                                     "--pool", s.pool,
                                     "--weights", name_of(s.weights),
                                     "--kv", std::string(name_of(s.kv)),
                                     "--page-size", std::to_string(s.page_size),
                                     "--n-pages", std::to_string(s.n_pages),
                                     "--fingerprint", fmt::format("{:016x}", s.fingerprint),
                                     "--max-rows", std::to_string(s.max_rows),
                                     "--max-tokens", std::to_string(s.max_tokens),
                                     "--log", s.log_level};
    if (s.model_fd >= 0) args.insert(args.end(), {"--model-fd", std::to_string(s.model_fd)});
    if (s.pool_fd >= 0) args.insert(args.end(), {"--pool-fd", std::to_string(s.pool_fd)});
    return args;
}

} // namespace tandem::daemon
