// The draft model (runtime/draft_model.hpp).
#include "runtime/draft_model.hpp"

#include "runtime/engine.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/model.hpp"
#include "runtime/runner.hpp"
#include "runtime/scheduler.hpp"

#include <algorithm>
#include <chrono>

namespace tandem {

namespace {

// The draft's sampler: the request's temperature and filters (penalties and biases stay with
// the target, whose verification sees them), and its own stream of the request's seed.
sampling_params draft_sampling(const sampling_params& p) {
    sampling_params d;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    if (p.seed) d.seed = *p.seed ^ 0x5deece66dull;
    return d;
}

} // namespace

struct draft_model::seq_state {
    sampler smp;
    explicit seq_state(const sampling_params& p) : smp(draft_sampling(p)) {}
};

draft_model::draft_model(model& mdl, int n_threads, int32_t page_size, int32_t n_pages, int32_t max_seqs)
    : n_vocab_(mdl.config().n_vocab) {
    kv_ = std::make_unique<kv_cache>(mdl.make_kv_layout(page_size), n_pages);
    store_ = make_local_store(*kv_);
    scheduler_options so;
    so.page_size = page_size;
    so.n_pages = n_pages;
    so.max_running = max_seqs;
    so.step_tokens = std::max(512, max_seqs + 1);
    so.decode_tokens = 1;
    so.kv_window = mdl.config().kv_window();
    sched_ = std::make_unique<scheduler>(so, store_.get());
    runner_ = make_cpu_runner(mdl, std::max(1, n_threads));
}

draft_model::~draft_model() = default;

std::string draft_model::device() const { return runner_->device(); }

void draft_model::forget(uint64_t id) {
    if (sched_->contains(id)) sched_->remove(id);
    seqs_.erase(id);
}

// The draft sequence holds the job's tokens, computed as far as they agree with what it
// computed before (a new one waits to be admitted).
void draft_model::sync(const draft_job& job) {
    if (!sched_->contains(job.id)) {
        sched_->add(job.id, {job.tokens.begin(), job.tokens.end()}, 0, std::chrono::steady_clock::now());
        seqs_.emplace(job.id, std::make_unique<seq_state>(*job.sampling));
        return;
    }
    const auto have = sched_->tokens(job.id);
    const size_t common = size_t(std::mismatch(have.begin(), have.end(), job.tokens.begin(), job.tokens.end()).first -
                                 have.begin());
    if (common == 0) { // nothing in common (cannot happen for one sequence): start over
        forget(job.id);
        sync(job);
        return;
    }
    if (common < have.size()) sched_->truncate(job.id, int32_t(common));
    if (common < job.tokens.size()) sched_->append(job.id, job.tokens.subspan(common));
}

void draft_model::propose(std::span<draft_job> jobs) {
    std::unordered_map<uint64_t, draft_job*> by_id;
    for (draft_job& j : jobs) {
        j.drafts.clear();
        j.q.clear();
        if (j.k <= 0 || j.tokens.empty()) continue;
        sync(j);
        by_id.emplace(j.id, &j);
    }
    sched_->admit(std::chrono::steady_clock::now());
    (void)sched_->take_admitted();
    // Each forward computes every pending token of every job's sequence (a catch-up, then one
    // draft each); a job is done once it has its k drafts.
    for (;;) {
        const batch& b = sched_->plan(0, work_kind::both);
        (void)sched_->take_preempted(); // a preempted sequence drafts less this time
        if (b.empty()) break;
        logits_.resize(size_t(b.n_logits()) * size_t(n_vocab_));
        bool ok = true;
        try {
            runner_->forward(b, *kv_, logits_.data());
        } catch (const std::exception&) {
            ok = false; // no drafts this step; the engine goes on without them
        }
        const std::vector<uint64_t> due = sched_->complete(0, ok);
        if (!ok) break;
        std::unordered_map<uint64_t, int32_t> last_row;
        for (int32_t i = 0; i < b.n_seqs(); ++i) last_row[b.seq_id[size_t(i)]] = b.logits_begin[size_t(i) + 1] - 1;
        for (uint64_t id : due) {
            auto it = by_id.find(id);
            if (it == by_id.end()) continue;
            draft_job& j = *it->second;
            seq_state& s = *seqs_.at(id);
            const float* row = logits_.data() + size_t(last_row.at(id)) * size_t(n_vocab_);
            row_.assign(row, row + n_vocab_);
            const bool greedy = !(j.sampling->temperature > 0.0f);
            token_id d = sampler::none;
            if (greedy) {
                d = s.smp.sample(row_, {});
            } else {
                const size_t at = j.q.size();
                j.q.resize(at + size_t(n_vocab_));
                const std::span<float> q(j.q.data() + at, size_t(n_vocab_));
                if (s.smp.distribution(row_, {}, q)) d = s.smp.draw(q);
                if (d == sampler::none) j.q.resize(at);
            }
            if (d == sampler::none) continue;
            j.drafts.push_back(d);
            if (int32_t(j.drafts.size()) < j.k) sched_->append(id, d);
        }
    }
}

std::string draft_vocab_mismatch(const tokenizer& target, const tokenizer& draft) {
    if (target.n_vocab() != draft.n_vocab())
        return fmt::format("its vocabulary has {} tokens, the model's {}", draft.n_vocab(), target.n_vocab());
    for (token_id t = 0; t < target.n_vocab(); ++t)
        if (target.token_text(t) != draft.token_text(t))
            return fmt::format("token {} is '{}' in the model, '{}' in the draft model", t, target.token_text(t),
                               draft.token_text(t));
    return {};
}

} // namespace tandem
