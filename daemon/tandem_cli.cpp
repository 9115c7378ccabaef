// `tandem`: the command-line tool. Each command group registers its subcommands.
#include "daemon/cli.hpp"
#include "runtime/log.hpp"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
    using namespace tandem;
    CLI::App app{"tandem: local LLM inference"};
    app.require_subcommand(1);
    std::string log_level = "warn";
    app.add_option("--log", log_level, "log level: trace, debug, info, warn, error, off (or TANDEM_LOG)");

    cli::registry reg;
    cli::register_offline(app, reg);
    cli::register_bench(app, reg);

    CLI11_PARSE(app, argc, argv);
    init_logging(log_level);
    try {
        for (const auto& c : reg)
            if (c.sub->parsed()) return c.run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
