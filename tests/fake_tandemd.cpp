// A stand-in for tandemd for scripted checks (tests/chat_tmux_check.sh): chat completions on a
// Unix socket, each request's body appended to a log as one line.
//   fake_tandemd SOCKET LOG
// The reply echoes the last message ("echo: <text>"); the message "slow" streams a tick every
// 200 ms for 20 s instead (to be interrupted). Runs until SIGTERM or SIGINT.
#include "fake_daemon.hpp"

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>

int main(int argc, char** argv) {
    using json = nlohmann::json;
    if (argc != 3) {
        std::fprintf(stderr, "usage: fake_tandemd SOCKET LOG\n");
        return 2;
    }
    // Signals to wait for, blocked before the serving thread starts so that it inherits the mask.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    std::signal(SIGPIPE, SIG_IGN); // a client that hung up mid-stream is a write error, not death

    const std::string log = argv[2];
    tandem::test::fake_daemon d(argv[1]);
    d.route("POST /v1/chat/completions", [&](const tandem::test::fake::request& r, tandem::test::fake::socket& s) {
        {
            std::ofstream(log, std::ios::app) << r.body << "\n";
        }
        std::string text;
        try {
            text = json::parse(r.body)["messages"].back()["content"].get<std::string>();
        } catch (const std::exception&) {}
        auto chunk = [](const std::string& t) {
            return json{{"choices", {{{"index", 0}, {"delta", {{"content", t}}}}}}}.dump();
        };
        std::vector<std::string> events;
        if (text == "slow") {
            for (int i = 0; i < 100; ++i) events.push_back(chunk("tick "));
        } else {
            events.push_back(chunk("echo: " + text));
        }
        events.push_back("[DONE]");
        tandem::test::fake::reply_sse(s, events, true, std::chrono::milliseconds(text == "slow" ? 200 : 0));
    });
    int sig = 0;
    sigwait(&stop, &sig);
    return 0;
}
