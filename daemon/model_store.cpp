// The model store: manifests by name, the files they list, aliases, and name resolution.
#include "daemon/model_store.hpp"

#include "runtime/error.hpp"
#include "runtime/gguf.hpp"
#include "runtime/log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tandem::daemon {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

std::string upper(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = char(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

bool is_digits(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "Q4_K_M", "IQ4_XS", "Q8_0", "F16", "BF16", "TQ1_0", "MXFP4" (upper-cased).
bool is_quant_token(std::string_view t) {
    const std::string u = upper(t);
    if (u == "F16" || u == "BF16" || u == "F32" || u == "MXFP4") return true;
    size_t i = 0;
    if (u.starts_with("IQ") || u.starts_with("TQ")) i = 2;
    else if (u.starts_with("Q")) i = 1;
    else return false;
    if (i >= u.size() || !std::isdigit(static_cast<unsigned char>(u[i]))) return false;
    ++i;
    if (i == u.size()) return false; // "Q4" alone is a word, not a type
    if (u[i] != '_') return false;
    for (; i < u.size(); ++i)
        if (!std::isalnum(static_cast<unsigned char>(u[i])) && u[i] != '_') return false;
    return true;
}

} // namespace

std::string utc_now() {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

namespace {

std::string get_string(const nlohmann::json& j, const char* key, const std::string& what, bool required = false) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
        if (required) fail("{}: no \"{}\"", what, key);
        return {};
    }
    if (!it->is_string()) fail("{}: \"{}\" is not a string", what, key);
    return it->get<std::string>();
}

int64_t get_int(const nlohmann::json& j, const char* key, const std::string& what) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return 0;
    if (!it->is_number_integer()) fail("{}: \"{}\" is not an integer", what, key);
    return it->get<int64_t>();
}

// The repository part of a name: "org/repo" of "org/repo:Q4_K_M" (or of "hf.co/org/repo").
std::string strip_hub_host(std::string_view name) {
    for (std::string_view prefix : {"https://", "http://"})
        if (name.starts_with(prefix)) name.remove_prefix(prefix.size());
    for (std::string_view host : {"hf.co/", "huggingface.co/"})
        if (name.starts_with(host)) name.remove_prefix(host.size());
    return std::string(name);
}

} // namespace

ojson model_manifest::to_json() const {
    ojson fj = ojson::array();
    for (const model_file& f : files)
        fj.push_back({{"path", f.path}, {"hub_path", f.hub_path}, {"size", f.size}, {"sha256", f.sha256}});
    return {{"name", name},         {"kind", kind},   {"source", source},
            {"revision", revision}, {"sha256", sha256}, {"size", size},
            {"architecture", architecture}, {"quantization", quantization}, {"pulled_at", pulled_at},
            {"files", fj}};
}

model_manifest model_manifest::from_json(const nlohmann::json& j, const std::string& what) {
    TANDEM_CHECK(j.is_object(), "{}: not a JSON object", what);
    model_manifest m;
    m.name = get_string(j, "name", what, true);
    m.kind = get_string(j, "kind", what);
    if (m.kind.empty()) m.kind = "hub";
    m.source = get_string(j, "source", what);
    m.revision = get_string(j, "revision", what);
    m.sha256 = get_string(j, "sha256", what);
    m.size = get_int(j, "size", what);
    m.architecture = get_string(j, "architecture", what);
    m.quantization = get_string(j, "quantization", what);
    m.pulled_at = get_string(j, "pulled_at", what);
    const auto files = j.find("files");
    TANDEM_CHECK(files != j.end() && files->is_array() && !files->empty(), "{}: \"files\" is not a list of files", what);
    for (const auto& f : *files) {
        TANDEM_CHECK(f.is_object(), "{}: an entry of \"files\" is not an object", what);
        m.files.push_back({get_string(f, "path", what, true), get_string(f, "hub_path", what), get_int(f, "size", what),
                           get_string(f, "sha256", what)});
    }
    return m;
}

std::string default_store_dir() {
    if (const char* d = std::getenv("TANDEM_MODELS"); d && *d) return d;
    // The system unit's StateDirectory=tandem is /var/lib/tandem; the user unit's is under ~.
    if (const char* d = std::getenv("STATE_DIRECTORY"); d && std::string_view(d).starts_with("/var/lib/")) {
        const std::string dir(d);
        return dir.substr(0, dir.find(':')) + "/models";
    }
    if (::geteuid() == 0) return "/var/lib/tandem/models";
    // The service's own user (sysusers.d: home /var/lib/tandem), as `sudo -u tandem tandem pull`.
    if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_dir && std::string_view(pw->pw_dir) == "/var/lib/tandem")
        return "/var/lib/tandem/models";
    if (const char* d = std::getenv("XDG_DATA_HOME"); d && *d == '/') return std::string(d) + "/tandem/models";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/share/tandem/models";
    return "/tmp/tandem-" + std::to_string(::geteuid()) + "/models";
}

std::optional<std::string> check_model_name(std::string_view name) {
    if (name.empty()) return "a model name cannot be empty";
    if (name.size() > 200) return "a model name has at most 200 characters";
    const size_t colon = name.find(':');
    if (colon != std::string_view::npos &&
        (name.find(':', colon + 1) != std::string_view::npos || name.find('/', colon) != std::string_view::npos))
        return fmt::format("'{}': a name has at most one ':TAG', at its end", name);
    size_t start = 0;
    while (true) {
        const size_t slash = name.find('/', start);
        const std::string_view part = name.substr(start, slash == std::string_view::npos ? name.npos : slash - start);
        if (part.empty() || part.front() == '.' || part.front() == ':')
            return fmt::format("'{}': each part between '/' must be non-empty and not start with '.'", name);
        for (char c : part)
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != ':')
                return fmt::format("'{}': a name has letters, digits, '.', '_', '-', '/' and one ':' only", name);
        if (slash == std::string_view::npos) break;
        start = slash + 1;
    }
    if (name.back() == ':') return fmt::format("'{}': an empty tag after ':'", name);
    return std::nullopt;
}

split_part split_of_file_name(std::string_view file_name) {
    std::string_view s = file_name;
    if (const size_t slash = s.rfind('/'); slash != s.npos) s.remove_prefix(slash + 1);
    if (s.ends_with(".gguf")) s.remove_suffix(5);
    // ...-00001-of-00003
    const size_t of = s.rfind("-of-");
    if (of == s.npos || of < 2) return {};
    const std::string_view count = s.substr(of + 4);
    const size_t dash = s.rfind('-', of - 1);
    if (dash == s.npos) return {};
    const std::string_view index = s.substr(dash + 1, of - dash - 1);
    if (!is_digits(index) || !is_digits(count) || index.size() > 6 || count.size() > 6) return {};
    const split_part p{std::atoi(std::string(index).c_str()), std::atoi(std::string(count).c_str())};
    if (p.index < 1 || p.count < 1 || p.index > p.count) return {};
    return p;
}

std::string quant_of_file_name(std::string_view file_name) {
    std::string_view s = file_name;
    if (const size_t slash = s.rfind('/'); slash != s.npos) s.remove_prefix(slash + 1);
    if (s.ends_with(".gguf")) s.remove_suffix(5);
    if (split_of_file_name(file_name).count > 0) s = s.substr(0, s.rfind('-', s.rfind("-of-") - 1));
    // The last token that is a type's name, tokens split at '-' and '.'.
    size_t end = s.size();
    while (end > 0) {
        size_t begin = s.find_last_of("-.", end - 1);
        begin = begin == s.npos ? 0 : begin + 1;
        const std::string_view tok = s.substr(begin, end - begin);
        if (is_quant_token(tok)) return upper(tok);
        if (begin == 0) break;
        end = begin - 1;
    }
    return {};
}

std::string quant_of_file_type(int64_t t) {
    static const char* const names[] = {
        "F32",    "F16",    "Q4_0",   "Q4_1",   "",       "",        "",       "Q8_0",   "Q5_0",   "Q5_1",
        "Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",  "Q5_K_S", "Q5_K_M", "Q6_K",   "IQ2_XXS",
        "IQ2_XS", "Q2_K_S", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",  "IQ3_S",  "IQ3_M",  "IQ2_S",  "IQ2_M",
        "IQ4_XS", "IQ1_M",  "BF16",   "",       "",       "",        "TQ1_0",  "TQ2_0",  "MXFP4"};
    if (t < 0 || t >= int64_t(std::size(names))) return {};
    return names[t];
}

model_store::model_store(std::string dir) : dir_(dir.empty() ? default_store_dir() : std::move(dir)) {}

std::string model_store::file_path(std::string_view repo, std::string_view hub_path) {
    return fmt::format("files/{}/{}", repo, hub_path);
}

fs::path model_store::manifest_path(std::string_view name) const {
    return dir_ / "manifests" / (std::string(name) + ".json");
}

std::vector<model_manifest> model_store::list() const {
    std::vector<model_manifest> out;
    const fs::path root = dir_ / "manifests";
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return out;
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        if (!it->is_regular_file() || it->path().extension() != ".json") continue;
        try {
            std::ifstream in(it->path());
            out.push_back(model_manifest::from_json(nlohmann::json::parse(in), it->path().string()));
        } catch (const std::exception& e) {
            logger("store")->warn("{}: skipped: {}", it->path().string(), e.what());
        }
    }
    std::sort(out.begin(), out.end(), [](const model_manifest& a, const model_manifest& b) { return a.name < b.name; });
    return out;
}

std::optional<model_manifest> model_store::find(std::string_view name_in, std::string* error) const {
    const std::string name = strip_hub_host(name_in);
    const std::vector<model_manifest> all = list();
    for (const model_manifest& m : all)
        if (m.name == name) return m;
    std::vector<const model_manifest*> hits;
    for (const model_manifest& m : all)
        if (lower(m.name) == lower(name)) hits.push_back(&m);
    if (hits.empty() && name.find(':') == std::string::npos) {
        // org/repo: its only tag, else its Q4_K_M
        const std::string prefix = lower(name) + ":";
        for (const model_manifest& m : all)
            if (lower(m.name).starts_with(prefix)) hits.push_back(&m);
        if (hits.size() > 1) {
            const auto q4 = std::find_if(hits.begin(), hits.end(),
                                         [](const model_manifest* m) { return m->quantization == "Q4_K_M"; });
            if (q4 != hits.end()) return **q4;
        }
    }
    if (hits.size() == 1) return *hits.front();
    if (error) {
        if (hits.empty()) {
            std::string names;
            for (const model_manifest& m : all) names += (names.empty() ? "" : ", ") + m.name;
            *error = fmt::format("no model '{}' in the store {} ({})", name, dir_.string(),
                                 names.empty() ? "it has none: tandem pull NAME adds one" : "it has " + names);
        } else {
            std::string names;
            for (const model_manifest* m : hits) names += (names.empty() ? "" : ", ") + m->name;
            *error = fmt::format("'{}' names several models in the store: {}", name, names);
        }
    }
    return std::nullopt;
}

void model_store::save(const model_manifest& m) const {
    if (auto err = check_model_name(m.name)) fail("{}", *err);
    const fs::path path = manifest_path(m.name);
    fs::create_directories(path.parent_path());
    const fs::path tmp = path.string() + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << m.to_json().dump(2) << "\n";
        out.flush();
        TANDEM_CHECK(out, "{}: cannot write", tmp.string());
    }
    fs::rename(tmp, path);
    adopt(path);
}

bool model_store::remove(std::string_view name) const {
    const fs::path path = manifest_path(name);
    std::error_code ec;
    if (check_model_name(name) || !fs::is_regular_file(path, ec)) return false;
    std::ifstream in(path);
    std::optional<model_manifest> gone;
    try {
        gone = model_manifest::from_json(nlohmann::json::parse(in), path.string());
    } catch (const std::exception& e) {
        logger("store")->warn("{}: {}; removing the manifest only", path.string(), e.what());
    }
    fs::remove(path);
    // Empty manifest folders up to manifests/
    for (fs::path p = path.parent_path(); p != dir_ / "manifests" && fs::is_empty(p, ec); p = p.parent_path())
        fs::remove(p, ec);
    if (!gone) return true;
    // The files under files/ that no other manifest lists (an alias's own file elsewhere stays).
    std::set<std::string> used;
    for (const model_manifest& m : list())
        for (const std::string& p : paths(m)) used.insert(p);
    const std::string files_dir = (dir_ / "files").string() + "/";
    for (const std::string& p : paths(*gone)) {
        if (!fs::path(p).lexically_normal().string().starts_with(files_dir) || used.count(p)) continue;
        fs::remove(p, ec);
        for (fs::path d = fs::path(p).parent_path(); d != dir_ / "files" && fs::is_empty(d, ec); d = d.parent_path())
            fs::remove(d, ec);
    }
    return true;
}

model_manifest model_store::alias(const std::string& name, const std::string& target) const {
    if (auto err = check_model_name(name)) fail("{}", *err);
    std::error_code ec;
    model_manifest m;
    if (fs::is_regular_file(target, ec)) {
        const fs::path abs = fs::absolute(target).lexically_normal();
        const gguf::file f = gguf::file::open(abs.string());
        m.kind = "alias";
        m.source = abs.string();
        m.size = int64_t(fs::file_size(abs));
        m.architecture = f.get_string("general.architecture").value_or("");
        m.quantization = quant_of_file_name(abs.filename().string());
        if (m.quantization.empty()) m.quantization = quant_of_file_type(f.get_int("general.file_type").value_or(-1));
        const split_part sp = split_of_file_name(abs.filename().string());
        TANDEM_CHECK(sp.count <= 1, "{}: part {} of a split GGUF: alias its first part, and keep the {} parts together",
                     target, sp.index, sp.count);
        m.files.push_back({abs.string(), "", m.size, ""});
    } else {
        std::string why;
        const std::optional<model_manifest> t = find(target, &why);
        TANDEM_CHECK(t, "{}: not a file, and {}", target, why);
        m = *t;
        m.kind = "alias";
        m.source = t->name;
        for (model_file& f : m.files)
            if (!fs::path(f.path).is_absolute()) f.path = (dir_ / f.path).string(); // stays when the name goes
    }
    m.name = name;
    m.pulled_at = utc_now();
    save(m);
    return m;
}

void model_store::adopt(const fs::path& path) const {
    struct stat st{};
    if (::geteuid() != 0 || ::stat(dir_.c_str(), &st) != 0 || st.st_uid == 0) return;
    const fs::path root = fs::absolute(dir_).lexically_normal();
    for (fs::path p = fs::absolute(path).lexically_normal(); p != root && p.has_relative_path(); p = p.parent_path())
        if (::lchown(p.c_str(), st.st_uid, st.st_gid) != 0) break;
}

std::vector<std::string> model_store::paths(const model_manifest& m) const {
    std::vector<std::string> out;
    for (const model_file& f : m.files) out.push_back(fs::path(f.path).is_absolute() ? f.path : (dir_ / f.path).string());
    return out;
}

resolve_result locate_model(const std::string& name_or_path, const std::string& store_dir) {
    resolve_result r;
    std::error_code ec;
    if (fs::is_regular_file(name_or_path, ec)) {
        r.model = resolved_model{fs::path(name_or_path).stem().string(), {name_or_path}, std::nullopt};
        return r;
    }
    const model_store store(store_dir);
    std::optional<model_manifest> m = store.find(name_or_path, &r.error);
    if (!m) {
        if (name_or_path.find('/') != std::string::npos && name_or_path.ends_with(".gguf"))
            r.error = fmt::format("{}: no such file, and {}", name_or_path, r.error);
        return r;
    }
    r.error.clear();
    std::vector<std::string> paths = store.paths(*m);
    for (const std::string& p : paths)
        if (!fs::is_regular_file(p, ec)) {
            r.error = fmt::format("model '{}': its file {} is missing (pull it again, or tandem rm {})", m->name, p, m->name);
            return r;
        }
    r.model = resolved_model{m->name, std::move(paths), std::move(m)};
    return r;
}

} // namespace tandem::daemon
