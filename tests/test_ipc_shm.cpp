// The worker-split IPC layer: shared KV pool, SPSC rings, control channel, worker processes (the wire messages: test_wire.cpp).
#include "ipc/channel.hpp"
#include "ipc/kv_pool.hpp"
#include "ipc/ring.hpp"
#include "ipc/wire.hpp"
#include "ipc/worker_process.hpp"
#include "runtime/error.hpp"

#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
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
using clock_type = std::chrono::steady_clock;

namespace {

// ---- helpers -------------------------------------------------------------------------------

// A unique pool file name under /dev/shm (tmpfs, like the daemon's), removed at scope end.
struct temp_pool {
    std::string path;
    temp_pool() {
        static int n = 0;
        const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        path = dir + "/tandem-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".kv";
        ::unlink(path.c_str());
    }
    ~temp_pool() { ::unlink(path.c_str()); }
};

// Runs `body` in a forked child (no exec) whose exit code is what body returns; exceptions
// and doctest stay out of the child.
pid_t fork_child(const std::function<int()>& body) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int rc = 99;
        try {
            rc = body();
        } catch (...) {
            rc = 98;
        }
        ::_exit(rc);
    }
    return pid;
}

// The wait status of `pid`, killing it if it runs past `limit`.
int wait_child(pid_t pid, std::chrono::milliseconds limit = 60s) {
    const auto end = clock_type::now() + limit;
    int st = 0;
    for (;;) {
        const pid_t r = ::waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        if (r < 0 && errno != EINTR) return -1;
        if (clock_type::now() > end) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &st, 0);
            FAIL_CHECK("child ", pid, " ran past its time limit");
            return st;
        }
        std::this_thread::sleep_for(2ms);
    }
}

int exit_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0); }

void truncate_file(const std::string& path, off_t size) { REQUIRE(::truncate(path.c_str(), size) == 0); }

void write_at(const std::string& path, off_t off, const void* p, size_t n) {
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, p, n, off) == ssize_t(n));
    ::close(fd);
}

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

off_t file_size(const std::string& path) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_size;
}

ipc::kv_pool_info small_info() {
    ipc::kv_pool_info i;
    i.fingerprint = 0x1234abcd5678ef01ull;
    i.layout.n_layer = 2;
    i.layout.n_head_kv = 2;
    i.layout.head_dim = 8;
    i.layout.page_size = 16;
    i.layout.dtype = kv_dtype::f32;
    i.n_pages = 8;
    return i;
}

uint8_t pattern(int page, int64_t i) { return uint8_t(page * 31 + i * 7 + 1); }

std::vector<int32_t> page_tokens(int page, int page_size) {
    std::vector<int32_t> t(static_cast<size_t>(page_size));
    for (int k = 0; k < page_size; ++k) t[size_t(k)] = page * 100 + k;
    return t;
}

// Fills every page with its pattern and publishes every entry.
void fill_pool(ipc::kv_pool& pool) {
    const int64_t pb = pool.info().layout.page_bytes();
    for (int p = 0; p < pool.info().n_pages; ++p) {
        uint8_t* page = pool.pages() + p * pb;
        for (int64_t i = 0; i < pb; ++i) page[i] = pattern(p, i);
        pool.publish_entry(p, 1000 + uint64_t(p), 2000 + uint64_t(p), page_tokens(p, pool.info().layout.page_size),
                           uint64_t(p) * 3);
    }
}

bool pages_match_pattern(ipc::kv_pool& pool, int page) {
    const int64_t pb = pool.info().layout.page_bytes();
    const uint8_t* p = pool.pages() + page * pb;
    for (int64_t i = 0; i < pb; ++i)
        if (p[i] != pattern(page, i)) return false;
    return true;
}

// Every page byte zero and every entry empty.
bool pool_is_empty(ipc::kv_pool& pool) {
    const int64_t n = int64_t(pool.info().n_pages) * pool.info().layout.page_bytes();
    const uint8_t* p = pool.pages();
    if (std::any_of(p, p + n, [](uint8_t b) { return b != 0; })) return false;
    for (int i = 0; i < pool.info().n_pages; ++i) {
        const ipc::page_entry& e = pool.entry(i);
        if (e.state.load() != 0 || e.n_tokens != 0 || e.hash != 0 || e.parent != 0 || e.last_use != 0) return false;
        for (int32_t t : pool.entry_tokens(i))
            if (t != 0) return false;
    }
    return true;
}

std::string thrown_by(const std::function<void()>& f) {
    try {
        f();
    } catch (const tandem::error& e) {
        return e.what();
    }
    return "(nothing thrown)";
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

// ---- kv_pool -------------------------------------------------------------------------------

TEST_CASE("kv_pool: a fresh segment is laid out and zeroed; adopting it keeps pages and entries") {
    temp_pool tp;
    const auto info = small_info();
    const int64_t pb = info.layout.page_bytes();
    REQUIRE(pb % 64 == 0);
    std::string why = "unset";
    {
        auto pool = ipc::kv_pool::create_or_adopt(tp.path, info, &why);
        CHECK(why == "no segment");
        // Header 4 KiB + a page table well under 2 MiB: the pages start at 2 MiB.
        CHECK(pool->bytes() == (int64_t(2) << 20) + info.n_pages * pb);
        CHECK(file_size(tp.path) == pool->bytes());
        CHECK(reinterpret_cast<uintptr_t>(pool->pages()) % 64 == 0);
        CHECK(ipc::kv_pool::page_entry_bytes(16) == 32 + 64);
        CHECK(pool_is_empty(*pool));
        fill_pool(*pool);
        pool->clear_entry(5);
    }
    auto pool = ipc::kv_pool::create_or_adopt(tp.path, info, &why);
    CHECK(why == "");
    for (int p = 0; p < info.n_pages; ++p) {
        INFO("page ", p);
        CHECK(pages_match_pattern(*pool, p));
        const ipc::page_entry& e = pool->entry(p);
        if (p == 5) {
            CHECK(e.state.load() == 0);
            continue;
        }
        CHECK(e.state.load() == 1);
        CHECK(e.n_tokens == info.layout.page_size);
        CHECK(e.hash == 1000 + uint64_t(p));
        CHECK(e.parent == 2000 + uint64_t(p));
        CHECK(e.last_use == uint64_t(p) * 3);
        const auto toks = pool->entry_tokens(p);
        CHECK(std::vector<int32_t>(toks.begin(), toks.end()) == page_tokens(p, info.layout.page_size));
    }
}

TEST_CASE("kv_pool: each mismatch rebuilds with its reason, zeroed pages and an empty page table") {
    struct mismatch_case {
        const char* name;
        std::function<void(ipc::kv_pool_info&)> change_want;
        std::function<void(const std::string& path, int64_t bytes)> change_file;
        const char* why;
    };
    const auto none_want = [](ipc::kv_pool_info&) {};
    const auto none_file = [](const std::string&, int64_t) {};
    const std::vector<mismatch_case> cases = {
        {"fingerprint", [](auto& w) { w.fingerprint ^= 1; }, none_file, "fingerprint differs"},
        {"n_layer", [](auto& w) { w.layout.n_layer += 1; }, none_file, "layout differs"},
        {"n_head_kv", [](auto& w) { w.layout.n_head_kv += 1; }, none_file, "layout differs"},
        {"head_dim", [](auto& w) { w.layout.head_dim *= 2; }, none_file, "layout differs"},
        {"page_size", [](auto& w) { w.layout.page_size *= 2; }, none_file, "layout differs"},
        {"dtype", [](auto& w) { w.layout.dtype = kv_dtype::i8; }, none_file, "layout differs"},
        {"n_pages", [](auto& w) { w.n_pages += 1; }, none_file, "page count differs"},
        {"truncated", none_want,
         [](const std::string& p, int64_t bytes) { truncate_file(p, off_t(bytes - 4096)); }, "size differs"},
        {"grown", none_want, [](const std::string& p, int64_t bytes) { truncate_file(p, off_t(bytes + 4096)); },
         "size differs"},
        {"empty file", none_want, [](const std::string& p, int64_t) { truncate_file(p, 0); }, "no segment"},
        {"short file", none_want, [](const std::string& p, int64_t) { truncate_file(p, 100); }, "bad header"},
        {"garbage header", none_want,
         [](const std::string& p, int64_t) {
             std::vector<uint8_t> junk(512);
             std::mt19937 rng(7);
             for (auto& b : junk) b = uint8_t(rng());
             write_at(p, 0, junk.data(), junk.size());
         },
         "bad header"},
        {"bad checksum", none_want,
         [](const std::string& p, int64_t) {
             const uint8_t b = 0x5a;
             write_at(p, 20, &b, 1); // inside the fingerprint, under the checksum
         },
         "bad checksum"},
        {"version", none_want,
         [](const std::string& p, int64_t) {
             const uint32_t v = 99;
             write_at(p, 8, &v, sizeof v);
         },
         "version differs"},
    };
    for (const auto& c : cases) {
        INFO("case: ", c.name);
        temp_pool tp;
        const auto info = small_info();
        int64_t bytes = 0;
        {
            auto pool = ipc::kv_pool::create_or_adopt(tp.path, info);
            fill_pool(*pool);
            bytes = pool->bytes();
        }
        auto want = info;
        c.change_want(want);
        c.change_file(tp.path, bytes);
        std::string why;
        {
            auto pool = ipc::kv_pool::create_or_adopt(tp.path, want, &why);
            CHECK(why == c.why);
            CHECK(file_size(tp.path) == pool->bytes());
            CHECK(pool_is_empty(*pool));
        }
        // The rebuilt segment is whole: the next start adopts it.
        auto again = ipc::kv_pool::create_or_adopt(tp.path, want, &why);
        CHECK(why == "");
    }
}

TEST_CASE("kv_pool: attach maps a matching segment (no lock) and throws on a mismatch") {
    temp_pool tp;
    const auto info = small_info();
    auto owner = ipc::kv_pool::create_or_adopt(tp.path, info);
    owner->pages()[0] = 42;
    auto worker = ipc::kv_pool::attach(tp.path, info);
    CHECK(worker->bytes() == owner->bytes());
    CHECK(worker->pages()[0] == 42);
    worker->pages()[1] = 43; // another mapping of the same pages
    CHECK(owner->pages()[1] == 43);
    owner->publish_entry(2, 9, 8, page_tokens(2, 16), 7);
    CHECK(worker->entry(2).state.load() == 1);
    CHECK(worker->entry(2).hash == 9);

    auto other = info;
    other.fingerprint ^= 0x10;
    std::string msg = thrown_by([&] { ipc::kv_pool::attach(tp.path, other); });
    CHECK(msg.find(tp.path) != std::string::npos);
    CHECK(msg.find("fingerprint differs") != std::string::npos);
    other = info;
    other.layout.page_size = 32;
    CHECK(thrown_by([&] { ipc::kv_pool::attach(tp.path, other); }).find("layout differs") != std::string::npos);
    other = info;
    other.n_pages = 9;
    CHECK(thrown_by([&] { ipc::kv_pool::attach(tp.path, other); }).find("page count differs") != std::string::npos);
    msg = thrown_by([&] { ipc::kv_pool::attach(tp.path + ".missing", info); });
    CHECK(msg.find(tp.path + ".missing") != std::string::npos);
    CHECK(msg.find("No such file or directory") != std::string::npos);
}

TEST_CASE("kv_pool: one owner at a time (flock); the next owner adopts once the first is gone") {
    temp_pool tp;
    const auto info = small_info();
    auto first = ipc::kv_pool::create_or_adopt(tp.path, info);
    first->pages()[7] = 77;
    const std::string msg = thrown_by([&] { ipc::kv_pool::create_or_adopt(tp.path, info); });
    CHECK(msg.find(tp.path) != std::string::npos);
    CHECK(msg.find("in use") != std::string::npos);
    CHECK(first->pages()[7] == 77); // the failed owner did not rebuild anything
    first.reset();
    std::string why = "unset";
    auto second = ipc::kv_pool::create_or_adopt(tp.path, info, &why);
    CHECK(why == "");
    CHECK(second->pages()[7] == 77);
}

TEST_CASE("kv_pool: open errors name the path and the errno text; a bad layout is refused") {
    const auto info = small_info();
    const std::string missing = "/nonexistent-tandem-dir/kv.pool";
    std::string msg = thrown_by([&] { ipc::kv_pool::create_or_adopt(missing, info); });
    CHECK(msg.find(missing) != std::string::npos);
    CHECK(msg.find("No such file or directory") != std::string::npos);
    test::scratch_dir dir("ipc-shm-dir");
    msg = thrown_by([&] { ipc::kv_pool::create_or_adopt(dir.path.string(), info); });
    CHECK(msg.find(dir.path.string()) != std::string::npos);
    CHECK(msg.find("Is a directory") != std::string::npos);
    temp_pool tp;
    auto bad = info;
    bad.n_pages = 0;
    CHECK(thrown_by([&] { ipc::kv_pool::create_or_adopt(tp.path, bad); }).find("bad layout") != std::string::npos);
}

TEST_CASE("kv_pool: publish and clear page entries") {
    temp_pool tp;
    auto pool = ipc::kv_pool::create_or_adopt(tp.path, small_info());
    const auto toks = page_tokens(3, 16);
    pool->publish_entry(3, 0xaaaa, 0xbbbb, toks, 17);
    const ipc::page_entry& e = pool->entry(3);
    CHECK(e.state.load() == 1);
    CHECK(e.n_tokens == 16);
    CHECK(e.hash == 0xaaaa);
    CHECK(e.parent == 0xbbbb);
    CHECK(e.last_use == 17);
    auto got = pool->entry_tokens(3);
    CHECK(std::vector<int32_t>(got.begin(), got.end()) == toks);
    CHECK(pool->entry(2).state.load() == 0); // neighbours untouched
    CHECK(pool->entry(4).state.load() == 0);
    // Publishing over a valid entry replaces it.
    pool->publish_entry(3, 0xcccc, 0xaaaa, page_tokens(4, 16), 18);
    CHECK(e.hash == 0xcccc);
    CHECK(pool->entry_tokens(3)[0] == 400);
    pool->clear_entry(3);
    CHECK(e.state.load() == 0);
    CHECK(e.n_tokens == 0);
    CHECK(e.hash == 0);
    CHECK(pool->entry_tokens(3)[5] == 0);
}

TEST_CASE("kv_pool: what a forked worker writes through attach is visible to the owner") {
    temp_pool tp;
    const auto info = small_info();
    auto owner = ipc::kv_pool::create_or_adopt(tp.path, info);
    const int64_t pb = info.layout.page_bytes();
    for (int64_t i = 0; i < pb; ++i) owner->pages()[i] = pattern(0, i);
    const pid_t pid = fork_child([&] {
        auto w = ipc::kv_pool::attach(tp.path, info);
        if (!pages_match_pattern(*w, 0)) return 2; // sees the owner's page 0
        for (int p : {5, 7})
            for (int64_t i = 0; i < pb; ++i) w->pages()[p * pb + i] = pattern(p, i);
        return 0;
    });
    CHECK(exit_code(wait_child(pid)) == 0);
    CHECK(pages_match_pattern(*owner, 5));
    CHECK(pages_match_pattern(*owner, 7));
    CHECK_FALSE(pages_match_pattern(*owner, 6));
}

TEST_CASE("kv_pool: default path") {
    const char* old = std::getenv("RUNTIME_DIRECTORY");
    const std::string saved = old ? old : "";
    ::setenv("RUNTIME_DIRECTORY", "/run/tandem", 1);
    CHECK(ipc::default_kv_pool_path("/run/tandem/tandem.sock") == "/run/tandem/kv.pool");
    ::setenv("RUNTIME_DIRECTORY", "/run/a:/run/b", 1);
    CHECK(ipc::default_kv_pool_path("x") == "/run/a/kv.pool");
    ::unsetenv("RUNTIME_DIRECTORY");
    const std::string a = ipc::default_kv_pool_path("/tmp/a.sock"), b = ipc::default_kv_pool_path("/tmp/b.sock");
    const std::string prefix = "/dev/shm/tandem-" + std::to_string(::getuid()) + "-";
    CHECK(a.rfind(prefix, 0) == 0);
    CHECK(a.size() == prefix.size() + 16 + 3);
    CHECK(a.substr(a.size() - 3) == ".kv");
    CHECK(a != b);
    CHECK(a == ipc::default_kv_pool_path("/tmp/a.sock"));
    if (old) ::setenv("RUNTIME_DIRECTORY", saved.c_str(), 1);
}

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
                    if (!b.wants_logits[size_t(t)]) continue;
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
    bad_ring[128 + 128] ^= 1; // the command ring's capacity (channel header 128 bytes, then head, tail)
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
