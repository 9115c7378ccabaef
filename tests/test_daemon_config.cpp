// tandemd's config parsing and request validation, without a running daemon.
#include "daemon/api.hpp"
#include "daemon/config.hpp"
#include "runtime/error.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <fstream>

using namespace tandem;
using namespace tandem::daemon;

TEST_CASE("config: key = value lines, comments, errors with file and line") {
    test::scratch_dir dir("config");
    const std::string path = dir.file("tandemd.conf");
    {
        std::ofstream f(path);
        f << "# sample\n\nmodel = /m/model.gguf   # trailing comment\nthreads=4\nsocket_mode = 0640\n"
             "allowed_users = alice, 1001\nallowed_groups = tandem video\nrequest_timeout_s = 2.5\n"
             "listen_tcp = 127.0.0.1:8080\n";
    }
    config c;
    c.load_file(path);
    CHECK(c.model == "/m/model.gguf");
    CHECK(c.threads == 4);
    CHECK(c.socket_mode == 0640);
    CHECK(c.allowed_users == std::vector<std::string>{"alice", "1001"});
    CHECK(c.allowed_groups == std::vector<std::string>{"tandem", "video"});
    CHECK(c.request_timeout_s == 2.5);
    CHECK_NOTHROW(c.validate());

    CHECK(c.set("threads", "-1").has_value());
    CHECK(c.set("max_running", "0").has_value());
    CHECK(c.set("placement", "tpu").has_value());
    CHECK_FALSE(c.set("placement", "gpu").has_value());
    CHECK(c.prefill == "gpu");
    CHECK(c.decode == "cpu");
    CHECK_FALSE(c.set("placement", "local").has_value());
    CHECK_FALSE(c.workers);
    CHECK(c.set("decode", "fpga").has_value());
    CHECK(c.set("prefix_cache", "maybe").has_value());
    CHECK_FALSE(c.set("kv_size_mb", "64").has_value()); // the old name still works
    CHECK(c.kv_cache_mb == 64);
    CHECK(c.set("kv_dtype", "f8").has_value());
    CHECK(c.set("nonsense", "1") == std::optional<std::string>("unknown key"));
    CHECK_FALSE(c.set("placement", "cpu").has_value());
    CHECK(c.workers);
    CHECK(c.prefill == "cpu");
    CHECK(c.set("listen_tcp", "0.0.0.0:80") == std::nullopt);
    CHECK_THROWS_AS(c.validate(), error); // not loopback

    {
        std::ofstream f(path);
        f << "threads = 2\nmax_body_bytes = lots\n";
    }
    config bad;
    try {
        bad.load_file(path);
        FAIL("no error");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find("tandemd.conf:2: max_body_bytes") != std::string::npos);
    }
    CHECK_THROWS_AS(config{}.validate(), error); // no model
    CHECK(!config_keys().empty());
}

TEST_CASE("config: the installed sample systemd/tandemd.conf loads and validates") {
    config c;
    c.load_file(std::string(TANDEM_SOURCE_DIR) + "/systemd/tandemd.conf");
    CHECK(c.model == "/var/lib/tandem/models/model.gguf");
    CHECK(c.socket == "/run/tandem/tandem.sock");
    CHECK(c.listen_tcp.empty());
    CHECK(c.allowed_groups == std::vector<std::string>{"tandem"});
    CHECK_NOTHROW(c.validate());
}

TEST_CASE("api: error bodies are OpenAI's shape and JSON stays valid with bad UTF-8") {
    api_error e{404, "no such model", "invalid_request_error", "model", "model_not_found"};
    const json j = json::parse(error_body(e));
    CHECK(j["error"]["message"] == "no such model");
    CHECK(j["error"]["param"] == "model");
    CHECK(j["error"]["code"] == "model_not_found");
    CHECK(json::parse(dump(json{{"t", std::string("a\xff")}}))["t"] == "a\xef\xbf\xbd");
    CHECK(route_label("/v1/completions?x=1") == "/v1/completions");
    CHECK(route_label("/v1/models/abc") == "/v1/models");
    CHECK(route_label("/etc/passwd") == "other");
}
