// `tandem pull`: names to files, the hub's tree API, and resumable, verified downloads.
#include "daemon/hub.hpp"

#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"

#include <curl/curl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <memory>
#include <sys/file.h>
#include <thread>
#include <unistd.h>

namespace tandem::daemon::hub {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

bool is_sha256(std::string_view s) {
    return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string size_text(double b) {
    if (b < 1024) return fmt::format("{:.0f} B", b);
    if (b < 1024.0 * 1024) return fmt::format("{:.1f} KiB", b / 1024);
    if (b < 1024.0 * 1024 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
    return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
}

std::string duration_text(double s) {
    if (s < 0 || s > 1e6) return "--:--";
    const int64_t t = int64_t(s + 0.5);
    return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{}:{:02}", t / 60, t % 60);
}

} // namespace

std::optional<reference> parse_reference(std::string_view text, std::string* error) {
    const auto bad = [&](const std::string& why) {
        if (error) *error = fmt::format("'{}': {}", text, why);
        return std::nullopt;
    };
    std::string_view s = text;
    for (std::string_view prefix : {"https://", "http://"})
        if (s.starts_with(prefix)) s.remove_prefix(prefix.size());
    for (std::string_view host : {"hf.co/", "huggingface.co/", "www.huggingface.co/"})
        if (s.starts_with(host)) s.remove_prefix(host.size());
    while (s.ends_with('/')) s.remove_suffix(1);
    std::vector<std::string> parts;
    for (size_t start = 0; start <= s.size();) {
        const size_t slash = s.find('/', start);
        parts.emplace_back(s.substr(start, slash == s.npos ? s.npos : slash - start));
        if (slash == s.npos) break;
        start = slash + 1;
    }
    if (parts.size() < 2 || parts[0].empty() || parts[1].empty())
        return bad("expected org/repo, org/repo:QUANT or org/repo/FILE.gguf");
    reference r;
    std::string repo_name = parts[1];
    if (const size_t colon = repo_name.find(':'); colon != std::string::npos) {
        r.quant = repo_name.substr(colon + 1);
        repo_name.resize(colon);
        if (r.quant.empty() || parts.size() > 2) return bad("a ':QUANT' goes at the end of org/repo");
    }
    r.repo = parts[0] + "/" + repo_name;
    if (auto err = check_model_name(r.repo)) return bad("not a repository name");
    size_t rest = 2;
    if (parts.size() > 3 && (parts[2] == "resolve" || parts[2] == "blob" || parts[2] == "tree")) {
        r.revision = parts[3];
        rest = 4;
    }
    for (size_t i = rest; i < parts.size(); ++i) r.file += (r.file.empty() ? "" : "/") + parts[i];
    if (!r.file.empty() && !lower(r.file).ends_with(".gguf")) {
        if (rest == 4 && parts[2] == "tree") { // a folder of the repository: its quant picks
            r.file.clear();
        } else {
            return bad("a file to pull is a .gguf");
        }
    }
    for (const std::string& p : parts)
        if (p == ".." || p == ".") return bad("no '.' or '..' in a path");
    if (r.revision.empty()) return bad("an empty revision");
    return r;
}

std::vector<repo_file> parse_tree(std::string_view json_text) {
    const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    TANDEM_CHECK(j.is_array(), "the hub's tree listing is not a JSON array");
    std::vector<repo_file> out;
    for (const auto& e : j) {
        if (!e.is_object() || e.value("type", "") != "file" || !e.contains("path") || !e["path"].is_string()) continue;
        repo_file f;
        f.path = e["path"].get<std::string>();
        // A path that would leave the repository's folder in the store is not a file to pull.
        const fs::path p(f.path);
        if (f.path.empty() || p.is_absolute() || f.path.find('\\') != std::string::npos ||
            f.path.find("//") != std::string::npos ||
            std::any_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".." || c == "." || c.empty(); }))
            continue;
        if (e.contains("size") && e["size"].is_number_integer()) f.size = e["size"].get<int64_t>();
        if (e.contains("lfs") && e["lfs"].is_object()) {
            const auto& lfs = e["lfs"];
            // the tree names it "oid"; the model info's siblings "sha256"
            for (const char* key : {"oid", "sha256"})
                if (lfs.contains(key) && lfs[key].is_string()) f.sha256 = lower(lfs[key].get<std::string>());
            if (lfs.contains("size") && lfs["size"].is_number_integer()) f.size = lfs["size"].get<int64_t>();
        }
        out.push_back(std::move(f));
    }
    return out;
}

selection select_files(const reference& ref, const std::vector<repo_file>& tree) {
    selection sel;
    // Models: .gguf files (not a vision projector), split parts grouped by their first part's name.
    struct model {
        std::string quant;
        std::vector<repo_file> parts;
        int count = 0;
    };
    std::map<std::string, model> models; // by the path without the split suffix
    for (const repo_file& f : tree) {
        const std::string base = fs::path(f.path).filename().string();
        if (!lower(base).ends_with(".gguf") || lower(base).starts_with("mmproj")) continue;
        const split_part sp = split_of_file_name(f.path);
        std::string key = f.path;
        if (sp.count > 0) key = f.path.substr(0, f.path.rfind('-', f.path.rfind("-of-") - 1));
        model& m = models[key];
        m.quant = quant_of_file_name(f.path);
        m.count = std::max(sp.count, 1);
        m.parts.push_back(f);
    }
    std::string have;
    for (const auto& [key, m] : models)
        have += fmt::format("{}{}{}", have.empty() ? "" : ", ", fs::path(key).filename().string(),
                            m.count > 1 ? fmt::format(" ({} parts)", m.count) : "");
    if (models.empty()) {
        sel.error = fmt::format("{} has no GGUF files", ref.repo);
        return sel;
    }
    std::vector<const model*> hits;
    if (!ref.file.empty()) {
        const split_part sp = split_of_file_name(ref.file);
        const std::string key = sp.count > 0 ? ref.file.substr(0, ref.file.rfind('-', ref.file.rfind("-of-") - 1)) : ref.file;
        for (const auto& [k, m] : models)
            if (k == key) hits.push_back(&m);
        if (hits.empty()) {
            sel.error = fmt::format("{} has no file {} (it has {})", ref.repo, ref.file, have);
            return sel;
        }
    } else if (!ref.quant.empty()) {
        for (const auto& [k, m] : models)
            if (lower(m.quant) == lower(ref.quant)) hits.push_back(&m);
        if (hits.empty()) {
            sel.error = fmt::format("{} has no {} file (it has {})", ref.repo, ref.quant, have);
            return sel;
        }
    } else {
        // The default: Q4_K_M; else the only model; else the first of a few common choices.
        for (const char* q : {"Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q6_K", "Q8_0"}) {
            for (const auto& [k, m] : models)
                if (m.quant == q) hits.push_back(&m);
            if (!hits.empty()) break;
        }
        if (hits.empty() && models.size() == 1) hits.push_back(&models.begin()->second);
        if (hits.empty()) {
            sel.error = fmt::format("{}: which one? pull org/repo:QUANT or org/repo/FILE.gguf (it has {})", ref.repo, have);
            return sel;
        }
    }
    if (hits.size() > 1) {
        std::string names;
        for (const model* m : hits) names += (names.empty() ? "" : ", ") + m->parts.front().path;
        sel.error = fmt::format("{}{}: several files match ({}): name one, org/repo/FILE.gguf", ref.repo,
                                ref.quant.empty() ? "" : ":" + ref.quant, names);
        return sel;
    }
    const model& m = *hits.front();
    std::vector<repo_file> parts = m.parts;
    std::sort(parts.begin(), parts.end(), [](const repo_file& a, const repo_file& b) {
        return split_of_file_name(a.path).index < split_of_file_name(b.path).index;
    });
    if (int(parts.size()) != m.count) {
        sel.error = fmt::format("{}: the split model {} lists {} of its {} parts", ref.repo, parts.front().path,
                                parts.size(), m.count);
        return sel;
    }
    sel.files = std::move(parts);
    sel.quant = m.quant;
    return sel;
}

std::string store_name(const reference& ref, const selection& sel) {
    if (!sel.quant.empty()) return ref.repo + ":" + sel.quant;
    std::string stem = fs::path(sel.files.front().path).stem().string();
    if (split_of_file_name(sel.files.front().path).count > 0) stem = stem.substr(0, stem.rfind('-', stem.rfind("-of-") - 1));
    for (char& c : stem)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
    if (stem.empty() || stem.front() == '.') stem.insert(0, "m");
    return ref.repo + ":" + stem;
}

namespace {

// One libcurl easy handle with the hub's settings: redirects followed (libcurl sends the
// Authorization header only to the host it was given for), proxies from the environment.
struct curl_deleter {
    void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct slist_deleter {
    void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

struct response_headers {
    std::map<std::string, std::string> first; // each header's first value over the redirect chain (lower-case names)
    std::string link;                         // the last response's Link
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
    auto* h = static_cast<response_headers*>(user);
    const std::string_view line(data, size * n);
    if (const size_t colon = line.find(':'); colon != line.npos) {
        std::string name = lower(line.substr(0, colon));
        std::string_view v = line.substr(colon + 1);
        while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
        if (name == "link") h->link = v;
        h->first.emplace(std::move(name), std::string(v));
    } else if (line.starts_with("HTTP/")) {
        h->link.clear();
    }
    return size * n;
}

struct session {
    std::string endpoint, token;
    std::unique_ptr<curl_slist, slist_deleter> headers;

    session(const pull_options& o) {
        static const bool global = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
        TANDEM_CHECK(global, "libcurl did not initialize");
        const char* env_endpoint = std::getenv("HF_ENDPOINT");
        endpoint = !o.endpoint.empty() ? o.endpoint : env_endpoint && *env_endpoint ? env_endpoint : "https://huggingface.co";
        while (endpoint.ends_with('/')) endpoint.pop_back();
        const char* env_token = std::getenv("HF_TOKEN");
        token = !o.token.empty() ? o.token : env_token ? env_token : "";
        curl_slist* l = nullptr;
        if (!token.empty()) l = curl_slist_append(l, ("Authorization: Bearer " + token).c_str());
        headers.reset(l);
    }

    std::unique_ptr<CURL, curl_deleter> handle(const std::string& url, response_headers& h) const {
        std::unique_ptr<CURL, curl_deleter> c(curl_easy_init());
        TANDEM_CHECK(c, "libcurl: no handle");
        CURL* e = c.get();
        curl_easy_setopt(e, CURLOPT_URL, url.c_str());
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_MAXREDIRS, 10L);
        curl_easy_setopt(e, CURLOPT_UNRESTRICTED_AUTH, 0L);
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_USERAGENT, "tandem/" TANDEM_VERSION);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 30L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L); // a stalled transfer: nothing for a minute
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &h);
        return c;
    }

    // Percent-encodes a URL path (a revision such as refs/pr/1 is one segment: keep_slash false).
    std::string escape(std::string_view s, bool keep_slash = true) const {
        std::string out;
        for (char c : s) {
            if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '~' ||
                (c == '/' && keep_slash))
                out.push_back(c);
            else
                out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
        }
        return out;
    }
};

size_t append_body(char* data, size_t size, size_t n, void* user) {
    auto* body = static_cast<std::string*>(user);
    if (body->size() + size * n > (64u << 20)) return 0; // a listing is never that large
    body->append(data, size * n);
    return size * n;
}

// What an HTTP error from the hub means for a pull.
std::string status_text(long status, const std::string& url, const session& s) {
    if (status == 401)
        return fmt::format("{}: 401: the hub wants a token{}", url, s.token.empty() ? " (set HF_TOKEN)" : " (HF_TOKEN was refused)");
    if (status == 403) return fmt::format("{}: 403: not allowed (a gated model: accept its terms on the hub, and set HF_TOKEN)", url);
    if (status == 404) return fmt::format("{}: 404: no such repository, revision or file{}", url, s.token.empty() ? " (a private one needs HF_TOKEN)" : "");
    return fmt::format("{}: HTTP {}", url, status);
}

// Every file of the repository at `revision` (following the listing's pages).
std::vector<repo_file> list_tree(const session& s, const reference& ref) {
    std::vector<repo_file> all;
    std::string url = fmt::format("{}/api/models/{}/tree/{}?recursive=true", s.endpoint, s.escape(ref.repo),
                                  s.escape(ref.revision, /*keep_slash=*/false));
    for (int page = 0; page < 1000 && !url.empty(); ++page) {
        response_headers h;
        std::string body;
        auto c = s.handle(url, h);
        curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, append_body);
        curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &body);
        const CURLcode rc = curl_easy_perform(c.get());
        TANDEM_CHECK(rc == CURLE_OK, "{}: {}", url, curl_easy_strerror(rc));
        long status = 0;
        curl_easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &status);
        TANDEM_CHECK(status == 200, "{}", status_text(status, url, s));
        std::vector<repo_file> files = parse_tree(body);
        all.insert(all.end(), files.begin(), files.end());
        // Link: <URL>; rel="next"
        url.clear();
        if (h.link.find("rel=\"next\"") != std::string::npos) {
            const size_t open = h.link.find('<'), close = h.link.find('>');
            if (open != std::string::npos && close > open) url = h.link.substr(open + 1, close - open - 1);
        }
    }
    return all;
}

// Progress of one file: a bar redrawn in place on a terminal, else a line a second; the speed
// over the last five seconds, and at the end the whole download's.
class progress_meter {
public:
    progress_meter(std::string name, int64_t total, int mode) : name_(std::move(name)), total_(total), mode_(mode) {}
    void update(int64_t done) {
        const auto now = std::chrono::steady_clock::now();
        if (mode_ == 0) return;
        if (samples_.empty()) start_ = {now, done};
        if (samples_.empty() || now - samples_.back().first > std::chrono::milliseconds(250))
            samples_.emplace_back(now, done);
        while (samples_.size() > 1 && now - samples_.front().first > std::chrono::seconds(5)) samples_.pop_front();
        const auto period = mode_ == 1 ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1000);
        if (now - start_.first < period || now - last_shown_ < period) return;
        last_shown_ = now;
        const double dt = std::chrono::duration<double>(now - samples_.front().first).count();
        const double speed = dt > 0 ? double(done - samples_.front().second) / dt : 0;
        show(done, speed, speed > 0 && total_ > 0 ? double(total_ - done) / speed : -1);
    }
    void finish(int64_t done) {
        if (mode_ == 0) return;
        const double dt = samples_.empty() ? 0 : std::chrono::duration<double>(std::chrono::steady_clock::now() - start_.first).count();
        const double speed = dt > 0 ? double(done - start_.second) / dt : 0;
        if (mode_ == 1) show(done, speed, 0);
        std::fprintf(stderr, "%spull: %s %s in %.1f s (%s/s)\n", mode_ == 1 ? "\r\033[K" : "", name_.c_str(),
                     size_text(double(done)).c_str(), dt, size_text(speed).c_str());
        std::fflush(stderr);
    }

private:
    void show(int64_t done, double speed, double left) {
        const double pct = total_ > 0 ? 100.0 * double(done) / double(total_) : 0;
        if (mode_ == 1) {
            const int width = 24, filled = std::clamp(int(pct / 100 * width), 0, width);
            std::fprintf(stderr, "\r\033[K%s %3.0f%% [%s%s] %s / %s  %s/s  %s left", name_.c_str(), pct,
                         std::string(size_t(filled), '#').c_str(), std::string(size_t(width - filled), '.').c_str(),
                         size_text(double(done)).c_str(), size_text(double(total_)).c_str(), size_text(speed).c_str(),
                         duration_text(left).c_str());
        } else {
            std::fprintf(stderr, "pull: %s %.0f%% %s of %s, %s/s, %s left\n", name_.c_str(), pct,
                         size_text(double(done)).c_str(), size_text(double(total_)).c_str(), size_text(speed).c_str(),
                         duration_text(left).c_str());
        }
        std::fflush(stderr);
    }

    std::string name_;
    int64_t total_;
    int mode_;
    std::pair<std::chrono::steady_clock::time_point, int64_t> start_;
    std::chrono::steady_clock::time_point last_shown_;
    std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> samples_;
};

struct sha256_ctx {
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
    sha256_ctx() { reset(); }
    void reset() { TANDEM_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "sha256: cannot start"); }
    void add(const void* p, size_t n) { EVP_DigestUpdate(ctx.get(), p, n); }
    std::string hex() {
        unsigned char md[32];
        unsigned int n = 0;
        EVP_DigestFinal_ex(ctx.get(), md, &n);
        std::string out;
        for (unsigned i = 0; i < n; ++i) out += fmt::format("{:02x}", md[i]);
        return out;
    }
};

// Hashes the first `n` bytes of fd into h.
void hash_prefix(int fd, int64_t n, sha256_ctx& h) {
    std::vector<char> buf(1 << 20);
    for (int64_t off = 0; off < n;) {
        const ssize_t got = ::pread(fd, buf.data(), size_t(std::min<int64_t>(n - off, int64_t(buf.size()))), off);
        TANDEM_CHECK(got > 0, "cannot read back the partial download");
        h.add(buf.data(), size_t(got));
        off += got;
    }
}

// One download attempt's state, shared with libcurl's callbacks.
struct transfer {
    CURL* curl = nullptr;
    int fd = -1;
    int64_t offset = 0;                // bytes in the file before this attempt
    int64_t written = 0;               // bytes this attempt wrote
    bool started = false, restarted = false, write_failed = false, bad_range = false;
    long status = 0;
    const response_headers* headers = nullptr;
    std::string error_body;
    sha256_ctx* hash = nullptr;
    progress_meter* meter = nullptr;
};

size_t on_data(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<transfer*>(user);
    const size_t len = size * n;
    if (!t->started) {
        t->started = true;
        curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->status);
        if (t->status == 200 && t->offset > 0) { // the server ignored Range: start over
            if (::ftruncate(t->fd, 0) != 0) return 0;
            t->offset = 0;
            t->hash->reset();
            t->restarted = true;
        }
        if (t->status == 206) { // the part asked for, or none of it
            const auto cr = t->headers->first.find("content-range");
            if (cr == t->headers->first.end() || !cr->second.starts_with(fmt::format("bytes {}-", t->offset))) {
                t->bad_range = true;
                return 0;
            }
        }
    }
    if (t->status != 200 && t->status != 206) {
        if (t->error_body.size() < 4096) t->error_body.append(data, std::min<size_t>(len, 4096));
        return len;
    }
    for (size_t done = 0; done < len;) {
        const ssize_t w = ::pwrite(t->fd, data + done, len - done, t->offset + t->written + int64_t(done));
        if (w <= 0) {
            t->write_failed = true;
            return 0;
        }
        done += size_t(w);
    }
    t->hash->add(data, len);
    t->written += int64_t(len);
    if (t->meter) t->meter->update(t->offset + t->written);
    return len;
}

struct fetched {
    std::string sha256;
    std::string commit;                // X-Repo-Commit
};

// Downloads one file to `final_path` through FINAL.partial (resumed when there is one),
// checked against its size and sha256.
fetched fetch_file(const session& s, const reference& ref, const repo_file& file, const fs::path& final_path,
                   const model_store& store, const pull_options& o) {
    fs::create_directories(final_path.parent_path());
    const fs::path partial = final_path.string() + ".partial";
    const int fd = ::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TANDEM_CHECK(fd >= 0, "{}: cannot open: {}", partial.string(), std::strerror(errno));
    struct closer {
        int fd;
        ~closer() { ::close(fd); }
    } close_fd{fd};
    TANDEM_CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0, "{}: another pull is downloading it", partial.string());

    const std::string url =
        fmt::format("{}/{}/resolve/{}/{}", s.endpoint, s.escape(ref.repo), s.escape(ref.revision, false), s.escape(file.path));
    sha256_ctx hash;
    int64_t have = int64_t(::lseek(fd, 0, SEEK_END));
    if (file.size > 0 && have > file.size) {
        TANDEM_CHECK(::ftruncate(fd, 0) == 0, "{}: cannot truncate", partial.string());
        have = 0;
    }
    if (have > 0) {
        logger("pull")->info("{}: resuming at {} of {}", file.path, size_text(double(have)), size_text(double(file.size)));
        hash_prefix(fd, have, hash);
    }
    const int mode = o.progress >= 0 ? o.progress : (::isatty(2) ? 1 : 2);
    progress_meter meter(fs::path(file.path).filename().string(), file.size, mode);
    response_headers h;
    for (int attempt = 0;; ++attempt) {
        transfer t;
        t.fd = fd;
        t.offset = have;
        t.hash = &hash;
        t.meter = &meter;
        response_headers this_h;
        auto c = s.handle(url, this_h);
        t.curl = c.get();
        t.headers = &this_h;
        curl_easy_setopt(c.get(), CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(c.get(), CURLOPT_WRITEDATA, &t);
        const std::string range = fmt::format("{}-", have);
        if (have > 0) curl_easy_setopt(c.get(), CURLOPT_RANGE, range.c_str());
        const CURLcode rc = curl_easy_perform(c.get());
        if (h.first.empty()) h = this_h;
        if (t.status == 0) curl_easy_getinfo(c.get(), CURLINFO_RESPONSE_CODE, &t.status);
        have = t.offset + t.written;
        TANDEM_CHECK(!t.write_failed, "{}: cannot write: {}", partial.string(), std::strerror(errno));
        if (t.bad_range) { // a 206 of another range than asked: start over
            TANDEM_CHECK(attempt < o.retries, "{}: the server sent another range than bytes={}-", file.path, t.offset);
            TANDEM_CHECK(::ftruncate(fd, 0) == 0, "{}: cannot truncate", partial.string());
            have = 0;
            hash.reset();
            continue;
        }
        if (rc == CURLE_OK && t.status == 416 && have == file.size) break; // it was all there
        if (rc == CURLE_OK && t.status == 416) {               // the partial is not a prefix of it
            TANDEM_CHECK(::ftruncate(fd, 0) == 0, "{}: cannot truncate", partial.string());
            have = 0;
            hash.reset();
            continue;
        }
        const bool busy = t.status == 429 || t.status >= 500; // the hub or its storage, for now
        if (rc == CURLE_OK && t.status != 200 && t.status != 206 && (!busy || attempt >= o.retries))
            fail("{}", status_text(t.status, url, s));
        if (rc == CURLE_OK && !busy) break;
        // A dropped or stalled connection: resume from what arrived, a few times.
        TANDEM_CHECK(attempt < o.retries, "{}: {} after {} of {} (the partial download {} resumes on the next pull)",
                     file.path, curl_easy_strerror(rc), size_text(double(have)), size_text(double(file.size)),
                     partial.string());
        logger("pull")->warn("{}: {} at {}; resuming", file.path,
                             rc == CURLE_OK ? fmt::format("HTTP {}", t.status) : std::string(curl_easy_strerror(rc)),
                             size_text(double(have)));
        std::this_thread::sleep_for(std::chrono::milliseconds(250 << std::min(attempt, 4)));
    }
    meter.finish(have);

    fetched out;
    out.sha256 = hash.hex();
    out.commit = h.first.count("x-repo-commit") ? h.first["x-repo-commit"] : "";
    // What the hub says the file is: the tree's LFS oid, else the resolve route's headers.
    // (the resolve route's X-Linked-Etag is the LFS oid too: two different ones are an error)
    std::string expected = file.sha256, header;
    for (const char* name : {"x-linked-etag", "etag"}) {
        if (!header.empty() || !h.first.count(name)) continue;
        std::string v = h.first[name];
        if (v.starts_with("W/")) v.erase(0, 2);
        v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
        if (is_sha256(v)) header = lower(v);
    }
    if (expected.empty()) expected = header;
    const auto discard = [&] { ::unlink(partial.c_str()); };
    if (file.size > 0 && have != file.size) {
        discard();
        fail("{}: {} bytes arrived, the hub lists {}: removed", file.path, have, file.size);
    }
    if (!header.empty() && header != expected) {
        discard();
        fail("{}: the hub's tree lists sha256 {} but its resolve route {}: the download is removed", file.path,
             expected, header);
    }
    if (expected.empty()) {
        logger("pull")->warn("{}: the hub lists no sha256 for it: not verified", file.path);
    } else if (expected != out.sha256) {
        discard();
        fail("{}: sha256 {} but the hub lists {}: the download is removed, nothing was added", file.path, out.sha256,
             expected);
    }
    TANDEM_CHECK(::fsync(fd) == 0, "{}: fsync: {}", partial.string(), std::strerror(errno));
    fs::rename(partial, final_path);
    store.adopt(final_path);
    return out;
}

} // namespace

model_manifest pull(const reference& ref, const model_store& store, const pull_options& o) {
    const session s(o);
    const std::vector<repo_file> tree = list_tree(s, ref);
    const selection sel = select_files(ref, tree);
    TANDEM_CHECK(!sel.files.empty(), "{}", sel.error);
    const std::string name = store_name(ref, sel);
    const std::optional<model_manifest> before = store.find(name);

    model_manifest m;
    m.name = name;
    m.kind = "hub";
    m.source = s.endpoint + "/" + ref.repo;
    m.revision = ref.revision;
    m.quantization = sel.quant;
    for (const repo_file& f : sel.files) {
        const std::string rel = model_store::file_path(ref.repo, f.path);
        const fs::path final_path = store.dir() / rel;
        std::error_code ec;
        // Already here and unchanged on the hub: nothing to fetch.
        const bool same = before && std::any_of(before->files.begin(), before->files.end(), [&](const model_file& b) {
            return b.path == rel && !f.sha256.empty() && b.sha256 == f.sha256;
        });
        if (same && fs::is_regular_file(final_path, ec) && int64_t(fs::file_size(final_path, ec)) == f.size) {
            logger("pull")->info("{}: up to date", f.path);
            m.files.push_back({rel, f.path, f.size, f.sha256});
            if (!before->revision.empty()) m.revision = before->revision;
            continue;
        }
        const fetched got = fetch_file(s, ref, f, final_path, store, o);
        if (!got.commit.empty()) m.revision = got.commit;
        m.files.push_back({rel, f.path, f.size > 0 ? f.size : int64_t(fs::file_size(final_path)), got.sha256});
    }
    for (const model_file& f : m.files) m.size += f.size;
    m.sha256 = m.files.front().sha256;
    const gguf::file g = gguf::file::open((store.dir() / m.files.front().path).string());
    m.architecture = g.get_string("general.architecture").value_or("");
    if (m.quantization.empty()) m.quantization = quant_of_file_type(g.get_int("general.file_type").value_or(-1));
    m.pulled_at = utc_now();
    store.save(m);
    return m;
}

} // namespace tandem::daemon::hub
