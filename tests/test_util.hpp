// Helpers for tests: where the shared models are, scratch files.
#pragma once

#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sys/wait.h>
#include <stdexcept>
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

// A scratch directory that every user can reach (under /tmp, mode 0755), for checks that
// connect as another user: the build directory may sit under a 0700 parent (a checkout in
// a home directory), which would refuse that user before the daemon's own check.
struct public_scratch_dir {
    std::filesystem::path path;
    explicit public_scratch_dir(const std::string& tag) {
        std::string templ = (std::filesystem::temp_directory_path() / ("tandem-" + tag + "-XXXXXX")).string();
        if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp " + templ + " failed");
        path = templ;
        std::filesystem::permissions(path, std::filesystem::perms(0755));
    }
    ~public_scratch_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

// A command's exit code (128 + signal when killed) and what it wrote.
struct run_result {
    int rc = -1;
    std::string out, err;
};

// Single-quotes s for /bin/sh.
inline std::string shell_quote(const std::string& s) {
    std::string q(1, '\'');
    for (char c : s) {
        if (c == '\'')
            q.append("'\\''");
        else
            q.push_back(c);
    }
    q.push_back('\'');
    return q;
}

// Runs the built program `name` (under daemon/) with `args` (each quoted), `stdin_text` on its
// standard input and `env` ("NAME=value ...", unquoted) before it, capturing stdout, stderr and
// the exit code. A run past 300 s is killed (rc 124): a hang fails its test with its stderr
// rather than as ctest's timeout of the whole file.
inline run_result run_built(const std::string& name, const std::vector<std::string>& args,
                            const std::string& stdin_text = "", const std::string& env = "") {
    static scratch_dir dir("tandem-io");
    std::string cmd = env + " timeout -k 5 300 " + shell_quote(binary_dir().append("/daemon/").append(name));
    for (const auto& a : args) {
        cmd.push_back(' ');
        cmd.append(shell_quote(a));
    }
    const std::string in = dir.file("in"), out = dir.file("out"), err = dir.file("err");
    {
        std::ofstream f(in, std::ios::binary);
        f << stdin_text;
    }
    cmd += " <" + shell_quote(in) + " >" + shell_quote(out) + " 2>" + shell_quote(err);
    const int st = std::system(cmd.c_str());
    run_result r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = read_text(out);
    r.err = read_text(err);
    return r;
}

// run_built for `tandem`.
inline run_result run_tandem(const std::vector<std::string>& args, const std::string& stdin_text = "",
                             const std::string& env = "") {
    return run_built("tandem", args, stdin_text, env);
}

} // namespace tandem::test
