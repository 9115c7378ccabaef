// `tandem`: the command-line tool. Each command group registers its subcommands.
#include "daemon/cli.hpp"
#include "runtime/log.hpp"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
    using namespace tandem;
    CLI::App app{"tandem: local LLM inference.\n"
                 "  tandem \"prompt\"         ask the daemon (tandemd); the reply streams to stdout\n"
                 "  tandem chat | status    talk to it, or see how it is doing\n"
                 "  tandem run | tokenize | detokenize | synth    offline, no daemon\n"
                 "Exit codes: 0 ok, 1 error, 2 usage, 3 no daemon reachable, 4 request rejected,\n"
                 "5 daemon busy or loading (retry), 130 interrupted."};
    std::string log_level = "warn";
    app.add_option("--log", log_level, "log level: trace, debug, info, warn, error, off (or TANDEM_LOG)");

    cli::registry reg;
    cli::register_offline(app, reg);
    cli::register_bench(app, reg);
    cli::register_client(app, reg); // last: its bare-prompt entry (sub == &app) is the fallback

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e); // prints help or the error
        return rc == 0 ? 0 : 2;
    }
    init_logging(log_level);
    try {
        for (const auto& c : reg)
            if (c.sub != &app && c.sub->parsed()) return c.run();
        for (const auto& c : reg)
            if (c.sub == &app) return c.run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
