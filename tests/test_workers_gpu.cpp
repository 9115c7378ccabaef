// The worker split under GPU placements: kill -9 of each worker, CPU or GPU decode keeping
// its pages, a GPU too small or failing, windowed models; each against the cpu/cpu tokens. On
// a machine without a GPU each says so and passes as skipped; test_workers_gpu_emulated runs
// them against the emulated device.
#include "worker_fixtures.hpp"

using namespace tandem;
using namespace tandem::test;

TEST_CASE("workers: kill -9 of each worker mid-batch under each GPU placement: requests resume with the tokens they had without it (or no GPU)") {
    for (const auto& placement : {std::pair<std::string, std::string>{"cpu", "gpu"}, {"gpu", "cpu"}, {"gpu", "gpu"}}) {
        const std::string prefill = placement.first, decode = placement.second;
        INFO("prefill=", prefill, " decode=", decode);
        daemon_process d;
        const std::string name = "k" + prefill + decode;
        d.log = scratch().file(name + ".log");
        d.start(scratch().file(name + ".sock"),
                {"--set", "step_tokens=32", "--set", "prefill=" + prefill, "--set", "decode=" + decode});
        if (!gpu_daemon_up(d, prefill == "gpu" ? "prefill=gpu" : "decode=gpu")) return;
        // What this placement gives undisturbed, one request at a time: on long texts a GPU
        // kernel's rounding may pick another token than the CPU's somewhere.
        const text_of undisturbed = [&d](const std::string& prompt, int n) {
            return completion(d.sock, prompt, n)["choices"][0]["text"].get<std::string>();
        };
        kill_mid_batch(d, "decode", 200, undisturbed);
        kill_mid_batch(d, "prefill", 200, undisturbed);
        CHECK(status(d.sock)["worker_restarts"] == 2);
        CHECK(d.stop() == 0);
    }
}


TEST_CASE("workers: CPU prefill + GPU decode keeping its pages gives the cpu/cpu tokens, or fails to start cleanly without a GPU") {
    daemon_process d;
    d.log = scratch().file("gd.log");
    // A pool smaller than the load (preemption: pages freed and taken again with new
    // contents) and prompts sharing a prefix, twice (cached pages shared, contents kept).
    d.start(scratch().file("gd.sock"), {"--set", "prefill=cpu", "--set", "decode=gpu", "--set", "kv_pages=24", "--set",
                                        "n_ctx=256", "--set", "kv_pool_persist=false"});
    if (!gpu_daemon_up(d, "decode=gpu")) return;
    CHECK(status(d.sock)["placement"]["decode"].get<std::string>().rfind("cuda", 0) == 0);
    CHECK(status(d.sock)["placement"]["prefill"] == "cpu");
    CHECK(status(d.sock)["kv_device_upload_bytes"] == 0);
    const std::string base = "Once upon a time, there was a little girl named Lily. She liked to play with her dog. ";
    for (int round = 0; round < 2; ++round) {
        std::vector<std::future<streamed>> fs;
        for (size_t i = 0; i < 6; ++i)
            fs.push_back(std::async(std::launch::async, [&, i] { return stream(d.sock, base + prompts[i], 100); }));
        for (size_t i = 0; i < fs.size(); ++i) {
            const streamed s = fs[i].get();
            CHECK(s.finish == "length");
            check_gpu_text(s.text, base + prompts[i], 100, fmt::format("round {} request {}", round, i));
        }
    }
    // The decode worker uploaded what the CPU prefill wrote, then decoded mostly from the pages
    // it kept: each step uploads nothing but what another worker appended.
    const json st = status(d.sock);
    const auto up = st["kv_device_upload_bytes"].get<int64_t>(), kept = st["kv_device_kept_bytes"].get<int64_t>();
    MESSAGE("device K/V: ", up >> 10, " KiB uploaded, ", kept >> 10, " KiB kept");
    CHECK(up > 0);
    CHECK(kept > 10 * up);
    CHECK(d.stop() == 0);
}

#if TANDEM_CUDA_EMULATED
TEST_CASE("workers: a GPU too small ends the daemon with exit 1; one with room for a few pages still serves (emulated device)") {
    // 16 MiB: not even a context (cuBLASLt's workspace is 32 MiB) for either worker.
    for (const std::string role : {"prefill", "decode"}) {
        daemon_process d;
        d.start(scratch().file("small" + role + ".sock"), {"--set", role + "=gpu"}, {"TANDEM_EMU_DEVICE_MIB=16"});
        int rc = -1;
        CHECK_FALSE(ready_or_exit(d, rc));
        CHECK_MESSAGE(rc == 1, role);
    }
    // 40 MiB: the decode worker keeps far fewer device pages than the pool has (least recently
    // used evicted) and gives the same text.
    daemon_process d;
    d.start(scratch().file("few.sock"), {"--set", "decode=gpu", "--set", "kv_pool_persist=false"},
            {"TANDEM_EMU_DEVICE_MIB=40"});
    REQUIRE(d.wait_ready(60));
    const tokens_of n40 = [](size_t) { return 40; };
    auto fs = stream_all(d.sock, 4, n40);
    check_equal_offline(fs, n40);
    CHECK(d.stop() == 0);
}

TEST_CASE("workers: a GPU worker with a sticky device error exits after 3 failed batches and serves again once restarted (emulated device)") {
    // The emulated device fails every synchronize from the moment the file exists, for the
    // rest of the process, as a real sticky error does; a new worker process starts clean.
    const std::string fault = scratch().file("sticky-fault");
    std::filesystem::remove(fault);
    daemon_process d;
    d.start(scratch().file("sticky.sock"), {"--set", "prefill=cpu", "--set", "decode=gpu", "--set", "kv_pool_persist=false"},
            {"TANDEM_EMU_FAULT_FILE=" + fault});
    REQUIRE(d.wait_ready(60));
    const json req = {{"prompt", prompts[0]}, {"max_tokens", 8}, {"temperature", 0}};
    const auto healthy = post(d.sock, "/v1/completions", req);
    REQUIRE(healthy.status == 200);
    const pid_t before = worker_pid(d.pid, "decode");
    { std::ofstream(fault) << "x"; }
    for (int i = 0; i < 3; ++i) {
        const auto r = post(d.sock, "/v1/completions", req);
        CHECK_MESSAGE(r.status == 500, r.body); // the device's error is in the daemon's log
    }
    std::filesystem::remove(fault);
    // The third failure ended the worker; its successor never saw the fault.
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, "decode"); return p > 0 && p != before; }, 10));
    const auto again = post(d.sock, "/v1/completions", req);
    CHECK(again.status == 200);
    CHECK(again.j()["choices"][0]["text"] == healthy.j()["choices"][0]["text"]);
    CHECK(d.stop() == 0);
}
#endif


TEST_CASE("workers: GPU prefill + CPU or GPU decode gives the cpu/cpu tokens, or fails to start cleanly without a GPU") {
    for (const std::string decode : {"cpu", "gpu"}) {
        daemon_process d;
        d.log = scratch().file("g" + decode + ".log");
        d.start(scratch().file("g" + decode + ".sock"), {"--set", "prefill=gpu", "--set", "decode=" + decode});
        if (!gpu_daemon_up(d, "prefill=gpu")) return;
        INFO("decode=", decode);
        CHECK(status(d.sock)["placement"]["prefill"].get<std::string>().rfind("cuda", 0) == 0);
        CHECK(status(d.sock)["placement"]["decode"].get<std::string>().rfind(decode == "gpu" ? "cuda" : "cpu", 0) == 0);
        const tokens_of n48 = [](size_t) { return 48; };
        auto fs = stream_all(d.sock, prompts.size(), n48);
        check_equal_offline(fs, n48, true);
        CHECK(d.stop() == 0);
    }
}


TEST_CASE("workers: a windowed model on GPU prefill and GPU decode keeping its pages releases them too (or no GPU)") {
    // The CUDA kernels read no page before the window; the decode worker's page mirror skips the
    // released entries. (The text is not compared with the CPU's: a random model's near ties
    // may break either way under other summation orders.)
    windowed_run("swa-gpu", {"--set", "prefill=gpu", "--set", "decode=gpu"});
}
