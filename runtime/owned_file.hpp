// Files and directories the process creates or reuses where another user might have put
// something first (/dev/shm, /tmp, a configured path): never followed through a link, never
// truncated or written unless they are this user's own, else an error that names the path and
// what is wrong with it.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace tandem {

// Opens `path` with `flags` (O_CREAT among them to create it with `mode`) plus O_NOFOLLOW and
// O_CLOEXEC, and checks what was opened before anything is done to it: a regular file, owned
// by this process's effective user, with one link, and no permission bit beyond `max_mode`
// (by default `mode`). O_TRUNC is applied only after those checks. Returns the descriptor;
// throws tandem::error ("PATH: a symbolic link: refusing to follow it", "PATH: owned by uid
// 65534, not by this user (uid 1000)", ...) and leaves the file as it was.
int open_owned_file(const std::string& path, int flags, mode_t mode, mode_t max_mode = 0);

// Makes directory `dir` with mode `mode` (its missing parents as mkdir -p would, with `mode`
// too), or checks the one that is there: a directory, not a link, owned by this
// process's effective user, and with no permission bit beyond `max_mode` (by default `mode`).
// Throws tandem::error naming the path and the problem.
void ensure_owned_dir(const std::string& dir, mode_t mode, mode_t max_mode = 0);

// Makes a rename (or a removal) in `dir` durable: the directory's entry reaches the disk.
void sync_dir(const std::string& dir);

// Writes `text` to `path` whole or not at all: PATH.tmp (this user's own, mode 0600), synced,
// renamed over `path`, the directory synced after. Throws tandem::error naming the path.
void write_atomic(const std::string& path, std::string_view text);

} // namespace tandem
