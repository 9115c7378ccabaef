// `tandemd`: the Tandem daemon. Flags override the config file; see docs/config.md.
#include "daemon/cli_args.hpp"
#include "daemon/config.hpp"
#include "daemon/server.hpp"
#include "daemon/tandemd_args.hpp"
#include "daemon/worker_main.hpp"
#include "runtime/host.hpp"
#include "runtime/log.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string_view>

int main(int argc, char** argv) {
    using namespace tandem;
    // oneDNN's OpenMP threads must sleep between prefill matmuls instead of spinning against
    // the engine's own pool; libgomp reads the policy only at start, so this may re-exec.
    prepare_inference_process();
    // The daemon starts its prefill and decode workers as `tandemd --worker ROLE ...`.
    if (argc > 1 && std::string_view(argv[1]) == "--worker") return daemon::worker_main(argc, argv);
    CLI::App app{"tandemd: the Tandem LLM inference daemon (OpenAI-compatible HTTP over a Unix socket).\n"
                 "Exit codes: 0 stopped, 1 error, 2 usage or configuration error.",
                 "tandemd"};
    daemon::tandemd_args args;
    daemon::add_options(app, args);
    cli::add_version_flag(app);
    if (auto rc = cli::parse_args(app, argc, argv)) return *rc; // a mistake: one line and exit code 2

    if (args.list_keys) {
        for (const auto& k : daemon::config_keys()) std::printf("%s\n", k.c_str());
        return 0;
    }
    daemon::config cfg;
    bool demo_model = false;
    try {
        if (!args.config_file.empty()) cfg.load_file(args.config_file);
        demo_model = daemon::apply_args(args, cfg);
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
