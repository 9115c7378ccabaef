// `tandem`: the command-line tool. Each command group registers its subcommands.
#include "daemon/cli.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string_view>

namespace {

using namespace tandem;

std::vector<std::string> command_names(const CLI::App& app) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
    return names;
}

// A likely mistyped command: `tandem runn` must not send "runn" to the model. The rule (README):
// the first argument, or the whole prompt when it is a single word, is within an edit or two of
// a command's name, and no `--` marks the words as a prompt.
std::optional<std::string> mistyped_command(const CLI::App& app, int argc, char** argv, bool parsed) {
    const std::vector<std::string_view> args(argv + 1, argv + argc);
    if (std::find(args.begin(), args.end(), "--") != args.end()) return std::nullopt;
    std::string word;
    if (!parsed) {
        if (args.empty() || args[0].starts_with("-")) return std::nullopt;
        word = args[0];
    } else {
        const auto prompt = app.get_option("prompt")->results();
        if (prompt.size() != 1) return std::nullopt;
        word = prompt[0];
    }
    if (word.find_first_of(" \t\n") != std::string::npos) return std::nullopt;
    if (auto near = cli::nearest(word, command_names(app)))
        return "'" + word + "' is not a command; did you mean '" + *near + "'? (to send it as a prompt: tandem -- " +
               word + ")";
    return std::nullopt;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"tandem: local LLM inference.\n"
                 "  tandem \"prompt\"         ask the daemon (tandemd); the reply streams to stdout\n"
                 "  tandem -- WORD          a prompt that is one word, even a command's name\n"
                 "  tandem chat | status | top    talk to it, or see how it is doing\n"
                 "  tandem embed TEXT...    embeddings, one JSON array a line (-m MODEL: offline)\n"
                 "  tandem run | tokenize | detokenize | synth    offline, no daemon\n"
                 "  tandem info MODEL       a GGUF's shapes, tensors, context, tokenizer and memory (--json)\n"
                 "  tandem pull NAME        a GGUF from a Hugging Face hub into the model store (org/repo:Q4_K_M)\n"
                 "  tandem ls | show NAME | rm NAME | alias NAME PATH    the models in the store\n"
                 "  tandem guide compile|check|bench    the JSON Schema constraint engine on its own\n"
                 "  tandem batch IN.jsonl -o OUT.jsonl   OpenAI Batch requests (-m MODEL: in this process)\n"
                 "  tandem help [COMMAND]   this help, or a command's\n"
                 "Exit codes: 0 ok, 1 error, 2 usage, 3 no daemon reachable or not allowed, 4 request rejected,\n"
                 "5 daemon busy or loading (after waiting --wait seconds), 130 interrupted.",
                 "tandem"};
    std::string log_level = "warn";
    const auto log_check = cli::one_of({"trace", "debug", "info", "warn", "error", "critical", "off"});
    const char* log_help = "log level: trace, debug, info, warn, error, critical, off (or TANDEM_LOG)";
    app.add_option("--log", log_level, log_help)->check(log_check);
    cli::add_version_flag(app);

    cli::registry reg;
    cli::register_offline(app, reg);
    cli::register_info(app, reg);
    cli::register_models(app, reg);
    cli::register_guide(app, reg);
    cli::register_eval(app, reg);
    cli::register_bench(app, reg);
    cli::register_embed(app, reg);
    cli::register_batch(app, reg);
    cli::register_client(app, reg); // last: its bare-prompt entry (sub == &app) is the fallback

    auto* help = app.add_subcommand("help", "show this help, or a command's (tandem help run)");
    // --log is global: accepted after the command too.
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        sub->add_option("--log", log_level, log_help)->check(log_check);

    // `tandem help COMMAND` is `tandem COMMAND --help` (CLI11 would read COMMAND as a command
    // of its own, with its required options missing).
    std::vector<const char*> args(argv, argv + argc);
    if (argc == 3 && std::string_view(argv[1]) == "help" && (std::string_view(argv[2]) == "--help" ||
                                                             std::string_view(argv[2]) == "-h"))
        args = {argv[0], "--help"}; // help about help: the main help
    else if (argc >= 3 && std::string_view(argv[1]) == "help") {
        const auto names = command_names(app);
        if (argc > 3 || std::find(names.begin(), names.end(), argv[2]) == names.end()) {
            const auto near = argc > 3 ? std::nullopt : cli::nearest(argv[2], names);
            return cli::usage_error(app, argc > 3 ? std::string("help: takes one command's name")
                                                  : "'" + std::string(argv[2]) + "' is not a command" +
                                                        (near ? "; did you mean '" + *near + "'?" : ""));
        }
        args = {argv[0], argv[2], "--help"};
    }

    // `tandem runn -m M -p x`: the options of `run` are unknown to the prompt form; the mistake
    // is the command's name.
    const auto typo_first = [&](const CLI::ParseError& e) -> std::optional<std::string> {
        if (!dynamic_cast<const CLI::ExtrasError*>(&e)) return std::nullopt;
        return mistyped_command(app, argc, argv, false);
    };
    if (auto rc = cli::parse_args(app, int(args.size()), args.data(), typo_first)) return *rc;
    init_logging(log_level);
    if (help->parsed()) { // the main help (app.help() would show the chosen command's: help's own)
        std::fputs(app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal).c_str(), stdout);
        return 0;
    }
    try {
        for (const auto& c : reg)
            if (c.sub != &app && c.sub->parsed()) return c.run();
        if (auto typo = mistyped_command(app, argc, argv, true)) return cli::usage_error(app, *typo);
        for (const auto& c : reg)
            if (c.sub == &app) return c.run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
