// Command lines of `tandem` and `tandemd`: parse errors as one line and exit code 2, mistyped
// commands, `help`, a global --log, and a TANDEM_LOG that names no level.
#include "fake_daemon.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <thread>

using namespace tandem;
using json = nlohmann::json;
using test::run_tandem;

namespace {

const std::string stories = test::model_path("stories260K.gguf");

// A usage mistake: exit 2 and exactly `line` then how to get help, nothing else.
void check_usage(const test::run_result& r, const std::string& line, const std::string& help = "tandem --help") {
    INFO("stderr: ", r.err);
    CHECK(r.rc == 2);
    CHECK(r.err == line + "\nRun '" + help + "' for usage.\n");
    CHECK(r.out.empty());
}

} // namespace

TEST_CASE("tandem: every parse error is one line `tandem: <option>: <problem>` and exit 2") {
    const std::string none = "/nonexistent/tandem.sock";
    check_usage(run_tandem({"--socket", none, "-n", "-5", "hi"}), "tandem: --max-tokens: must be at least 1, got -5");
    check_usage(run_tandem({"--socket", none, "--max-tokens", "1.5", "hi"}),
                "tandem: --max-tokens: expected an integer, got '1.5'");
    check_usage(run_tandem({"--socket", none, "--temp", "abc", "hi"}), "tandem: --temp: expected a number, got 'abc'");
    check_usage(run_tandem({"--socket", none, "--temp", "3", "hi"}), "tandem: --temp: must be from 0 to 2, got 3");
    check_usage(run_tandem({"--socket", none, "--tmep", "1", "hi"}), "tandem: --tmep: unknown option (did you mean --temp?)");
    check_usage(run_tandem({"--socket", none, "-t", "0", "hi"}), "tandem: -t: unknown option");
    check_usage(run_tandem({"--socket", none, "--raw", "--chat", "hi"}), "tandem: --raw: cannot be used with --chat");
    check_usage(run_tandem({"--socket", none, "--raw", "--system", "x", "hi"}),
                "tandem: --system: needs a chat request; drop --raw");
    check_usage(run_tandem({"--socket", none, "--log", "bogus", "hi"}),
                "tandem: --log: expected trace, debug, info, warn, error, critical or off, got 'bogus'");
    check_usage(run_tandem({"--socket"}), "tandem: --socket: needs a value");
    check_usage(run_tandem({"--socket", none, "--socket", none, "hi"}), "tandem: --socket: given more than once");
    // Subcommands name themselves in the hint.
    check_usage(run_tandem({"chat", "-t", "0"}), "tandem: -t: unknown option", "tandem chat --help");
    check_usage(run_tandem({"run", "-m", stories, "-p", "x", "-t", "0"}), "tandem: --threads: must be at least 1, got 0",
                "tandem run --help");
    check_usage(run_tandem({"run", "-m", stories, "-p", "x", "-n", "-5"}),
                "tandem: --n-predict: must be at least -1, got -5", "tandem run --help");
    check_usage(run_tandem({"run", "-m", stories, "-p", "x", "--weights", "f16"}),
                "tandem: --weights: expected f32, int8 or auto, got 'f16'", "tandem run --help");
    check_usage(run_tandem({"run", "-m", stories}), "tandem: --prompt: required", "tandem run --help");
    check_usage(run_tandem({"status", "--interval", "1"}), "tandem: --interval: needs --watch", "tandem status --help");
    check_usage(run_tandem({"status", "--watch", "--count", "-1"}), "tandem: --count: must be at least 0, got -1",
                "tandem status --help");
    check_usage(run_tandem({"synth", "-o", "/tmp/x.gguf", "--type", "q3"}),
                "tandem: --type: expected bf16, f16, f32, iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q4_k_m, q5_0, q5_1, q5_k, q6_k or "
                "q8_0, got 'q3'",
                "tandem synth --help");
    check_usage(run_tandem({"synth", "-o", "/tmp/x.gguf", "--rope-scaling", "llama3"}),
                "tandem: --rope-scaling: llama3 needs --rope-scale (the factor); without one the file would have no "
                "RoPE scaling",
                "tandem synth --help");
    // Values that are fine still work: the enum behind --weights/--kv is set from its name.
    auto ok = run_tandem({"run", "-m", stories, "-p", "Once", "-n", "3", "--temp", "0", "--weights", "f32", "--kv",
                          "int8", "--json", "-t", "1"});
    INFO(ok.err);
    CHECK(ok.rc == 0);
}

TEST_CASE("tandem: a mistyped command is named, not sent to the model; -- sends any word") {
    check_usage(run_tandem({"runn"}), "tandem: 'runn' is not a command; did you mean 'run'? (to send it as a prompt: tandem -- runn)");
    check_usage(run_tandem({"stauts"}),
                "tandem: 'stauts' is not a command; did you mean 'status'? (to send it as a prompt: tandem -- stauts)");
    // With the command's own options it is the same mistake (not "-m: unknown option").
    check_usage(run_tandem({"runn", "-m", stories, "-p", "x"}),
                "tandem: 'runn' is not a command; did you mean 'run'? (to send it as a prompt: tandem -- runn)");
    check_usage(run_tandem({"--temp", "0", "tokenise"}),
                "tandem: 'tokenise' is not a command; did you mean 'tokenize'? (to send it as a prompt: tandem -- tokenise)");

    test::scratch_dir dir("cli-usage-prompt");
    test::fake_daemon d(dir.file("d.sock"));
    d.route("POST /v1/chat/completions", [](const auto&, auto& s) {
        test::fake::reply_sse(s, {R"({"choices":[{"index":0,"delta":{"content":"ok"}}]})", "[DONE]"}, true);
    });
    auto sent = [&](const std::vector<std::string>& args) {
        const size_t before = d.requests().size();
        auto r = run_tandem(args);
        INFO(r.err);
        CHECK(r.rc == 0);
        REQUIRE(d.requests().size() == before + 1);
        return json::parse(d.requests().back().body)["messages"].back()["content"].get<std::string>();
    };
    // Far from every command, several words, or after --: a prompt.
    CHECK(sent({"--socket", d.path(), "hello"}) == "hello");
    CHECK(sent({"--socket", d.path(), "runn", "fast"}) == "runn fast");
    CHECK(sent({"--socket", d.path(), "--", "runn"}) == "runn");
    CHECK(sent({"--socket", d.path(), "--", "run"}) == "run");   // a command's very name
    CHECK(sent({"--socket", d.path(), "--", "help"}) == "help");
}

TEST_CASE("tandem help [COMMAND] shows help; --help exits 0") {
    auto h = run_tandem({"help"});
    CHECK(h.rc == 0);
    CHECK(h.out.find("Usage: tandem") != std::string::npos);
    CHECK(h.out.find("status") != std::string::npos);
    auto r = run_tandem({"help", "run"});
    CHECK(r.rc == 0);
    CHECK(r.out.find("--n-predict") != std::string::npos);
    CHECK(r.out == run_tandem({"run", "--help"}).out);
    check_usage(run_tandem({"help", "rn"}), "tandem: 'rn' is not a command; did you mean 'run'?");
    check_usage(run_tandem({"help", "run", "chat"}), "tandem: help: takes one command's name");
    CHECK(run_tandem({"--help"}).rc == 0);
    CHECK(run_tandem({"--help"}).out.find("--wait") != std::string::npos);
    const auto hh = run_tandem({"help", "--help"}); // help about help: the main help
    CHECK(hh.rc == 0);
    CHECK(hh.out == run_tandem({"--help"}).out);
    const auto v = run_tandem({"--version"});
    CHECK(v.rc == 0);
    CHECK(v.out == "tandem " TANDEM_VERSION "\n");
}

TEST_CASE("tandem --log is global: accepted after the command too") {
    auto r = run_tandem({"run", "-m", stories, "-p", "Once", "-n", "2", "--temp", "0", "--log", "debug"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("debug") != std::string::npos); // the engine's debug lines are on
    auto s = run_tandem({"status", "--socket", "/nonexistent/tandem.sock", "--log", "info"});
    CHECK(s.rc == 3); // parsed; no daemon there
    check_usage(run_tandem({"status", "--log", "loud"}),
                "tandem: --log: expected trace, debug, info, warn, error, critical or off, got 'loud'",
                "tandem status --help");
}

TEST_CASE("a TANDEM_LOG that names no level warns and keeps the default level") {
    auto r = run_tandem({"run", "-m", stories, "-p", "Once", "-n", "2", "--temp", "0", "--log", "info"}, "",
                        "TANDEM_LOG=loud");
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("TANDEM_LOG=loud is not a log level") != std::string::npos);
    CHECK(r.err.find("using info") != std::string::npos);

    // tandemd: before, every log line was gone ("off"); now the warning, then its usual lines.
    test::scratch_dir dir("cli-usage-log");
    const std::string sock = dir.file("d.sock"), err = dir.file("err");
    const std::string cmd = "TANDEM_LOG=loud " + test::shell_quote(test::binary_dir() + "/daemon/tandemd") +
                            " --model " + test::shell_quote(stories) + " --socket " + test::shell_quote(sock) +
                            " --set workers=false 2>" + test::shell_quote(err) + " & echo $! >" +
                            test::shell_quote(dir.file("pid"));
    REQUIRE(std::system(("sh -c " + test::shell_quote(cmd)).c_str()) == 0);
    const int pid = std::stoi(test::read_text(dir.file("pid")));
    std::string log;
    for (int i = 0; i < 300 && log.find("listening on") == std::string::npos; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        log = test::read_text(err);
    }
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 100 && ::kill(pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    INFO(log);
    CHECK(log.find("TANDEM_LOG=loud is not a log level") != std::string::npos);
    CHECK(log.find("listening on " + sock) != std::string::npos);
}

TEST_CASE("tandemd: parse errors are one line and exit 2, --help exits 0") {
    auto run_d = [](const std::vector<std::string>& args) { return test::run_built("tandemd", args); };
    check_usage(run_d({"--bogus"}), "tandemd: --bogus: unknown option", "tandemd --help");
    check_usage(run_d({"-t", "-5"}), "tandemd: --threads: must be at least 0, got -5", "tandemd --help");
    check_usage(run_d({"--threads", "many"}), "tandemd: --threads: expected an integer, got 'many'", "tandemd --help");
    check_usage(run_d({"--model"}), "tandemd: --model: needs a value", "tandemd --help");
    check_usage(run_d({"extra"}), "tandemd: 'extra': unexpected argument", "tandemd --help");
    auto h = run_d({"--help"});
    CHECK(h.rc == 0);
    CHECK(h.out.find("Exit codes") != std::string::npos);
    const auto v = run_d({"--version"});
    CHECK(v.rc == 0);
    CHECK(v.out == "tandemd " TANDEM_VERSION "\n");
}
