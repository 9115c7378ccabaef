// The KV page pool segment: header checks, create/adopt/rebuild under an exclusive flock, mapping.
#include "ipc/kv_pool.hpp"

#include "runtime/error.hpp"
#include "runtime/owned_file.hpp"

#include <boost/interprocess/file_mapping.hpp>
#include <boost/interprocess/mapped_region.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <linux/magic.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace tandem::ipc {

namespace bip = boost::interprocess;

namespace {

constexpr uint64_t pool_magic = 0x4c4f4f50564b4454ull; // "TDKVPOOL" read as little-endian bytes
constexpr uint32_t pool_version = 1;
constexpr int64_t header_bytes = 4096;
constexpr int64_t pages_align = int64_t(2) << 20; // 2 MiB: lets the pages sit on huge pages

// The first bytes of the segment. Fields are laid out without padding so the checksum over
// the raw bytes is well defined.
struct pool_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;
    uint64_t fingerprint;
    int32_t n_layer, n_head_kv, head_dim, page_size;
    int32_t dtype;
    int32_t n_pages;
    int64_t page_bytes;
    int64_t entry_bytes;
    int64_t table_offset;
    int64_t pages_offset;
    int64_t total_bytes;
    uint64_t checksum; // FNV-1a over every byte before it
};
static_assert(std::is_trivially_copyable_v<pool_header>);
static_assert(std::has_unique_object_representations_v<pool_header>, "no padding inside the header");
static_assert(offsetof(pool_header, checksum) + sizeof(uint64_t) == sizeof(pool_header));
static_assert(sizeof(pool_header) <= size_t(header_bytes));
static_assert(std::atomic<uint32_t>::is_always_lock_free, "page_entry::state is shared between processes");
static_assert(sizeof(page_entry) == 32 && alignof(page_entry) == 8 && std::is_standard_layout_v<page_entry>);

uint64_t fnv1a(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t header_checksum(const pool_header& h) { return fnv1a(&h, offsetof(pool_header, checksum)); }

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

std::string errno_text(int e) { return std::strerror(e); }

// The header a segment for `want` must have (checksum filled in). Throws on a `want` that
// cannot describe a segment (the caller's configuration is wrong).
pool_header expected_header(const std::string& path, const kv_pool_info& want) {
    const kv_layout& l = want.layout;
    TANDEM_CHECK(want.n_pages > 0 && l.n_layer > 0 && l.n_head_kv > 0 && l.head_dim > 0 && l.page_size > 0,
                 "kv pool {}: bad layout (n_pages {}, n_layer {}, n_head_kv {}, head_dim {}, page_size {})", path,
                 want.n_pages, l.n_layer, l.n_head_kv, l.head_dim, l.page_size);
    TANDEM_CHECK(l.dtype == kv_dtype::f32 || l.dtype == kv_dtype::f16 || l.dtype == kv_dtype::i8,
                 "kv pool {}: bad kv dtype {}", path, int(l.dtype));
    // Bounds that keep every product below in int64 and the segment below 1 PiB.
    TANDEM_CHECK(int64_t(l.n_layer) * l.n_head_kv * l.head_dim * l.page_size <= (int64_t(1) << 36) &&
                     l.page_size <= (1 << 20),
                 "kv pool {}: page too large", path);
    pool_header h{};
    h.magic = pool_magic;
    h.version = pool_version;
    h.header_bytes = uint32_t(header_bytes);
    h.fingerprint = want.fingerprint;
    h.n_layer = l.n_layer;
    h.n_head_kv = l.n_head_kv;
    h.head_dim = l.head_dim;
    h.page_size = l.page_size;
    h.dtype = int32_t(l.dtype);
    h.n_pages = want.n_pages;
    h.page_bytes = l.page_bytes();
    TANDEM_ASSERT(h.page_bytes > 0 && h.page_bytes % 64 == 0, "page_bytes {}", h.page_bytes);
    h.entry_bytes = kv_pool::page_entry_bytes(l.page_size);
    h.table_offset = header_bytes;
    h.pages_offset = round_up(h.table_offset + int64_t(want.n_pages) * h.entry_bytes, pages_align);
    TANDEM_CHECK(h.page_bytes <= (int64_t(1) << 50) / want.n_pages, "kv pool {}: {} pages of {} bytes is too large",
                 path, want.n_pages, h.page_bytes);
    h.total_bytes = h.pages_offset + int64_t(want.n_pages) * h.page_bytes;
    h.checksum = header_checksum(h);
    return h;
}

// Why the segment of `size` bytes whose first bytes are `got` cannot be used for `want`
// ("" when it can). `n_read` is how many header bytes were read.
std::string mismatch(const pool_header& got, size_t n_read, int64_t size, const pool_header& want) {
    if (size == 0) return "no segment";
    if (n_read < sizeof(pool_header) || size < header_bytes || got.magic != pool_magic) return "bad header";
    if (got.version != pool_version) return "version differs";
    if (got.checksum != header_checksum(got)) return "bad checksum";
    if (got.header_bytes != want.header_bytes) return "bad header";
    if (got.fingerprint != want.fingerprint) return "fingerprint differs";
    if (got.n_layer != want.n_layer || got.n_head_kv != want.n_head_kv || got.head_dim != want.head_dim ||
        got.page_size != want.page_size || got.dtype != want.dtype)
        return "layout differs";
    if (got.n_pages != want.n_pages) return "page count differs";
    if (got.page_bytes != want.page_bytes || got.entry_bytes != want.entry_bytes ||
        got.table_offset != want.table_offset || got.pages_offset != want.pages_offset ||
        got.total_bytes != want.total_bytes)
        return "bad header"; // same version and shape, other offsets: a writer with other rules
    if (size != got.total_bytes) return "size differs";
    return "";
}

// Reads the header bytes at the start of fd; returns how many were read.
size_t read_header(int fd, const std::string& path, pool_header& h) {
    std::memset(&h, 0, sizeof h);
    size_t n = 0;
    while (n < sizeof h) {
        const ssize_t r = ::pread(fd, reinterpret_cast<char*>(&h) + n, sizeof h - n, off_t(n));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail("kv pool {}: cannot read the header: {}", path, errno_text(errno));
        if (r == 0) break;
        n += size_t(r);
    }
    return n;
}

// Whole reads and writes at an offset of the segment's file (`io`: pread or pwrite); false on
// an error, or a read past the end (a truncated file).
template <typename Byte, typename Io>
bool whole_at(Io io, int fd, Byte* p, size_t n, int64_t off) {
    while (n > 0) {
        const ssize_t r = io(fd, p, n, off_t(off));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r, n -= size_t(r), off += r;
    }
    return true;
}
bool pread_all(int fd, void* out, size_t n, int64_t off) {
    return whole_at(::pread, fd, static_cast<uint8_t*>(out), n, off);
}
bool pwrite_all(int fd, const void* in, size_t n, int64_t off) {
    return whole_at(::pwrite, fd, static_cast<const uint8_t*>(in), n, off);
}

int64_t file_size(int fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail("kv pool {}: fstat: {}", path, errno_text(errno));
    return int64_t(st.st_size);
}

} // namespace

struct kv_pool::impl {
    int fd = -1;
    bip::mapped_region region;
    uint8_t* base = nullptr;
    int64_t bytes = 0;
    int64_t table_offset = 0, pages_offset = 0, entry_bytes = 0, page_bytes = 0;
    std::vector<uint8_t> copy_buf; // copy_page's bounce buffer
    std::vector<uint8_t> zeros;    // an entry's bytes after its first word, zero: clear_entry writes them

    int64_t entry_offset(int32_t page) const { return table_offset + int64_t(page) * entry_bytes; }

    ~impl() {
        if (fd >= 0) ::close(fd); // drops the flock with it
    }

    // Maps the whole segment (already the right size) through Boost.Interprocess, MAP_SHARED.
    void map(const std::string& path, const pool_header& h) {
        try {
            // Through our descriptor's name: the file we checked (and locked), even if its
            // path was replaced or removed since.
            const std::string ours = fmt::format("/proc/self/fd/{}", fd);
            bip::file_mapping fm(ours.c_str(), bip::read_write);
            region = bip::mapped_region(fm, bip::read_write, 0, size_t(h.total_bytes));
        } catch (const bip::interprocess_exception& e) {
            fail("kv pool {}: cannot map {} bytes: {}", path, h.total_bytes, e.what());
        }
        base = static_cast<uint8_t*>(region.get_address());
        bytes = h.total_bytes;
        table_offset = h.table_offset;
        pages_offset = h.pages_offset;
        entry_bytes = h.entry_bytes;
        page_bytes = h.page_bytes;
        zeros.assign(size_t(entry_bytes) - sizeof(uint32_t), 0);
        // Huge pages for the page array where the file system allows them (tmpfs with
        // huge=advise/within_size); a plain file or a refusal is fine.
        const uintptr_t pages = reinterpret_cast<uintptr_t>(base) + uintptr_t(pages_offset);
        const uintptr_t sys_page = uintptr_t(::sysconf(_SC_PAGESIZE));
        const uintptr_t begin = (pages + sys_page - 1) / sys_page * sys_page;
        const uintptr_t end = reinterpret_cast<uintptr_t>(base) + uintptr_t(bytes);
        if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    }
};

kv_pool::kv_pool(std::string path, const kv_pool_info& info)
    : impl_(std::make_unique<impl>()), info_(info), path_(std::move(path)) {}

kv_pool::~kv_pool() = default;

int64_t kv_pool::page_entry_bytes(int32_t page_size) {
    return round_up(int64_t(sizeof(page_entry)) + int64_t(page_size) * int64_t(sizeof(int32_t)), 8);
}

std::unique_ptr<kv_pool> kv_pool::create_or_adopt(const std::string& path, const kv_pool_info& want,
                                                  std::string* rebuilt_why) {
    const pool_header h = expected_header(path, want);
    std::unique_ptr<kv_pool> pool(new kv_pool(path, want));
    impl& m = *pool->impl_;

    // (Not followed through a link, and refused unless it is this user's own file of mode
    // 0600 or less: another user's planted file or link is never truncated or written.)
    try {
        m.fd = open_owned_file(path, O_RDWR | O_CREAT, 0600);
    } catch (const error& e) {
        fail("kv pool {}", e.what());
    }
    if (::flock(m.fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        if (e == EWOULDBLOCK)
            fail("kv pool {}: in use by another process that holds its lock (flock: {})", path, errno_text(e));
        fail("kv pool {}: cannot lock: {}", path, errno_text(e));
    }
    // Locked, the file is ours: a failure from here on (no room for it, no mapping) removes
    // it, since what is left (created empty, or truncated) serves no later start.
    struct remove_unless_kept {
        const std::string& path;
        bool keep = false;
        ~remove_unless_kept() {
            if (!keep) (void)::unlink(path.c_str());
        }
    } cleanup{path};

    pool_header got{};
    const size_t n_read = read_header(m.fd, path, got);
    const std::string why = mismatch(got, n_read, file_size(m.fd, path), h);
    if (!why.empty()) {
        // Rebuild: truncating to 0 first drops every old page, so the new segment reads as
        // zeros (a sparse file on tmpfs: nothing is written to the pages here).
        if (::ftruncate(m.fd, 0) != 0) fail("kv pool {}: cannot truncate: {}", path, errno_text(errno));
        // tmpfs accepts any size in ftruncate and raises SIGBUS on the first page it cannot
        // back, so refuse a segment the file system has no room for now.
        struct statvfs vfs {};
        if (::fstatvfs(m.fd, &vfs) == 0 && vfs.f_blocks > 0) {
            const unsigned long long avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
            if (avail < (unsigned long long)h.total_bytes)
                fail("kv pool {}: needs {} MiB, the file system has {} MiB free: {}", path, h.total_bytes >> 20,
                     avail >> 20, errno_text(ENOSPC));
        }
        if (::ftruncate(m.fd, off_t(h.total_bytes)) != 0)
            fail("kv pool {}: cannot size to {} bytes: {}", path, h.total_bytes, errno_text(errno));
    }
    // Every page allocated now (an adopted file too: it may be sparse): a file system that
    // fills up later cannot leave a page unbacked, which would be a SIGBUS on first touch.
    if (const int e = ::posix_fallocate(m.fd, 0, off_t(h.total_bytes)); e != 0)
        fail("kv pool {}: cannot allocate {} MiB: {}", path, h.total_bytes >> 20, errno_text(e));
    m.map(path, h);
    if (!why.empty()) {
        // The header goes in last, its magic after everything else: a crash before that
        // leaves a file that the next start rebuilds.
        pool_header body = h;
        body.magic = 0;
        std::memcpy(m.base + sizeof(uint64_t), reinterpret_cast<const uint8_t*>(&body) + sizeof(uint64_t),
                    sizeof(pool_header) - sizeof(uint64_t));
        std::atomic_thread_fence(std::memory_order_release);
        std::memcpy(m.base, &h.magic, sizeof(uint64_t));
    }
    if (rebuilt_why) *rebuilt_why = why;
    cleanup.keep = true;
    return pool;
}

std::unique_ptr<kv_pool> kv_pool::attach(const std::string& path, const kv_pool_info& want, int fd) {
    const pool_header h = expected_header(path, want);
    std::unique_ptr<kv_pool> pool(new kv_pool(path, want));
    impl& m = *pool->impl_;

    m.fd = fd >= 0 ? ::fcntl(fd, F_DUPFD_CLOEXEC, 0) : ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (m.fd < 0) fail("kv pool {}: cannot open: {}", path, errno_text(errno));
    pool_header got{};
    const size_t n_read = read_header(m.fd, path, got);
    const std::string why = mismatch(got, n_read, file_size(m.fd, path), h);
    if (!why.empty()) fail("kv pool {}: cannot attach: {}", path, why);
    // Workers attach after the owner's create_or_adopt returned; the owner rebuilds only
    // then, so the segment does not change size under this mapping.
    m.map(path, h);
    return pool;
}

int kv_pool::fd() const { return impl_->fd; }

uint8_t* kv_pool::pages() { return impl_->base + impl_->pages_offset; }

int64_t kv_pool::bytes() const { return impl_->bytes; }

page_entry& kv_pool::entry(int32_t page) {
    TANDEM_ASSERT(page >= 0 && page < info_.n_pages, "page {} of {}", page, info_.n_pages);
    return *reinterpret_cast<page_entry*>(impl_->base + impl_->table_offset + int64_t(page) * impl_->entry_bytes);
}

std::span<int32_t> kv_pool::entry_tokens(int32_t page) {
    auto* p = reinterpret_cast<uint8_t*>(&entry(page)) + sizeof(page_entry);
    return {reinterpret_cast<int32_t*>(p), size_t(info_.layout.page_size)};
}

// The page table through the descriptor. An entry is page_entry's fields (state first) then
// its tokens; a write that fails (the file system full after a truncation) stops there, so an
// entry is never marked valid over contents that were not written.
namespace {
struct entry_fields { // page_entry's bytes, without the atomic
    uint32_t state;
    int32_t n_tokens;
    uint64_t hash, parent, last_use;
};
static_assert(sizeof(entry_fields) == sizeof(page_entry) && offsetof(entry_fields, hash) == offsetof(page_entry, hash) &&
              offsetof(entry_fields, last_use) == offsetof(page_entry, last_use));
} // namespace

kv_pool::entry_copy kv_pool::read_entry(int32_t page) const {
    TANDEM_ASSERT(page >= 0 && page < info_.n_pages, "page {} of {}", page, info_.n_pages);
    const impl& m = *impl_;
    entry_fields f{};
    entry_copy e;
    if (!pread_all(m.fd, &f, sizeof f, m.entry_offset(page))) return e; // past the end: none
    e.tokens.resize(size_t(info_.layout.page_size));
    if (!pread_all(m.fd, e.tokens.data(), e.tokens.size() * sizeof(int32_t), m.entry_offset(page) + int64_t(sizeof f)))
        return entry_copy{};
    e.state = f.state;
    e.n_tokens = f.n_tokens;
    e.hash = f.hash;
    e.parent = f.parent;
    e.last_use = f.last_use;
    return e;
}

void kv_pool::clear_entry(int32_t page) {
    TANDEM_ASSERT(page >= 0 && page < info_.n_pages, "page {} of {}", page, info_.n_pages);
    const impl& m = *impl_;
    const int64_t off = m.entry_offset(page);
    // Invalid before anything else changes, for a reader after a crash.
    const uint32_t invalid = 0;
    if (!pwrite_all(m.fd, &invalid, sizeof invalid, off)) return;
    (void)pwrite_all(m.fd, m.zeros.data(), m.zeros.size(), off + int64_t(sizeof invalid));
}

void kv_pool::publish_entry(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                            uint64_t last_use) {
    TANDEM_ASSERT(int64_t(tokens.size()) == info_.layout.page_size, "publish_entry: {} tokens, page_size {}",
                  tokens.size(), info_.layout.page_size);
    TANDEM_ASSERT(page >= 0 && page < info_.n_pages, "page {} of {}", page, info_.n_pages);
    const impl& m = *impl_;
    const int64_t off = m.entry_offset(page);
    entry_fields f{0, int32_t(tokens.size()), hash, parent, last_use};
    if (!pwrite_all(m.fd, &f.state, sizeof f.state, off)) return;
    if (!pwrite_all(m.fd, reinterpret_cast<const uint8_t*>(&f) + sizeof f.state, sizeof f - sizeof f.state,
                    off + int64_t(sizeof f.state)) ||
        !pwrite_all(m.fd, tokens.data(), tokens.size_bytes(), off + int64_t(sizeof f)))
        return;
    const uint32_t valid = 1;
    (void)pwrite_all(m.fd, &valid, sizeof valid, off);
}

void kv_pool::copy_page(int32_t src, int32_t dst) {
    TANDEM_ASSERT(src >= 0 && src < info_.n_pages && dst >= 0 && dst < info_.n_pages, "copy_page {} -> {} of {}", src,
                  dst, info_.n_pages);
    impl& m = *impl_;
    m.copy_buf.resize(size_t(m.page_bytes));
    // A page lost to a truncation copies as zeros; the worker that reads it faults first.
    if (!pread_all(m.fd, m.copy_buf.data(), m.copy_buf.size(), m.pages_offset + int64_t(src) * m.page_bytes))
        std::fill(m.copy_buf.begin(), m.copy_buf.end(), uint8_t(0));
    (void)pwrite_all(m.fd, m.copy_buf.data(), m.copy_buf.size(), m.pages_offset + int64_t(dst) * m.page_bytes);
}

void kv_pool::unlink_file() {
    // Best effort: a file someone else already removed is the outcome we want; a file that
    // another process put in its place since is theirs, left alone.
    struct stat ours {}, at_path {};
    if (::fstat(impl_->fd, &ours) == 0 && ::stat(path_.c_str(), &at_path) == 0 && ours.st_dev == at_path.st_dev &&
        ours.st_ino == at_path.st_ino)
        (void)::unlink(path_.c_str());
}

std::string default_kv_pool_path(const std::string& socket_path, const std::string& model_path) {
    // A directory of this user's own on the tmpfs, never the shared /dev/shm itself, where
    // another user could have created the pool's name first.
    std::string dir = fmt::format("/dev/shm/tandem-{}", ::geteuid());
    if (const char* rd = std::getenv("RUNTIME_DIRECTORY"); rd && *rd) {
        const std::string d(rd);
        if (d.front() != ':') dir = d.substr(0, d.find(':')); // several RuntimeDirectory= entries: the first
    }
    // The user's name where it is a plain word (a file name part), else the uid.
    std::string user = std::to_string(::getuid());
    if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_name && *pw->pw_name) {
        const std::string name = pw->pw_name;
        if (name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos)
            user = name;
    }
    const std::string key = socket_path + '\0' + model_path;
    return fmt::format("{}/tandem-kv-{}-{:012x}", dir, user, fnv1a(key.data(), key.size()) & 0xffffffffffffull);
}

std::string file_system_name(const std::string& path) {
    struct statfs st {};
    if (::statfs(path.c_str(), &st) != 0) return fmt::format("file system unknown: {}", errno_text(errno));
    switch (st.f_type) {
    case TMPFS_MAGIC: return "tmpfs";
    case HUGETLBFS_MAGIC: return "hugetlbfs";
    case EXT4_SUPER_MAGIC: return "ext4"; // also ext2 and ext3
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case NFS_SUPER_MAGIC: return "nfs";
    default: return fmt::format("file system {:#x}", static_cast<unsigned long>(st.f_type));
    }
}

} // namespace tandem::ipc
