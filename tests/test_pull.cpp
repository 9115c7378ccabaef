// `tandem pull` against a hub on loopback (tests/hub_server.py: the tree API, a redirect to a
// storage port, ranges, a dropped connection, a wrong sha256), then ls, show, rm and alias,
// and the daemon's `model = NAME` through the store.
#include "daemon/hub.hpp"
#include "daemon/model_store.hpp"
#include "daemon/tandemd_args.hpp"
#include "daemon_client.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <sstream>
#include <thread>

using namespace tandem;
using json = nlohmann::json;
namespace fs = std::filesystem;
using daemon::hub::parse_reference;

namespace {

const std::string repo = "tt/stories-GGUF";

std::string sha256sum(const std::string& path) {
    const std::string out = path + ".sum";
    const std::string cmd = "sha256sum " + test::shell_quote(path) + " >" + test::shell_quote(out);
    REQUIRE(std::system(cmd.c_str()) == 0);
    return test::read_text(out).substr(0, 64);
}

// The hub's content: a repository with a Q4_K_M, a Q8_0, a split F32 in a folder, a vision
// projector and a README (the models are the shared tiny ones under the names a hub has).
struct test_hub {
    test::scratch_dir dir{"hub"};
    pid_t pid = -1;
    int port = 0;
    fs::path root = dir.path / "root", store = dir.path / "store";

    test_hub() {
        const fs::path r = root / repo;
        fs::create_directories(r / "split");
        fs::copy_file(test::model_path("stories260K.gguf"), r / "stories260K-Q4_K_M.gguf");
        fs::copy_file(test::model_path("TinyStories-656K-Q8_0.gguf"), r / "stories260K-Q8_0.gguf");
        fs::copy_file(test::model_path("stories260K.gguf"), r / "split/stories260K-F32-00001-of-00002.gguf");
        fs::copy_file(test::model_path("TinyStories-656K-IQ4_NL.gguf"), r / "split/stories260K-F32-00002-of-00002.gguf");
        fs::copy_file(test::model_path("TinyStories-656K-F16.gguf"), r / "mmproj-stories-F16.gguf");
        std::ofstream(r / "README.md") << "# stories\n";
        faults(json::object());
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            const std::string script = std::string(TANDEM_SOURCE_DIR) + "/tests/hub_server.py";
            ::execlp("python3", "python3", script.c_str(), root.c_str(), dir.file("ports").c_str(),
                     dir.file("log").c_str(), dir.file("faults.json").c_str(), nullptr);
            ::_exit(127);
        }
        for (int i = 0; i < 300 && !fs::exists(dir.file("ports")); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::istringstream(test::read_text(dir.file("ports"))) >> port;
        REQUIRE(port > 0);
    }
    ~test_hub() {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, nullptr, 0);
    }
    void faults(const json& f) const { std::ofstream(dir.file("faults.json")) << f.dump(); }
    std::vector<json> log() const {
        std::vector<json> out;
        std::istringstream in(test::read_text(dir.file("log")));
        for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
        return out;
    }
    void clear_log() const { std::ofstream(dir.file("log"), std::ios::trunc); }
    std::string env(const std::string& token = "") const {
        return "HF_ENDPOINT=http://127.0.0.1:" + std::to_string(port) + " HF_TOKEN=" + token +
               " NO_PROXY=127.0.0.1 no_proxy=127.0.0.1 TANDEM_MODELS=" + test::shell_quote(store.string());
    }
    test::run_result tandem(const std::vector<std::string>& args, const std::string& token = "") const {
        return test::run_tandem(args, "", env(token));
    }
    fs::path stored(const std::string& hub_path) const { return store / "files" / repo / hub_path; }
    fs::path source(const std::string& hub_path) const { return root / repo / hub_path; }
};

json ls_json(const test_hub& hub) {
    const test::run_result r = hub.tandem({"ls", "--json"});
    REQUIRE(r.rc == 0);
    return json::parse(r.out);
}

} // namespace

TEST_CASE("pull names: org/repo, :QUANT, /FILE.gguf, hf.co and huggingface.co links") {
    std::string why;
    auto r = parse_reference("bartowski/Qwen_Qwen3-0.6B-GGUF", &why);
    REQUIRE(r);
    CHECK(r->repo == "bartowski/Qwen_Qwen3-0.6B-GGUF");
    CHECK(r->quant.empty());
    CHECK(r->file.empty());
    CHECK(r->revision == "main");
    r = parse_reference("hf.co/bartowski/Qwen_Qwen3-0.6B-GGUF:q8_0", &why);
    REQUIRE(r);
    CHECK(r->quant == "q8_0");
    r = parse_reference("https://huggingface.co/org/repo/resolve/v2/sub/x-Q4_K_M.gguf", &why);
    REQUIRE(r);
    CHECK(r->repo == "org/repo");
    CHECK(r->revision == "v2");
    CHECK(r->file == "sub/x-Q4_K_M.gguf");
    r = parse_reference("org/repo/x-00001-of-00002.gguf", &why);
    REQUIRE(r);
    CHECK(r->file == "x-00001-of-00002.gguf");
    CHECK_FALSE(parse_reference("repo-only", &why));
    CHECK(why.find("expected org/repo") != std::string::npos);
    CHECK_FALSE(parse_reference("org/repo/README.md", &why));
    CHECK_FALSE(parse_reference("org/repo:Q4/x.gguf", &why));
    CHECK_FALSE(parse_reference("org/../x.gguf", &why));

    CHECK(daemon::quant_of_file_name("Qwen_Qwen3-0.6B-Q4_K_M.gguf") == "Q4_K_M");
    CHECK(daemon::quant_of_file_name("tinyllama-1.1b-chat-v1.0.q8_0.gguf") == "Q8_0");
    CHECK(daemon::quant_of_file_name("m-IQ4_XS-00002-of-00003.gguf") == "IQ4_XS");
    CHECK(daemon::quant_of_file_name("Llama-3-8B-bf16.gguf") == "BF16");
    CHECK(daemon::quant_of_file_name("model.gguf").empty());
    CHECK(daemon::split_of_file_name("a/m-Q8_0-00002-of-00003.gguf").index == 2);
    CHECK(daemon::split_of_file_name("m-Q8_0.gguf").count == 0);
    CHECK(daemon::check_model_name("org/repo:Q4_K_M") == std::nullopt);
    CHECK(daemon::check_model_name("../x"));
    CHECK(daemon::check_model_name("a:b:c"));
    CHECK(daemon::check_model_name("a:b/c"));
    CHECK(daemon::check_model_name("a b"));
}

TEST_CASE("select_files: the default quant, a quant, a file, split parts together, and what a repo has") {
    const std::vector<daemon::hub::repo_file> tree = daemon::hub::parse_tree(R"([
      {"type":"directory","oid":"0","path":"big","size":0},
      {"type":"file","oid":"a","size":10,"path":"README.md"},
      {"type":"file","oid":"b","size":134,"path":"m-Q8_0.gguf","lfs":{"oid":"AB","size":800,"pointerSize":134}},
      {"type":"file","oid":"c","size":134,"path":"m-Q4_K_M.gguf","lfs":{"oid":"cd","size":400,"pointerSize":134}},
      {"type":"file","oid":"d","size":134,"path":"big/m-F16-00002-of-00002.gguf","lfs":{"oid":"e2","size":5,"pointerSize":134}},
      {"type":"file","oid":"e","size":134,"path":"big/m-F16-00001-of-00002.gguf","lfs":{"oid":"e1","size":9,"pointerSize":134}},
      {"type":"file","oid":"f","size":134,"path":"mmproj-m-F16.gguf","lfs":{"oid":"ff","size":3,"pointerSize":134}}])");
    REQUIRE(tree.size() == 6);
    // A hub's path that would leave the repository's folder is no file to pull.
    CHECK(daemon::hub::parse_tree(R"([{"type":"file","path":"../../x-Q4_K_M.gguf","size":1},
      {"type":"file","path":"/etc/x.gguf","size":1}, {"type":"file","path":"a/./b.gguf","size":1},
      {"type":"file","path":"a//b.gguf","size":1}, {"type":"file","path":"a\\b.gguf","size":1}])").empty());
    CHECK(tree[1].sha256 == "ab"); // the LFS oid, lower-cased
    CHECK(tree[1].size == 800);    // the file's size, not its pointer's
    std::string why;
    auto sel = daemon::hub::select_files(*parse_reference("o/r", &why), tree);
    REQUIRE(sel.files.size() == 1);
    CHECK(sel.files[0].path == "m-Q4_K_M.gguf");
    sel = daemon::hub::select_files(*parse_reference("o/r:f16", &why), tree);
    REQUIRE(sel.files.size() == 2);
    CHECK(sel.files[0].path == "big/m-F16-00001-of-00002.gguf");
    CHECK(sel.files[1].path == "big/m-F16-00002-of-00002.gguf");
    CHECK(daemon::hub::store_name(*parse_reference("o/r:f16", &why), sel) == "o/r:F16");
    sel = daemon::hub::select_files(*parse_reference("o/r/big/m-F16-00002-of-00002.gguf", &why), tree);
    CHECK(sel.files.size() == 2);
    sel = daemon::hub::select_files(*parse_reference("o/r:Q5_K_M", &why), tree);
    CHECK(sel.files.empty());
    CHECK(sel.error == "o/r has no Q5_K_M file (it has m-F16 (2 parts), m-Q4_K_M.gguf, m-Q8_0.gguf)");
}

TEST_CASE("tandem pull org/repo: its Q4_K_M through the redirect, verified; ls, show, info and rm by name") {
    test_hub hub;
    const test::run_result r = hub.tandem({"pull", repo});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("pulled tt/stories-GGUF:Q4_K_M") != std::string::npos);
    CHECK(r.err.find("pull: stories260K-Q4_K_M.gguf") != std::string::npos); // progress, a line a second off a terminal
    const fs::path file = hub.stored("stories260K-Q4_K_M.gguf");
    CHECK(test::read_bytes(file.string()) == test::read_bytes(hub.source("stories260K-Q4_K_M.gguf").string()));
    CHECK_FALSE(fs::exists(file.string() + ".partial"));
    // The hub's tree, its resolve route, then the storage host it redirected to; no token anywhere.
    const std::vector<json> log = hub.log();
    REQUIRE(log.size() == 3);
    CHECK(log[0]["path"] == "/api/models/tt/stories-GGUF/tree/main?recursive=true");
    CHECK(log[1]["path"] == "/tt/stories-GGUF/resolve/main/stories260K-Q4_K_M.gguf");
    CHECK(log[2]["server"] == "storage");

    const json ls = ls_json(hub);
    REQUIRE(ls.size() == 1);
    const json& m = ls[0];
    CHECK(m["name"] == "tt/stories-GGUF:Q4_K_M");
    CHECK(m["source"] == "http://127.0.0.1:" + std::to_string(hub.port) + "/tt/stories-GGUF");
    CHECK(m["revision"] == "0123456789abcdef0123456789abcdef01234567"); // X-Repo-Commit
    CHECK(m["sha256"] == sha256sum(file.string()));
    CHECK(m["size"] == int64_t(fs::file_size(file)));
    CHECK(m["architecture"] == "llama");
    CHECK(m["quantization"] == "Q4_K_M");
    CHECK(m["files"][0]["path"] == "files/tt/stories-GGUF/stories260K-Q4_K_M.gguf");
    CHECK(fs::exists(hub.store / "manifests/tt/stories-GGUF:Q4_K_M.json"));

    // On a terminal (script(1) gives it one): the bar, redrawn in place, with speed and time left.
    const std::string cmd = hub.env() + " script -qec " +
                            test::shell_quote(test::binary_dir() + "/daemon/tandem pull " + repo + ":Q8_0") + " " +
                            test::shell_quote(hub.dir.file("tty.txt")) + " >/dev/null 2>&1";
    if (std::system("command -v script >/dev/null") == 0) {
        CHECK(std::system(cmd.c_str()) == 0);
        const std::string tty = test::read_text(hub.dir.file("tty.txt"));
        INFO(tty);
        CHECK(tty.find("\r\033[Kstories260K-Q8_0.gguf 100% [########################] ") != std::string::npos);
        CHECK(tty.find("/s  0:00 left") != std::string::npos);
        CHECK(tty.find("pull: stories260K-Q8_0.gguf ") != std::string::npos);
        CHECK(hub.tandem({"rm", repo + ":Q8_0"}).rc == 0);
    } else {
        MESSAGE("skipped: no script(1) for a terminal");
    }

    // Pulled again: nothing fetched.
    hub.clear_log();
    CHECK(hub.tandem({"pull", repo}).rc == 0);
    CHECK(hub.log().size() == 1);

    // show: the source, then what `tandem info` says; info and run take the name too.
    const test::run_result show = hub.tandem({"show", repo});
    INFO(show.err);
    CHECK(show.rc == 0);
    CHECK(show.out.find("  source         http://127.0.0.1:") != std::string::npos);
    CHECK(show.out.find("  tokenizer      ") != std::string::npos);
    const test::run_result sj = hub.tandem({"show", "tt/stories-GGUF:q4_k_m", "--json"});
    REQUIRE(sj.rc == 0);
    CHECK(json::parse(sj.out)["info"]["arch"] == "llama");
    CHECK(hub.tandem({"info", "tt/stories-GGUF:Q4_K_M"}).rc == 0);
    const test::run_result run = hub.tandem({"run", "-m", repo, "-p", "Once", "-n", "4", "--temp", "0", "-t", "1"});
    INFO(run.err);
    CHECK(run.rc == 0);

    const test::run_result gone = hub.tandem({"rm", repo});
    CHECK(gone.rc == 0);
    CHECK(gone.out == "removed tt/stories-GGUF:Q4_K_M\n");
    CHECK_FALSE(fs::exists(file));
    CHECK(ls_json(hub).empty());
    const test::run_result missing = hub.tandem({"show", repo});
    CHECK(missing.rc == 1);
    CHECK(missing.err.find("no model 'tt/stories-GGUF' in the store") != std::string::npos);
}

TEST_CASE("tandem pull: a quant, a file, links, split parts whole, a paginated tree") {
    test_hub hub;
    hub.faults({{"page_size", 2}});
    test::run_result r = hub.tandem({"pull", "hf.co/tt/stories-GGUF:f32"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    for (const char* part : {"split/stories260K-F32-00001-of-00002.gguf", "split/stories260K-F32-00002-of-00002.gguf"})
        CHECK(test::read_bytes(hub.stored(part).string()) == test::read_bytes(hub.source(part).string()));
    r = hub.tandem({"pull", "https://huggingface.co/tt/stories-GGUF/blob/main/stories260K-Q8_0.gguf"});
    CHECK(r.rc == 0);
    const json ls = ls_json(hub);
    REQUIRE(ls.size() == 2);
    CHECK(ls[0]["name"] == "tt/stories-GGUF:F32");
    CHECK(ls[0]["files"].size() == 2);
    CHECK(ls[1]["name"] == "tt/stories-GGUF:Q8_0");
    r = hub.tandem({"pull", "tt/stories-GGUF/none-Q2_K.gguf"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("has no file none-Q2_K.gguf (it has ") != std::string::npos);
    r = hub.tandem({"pull", "tt/nothing-here"});
    CHECK(r.rc == 1);
    CHECK(r.err.find(": 404: no such repository") != std::string::npos);
}

TEST_CASE("tandem pull: a connection dropped half-way resumes with a range, in the next pull or the same") {
    test_hub hub;
    const std::string q8 = "stories260K-Q8_0.gguf";
    const int64_t size = int64_t(fs::file_size(hub.source(q8))), half = size / 2;
    hub.faults({{"drop", {{repo + "/" + q8, half}}}});
    test::run_result r = hub.tandem({"pull", repo + ":Q8_0", "--retries", "0"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("resumes on the next pull") != std::string::npos);
    const fs::path partial = hub.stored(q8).string() + ".partial";
    REQUIRE(fs::exists(partial));
    CHECK(int64_t(fs::file_size(partial)) == half);
    CHECK_FALSE(fs::exists(hub.stored(q8))); // never taken for the model
    CHECK(ls_json(hub).empty());
    hub.clear_log();
    r = hub.tandem({"pull", repo + ":Q8_0"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(test::read_bytes(hub.stored(q8).string()) == test::read_bytes(hub.source(q8).string()));
    CHECK_FALSE(fs::exists(partial));
    const std::vector<json> log = hub.log();
    REQUIRE(log.size() == 3);
    CHECK(log[2]["range"] == "bytes=" + std::to_string(half) + "-");

    // Within one pull: the drop, then the rest from where it stopped.
    const std::string q4 = "stories260K-Q4_K_M.gguf";
    hub.faults({{"drop", {{repo + "/" + q4, 100000}}}});
    hub.clear_log();
    r = hub.tandem({"pull", repo});
    REQUIRE(r.rc == 0);
    CHECK(test::read_bytes(hub.stored(q4).string()) == test::read_bytes(hub.source(q4).string()));
    int n_storage = 0;
    for (const json& e : hub.log()) n_storage += e["server"] == "storage";
    CHECK(n_storage == 2);
    CHECK(hub.log().back()["range"] == "bytes=100000-");

    // A busy storage host (503): tried again like a drop, up to --retries.
    const std::string part = "split/stories260K-F32-00002-of-00002.gguf";
    hub.faults({{"fail", {{repo + "/" + part, {503, 1}}}}});
    r = hub.tandem({"pull", repo + ":F32", "--retries", "0"});
    CHECK(r.rc == 1);
    CHECK(r.err.find(": HTTP 503") != std::string::npos);
    hub.faults({{"fail", {{repo + "/" + part, {503, 2}}}}});
    r = hub.tandem({"pull", repo + ":F32"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("HTTP 503 at 0 B; resuming") != std::string::npos);
    CHECK(test::read_bytes(hub.stored(part).string()) == test::read_bytes(hub.source(part).string()));
}

TEST_CASE("tandem pull: a file whose sha256 is not the hub's is refused, and nothing of it is kept") {
    test_hub hub;
    const std::string q8 = "stories260K-Q8_0.gguf";
    hub.faults({{"bad_sha", {repo + "/" + q8}}});
    const test::run_result r = hub.tandem({"pull", repo + ":Q8_0"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("sha256 " + sha256sum(hub.source(q8).string()) + " but the hub lists ffff") != std::string::npos);
    CHECK_FALSE(fs::exists(hub.stored(q8)));
    CHECK_FALSE(fs::exists(hub.stored(q8).string() + ".partial"));
    CHECK(ls_json(hub).empty());
    // Where the tree lists no LFS oid, the resolve route's X-Linked-Etag is the one checked.
    hub.faults({{"bad_sha", {repo + "/" + q8}}, {"no_lfs", true}});
    test::run_result again = hub.tandem({"pull", repo + ":Q8_0"});
    CHECK(again.rc == 1);
    CHECK(again.err.find("but the hub lists ffff") != std::string::npos);
    CHECK_FALSE(fs::exists(hub.stored(q8)));
    hub.faults({{"no_lfs", true}});
    again = hub.tandem({"pull", repo + ":Q8_0"});
    INFO(again.err);
    CHECK(again.rc == 0);
    CHECK(ls_json(hub)[0]["sha256"] == sha256sum(hub.source(q8).string()));
}

TEST_CASE("HF_TOKEN goes to the hub, never to the storage host it redirects to") {
    test_hub hub;
    hub.faults({{"token", "hf_secret"}});
    test::run_result r = hub.tandem({"pull", repo});
    CHECK(r.rc == 1);
    CHECK(r.err.find("401: the hub wants a token (set HF_TOKEN)") != std::string::npos);
    hub.clear_log();
    r = hub.tandem({"pull", repo}, "hf_secret");
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const std::vector<json> log = hub.log();
    REQUIRE(log.size() == 3);
    CHECK(log[0]["auth"] == true);
    CHECK(log[1]["auth"] == true);
    CHECK(log[2]["server"] == "storage");
    CHECK(log[2]["auth"] == false);
}

TEST_CASE("tandem alias: a file or a stored name; rm keeps files an alias uses; tandemd's model = NAME") {
    test_hub hub;
    REQUIRE(hub.tandem({"pull", repo}).rc == 0);
    const std::string tiny = test::model_path("TinyStories-656K-Q8_0.gguf");
    test::run_result r = hub.tandem({"alias", "tiny", tiny});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(hub.tandem({"alias", "stories", repo}).rc == 0);
    CHECK(hub.tandem({"alias", "../bad", tiny}).rc == 1);
    CHECK(hub.tandem({"alias", "x", "/no/such.gguf"}).rc == 1);
    json ls = ls_json(hub);
    REQUIRE(ls.size() == 3);
    CHECK(ls[0]["name"] == "stories");
    CHECK(ls[0]["kind"] == "alias");
    CHECK(ls[0]["source"] == "tt/stories-GGUF:Q4_K_M");
    CHECK(ls[1]["name"] == "tiny");
    CHECK(ls[1]["quantization"] == "Q8_0");
    CHECK(ls[1]["files"][0]["path"] == fs::absolute(tiny).lexically_normal().string());

    // The daemon's config: a name resolves through the store, a path is left as it is.
    daemon::config cfg;
    cfg.store = hub.store.string();
    cfg.model = "stories";
    daemon::resolve_store_model(cfg);
    CHECK(cfg.model == hub.stored("stories260K-Q4_K_M.gguf").string());
    CHECK(cfg.model_id == "stories");
    cfg.model = "nothing";
    cfg.model_id.clear();
    try {
        daemon::resolve_store_model(cfg);
        FAIL("no error");
    } catch (const std::exception& e) {
        CHECK(std::string(e.what()).find("model: no model 'nothing' in the store " + hub.store.string() +
                                         " (it has stories, tiny, tt/stories-GGUF:Q4_K_M)") != std::string::npos);
    }
    cfg.model = "/no/such.gguf";
    daemon::resolve_store_model(cfg);
    CHECK(cfg.model == "/no/such.gguf");

    // rm of the pulled name keeps the file the alias uses; rm of an alias of a file outside the
    // store keeps it.
    REQUIRE(hub.tandem({"rm", "tt/stories-GGUF:Q4_K_M"}).rc == 0);
    CHECK(fs::exists(hub.stored("stories260K-Q4_K_M.gguf")));
    REQUIRE(hub.tandem({"rm", "tiny"}).rc == 0);
    CHECK(fs::exists(tiny));
    r = hub.tandem({"run", "-m", "stories", "-p", "Once", "-n", "2", "--temp", "0", "-t", "1"});
    CHECK(r.rc == 0);
    ls = ls_json(hub);
    REQUIRE(ls.size() == 1);
    r = hub.tandem({"rm", "nothing"});
    CHECK(r.rc == 1);
    CHECK(r.err.find("(it has stories)") != std::string::npos);
    REQUIRE(hub.tandem({"rm", "stories"}).rc == 0); // the last name of the store's file: it goes
    CHECK_FALSE(fs::exists(hub.stored("stories260K-Q4_K_M.gguf")));
}

TEST_CASE("tandemd --model NAME serves a pulled model under its name; tandem --model NAME asks it") {
    test_hub hub;
    REQUIRE(hub.tandem({"pull", repo}).rc == 0);
    test::daemon_process d;
    d.sock = hub.dir.file("d.sock");
    d.log = hub.dir.file("tandemd.log");
    d.spawn({"--model", repo, "--socket", d.sock, "--threads", "1", "--log", "warn", "--set", "kv_pool=" + d.sock + ".kv",
             "--set", "placement=local"},
            {"TANDEM_MODELS=" + hub.store.string()});
    REQUIRE(d.wait_ready());
    const test::http_response models = test::request(d.sock, "GET", "/v1/models");
    CHECK(json::parse(models.body)["data"][0]["id"] == "tt/stories-GGUF:Q4_K_M");
    const test::run_result r =
        test::run_tandem({"--socket", d.sock, "--model", "tt/stories-GGUF:Q4_K_M", "--raw", "-n", "4", "Once"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK_FALSE(r.out.empty());
    CHECK(d.stop() == 0);
}

TEST_CASE("a model pulled while tandemd runs is served by name without a restart, listed in /v1/models") {
    test_hub hub;
    test::daemon_process d;
    d.sock = hub.dir.file("live.sock");
    d.log = hub.dir.file("live.log");
    // (with workers: each model's pool is a file beside kv_pool, whatever its store name holds)
    d.spawn({"--model", test::model_path("TinyStories-656K-Q8_0.gguf"), "--socket", d.sock, "--threads", "1", "--log",
             "warn", "--set", "kv_pool=" + d.sock + ".kv"},
            {"TANDEM_MODELS=" + hub.store.string()});
    REQUIRE(d.wait_ready());
    const auto ids = [&d] {
        std::vector<std::string> out;
        const test::http_response r = test::request(d.sock, "GET", "/v1/models");
        INFO(r.status, " ", r.body);
        REQUIRE(r.status == 200);
        const json models = json::parse(r.body);
        for (const json& m : models.at("data"))
            out.push_back(m["id"].get<std::string>() + (m["loaded"].get<bool>() ? " loaded" : ""));
        return out;
    };
    CHECK(ids() == std::vector<std::string>{"TinyStories-656K-Q8_0 loaded"});
    const json ask = {{"model", "tt/stories-GGUF:Q4_K_M"}, {"prompt", "Once"}, {"max_tokens", 4}, {"temperature", 0}};
    const test::http_response before = test::request(d.sock, "POST", "/v1/completions", ask.dump());
    CHECK(before.status == 404);
    CHECK(before.body.find("model_not_found") != std::string::npos);

    REQUIRE(hub.tandem({"pull", repo}).rc == 0); // the daemon is not told
    CHECK(ids() == std::vector<std::string>{"TinyStories-656K-Q8_0 loaded", "tt/stories-GGUF:Q4_K_M"});
    const test::run_result r =
        test::run_tandem({"--socket", d.sock, "--model", "tt/stories-GGUF:Q4_K_M", "--raw", "-n", "4", "Once"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK_FALSE(r.out.empty());
    CHECK(ids() == std::vector<std::string>{"TinyStories-656K-Q8_0 loaded", "tt/stories-GGUF:Q4_K_M loaded"});
    // The repository's name alone picks its Q4_K_M, the same model (one entry, not two).
    const json by_repo = {{"model", repo}, {"prompt", "Once"}, {"max_tokens", 4}, {"temperature", 0}};
    const test::http_response again = test::request(d.sock, "POST", "/v1/completions", by_repo.dump());
    CHECK(again.status == 200);
    CHECK(ids().size() == 2);
    // A path is never a model name a request may give.
    const json path = {{"model", test::model_path("stories260K.gguf")}, {"prompt", "Once"}, {"max_tokens", 1}};
    CHECK(test::request(d.sock, "POST", "/v1/completions", path.dump()).status == 404);
    CHECK(d.stop() == 0);
}
