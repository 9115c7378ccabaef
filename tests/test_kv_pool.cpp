// The shared-memory KV pool (ipc/kv_pool): layout, adoption and rebuilds, attach, one owner, entries, default path.
#include "ipc/kv_pool.hpp"

#include "ipc_fixtures.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace tandem;
using tandem::test::exit_code;
using tandem::test::fork_child;
using tandem::test::thrown_by;
using tandem::test::wait_child;

namespace {

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

void truncate_file(const std::string& path, off_t size) { REQUIRE(::truncate(path.c_str(), size) == 0); }

void write_at(const std::string& path, off_t off, const void* p, size_t n) {
    const int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, p, n, off) == ssize_t(n));
    ::close(fd);
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
    CHECK(::access(tp.path.c_str(), F_OK) == 0); // nor remove the file
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

TEST_CASE("kv_pool: a segment the file system has no room for is refused and leaves no file") {
    temp_pool tp;
    auto huge = small_info();
    huge.layout.n_layer = 64;
    huge.layout.n_head_kv = 64;
    huge.layout.head_dim = 256; // 128 MiB a page (f32): 2^20 pages are 128 TiB, more than any machine has free
    huge.n_pages = 1 << 20;
    const std::string msg = thrown_by([&] { ipc::kv_pool::create_or_adopt(tp.path, huge); });
    CHECK(msg.find(tp.path) != std::string::npos);
    CHECK(msg.find("free") != std::string::npos);
    CHECK(::access(tp.path.c_str(), F_OK) != 0); // created, then removed
    // an existing (adoptable) segment that a bigger one replaces is gone too: it was truncated
    ipc::kv_pool::create_or_adopt(tp.path, small_info()).reset();
    CHECK(::access(tp.path.c_str(), F_OK) == 0);
    CHECK_FALSE(thrown_by([&] { ipc::kv_pool::create_or_adopt(tp.path, huge); }).empty());
    CHECK(::access(tp.path.c_str(), F_OK) != 0);
}

TEST_CASE("kv_pool: the segment is allocated whole, an adopted sparse one too (no SIGBUS when the disk fills later)") {
    temp_pool tp;
    const auto info = small_info();
    auto allocated = [&] {
        struct stat st {};
        REQUIRE(::stat(tp.path.c_str(), &st) == 0);
        return int64_t(st.st_blocks) * 512;
    };
    int64_t bytes = 0;
    {
        auto pool = ipc::kv_pool::create_or_adopt(tp.path, info);
        bytes = pool->bytes();
        CHECK(allocated() >= bytes);
        fill_pool(*pool);
    }
    // A hole in the pages (a sparse file, as ftruncate alone leaves one): adopting fills it.
    const int fd = ::open(tp.path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    REQUIRE(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, bytes - (1 << 20), 1 << 20) == 0);
    ::close(fd);
    REQUIRE(allocated() < bytes);
    std::string why = "unset";
    auto pool = ipc::kv_pool::create_or_adopt(tp.path, info, &why);
    CHECK(why == ""); // adopted, not rebuilt
    CHECK(allocated() >= bytes);
    CHECK(pool->entry(1).hash == 1001); // the page table (before the hole) kept
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

TEST_CASE("kv_pool: the owner's table reads, writes and page copies go through the file: a truncated file is no entry, never a fault") {
    temp_pool tp;
    const auto info = small_info();
    auto pool = ipc::kv_pool::create_or_adopt(tp.path, info);
    const int64_t pb = info.layout.page_bytes();
    pool->publish_entry(2, 0x1234, 0x5678, page_tokens(2, 16), 9);
    const auto e = pool->read_entry(2);
    CHECK(e.state == 1);
    CHECK(e.hash == 0x1234);
    CHECK(e.parent == 0x5678);
    CHECK(e.last_use == 9);
    CHECK(e.tokens == page_tokens(2, 16));
    for (int64_t i = 0; i < pb; ++i) pool->pages()[1 * pb + i] = uint8_t(i * 7 + 3);
    pool->copy_page(1, 5);
    CHECK(std::memcmp(pool->pages() + 5 * pb, pool->pages() + 1 * pb, size_t(pb)) == 0);
    // Another process truncates the file: the mapping would SIGBUS on these bytes.
    REQUIRE(::truncate(tp.path.c_str(), 4096) == 0);
    CHECK(pool->read_entry(2).state == 0);
    pool->publish_entry(3, 1, 2, page_tokens(3, 16), 10); // no fault
    pool->clear_entry(3);
    pool->copy_page(6, 7);
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

TEST_CASE("kv_pool: default path: one per socket and model, in a directory of the user's own on /dev/shm, in the RuntimeDirectory under systemd") {
    const char* old = std::getenv("RUNTIME_DIRECTORY");
    const std::string saved = old ? old : "";
    ::unsetenv("RUNTIME_DIRECTORY");
    const std::string a = ipc::default_kv_pool_path("/tmp/a.sock", "/m/x.gguf");
    // /dev/shm/tandem-EUID/ (the daemon makes it 0700 and refuses it owned by another user),
    // never a name in the shared /dev/shm another user could create first
    const std::string dir = "/dev/shm/tandem-" + std::to_string(::geteuid()) + "/";
    const std::string prefix = dir + "tandem-kv-";
    CHECK(a.rfind(prefix, 0) == 0);
    // tandem-kv-USER-HASH: the user's name (or uid), 12 hex digits
    const std::string rest = a.substr(prefix.size());
    const auto dash = rest.rfind('-');
    REQUIRE(dash != std::string::npos);
    CHECK(rest.size() - dash - 1 == 12);
    CHECK(rest.substr(dash + 1).find_first_not_of("0123456789abcdef") == std::string::npos);
    const passwd* pw = ::getpwuid(::getuid());
    CHECK(rest.substr(0, dash) == (pw ? std::string(pw->pw_name) : std::to_string(::getuid())));
    CHECK(a == ipc::default_kv_pool_path("/tmp/a.sock", "/m/x.gguf"));
    CHECK(a != ipc::default_kv_pool_path("/tmp/b.sock", "/m/x.gguf"));
    CHECK(a != ipc::default_kv_pool_path("/tmp/a.sock", "/m/y.gguf"));
    // the parts cannot run into each other
    CHECK(ipc::default_kv_pool_path("/tmp/a", "b/x") != ipc::default_kv_pool_path("/tmp/a/b", "x"));
    ::setenv("RUNTIME_DIRECTORY", "/run/tandem", 1);
    CHECK(ipc::default_kv_pool_path("/tmp/a.sock", "/m/x.gguf") == "/run/tandem/" + a.substr(dir.size()));
    ::setenv("RUNTIME_DIRECTORY", "/run/a:/run/b", 1);
    CHECK(ipc::default_kv_pool_path("/tmp/a.sock", "/m/x.gguf").rfind("/run/a/tandem-kv-", 0) == 0);
    if (old) ::setenv("RUNTIME_DIRECTORY", saved.c_str(), 1);
    else ::unsetenv("RUNTIME_DIRECTORY");
}
