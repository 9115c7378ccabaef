// tandemd's batch jobs: /v1/files and /v1/batches as OpenAI defines them, a job killed with
// the daemon (SIGKILL) and resumed by the next one, cancellation; the multipart parser.
#include "daemon/batch_jobs.hpp"
#include "batch_http.hpp"
#include "batch_lines.hpp"
#include "daemon_client.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <sstream>
#include <thread>

using namespace tandem;
using test::json;
using test::answer_of, test::completion, test::completions_file, test::id_counts, test::line;
using test::boundary, test::body_of, test::create_batch, test::ended, test::file_lines, test::form_body, test::poll_batch,
    test::raw_request, test::upload;

namespace {

test::scratch_dir& scratch() {
    static test::scratch_dir d("batch-jobs");
    return d;
}

} // namespace

TEST_CASE("multipart/form-data: fields and files, a quoted boundary, malformed bodies refused") {
    std::string why;
    const std::string body = form_body({{"purpose", "batch"}}, "{\"a\":1}\n");
    auto parts = daemon::parse_multipart("multipart/form-data; boundary=\"" + boundary + "\"", body, why);
    REQUIRE(parts);
    REQUIRE(parts->size() == 2);
    CHECK((*parts)[0].name == "purpose");
    CHECK((*parts)[0].data == "batch");
    CHECK((*parts)[1].name == "file");
    CHECK((*parts)[1].filename == "in.jsonl");
    CHECK((*parts)[1].content_type == "application/jsonl");
    CHECK((*parts)[1].data == "{\"a\":1}\n");
    // A file holding the boundary's text without its line break is data.
    const std::string tricky = form_body({}, "x --" + boundary + " y"); // (the parts view it)
    parts = daemon::parse_multipart("multipart/form-data; boundary=" + boundary, tricky, why);
    REQUIRE(parts);
    CHECK((*parts)[0].data == "x --" + boundary + " y");
    CHECK_FALSE(daemon::parse_multipart("application/json", body, why));
    CHECK(why.find("multipart/form-data") != std::string::npos);
    CHECK_FALSE(daemon::parse_multipart("multipart/form-data", body, why));
    CHECK_FALSE(daemon::parse_multipart("multipart/form-data; boundary=" + boundary, body.substr(0, body.size() / 2), why));
    CHECK_FALSE(daemon::parse_multipart("multipart/form-data; boundary=other", body, why));
}

TEST_CASE("tandemd /v1/files and /v1/batches: the API's objects, and what it refuses by name") {
    test::daemon_process d;
    d.start(scratch().file("files.sock"));
    REQUIRE(d.wait_ready());
    const std::string content = completions_file(2, 4);
    const auto up = upload(d.sock, content);
    REQUIRE(up.status == 200);
    const json f = body_of(up);
    CHECK(f["object"] == "file");
    CHECK(f["purpose"] == "batch");
    CHECK(f["filename"] == "in.jsonl");
    CHECK(f["bytes"] == content.size());
    const std::string fid = f["id"];
    CHECK(body_of(test::request(d.sock, "GET", "/v1/files/" + fid)) == f);
    CHECK(test::request(d.sock, "GET", "/v1/files/" + fid + "/content").body == content);
    const json list = body_of(test::request(d.sock, "GET", "/v1/files?purpose=batch&limit=5"));
    CHECK(list["object"] == "list");
    REQUIRE(list["data"].size() == 1);
    CHECK(list["data"][0]["id"] == fid);
    CHECK(list["has_more"] == false);

    // Refusals name what they refuse.
    auto refused = [](const test::http_response& r, int status, const std::string& param) {
        INFO(r.body);
        CHECK(r.status == status);
        if (!param.empty()) CHECK(json::parse(r.body)["error"]["param"] == param);
    };
    refused(upload(d.sock, content, "fine-tune"), 400, "purpose");
    refused(raw_request(d.sock, "POST", "/v1/files", "multipart/form-data; boundary=" + boundary,
                        form_body({{"purpose", "batch"}, {"expires_after", "1"}}, content)),
            400, "expires_after");
    refused(raw_request(d.sock, "POST", "/v1/files", "multipart/form-data; boundary=" + boundary,
                        form_body({{"purpose", "batch"}}, "")),
            400, "file");
    refused(raw_request(d.sock, "POST", "/v1/files", "application/json", "{}"), 400, "");
    refused(test::request(d.sock, "GET", "/v1/files?bogus=1"), 400, "bogus");
    refused(test::request(d.sock, "GET", "/v1/files/file-000000000000000000000000"), 404, "");
    refused(test::request(d.sock, "PUT", "/v1/files/" + fid), 405, "");
    refused(test::post(d.sock, "/v1/batches", {{"input_file_id", fid}, {"endpoint", "/v1/completions"},
                                               {"completion_window", "24h"}, {"output_expires_after", 1}}),
            400, "output_expires_after");
    refused(test::post(d.sock, "/v1/batches",
                       {{"input_file_id", fid}, {"endpoint", "/v1/responses"}, {"completion_window", "24h"}}),
            400, "endpoint");
    refused(test::post(d.sock, "/v1/batches",
                       {{"input_file_id", fid}, {"endpoint", "/v1/completions"}, {"completion_window", "1h"}}),
            400, "completion_window");
    refused(test::post(d.sock, "/v1/batches", {{"input_file_id", "file-000000000000000000000000"},
                                               {"endpoint", "/v1/completions"}, {"completion_window", "24h"}}),
            404, "");
    refused(test::request(d.sock, "GET", "/v1/batches/batch_000000000000000000000000"), 404, "");

    // A job: every line answered, the lines for another endpoint and the malformed ones are errors.
    const std::string mixed = completions_file(3, 8) + "not json\n" +
                              line("emb", "/v1/embeddings", {{"input", "Lily"}}).dump() + "\n";
    const std::string mid = body_of(upload(d.sock, mixed))["id"];
    const json created = create_batch(d.sock, mid);
    CHECK(created["object"] == "batch");
    CHECK(created["status"] == "validating");
    CHECK(created["input_file_id"] == mid);
    CHECK(created["expires_at"].get<int64_t>() - created["created_at"].get<int64_t>() == 24 * 3600);
    const json b = poll_batch(d.sock, created["id"], ended);
    REQUIRE(b["status"] == "completed");
    CHECK(b["request_counts"] == json{{"total", 5}, {"completed", 3}, {"failed", 2}});
    CHECK(b["in_progress_at"].is_number());
    CHECK(b["completed_at"].is_number());
    const auto out = file_lines(d.sock, b["output_file_id"]);
    const auto errs = file_lines(d.sock, b["error_file_id"]);
    REQUIRE(out.size() == 3);
    REQUIRE(errs.size() == 2);
    for (const json& l : out) {
        // each as the daemon answers the same body (greedy)
        const int i = std::stoi(l["custom_id"].get<std::string>().substr(4));
        const auto direct = test::post(d.sock, "/v1/completions", completion("Once upon a time " + std::to_string(i), 8));
        CHECK(answer_of(l["response"]["body"]) == answer_of(json::parse(direct.body)));
    }
    CHECK(body_of(test::request(d.sock, "GET", "/v1/files/" + b["output_file_id"].get<std::string>()))["purpose"] ==
          "batch_output");
    CHECK(body_of(test::request(d.sock, "GET", "/v1/batches?limit=1"))["data"][0]["id"] == b["id"]);
    refused(test::post(d.sock, "/v1/batches/" + b["id"].get<std::string>() + "/cancel", json::object()), 409, "");
    // Deleting a file.
    CHECK(body_of(test::request(d.sock, "DELETE", "/v1/files/" + fid))["deleted"] == true);
    CHECK(test::request(d.sock, "GET", "/v1/files/" + fid).status == 404);
    CHECK(d.stop() == 0);
}

TEST_CASE("tandemd batch jobs: a job survives SIGKILL (every custom_id exactly once), and cancel") {
    const std::string sock = scratch().file("jobs.sock");
    constexpr int n = 48;
    test::daemon_process d;
    d.state_dir = scratch().file("jobs-state");
    d.start(sock, {"--set", "batch_concurrency=2"});
    REQUIRE(d.wait_ready());
    const std::string fid = body_of(upload(sock, completions_file(n, 96) + "not json\n"))["id"];
    const json job = create_batch(sock, fid);
    const json second = create_batch(sock, fid); // waits behind the first
    // ids sort in creation order (both were made in the same second, most likely: created_at
    // alone cannot order them, and the runner takes the oldest)
    CHECK(job["id"].get<std::string>() < second["id"].get<std::string>());
    const json mid = poll_batch(sock, job["id"], [](const json& b) { return b["request_counts"]["completed"] >= 3; });
    ::kill(d.pid, SIGKILL);
    CHECK(d.wait_exit(10) == 128 + SIGKILL);
    INFO("answered before the kill: ", mid["request_counts"].dump());
    CHECK(mid["status"] == "in_progress");
    CHECK(mid["request_counts"]["completed"] < n); // killed half way (else the check below proves nothing)

    test::daemon_process d2;
    d2.state_dir = d.state_dir;
    d2.start(sock, {"--set", "batch_concurrency=2"});
    REQUIRE(d2.wait_ready());
    // The second job, waiting, is cancelled (at once unless the first ended already); the
    // first goes on from where it stopped.
    const json c2 = body_of(test::post(sock, "/v1/batches/" + second["id"].get<std::string>() + "/cancel", json::object()));
    CHECK((c2["status"] == "cancelling" || c2["status"] == "cancelled"));
    CHECK(c2["cancelling_at"].is_number());
    const json b = poll_batch(sock, job["id"], ended);
    const json e2 = poll_batch(sock, second["id"], ended);
    CHECK(e2["status"] == "cancelled");
    CHECK(e2["cancelled_at"].is_number());
    REQUIRE(b["status"] == "completed");
    CHECK(b["request_counts"] == json{{"total", n + 1}, {"completed", n}, {"failed", 1}});
    const auto out = file_lines(sock, b["output_file_id"]);
    const auto counts = id_counts(out);
    CHECK(out.size() == size_t(n));
    CHECK(counts.size() == size_t(n));
    for (const auto& c : counts) CHECK_MESSAGE(c.second == 1, c.first);
    for (const json& l : out) CHECK(l["response"]["status_code"] == 200);
    CHECK(file_lines(sock, b["error_file_id"]).size() == 1);

    // A running job cancelled: cancelling, then cancelled once the lines in flight are answered,
    // with what was answered by then in its output.
    const json third = create_batch(sock, fid);
    poll_batch(sock, third["id"], [](const json& x) { return x["request_counts"]["completed"] >= 2; });
    const json c3 = body_of(test::post(sock, "/v1/batches/" + third["id"].get<std::string>() + "/cancel", json::object()));
    CHECK((c3["status"] == "cancelling" || c3["status"] == "cancelled"));
    const json e3 = poll_batch(sock, third["id"], ended);
    CHECK(e3["status"] == "cancelled");
    CHECK(e3["request_counts"]["completed"] < n);
    CHECK(file_lines(sock, e3["output_file_id"]).size() == e3["request_counts"]["completed"].get<size_t>());
    CHECK(d2.stop() == 0);
}
