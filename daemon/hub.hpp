// `tandem pull`: GGUF models from a Hugging Face-compatible hub into the model store (libcurl).
#pragma once

#include "daemon/model_store.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::daemon::hub {

// What a pull names: org/repo, org/repo:QUANT, org/repo/FILE.gguf (FILE may be in a
// folder), each optionally after hf.co/, huggingface.co/ or https://huggingface.co/, and the
// hub's own links https://huggingface.co/org/repo/resolve/REV/FILE (or blob/, tree/).
struct reference {
    std::string repo;                  // org/repo
    std::string quant;                 // "" = the repository's default (Q4_K_M where present)
    std::string file;                  // a .gguf path in the repository ("" = by quant)
    std::string revision = "main";
};
std::optional<reference> parse_reference(std::string_view text, std::string* error);

// A file of the repository, as its tree lists it.
struct repo_file {
    std::string path;
    int64_t size = 0;
    std::string sha256;                // the LFS object id; "" for a file not in LFS
};
// The hub's tree listing (GET /api/models/ORG/REPO/tree/REV): a JSON array of entries.
std::vector<repo_file> parse_tree(std::string_view json_text);

// The files of the model a reference names (a split GGUF: every part, in order), and its quant.
struct selection {
    std::vector<repo_file> files;
    std::string quant;
    std::string error;                 // when files is empty: why, with what the repository has
};
selection select_files(const reference& ref, const std::vector<repo_file>& tree);

// The store name a pull gets: org/repo:QUANT, or org/repo:STEM when the file names no quant.
std::string store_name(const reference& ref, const selection& sel);

struct pull_options {
    std::string endpoint;              // "" = $HF_ENDPOINT, else https://huggingface.co
    std::string token;                 // "" = $HF_TOKEN (sent as Authorization: Bearer, never across hosts)
    int retries = 5;                   // resumed attempts after a dropped connection, per file
    int progress = -1;                 // -1: a bar on a terminal, else a line a second; 0: none; 1: bar; 2: lines
};

// Pulls the model into the store and writes its manifest; throws tandem::error with what
// went wrong (a partial download stays as FILE.partial, resumed by the next pull; a file
// whose sha256 differs from the hub's is removed).
model_manifest pull(const reference& ref, const model_store& store, const pull_options& opts);

} // namespace tandem::daemon::hub
