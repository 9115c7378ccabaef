// tandemd's batch jobs: /v1/files and /v1/batches, their state on disk, and the runner
// (daemon/batch_jobs.hpp).
#include "daemon/batch_jobs.hpp"

#include "daemon/batch_file.hpp"
#include "daemon/batch_run.hpp"
#include "daemon/fields.hpp"
#include "runtime/error.hpp"
#include "runtime/json_limits.hpp"
#include "runtime/owned_file.hpp"
#include "runtime/log.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

namespace tandem::daemon {

namespace fs = std::filesystem;

namespace {

int64_t now_unix() { return int64_t(std::time(nullptr)); }

// An id that sorts in creation order: 16 hex digits of a count that only grows (the wall clock
// in microseconds, or one more than the last id's), then 8 random ones. created_at is in whole
// seconds, so the id is what orders the files, the jobs a runner takes and the list pages made
// in one second (before, with a random id, two batches created in the same second ran in either
// order).
std::string new_id(std::string_view prefix) {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    static uint64_t last = 0;
    std::lock_guard lock(mu);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    last = std::max(last + 1, uint64_t(us.count()));
    return fmt::format("{}{:016x}{:08x}", prefix, last, uint32_t(rng()));
}

// An id these routes made (no path tricks: it names a file under the state directory).
bool valid_id(std::string_view id, std::string_view prefix) {
    if (!id.starts_with(prefix) || id.size() != prefix.size() + 24) return false;
    return std::all_of(id.begin() + std::ptrdiff_t(prefix.size()), id.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int64_t file_size(const std::string& path) {
    std::error_code ec;
    const auto n = fs::file_size(path, ec);
    return ec ? -1 : int64_t(n);
}

reply not_found(std::string_view what, std::string_view id) {
    return reply::of(api_error{404, fmt::format("No such {}: {}", what, id), "invalid_request_error", "", "not_found"});
}

reply bad_request(std::string message, std::string param = {}) {
    return reply::of(api_error{400, std::move(message), "invalid_request_error", std::move(param)});
}





// The query's parameters, when each is one of `known`; else the 400 that names the first.
std::optional<reply> unknown_param(const std::map<std::string, std::string>& query,
                                   std::initializer_list<std::string_view> known) {
    for (const auto& [k, v] : query)
        if (std::find(known.begin(), known.end(), k) == known.end())
            return bad_request(fmt::format("unknown query parameter '{}': Tandem does not support it here", k), k);
    return std::nullopt;
}

// A list page of `items` (newest first unless `asc`) after the cursor, at most `limit`.
std::variant<json, reply> page(std::vector<json> items, const std::map<std::string, std::string>& query, bool asc) {
    int64_t limit = 10000;
    if (auto it = query.find("limit"); it != query.end()) {
        try {
            size_t used = 0;
            limit = std::stoll(it->second, &used);
            if (used != it->second.size() || limit < 1 || limit > 10000) throw std::invalid_argument("range");
        } catch (const std::exception&) {
            return bad_request("limit must be an integer from 1 to 10000", "limit");
        }
    }
    std::stable_sort(items.begin(), items.end(), [&](const json& a, const json& b) {
        const auto ta = a["created_at"].get<int64_t>(), tb = b["created_at"].get<int64_t>();
        if (ta != tb) return asc ? ta < tb : ta > tb;
        return asc ? a["id"].get<std::string>() < b["id"].get<std::string>()
                   : a["id"].get<std::string>() > b["id"].get<std::string>();
    });
    size_t from = 0;
    if (auto it = query.find("after"); it != query.end()) {
        const auto at = std::find_if(items.begin(), items.end(), [&](const json& j) { return j["id"] == it->second; });
        if (at == items.end()) return bad_request(fmt::format("after: no such id {}", it->second), "after");
        from = size_t(at - items.begin()) + 1;
    }
    json data = json::array();
    for (size_t i = from; i < items.size() && int64_t(data.size()) < limit; ++i) data.push_back(items[i]);
    const bool more = from + data.size() < items.size();
    return json{{"object", "list"},
                {"data", data},
                {"first_id", data.empty() ? json() : data.front()["id"]},
                {"last_id", data.empty() ? json() : data.back()["id"]},
                {"has_more", more}};
}

// A file's bytes mapped read-only (an upload's body, up to max_file_bytes: never copied
// into memory whole).
class mapped_file {
public:
    explicit mapped_file(const std::string& path) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) throw error(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
        struct stat st {};
        if (::fstat(fd, &st) == 0) size_ = size_t(st.st_size);
        if (size_ > 0) {
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            data_ = p == MAP_FAILED ? nullptr : static_cast<const char*>(p);
        }
        ::close(fd);
        if (size_ > 0 && !data_) throw error(fmt::format("cannot map {}: {}", path, std::strerror(errno)));
    }
    ~mapped_file() {
        if (data_) ::munmap(const_cast<char*>(data_), size_);
    }
    mapped_file(const mapped_file&) = delete;
    mapped_file& operator=(const mapped_file&) = delete;
    std::string_view view() const { return {data_ ? data_ : "", size_}; }

private:
    const char* data_ = nullptr;
    size_t size_ = 0;
};

// A state file written by this daemon, read back at start (under the nesting limit: the
// directory is the daemon's, but a file in it may be planted or damaged). Throws.
json parse_stored(const std::string& path, int max_depth) {
    std::string why;
    std::optional<json> j = parse_json_limited<json>(batch::read_file(path), max_depth, why);
    if (!j) throw error(why);
    return std::move(*j);
}

bool unfinished(const std::string& status) {
    return status == "validating" || status == "in_progress" || status == "finalizing" || status == "cancelling";
}

} // namespace

std::optional<std::vector<form_part>> parse_multipart(std::string_view content_type, std::string_view body,
                                                      std::string& why) {
    const size_t semi = content_type.find(';');
    std::string type(content_type.substr(0, semi));
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    while (!type.empty() && type.back() == ' ') type.pop_back();
    if (type != "multipart/form-data") {
        why = "a file is uploaded as multipart/form-data (with the fields file and purpose)";
        return std::nullopt;
    }
    std::string boundary;
    for (size_t at = semi; at != std::string_view::npos && at < content_type.size();) {
        const size_t next = content_type.find(';', at + 1);
        std::string_view p = content_type.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1);
        while (!p.empty() && p.front() == ' ') p.remove_prefix(1);
        if (p.size() > 9 && (p.substr(0, 9) == "boundary=" || p.substr(0, 9) == "BOUNDARY=")) {
            p.remove_prefix(9);
            if (p.size() >= 2 && p.front() == '"' && p.back() == '"') p = p.substr(1, p.size() - 2);
            boundary = p;
        }
        at = next;
    }
    if (boundary.empty() || boundary.size() > 200) {
        why = "the multipart/form-data content type has no boundary";
        return std::nullopt;
    }
    const std::string delim = "--" + boundary;
    std::vector<form_part> parts;
    size_t at = body.find(delim);
    if (at == std::string_view::npos) {
        why = "the multipart body has no part";
        return std::nullopt;
    }
    for (;;) {
        at += delim.size();
        if (body.substr(at, 2) == "--") return parts; // the closing delimiter
        if (body.substr(at, 2) != "\r\n") break;
        at += 2;
        const size_t head_end = body.find("\r\n\r\n", at);
        if (head_end == std::string_view::npos) break;
        form_part part;
        for (std::string_view head = body.substr(at, head_end - at); !head.empty();) {
            const size_t eol = head.find("\r\n");
            const std::string_view line = head.substr(0, eol);
            head = eol == std::string_view::npos ? std::string_view{} : head.substr(eol + 2);
            const size_t colon = line.find(':');
            if (colon == std::string_view::npos) continue;
            std::string name(line.substr(0, colon));
            std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
            std::string_view value = line.substr(colon + 1);
            while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
            if (name == "content-type") part.content_type = value;
            if (name != "content-disposition") continue;
            // form-data; name="file"; filename="in.jsonl"
            auto param = [&](std::string_view key) -> std::optional<std::string> {
                for (size_t p = value.find(';'); p != std::string_view::npos; p = value.find(';', p + 1)) {
                    std::string_view v = value.substr(p + 1);
                    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
                    if (!v.starts_with(key) || v.substr(key.size(), 1) != "=") continue;
                    v.remove_prefix(key.size() + 1);
                    if (v.starts_with('"')) {
                        const size_t close = v.find('"', 1);
                        return std::string(v.substr(1, close == std::string_view::npos ? v.size() - 1 : close - 1));
                    }
                    return std::string(v.substr(0, v.find(';')));
                }
                return std::nullopt;
            };
            part.name = param("name").value_or("");
            part.filename = param("filename").value_or("");
        }
        const size_t data_begin = head_end + 4;
        const size_t data_end = body.find("\r\n" + delim, data_begin);
        if (data_end == std::string_view::npos) break;
        part.data = body.substr(data_begin, data_end - data_begin);
        parts.push_back(std::move(part));
        at = data_end + 2;
    }
    why = "malformed multipart/form-data body";
    return std::nullopt;
}

batch_jobs::batch_jobs(batch_settings s) : s_(std::move(s)) {
    // Private: the files hold what clients asked and got. The directories are this user's,
    // and nobody else may write in them (systemd's StateDirectoryMode may let others read the
    // top one); made so, or refused by name.
    std::error_code ec;
    ensure_owned_dir(s_.dir, 0700, 0755);
    ensure_owned_dir(s_.dir + "/files", 0700);
    ensure_owned_dir(s_.dir + "/batches", 0700);
    // One daemon per state directory: two would run the same jobs.
    lock_fd_ = open_owned_file(s_.dir + "/lock", O_RDWR | O_CREAT, 0600);
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        ::close(lock_fd_);
        lock_fd_ = -1;
        throw error(fmt::format("{} is in use by another tandemd ({})", s_.dir, std::strerror(e)));
    }
    auto log = logger("batch");
    for (const auto& e : fs::directory_iterator(s_.dir + "/files", ec)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".tmp")) fs::remove(e.path(), ec);
        if (!name.ends_with(".json")) continue;
        try {
            json f = parse_stored(e.path().string(), s_.max_json_depth);
            const std::string id = f.at("id").get<std::string>();
            // (kept beside the object on disk; a file from before owners has none: root's)
            std::string owner = f.contains("owner") ? f["owner"].get<std::string>() : "";
            f.erase("owner");
            if (valid_id(id, "file-") && fs::exists(file_path(id))) files_[id] = {std::move(f), std::move(owner)};
        } catch (const std::exception& x) {
            log->warn("ignoring {}: {}", e.path().string(), x.what());
        }
    }
    for (const auto& e : fs::directory_iterator(s_.dir + "/batches", ec)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".tmp")) fs::remove(e.path(), ec);
        if (!name.ends_with(".json")) continue;
        try {
            const json j = parse_stored(e.path().string(), s_.max_json_depth);
            auto jb = std::make_unique<job>();
            jb->batch = j.at("batch");
            jb->final_status = j.value("final", "");
            jb->owner = j.value("owner", "");
            jb->cancel = jb->batch.at("status") == "cancelling";
            const std::string id = jb->batch.at("id").get<std::string>();
            if (valid_id(id, "batch_")) jobs_[id] = std::move(jb);
        } catch (const std::exception& x) {
            log->warn("ignoring {}: {}", e.path().string(), x.what());
        }
    }
    remove_orphans();
    int n_open = 0;
    for (const auto& [id, j] : jobs_) n_open += unfinished(j->batch["status"].get<std::string>());
    log->info("batch jobs in {}: {} files, {} jobs ({} to run)", s_.dir, files_.size(), jobs_.size(), n_open);
}

void batch_jobs::remove_orphans() {
    // What a crash (or a power cut) between two steps leaves: a file's bytes without its
    // object or the object without its bytes, results of a job that is gone or ended.
    auto log = logger("batch");
    std::error_code ec;
    const auto drop = [&](const fs::path& p) {
        log->info("removing {}: left by an earlier run, it belongs to no file or batch", p.string());
        fs::remove(p, ec);
    };
    for (const auto& e : fs::directory_iterator(s_.dir + "/files", ec)) {
        std::string id = e.path().filename().string();
        if (id.ends_with(".json")) id.resize(id.size() - 5);
        if (valid_id(id, "file-") && !files_.contains(id)) drop(e.path());
    }
    for (const auto& e : fs::directory_iterator(s_.dir + "/batches", ec)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".json")) continue;
        const std::string id = name.substr(0, name.find('.'));
        const auto it = jobs_.find(id);
        if (valid_id(id, "batch_") && (it == jobs_.end() || !unfinished(it->second->batch["status"].get<std::string>())))
            drop(e.path());
    }
    sync_dir(s_.dir + "/files");
    sync_dir(s_.dir + "/batches");
}

batch_jobs::~batch_jobs() {
    stop();
    if (runner_.joinable()) runner_.join();
    if (lock_fd_ >= 0) ::close(lock_fd_);
}

void batch_jobs::start() {
    runner_ = std::thread([this] { run(); });
}

void batch_jobs::stop() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
}


std::string batch_jobs::new_upload_path() const {
    return s_.dir + "/files/" + new_id("upload-") + ".tmp";
}

reply batch_jobs::list_files(const query_map& query, const principal& who) {
    if (auto r = unknown_param(query, {"purpose", "limit", "after", "order"})) return *r;
    bool asc = false;
    if (auto it = query.find("order"); it != query.end()) {
        if (it->second != "asc" && it->second != "desc") return bad_request("order must be asc or desc", "order");
        asc = it->second == "asc";
    }
    std::vector<json> items;
    {
        std::lock_guard lock(mu_);
        const auto purpose = query.find("purpose");
        for (const auto& [id, f] : files_)
            if (who.may_see(f.owner) && (purpose == query.end() || f.object["purpose"] == purpose->second))
                items.push_back(f.object);
    }
    auto r = page(std::move(items), query, asc);
    if (auto* err = std::get_if<reply>(&r)) return *err;
    return reply::of_json(std::get<json>(r));
}

reply batch_jobs::upload(std::string_view content_type, const std::string& body, const std::string& body_file,
                         const principal& who) {
    if (body_file.empty()) return upload(content_type, std::string_view(body), who);
    const mapped_file m(body_file); // (the bytes stay on disk: read where they lie)
    return upload(content_type, m.view(), who);
}

reply batch_jobs::file(const std::string& id, bool content, const query_map& query, const principal& who) {
    if (auto r = unknown_param(query, {})) return *r;
    std::lock_guard lock(mu_);
    const auto it = files_.find(id);
    if (it == files_.end() || !who.may_see(it->second.owner)) return not_found("file", id);
    if (!content) return reply::of_json(it->second.object);
    reply r;
    r.content_type = "application/octet-stream";
    r.file = file_path(id); // sent from the disk as it is read
    return r;
}

reply batch_jobs::remove_file(const std::string& id, const query_map& query, const principal& who) {
    if (auto r = unknown_param(query, {})) return *r;
    std::lock_guard lock(mu_);
    const auto it = files_.find(id);
    if (it == files_.end() || !who.may_see(it->second.owner)) return not_found("file", id);
    return delete_file(id);
}

reply batch_jobs::batch(const std::string& id, bool cancel, const query_map& query, const principal& who) {
    if (auto r = unknown_param(query, {})) return *r;
    std::lock_guard lock(mu_);
    const auto it = jobs_.find(id);
    if (it == jobs_.end() || !who.may_see(it->second->owner)) return not_found("batch", id);
    return cancel ? cancel_batch(id) : reply::of_json(it->second->batch);
}

reply batch_jobs::upload(std::string_view content_type, std::string_view body, const principal& who) {
    std::string why;
    const auto parts = parse_multipart(content_type, body, why);
    if (!parts) return bad_request(why);
    const form_part* file = nullptr;
    std::string purpose;
    for (const form_part& p : *parts) {
        if (p.name == "file") {
            file = &p;
        } else if (p.name == "purpose") {
            purpose = p.data;
        } else {
            return bad_request(fmt::format("unknown form field '{}': Tandem does not support it", p.name), p.name);
        }
    }
    if (!file) return bad_request("missing the form field 'file'", "file");
    if (purpose.empty()) return bad_request("missing the form field 'purpose'", "purpose");
    if (purpose != "batch")
        return bad_request(fmt::format("purpose '{}' is not supported: Tandem keeps files for batch jobs (purpose \"batch\")",
                               purpose),
                   "purpose");
    if (int64_t(file->data.size()) > s_.max_file_bytes)
        return reply::of(api_error{413, fmt::format("the file is larger than {} bytes (max_file_bytes)", s_.max_file_bytes),
                                   "invalid_request_error", "file", "request_too_large"});
    std::string filename = file->filename.empty() ? "upload.jsonl" : file->filename;
    if (filename.size() > 255) filename.resize(255);
    std::lock_guard lock(mu_);
    if (int64_t(files_.size()) >= s_.max_files)
        return bad_request(fmt::format("this daemon keeps at most {} files (max_files): delete some first", s_.max_files));
    const std::string id = new_id("file-");
    write_atomic(file_path(id), file->data);
    json f{{"id", id},           {"object", "file"}, {"bytes", int64_t(file->data.size())},
           {"created_at", now_unix()}, {"filename", filename}, {"purpose", purpose},
           {"status", "processed"}, {"expires_at", nullptr}, {"status_details", nullptr}};
    save_file(id, f, who.owner);
    return reply::of_json(f);
}

void batch_jobs::save_file(const std::string& id, json object, const std::string& owner) {
    json stored = object;
    stored["owner"] = owner;
    write_atomic(file_path(id) + ".json", stored.dump());
    files_[id] = {std::move(object), owner};
}

reply batch_jobs::delete_file(const std::string& id) {
    for (const auto& [bid, j] : jobs_)
        if (j->batch["input_file_id"] == id && unfinished(j->batch["status"].get<std::string>()))
            return reply::of(api_error{409, fmt::format("file {} is the input of batch {}, which has not finished", id, bid),
                                       "invalid_request_error", "", "conflict"});
    std::error_code ec;
    fs::remove(file_path(id) + ".json", ec);
    fs::remove(file_path(id), ec);
    files_.erase(id);
    return reply::of_json({{"id", id}, {"object", "file"}, {"deleted", true}});
}

reply batch_jobs::create_batch(const std::string& body, const principal& who) {
    auto parsed = parse_request_body(body, s_.max_json_depth);
    if (auto* e = std::get_if<api_error>(&parsed)) return reply::of(*e);
    const json& req = std::get<json>(parsed);
    for (const auto& [k, v] : req.items())
        if (k != "input_file_id" && k != "endpoint" && k != "completion_window" && k != "metadata")
            return bad_request(fmt::format("unknown field '{}': Tandem does not support it", k), k);
    for (const char* k : {"input_file_id", "endpoint", "completion_window"})
        if (!req.contains(k) || !req[k].is_string()) return bad_request(fmt::format("'{}' must be a string", k), k);
    const std::string endpoint = req["endpoint"];
    if (std::find(std::begin(batch::routes), std::end(batch::routes), endpoint) == std::end(batch::routes))
        return bad_request(fmt::format("endpoint '{}' is not supported: one of /v1/chat/completions, /v1/completions, "
                               "/v1/embeddings",
                               endpoint),
                   "endpoint");
    if (req["completion_window"] != "24h") return bad_request("completion_window must be \"24h\"", "completion_window");
    json metadata = req.value("metadata", json());
    if (!metadata.is_null()) {
        if (!metadata.is_object() || metadata.size() > 16) return bad_request("metadata must be an object of at most 16 keys", "metadata");
        for (const auto& [k, v] : metadata.items())
            if (k.size() > 64 || !v.is_string() || v.get<std::string>().size() > 512)
                return bad_request("metadata keys are strings of at most 64 characters, values of at most 512", "metadata");
    }
    std::lock_guard lock(mu_);
    const std::string input = req["input_file_id"];
    const auto f = files_.find(input);
    if (f == files_.end() || !who.may_see(f->second.owner)) return not_found("file", input);
    if (f->second.object["purpose"] != "batch")
        return bad_request(fmt::format("file {} has purpose {}: a batch's input has purpose batch", input,
                               f->second.object["purpose"].get<std::string>()),
                   "input_file_id");
    const std::string id = new_id("batch_");
    const int64_t now = now_unix();
    auto j = std::make_unique<job>();
    j->batch = json{{"id", id},
                    {"object", "batch"},
                    {"endpoint", endpoint},
                    {"errors", nullptr},
                    {"input_file_id", input},
                    {"completion_window", "24h"},
                    {"status", "validating"},
                    {"output_file_id", nullptr},
                    {"error_file_id", nullptr},
                    {"created_at", now},
                    {"in_progress_at", nullptr},
                    {"expires_at", now + 24 * 3600},
                    {"finalizing_at", nullptr},
                    {"completed_at", nullptr},
                    {"failed_at", nullptr},
                    {"expired_at", nullptr},
                    {"cancelling_at", nullptr},
                    {"cancelled_at", nullptr},
                    {"request_counts", {{"total", 0}, {"completed", 0}, {"failed", 0}}},
                    {"metadata", metadata}};
    j->owner = who.owner;
    jobs_[id] = std::move(j);
    save_job(id);
    cv_.notify_all();
    return reply::of_json(jobs_[id]->batch);
}

reply batch_jobs::list_batches(const query_map& query, const principal& who) {
    if (auto r = unknown_param(query, {"limit", "after"})) return *r;
    std::vector<json> items;
    {
        std::lock_guard lock(mu_);
        for (const auto& [id, j] : jobs_)
            if (who.may_see(j->owner)) items.push_back(j->batch);
    }
    auto r = page(std::move(items), query, false);
    if (auto* err = std::get_if<reply>(&r)) return *err;
    return reply::of_json(std::get<json>(r));
}

reply batch_jobs::cancel_batch(const std::string& id) {
    job& j = *jobs_.at(id);
    const std::string status = j.batch["status"];
    if (status == "cancelling") return reply::of_json(j.batch);
    if (status != "validating" && status != "in_progress")
        return reply::of(api_error{409, fmt::format("batch {} is {}: it cannot be cancelled", id, status),
                                   "invalid_request_error", "", "conflict"});
    j.batch["status"] = "cancelling";
    j.batch["cancelling_at"] = now_unix();
    j.cancel = true;
    if (running_ == id) {
        save_job(id); // the runner ends it once the lines in flight are answered
    } else {
        finalize(id, "cancelled");
    }
    return reply::of_json(j.batch);
}

void batch_jobs::save_job(const std::string& id) {
    const job& j = *jobs_.at(id);
    write_atomic(job_path(id, ".json"), json{{"batch", j.batch}, {"final", j.final_status}, {"owner", j.owner}}.dump());
}

void batch_jobs::finalize(const std::string& id, const std::string& status) {
    job& j = *jobs_.at(id);
    json& b = j.batch;
    const std::pair<const char*, const char*> results[] = {{"output_file_id", ".output.jsonl"},
                                                          {"error_file_id", ".errors.jsonl"}};
    if (j.final_status.empty()) {
        // The ids first, saved: a restart from here on finishes the same way.
        j.final_status = status;
        b["status"] = "finalizing";
        b["finalizing_at"] = now_unix();
        for (const auto& [key, suffix] : results)
            if (file_size(job_path(id, suffix)) > 0) b[key] = new_id("file-");
        save_job(id);
    }
    for (const auto& [key, suffix] : results) {
        const std::string partial = job_path(id, suffix);
        if (b[key].is_string()) {
            const std::string fid = b[key];
            std::error_code ec;
            if (!fs::exists(file_path(fid))) {
                fs::rename(partial, file_path(fid), ec);
                if (ec) throw error(fmt::format("cannot move {}: {}", partial, ec.message()));
                sync_dir(s_.dir + "/files");
            }
            if (!files_.contains(fid)) {
                json f{{"id", fid},
                       {"object", "file"},
                       {"bytes", std::max<int64_t>(0, file_size(file_path(fid)))},
                       {"created_at", now_unix()},
                       {"filename", id + (std::string_view(key) == "output_file_id" ? "_output.jsonl" : "_error.jsonl")},
                       {"purpose", "batch_output"},
                       {"status", "processed"},
                       {"expires_at", nullptr},
                       {"status_details", nullptr}};
                save_file(fid, std::move(f), j.owner); // the batch's results are its owner's
            }
        }
        std::error_code ec;
        fs::remove(partial, ec); // (an empty one)
    }
    b["status"] = j.final_status;
    b[j.final_status + "_at"] = now_unix();
    save_job(id);
    logger("batch")->info("batch {} {}: {} of {} requests completed, {} failed", id, j.final_status,
                          b["request_counts"]["completed"].get<int64_t>(), b["request_counts"]["total"].get<int64_t>(),
                          b["request_counts"]["failed"].get<int64_t>());
}

void batch_jobs::run() {
    auto log = logger("batch");
    while (true) {
        std::string id;
        {
            std::unique_lock lock(mu_);
            if (stop_) return;
            // The oldest unfinished job.
            const json* oldest = nullptr;
            for (const auto& [jid, j] : jobs_) {
                if (!unfinished(j->batch["status"].get<std::string>())) continue;
                if (!oldest || j->batch["created_at"] < (*oldest)["created_at"] ||
                    (j->batch["created_at"] == (*oldest)["created_at"] && jid < (*oldest)["id"].get<std::string>()))
                    oldest = &j->batch;
            }
            if (!oldest) {
                cv_.wait_for(lock, std::chrono::seconds(5));
                continue;
            }
            id = (*oldest)["id"];
            running_ = id;
        }
        bool again = false;
        try {
            again = run_job(id);
        } catch (const std::exception& e) {
            log->error("batch {} failed: {}", id, e.what());
            std::lock_guard lock(mu_);
            try {
                json& b = jobs_.at(id)->batch;
                b["errors"] = {{"object", "list"},
                               {"data", json::array({{{"code", "internal_error"}, {"message", e.what()},
                                                      {"param", nullptr}, {"line", nullptr}}})}};
                finalize(id, "failed");
            } catch (const std::exception& e2) {
                log->error("batch {}: cannot record the failure: {}", id, e2.what());
                again = true;
            }
        }
        std::unique_lock lock(mu_);
        running_.clear();
        if (again) cv_.wait_for(lock, std::chrono::seconds(1), [&] { return bool(stop_); });
    }
}

bool batch_jobs::run_job(const std::string& id) {
    job* j = nullptr;
    json b;
    {
        std::lock_guard lock(mu_);
        j = jobs_.at(id).get();
        b = j->batch;
        if (b["status"] == "finalizing") {
            finalize(id, j->final_status.empty() ? "completed" : j->final_status);
            return false;
        }
        if (j->cancel) {
            finalize(id, "cancelled");
            return false;
        }
        if (now_unix() >= b["expires_at"].get<int64_t>()) {
            finalize(id, "expired");
            return false;
        }
        const std::string input = b["input_file_id"];
        if (!files_.contains(input)) throw error(fmt::format("its input file {} is gone", input));
    }
    const std::string text = batch::read_file(file_path(b["input_file_id"]));
    const std::string endpoint = b["endpoint"];
    auto fail = [&](const std::string& code, const std::string& message) {
        std::lock_guard lock(mu_);
        j->batch["errors"] = {{"object", "list"},
                              {"data", json::array({{{"code", code}, {"message", message}, {"param", nullptr},
                                                     {"line", nullptr}}})}};
        finalize(id, "failed");
        return false;
    };
    batch::input in;
    try {
        in = batch::read_input(text, s_.max_json_depth);
    } catch (const error& e) {
        return fail("invalid_file", e.what());
    }
    // Lines for another endpoint are errors of their own, as malformed lines are.
    std::vector<batch::request_line> requests;
    for (batch::request_line& r : in.requests) {
        if (r.url == endpoint) {
            requests.push_back(std::move(r));
            continue;
        }
        in.errors.push_back({r.line, r.custom_id, "invalid_url",
                             fmt::format("line {}: url {} is not the batch's endpoint {}", r.line, r.url, endpoint)});
    }
    const int64_t total = int64_t(requests.size() + in.errors.size());
    if (total == 0) return fail("empty_file", "the input file holds no request");

    const std::string out_path = job_path(id, ".output.jsonl"), err_path = job_path(id, ".errors.jsonl");
    const batch::done_set out_done = batch::read_done(out_path), err_done = batch::read_done(err_path);
    batch::output_file out(out_path, out_done.whole_bytes, 0600, 0600), errs(err_path, err_done.whole_bytes, 0600, 0600);
    int64_t completed = int64_t(out_done.size()), failed = int64_t(err_done.size()); // (under mu_)
    const int64_t before = completed + failed;
    // The counts in the batch object as answers come; on disk at most every second (a restart
    // counts the files again).
    auto count = [&](int64_t ok, int64_t bad) {
        completed += ok;
        failed += bad;
        j->batch["request_counts"] = {{"total", total}, {"completed", completed}, {"failed", failed}};
    };
    auto save = [&] {
        std::lock_guard lock(mu_);
        save_job(id);
    };
    int64_t new_errors = 0;
    for (const batch::line_error& e : in.errors) {
        if (out_done.has(e) || err_done.has(e)) continue;
        errs.write(batch::error_line(e));
        ++new_errors;
    }
    std::vector<batch::request_line> todo;
    for (batch::request_line& r : requests) {
        if (out_done.has(r) || err_done.has(r)) continue;
        if (!r.body.contains("priority")) r.body["priority"] = -1; // background work: live requests go first
        todo.push_back(std::move(r));
    }
    batch::sort_by_prefix(todo);
    {
        std::lock_guard lock(mu_);
        if (j->batch["status"] == "validating") {
            j->batch["status"] = "in_progress";
            j->batch["in_progress_at"] = now_unix();
        }
        count(0, new_errors);
        save_job(id);
    }
    logger("batch")->info("batch {}: {} requests, {} answered before, {} to send", id, total, before, todo.size());

    std::atomic<bool> halt{false};
    const int64_t expires_at = b["expires_at"].get<int64_t>();
    const ipc::client c(s_.socket);
    batch::sender snd(
        c, todo,
        [&](const batch::request_line& r, int status, const std::string& body) {
            const bool ok = status >= 200 && status < 300;
            (ok ? out : errs).write(batch::result_line(r.custom_id, status, body));
            std::lock_guard lock(mu_);
            count(ok, !ok);
        },
        halt, s_.wait_s);
    if (!todo.empty()) snd.run(std::max(1, std::min(s_.concurrency, int(todo.size()))));
    auto saved = std::chrono::steady_clock::now();
    while (!todo.empty() && !snd.wait_for(std::chrono::milliseconds(200))) {
        if (stop_ || j->cancel || now_unix() >= expires_at) halt = true;
        if (std::chrono::steady_clock::now() - saved > std::chrono::seconds(1)) {
            save();
            saved = std::chrono::steady_clock::now();
        }
    }
    snd.join();
    out.sync();
    errs.sync();
    save();
    if (stop_) return false; // the daemon stops: the job goes on at the next start
    std::lock_guard lock(mu_);
    if (j->cancel) {
        finalize(id, "cancelled");
    } else if (now_unix() >= expires_at) {
        finalize(id, "expired");
    } else if (snd.left() > 0) {
        return true; // refused as busy past the wait, or a connection broke: again shortly
    } else {
        finalize(id, "completed");
    }
    return false;
}

} // namespace tandem::daemon
