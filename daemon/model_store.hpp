// The model store: pulled models and aliases by name, a JSON manifest each (docs/models.md).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::daemon {

// One file of a model. `path` is relative to the store for pulled files, absolute for an
// alias of a file outside it; `hub_path` is the file's path in its hub repository.
struct model_file {
    std::string path;
    std::string hub_path;
    int64_t size = 0;
    std::string sha256;                // "" when unknown (an alias of a file never hashed)
};

// A manifest: manifests/NAME.json in the store.
struct model_manifest {
    std::string name;                  // org/repo:QUANT, or an alias's own name
    std::string kind = "hub";          // hub | alias
    std::string source;                // hub: https://ENDPOINT/org/repo; alias: the path or the name it stands for
    std::string revision;              // hub: the commit pulled (or the revision asked when the hub named none)
    std::string sha256;                // of the first file
    int64_t size = 0;                  // all files together
    std::string architecture;          // general.architecture
    std::string quantization;          // Q4_K_M, Q8_0, F16, ... ("" when neither the file name nor its type says)
    std::string pulled_at;             // UTC, ISO 8601
    std::vector<model_file> files;     // the first is the model; split GGUFs list every part in order

    nlohmann::ordered_json to_json() const;
    // tandem::error naming `what` for a manifest that lacks a field or has one of the wrong type.
    static model_manifest from_json(const nlohmann::json& j, const std::string& what);
};

// Now, UTC, as ISO 8601 (a manifest's pulled_at).
std::string utc_now();

// The store's directory: $TANDEM_MODELS; else $STATE_DIRECTORY/models for the system service
// (a StateDirectory under /var/lib), /var/lib/tandem/models for root and the `tandem` user; else
// $XDG_DATA_HOME/tandem/models, or ~/.local/share/tandem/models.
std::string default_store_dir();

// Whether `name` may name a model in the store: components separated by '/', each of
// [A-Za-z0-9._-] and not starting with '.', the last one optionally with one ":TAG".
// An error message, or nullopt when it is fine.
std::optional<std::string> check_model_name(std::string_view name);

// The quantization a GGUF file name says (Qwen3-0.6B-Q4_K_M.gguf: Q4_K_M), upper-case;
// "" when it says none. The split suffix (-00001-of-00003) is ignored.
std::string quant_of_file_name(std::string_view file_name);
// A split GGUF's part: "x-00002-of-00003.gguf" gives {2, 3}; {0, 0} for a whole file.
struct split_part {
    int index = 0, count = 0;
};
split_part split_of_file_name(std::string_view file_name);
// The quantization a GGUF says inside (general.file_type), or "" (mostly F32: "F32").
std::string quant_of_file_type(int64_t file_type);

class model_store {
public:
    explicit model_store(std::string dir = ""); // "" = default_store_dir()
    const std::filesystem::path& dir() const { return dir_; }

    // Every manifest, sorted by name; an unreadable one is skipped with a warning.
    std::vector<model_manifest> list() const;
    // The manifest a name picks: the exact name; else the one name that matches it ignoring
    // case; else, for `org/repo` (or `hf.co/org/repo`), the repository's only tag, or its
    // Q4_K_M. nullopt when none does (or several do: `error` says which).
    std::optional<model_manifest> find(std::string_view name, std::string* error = nullptr) const;
    // Writes the manifest (atomically: a temporary file renamed over it).
    void save(const model_manifest& m) const;
    // Removes the manifest, and the files under the store no other manifest uses; false when
    // there is no such name.
    bool remove(std::string_view name) const;
    // `name` for `target`: a GGUF path (made absolute; read for its architecture and
    // quantization) or a name in the store. Throws tandem::error when it is neither.
    model_manifest alias(const std::string& name, const std::string& target) const;

    // Run as root: gives `path` and its folders up to the store to the store's owner (root
    // pulling into /var/lib/tandem/models leaves files the tandem user can remove).
    void adopt(const std::filesystem::path& path) const;

    // Absolute paths of a manifest's files.
    std::vector<std::string> paths(const model_manifest& m) const;
    // Where a hub file of `repo` goes, relative to the store: files/ORG/REPO/HUB_PATH.
    static std::string file_path(std::string_view repo, std::string_view hub_path);

private:
    std::filesystem::path manifest_path(std::string_view name) const;
    std::filesystem::path dir_;
};

// What the daemon serves for `model = ...`: the files and the id requests name.
struct resolved_model {
    std::string id;                    // the store name, or a file's stem
    std::vector<std::string> paths;    // the GGUF (split: every part, the first first)
    std::optional<model_manifest> manifest; // when it came from the store
};
struct resolve_result {
    std::optional<resolved_model> model;
    std::string error;                 // when model is empty: why, with the names the store has
};
// A path to an existing file is served as it is; anything else is looked up in the store at
// `store_dir` ("" = default_store_dir()).
resolve_result locate_model(const std::string& name_or_path, const std::string& store_dir = "");

} // namespace tandem::daemon
