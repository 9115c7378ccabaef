// The KV page pool in shared memory: one file-backed segment (tmpfs) that the supervisor and
// its workers map, with a header, a page table for the prefix cache, and the page array.
#pragma once

#include "runtime/kv_layout.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tandem::ipc {

// What a segment must match to be used: the model (fingerprint), the page layout, the count.
struct kv_pool_info {
    uint64_t fingerprint = 0;   // model + weight format + KV dtype (see model_fingerprint)
    kv_layout layout;
    int32_t n_pages = 0;
};

// One page's entry in the segment's page table. `state` is written last (release) when an
// entry becomes valid and first when it is cleared, so a reader after a crash sees either a
// whole entry or none. Only full pages whose K/V are computed are valid.
struct page_entry {
    std::atomic<uint32_t> state;  // 0 = nothing cached, 1 = valid
    int32_t n_tokens;             // == page_size when valid
    uint64_t hash;                // prefix_hash of the page (chained over the prefix)
    uint64_t parent;              // the previous page's hash (the seed for page 0)
    uint64_t last_use;            // supervisor's LRU clock when the page was last released
    // followed by int32_t tokens[page_size]
};

// Layout of the segment:
//   header (4 KiB)  | page table: n_pages entries of page_entry_bytes(page_size) | pad to 2 MiB
//   | pages: n_pages * layout.page_bytes(), each 64-byte aligned
class kv_pool {
public:
    // Supervisor: maps the segment at `path`, adopting an existing one only when its header
    // is whole and matches `want` (magic, version, fingerprint, layout, page count, file
    // size); anything else is rebuilt from scratch (zeroed, empty page table). Holds an
    // exclusive lock on the file while it lives: a second owner gets a tandem::error that
    // names the path (and its file is left alone); a failure once locked (no room for the
    // segment, no mapping) removes the file.
    // `rebuilt_why` (when not null) gets "" when adopted, else the reason.
    static std::unique_ptr<kv_pool> create_or_adopt(const std::string& path, const kv_pool_info& want,
                                                    std::string* rebuilt_why = nullptr);
    // Worker: maps an existing segment; throws tandem::error unless it matches `want`. With
    // `fd` (the owner's descriptor, inherited) it maps that file, found even once its name is
    // gone; messages name `path`.
    static std::unique_ptr<kv_pool> attach(const std::string& path, const kv_pool_info& want, int fd = -1);
    ~kv_pool();

    const kv_pool_info& info() const { return info_; }
    const std::string& path() const { return path_; }
    int fd() const;                       // the segment's file, open for reading and writing
    uint8_t* pages();                     // page 0; page i at pages() + i * layout.page_bytes()
    int64_t bytes() const;                // whole segment
    page_entry& entry(int32_t page);
    std::span<int32_t> entry_tokens(int32_t page); // [page_size]
    static int64_t page_entry_bytes(int32_t page_size);

    // The supervisor's access: through the file's descriptor (pread/pwrite), never the
    // mapping, so a file truncated under the daemon cannot SIGBUS it (a read past the end
    // finds no entry; a worker that touches a lost page dies, see worker_spec's file checks). Clear marks invalid first; publish fills the entry and marks it valid
    // last, each a write of its own, so a reader after a crash sees a whole entry or none.
    struct entry_copy {
        uint32_t state = 0;
        int32_t n_tokens = 0;
        uint64_t hash = 0, parent = 0, last_use = 0;
        std::vector<int32_t> tokens; // [page_size] when valid
    };
    entry_copy read_entry(int32_t page) const;
    void clear_entry(int32_t page);
    void publish_entry(int32_t page, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                       uint64_t last_use);
    void copy_page(int32_t src, int32_t dst); // the K/V bytes of page src into page dst

    void unlink_file(); // removes the file if it is still this segment's (the mapping stays valid)

private:
    kv_pool(std::string path, const kv_pool_info& info); // unmapped; create_or_adopt / attach map it
    struct impl;
    std::unique_ptr<impl> impl_;
    kv_pool_info info_;
    std::string path_;
};

// The default path of a daemon's pool: DIR/tandem-kv-<user>-<12 hex digits of a hash of the
// socket path and the model path>, DIR being $RUNTIME_DIRECTORY under systemd (its first
// entry), else /dev/shm. One name per daemon: daemons on other sockets or with other models
// never meet on one file (and its lock).
std::string default_kv_pool_path(const std::string& socket_path, const std::string& model_path);

// The kind of file system `path` is on, for messages: "tmpfs", "ext4", ... or its magic number.
std::string file_system_name(const std::string& path);

} // namespace tandem::ipc
