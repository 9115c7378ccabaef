// Opening files and directories that must be this user's own (runtime/owned_file.hpp).
#include "runtime/owned_file.hpp"

#include "runtime/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tandem {
namespace {

// What is wrong with `st` for a file or directory of this user with at most `mode`'s bits;
// "" when nothing is.
std::string problem_of(const struct stat& st, mode_t mode, bool dir) {
    if (dir && !S_ISDIR(st.st_mode)) return "not a directory";
    if (!dir && !S_ISREG(st.st_mode)) return "not a regular file";
    if (st.st_uid != ::geteuid())
        return fmt::format("owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
    if (!dir && st.st_nlink != 1) return fmt::format("has {} hard links (one expected)", st.st_nlink);
    if ((st.st_mode & 07777 & ~mode) != 0)
        return fmt::format("mode {:04o} is wider than {:04o} (chmod it, or remove it)", st.st_mode & 07777, mode);
    return {};
}

} // namespace

int open_owned_file(const std::string& path, int flags, mode_t mode, mode_t max_mode) {
    const bool truncate = (flags & O_TRUNC) != 0;
    const int fd = ::open(path.c_str(), (flags & ~O_TRUNC) | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        const int e = errno;
        if (e == ELOOP) fail("{}: a symbolic link: refusing to follow it (remove it)", path);
        fail("{}: cannot open: {}", path, std::strerror(e));
    }
    struct stat st {};
    std::string why =
        ::fstat(fd, &st) != 0 ? std::string(std::strerror(errno)) : problem_of(st, max_mode ? max_mode : mode, false);
    if (why.empty() && truncate && ::ftruncate(fd, 0) != 0) why = fmt::format("cannot truncate: {}", std::strerror(errno));
    if (!why.empty()) {
        ::close(fd);
        fail("{}: {}", path, why);
    }
    return fd;
}

void ensure_owned_dir(const std::string& dir, mode_t mode, mode_t max_mode) {
    // Missing parents are made with `mode` too (a fallback under /tmp is this user's alone).
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty() && parent != dir && !std::filesystem::exists(parent, ec)) ensure_owned_dir(parent.string(), mode);
    if (::mkdir(dir.c_str(), mode) == 0) {
        if (::chmod(dir.c_str(), mode) != 0) fail("{}: cannot chmod: {}", dir, std::strerror(errno)); // (the umask)
    } else if (errno != EEXIST) {
        fail("{}: cannot create the directory: {}", dir, std::strerror(errno));
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) fail("{}: {}", dir, std::strerror(errno));
    if (S_ISLNK(st.st_mode)) fail("{}: a symbolic link, not a directory of this user's: refusing it (remove it)", dir);
    if (const std::string why = problem_of(st, max_mode ? max_mode : mode, true); !why.empty()) fail("{}: {}", dir, why);
}

void sync_dir(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
}

void write_atomic(const std::string& path, std::string_view text) {
    const std::string tmp = path + ".tmp";
    const int fd = open_owned_file(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    bool ok = true;
    for (size_t at = 0; ok && at < text.size();) {
        const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
        if (n < 0 && errno == EINTR) continue;
        ok = n > 0;
        if (ok) at += size_t(n);
    }
    ok = ok && ::fdatasync(fd) == 0;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        fail("cannot write {}: {}", path, std::strerror(e));
    }
    sync_dir(std::filesystem::path(path).parent_path().string());
}

} // namespace tandem
