// The supervisor-worker control channel: a sealed memfd (header, two rings, logits) and eventfds.
#include "ipc/channel.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <type_traits>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tandem::ipc {

namespace {

constexpr uint64_t channel_magic = 0x4c544354444e4154ull; // "TANDCTL" + 'L'
constexpr uint32_t channel_version = 5; // 2: run_msg carries page generations; 3: done_msg, device K/V bytes; 4: run_msg is a batch (per-token logits flags); 5: the worker's heartbeat
constexpr int32_t max_rows_cap = 1 << 16;
constexpr int32_t n_vocab_cap = 1 << 24;
constexpr uint64_t logits_bytes_cap = uint64_t(1) << 34;

struct channel_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint64_t command_bytes, result_bytes;
    int32_t max_rows, n_vocab;
    uint64_t heartbeat_offset, commands_offset, results_offset, logits_offset, total_bytes;
};
static_assert(std::is_trivially_copyable_v<channel_header>);
static_assert(std::has_unique_object_representations_v<channel_header>, "compared with memcmp");

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

bool valid_ring(uint64_t c) { return c >= ring::min_capacity && c <= ring::max_capacity && (c & (c - 1)) == 0; }

// Why cfg cannot describe a channel, "" when it can.
std::string bad_config(const channel_config& cfg) {
    if (!valid_ring(cfg.command_bytes) || !valid_ring(cfg.result_bytes))
        return fmt::format("ring sizes {} and {} must be powers of two in [{}, {}]", cfg.command_bytes,
                           cfg.result_bytes, ring::min_capacity, ring::max_capacity);
    if (cfg.max_rows < 1 || cfg.max_rows > max_rows_cap || cfg.n_vocab < 1 || cfg.n_vocab > n_vocab_cap ||
        uint64_t(cfg.max_rows) * uint64_t(cfg.n_vocab) * sizeof(float) > logits_bytes_cap)
        return fmt::format("bad logits area ({} rows of {} floats)", cfg.max_rows, cfg.n_vocab);
    return "";
}

// The header (layout) of a channel for a valid cfg.
channel_header layout_of(const channel_config& cfg) {
    channel_header h{};
    h.magic = channel_magic;
    h.version = channel_version;
    h.heartbeat_offset = round_up(sizeof(channel_header), 64); // a cache line of its own
    h.header_bytes = uint32_t(h.heartbeat_offset + 64);
    h.command_bytes = cfg.command_bytes;
    h.result_bytes = cfg.result_bytes;
    h.max_rows = cfg.max_rows;
    h.n_vocab = cfg.n_vocab;
    h.commands_offset = h.header_bytes;
    h.results_offset = round_up(h.commands_offset + ring::bytes_for(cfg.command_bytes), 64);
    h.logits_offset = round_up(h.results_offset + ring::bytes_for(cfg.result_bytes), 64);
    const uint64_t end = h.logits_offset + uint64_t(cfg.max_rows) * uint64_t(cfg.n_vocab) * sizeof(float);
    h.total_bytes = round_up(end, uint64_t(::sysconf(_SC_PAGESIZE)));
    return h;
}

std::string errno_text(int e) { return std::strerror(e); }

} // namespace

std::unique_ptr<channel> channel::create(const channel_config& cfg) {
    const std::string bad = bad_config(cfg);
    TANDEM_CHECK(bad.empty(), "channel: {}", bad);
    const channel_header h = layout_of(cfg);

    std::unique_ptr<channel> c(new channel());
    c->cfg_ = cfg;
    // Sealed at its size: a broken worker cannot shrink the area under the supervisor (SIGBUS).
    c->memfd_ = ::memfd_create("tandem-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (c->memfd_ < 0) fail("channel: memfd_create: {}", errno_text(errno));
    if (::ftruncate(c->memfd_, off_t(h.total_bytes)) != 0)
        fail("channel: cannot size the memfd to {} bytes: {}", h.total_bytes, errno_text(errno));
    if (::fcntl(c->memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        fail("channel: cannot seal the memfd: {}", errno_text(errno));
    void* base = ::mmap(nullptr, h.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd_, 0);
    if (base == MAP_FAILED) fail("channel: cannot map {} bytes: {}", h.total_bytes, errno_text(errno));
    c->base_ = base;
    c->bytes_ = h.total_bytes;
    auto* b = static_cast<uint8_t*>(base);
    c->commands_ = ring::init(b + h.commands_offset, h.command_bytes);
    c->results_ = ring::init(b + h.results_offset, h.result_bytes);
    c->logits_ = reinterpret_cast<float*>(b + h.logits_offset);
    c->heartbeat_ = reinterpret_cast<uint64_t*>(b + h.heartbeat_offset);
    std::memcpy(b, &h, sizeof h); // a fresh memfd reads as zeros, the rest needs no writing

    c->to_worker_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->to_worker_ < 0) fail("channel: eventfd: {}", errno_text(errno));
    c->to_supervisor_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->to_supervisor_ < 0) fail("channel: eventfd: {}", errno_text(errno));
    return c;
}

std::unique_ptr<channel> channel::attach(int memfd, int to_worker_efd, int to_supervisor_efd) {
    for (int fd : {memfd, to_worker_efd, to_supervisor_efd})
        if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) fail("channel: fd {} is not open", fd);
    struct stat st {};
    if (::fstat(memfd, &st) != 0) fail("channel: fstat of fd {}: {}", memfd, errno_text(errno));
    TANDEM_CHECK(uint64_t(st.st_size) >= sizeof(channel_header), "channel: fd {} holds {} bytes, not a channel",
                 memfd, st.st_size);

    std::unique_ptr<channel> c(new channel());
    void* base = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (base == MAP_FAILED) fail("channel: cannot map fd {}: {}", memfd, errno_text(errno));
    c->base_ = base;
    c->bytes_ = uint64_t(st.st_size);
    auto* b = static_cast<uint8_t*>(base);
    channel_header got;
    std::memcpy(&got, b, sizeof got);
    TANDEM_CHECK(got.magic == channel_magic, "channel: fd {} has no channel header", memfd);
    TANDEM_CHECK(got.version == channel_version, "channel: version {}, this build speaks {}", got.version,
                 channel_version);
    channel_config cfg;
    cfg.command_bytes = got.command_bytes;
    cfg.result_bytes = got.result_bytes;
    cfg.max_rows = got.max_rows;
    cfg.n_vocab = got.n_vocab;
    const std::string bad = bad_config(cfg);
    TANDEM_CHECK(bad.empty(), "channel: bad header: {}", bad);
    const channel_header want = layout_of(cfg);
    TANDEM_CHECK(std::memcmp(&got, &want, sizeof got) == 0, "channel: header offsets do not match the sizes");
    TANDEM_CHECK(want.total_bytes == uint64_t(st.st_size), "channel: the area holds {} bytes, its header says {}",
                 st.st_size, want.total_bytes);
    c->cfg_ = cfg;
    c->commands_ = ring::attach(b + want.commands_offset, want.command_bytes);
    c->results_ = ring::attach(b + want.results_offset, want.result_bytes);
    c->logits_ = reinterpret_cast<float*>(b + want.logits_offset);
    c->heartbeat_ = reinterpret_cast<uint64_t*>(b + want.heartbeat_offset);
    // Owned from here on (the destructor closes them); on a throw above they stay the caller's.
    c->memfd_ = memfd;
    c->to_worker_ = to_worker_efd;
    c->to_supervisor_ = to_supervisor_efd;
    return c;
}

channel::~channel() {
    if (base_) ::munmap(base_, bytes_);
    for (int fd : {memfd_, to_worker_, to_supervisor_})
        if (fd >= 0) ::close(fd);
}

float* channel::logits_row(int32_t row) {
    TANDEM_ASSERT(row >= 0 && row < cfg_.max_rows, "logits row {} of {}", row, cfg_.max_rows);
    return logits_ + int64_t(row) * cfg_.n_vocab;
}

namespace {

void signal_efd(int fd) {
    const uint64_t one = 1;
    for (;;) {
        if (::write(fd, &one, sizeof one) == ssize_t(sizeof one)) return;
        if (errno == EINTR) continue;
        return; // EAGAIN: the counter is saturated, so the reader is woken anyway
    }
}

} // namespace

void channel::beat() { std::atomic_ref<uint64_t>(*heartbeat_).fetch_add(1, std::memory_order_relaxed); }

uint64_t channel::beats() const { return std::atomic_ref<uint64_t>(*heartbeat_).load(std::memory_order_relaxed); }

void channel::notify_worker() { signal_efd(to_worker_); }

void channel::notify_supervisor() { signal_efd(to_supervisor_); }

void channel::consume(int eventfd) {
    uint64_t n = 0;
    while (::read(eventfd, &n, sizeof n) < 0 && errno == EINTR) {
    }
}

std::vector<size_t> wait_readable(const std::vector<int>& fds, std::chrono::milliseconds timeout) {
    std::vector<pollfd> p(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) p[i] = pollfd{fds[i], POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        const int ms = int(std::clamp<int64_t>(left.count(), 0, 1 << 30));
        const int n = ::poll(p.data(), nfds_t(p.size()), ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("poll: {}", errno_text(errno));
        std::vector<size_t> ready;
        for (size_t i = 0; i < p.size(); ++i)
            if (p[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) ready.push_back(i);
        return ready;
    }
}

} // namespace tandem::ipc
