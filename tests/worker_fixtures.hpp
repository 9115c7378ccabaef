// What the worker-split suites share (test_workers, test_workers_gpu): daemons with worker
// processes on scratch sockets, requests and the offline loop's outputs to compare with.
#pragma once

#include "batch_checks.hpp"
#include "cpu/thread_pool.hpp"
#include "daemon/worker_executor.hpp"
#include "daemon_client.hpp"
#include "offline_reference.hpp"
#include "ipc/channel.hpp"
#include "ipc/kv_pool.hpp"
#include "ipc/ring.hpp"
#include "runtime/fingerprint.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/quantize_file.hpp"
#include "runtime/synth.hpp"

#include <doctest/doctest.h>

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

namespace tandem::test {

inline scratch_dir& scratch() {
    static scratch_dir d("workers");
    return d;
}

// The offline loop's output for `prompt`: greedy, or with `beams` (a width) the beams' texts.
inline generate_result offline(const std::string& prompt, int n, int beams = 0) {
    return offline_run(prompt, n, true, beams);
}

std::string offline_text(const std::string& prompt, int n) { return offline(prompt, n).text; }

// A GPU placement's greedy text against the offline loop's (the CPU's). The emulated device
// computes what the CPU does: the texts are equal. A real device's kernels round now and then
// an activation to the neighbouring int8 step (test_cuda: runner_flip_tol), which moves the
// logits by thousandths: the texts may part where the CPU's two best tokens were that close
// (seen on an H200: at a gap of 0.0056 in 100 tokens), never elsewhere.
constexpr float near_tie = 0.05f;
inline void check_gpu_text(const std::string& got, const std::string& prompt, int n, const std::string& what) {
    const std::string want = offline_text(prompt, n);
#if TANDEM_CUDA_EMULATED
    CHECK_MESSAGE(got == want, what);
#else
    if (got == want) return;
    const size_t same = size_t(std::mismatch(got.begin(), got.end(), want.begin(), want.end()).first - got.begin());
    // The CPU's steps again, with the gap between each step's two best logits; the step whose
    // piece holds the first differing byte is where the device chose otherwise.
    static model_bundle b = load_model(model_path("stories260K.gguf"));
    static const std::unique_ptr<runner> cpu = make_cpu_runner(*b.mdl, 1);
    const auto ptoks = b.tok->encode(prompt, true, false);
    paged_kv kv(b.mdl->make_kv_layout(16), int32_t((ptoks.size() + size_t(n)) / 16 + 2));
    seq_driver d(*cpu, kv, b.mdl->config().n_vocab);
    token_id next = d.prefill(ptoks, ptoks.size());
    size_t at = 0;
    for (int i = 0; i < n; ++i) {
        at += b.tok->piece(next).size();
        if (at > same) {
            INFO(what, ": parted from the CPU's text at byte ", same, ", generated token ", i, ", where the CPU's two best "
                 "logits were ", d.gap(), " apart\n  gpu: ", got, "\n  cpu: ", want);
            CHECK(d.gap() < near_tie);
            return;
        }
        next = d.step(std::span(&next, 1));
    }
    FAIL(what, ": the texts differ past the CPU's ", n, " tokens\n  gpu: ", got, "\n  cpu: ", want);
#endif
}

// The pid of the daemon's worker with this role, or -1.
inline pid_t worker_pid(pid_t daemon, const std::string& role) {
    DIR* d = ::opendir("/proc");
    if (!d) return -1;
    pid_t found = -1;
    while (dirent* e = ::readdir(d)) {
        const pid_t pid = pid_t(std::atoi(e->d_name));
        if (pid <= 0) continue;
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string line;
        std::getline(stat, line);
        const size_t rp = line.rfind(')');
        if (rp == std::string::npos) continue;
        char state = 0;
        int ppid = 0;
        if (std::sscanf(line.c_str() + rp + 1, " %c %d", &state, &ppid) != 2 || ppid != daemon || state == 'Z') continue;
        std::ifstream cl("/proc/" + std::to_string(pid) + "/cmdline");
        std::string cmd((std::istreambuf_iterator<char>(cl)), {});
        if (cmd.find(std::string("--worker") + '\0' + role + '\0') != std::string::npos) found = pid;
    }
    ::closedir(d);
    return found;
}

inline bool alive(pid_t pid) {
    if (::kill(pid, 0) != 0) return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t rp = line.rfind(')');
    return rp != std::string::npos && line.size() > rp + 2 && line[rp + 2] != 'Z';
}

json status(const std::string& sock) { return request(sock, "GET", "/v1/tandem/status").j(); }

inline json completion(const std::string& sock, const std::string& prompt, int n) {
    auto r = post(sock, "/v1/completions",
                  {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}});
    return r.status == 200 ? r.j() : json{{"status", r.status}, {"body", r.body}};
}

// A streamed completion: its text and finish reason.
struct streamed {
    std::string text, finish;
    bool done = false;
};

inline streamed stream(const std::string& sock, const std::string& prompt, int n) {
    auto r = post(sock, "/v1/completions",
                  {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true}});
    streamed s;
    for (const auto& e : sse_events(r.body, &s.done)) {
        if (!e.contains("choices") || e["choices"].empty()) continue;
        s.text += e["choices"][0]["text"].get<std::string>();
        if (!e["choices"][0]["finish_reason"].is_null()) s.finish = e["choices"][0]["finish_reason"];
    }
    return s;
}

inline bool wait_for(const std::function<bool()>& pred, double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
}

const std::vector<std::string> prompts = {"Once upon a time", "The cat sat on", "One day, Tom went", "Lily and Ben",
                                          "A little bird", "The sun was hot and", "Mom said", "They played"};

inline double generated_tokens(const daemon_process& d) {
    return metric(request(d.sock, "GET", "/metrics").body, "tandem_engine_generated_tokens_total");
}

// Streams of n tokens from the first `count` prompts, returned once `settled` tokens of theirs
// were generated: a fault injected then hits them mid-stream.
inline std::vector<std::future<streamed>> streaming(const daemon_process& d, size_t count, int n, int settled) {
    const double before = generated_tokens(d);
    std::vector<std::future<streamed>> fs;
    for (size_t i = 0; i < count; ++i)
        fs.push_back(std::async(std::launch::async, [sock = d.sock, i, n] { return stream(sock, prompts[i], n); }));
    REQUIRE(wait_for([&] { return generated_tokens(d) >= before + settled; }, 10));
    return fs;
}

using tokens_of = std::function<int(size_t)>; // request i's max_tokens

// prompts[0..count) streamed at once, request i asking for n_of(i) tokens.
inline std::vector<std::future<streamed>> stream_all(const std::string& sock, size_t count, const tokens_of& n_of) {
    std::vector<std::future<streamed>> fs;
    for (size_t i = 0; i < count; ++i)
        fs.push_back(std::async(std::launch::async, [sock, i, n = n_of(i)] { return stream(sock, prompts[i], n); }));
    return fs;
}

// Every stream of fs (prompt i, n_of(i) tokens) ended whole, by length, with the offline
// loop's text.
inline void check_equal_offline(std::vector<std::future<streamed>>& fs, const tokens_of& n_of, bool on_gpu = false) {
    for (size_t i = 0; i < fs.size(); ++i) {
        const streamed s = fs[i].get();
        CHECK(s.done);
        CHECK(s.finish == "length");
        if (on_gpu) check_gpu_text(s.text, prompts[i], n_of(i), fmt::format("request {}", i));
        else CHECK_MESSAGE(s.text == offline_text(prompts[i], n_of(i)), "request ", i);
    }
}

const tokens_of growing = [](size_t i) { return 30 + int(i) * 7; };
const tokens_of short_growing = [](size_t i) { return 24 + int(i) * 5; };


// Waits up to 2 minutes for the daemon to answer /health (true) or to exit (false, its exit
// code in rc): a GPU placement without a usable device must end the daemon, not hang it.
inline bool ready_or_exit(daemon_process& d, int& rc) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < until) {
        if (request(d.sock, "GET", "/health").status == 200) return true;
        if ((rc = d.wait_exit(0.05)) != -1) return false;
    }
    return false;
}

// A daemon started with a GPU placement (its log captured in d.log): true once it serves;
// false (checked and reported as skipped) when it refused to start with exit code 1 and the
// log says there is no usable device, as it must without one. A GPU worker that crashes at
// start is neither, and neither is a refusal on the emulated device, which is always usable.
inline bool gpu_daemon_up(daemon_process& d, const std::string& placement) {
    REQUIRE_MESSAGE(!d.log.empty(), "gpu_daemon_up reads the daemon's log: set d.log before starting it");
    int rc = -1;
    if (ready_or_exit(d, rc)) {
#if TANDEM_CUDA_EMULATED
        // A pool the kernel will not pin (the tests keep it beside the socket, in the temp
        // dir: on disk here, unless that is a tmpfs) serves unpinned, with a warning; the
        // emulated device refuses what Linux refuses.
        const std::string pool = d.sock + ".kv";
        const bool pinnable = ipc::file_system_name(pool) == "tmpfs";
        INFO("pool ", pool, " on ", ipc::file_system_name(pool));
        CHECK((read_text(d.log).find("cannot page-lock the KV pool") == std::string::npos) == pinnable);
#endif
        return true;
    }
    const std::string log = read_text(d.log);
#if TANDEM_CUDA_EMULATED
    FAIL("the emulated device is usable, yet ", placement, " did not start (exit code ", rc, "):\n", log);
#endif
    CHECK(rc == 1);
    CHECK_MESSAGE(log.find(placement + ": no CUDA device is usable") != std::string::npos, log);
    MESSAGE("skipped: no CUDA device (", placement, " refused to start, as it must without one)");
    return false;
}

// Polls `ex` as the engine thread does, waiting on its fds in between, until `done` holds
// for what poll() returned (false after 60 s).
inline bool poll_until(executor& ex, const std::function<bool(const std::optional<executor::outcome>&)>& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
        if (done(ex.poll())) return true;
        const auto wait = std::min(ex.poll_interval(), std::chrono::milliseconds(100));
        if (const auto fds = ex.wait_fds(); fds.empty()) std::this_thread::sleep_for(wait);
        else ipc::wait_readable(fds, wait);
    }
    return false;
}

// A runner whose forward is one batch through a worker process's executor, as the engine
// runs it: the batch goes over the wire with its pages' generations, the worker writes K/V
// into the shared pool (mapped here as `pages`), the rows come back through the channel.
class executor_runner final : public runner {
public:
    executor_runner(executor& ex, paged_kv& pages, int32_t n_vocab) : ex_(ex), pages_(pages), n_vocab_(n_vocab) {}
    std::string device() const override { return ex_.name(); }
    void forward(const batch& b, kv_cache& kv, float* logits) override {
        REQUIRE(&kv == &pages_); // the worker writes the pool, nothing else
        wire_ = b;
        wire_.generations.clear();
        for (int32_t p : wire_.tables) wire_.generations.push_back(p == no_page ? 0 : pages_.pages.generation(p));
        REQUIRE(ex_.ready());
        ex_.start(wire_);
        std::optional<executor::outcome> out;
        REQUIRE(poll_until(ex_, [&](const auto& o) { return (out = o).has_value(); }));
        REQUIRE_MESSAGE(out->ok, out->error);
        for (int32_t row = 0; row < b.n_logits(); ++row) {
            const auto got = ex_.logits(row);
            REQUIRE(got.size() == size_t(n_vocab_));
            std::copy(got.begin(), got.end(), logits + int64_t(row) * n_vocab_);
        }
    }

private:
    executor& ex_;
    paged_kv& pages_;
    int32_t n_vocab_;
    batch wire_; // valid until the outcome is taken
};

// A decode worker's spec on stories260K with the pool at `path`.
inline daemon::worker_spec decode_spec(const std::string& path, uint64_t fp, const load_options& lo, int32_t page_size,
                                int32_t n_pages, int32_t n_vocab, int32_t max_rows) {
    daemon::worker_spec s;
    s.role = "decode";
    s.exe = default_tandemd();
    s.model = model_path("stories260K.gguf");
    s.pool = path;
    s.weights = lo.weights;
    s.kv = lo.kv;
    s.page_size = page_size;
    s.n_pages = n_pages;
    s.fingerprint = fp;
    s.max_rows = max_rows;
    s.n_vocab = n_vocab;
    s.timeout_s = 60;
    return s;
}

// Its executor, polled until the worker is ready.
inline std::unique_ptr<executor> start_decode_worker(const daemon::worker_spec& s) {
    auto ex = daemon::make_worker_executor(s, work_kind::decode);
    REQUIRE(poll_until(*ex, [&](const auto&) { return ex->ready() || !ex->failure().empty(); }));
    REQUIRE_MESSAGE(ex->failure().empty(), ex->failure());
    return ex;
}

// The command ring's header in this process's (the supervisor's) worker channel, found by
// the ring's magic: the first ring of the only channel the test has open.
inline ipc::ring_header* command_ring_of_channel() {
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        if (std::filesystem::read_symlink(e.path(), ec).string().find("memfd:tandem-ctl") == std::string::npos) continue;
        const int fd = std::atoi(e.path().filename().c_str());
        struct stat st {};
        REQUIRE(::fstat(fd, &st) == 0);
        void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        REQUIRE(p != MAP_FAILED); // left mapped: the test process ends soon
        auto* base = static_cast<uint8_t*>(p);
        for (size_t at = 0; at + sizeof(ipc::ring_header) <= size_t(st.st_size); at += 64) {
            auto* h = reinterpret_cast<ipc::ring_header*>(base + at);
            if (h->magic == 0x474e4952 && h->capacity >= ipc::ring::min_capacity) return h; // "RING"
        }
    }
    FAIL("no worker channel open");
    return nullptr;
}


using text_of = std::function<std::string(const std::string& prompt, int n)>;

// Kills the `role` worker of `d` with requests in its batch (decode: once their tokens flow;
// prefill: stopped first, holding the first chunk of long prompts), then checks that a new
// worker comes within 2 s and the requests end as if nothing had happened (resumed from the
// pages in the pool: the text `want` gives), their pages returned.
inline void kill_mid_batch(const daemon_process& d, const std::string& role, int n_decode, const text_of& want = offline_text) {
    CAPTURE(role);
    std::string story;
    for (const auto& p : prompts) story += p + " and then. ";
    const pid_t victim = worker_pid(d.pid, role);
    REQUIRE(victim > 0);
    std::vector<std::future<streamed>> fs;
    std::vector<std::string> sent;
    if (role == "decode") {
        fs = streaming(d, 4, n_decode, 40); // once tokens flow, kill it
        sent.assign(prompts.begin(), prompts.begin() + 4);
        CHECK(status(d.sock)["running"].get<int>() >= 1); // killed while streaming
    } else {
        REQUIRE(::kill(victim, SIGSTOP) == 0);
        for (size_t i = 0; i < 2; ++i) {
            sent.push_back(prompts[i] + ". " + story);
            fs.push_back(std::async(std::launch::async, [sock = d.sock, p = sent.back()] { return stream(sock, p, 40); }));
        }
        REQUIRE(wait_for([&] { return status(d.sock)["running"].get<int>() >= 1; }, 10));
    }
    const auto t_kill = std::chrono::steady_clock::now();
    REQUIRE(::kill(victim, SIGKILL) == 0);
    // a new worker within a second or two (model load included)
    CHECK(wait_for([&] { const pid_t p = worker_pid(d.pid, role); return p > 0 && p != victim; }, 2));
    const double noticed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
    CHECK(noticed < 2.0);
    for (size_t i = 0; i < fs.size(); ++i) {
        const streamed s = fs[i].get();
        CHECK(s.done);
        CHECK_MESSAGE(s.finish == "length", "request ", i);
        CHECK_MESSAGE(s.text == want(sent[i], role == "decode" ? n_decode : 40), "request ", i);
    }
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
}

// A synthetic Llama with a window of 24 on every layer (written once), and what one greedy
// request of 96 tokens gives on it in-process.
inline const std::string& windowed_model_path() {
    static const std::string path = [] {
        synth_params p = synth_preset("tiny");
        p.sliding_window = 24;
        p.n_ctx = 512;
        p.seed = 17;
        const std::string f = scratch().file("swa.gguf");
        synth_write(p, f);
        return f;
    }();
    return path;
}

inline const std::string windowed_prompt = "abc def ghi";

// tandemd on the windowed model with these placements: while a request generates 4 windows'
// worth of tokens, the pages behind its window go back to the shared pool's free list at once,
// so it never holds more than ceil(23 / 16) + 1 = 3 pages (without the release, 7 at the end).
// Returns its text ("" when the placement cannot start here).
inline std::string windowed_run(const std::string& name, const std::vector<std::string>& placement) {
    daemon_process d;
    d.sock = scratch().file(name + ".sock");
    d.log = scratch().file(name + ".log");
    std::vector<std::string> args{"--model", windowed_model_path(), "--socket", d.sock, "--threads", "1", "--log",
                                  "warn", "--set", "kv_pool=" + d.sock + ".kv", "--set", "kv_pool_persist=false"};
    args.insert(args.end(), placement.begin(), placement.end());
    d.spawn(args);
    if (!placement.empty()) {
        if (!gpu_daemon_up(d, placement[1])) return ""; // the first placement set (prefill's)
    } else {
        REQUIRE(d.wait_ready());
    }
    const streamed s = stream(d.sock, windowed_prompt, 96);
    CHECK(s.done);
    CHECK(s.finish == "length");
    CHECK(wait_for([&] { return status(d.sock)["kv_pages_used"] == 0; }, 5));
    const int most = status(d.sock)["kv_pages_peak"].get<int>(); // over the daemon's one request
    CHECK(most >= 1);
    CHECK(most <= 3);
    CHECK(d.stop() == 0);
    return s.text;
}


} // namespace tandem::test
