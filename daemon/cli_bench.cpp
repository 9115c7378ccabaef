// Measurement subcommands of `tandem`: bench and its modes (speculative, beams, guided).
#include "daemon/cli.hpp"

#include "runtime/engine.hpp"
#include "runtime/error.hpp"
#include "quant/int8.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/host.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/log.hpp"
#include "runtime/logits_processor.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

namespace tandem::cli {
namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// VmRSS or VmHWM of this process in MB, from /proc/self/status.
double proc_status_mb(const char* key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) return double(std::stoll(line.substr(std::strlen(key) + 1))) / 1024.0;
    return 0;
}

// Resets VmHWM to the current RSS, so a later peak is the peak after this point.
void reset_peak_rss() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
}

struct bench_opts {
    std::string model;
    load_options load;
    int32_t n_prompt = 512, n_gen = 128;
    int threads = default_threads();
    std::vector<int> batches{1, 8, 16};
    bool json = false, no_raw = false;
    int32_t speculative = 0; // --speculative K: the speculative-decoding mode
    std::string draft_model; // --draft-model: the speculative mode also drafts from it
    bool guided = false;     // --guided-decode: decode under a JSON schema vs without
    int32_t beams = 0;       // --beams W: the beam-search mode
};

// Every matrix a decode step reads for every token (a mixture's router and shared expert
// included), or (experts) a mixture's routed experts.
std::vector<const weight*> decode_matrices(const model_weights& w, bool experts = false) {
    std::vector<const weight*> v;
    for (const auto& l : w.layers) {
        for (const weight* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router, &l.w_gate_shexp,
                                &l.w_up_shexp, &l.w_down_shexp})
            if (!m->empty() && !experts) v.push_back(m);
        for (const auto* exps : {&l.gate_exps, &l.up_exps, &l.down_exps})
            for (const weight& x : *exps) if (experts) v.push_back(&x);
    }
    if (!experts) v.push_back(&w.logits_weight());
    return v;
}

// Read bandwidth in GB/s, measured by streaming over the weight matrices themselves (well
// above the cache size) on the threads: the bytes a decode step reads, on the threads it uses.
double measure_bandwidth_gbs(const host_threads& threads, const std::vector<const weight*>& mats) {
    std::vector<std::span<const uint8_t>> ranges;
    for (const weight* m : mats) {
        const uint8_t* p = m->is_lowbit() ? m->lb->data.data()
                           : m->is_i8()   ? reinterpret_cast<const uint8_t*>(m->q())
                                          : reinterpret_cast<const uint8_t*>(m->data.data());
        const int64_t n = m->is_lowbit() ? m->lb->bytes() : m->is_i8() ? m->n_out * m->n_in : int64_t(m->data.size()) * 4;
        ranges.emplace_back(p, size_t(n));
    }
    return threads.read_bandwidth_gbs(ranges);
}

std::vector<token_id> random_tokens(int n, int32_t n_vocab, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<token_id> v(static_cast<size_t>(n));
    for (auto& t : v) t = token_id(3 + g() % uint32_t(n_vocab - 3));
    return v;
}

// The median and range of a few runs' figures (the runs interleaved with what they are
// compared with: on a noisy machine the range says how far to trust the median).
struct spread {
    double median = 0, min = 0, max = 0;
};

spread spread_of(std::vector<double> v) {
    TANDEM_ASSERT(!v.empty());
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

// A profiled forward's ops, largest time first, and as JSON.
std::vector<op_profile::entry> sorted_ops(const op_profile& prof) {
    std::vector<op_profile::entry> ops = prof.entries();
    std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
    return ops;
}

nlohmann::json ops_json(const std::vector<op_profile::entry>& ops) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& e : ops) a.push_back({{"op", e.name}, {"calls", e.calls}, {"s", e.seconds}});
    return a;
}

// Where the time of one profiled forward went, op by op, largest first.
void print_ops(const std::vector<op_profile::entry>& ops, double total_s) {
    double ops_s = 0;
    for (const auto& e : ops) {
        std::cout << fmt::format("  op         {:<20} {:5d} calls {:8.2f} ms {:5.1f}%\n", e.name, e.calls,
                                 e.seconds * 1e3, 100.0 * e.seconds / total_s);
        ops_s += e.seconds;
    }
    std::cout << fmt::format("  op         {:<20} {:>11} {:8.2f} ms {:5.1f}%\n", "(between ops)", "",
                             (total_s - ops_s) * 1e3, 100.0 * (total_s - ops_s) / total_s);
}

int cmd_bench(const bench_opts& o) {
    prepare_inference_process();
    const auto t_load = clock_type::now();
    model_bundle b = load_model(resolve_model(o.model), o.load);
    const double load_s = since(t_load);
    const double rss_load_mb = proc_status_mb("VmRSS");
    const double peak_load_mb = proc_status_mb("VmHWM");
    reset_peak_rss();

    model& m = *b.mdl;
    const model_config& c = m.config();
    const int32_t n_vocab = c.n_vocab;
    const host_threads threads(o.threads);
    const exec_ctx ctx = threads.ctx();
    auto log = logger("bench");

    auto mats = decode_matrices(m.weights());
    int64_t step_bytes = 0;
    for (const weight* w : mats) step_bytes += w->bytes();
    // A mixture of experts: a token reads n_expert_used of each layer's n_expert experts.
    const int64_t all_expert_bytes = m.weights().expert_bytes();
    if (c.is_moe()) step_bytes += all_expert_bytes / c.n_expert * c.n_expert_used;
    for (const weight* w : decode_matrices(m.weights(), true)) mats.push_back(w);
    const double bw = measure_bandwidth_gbs(threads, mats);
    const double roofline = bw * 1e9 / double(step_bytes);
    log->info("bandwidth {:.1f} GB/s over {:.0f} MB of weights: roofline {:.2f} tok/s", bw, double(step_bytes) / 1e6,
              roofline);

    const int32_t page = 16;
    const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
    const int32_t seq_len = o.n_prompt + o.n_gen + 1;
    const int32_t n_short = 16; // prompt tokens per sequence before the decode steps
    const int32_t pages_seq = (seq_len + page - 1) / page, pages_dec = (n_short + o.n_gen + page) / page;
    kv_cache kv(m.make_kv_layout(page), std::max(pages_seq, int32_t(max_batch) * pages_dec) + 1);
    block_pool pages(kv.n_pages());
    std::vector<float> logits(size_t(std::max(2, max_batch)) * size_t(n_vocab));

    // prefill: one sequence of n_prompt tokens in one step (a warm-up run first: JIT, pages)
    double prefill_s = 0;
    std::vector<token_id> prompt = random_tokens(o.n_prompt, n_vocab, 1);
    for (int rep = 0; rep < 2; ++rep) {
        sequence_kv seq(pages, page);
        TANDEM_ASSERT(seq.reserve(seq_len));
        const batch s = one_sequence(prompt, 0, seq.block_table());
        const auto t0 = clock_type::now();
        m.forward(ctx, s, kv, logits.data());
        prefill_s = since(t0);
    }
    const double prefill_tok_s = double(o.n_prompt) / prefill_s;
    log->info("prefill {} tokens: {:.3f} s, {:.1f} tok/s", o.n_prompt, prefill_s, prefill_tok_s);
    // One more prefill with each op timed: where the prefill's time goes (not in the figure above).
    op_profile prof;
    double prof_s = 0;
    {
        sequence_kv seq(pages, page);
        TANDEM_ASSERT(seq.reserve(seq_len));
        const batch s = one_sequence(prompt, 0, seq.block_table());
        exec_ctx pctx = ctx;
        pctx.profile = &prof;
        const auto t0 = clock_type::now();
        m.forward(pctx, s, kv, logits.data());
        prof_s = since(t0);
    }
    const std::vector<op_profile::entry> prefill_ops = sorted_ops(prof);

    // decode: each batch size decodes n_gen steps after a short prompt per sequence
    std::map<int, double> batch_tok_s;
    std::map<int, model::expert_reads> batch_expert_reads; // a step's, on average
    op_profile decode_prof;
    double decode_prof_s = 0;
    for (int nb : o.batches) {
        std::vector<std::unique_ptr<sequence_kv>> seqs;
        std::vector<std::vector<token_id>> toks;
        batch step_batch;
        // Each sequence's next token at position pos (the step's tokens, one per sequence).
        auto step = [&](int32_t pos) -> const batch& {
            step_batch.clear();
            for (int i = 0; i < nb; ++i)
                step_batch.add_seq(uint64_t(i), pos, std::span(&toks[size_t(i)][size_t(pos)], 1),
                                   seqs[size_t(i)]->block_table(), {}, pos);
            return step_batch;
        };
        for (int i = 0; i < nb; ++i) {
            seqs.push_back(std::make_unique<sequence_kv>(pages, page));
            TANDEM_ASSERT(seqs.back()->reserve(n_short + o.n_gen + 1));
            toks.push_back(random_tokens(n_short + o.n_gen + 1, n_vocab, uint32_t(100 + i)));
        }
        for (int i = 0; i < nb; ++i) { // prompts (not timed)
            m.forward(ctx, one_sequence(std::span(toks[size_t(i)]).first(size_t(n_short)), 0, seqs[size_t(i)]->block_table()),
                      kv, logits.data());
        }
        const model::expert_reads r0 = m.expert_reads_total();
        const auto t0 = clock_type::now();
        for (int32_t s = 0; s < o.n_gen; ++s) m.forward(ctx, step(n_short + s), kv, logits.data());
        batch_tok_s[nb] = double(nb) * double(o.n_gen) / since(t0);
        const model::expert_reads r1 = m.expert_reads_total();
        batch_expert_reads[nb] = {(r1.runs - r0.runs) / o.n_gen, (r1.bytes - r0.bytes) / o.n_gen};
        log->info("decode batch {}: {:.2f} tok/s aggregate", nb, batch_tok_s[nb]);
        if (nb == max_batch) { // one more step with each op timed (not in the figure above)
            exec_ctx pctx = ctx;
            pctx.profile = &decode_prof;
            const auto& b = step(n_short + o.n_gen);
            const auto t1 = clock_type::now();
            m.forward(pctx, b, kv, logits.data());
            decode_prof_s = since(t1);
        }
    }
    const double decode_tok_s = batch_tok_s.count(1) ? batch_tok_s[1] : batch_tok_s.begin()->second;
    const double peak_rss_mb = proc_status_mb("VmHWM");

    // The layers' matmul shapes (k inputs, n outputs) of one token.
    const int64_t e = c.n_embd, nq = c.n_embd_q(), kvd = c.n_embd_kv(), ff = c.n_ff, M = o.n_prompt;
    std::vector<std::pair<int64_t, int64_t>> per_layer{{e, nq}, {e, kvd}, {e, kvd}, {nq, e}, {e, ff}, {e, ff}, {ff, e}};
    double macs_per_token = 0;
    if (c.is_moe()) { // a token's experts, the router, the shared expert (oneDNN's figure: each shape at M rows)
        const int64_t fe = c.n_ff_exp, fs = c.n_ff_shexp;
        per_layer = {per_layer[0], per_layer[1], per_layer[2], per_layer[3], {e, fe}, {e, fe}, {fe, e}};
        if (fs > 0) per_layer.insert(per_layer.end(), {{e, fs}, {e, fs}, {fs, e}});
        macs_per_token += double(c.n_expert_used - 1) * 3.0 * double(e) * double(fe) + double(e) * double(c.n_expert);
    }
    for (auto kn : per_layer) macs_per_token += double(kn.first) * double(kn.second);
    macs_per_token *= c.n_layer;

    // The compute limit: this machine's int8 peak on every thread (a register-only loop of the
    // instruction the kernels at this ISA level use) over the ops a prompt token's matmuls take.
    const host_threads::int8_peak peak = threads.measure_int8_peak(0.5);
    const double limit_tok_s = peak.tops > 0 ? peak.tops * 1e12 / (2.0 * macs_per_token) : 0;

    // oneDNN's raw int8 matmul throughput on this model's prefill shapes, as time for the
    // whole prefill's matmuls: prefill tok/s as a fraction of it excludes everything else.
    double raw_s = 0, raw_tok_s = 0;
    nlohmann::json raw_shapes = nlohmann::json::array();
    if (!o.no_raw) {
        std::map<std::pair<int64_t, int64_t>, double> gops;
        for (auto kn : per_layer) {
            if (gops.count(kn)) continue;
            gops[kn] = host_matmul_gops(o.threads, M, kn.first, kn.second, 5);
            raw_shapes.push_back({{"m", M}, {"k", kn.first}, {"n", kn.second}, {"gops", gops[kn]},
                                  {"impl", host_matmul_impl(M, kn.first, kn.second)}});
        }
        for (auto kn : per_layer) raw_s += 2.0 * double(M) * double(kn.first) * double(kn.second) / (gops[kn] * 1e9);
        raw_s *= c.n_layer;
        raw_tok_s = double(M) / raw_s;
    }

    const double weights_mb = double(m.weights().bytes()) / 1e6;
    double file_tensor_mb = 0; // what the file's tensors take: the low-bit family's measure
    for (const auto& t : b.file->tensors()) file_tensor_mb += double(t.n_bytes) / 1e6;
    nlohmann::json j{{"model", resolve_model(o.model)},
                     {"threads", o.threads},
                     {"weights", name_of(o.load.weights)},
                     {"family", m.weights().family()},
                     {"file_tensor_mb", file_tensor_mb},
                     {"kv", name_of(o.load.kv)},
                     {"load_s", load_s},
                     {"n_prompt", o.n_prompt},
                     {"n_gen", o.n_gen},
                     {"prefill_tok_s", prefill_tok_s},
                     {"decode_tok_s", decode_tok_s},
                     {"decode_batch_tok_s", nlohmann::json::object()},
                     {"bandwidth_gbs", bw},
                     {"bytes_per_step_mb", double(step_bytes) / 1e6},
                     {"roofline_tok_s", roofline},
                     {"roofline_pct", 100.0 * decode_tok_s / roofline},
                     {"weights_mb", weights_mb},
                     {"rss_after_load_mb", rss_load_mb},
                     {"peak_rss_load_mb", peak_load_mb},
                     {"peak_rss_mb", peak_rss_mb},
                     {"rss_ratio", peak_rss_mb * 1.048576 / weights_mb},
                     {"rss_file_ratio", peak_rss_mb * 1.048576 / file_tensor_mb}};
    for (auto [nb, v] : batch_tok_s) j["decode_batch_tok_s"][std::to_string(nb)] = v;
    if (c.is_moe()) {
        j["experts"] = {{"count", c.n_expert}, {"used", c.n_expert_used}, {"bytes_mb", double(all_expert_bytes) / 1e6}};
        for (auto [nb, r] : batch_expert_reads)
            j["decode_expert_reads_per_step"][std::to_string(nb)] = {{"runs", r.runs}, {"mb", double(r.bytes) / 1e6}};
    }
    const std::vector<op_profile::entry> decode_ops = sorted_ops(decode_prof);
    j["prefill_ops"] = ops_json(prefill_ops);
    j["prefill_profiled_s"] = prof_s;
    j["decode_step_ops"] = ops_json(decode_ops);
    j["decode_step_batch"] = max_batch;
    j["decode_step_profiled_s"] = decode_prof_s;
    if (batch_tok_s.count(1) && batch_tok_s.count(16)) j["batch16_speedup"] = batch_tok_s[16] / batch_tok_s[1];
    if (limit_tok_s > 0) {
        j["int8_peak_isa"] = peak.isa;
        j["int8_peak_tops"] = peak.tops;
        j["compute_limit_tok_s"] = limit_tok_s;
        j["prefill_pct_of_peak"] = 100.0 * prefill_tok_s / limit_tok_s;
    }
    if (!o.no_raw) {
        j["onednn_raw_shapes"] = raw_shapes;
        j["onednn_raw_prefill_tok_s"] = raw_tok_s;
        j["prefill_pct_of_onednn"] = 100.0 * prefill_tok_s / raw_tok_s;
    }
    if (o.json) {
        std::cout << j.dump() << "\n";
        return 0;
    }
    std::cout << fmt::format("model        {} (--weights {}: {} weights {:.0f} MB, file tensors {:.0f} MB, kv {}), {} "
                             "threads\n", j["model"].get<std::string>(), j["weights"].get<std::string>(),
                             j["family"].get<std::string>(), weights_mb, file_tensor_mb, name_of(o.load.kv), o.threads);
    std::cout << fmt::format("load         {:.2f} s\n", load_s);
    std::cout << fmt::format("prefill      {} tokens: {:.1f} tok/s", o.n_prompt, prefill_tok_s);
    if (!o.no_raw)
        std::cout << fmt::format(" ({:.0f}% of oneDNN raw int8 matmul on these shapes: {:.1f} tok/s)",
                                 100.0 * prefill_tok_s / raw_tok_s, raw_tok_s);
    std::cout << "\n";
    for (const auto& s : raw_shapes)
        std::cout << fmt::format("  oneDNN     m={} k={} n={}: {:.0f} GOPS ({})\n", s["m"].get<int64_t>(),
                                 s["k"].get<int64_t>(), s["n"].get<int64_t>(), s["gops"].get<double>(),
                                 s["impl"].get<std::string>());
    print_ops(prefill_ops, prof_s);
    for (auto [nb, v] : batch_tok_s)
        std::cout << fmt::format("decode       batch {:2d}: {:.2f} tok/s aggregate{}\n", nb, v, !c.is_moe() ? "" :
                                 fmt::format("; experts read {:.1f} MB a step ({} expert runs of {} layers x {} a token)",
                                             double(batch_expert_reads[nb].bytes) / 1e6, batch_expert_reads[nb].runs,
                                             c.n_layer, c.n_expert_used));
    std::cout << fmt::format("  one step at batch {}: {:.1f} ms\n", max_batch, decode_prof_s * 1e3);
    print_ops(decode_ops, decode_prof_s);
    std::cout << fmt::format("roofline     {:.1f} GB/s / {:.0f} MB per step = {:.2f} tok/s; decode at {:.0f}%\n", bw,
                             double(step_bytes) / 1e6, roofline, 100.0 * decode_tok_s / roofline);
    if (limit_tok_s > 0)
        std::cout << fmt::format("compute      int8 peak {:.2f} TOPS ({} register loop, {} threads) / {:.2f} GOP per "
                                 "token = {:.0f} tok/s; prefill at {:.1f}%\n",
                                 peak.tops, peak.isa, o.threads, 2.0 * macs_per_token * 1e-9, limit_tok_s,
                                 100.0 * prefill_tok_s / limit_tok_s);
    else
        std::cout << "compute      no int8 peak at the scalar level\n";
    std::cout << fmt::format("memory       peak RSS after load {:.0f} MiB ({:.2f}x weights, {:.2f}x the file's tensors); "
                             "at load {:.0f} MiB, peak during load {:.0f} MiB\n",
                             peak_rss_mb, peak_rss_mb * 1.048576 / weights_mb, peak_rss_mb * 1.048576 / file_tensor_mb,
                             rss_load_mb, peak_load_mb);
    return 0;
}

// One run of requests on an in-process engine: wall time, tokens, the engine's counters, and
// the decode window (from when every sequence has its first token to the end; a beam search,
// whose events all come when it ends: from when its prompt's row is taken, see beam_watch).
struct engine_run {
    double seconds = 0;
    int32_t n_tokens = 0;
    engine_stats stats;
    double decode_seconds = 0;
    int32_t n_decode_tokens = 0;
    std::vector<token_id> tokens;     // sequence 0's
    int32_t peak_pages = 0;           // beam search: KV pages in use at most, over every step
};

// Watches a beam search from inside the engine, with no thread of its own to disturb it: a
// logits processor that edits nothing, called for every beam's row on the engine thread as
// each step's result is taken. Its first call is the prompt's row, where decode starts. The
// stats it reads were published after the step whose rows these are, so it sees the pages in
// use during every step.
struct beam_watch {
    const engine* eng = nullptr;
    clock_type::time_point t_decode{}; // the prompt's row taken
    uint64_t n_steps_prompt = 0;       // steps run by then: the prompt's
    int32_t peak_pages = 0;
};

class beam_watch_processor final : public logits_processor {
public:
    explicit beam_watch_processor(std::shared_ptr<beam_watch> w) : w_(std::move(w)) {}
    std::string_view name() const override { return "beam_watch"; }
    void apply(std::span<float>, std::span<const token_id>) override {
        const engine_stats s = w_->eng->stats();
        if (w_->t_decode == clock_type::time_point{}) {
            w_->t_decode = clock_type::now();
            w_->n_steps_prompt = s.n_steps;
        }
        w_->peak_pages = std::max(w_->peak_pages, s.n_pages_used);
    }
    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<beam_watch_processor>(w_); }

private:
    std::shared_ptr<beam_watch> w_; // shared by the beams (read once the request is done)
};

// `n_seqs` copies of `req` (sequence i seeded with i) decoding together.
engine_run run_engine(model_bundle& b, int threads, const engine_request& req, int n_seqs, model* draft = nullptr) {
    engine_options eo;
    eo.n_threads = threads;
    eo.max_draft_tokens = req.draft_tokens;
    eo.draft_model = draft;
    eo.sched.max_running = std::max(eo.sched.max_running, n_seqs * std::max(1, req.beam.width)); // every beam in every step
    auto eng = make_local_engine(*b.mdl, *b.tok, eo);
    TANDEM_ASSERT(req.beam.width == 0 || (n_seqs == 1 && !req.make_processor));
    auto watch = std::make_shared<beam_watch>();
    watch->eng = eng.get();
    std::promise<void> done;
    std::mutex mu;
    engine_run r;
    int n_started = 0, n_done = 0;
    clock_type::time_point all_started{};
    const auto t0 = clock_type::now();
    for (int i = 0; i < n_seqs; ++i) {
        engine_request q = req;
        q.sampling.seed = uint64_t(i);
        if (req.beam.width > 0) q.make_processor = [watch] { return std::make_unique<beam_watch_processor>(watch); };
        TANDEM_CHECK(eng->submit(q, [&, first = true, i](engine_event&& ev) mutable {
                             std::lock_guard lock(mu);
                             if (ev.done) {
                                 if (++n_done == n_seqs) done.set_value();
                                 return;
                             }
                             if (i == 0) r.tokens.push_back(ev.id);
                             if (std::exchange(first, false) && ++n_started == n_seqs) all_started = clock_type::now();
                             else if (n_started == n_seqs) ++r.n_decode_tokens;
                             ++r.n_tokens;
                         }).status == submit_status::ok,
                     "the benchmark's request was refused");
    }
    done.get_future().wait();
    const auto t_end = clock_type::now();
    r.seconds = std::chrono::duration<double>(t_end - t0).count();
    r.stats = eng->stats();
    if (req.beam.width == 0) r.decode_seconds = std::chrono::duration<double>(t_end - all_started).count();
    else { // the steps after the prompt's, each one token of every beam (ignore_eos keeps them all)
        r.decode_seconds = std::chrono::duration<double>(t_end - watch->t_decode).count();
        r.n_decode_tokens = int32_t(r.stats.n_steps - watch->n_steps_prompt) * req.beam.width;
        r.peak_pages = watch->peak_pages;
    }
    eng->stop();
    return r;
}

// One greedy request with up to draft_tokens drafts a step from `drafts` (replay: `replay`).
engine_run run_greedy(model_bundle& b, int threads, const std::vector<token_id>& prompt, int32_t n_gen,
                      int32_t draft_tokens, draft_source drafts = draft_source::ngram, model* draft = nullptr,
                      std::vector<token_id> replay = {}) {
    engine_request req;
    req.prompt = prompt;
    req.max_tokens = n_gen;
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    req.draft_tokens = draft_tokens;
    req.drafts = drafts;
    req.replay = std::move(replay);
    return run_engine(b, threads, req, 1, draft);
}

// `tandem bench --beams W`: beam search of width W against width 1 (greedy's tokens, on the
// same path and timed the same way) on one prompt of -p random tokens, -n tokens a beam
// (ignore_eos: every run takes every step), three runs of each interleaved. Decode rates are
// aggregate: W tokens for each step after the prompt's, over the time from the prompt's row
// to the end (beam_watch), so the prefill is not in them; one step reads the weights once for
// all W beams. The beams share the prompt's pages and whatever history they have in common:
// the peak of pages in use (over every step) against W unshared copies of -p + -n tokens.
int cmd_bench_beams(const bench_opts& o) {
    prepare_inference_process();
    model_bundle b = load_model(resolve_model(o.model), o.load);
    const int32_t W = o.beams;
    engine_request req;
    req.prompt = random_tokens(o.n_prompt, b.mdl->config().n_vocab, 1);
    req.max_tokens = o.n_gen;
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    req.beam.width = W;
    engine_request single = req;
    single.beam.width = 1;
    const auto tok_s = [](const engine_run& r) { return r.n_decode_tokens / r.decode_seconds; };
    constexpr int reps = 3;
    std::vector<double> rates_1, rates_w, ratios;
    engine_run one, beams;
    int32_t peak = 0;
    for (int rep = 0; rep < reps; ++rep) { // alternating which goes first, against drift
        if (rep % 2) one = run_engine(b, o.threads, single, 1);
        beams = run_engine(b, o.threads, req, 1);
        if (rep % 2 == 0) one = run_engine(b, o.threads, single, 1);
        TANDEM_CHECK(int32_t(one.tokens.size()) == o.n_gen && int32_t(beams.tokens.size()) == o.n_gen,
                     "a search ended after {} and {} of {} tokens", one.tokens.size(), beams.tokens.size(), o.n_gen);
        rates_1.push_back(tok_s(one));
        rates_w.push_back(tok_s(beams));
        ratios.push_back(rates_w.back() / rates_1.back());
        peak = std::max(peak, beams.peak_pages);
    }
    const spread r1 = spread_of(rates_1), rw = spread_of(rates_w), ratio = spread_of(ratios);
    const int32_t page = beams.stats.page_size, unshared = W * ((o.n_prompt + o.n_gen + page - 1) / page);
    const int32_t steps = beams.n_decode_tokens / W;
    const nlohmann::json j{{"model", resolve_model(o.model)},
                           {"threads", o.threads},
                           {"n_prompt", o.n_prompt},
                           {"n_gen", o.n_gen},
                           {"width", W},
                           {"runs", reps},
                           {"tok_s_width1", r1.median},
                           {"tok_s_width1_min", r1.min},
                           {"tok_s_width1_max", r1.max},
                           {"tok_s_beam", rw.median},
                           {"tok_s_beam_min", rw.min},
                           {"tok_s_beam_max", rw.max},
                           {"speedup", ratio.median},
                           {"speedup_min", ratio.min},
                           {"speedup_max", ratio.max},
                           {"steps_timed", steps},
                           {"page_size", page},
                           {"peak_pages", peak},
                           {"peak_pages_width1", one.peak_pages},
                           {"unshared_pages", unshared},
                           {"pages_ratio", double(peak) / double(unshared)}};
    if (o.json) {
        std::cout << j.dump() << "\n";
        return 0;
    }
    std::cout << fmt::format("model        {}, {} threads, prompt {} random tokens, {} generated a beam (ignore_eos), "
                             "{} runs of each, interleaved\n",
                             j["model"].get<std::string>(), o.threads, o.n_prompt, o.n_gen, reps);
    std::cout << fmt::format("width 1      decode {:.2f} tok/s ({:.2f}-{:.2f}), beam search of width 1 (greedy's tokens)\n",
                             r1.median, r1.min, r1.max);
    std::cout << fmt::format("width {:<2}     decode {:.2f} tok/s aggregate ({:.2f}-{:.2f}) over {} steps: {:.2f}x width 1 "
                             "({:.2f}-{:.2f})\n",
                             W, rw.median, rw.min, rw.max, steps, ratio.median, ratio.min, ratio.max);
    std::cout << fmt::format("KV pages     peak {} ({}-token pages) for {} beams; {} unshared copies {} ({} x {}): {:.1f}%; "
                             "width 1 peak {}\n",
                             peak, page, W, W, unshared, W, unshared / W, 100.0 * double(peak) / double(unshared),
                             one.peak_pages);
    return 0;
}


// `tandem bench --guided-decode`: decode on the engine under a JSON schema (records in an
// array that never ends within -n tokens, sampled at temperature 1) against the same decode
// unconstrained, at each --batch size, runs interleaved; the schema's mask cache is warmed by
// one run first, as a daemon's is by earlier requests, and that cold run is reported apart.
int cmd_bench_guided(const bench_opts& o) {
    prepare_inference_process();
    model_bundle b = load_model(resolve_model(o.model), o.load);
    const nlohmann::json schema = nlohmann::json::parse(R"({
      "type": "array", "minItems": 10000,
      "items": {"type": "object",
                "properties": {"name": {"type": "string", "maxLength": 24},
                               "age": {"type": "integer", "minimum": 0, "maximum": 130},
                               "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                               "active": {"type": "boolean"}},
                "required": ["name", "age", "tags", "active"]}})");
    auto cache = std::make_shared<grammar::mask_cache>(
        grammar::compile({grammar::constraint::kind::json_schema, schema.dump()}), grammar::vocab_trie::of(*b.tok));
    engine_request plain;
    plain.prompt = b.tok->encode("Records:", true, false);
    plain.max_tokens = o.n_gen;
    plain.sampling.temperature = 1;
    plain.ignore_eos = true;
    engine_request guided = plain;
    guided.ignore_eos = false;
    // The processors time their masks: the share of decode time they take is a bound on the
    // slowdown that does not depend on how noisy the wall times are.
    auto stats = std::make_shared<grammar::guide_stats>();
    guided.make_processor = [cache, stats] { return grammar::make_grammar_processor(cache, stats.get()); };
    const auto tok_s = [](const engine_run& r) { return r.n_decode_tokens / r.decode_seconds; };
    constexpr int reps = 3;
    nlohmann::json j{{"model", resolve_model(o.model)}, {"threads", o.threads}, {"n_gen", o.n_gen}};
    for (const int nb : o.batches) {
        const double cold = tok_s(run_engine(b, o.threads, guided, nb));
        double t_plain = 0, t_guided = 0, guided_s = 0;
        const uint64_t mask_us0 = stats->mask_us.sum_us;
        for (int rep = 0; rep < reps; ++rep) { // alternating which goes first, against drift
            if (rep % 2) t_plain += tok_s(run_engine(b, o.threads, plain, nb)) / reps;
            const engine_run g = run_engine(b, o.threads, guided, nb);
            t_guided += tok_s(g) / reps;
            guided_s += g.seconds;
            if (rep % 2 == 0) t_plain += tok_s(run_engine(b, o.threads, plain, nb)) / reps;
        }
        const double mask_share = double(stats->mask_us.sum_us - mask_us0) * 1e-6 / guided_s;
        j["batch"][std::to_string(nb)] = {{"tok_s_plain", t_plain},
                                          {"tok_s_guided", t_guided},
                                          {"tok_s_guided_cold", cold},
                                          {"ratio", t_guided / t_plain},
                                          {"ratio_cold", cold / t_plain},
                                          {"mask_share", mask_share}};
    }
    if (o.json) {
        std::cout << j.dump() << "\n";
        return 0;
    }
    std::cout << fmt::format("model        {}, {} threads, {} tokens a sequence\n", j["model"].get<std::string>(),
                             o.threads, o.n_gen);
    for (const auto& [nb, r] : j["batch"].items())
        std::cout << fmt::format("batch {:>3}    plain {:.1f} tok/s, JSON schema {:.1f} tok/s: {:.3f}x "
                                 "(first run, masks cold: {:.3f}x); masks take {:.2f}% of the guided runs' time\n",
                                 nb, r["tok_s_plain"].get<double>(), r["tok_s_guided"].get<double>(),
                                 r["ratio"].get<double>(), r["ratio_cold"].get<double>(),
                                 100.0 * r["mask_share"].get<double>());
    return 0;
}

// `tandem bench --speculative K`: what verifying drafts costs (a step that computes k + 1
// tokens of every sequence with logits for all, over a one-token step, k = 1..K, at each batch
// size, measured interleaved) and what prompt lookup gains on the engine (greedy, K drafts):
// a prompt that holds a passage twice (the continuation copies it), and random tokens.
int cmd_bench_speculative(const bench_opts& o) {
    prepare_inference_process();
    model_bundle b = load_model(resolve_model(o.model), o.load);
    model& m = *b.mdl;
    const int32_t n_vocab = m.config().n_vocab, page = 16, n_short = 64, K = o.speculative, reps = 6;
    const host_threads threads(o.threads);
    const exec_ctx ctx = threads.ctx();
    nlohmann::json j{{"model", resolve_model(o.model)}, {"threads", o.threads}, {"verify_cost", nlohmann::json::object()}};
    for (int nb : o.batches) {
        const int32_t n_pos = n_short + K + 1;
        kv_cache kv(m.make_kv_layout(page), nb * ((n_pos + page - 1) / page) + 1);
        block_pool pages(kv.n_pages());
        std::vector<std::unique_ptr<sequence_kv>> seqs;
        std::vector<std::vector<token_id>> toks;
        std::vector<float> logits(size_t(nb) * size_t(K + 1) * size_t(n_vocab));
        for (int i = 0; i < nb; ++i) {
            seqs.push_back(std::make_unique<sequence_kv>(pages, page));
            TANDEM_ASSERT(seqs.back()->reserve(n_pos));
            toks.push_back(random_tokens(n_pos, n_vocab, uint32_t(200 + i)));
            m.forward(ctx, one_sequence(std::span(toks.back()).first(size_t(n_short)), 0, seqs.back()->block_table()), kv,
                      logits.data());
        }
        // Every sequence's last token and k drafts after its prompt, logits for all k + 1.
        auto step = [&](int32_t k) {
            batch s;
            for (int i = 0; i < nb; ++i)
                s.add_seq(uint64_t(i), n_short, std::span(toks[size_t(i)]).subspan(size_t(n_short), size_t(k + 1)),
                          seqs[size_t(i)]->block_table(), {}, n_short);
            return s;
        };
        std::vector<batch> steps;
        for (int32_t k = 0; k <= K; ++k) steps.push_back(step(k));
        // The fastest of the reps of each (the least disturbed by the rest of the machine).
        std::vector<double> t(size_t(K + 1), 1e30);
        for (int rep = 0; rep <= reps; ++rep) // rep 0 warms up
            for (int32_t k = 0; k <= K; ++k) {
                const auto t0 = clock_type::now();
                m.forward(ctx, steps[size_t(k)], kv, logits.data());
                if (rep > 0) t[size_t(k)] = std::min(t[size_t(k)], since(t0));
            }
        nlohmann::json row = nlohmann::json::array();
        for (int32_t k = 1; k <= K; ++k) row.push_back(t[size_t(k)] / t[0]);
        j["verify_cost"][std::to_string(nb)] = row;
        j["step_ms"][std::to_string(nb)] = t[0] * 1e3;
    }
    // On the engine, greedy, decode rates (after the first token) side by side with plain
    // decoding: prompt lookup on a passage twice (the model's continuation may copy it) and on
    // random tokens; the draft model on both (--draft-model); and the upper bound, drafts
    // replayed from the model's own greedy output (every one accepted), at k = 4 and K.
    std::optional<model_bundle> draft;
    if (!o.draft_model.empty()) draft = load_draft_model(o.draft_model, *b.tok, o.load);
    const std::string passage = "Lily had a red ball. She liked to play with it in the park with her friend Tom. "
                                "One day the ball rolled into the pond and Tom helped her get it back. ";
    const std::vector<std::pair<std::string, std::vector<token_id>>> tasks{
        {"copy", b.tok->encode(passage + passage + passage.substr(0, 40), true, false)},
        {"random", random_tokens(int(b.tok->encode(passage, true, false).size()) * 2, n_vocab, 7)}};
    // Each configuration runs three times, interleaved with the plain runs; the speed-up is
    // the median of each run over the plain run beside it.
    const auto decode_tok_s = [](const engine_run& r) { return r.n_decode_tokens / r.decode_seconds; };
    constexpr int engine_reps = 3;
    for (const auto& [name, prompt] : tasks) {
        using run_fn = std::function<engine_run()>;
        std::vector<std::pair<std::string, run_fn>> configs{
            {"prompt_lookup", [&, p = prompt] { return run_greedy(b, o.threads, p, o.n_gen, K); }}};
        if (draft)
            configs.emplace_back("draft_model", [&, p = prompt] {
                return run_greedy(b, o.threads, p, o.n_gen, K, draft_source::model, draft->mdl.get());
            });
        if (name == "random") { // the upper bound: the drafts are what the model will say
            const std::vector<token_id> own = run_greedy(b, o.threads, prompt, o.n_gen, 0).tokens;
            for (const int32_t k : std::set<int32_t>{std::min(4, K), K})
                configs.emplace_back("replay/" + std::to_string(k), [&, p = prompt, own, k] {
                    return run_greedy(b, o.threads, p, o.n_gen, k, draft_source::replay, nullptr, own);
                });
        }
        for (const auto& [config, run] : configs) {
            std::vector<double> ratios;
            engine_run plain, spec;
            for (int rep = 0; rep < engine_reps; ++rep) { // alternating which goes first, against drift
                if (rep % 2) plain = run_greedy(b, o.threads, prompt, o.n_gen, 0);
                spec = run();
                if (rep % 2 == 0) plain = run_greedy(b, o.threads, prompt, o.n_gen, 0);
                ratios.push_back(decode_tok_s(spec) / decode_tok_s(plain));
            }
            const spread speedup = spread_of(ratios);
            const uint64_t drafted = spec.stats.n_draft_tokens, accepted = spec.stats.n_accepted_tokens;
            const auto slash = config.find('/');
            nlohmann::json& at = slash == std::string::npos ? j[config][name] : j[config.substr(0, slash)][config.substr(slash + 1)];
            at = {{"tok_s_plain", decode_tok_s(plain)},
                  {"tok_s_speculative", decode_tok_s(spec)},
                  {"speedup", speedup.median},
                  {"speedup_min", speedup.min},
                  {"speedup_max", speedup.max},
                  {"drafted", drafted},
                  {"accepted", accepted},
                  {"acceptance", drafted ? double(accepted) / double(drafted) : 0.0},
                  {"steps_plain", plain.stats.n_steps},
                  {"steps_speculative", spec.stats.n_steps}};
        }
    }
    if (o.json) {
        std::cout << j.dump() << "\n";
        return 0;
    }
    std::cout << fmt::format("model        {}, {} threads\n", j["model"].get<std::string>(), o.threads);
    for (int nb : o.batches) {
        std::cout << fmt::format("verify cost  batch {:2d} (one-token step {:.1f} ms), k + 1 tokens over 1:", nb,
                                 j["step_ms"][std::to_string(nb)].get<double>());
        int32_t k = 1;
        for (const auto& v : j["verify_cost"][std::to_string(nb)]) std::cout << fmt::format(" k={} {:.2f}x", k++, v.get<double>());
        std::cout << "\n";
    }
    for (const char* kind : {"prompt_lookup", "draft_model", "replay"}) {
        if (!j.contains(kind)) continue;
        for (const auto& [name, r] : j[kind].items())
            std::cout << fmt::format("{:13s}{:6s}: decode {:.1f} -> {:.1f} tok/s ({:.2f}x, {:.2f}-{:.2f}), {} of {} "
                                     "drafts accepted ({:.0f}%), {} -> {} steps\n",
                                     kind == std::string("prompt_lookup") ? "lookup"
                                     : kind == std::string("replay")      ? "upper bound"
                                                                          : "draft model",
                                     kind == std::string("replay") ? "k=" + name : name,
                                     r["tok_s_plain"].get<double>(), r["tok_s_speculative"].get<double>(),
                                     r["speedup"].get<double>(), r["speedup_min"].get<double>(),
                                     r["speedup_max"].get<double>(), r["accepted"].get<uint64_t>(),
                                     r["drafted"].get<uint64_t>(), 100.0 * r["acceptance"].get<double>(),
                                     r["steps_plain"].get<uint64_t>(), r["steps_speculative"].get<uint64_t>());
    }
    return 0;
}

} // namespace

void register_bench(CLI::App& app, registry& reg) {
    auto bo = std::make_shared<bench_opts>();
    auto* bench = app.add_subcommand(
        "bench",
        "load time, prefill and decode speed, roofline, compute peak, memory; with --serve, a running daemon under load");
    bench->add_option("-m,--model", bo->model, "GGUF model (default: $TANDEM_MODEL)");
    bench->add_option("-p,--n-prompt", bo->n_prompt, "prefill tokens")->check(between(1, 1 << 16));
    bench->add_option("-n,--n-gen", bo->n_gen, "decode steps per batch size (with --beams: tokens a beam)")->check(between(1, 1 << 16));
    bench->add_option("-t,--threads", bo->threads, "CPU threads")->check(at_least(1));
    bench->add_option("--batch", bo->batches, "decode batch sizes")->delimiter(',')->check(between(1, 256));
    add_precision_flags(bench, bo->load);
    bench->add_flag("--no-raw", bo->no_raw, "skip the oneDNN raw matmul measurement");
    bench->add_flag("--json", bo->json, "print one JSON object");
    bench->add_option("--speculative", bo->speculative,
                      "speculative decoding instead: the cost of verifying k = 1..K drafts in one step; prompt "
                      "lookup with K drafts on the engine (-n tokens, greedy), and its upper bound (replayed drafts)")
        ->check(between(1, 16));
    bench->add_option("--draft-model", bo->draft_model, "with --speculative: also draft from this model")
        ->check(existing_file())
        ->needs("--speculative");
    auto* beams = bench->add_option("--beams", bo->beams,
                                    "beam search instead: width W against width 1 on one prompt of -p random tokens, "
                                    "-n tokens a beam; aggregate decode rates and the peak of KV pages in use")
                      ->check(between(1, 64));
    bench->add_flag("--guided-decode", bo->guided,
                    "guided generation instead: decode on the engine under a JSON schema vs unconstrained, side by "
                    "side at each --batch size (-n tokens a sequence, temperature 1)");
    const bench_mode serve = add_bench_serve(bench, bo->json);
    const bench_mode guided = add_bench_grammar(bench, bo->model, bo->json);
    for (const char* other : {"--batch", "--no-raw", "--speculative", "--guided-decode"}) beams->excludes(other);
    beams->excludes(serve.flag)->excludes(guided.flag);
    reg.push_back({bench, [bo, serve, guided] {
                       if (serve.flag->count()) return serve.run();
                       if (guided.flag->count()) return guided.run();
                       if (bo->guided) return cmd_bench_guided(*bo);
                       if (bo->beams > 0) return cmd_bench_beams(*bo);
                   return bo->speculative > 0 ? cmd_bench_speculative(*bo) : cmd_bench(*bo);
                   }});
}

} // namespace tandem::cli
