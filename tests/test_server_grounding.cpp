// tandemd end to end, grounding and context limits: citations, retrieval of passages,
// strict quotes; prompts over the context, truncate_prompt_tokens, n_ctx planning.
#include "server_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

TEST_CASE("grounding: citations index the reply and the documents in code points, plain and streamed; the documents are a cached prefix") {
    const auto& s = shared_socket();
    // A document holding the model's own story (so replies copy from it), after multi-byte text
    // (so code points and bytes differ); replies start with multi-byte text too (a regex).
    const std::string story = offline_text("Once upon a time", 200);
    const std::vector<std::string> docs{"Zoë's café: crème brûlée 🍰 on Sundays.", "Crème brûlée 🍰 for Zoë." + story};
    json documents = json::array();
    documents.push_back({{"id", "menu"}, {"text", docs[0]}});
    documents.push_back({{"text", docs[1]}, {"title", "A story"}});
    const auto request = [&](int seed, bool stream) {
        json b = {{"messages", {{{"role", "user"}, {"content", "Tell me the story."}}}},
                  {"max_tokens", 120},
                  {"documents", documents},
                  {"citation_options", {{"min_tokens", 3}}},
                  {"structured_outputs", {{"regex", "Été 🍰, [a-zA-Z ,.'!]+"}}}};
        if (seed >= 0) b["seed"] = seed;
        else b["temperature"] = 0;
        if (stream) b["stream"] = true;
        return post(s, "/v1/chat/completions", b);
    };
    int n_citations = 0;
    for (int seed : {-1, 1, 2, 3, 4, 5}) {
        CAPTURE(seed);
        auto r = request(seed, false);
        REQUIRE(r.status == 200);
        const json m = r.j()["choices"][0]["message"];
        const std::string content = m["content"];
        REQUIRE(content.starts_with("Été 🍰, "));
        for (const auto& c : m["citations"]) {
            CAPTURE(c.dump());
            CHECK(slice(content, c["start"], c["end"]) == c["text"].get<std::string>());
            const int d = c["document_index"];
            REQUIRE((d == 0 || d == 1));
            CHECK(c["document_id"] == (d == 0 ? "menu" : "1"));
            CHECK(norm(slice(docs[size_t(d)], c["document_start"], c["document_end"])) == norm(c["text"]));
            ++n_citations;
        }
        // Streamed: the same reply; each citation comes in the chunk where its span closed, and
        // the last chunk lists them all.
        auto st = request(seed, true);
        REQUIRE(st.status == 200);
        json streamed = json::array(), listed;
        for (const auto& e : sse_events(st.body))
            for (const auto& c : e["choices"]) {
                if (c["delta"].contains("citations"))
                    for (const auto& x : c["delta"]["citations"]) streamed.push_back(x);
                if (c.contains("citations")) listed = c["citations"];
            }
        CHECK(stream_text(sse_events(st.body), true) == content);
        CHECK(streamed == m["citations"]);
        CHECK(listed == m["citations"]);
    }
    CHECK(n_citations >= 6);

    // The second question about the same documents reuses their pages.
    json q = {{"messages", {{{"role", "user"}, {"content", "Who had the café?"}}}}, {"max_tokens", 4},
              {"documents", documents}};
    auto first = post(s, "/v1/chat/completions", q);
    q["messages"][0]["content"] = "What happened on Sundays?";
    auto second = post(s, "/v1/chat/completions", q);
    REQUIRE(second.status == 200);
    const json u = second.j()["usage"];
    CHECK(u["prompt_tokens_details"]["cached_tokens"].get<int>() > u["prompt_tokens"].get<int>() / 2);

    // mode "off": no citations field; what is not built or not allowed is a 400 naming it.
    q["citation_options"] = {{"mode", "off"}};
    auto off = post(s, "/v1/chat/completions", q);
    REQUIRE(off.status == 200);
    CHECK_FALSE(off.j()["choices"][0]["message"].contains("citations"));
    const auto refused = [&](const json& body, const std::string& route, const std::string& param) {
        auto e = post(s, route, body);
        CAPTURE(body.dump());
        CHECK(e.status == 400);
        CHECK(e.j()["error"]["param"] == param);
    };
    const json msgs = {{{"role", "user"}, {"content", "Hi"}}};
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}}}}, {"citation_options", {{"mode", "exact"}}}},
            "/v1/chat/completions", "citation_options.mode");
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}}}}, {"citation_options", {{"mode", "strict"}}},
             {"structured_outputs", {{"regex", "a+"}}}},
            "/v1/chat/completions", "structured_outputs.regex");
    refused({{"messages", msgs}, {"citation_options", {{"mode", "fast"}}}}, "/v1/chat/completions", "citation_options");
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}}}}, {"citation_options", {{"mode", "off"}, {"min_tokens", 4}}}},
            "/v1/chat/completions", "citation_options.min_tokens");
    refused({{"messages", msgs}, {"documents", {{{"text", "x"}, {"url", "y"}}}}}, "/v1/chat/completions", "documents[0].url");
    refused({{"messages", msgs}, {"documents", {{{"title", "x"}}}}}, "/v1/chat/completions", "documents[0].text");
    refused({{"prompt", "Hi"}, {"documents", {{{"text", "x"}}}}}, "/v1/completions", "documents");
}

TEST_CASE("grounding, documents larger than the context: the passages most like the question, citations into the originals") {
    daemon_process d;
    d.start(scratch().file("retrieval.sock"), {"--set", "n_ctx=256"});
    REQUIRE(d.wait_ready());
    // Two long documents of the model's own stories (replies copy them), the first after
    // multi-byte text (code points and bytes differ), and between them a short one that is the
    // question word for word: its passage embeds as the question does, so it ranks first.
    std::string story;
    for (const char* start : {"Once upon a time", "One day, Tom", "Lily and her mom", "The little dog"})
        story += std::string(start) + offline_text(start, 60) + "\n\n";
    const std::string needle = "Sue went to the beach with her mom and dad.";
    const std::vector<std::string> docs{"Zoë's café: crème brûlée 🍰 on Sundays.\n\n" + story, needle, story + story};
    json documents = json::array();
    documents.push_back({{"id", "long"}, {"text", docs[0]}});
    documents.push_back({{"id", "needle"}, {"text", docs[1]}});
    documents.push_back({{"text", docs[2]}});
    const auto engine_prompt_tokens = [&] {
        return metric(request(d.sock, "GET", "/metrics").body, "tandem_engine_prompt_tokens_total");
    };
    json q = {{"messages", {{{"role", "user"}, {"content", needle}}}},
              {"max_tokens", 30},
              {"documents", documents},
              {"citation_options", {{"min_tokens", 3}}}};
    int n_citations = 0;
    json first_passages;
    double first_cost = 0;
    for (int seed : {-1, 1, 2, 3}) {
        CAPTURE(seed);
        if (seed < 0) q["temperature"] = 0;
        else q["seed"] = seed, q["temperature"] = 1;
        const double before = engine_prompt_tokens();
        auto r = post(d.sock, "/v1/chat/completions", q);
        REQUIRE(r.status == 200);
        const json j = r.j();
        REQUIRE(j.contains("passages"));
        const json& ps = j["passages"];
        REQUIRE(ps.size() >= 2);
        CHECK(j["usage"]["prompt_tokens"].get<int>() <= 256 - 30);
        bool needle_found = false;
        for (const auto& p : ps) {
            const int di = p["document_index"];
            REQUIRE((di >= 0 && di < 3));
            CHECK(p["document_id"] == (di == 0 ? "long" : di == 1 ? "needle" : "2"));
            const std::string text = slice(docs[size_t(di)], p["start"], p["end"]);
            REQUIRE(!text.empty());
            CHECK(text.front() != ' ');
            needle_found |= di == 1 && text == needle;
        }
        CHECK(needle_found);
        if (seed < 0) { // the first request embeds every passage; later ones only their question
            first_passages = ps;
            first_cost = engine_prompt_tokens() - before;
        } else {
            CHECK(engine_prompt_tokens() - before < first_cost / 2);
            CHECK(ps == first_passages); // the same question ranks the same passages
        }
        const json m = j["choices"][0]["message"];
        const std::string content = m["content"];
        for (const auto& c : m["citations"]) {
            CAPTURE(c.dump());
            CHECK(slice(content, c["start"], c["end"]) == c["text"].get<std::string>());
            const int di = c["document_index"];
            REQUIRE((di >= 0 && di < 3));
            CHECK(norm(slice(docs[size_t(di)], c["document_start"], c["document_end"])) == norm(c["text"]));
            ++n_citations;
        }
    }
    CHECK(n_citations >= 1);
    // streamed: the last chunk lists the passages
    q["stream"] = true;
    q["temperature"] = 0;
    q.erase("seed");
    auto st = post(d.sock, "/v1/chat/completions", q);
    REQUIRE(st.status == 200);
    json listed;
    for (const auto& e : sse_events(st.body))
        if (e.contains("passages")) listed = e["passages"];
    CHECK(listed == first_passages);
    // documents that fit are rendered whole: no passages
    auto whole = post(d.sock, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4},
                       {"documents", {{{"text", needle}}}}});
    REQUIRE(whole.status == 200);
    CHECK_FALSE(whole.j().contains("passages"));
    // a question that leaves no room for passages is a 400 that says so
    std::string long_question;
    for (int i = 0; i < 40; ++i) long_question += "Why did Sue go? ";
    auto no_room = post(d.sock, "/v1/chat/completions",
                        {{"messages", {{{"role", "user"}, {"content", long_question}}}}, {"max_tokens", 30},
                         {"documents", documents}});
    CHECK(no_room.status == 400);
    CHECK(no_room.j()["error"]["param"] == "documents");
    CHECK(request(d.sock, "GET", "/v1/tandem/status").j()["kv_pages_used"] == 0);
    CHECK(d.stop() == 0);
}

TEST_CASE("grounding, strict mode: every quotation of sampled replies is document text; unsupported sentences carry no citation") {
    const auto& s = shared_socket();
    const std::string story = offline_text("Once upon a time", 300);
    const std::vector<std::string> docs{story, "Ben said, \"The sun is hot today.\" Mia said, \"Let us swim.\""};
    json documents = json::array();
    for (const auto& d : docs) documents.push_back({{"text", d}});
    int n_quotes = 0;
    for (int seed = 1; seed <= 12; ++seed) {
        CAPTURE(seed);
        auto r = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Tell me the story."}}}},
                                                  {"max_tokens", 150}, {"seed", seed}, {"temperature", 1},
                                                  {"documents", documents},
                                                  {"citation_options", {{"mode", "strict"}, {"min_tokens", 4}}}});
        REQUIRE(r.status == 200);
        const json m = r.j()["choices"][0]["message"];
        const std::string content = m["content"];
        // the text between the 1st and 2nd, 3rd and 4th, ... double quote (the last may be cut
        // by max_tokens: a prefix of document text is document text too)
        size_t open = content.find('"');
        while (open != std::string::npos) {
            const size_t close = content.find('"', open + 1);
            const std::string quoted = content.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
            CAPTURE(quoted);
            CHECK((docs[0].find(quoted) != std::string::npos || docs[1].find(quoted) != std::string::npos));
            ++n_quotes;
            open = close == std::string::npos ? close : content.find('"', close + 1);
        }
        for (const auto& u : m["unsupported"]) {
            for (const auto& c : m["citations"])
                CHECK((c["end"].get<int64_t>() <= u["start"].get<int64_t>() || c["start"].get<int64_t>() >= u["end"].get<int64_t>()));
            CHECK(content.find(u["text"].get<std::string>()) != std::string::npos);
        }
    }
    CHECK(n_quotes >= 5); // stories260K writes dialogue: quotes happen
}


namespace {

// The token ids tandemd makes of a completions prompt (BOS as the model asks).
std::vector<int> prompt_ids(const std::string& sock, const std::string& text) {
    const auto r = post(sock, "/tokenize", {{"content", text}});
    REQUIRE(r.status == 200);
    return r.j()["tokens"].get<std::vector<int>>();
}

std::string many_words(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "Lily saw a dog. ";
    return s;
}

// A 400 context_length_exceeded naming `param` whose message has every one of `parts`.
void check_too_long(const http_response& r, const std::string& param, std::initializer_list<std::string> parts) {
    CHECK(r.status == 400);
    const json j = r.j();
    CHECK(j["error"]["code"] == "context_length_exceeded");
    CHECK(j["error"]["param"] == param);
    const std::string m = j["error"]["message"];
    for (const std::string& p : parts) CHECK_MESSAGE(m.find(p) != std::string::npos, "'", p, "' in: ", m);
}

} // namespace

TEST_CASE("context limits: a prompt over the limit is a 400 with both numbers and what to change, on every route") {
    const auto& s = shared_socket(); // n_ctx 2048 (stories260K's training context): prompts up to 2047
    const std::string text = many_words(500);
    const auto ids = prompt_ids(s, text);
    REQUIRE(ids.size() > 2047);
    const std::string n = std::to_string(ids.size()) + " tokens";
    check_too_long(post(s, "/v1/completions", {{"prompt", text}, {"max_tokens", 4}}), "prompt",
                   {"the prompt has " + n, "more than the 2047 this daemon accepts", "n_ctx 2048",
                    "'truncate_prompt_tokens' (1 to 2047)", "shorten it"});
    // token ids as given, and the second of several prompts
    check_too_long(post(s, "/v1/completions", {{"prompt", json::array({json::array({1, 2}), ids})}, {"max_tokens", 4}}),
                   "prompt", {"prompt 1 has " + n, "2047"});
    // chat: the messages as the template renders them
    const json messages = json::array({{{"role", "user"}, {"content", text}}});
    const auto rendered = post(s, "/v1/tandem/apply-template", {{"messages", messages}});
    REQUIRE(rendered.status == 200);
    check_too_long(post(s, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4}}), "messages",
                   {"has " + std::to_string(rendered.j()["tokens"].size()) + " tokens", "2047"});
    check_too_long(post(s, "/v1/embeddings", {{"input", json::array({"Lily", text})}}), "input",
                   {"input 1 has " + n, "2047", "truncate_prompt_tokens"});
    // a prompt that fits with max_tokens past the context: the reply stops at the context's end
    // (finish_reason length), the prompt whole
    const std::vector<int> fits(ids.end() - 2040, ids.end());
    const auto r = post(s, "/v1/completions", {{"prompt", fits}, {"max_tokens", 100}, {"ignore_eos", true}});
    REQUIRE(r.status == 200);
    CHECK(r.j()["usage"]["prompt_tokens"] == 2040);
    CHECK(r.j()["usage"]["completion_tokens"] == 8);
    CHECK(r.j()["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("truncate_prompt_tokens keeps each prompt's last N tokens, as sending them would; usage says what it dropped") {
    const auto& s = shared_socket();
    const std::string text = many_words(500);
    const auto ids = prompt_ids(s, text);
    const int keep = 100;
    const std::vector<int> last(ids.end() - keep, ids.end());
    const int dropped = int(ids.size()) - keep;

    const json ask = {{"max_tokens", 12}, {"temperature", 0}};
    json cut = ask, own = ask;
    cut["prompt"] = text;
    cut["truncate_prompt_tokens"] = keep;
    own["prompt"] = last;
    const auto a = post(s, "/v1/completions", cut);
    const auto b = post(s, "/v1/completions", own);
    REQUIRE(a.status == 200);
    REQUIRE(b.status == 200);
    CHECK(a.j()["choices"][0]["text"] == b.j()["choices"][0]["text"]);
    CHECK(a.j()["usage"]["prompt_tokens"] == keep);
    CHECK(a.j()["usage"]["truncated_prompt_tokens"] == dropped);
    CHECK_FALSE(b.j()["usage"].contains("truncated_prompt_tokens")); // not asked, nothing to say
    // a prompt shorter than N is whole; the field is still there, 0; several prompts add up
    json two = cut;
    two["prompt"] = json::array({text, "Once upon a time"});
    const auto t = post(s, "/v1/completions", two);
    REQUIRE(t.status == 200);
    CHECK(t.j()["usage"]["truncated_prompt_tokens"] == dropped);
    CHECK(t.j()["choices"][1]["text"] == offline_text("Once upon a time", 12));

    // streamed: the usage chunk (include_usage), and each choice's last chunk, say it too
    json streamed = cut;
    streamed["stream"] = true;
    streamed["stream_options"] = {{"include_usage", true}};
    const auto st = post(s, "/v1/completions", streamed);
    REQUIRE(st.status == 200);
    const auto events = sse_events(st.body);
    REQUIRE(events.size() >= 2);
    CHECK(stream_text(events, false) == b.j()["choices"][0]["text"]);
    CHECK(events.back()["usage"]["truncated_prompt_tokens"] == dropped);
    const json& last_choice = events[events.size() - 2]["choices"][0];
    CHECK(last_choice["finish_reason"] == "length");
    CHECK(last_choice["truncated_prompt_tokens"] == dropped);

    // chat: the last N tokens of the rendered messages
    const json messages = json::array({{{"role", "user"}, {"content", text}}});
    const auto rendered = post(s, "/v1/tandem/apply-template", {{"messages", messages}});
    REQUIRE(rendered.status == 200);
    const auto chat_ids = rendered.j()["tokens"].get<std::vector<int>>();
    json chat = ask;
    chat["messages"] = messages;
    chat["truncate_prompt_tokens"] = keep;
    const auto c = post(s, "/v1/chat/completions", chat);
    REQUIRE(c.status == 200);
    json same = ask;
    same["prompt"] = std::vector<int>(chat_ids.end() - keep, chat_ids.end());
    CHECK(c.j()["choices"][0]["message"]["content"] == post(s, "/v1/completions", same).j()["choices"][0]["text"]);
    CHECK(c.j()["usage"]["truncated_prompt_tokens"] == int(chat_ids.size()) - keep);

    // embeddings: the same vector as the last N tokens given as ids
    const auto e = post(s, "/v1/embeddings", {{"input", text}, {"truncate_prompt_tokens", keep}});
    const auto f = post(s, "/v1/embeddings", {{"input", last}});
    REQUIRE(e.status == 200);
    REQUIRE(f.status == 200);
    CHECK(e.j()["data"][0]["embedding"] == f.j()["data"][0]["embedding"]);
    CHECK(e.j()["usage"]["prompt_tokens"] == keep);
    CHECK(e.j()["usage"]["truncated_prompt_tokens"] == dropped);

    // refused values name the field; it does not go with documents
    for (const json& v : {json(0), json(-1), json(2048), json("100"), json(1.5)}) {
        CAPTURE(v.dump());
        json bad = cut;
        bad["truncate_prompt_tokens"] = v;
        const auto r = post(s, "/v1/completions", bad);
        CHECK(r.status == 400);
        CHECK(r.j()["error"]["param"] == "truncate_prompt_tokens");
        const auto r2 = post(s, "/v1/embeddings", {{"input", "Lily"}, {"truncate_prompt_tokens", v}});
        CHECK(r2.status == 400);
        CHECK(r2.j()["error"]["param"] == "truncate_prompt_tokens");
    }
    CHECK(post(s, "/v1/completions", {{"prompt", "x"}, {"truncate_prompt_tokens", 2047}}).status == 200);
    const auto docs = post(s, "/v1/chat/completions", {{"messages", messages},
                                                       {"documents", {{{"text", "Lily saw a dog."}}}},
                                                       {"truncate_prompt_tokens", keep}});
    CHECK(docs.status == 400);
    CHECK(docs.j()["error"]["param"] == "truncate_prompt_tokens");
}

TEST_CASE("context limits: n_ctx capped by the KV memory, logged; an explicit n_ctx grows the pool, above training is refused") {
    // kv_pages 8 of 16 tokens: the context is 128 tokens, not the training 2048, and the log says why
    daemon_process a;
    a.log = scratch().file("kv-cap.log");
    a.start(scratch().file("kv-cap.sock"), {"--set", "kv_pages=8"}, {"TANDEM_LOG=info"});
    REQUIRE(a.wait_ready());
    auto m = request(a.sock, "GET", "/v1/models");
    REQUIRE(m.status == 200);
    CHECK(m.j()["data"][0]["meta"]["n_ctx"] == 128);
    CHECK(m.j()["data"][0]["meta"]["n_ctx_train"] == 2048);
    auto st = request(a.sock, "GET", "/v1/tandem/status").j();
    CHECK(st["model"]["meta"]["n_ctx"] == 128);
    CHECK(st["kv_pages_total"] == 8);
    CHECK(st["limits"]["max_prompt_tokens"] == 127);
    const std::string text = many_words(40);
    const auto ids = prompt_ids(a.sock, text);
    REQUIRE(ids.size() > 127);
    check_too_long(post(a.sock, "/v1/completions", {{"prompt", text}}), "prompt",
                   {"has " + std::to_string(ids.size()) + " tokens", "more than the 127", "n_ctx 128 less one",
                    "raise n_ctx in tandemd.conf (the model's training context is 2048)"});
    CHECK(a.stop() == 0);
    {
        std::ifstream in(a.log);
        const std::string log((std::istreambuf_iterator<char>(in)), {});
        INFO(log);
        CHECK(log.find("n_ctx 128: the model's training context is 2048 tokens, but kv_pages 8 holds 128 tokens") !=
              std::string::npos);
        CHECK(log.find("raise kv_cache_mb (or kv_pages), or set n_ctx") != std::string::npos);
    }

    // an explicit n_ctx the pool cannot hold: the pool grows to one full context; max_prompt_tokens binds
    daemon_process b;
    b.start(scratch().file("kv-grow.sock"),
            {"--set", "kv_pages=8", "--set", "n_ctx=512", "--set", "max_prompt_tokens=100"});
    REQUIRE(b.wait_ready());
    st = request(b.sock, "GET", "/v1/tandem/status").j();
    CHECK(st["model"]["meta"]["n_ctx"] == 512);
    CHECK(st["kv_pages_total"] == 32);
    CHECK(st["limits"]["max_prompt_tokens"] == 100);
    check_too_long(post(b.sock, "/v1/completions", {{"prompt", text}}), "prompt",
                   {"more than the 100 this daemon accepts", "max_prompt_tokens in tandemd.conf; the context is 512",
                    "raise max_prompt_tokens in tandemd.conf", "'truncate_prompt_tokens' (1 to 100)"});
    CHECK(post(b.sock, "/v1/completions", {{"prompt", text}, {"truncate_prompt_tokens", 101}}).status == 400);
    const auto r = post(b.sock, "/v1/completions", {{"prompt", text}, {"truncate_prompt_tokens", 100}, {"max_tokens", 2}});
    CHECK(r.status == 200);
    CHECK(r.j()["usage"]["prompt_tokens"] == 100);
    CHECK(b.stop() == 0);

    // past the training context: the daemon does not start, and says what to set
    daemon_process c;
    c.log = scratch().file("n-ctx-train.log");
    c.start(scratch().file("n-ctx-train.sock"), {"--set", "n_ctx=4096"});
    CHECK(c.wait_exit(30) == 1);
    std::ifstream in(c.log);
    const std::string log((std::istreambuf_iterator<char>(in)), {});
    INFO(log);
    CHECK(log.find("n_ctx 4096 (--set) is more than the model's training context, 2048 tokens") != std::string::npos);
    CHECK(log.find("set n_ctx to 2048 or less") != std::string::npos);
}
