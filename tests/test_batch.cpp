// `tandem batch`: the OpenAI Batch file format in and out, in-process (-m) and by a running
// tandemd (--socket); bad lines, resuming an output file, a run killed half way.
#include "batch_lines.hpp"
#include "daemon/batch_file.hpp"
#include "daemon_client.hpp"
#include "fake_daemon.hpp"
#include "runtime/error.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <fstream>
#include <map>
#include <set>

using namespace tandem;
using test::json;
using test::answer_of, test::completion, test::completions_file, test::id_counts, test::line;

namespace {

const std::string stories = test::model_path("stories260K.gguf");

test::scratch_dir& scratch() {
    static test::scratch_dir d("batch");
    return d;
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
}

std::vector<json> read_lines(const std::string& path) {
    std::vector<json> out;
    std::ifstream f(path);
    for (std::string l; std::getline(f, l);) out.push_back(json::parse(l));
    return out;
}

} // namespace

TEST_CASE("batch_file: lines checked one by one, duplicates refused, a cut-short output line not counted") {
    namespace batch = daemon::batch;
    using namespace batch;
    CHECK(std::holds_alternative<request_line>(
        parse_line(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}})", 1)));
    const auto err = [](std::string_view text) {
        auto p = parse_line(text, 7);
        REQUIRE(std::holds_alternative<line_error>(p));
        return std::get<line_error>(p);
    };
    CHECK(err("{").code == "invalid_json");
    // A number past a double's range is invalid JSON too, not an exception (found by fuzz_text).
    CHECK(err(R"({"custom_id":"a","body":{"max_tokens":5555555555555555555e5555}})").code == "invalid_json");
    CHECK(err("[1]").message == "line 7: not a JSON object");
    CHECK(err(R"({"custom_id":"a","method":"GET","url":"/v1/completions","body":{}})").message.find("POST") !=
          std::string::npos);
    CHECK(err(R"({"custom_id":"a","method":"POST","url":"/v1/files","body":{}})").message.find("/v1/embeddings") !=
          std::string::npos);
    CHECK(err(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":[]})").custom_id == "a");
    CHECK(err(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"stream":true}})")
              .message.find("stream") != std::string::npos);
    CHECK(err(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{},"x":1})").message.find("\"x\"") !=
          std::string::npos);
    CHECK(err(R"({"method":"POST","url":"/v1/completions","body":{}})").custom_id.empty());

    const input in = read_input("{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{}}\r\n"
                                "\n  \nnope\n");
    CHECK(in.requests.size() == 1);
    REQUIRE(in.errors.size() == 1);
    CHECK(in.errors[0].line == 4);
    const std::string a = R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{}})";
    CHECK_THROWS_WITH_AS(read_input(a + "\n{}\n" + a + "\n"), doctest::Contains("lines 1 and 3"), tandem::error);

    const std::string out = scratch().file("done.jsonl");
    const batch::json ok = result_line("a", 200, R"({"id":"cmpl-1","choices":[]})");
    CHECK(ok["response"]["request_id"] == "cmpl-1");
    const batch::json bad = error_line(in.errors[0]);
    const std::string whole = ok.dump() + "\n" + bad.dump() + "\n";
    write_file(out, whole + R"({"id":"batch_req_x","custom_id":"b","respo)");
    const done_set d = read_done(out);
    CHECK(d.ids == std::set<std::string>{"a"});
    CHECK(d.lines == std::set<int64_t>{4});
    CHECK(d.whole_bytes == whole.size());
    write_file(out, whole + "{\"not\": \"a result\"}\n");
    CHECK_THROWS_WITH_AS(read_done(out), doctest::Contains("line 3 is not a batch output line"), tandem::error);
    CHECK(read_done(scratch().file("missing.jsonl")).size() == 0);
}

TEST_CASE("tandem batch -m: every line answered as tandemd answers it; bad lines get their own error lines") {
    const std::string in = scratch().file("mixed.jsonl"), out = scratch().file("mixed.out.jsonl");
    const json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me about Lily"}}}},
                       {"max_tokens", 24},
                       {"temperature", 0}};
    const json bodies[] = {completion("Once upon a time", 32), chat, completion("The dog ran", 16)};
    std::string text = line("c1", "/v1/completions", bodies[0]).dump() + "\n" +
                       line("chat", "/v1/chat/completions", bodies[1]).dump() + "\n" + "not json\n" +
                       line("c2", "/v1/completions", bodies[2]).dump() + "\n" +
                       line("unknown-field", "/v1/completions", {{"prompt", "x"}, {"bogus", 1}}).dump() + "\n" +
                       line("emb", "/v1/embeddings", {{"input", "Lily"}}).dump() + "\n" +
                       R"({"custom_id":"get","method":"GET","url":"/v1/completions","body":{}})" + "\n";
    write_file(in, text);
    std::filesystem::remove(out);
    const auto r = test::run_tandem({"batch", in, "-o", out, "-m", stories, "--threads", "1"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(r.err.find("7 lines: 4 answered, 3 errors, 0 skipped (done before), 0 left") != std::string::npos);
    const std::vector<json> lines = read_lines(out);
    REQUIRE(lines.size() == 7);
    std::map<std::string, json> by_id;
    int null_ids = 0;
    for (const json& l : lines) {
        CHECK(l["id"].get<std::string>().rfind("batch_req_", 0) == 0);
        if (l["custom_id"].is_null()) {
            ++null_ids;
            CHECK(l["response"].is_null());
            CHECK(l["error"]["code"] == "invalid_json");
            CHECK(l["error"]["line"] == 3);
        } else {
            by_id[l["custom_id"].get<std::string>()] = l;
        }
    }
    CHECK(null_ids == 1);
    CHECK(by_id["get"]["error"]["code"] == "invalid_line");
    CHECK(by_id["unknown-field"]["response"]["status_code"] == 400);
    CHECK(by_id["unknown-field"]["response"]["body"]["error"]["param"] == "bogus");
    CHECK(by_id["emb"]["response"]["status_code"] == 200);
    CHECK(by_id["emb"]["response"]["body"]["data"][0]["embedding"].size() > 0);
    CHECK(by_id["c1"]["response"]["request_id"] == by_id["c1"]["response"]["body"]["id"]);

    // The same bodies sent to tandemd (its workers, INT8 as in-process): the same answers.
    test::daemon_process d;
    d.start(scratch().file("ref.sock"));
    REQUIRE(d.wait_ready());
    const std::pair<const char*, const char*> sent[] = {
        {"c1", "/v1/completions"}, {"chat", "/v1/chat/completions"}, {"c2", "/v1/completions"}};
    for (size_t i = 0; i < 3; ++i) {
        const auto want = test::post(d.sock, sent[i].second, bodies[i]);
        REQUIRE(want.status == 200);
        const json& got = by_id[sent[i].first]["response"];
        CHECK(got["status_code"] == 200);
        CHECK(answer_of(got["body"]) == answer_of(want.j()));
    }

    // --socket: the same file by the running daemon, into a fresh output file.
    const std::string out2 = scratch().file("mixed.socket.jsonl");
    std::filesystem::remove(out2);
    const auto s = test::run_tandem({"batch", in, "-o", out2, "--socket", d.sock});
    INFO(s.err);
    REQUIRE(s.rc == 0);
    std::map<std::string, json> by_id2;
    for (const json& l : read_lines(out2))
        if (l["custom_id"].is_string()) by_id2[l["custom_id"].get<std::string>()] = l;
    CHECK(by_id2.size() == by_id.size());
    for (const char* id : {"c1", "chat", "c2"})
        CHECK(answer_of(by_id2[id]["response"]["body"]) == answer_of(by_id[id]["response"]["body"]));
}

TEST_CASE("tandem batch: a rerun goes on where the output file stops; nothing twice, nothing lost") {
    const std::string in = scratch().file("resume.jsonl"), out = scratch().file("resume.out.jsonl");
    write_file(in, completions_file(12, 8));
    std::filesystem::remove(out);
    const auto full = test::run_tandem({"batch", in, "-o", out, "-m", stories, "--threads", "1"});
    REQUIRE(full.rc == 0);
    const std::vector<json> all = read_lines(out);
    REQUIRE(all.size() == 12);

    // Keep 5 whole lines and half of the sixth, as a crash while writing would leave them.
    std::string kept;
    for (size_t i = 0; i < 5; ++i) kept += all[i].dump() + "\n";
    const std::string sixth = all[5].dump();
    write_file(out, kept + sixth.substr(0, sixth.size() / 2));
    const auto again = test::run_tandem({"batch", in, "-o", out, "-m", stories, "--threads", "1"});
    INFO(again.err);
    REQUIRE(again.rc == 0);
    CHECK(again.err.find("5 of 12 lines were answered") != std::string::npos);
    CHECK(again.err.find("7 answered, 0 errors, 5 skipped") != std::string::npos);
    const std::vector<json> resumed = read_lines(out); // (parses: the half line is gone)
    CHECK(resumed.size() == 12);
    const auto counts = id_counts(resumed);
    CHECK(counts.size() == 12);
    for (const auto& c : counts) CHECK_MESSAGE(c.second == 1, c.first);
    // The lines answered again are the answers of the first run (greedy).
    std::map<std::string, json> first;
    for (const json& l : all) first[l["custom_id"].get<std::string>()] = answer_of(l["response"]["body"]);
    for (const json& l : resumed) CHECK(answer_of(l["response"]["body"]) == first[l["custom_id"].get<std::string>()]);

    // Nothing left: a third run sends nothing.
    const auto third = test::run_tandem({"batch", in, "-o", out, "-m", stories});
    CHECK(third.rc == 0);
    CHECK(third.err.find("12 of 12 lines were answered") != std::string::npos);
    CHECK(read_lines(out).size() == 12);
}

TEST_CASE("tandem batch killed half way (SIGKILL): the rerun completes it, every custom_id exactly once") {
    const std::string in = scratch().file("killed.jsonl"), out = scratch().file("killed.out.jsonl");
    constexpr int n = 40;
    write_file(in, completions_file(n, 64));
    std::filesystem::remove(out);
    test::daemon_process p; // (its spawn runs any binary)
    // (TMPDIR: the killed run's private socket directory stays behind in the scratch directory)
    p.spawn({"batch", in, "-o", out, "-m", stories, "--threads", "1", "--max-running", "2", "--concurrency", "2"},
            {"TMPDIR=" + scratch().path.string()}, test::binary_dir() + "/daemon/tandem");
    REQUIRE(p.pid > 0);
    const auto lines_in = [&] {
        std::ifstream f(out);
        return std::count(std::istreambuf_iterator<char>(f), {}, '\n');
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (lines_in() < 4 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ::kill(p.pid, SIGKILL);
    CHECK(p.wait_exit(10) == 128 + SIGKILL);
    const auto before = lines_in();
    INFO("lines before the kill: ", before);
    CHECK(before >= 4);
    CHECK(before < n); // killed half way (else the check below proves nothing)

    const auto r = test::run_tandem({"batch", in, "-o", out, "-m", stories, "--threads", "1"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const auto counts = id_counts(read_lines(out));
    CHECK(counts.size() == size_t(n));
    for (const auto& c : counts) CHECK_MESSAGE(c.second == 1, c.first);
}

TEST_CASE("tandem batch: refusals before anything runs, and exit codes") {
    const std::string in = scratch().file("refuse.jsonl"), out = scratch().file("refuse.out.jsonl");
    const std::string a = line("a", "/v1/completions", completion("x", 4)).dump();
    write_file(in, a + "\n" + a + "\n");
    std::filesystem::remove(out);
    auto r = test::run_tandem({"batch", in, "-o", out, "-m", stories});
    CHECK(r.rc == 1);
    CHECK(r.err.find("custom_id \"a\" is on lines 1 and 2") != std::string::npos);
    CHECK(!std::filesystem::exists(out));

    // An output file that is not one: left as it was.
    write_file(in, a + "\n");
    write_file(out, "precious data\n");
    r = test::run_tandem({"batch", in, "-o", out, "-m", stories});
    CHECK(r.rc == 1);
    CHECK(r.err.find("not a batch output line") != std::string::npos);
    CHECK(test::read_text(out) == "precious data\n");
    std::filesystem::remove(out);

    // No daemon on the socket: exit 3, nothing written.
    r = test::run_tandem({"batch", in, "-o", out, "--socket", scratch().file("nobody.sock")});
    CHECK(r.rc == 3);
    CHECK(test::read_text(out).empty());
    // -m and --socket together: a usage error; a model that does not load: exit 1, why.
    CHECK(test::run_tandem({"batch", in, "-o", out, "-m", stories, "--socket", "x"}).rc == 2);
    // Several times: the wait for the model once raced the failed server's last connection
    // and hung (rc 124 here, from run_built's time limit).
    write_file(scratch().file("bad.gguf"), "GGUF but not really");
    for (int i = 0; i < 12; ++i) {
        r = test::run_tandem({"batch", in, "-o", out, "-m", scratch().file("bad.gguf")});
        REQUIRE(r.rc == 1);
        CHECK(r.err.find("the model did not load") != std::string::npos);
    }
    // An in-process placement that needs workers is refused by name.
    r = test::run_tandem({"batch", in, "-o", out, "-m", stories, "--set", "placement=cpu"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("placement cpu") != std::string::npos);
}

TEST_CASE("tandem batch --socket: lines are background work unless they say; a busy daemon is waited for") {
    test::scratch_dir dir("batch-fake");
    test::fake_daemon d(dir.file("d.sock"));
    std::atomic<int> n_posts{0};
    d.route("GET /health", [](const test::fake::request&, test::fake::socket& s) {
        test::fake::reply_json(s, 200, R"({"status":"ok"})");
    });
    d.route("POST /v1/completions", [&](const test::fake::request&, test::fake::socket& s) {
        if (n_posts++ == 0) { // the first is told to come back
            test::fake::reply_json(s, 503, R"({"error":{"message":"loading","type":"server_error"}})",
                                   "Retry-After: 0\r\n");
            return;
        }
        test::fake::reply_json(s, 200, R"({"id":"cmpl-fake","usage":{"prompt_tokens":3,"completion_tokens":2}})");
    });
    const std::string in = dir.file("in.jsonl"), out = dir.file("out.jsonl");
    write_file(in, line("plain", "/v1/completions", {{"prompt", "x"}}).dump() + "\n" +
                       line("urgent", "/v1/completions", {{"prompt", "y"}, {"priority", 5}}).dump() + "\n");
    const auto priorities = [&] { // custom prompt -> the priority the daemon got
        std::map<std::string, json> got;
        for (const auto& r : d.requests())
            if (r.target == "/v1/completions") {
                const json b = json::parse(r.body);
                got[b["prompt"].get<std::string>()] = b.value("priority", json());
            }
        return got;
    };
    auto r = test::run_tandem({"batch", in, "-o", out, "--socket", d.path(), "--concurrency", "1"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(n_posts == 3); // one 503, answered again
    auto got = priorities();
    CHECK(got["x"] == -1);
    CHECK(got["y"] == 5);
    const auto lines = read_lines(out);
    REQUIRE(lines.size() == 2);
    for (const json& l : lines) CHECK(l["response"]["status_code"] == 200);
    CHECK(r.err.find("6 prompt and 4 generated tokens") != std::string::npos);

    std::filesystem::remove(out);
    r = test::run_tandem({"batch", in, "-o", out, "--socket", d.path(), "--priority", "3"});
    REQUIRE(r.rc == 0);
    got = priorities();
    CHECK(got["x"] == 3);
    CHECK(got["y"] == 5);

    // A daemon busy past --wait: the line is left out, for a rerun; exit 1.
    d.route("POST /v1/completions", [](const test::fake::request&, test::fake::socket& s) {
        test::fake::reply_json(s, 429, R"({"error":{"message":"busy","type":"server_error"}})", "Retry-After: 0\r\n");
    });
    std::filesystem::remove(out);
    r = test::run_tandem({"batch", in, "-o", out, "--socket", d.path(), "--wait", "0.3"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("2 lines left unanswered") != std::string::npos);
    CHECK(test::read_text(out).empty());
}
