// tandemd's config parsing and request validation, without a running daemon.
#include "daemon/reply.hpp"
#include "daemon/routes.hpp"
#include "daemon/config.hpp"
#include "daemon/model_host.hpp"
#include "daemon/peer_cred.hpp"
#include "daemon/worker_spec.hpp"
#include "ipc/wire.hpp"
#include "runtime/error.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

#include <unistd.h>

using namespace tandem;
using namespace tandem::daemon;

TEST_CASE("config: key = value lines, comments, errors with file and line") {
    test::scratch_dir dir("config");
    const std::string path = dir.file("tandemd.conf");
    {
        std::ofstream f(path);
        f << "# sample\n\nmodel = /m/model.gguf   # trailing comment\nthreads=4\nsocket_mode = 0640\n"
             "allowed_users = root, 1001\nallowed_groups = root 0\nrequest_timeout_s = 2.5\n"
             "listen_tcp = 127.0.0.1:8080\n";
    }
    config c;
    c.load_file(path);
    CHECK(c.model == "/m/model.gguf");
    CHECK(c.threads == 4);
    CHECK(c.socket_mode == 0640);
    CHECK(c.allowed_users == std::vector<std::string>{"root", "1001"});
    CHECK(c.allowed_groups == std::vector<std::string>{"root", "0"});
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

const std::string sample_conf = std::string(TANDEM_SOURCE_DIR) + "/systemd/tandemd.conf";

// "FILE:LINE: key: problem" from loading `text` (then validating), "" when both pass.
std::string config_error(const std::string& text) {
    test::scratch_dir dir("config-error");
    const std::string path = dir.file("tandemd.conf");
    std::ofstream(path) << text;
    try {
        config c;
        c.load_file(path);
        c.validate();
        return "";
    } catch (const error& e) {
        const std::string m = e.what();
        return m.rfind(path + ":", 0) == 0 ? m.substr(path.size()) : "not at the file: " + m;
    }
}

TEST_CASE("config: the installed sample systemd/tandemd.conf loads and validates for any user") {
    config c;
    c.load_file(sample_conf);
    CHECK(c.origin.empty()); // it sets no key: as it is, tandemd serves the installed demo model
    CHECK(c.model.empty());
    // nothing a user instance cannot have: no system socket, no tandem group, an auto-sized pool
    CHECK(c.socket.empty());
    CHECK(c.socket_group.empty());
    CHECK(c.allowed_groups.empty());
    CHECK(c.allowed_users.empty());
    CHECK(c.kv_cache_mb == 0);
    CHECK(c.listen_tcp.empty());
    c.model = "/var/lib/tandem/models/model.gguf";
    CHECK_NOTHROW(c.validate());
}

TEST_CASE("config: the default model is the demo model of tandemd's install prefix, none in a build tree") {
    // this suite runs from the build tree, which has no share/tandem/models (the package test
    // checks the installed tandemd's default)
    CHECK(default_model_path().empty());
    const std::string msg = [] {
        try {
            config{}.validate();
        } catch (const error& e) {
            return std::string(e.what());
        }
        return std::string();
    }();
    CHECK(msg.find("no model") != std::string::npos);
}

TEST_CASE("config: load_wait_s takes 0 (no wait); the other timeouts do not") {
    config c;
    CHECK(c.load_wait_s == 30);
    CHECK_FALSE(c.set("load_wait_s", "0"));
    CHECK(c.load_wait_s == 0);
    CHECK_FALSE(c.set("load_wait_s", "0.5"));
    CHECK(c.load_wait_s == 0.5);
    CHECK(c.set("load_wait_s", "-1") == "expected seconds, 0 or more");
    CHECK(c.set("drain_timeout_s", "0") == "expected seconds, more than 0");
}

TEST_CASE("config: the sample names every key the parser knows, each line's default parses") {
    // `key = value` and `#key = value` lines of the sample
    std::vector<std::string> listed;
    std::string text, line;
    for (std::ifstream in(sample_conf); std::getline(in, line);) {
        const auto eq = line.find(" =");
        const std::string key = line.substr(line.starts_with("#") ? 1 : 0, eq - (line.starts_with("#") ? 1 : 0));
        if (eq != std::string::npos && !key.empty() && key.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos) {
            listed.push_back(key);
            text += line.substr(line.starts_with("#") ? 1 : 0) + "\n"; // uncommented
        }
    }
    auto keys = config_keys();
    std::sort(listed.begin(), listed.end());
    CHECK(std::adjacent_find(listed.begin(), listed.end()) == listed.end()); // each once
    auto sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    CHECK(listed == sorted);
    // every commented default is a value the parser takes, and it is the default
    config all;
    test::scratch_dir dir("config-sample");
    std::ofstream(dir.file("all.conf")) << text;
    REQUIRE_NOTHROW(all.load_file(dir.file("all.conf")));
    const config d;
    CHECK(all.socket_mode == d.socket_mode);
    CHECK(all.threads == d.threads);
    CHECK(all.kv_cache_mb == d.kv_cache_mb);
    CHECK(all.max_prompt_tokens == d.max_prompt_tokens);
    CHECK(all.max_tokens_limit == d.max_tokens_limit);
    CHECK(all.max_connections == d.max_connections);
    CHECK(all.engine.sched.step_tokens == d.engine.sched.step_tokens);
    CHECK(all.worker_timeout_s == d.worker_timeout_s);
    CHECK(all.worker_heartbeat_s == d.worker_heartbeat_s);
    CHECK(all.engine.sched.priority_aging_s == d.engine.sched.priority_aging_s);
    CHECK(all.engine.sched.background_step_tokens == d.engine.sched.background_step_tokens);
    CHECK(all.max_file_bytes == d.max_file_bytes);
    CHECK(all.max_files == d.max_files);
    CHECK(all.batch_concurrency == d.batch_concurrency);
    CHECK(all.state_dir == d.state_dir);
    CHECK(all.workers == d.workers);
    CHECK(all.kv_pool_persist == d.kv_pool_persist);
    CHECK(all.load_wait_s == d.load_wait_s);
    CHECK(all.drain_timeout_s == d.drain_timeout_s);
    CHECK(all.placement == d.placement);
    CHECK(all.log_level == d.log_level);
    CHECK(all.weights == d.weights);
    CHECK_NOTHROW(all.validate());

    // docs/config.md's table has a row for each key but the old name kv_size_mb
    std::vector<std::string> documented;
    for (std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/docs/config.md"); std::getline(in, line);)
        if (line.starts_with("| `")) documented.push_back(line.substr(3, line.find('`', 3) - 3));
    std::erase(keys, "kv_size_mb");
    CHECK(documented == keys); // the parser's order
}

TEST_CASE("config: KV pools are removed at exit unless asked") {
    CHECK_FALSE(config{}.kv_pool_persist);
}

TEST_CASE("config: every error is FILE:LINE: key: problem") {
    CHECK(config_error("model = /m.gguf\nthreads = many\n") == ":2: threads: expected an integer from 0 to 1024");
    CHECK(config_error("model = /m.gguf\nno_such = 1\n") == ":2: no_such: unknown key");
    CHECK(config_error("model = /m.gguf\n\nsocket_group = no-such-group-tandem\n") ==
          ":3: socket_group: no group 'no-such-group-tandem'");
    CHECK(config_error("model = /m.gguf\nallowed_groups = root, no-such-group-tandem\n") ==
          ":2: allowed_groups: no group 'no-such-group-tandem'");
    CHECK(config_error("model = /m.gguf\nallowed_users = no-such-user-tandem\n") ==
          ":2: allowed_users: no user 'no-such-user-tandem'");
    CHECK(config_error("model = /m.gguf\n# x\nlisten_tcp = 0.0.0.0:80\n") ==
          ":3: listen_tcp: a listener on 0.0.0.0, not a loopback address, needs api_keys_file (clients there send a "
          "key; put TLS in front of it: docs/config.md)");
    CHECK(config_error("model = /m.gguf\napi_keys_file = /etc/k\nlisten_tcp = 0.0.0.0:80\n").empty());
    CHECK(config_error("model = \"/m.gguf\nthreads = 1\n") == ":1: model: unterminated quote");
    CHECK(config_error("model = \"/a\" b\"\n") == ":1: model: text after the closing quote");
    CHECK(config_error("model = /m.gguf\nallowed_groups = root, 0\nallowed_users = root\n").empty());
}

TEST_CASE("config: quoted values lose their quotes; # inside quotes is not a comment") {
    test::scratch_dir dir("config-quotes");
    const std::string path = dir.file("q.conf");
    std::ofstream(path) << "model = \"/models/my model #1.gguf\"  # the model\nmodel_id = 'tiny'\nsocket = \"\"\n";
    config c;
    c.load_file(path);
    CHECK(c.model == "/models/my model #1.gguf");
    CHECK(c.model_id == "tiny");
    CHECK(c.socket.empty());
    CHECK(c.origin.at("model_id") == path + ":2");
}

TEST_CASE("peers: the socket's group may connect, by default the daemon's own group") {
    config c;
    CHECK(make_peer_policy(c).gids.contains(::getegid())); // the system unit's Group=tandem
    c.socket_group = "0";
    CHECK(make_peer_policy(c).gids == std::set<gid_t>{0});
    c.allowed_users = {"no-such-user-tandem"};
    CHECK_THROWS_AS(make_peer_policy(c), error);
}

TEST_CASE("config: the default socket under systemd is in its RuntimeDirectory") {
    const char* old = std::getenv("RUNTIME_DIRECTORY");
    const std::string saved = old ? old : "";
    ::setenv("RUNTIME_DIRECTORY", "/run/tandem", 1);
    CHECK(default_socket_path() == "/run/tandem/tandem.sock");
    if (old) ::setenv("RUNTIME_DIRECTORY", saved.c_str(), 1);
    else ::unsetenv("RUNTIME_DIRECTORY");
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

TEST_CASE("worker channel: the command ring holds the largest batch the options allow") {
    // A 128K context with 16-token pages: every sequence's block table has 8193 entries.
    engine_options eo;
    eo.n_ctx = 131072;
    eo.sched.page_size = 16;
    eo.sched.n_pages = 1 << 20;
    eo.sched.max_running = 16;
    eo.sched.step_tokens = 512;
    eo.sched.max_logits = 16;
    // The largest batch a plan can make: every running sequence (max_running requests of
    // max_n each, or the 16 decodes and 512 one-token prefill chunks a step can hold) at the
    // end of the context, one of them with the whole prefill budget.
    for (const auto& limits : {std::pair{4, 64}, std::pair{64, 16 + 512}}) {
        const int max_n = limits.first, n_seqs = limits.second; // not a structured binding: clang 14 cannot capture one in INFO
        INFO("max_n ", max_n);
        const uint64_t cap = command_ring_bytes(eo, max_n);
        batch b;
        const std::vector<int32_t> table(size_t(eo.n_ctx / eo.sched.page_size + 1), 7);
        const std::vector<uint32_t> gens(table.size(), 1);
        for (int i = 0; i < n_seqs; ++i) {
            const std::vector<token_id> toks(i == 0 ? size_t(eo.sched.step_tokens) + 1 : 1, 5);
            b.add_seq(uint64_t(i), eo.n_ctx - 1 - int32_t(toks.size()), toks, table, gens, eo.n_ctx - 1);
        }
        std::vector<uint8_t> bytes;
        ipc::encode_run(1, b, bytes);
        INFO(n_seqs, " sequences: ", bytes.size(), " bytes, ring of ", cap);
        CHECK(2 * (bytes.size() + 8) <= cap); // fits wherever the ring's position is
        CHECK(cap > (uint64_t(4) << 20));      // the fixed ring it replaces could not
    }
    eo.n_ctx = 2048; // a small context keeps a small ring
    CHECK(command_ring_bytes(eo, 8) <= (uint64_t(1) << 20));
}

TEST_CASE("context: n_ctx defaults to the training context as far as the KV memory holds it, and says so") {
    // stories260K's shape: 640 bytes a token in f16, so a 16-token page is 10 KiB
    const int64_t page_bytes = 10240;
    const auto notes_of = [](const context_plan& p) {
        std::string s;
        for (const auto& n : p.notes) s += (n.warn ? "warn: " : "info: ") + n.text + "\n";
        return s;
    };
    config c;
    // the default pool (at most 2048 MiB) holds the whole training context: it is the context
    context_plan p = plan_context(c, 2048, page_bytes);
    CHECK(p.error.empty());
    CHECK(p.n_ctx == 2048);
    CHECK(p.n_pages == 128 * 16); // max_running (16) full contexts
    CHECK(p.max_prompt_tokens == 2047);
    CHECK(p.max_tokens_limit == 2048);
    CHECK(notes_of(p) == "info: n_ctx 2048: the model's training context\n");

    // kv_pages caps it: 8 pages of 16 tokens, and the note says why and what to change
    c.kv_pages = 8;
    p = plan_context(c, 2048, page_bytes);
    CHECK(p.n_ctx == 128);
    CHECK(p.n_pages == 8);
    CHECK(p.max_prompt_tokens == 127);
    INFO(notes_of(p));
    REQUIRE(p.notes.size() == 1);
    const std::string& note = p.notes[0].text;
    CHECK_FALSE(p.notes[0].warn);
    for (const char* part : {"n_ctx 128", "training context is 2048", "kv_pages 8 holds 128 tokens", "640 bytes a token",
                             "raise kv_cache_mb (or kv_pages)", "set n_ctx"})
        CHECK_MESSAGE(note.find(part) != std::string::npos, part);

    // kv_cache_mb caps it the same way: 1 MiB is 102 pages, 1632 tokens
    c.kv_pages = 0;
    c.kv_cache_mb = 1;
    p = plan_context(c, 2048, page_bytes);
    CHECK(p.n_ctx == 1632);
    CHECK(p.n_pages == 102);
    CHECK(notes_of(p).find("kv_cache_mb 1 holds 1632 tokens") != std::string::npos);
    // a large model's 128K context against the default 2048 MiB pool (128 KiB a token: Llama-3-8B)
    c.kv_cache_mb = 0;
    p = plan_context(c, 131072, 128 * 1024 * 16);
    CHECK(p.n_ctx == 16384);
    CHECK(p.n_pages == 1024);
    CHECK(notes_of(p).find("the default KV pool (kv_cache_mb 0: at most 2048 MiB) holds 16384 tokens") !=
          std::string::npos);

    // an explicit n_ctx larger than the pool: honoured, the pool grown to one full context, logged
    c.kv_pages = 8;
    c.n_ctx = 512;
    p = plan_context(c, 2048, page_bytes);
    CHECK(p.error.empty());
    CHECK(p.n_ctx == 512);
    CHECK(p.n_pages == 32);
    CHECK(notes_of(p).find("the KV pool is grown from kv_pages 8's 8 pages (80.0 KiB) to 32 pages (320.0 KiB)") !=
          std::string::npos);
    // past the training context: refused, saying what to set
    c.n_ctx = 4096;
    p = plan_context(c, 2048, page_bytes);
    CHECK(p.error.find("n_ctx 4096 is more than the model's training context, 2048 tokens") != std::string::npos);
    CHECK(p.error.find("set n_ctx to 2048 or less") != std::string::npos);
    REQUIRE_FALSE(c.set("n_ctx", "4096"));
    c.origin["n_ctx"] = "/etc/tandem/tandemd.conf:12"; // (load_file records where)
    CHECK(plan_context(c, 2048, page_bytes).error.find("n_ctx 4096 (/etc/tandem/tandemd.conf:12) is more than") !=
          std::string::npos);

    // limits above what the context allows are lowered, with a warning
    c = config{};
    c.n_ctx = 256;
    c.max_prompt_tokens = 1000;
    c.max_tokens_limit = 1000;
    p = plan_context(c, 2048, page_bytes);
    CHECK(p.max_prompt_tokens == 255);
    CHECK(p.max_tokens_limit == 256);
    CHECK(notes_of(p).find("warn: max_prompt_tokens 1000 is more than the context allows: 255") != std::string::npos);
    CHECK(notes_of(p).find("warn: max_tokens_limit 1000 is more than the context allows: 256") != std::string::npos);
    c.max_prompt_tokens = 100;
    p = plan_context(c, 2048, page_bytes);
    CHECK(p.max_prompt_tokens == 100);
}

TEST_CASE("config: [model NAME] and [upstream NAME] sections, and the one resolver from a name to a model") {
    test::scratch_dir dir("config-sections");
    const std::string path = dir.file("tandemd.conf");
    std::ofstream(path) << "model = /m/default.gguf\nkv_pool = /dev/shm/p\nkeep_alive = 10m\nmodels_max = 2\n"
                           "memory_budget_mb = 4096\n[model coder]\npath = /m/coder.gguf\nn_ctx = 4096\n"
                           "keep_alive = 30s\noverflow = cluster\n[upstream cluster]\nbase_url = https://c.example/v1/\n"
                           "models = big, huge\ntimeout_s = 60\n";
    config c;
    c.load_file(path);
    CHECK_NOTHROW(c.validate());
    CHECK(c.keep_alive_s == 600);
    CHECK(c.models_max == 2);
    CHECK(c.memory_budget_mb == 4096);
    REQUIRE(c.models.size() == 1);
    REQUIRE(c.upstreams.size() == 1);
    CHECK(c.upstreams[0].base_url == "https://c.example"); // (its /v1 routes are added)
    CHECK(c.upstreams[0].models == std::vector<std::string>{"big", "huge"});
    CHECK(c.upstreams[0].timeout_s == 60);
    CHECK(c.origin.count("n_ctx") == 0); // a section's keys are its own

    CHECK(local_model_names(c) == std::vector<std::string>{"default", "coder"});
    const auto def = resolve_model(c, "");
    REQUIRE(def);
    CHECK(def->name == "default");
    CHECK(def->is_default);
    CHECK(def->keep_alive_s < 0); // the default stays
    CHECK(resolve_model(c, "default:latest")); // Ollama's name
    const auto coder = resolve_model(c, "coder");
    REQUIRE(coder);
    CHECK(coder->cfg.model == "/m/coder.gguf");
    CHECK(coder->cfg.model_id == "coder");
    CHECK(coder->cfg.n_ctx == 4096);
    CHECK(coder->cfg.kv_pool == "/dev/shm/p.coder"); // its own pool file
    CHECK(coder->keep_alive_s == 30);
    CHECK(coder->overflow == "cluster");
    CHECK_FALSE(resolve_model(c, "big")); // an upstream's
    REQUIRE(upstream_of(c, "huge"));
    CHECK(upstream_of(c, "huge")->name == "cluster");
    CHECK_FALSE(upstream_of(c, "coder"));

    // the first section is the default when `model` is not set
    config first;
    first.models.push_back({"a", {{"path", "/m/a.gguf"}}, "x:1"});
    CHECK(default_model_name(first) == "a");
    CHECK(resolve_model(first, "")->cfg.model == "/m/a.gguf");

    CHECK(parse_keep_alive("5m") == 300);
    CHECK(parse_keep_alive("-1") == -1);
    CHECK(parse_keep_alive("500ms") == 0.5);
    CHECK_FALSE(parse_keep_alive("soon"));
}

TEST_CASE("config: a section's mistakes are FILE:LINE: [section NAME] key: problem") {
    CHECK(config_error("model = /m.gguf\n[model a]\npath = /a.gguf\nsocket = /s\n") ==
          ":4: [model a] socket: not a key a [model] section takes (it is the daemon's, for every model)");
    CHECK(config_error("model = /m.gguf\n[model a]\nn_ctx = lots\n").find(":3: [model a] n_ctx: expected an integer") == 0);
    CHECK(config_error("model = /m.gguf\n[model a]\nn_ctx = 512\n") == ":2: [model a] has no `path` (its GGUF file)");
    CHECK(config_error("model = /m.gguf\n[model a]\npath = /a.gguf\noverflow = nowhere\n") ==
          ":2: [model a] overflow: no [upstream nowhere] section");
    CHECK(config_error("model = /m.gguf\n[upstream u]\nmodels = x\n") == ":2: [upstream u] has no `base_url`");
    CHECK(config_error("model = /m.gguf\n[upstream u]\nbase_url = ftp://x\n") ==
          ":3: [upstream u] base_url: expected an http:// or https:// URL");
    CHECK(config_error("model = /m.gguf\n[model a]\npath = /a\n[model a]\npath = /b\n") ==
          ":4: a section named 'a' comes earlier");
    CHECK(config_error("model = /m.gguf\n[thing a]\n") ==
          ":2: unknown section [thing]: expected [model NAME] or [upstream NAME]");
}
