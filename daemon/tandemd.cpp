// `tandemd`: the Tandem daemon. Flags override the config file; see docs/config.md.
#include "cpu/dnnl_matmul.hpp"
#include "daemon/cli_args.hpp"
#include "daemon/config.hpp"
#include "daemon/server.hpp"
#include "daemon/worker_main.hpp"
#include "runtime/log.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string_view>

int main(int argc, char** argv) {
    using namespace tandem;
    // oneDNN's OpenMP threads must sleep between prefill matmuls instead of spinning against
    // the engine's own pool; libgomp reads the policy only at start, so this may re-exec.
    cpu::ensure_passive_openmp();
    // The daemon starts its prefill and decode workers as `tandemd --worker ROLE ...`.
    if (argc > 1 && std::string_view(argv[1]) == "--worker") return daemon::worker_main(argc, argv);
    CLI::App app{"tandemd: the Tandem LLM inference daemon (OpenAI-compatible HTTP over a Unix socket).\n"
                 "Exit codes: 0 stopped, 1 error, 2 usage or configuration error.",
                 "tandemd"};
    std::string config_file, model, socket, listen_tcp, log_level;
    int threads = -1;
    std::vector<std::string> sets;
    bool list_keys = false;
    app.add_option("--config", config_file, "config file of `key = value` lines (docs/config.md)");
    app.add_option("-m,--model", model, "GGUF model file (default: the installed demo model, share/tandem/models/stories260K.gguf)");
    app.add_option("--socket", socket, "Unix socket path (default $XDG_RUNTIME_DIR/tandem/tandem.sock, or /run/tandem/tandem.sock as root)");
    app.add_option("-t,--threads", threads, "compute threads (default 0: all cores)")->check(cli::at_least(0));
    app.add_option("--listen-tcp", listen_tcp, "also listen on a loopback TCP address, e.g. 127.0.0.1:8080");
    app.add_option("--log", log_level, "log level: trace, debug, info, warn, error, off (or TANDEM_LOG)");
    app.add_option("--set", sets, "KEY=VALUE for any config key (repeatable)");
    app.add_flag("--list-keys", list_keys, "print the config keys and exit");
    if (auto rc = cli::parse_args(app, argc, argv)) return *rc; // a mistake: one line and exit code 2

    if (list_keys) {
        for (const auto& k : daemon::config_keys()) std::printf("%s\n", k.c_str());
        return 0;
    }
    daemon::config cfg;
    bool demo_model = true;
    try {
        if (!config_file.empty()) cfg.load_file(config_file);
        auto put = [&](const std::string& k, const std::string& v) {
            if (auto err = cfg.set(k, v)) throw error(fmt::format("--{}: {}", k, *err));
            cfg.origin[k] = "command line";
        };
        if (!model.empty()) put("model", model);
        if (!socket.empty()) put("socket", socket);
        if (threads >= 0) put("threads", std::to_string(threads));
        if (!listen_tcp.empty()) put("listen_tcp", listen_tcp);
        if (!log_level.empty()) put("log_level", log_level);
        for (const auto& s : sets) {
            const auto eq = s.find('=');
            if (eq == std::string::npos) throw error(fmt::format("--set {}: expected KEY=VALUE", s));
            if (auto err = cfg.set(s.substr(0, eq), s.substr(eq + 1)))
                throw error(fmt::format("--set {}: {}", s.substr(0, eq), *err));
            cfg.origin[s.substr(0, eq)] = "--set";
        }
        if (cfg.model.empty()) cfg.model = daemon::default_model_path(); // the installed demo model, if any
        else demo_model = false;
        cfg.validate();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandemd: error: %s\n", e.what());
        return 2;
    }
    init_logging(cfg.log_level);
    if (demo_model) logger("server")->info("no model configured: serving the demo model {}", cfg.model);
    try {
        daemon::server srv(std::move(cfg));
        return srv.run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandemd: error: %s\n", e.what());
        return 1;
    }
}
