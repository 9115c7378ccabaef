// Helpers for tests: where the shared models are, scratch files.
#pragma once

#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace tandem::test {

// ../shared beside the repository, or $TANDEM_SHARED.
inline std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("TANDEM_SHARED"); env && *env) return env;
    return TANDEM_SHARED_DIR;
}

inline std::string model_path(const std::string& name) {
    return (shared_dir() / "models" / name).string();
}

inline std::string binary_dir() { return TANDEM_BINARY_DIR; }

inline std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A fresh directory under the build tree, removed when the object dies.
struct scratch_dir {
    std::filesystem::path path;
    explicit scratch_dir(const std::string& tag) {
        path = std::filesystem::path(TANDEM_BINARY_DIR) / "scratch" /
               (tag + "-" + std::to_string(::getpid()));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~scratch_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

} // namespace tandem::test
