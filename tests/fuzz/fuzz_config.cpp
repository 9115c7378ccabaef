// libFuzzer target for tandemd's configuration: the config file's text, then (after a NUL)
// a command line, NUL-separated, as tandemd reads them: the file, the flags over it,
// validation, and the peer policy the server makes from it. A mistake must be a
// tandem::error (or a CLI11 parse error) with a message, never a crash or another exception;
// what is accepted must read back the same from the file the keys' origins describe.
#include "daemon/cli_args.hpp"
#include "daemon/config.hpp"
#include "daemon/peer_cred.hpp"
#include "daemon/tandemd_args.hpp"
#include "runtime/error.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Every key's value as `set` takes it back (lists and numbers in the form set accepts).
std::string settings_text(const tandem::daemon::config& c) {
    std::string s;
    const auto line = [&](const char* k, const std::string& v) { s += std::string(k) + " = \"" + v + "\"\n"; };
    const auto list = [](const std::vector<std::string>& v) {
        std::string out;
        for (const auto& x : v) out += (out.empty() ? "" : ",") + x;
        return out;
    };
    line("model", c.model);
    line("placement", c.placement);
    line("prefill", c.prefill);
    line("decode", c.decode);
    line("workers", c.workers ? "true" : "false");
    line("threads", std::to_string(c.threads));
    line("n_ctx", std::to_string(c.n_ctx));
    line("kv_dtype", c.kv_dtype);
    line("max_body_bytes", std::to_string(c.max_body_bytes));
    line("allowed_users", list(c.allowed_users));
    line("log_level", c.log_level);
    return s;
}

bool quotable(const std::string& v) { return v.find_first_of("\"\n\r") == std::string::npos; }

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace tandem::daemon;
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t cut = std::min(in.size(), in.find('\0'));
    const std::string text(in.substr(0, cut));
    std::vector<std::string> argv{"tandemd"};
    for (size_t at = cut + 1; at <= in.size() && argv.size() < 16;) {
        const size_t end = std::min(in.size(), in.find('\0', at));
        argv.emplace_back(in.substr(at, end - at));
        at = end + 1;
    }

    config cfg;
    try {
        std::istringstream file(text);
        cfg.load(file, "fuzz.conf");
    } catch (const tandem::error& e) {
        if (std::string_view(e.what()).substr(0, 10) != "fuzz.conf:") std::abort(); // errors name the file
        return 0;
    }

    CLI::App app{"tandemd", "tandemd"};
    tandemd_args args;
    add_options(app, args);
    std::vector<const char*> ptrs;
    for (const auto& a : argv) ptrs.push_back(a.c_str());
    try {
        app.parse(int(ptrs.size()), ptrs.data());
    } catch (const CLI::ParseError& e) {
        if (tandem::cli::describe(e, app).empty() && e.get_exit_code() != 0) std::abort();
        return 0;
    }
    try {
        apply_args(args, cfg); // (--config is not read here: the text above is the file)
        (void)make_peer_policy(cfg);
    } catch (const tandem::error&) {
        return 0;
    }

    // What was accepted reads back the same, written as a file.
    if (!quotable(cfg.model) || !quotable(cfg.placement)) return 0;
    for (const auto& u : cfg.allowed_users)
        if (u.find_first_of(", \t") != std::string::npos || !quotable(u)) return 0;
    config again;
    std::istringstream file(settings_text(cfg));
    try {
        again.load(file, "again.conf");
    } catch (const tandem::error&) {
        std::abort();
    }
    if (settings_text(again) != settings_text(cfg)) std::abort();
    return 0;
}
