// `tandem chat`: a conversation with the daemon, with slash commands and, on a terminal, line editing.
#include "daemon/cli_client.hpp"
#include "daemon/cli_line_reader.hpp"

#include <cstdio>

namespace tandem::cli::client {

namespace {

// What /help says; /reset's and /system's answers say the same about the system prompt.
constexpr const char* help_text =
    "/reset forgets the conversation but keeps the system prompt; /system TEXT sets the system prompt "
    "(/system alone: none); /quit or Ctrl-D ends; Ctrl-C stops a reply";

} // namespace

int cmd_chat(const client_opts& o) {
    const terminal t;
    const ipc::client c(ipc::default_socket_path(o.socket));
    install_sigint(); // Ctrl-C stops the reply (or drops the line), not the chat
    const bool editing = t.in_tty && t.out_tty;
    const std::string prompt = t.out(std::string(bold) + ";" + std::string(green), "> ");
    const auto reader = line_reader::make(editing, prompt);
    auto say = [&](std::string_view code, const std::string& text) {
        std::printf("%s\n", t.out(code, text).c_str());
        std::fflush(stdout);
    };

    std::string system = o.system;
    std::vector<json> history;
    if (t.in_tty) say(dim, "tandem chat on " + c.socket_path() + " (/help for commands, Ctrl-D to leave)");
    int last_rc = exit_ok;
    for (;;) {
        interrupted = false;
        if (t.in_tty && !editing) { // libedit draws its own prompt
            std::printf("%s", prompt.c_str());
            std::fflush(stdout);
        }
        const line_reader::result in = reader->read();
        if (in.what == line_reader::outcome::interrupted) {
            std::printf("\n");
            if (in.text.empty()) say(dim, "(type /quit or press Ctrl-D to leave)");
            std::fflush(stdout);
            continue;
        }
        if (in.what == line_reader::outcome::end) {
            if (t.in_tty) std::printf("\n");
            break;
        }
        const std::string& line = in.text;
        if (line.empty()) continue;
        reader->remember(line);
        if (line[0] == '/') {
            const size_t sp = line.find(' ');
            const std::string cmd = line.substr(0, sp);
            const std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
            if (cmd == "/quit" || cmd == "/exit") break;
            if (cmd == "/help") {
                say(dim, help_text);
            } else if (cmd == "/reset") {
                history.clear();
                say(dim, system.empty() ? "(conversation forgotten; no system prompt)"
                                        : "(conversation forgotten; the system prompt stays: /system to change it)");
            } else if (cmd == "/system") {
                system = arg;
                say(dim, arg.empty() ? "(no system prompt)" : "(system prompt set)");
            } else {
                say(yellow, "unknown command " + cmd + "; /help lists them");
            }
            continue;
        }
        history.push_back({{"role", "user"}, {"content", line}});
        std::vector<json> messages;
        if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
        messages.insert(messages.end(), history.begin(), history.end());
        const reply r = send(c, t, o, request_body(o, true, messages, ""), true);
        if (r.rc == exit_ok || (r.rc == exit_interrupted && !r.text.empty())) {
            // An interrupted reply stays in the history as far as it got, as it was shown.
            history.push_back({{"role", "assistant"}, {"content", r.text}});
            last_rc = exit_ok;
            continue;
        }
        history.pop_back(); // the turn did not happen
        if (r.rc == exit_interrupted) continue;
        if (r.rc == exit_unreachable) return r.rc;
        last_rc = r.rc;
    }
    return last_rc;
}

} // namespace tandem::cli::client
