// The worker-split IPC layer: SPSC rings, control channel, worker processes (the pool: test_kv_pool; wire: test_wire).
#include "ipc/channel.hpp"
#include "ipc/ring.hpp"
#include "ipc/wire.hpp"
#include "ipc/worker_process.hpp"
#include "runtime/error.hpp"

#include "ipc_fixtures.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace tandem;
using namespace std::chrono_literals;
using tandem::test::clock_type;
using tandem::test::exit_code;
using tandem::test::fork_child;
using tandem::test::thrown_by;
using tandem::test::wait_child;

namespace {

// The wait status of a worker once it exits by itself (killed after 60 s).
int wait_exit(ipc::worker_process& w) {
    if (ipc::wait_readable({w.pidfd()}, 60s).empty()) {
        FAIL_CHECK("worker ", w.pid(), " did not exit");
        w.kill_now();
    }
    for (int i = 0; i < 1000; ++i) {
        if (auto st = w.try_reap()) return *st;
        std::this_thread::sleep_for(1ms);
    }
    return w.stop(0ms);
}

// An anonymous shared mapping, 64-byte aligned, inherited across fork.
struct shared_mem {
    void* p = nullptr;
    size_t n = 0;
    explicit shared_mem(size_t bytes) : n(bytes) {
        p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
    }
    ~shared_mem() { ::munmap(p, n); }
};

uint64_t fnv1a(const uint8_t* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

} // namespace

// ---- ring ----------------------------------------------------------------------------------

TEST_CASE("ring: FIFO order with random sizes across many wraps, near-capacity messages included") {
    constexpr uint64_t cap = 4096;
    shared_mem mem(ipc::ring::bytes_for(cap));
    auto r = ipc::ring::init(mem.p, cap);
    std::mt19937_64 rng(12345);
    std::deque<std::pair<uint32_t, std::vector<uint8_t>>> want;
    uint64_t pushed_bytes = 0, n_pushed = 0, n_popped = 0, n_big = 0;
    uint32_t type = 0;
    std::vector<uint8_t> got;
    const auto pop_one = [&] {
        uint32_t t = 0;
        if (!r.pop(t, got)) return false;
        REQUIRE_FALSE(want.empty());
        CHECK(t == want.front().first);
        CHECK(got == want.front().second);
        want.pop_front();
        ++n_popped;
        return true;
    };
    while (pushed_bytes < 200 * cap || n_pushed < 5000) {
        if (rng() % 100 < 55) {
            const uint64_t k = rng() % 100;
            const size_t n = k < 70 ? rng() % 65 : k < 90 ? rng() % 1025 : cap - 8 - rng() % 64;
            std::vector<uint8_t> msg(n);
            for (auto& b : msg) b = uint8_t(rng());
            ++type;
            const bool big = n > cap / 2;
            bool ok = r.push(type, msg);
            if (!ok && (big || want.empty())) {
                // Read until it fits: it must, at the latest once the ring and the wrap pad
                // (which an empty ring may take alone) have been read.
                for (int guard = 0; !ok && guard < 1000; ++guard) {
                    if (!pop_one()) REQUIRE(want.empty());
                    ok = r.push(type, msg);
                }
                REQUIRE(ok);
            }
            if (ok) {
                pushed_bytes += n;
                ++n_pushed;
                n_big += big;
                want.emplace_back(type, std::move(msg));
            }
        } else if (!pop_one()) {
            CHECK(want.empty());
        }
    }
    while (pop_one()) {
    }
    CHECK(want.empty());
    CHECK(r.empty());
    CHECK_FALSE(r.corrupt());
    CHECK(n_popped == n_pushed);
    CHECK(n_big > 100);
    MESSAGE(n_pushed, " messages, ", pushed_bytes / cap, " times the capacity");
}

TEST_CASE("ring: a full ring refuses, then takes more once read; oversized messages never fit") {
    constexpr uint64_t cap = 1024;
    shared_mem mem(ipc::ring::bytes_for(cap));
    auto r = ipc::ring::init(mem.p, cap);
    std::vector<uint8_t> msg(56, 1); // a 64-byte record
    for (int i = 0; i < 16; ++i) {
        msg[0] = uint8_t(i);
        REQUIRE(r.push(7, msg));
    }
    CHECK_FALSE(r.push(7, msg));
    CHECK_FALSE(r.push(7, {})); // not even an empty one
    uint32_t t = 0;
    std::vector<uint8_t> got;
    REQUIRE(r.pop(t, got));
    CHECK(got[0] == 0);
    msg[0] = 16;
    CHECK(r.push(7, msg));
    for (int i = 1; i <= 16; ++i) {
        REQUIRE(r.pop(t, got));
        CHECK(got[0] == i);
    }
    CHECK_FALSE(r.pop(t, got));

    // Too big for the ring at all, even empty; the reserved pad type is refused too.
    CHECK_FALSE(r.push(1, std::vector<uint8_t>(cap - 7)));
    CHECK_FALSE(r.push(1, std::vector<uint8_t>(cap)));
    CHECK_FALSE(r.push(ipc::ring::pad_type, {}));
    CHECK(r.empty());
    // The largest message fills the whole ring; it needs the read position at the start.
    const std::vector<uint8_t> big(cap - 8, 9);
    CHECK_FALSE(r.push(1, big)); // position 64*17 % 1024 != 0: the pad goes in alone
    CHECK_FALSE(r.pop(t, got));  // the consumer passes the pad
    REQUIRE(r.push(1, big));
    CHECK_FALSE(r.push(1, {}));
    REQUIRE(r.pop(t, got));
    CHECK(got == big);
    CHECK(r.empty());
    CHECK_FALSE(r.corrupt());
}

TEST_CASE("ring: at capacity_for(n), a message of n bytes fits an empty ring wherever the last one ended") {
    for (const uint64_t n : {uint64_t(0), uint64_t(1), uint64_t(100), uint64_t(1000), uint64_t(4096), uint64_t(65573)}) {
        INFO("payload ", n);
        const uint64_t cap = ipc::ring::capacity_for(n);
        CHECK((cap & (cap - 1)) == 0);
        CHECK(cap >= ipc::ring::min_capacity);
        shared_mem m(ipc::ring::bytes_for(cap));
        const std::vector<uint8_t> big(n, 0xab);
        const uint64_t rec = 8 + (n + 7) / 8 * 8;
        // Every 8-byte position where the message meets the end (the wrap cases), a
        // sample elsewhere.
        std::set<uint64_t> at;
        for (uint64_t o = 0; o < cap; o += cap <= 16384 ? 8 : 4096) at.insert(o);
        for (uint64_t edge : {cap - rec, cap / 2, cap - 8})
            for (uint64_t d = 0; d <= 128; d += 8)
                for (uint64_t o : {edge - d, edge + d})
                    if (o < cap) at.insert(o);
        std::vector<uint8_t> got;
        uint32_t type = 0;
        for (uint64_t o : at) {
            auto r = ipc::ring::init(m.p, cap);
            auto* h = static_cast<ipc::ring_header*>(m.p);
            h->head.store(o + cap); // an empty ring whose last message ended at o
            h->tail.store(o + cap);
            REQUIRE_MESSAGE(r.push(1, big), "at ", o);
            REQUIRE(r.pop(type, got));
            CHECK(got == big);
            CHECK(r.empty());
        }
    }
    CHECK(thrown_by([] { ipc::ring::capacity_for(ipc::ring::max_capacity); }).find("ring") != std::string::npos);
}

TEST_CASE("ring: a producer in a forked child pushes 100k checksummed messages") {
    constexpr uint64_t cap = 1 << 16;
    constexpr uint64_t n_msgs = 100000;
    shared_mem mem(ipc::ring::bytes_for(cap));
    ipc::ring::init(mem.p, cap);
    const pid_t pid = fork_child([&] {
        auto r = ipc::ring::attach(mem.p, cap);
        std::mt19937 rng(99);
        std::vector<uint8_t> msg;
        for (uint64_t i = 0; i < n_msgs; ++i) {
            const size_t n = rng() % 300;
            msg.resize(8 + n + 8);
            std::memcpy(msg.data(), &i, 8);
            for (size_t k = 0; k < n; ++k) msg[8 + k] = uint8_t(rng());
            const uint64_t sum = fnv1a(msg.data(), 8 + n);
            std::memcpy(msg.data() + 8 + n, &sum, 8);
            const auto give_up = clock_type::now() + 60s;
            while (!r.push(uint32_t(i), msg)) {
                if (r.corrupt() || clock_type::now() > give_up) return 2;
                ::sched_yield();
            }
        }
        return 0;
    });
    auto r = ipc::ring::attach(mem.p, cap);
    uint64_t next = 0, bad = 0;
    uint32_t t = 0;
    std::vector<uint8_t> got;
    const auto give_up = clock_type::now() + 120s;
    while (next < n_msgs && clock_type::now() < give_up && !r.corrupt()) {
        if (!r.pop(t, got)) {
            ::sched_yield();
            continue;
        }
        uint64_t seq = ~0ull, sum = 0;
        if (got.size() >= 16) {
            std::memcpy(&seq, got.data(), 8);
            std::memcpy(&sum, got.data() + got.size() - 8, 8);
        }
        bad += seq != next || t != uint32_t(next) || sum != fnv1a(got.data(), got.size() - 8);
        ++next;
    }
    CHECK(next == n_msgs);
    CHECK(bad == 0);
    CHECK_FALSE(r.corrupt());
    CHECK(r.empty());
    CHECK(exit_code(wait_child(pid)) == 0);
}

TEST_CASE("ring: a corrupt shared header or record is detected, never read out of bounds") {
    constexpr uint64_t cap = 256;
    shared_mem mem(ipc::ring::bytes_for(cap));
    auto* h = static_cast<ipc::ring_header*>(mem.p);
    auto* data = static_cast<uint8_t*>(mem.p) + sizeof(ipc::ring_header);
    uint32_t t = 0;
    std::vector<uint8_t> got;
    const std::vector<uint8_t> msg(16, 3);

    SUBCASE("tail beyond head + capacity") {
        auto r = ipc::ring::init(mem.p, cap);
        h->tail.store(cap + 8);
        CHECK_FALSE(r.pop(t, got));
        CHECK(r.corrupt());
        CHECK_FALSE(r.push(1, msg)); // sticky
    }
    SUBCASE("misaligned tail") {
        auto r = ipc::ring::init(mem.p, cap);
        h->tail.store(12);
        CHECK_FALSE(r.pop(t, got));
        CHECK(r.corrupt());
    }
    SUBCASE("head ahead of tail, seen by the producer") {
        auto r = ipc::ring::init(mem.p, cap);
        h->head.store(64);
        CHECK_FALSE(r.push(1, msg));
        CHECK(r.corrupt());
    }
    SUBCASE("size field past the published tail") {
        auto r = ipc::ring::init(mem.p, cap);
        REQUIRE(r.push(1, msg));
        const uint32_t huge = 200; // fits the area, not the 24 published bytes
        std::memcpy(data, &huge, 4);
        CHECK_FALSE(r.pop(t, got));
        CHECK(r.corrupt());
    }
    SUBCASE("size field past the end of the area") {
        auto r = ipc::ring::init(mem.p, cap);
        REQUIRE(r.push(1, msg));
        const uint32_t huge = 0xfffffff0u;
        std::memcpy(data, &huge, 4);
        CHECK_FALSE(r.pop(t, got));
        CHECK(r.corrupt());
    }
    SUBCASE("a pad record that does not reach the end") {
        auto r = ipc::ring::init(mem.p, cap);
        REQUIRE(r.push(1, msg));
        const uint32_t pad[2] = {8, ipc::ring::pad_type};
        std::memcpy(data, pad, 8);
        CHECK_FALSE(r.pop(t, got));
        CHECK(r.corrupt());
    }
    SUBCASE("capacity changed under a live view") {
        auto r = ipc::ring::init(mem.p, cap);
        REQUIRE(r.push(1, msg));
        h->capacity = cap * 4;
        CHECK_FALSE(r.pop(t, got));
        CHECK(r.corrupt());
    }
    SUBCASE("attach checks the magic and the capacity; init checks the capacity") {
        ipc::ring::init(mem.p, cap);
        CHECK_THROWS_AS(ipc::ring::attach(mem.p, cap / 2), tandem::error);
        h->magic ^= 1;
        CHECK_THROWS_AS(ipc::ring::attach(mem.p, cap), tandem::error);
        CHECK_THROWS_AS(ipc::ring::init(mem.p, 100), tandem::error);
        CHECK_THROWS_AS(ipc::ring::init(mem.p, 32), tandem::error);
    }
}

// ---- channel -------------------------------------------------------------------------------

TEST_CASE("channel: a forked worker attaches by fd numbers, says hello, answers a batch with logits") {
    ipc::channel_config cfg;
    cfg.command_bytes = 1 << 12;
    cfg.result_bytes = 1 << 12;
    cfg.max_rows = 4;
    cfg.n_vocab = 100;
    auto sup = ipc::channel::create(cfg);
    const std::vector<int> fds = sup->child_fds();
    REQUIRE(fds.size() == 3);

    const pid_t pid = fork_child([&] {
        auto w = ipc::channel::attach(fds[0], fds[1], fds[2]);
        if (w->config().n_vocab != 100 || w->config().max_rows != 4) return 2;
        ipc::hello_msg h;
        h.pid = int32_t(::getpid());
        h.n_threads = 2;
        h.fingerprint = 42;
        h.device = "test";
        std::vector<uint8_t> out;
        ipc::encode(h, out);
        if (!w->results().push(uint32_t(ipc::msg_type::hello), out)) return 3;
        w->notify_supervisor();
        uint32_t type = 0;
        std::vector<uint8_t> in;
        for (;;) {
            if (ipc::wait_readable({w->worker_wait_fd()}, 20s).empty()) return 4;
            ipc::channel::consume(w->worker_wait_fd());
            while (w->commands().pop(type, in)) {
                if (type == uint32_t(ipc::msg_type::shutdown)) return 0;
                if (type != uint32_t(ipc::msg_type::run)) return 5;
                auto run = ipc::decode_run(in);
                if (!run) return 6;
                const batch& b = run->b;
                for (int32_t t = 0, r = 0; t < b.n_tokens(); ++t) {
                    if (!b.wants_row[size_t(t)]) continue;
                    float* row = w->logits_row(r++);
                    for (int v = 0; v < 100; ++v) row[v] = float(b.seq_id[size_t(b.seq[size_t(t)])]) + float(v) / 1000.0f;
                }
                ipc::done_msg d;
                d.batch_id = run->batch_id;
                d.compute_s = 0.5;
                out.clear();
                ipc::encode(d, out);
                if (!w->results().push(uint32_t(ipc::msg_type::done), out)) return 7;
                w->notify_supervisor();
            }
            if (w->commands().corrupt()) return 8;
        }
    });

    uint32_t type = 0;
    std::vector<uint8_t> in;
    REQUIRE(ipc::wait_readable({sup->supervisor_wait_fd()}, 20s) == std::vector<size_t>{0});
    ipc::channel::consume(sup->supervisor_wait_fd());
    REQUIRE(sup->results().pop(type, in));
    CHECK(type == uint32_t(ipc::msg_type::hello));
    auto hello = ipc::decode_hello(in);
    REQUIRE(hello);
    CHECK(hello->pid == pid);
    CHECK(hello->device == "test");

    // Rows: tokens 2 and 3 of sequence 100, then sequence 300's token; none of sequence 200.
    ipc::run_msg run;
    run.batch_id = 9;
    const std::vector<token_id> t100{1, 2, 3}, t200{4}, t300{5};
    run.b.add_seq(100, 0, t100, {}, {}, 1);
    run.b.add_seq(200, 0, t200, {}, {}, 1);
    run.b.add_seq(300, 0, t300, {}, {}, 0);
    REQUIRE(run.b.n_logits() == 3);
    std::vector<uint8_t> out;
    ipc::encode(run, out);
    REQUIRE(sup->commands().push(uint32_t(ipc::msg_type::run), out));
    sup->notify_worker();
    // The worker's answer may come with the hello's wakeup already consumed: wait for the ring.
    const auto give_up = clock_type::now() + 20s;
    bool got_done = false;
    while (!got_done && clock_type::now() < give_up) {
        ipc::wait_readable({sup->supervisor_wait_fd()}, 1s);
        ipc::channel::consume(sup->supervisor_wait_fd());
        got_done = sup->results().pop(type, in);
    }
    REQUIRE(got_done);
    CHECK(type == uint32_t(ipc::msg_type::done));
    auto done = ipc::decode_done(in);
    REQUIRE(done);
    CHECK(done->batch_id == 9);
    CHECK(done->ok);
    CHECK(sup->logits_row(0)[0] == 100.0f);
    CHECK(sup->logits_row(0)[99] == doctest::Approx(100.099));
    CHECK(sup->logits_row(1)[5] == doctest::Approx(100.005));
    CHECK(sup->logits_row(2)[7] == doctest::Approx(300.007));
    CHECK(sup->logits_row(3)[0] == 0.0f); // nobody wrote row 3

    REQUIRE(sup->commands().push(uint32_t(ipc::msg_type::shutdown), {}));
    sup->notify_worker();
    CHECK(exit_code(wait_child(pid)) == 0);
}

TEST_CASE("channel: eventfd wakeups and wait_readable timeouts") {
    auto c = ipc::channel::create({});
    const std::vector<int> fds{c->worker_wait_fd(), c->supervisor_wait_fd()};
    auto t0 = clock_type::now();
    CHECK(ipc::wait_readable(fds, 50ms).empty());
    CHECK(clock_type::now() - t0 >= 45ms);
    c->notify_worker();
    CHECK(ipc::wait_readable(fds, 0ms) == std::vector<size_t>{0});
    ipc::channel::consume(c->worker_wait_fd());
    CHECK(ipc::wait_readable(fds, 0ms).empty());
    c->notify_worker();
    c->notify_worker();
    ipc::channel::consume(c->worker_wait_fd()); // one read resets the count
    CHECK(ipc::wait_readable(fds, 0ms).empty());
    ipc::channel::consume(c->worker_wait_fd()); // nothing to read: no block, no throw
    c->notify_supervisor();
    CHECK(ipc::wait_readable(fds, 0ms) == std::vector<size_t>{1});
    CHECK(ipc::wait_readable({-1, c->supervisor_wait_fd()}, 0ms) == std::vector<size_t>{1});
    // A wakeup from another thread ends a long wait early.
    ipc::channel::consume(c->supervisor_wait_fd());
    std::thread waker([&] {
        std::this_thread::sleep_for(20ms);
        c->notify_supervisor();
    });
    t0 = clock_type::now();
    CHECK(ipc::wait_readable(fds, 10s) == std::vector<size_t>{1});
    CHECK(clock_type::now() - t0 < 5s);
    waker.join();
    // A pipe whose writer is gone counts as readable (POLLHUP).
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    ::close(p[1]);
    CHECK(ipc::wait_readable({p[0]}, 0ms) == std::vector<size_t>{0});
    ::close(p[0]);
    t0 = clock_type::now();
    CHECK(ipc::wait_readable({}, 20ms).empty());
    CHECK(clock_type::now() - t0 >= 15ms);
}

TEST_CASE("channel: attach refuses what is not a whole channel; the area cannot be resized") {
    ipc::channel_config cfg;
    cfg.command_bytes = 1 << 12;
    cfg.result_bytes = 1 << 10;
    cfg.max_rows = 3;
    cfg.n_vocab = 33;
    auto c = ipc::channel::create(cfg);
    const std::vector<int> fds = c->child_fds();
    // Layout: logits rows 64-byte aligned and contiguous.
    CHECK(reinterpret_cast<uintptr_t>(c->logits_row(0)) % 64 == 0);
    CHECK(c->logits_row(2) - c->logits_row(0) == 66);
    // Sealed: a worker cannot shrink the area under the supervisor.
    CHECK(::ftruncate(fds[0], 0) != 0);
    CHECK(errno == EPERM);

    struct stat st {};
    REQUIRE(::fstat(fds[0], &st) == 0);
    std::vector<uint8_t> area(size_t(st.st_size));
    REQUIRE(::pread(fds[0], area.data(), area.size(), 0) == ssize_t(area.size()));
    const auto memfd_with = [](const std::vector<uint8_t>& bytes) {
        const int fd = ::memfd_create("tandem-test", MFD_CLOEXEC);
        REQUIRE(fd >= 0);
        REQUIRE(::write(fd, bytes.data(), bytes.size()) == ssize_t(bytes.size()));
        return fd;
    };
    const auto attach_fails = [&](int memfd) {
        const std::string msg = thrown_by([&] { ipc::channel::attach(memfd, fds[1], fds[2]); });
        const bool still_open = ::fcntl(memfd, F_GETFD) >= 0 && ::fcntl(fds[1], F_GETFD) >= 0;
        ::close(memfd);
        CHECK(still_open); // a failed attach leaves the fds to the caller
        return msg;
    };
    {
        // A copy of the whole area attaches.
        auto w = ipc::channel::attach(memfd_with(area), ::dup(fds[1]), ::dup(fds[2]));
        CHECK(w->config().n_vocab == 33);
        CHECK(w->config().command_bytes == 1 << 12);
    }
    CHECK(attach_fails(memfd_with(std::vector<uint8_t>(4096, 0))).find("no channel header") != std::string::npos);
    CHECK(attach_fails(memfd_with(std::vector<uint8_t>(16, 0))).find("not a channel") != std::string::npos);
    auto shorter = area;
    shorter.resize(area.size() - 4096);
    CHECK(attach_fails(memfd_with(shorter)).find("bytes") != std::string::npos);
    auto bad_vocab = area;
    const int32_t big = 1 << 30;
    std::memcpy(bad_vocab.data() + 36, &big, 4); // n_vocab
    CHECK(attach_fails(memfd_with(bad_vocab)).find("bad header") != std::string::npos);
    auto bad_ring = area;
    bad_ring[192 + 128] ^= 1; // the command ring's capacity (header 128 bytes and the heartbeat's 64, then head, tail)
    CHECK(attach_fails(memfd_with(bad_ring)).find("capacity") != std::string::npos);
    CHECK(thrown_by([&] { ipc::channel::attach(-1, fds[1], fds[2]); }).find("not open") != std::string::npos);
    // A bad configuration is refused at create.
    ipc::channel_config bad = cfg;
    bad.command_bytes = 1000;
    CHECK_THROWS_AS(ipc::channel::create(bad), tandem::error);
    bad = cfg;
    bad.n_vocab = 0;
    CHECK_THROWS_AS(ipc::channel::create(bad), tandem::error);

    // Two views of one area (the second from duplicated fds) talk through the rings.
    auto w = ipc::channel::attach(::dup(fds[0]), ::dup(fds[1]), ::dup(fds[2]));
    // the heartbeat: the worker's beats are the supervisor's count
    CHECK(c->beats() == 0);
    w->beat();
    w->beat();
    CHECK(c->beats() == 2);
    const std::vector<uint8_t> msg{1, 2, 3};
    REQUIRE(c->commands().push(5, msg));
    uint32_t type = 0;
    std::vector<uint8_t> got;
    REQUIRE(w->commands().pop(type, got));
    CHECK(type == 5);
    CHECK(got == msg);
    w->logits_row(1)[32] = 1.5f;
    CHECK(c->logits_row(1)[32] == 1.5f);
}

// ---- worker_process ------------------------------------------------------------------------

TEST_CASE("worker_process: the exit status through the pidfd and try_reap") {
    auto w = ipc::worker_process::spawn({"/bin/sh", "-c", "exit 3"}, {});
    CHECK(w->pid() > 0);
    REQUIRE(w->pidfd() >= 0);
    CHECK(ipc::wait_readable({w->pidfd()}, 20s) == std::vector<size_t>{0});
    const auto st = w->try_reap();
    REQUIRE(st);
    CHECK(WIFEXITED(*st));
    CHECK(WEXITSTATUS(*st) == 3);
    CHECK(ipc::worker_process::describe(*st) == "exited with status 3");
    CHECK(w->try_reap() == st); // reaped once, remembered
}

TEST_CASE("worker_process: kill_now, stop, exec failure, describe") {
    SUBCASE("kill_now") {
        auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
        CHECK_FALSE(w->try_reap());
        w->kill_now();
        CHECK(ipc::wait_readable({w->pidfd()}, 20s) == std::vector<size_t>{0});
        const auto st = w->try_reap();
        REQUIRE(st);
        CHECK(ipc::worker_process::describe(*st) == "killed by signal 9 (Killed)");
    }
    SUBCASE("stop: SIGTERM is enough") {
        auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
        const auto t0 = clock_type::now();
        const int st = w->stop(20s);
        CHECK(ipc::worker_process::describe(st) == "killed by signal 15 (Terminated)");
        CHECK(clock_type::now() - t0 < 10s);
    }
    SUBCASE("stop: SIGKILL after the grace period when SIGTERM is ignored") {
        int p[2];
        REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
        const int wfd = ::fcntl(p[1], F_DUPFD_CLOEXEC, 3);
        REQUIRE(wfd < 10); // sh takes one digit
        const std::string script = "trap '' TERM; echo ready >&" + std::to_string(wfd) + "; exec /bin/sleep 30";
        const int keep[] = {wfd};
        auto w = ipc::worker_process::spawn({"/bin/sh", "-c", script}, keep);
        ::close(wfd);
        ::close(p[1]);
        char buf[16] = {};
        REQUIRE(::read(p[0], buf, sizeof buf) > 0); // the trap is set
        ::close(p[0]);
        const auto t0 = clock_type::now();
        const int st = w->stop(300ms);
        const auto took = clock_type::now() - t0;
        CHECK(ipc::worker_process::describe(st) == "killed by signal 9 (Killed)");
        CHECK(took >= 290ms);
        CHECK(took < 10s);
    }
    SUBCASE("exec failure is exit 127") {
        auto w = ipc::worker_process::spawn({"/nonexistent/tandem-worker"}, {});
        CHECK(ipc::worker_process::describe(wait_exit(*w)) == "exited with status 127");
    }
    SUBCASE("a signal right after spawn: the parent's handlers never run in the child") {
        // doctest handles SIGTERM in this process; in a child that has not exec'd yet the
        // signal must still just terminate it.
        for (int i = 0; i < 10; ++i) {
            auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
            const int st = w->stop(20s);
            CHECK(ipc::worker_process::describe(st) == "killed by signal 15 (Terminated)");
        }
        // A handler of ours that would show if it ran in a child: the child usually is not
        // scheduled yet when the signal is sent, so it lands before exec.
        struct sigaction sa {}, old {};
        sa.sa_handler = [](int) { ::_exit(42); };
        REQUIRE(::sigaction(SIGUSR1, &sa, &old) == 0);
        int n_default = 0;
        for (int i = 0; i < 20; ++i) {
            auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
            ::kill(w->pid(), SIGUSR1);
            n_default += ipc::worker_process::describe(wait_exit(*w)) == "killed by signal 10 (User defined signal 1)";
        }
        ::sigaction(SIGUSR1, &old, nullptr);
        CHECK(n_default == 20);
    }
    SUBCASE("describe") {
        CHECK(ipc::worker_process::describe(0) == "exited with status 0");
        CHECK(ipc::worker_process::describe(11 | 0x80) == "killed by signal 11 (Segmentation fault) (core dumped)");
        CHECK(ipc::worker_process::describe(0x137f) == "stopped by signal 19");
        CHECK_THROWS_AS(ipc::worker_process::spawn({}, {}), tandem::error);
    }
    SUBCASE("the destructor kills and reaps") {
        pid_t pid = -1;
        {
            auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
            pid = w->pid();
        }
        CHECK(::kill(pid, 0) != 0); // gone, not a zombie
        CHECK(errno == ESRCH);
    }
}

TEST_CASE("worker_process: kept fds stay open in the child, the others close at exec") {
    int kept[2], other[2];
    REQUIRE(::pipe2(kept, O_CLOEXEC) == 0);
    REQUIRE(::pipe(other) == 0); // not close-on-exec: only the child's close_range closes it
    // sh reads one-digit fd numbers: move both write ends below 10.
    const int k = ::fcntl(kept[1], F_DUPFD_CLOEXEC, 3);
    const int m = ::fcntl(other[1], F_DUPFD, 3);
    ::close(kept[1]);
    ::close(other[1]);
    REQUIRE(k < 10);
    REQUIRE(m < 10);
    REQUIRE((::fcntl(m, F_GETFD) & FD_CLOEXEC) == 0);
    const auto run = [&](std::vector<int> keep) {
        const std::string probe = "if (: >&" + std::to_string(m) + ") 2>/dev/null; then echo open >&" +
                                  std::to_string(k) + "; else echo closed >&" + std::to_string(k) + "; fi";
        auto w = ipc::worker_process::spawn({"/bin/sh", "-c", "echo hi >&" + std::to_string(k) + "; " + probe}, keep);
        CHECK(ipc::worker_process::describe(wait_exit(*w)) == "exited with status 0");
    };
    run({k});
    run({k, m}); // the probe sees an fd that is kept
    ::close(k);
    ::close(m);
    std::string out;
    char buf[256];
    for (ssize_t n; (n = ::read(kept[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
    CHECK(out == "hi\nclosed\nhi\nopen\n");
    ::close(kept[0]);
    ::close(other[0]);
}

TEST_CASE("worker_process: the worker dies with the process that spawned it (PDEATHSIG)") {
    // The grandchild is reparented to us (a subreaper), so we can reap it and see how it died.
    REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    const pid_t mid = fork_child([&] {
        auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
        const int32_t gpid = w->pid();
        // Wait until it runs sleep, past its PDEATHSIG setup, so that our exit below is
        // the parent death it reacts to (not the getppid check).
        const std::string comm = "/proc/" + std::to_string(gpid) + "/comm";
        const auto give_up = clock_type::now() + 20s;
        while (test::read_text(comm) != "sleep\n" && clock_type::now() < give_up) std::this_thread::sleep_for(1ms);
        if (::write(p[1], &gpid, sizeof gpid) != sizeof gpid) return 3;
        (void)w.release(); // exit without the destructor's kill
        return 0;
    });
    ::close(p[1]);
    int32_t gpid = -1;
    REQUIRE(::read(p[0], &gpid, sizeof gpid) == sizeof gpid);
    ::close(p[0]);
    CHECK(exit_code(wait_child(mid)) == 0);
    const auto t0 = clock_type::now();
    int st = 0;
    pid_t r = 0;
    while ((r = ::waitpid(gpid, &st, WNOHANG)) == 0 && clock_type::now() - t0 < 5s) std::this_thread::sleep_for(2ms);
    const auto took = clock_type::now() - t0;
    if (r == 0) { // failed: do not leave it behind
        ::kill(gpid, SIGKILL);
        ::waitpid(gpid, &st, 0);
    }
    REQUIRE(r == gpid);
    CHECK(ipc::worker_process::describe(st) == "killed by signal 9 (Killed)");
    CHECK(took < 1s);

    // The spawner exits at once, often before its child has set PDEATHSIG: then the child
    // sees another parent and exits 1 instead of running on.
    int n_killed = 0, n_exited = 0;
    for (int i = 0; i < 20; ++i) {
        REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
        const pid_t m = fork_child([&] {
            auto w = ipc::worker_process::spawn({"/bin/sleep", "30"}, {});
            const int32_t g = w->pid();
            (void)w.release();
            return ::write(p[1], &g, sizeof g) == sizeof g ? 0 : 3;
        });
        ::close(p[1]);
        int32_t g = -1;
        REQUIRE(::read(p[0], &g, sizeof g) == sizeof g);
        ::close(p[0]);
        CHECK(exit_code(wait_child(m)) == 0);
        const auto t1 = clock_type::now();
        while ((r = ::waitpid(g, &st, WNOHANG)) == 0 && clock_type::now() - t1 < 5s) std::this_thread::sleep_for(2ms);
        if (r == 0) {
            FAIL_CHECK("worker ", g, " outlived its spawner");
            ::kill(g, SIGKILL);
            ::waitpid(g, &st, 0);
            continue;
        }
        const std::string how = ipc::worker_process::describe(st);
        n_killed += how == "killed by signal 9 (Killed)";
        n_exited += how == "exited with status 1";
    }
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
    CHECK(n_killed + n_exited == 20);
    MESSAGE("spawner gone at once: ", n_killed, " killed by PDEATHSIG, ", n_exited, " saw the new parent");
}

TEST_CASE("self_exe: the path of this test binary") {
    const std::string exe = ipc::self_exe();
    CHECK(exe.front() == '/');
    CHECK(exe.substr(exe.rfind('/') + 1) == "test_ipc_shm");
    CHECK(std::filesystem::exists(exe));
}
