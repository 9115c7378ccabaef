// The in-process engine: an executor that runs each batch on the engine thread through a
// runner, over a private page pool (runtime/engine.hpp make_local_engine).
#include "runtime/engine.hpp"

#include "runtime/kv_cache.hpp"
#include "runtime/model.hpp"
#include "runtime/runner.hpp"

#include <cstring>

namespace tandem {
namespace {

// The in-process executor: runs each batch on the engine thread through a runner.
class inproc_executor final : public executor {
public:
    inproc_executor(std::unique_ptr<runner> r, kv_cache& kv, int32_t n_vocab)
        : runner_(std::move(r)), kv_(kv), n_vocab_(n_vocab) {}
    std::string name() const override { return "in-process " + runner_->device(); }
    work_kind kind() const override { return work_kind::both; }
    bool ready() override { return !result_; }
    void start(const batch& b) override {
        logits_.resize(size_t(b.n_logits()) * size_t(n_vocab_));
        result_ = outcome{};
        try {
            runner_->forward(b, kv_, logits_.data());
        } catch (const std::exception& e) { // a failed step ends its batch, not the daemon
            result_ = outcome{false, false, e.what()};
        }
    }
    std::optional<outcome> poll() override {
        auto r = result_;
        result_.reset();
        return r;
    }
    std::span<const float> logits(int32_t row) override {
        return std::span<const float>(logits_).subspan(size_t(row) * size_t(n_vocab_), size_t(n_vocab_));
    }
    std::vector<int> wait_fds() override { return {}; }

private:
    std::unique_ptr<runner> runner_;
    kv_cache& kv_;
    int32_t n_vocab_;
    std::vector<float> logits_;                           // [n_logits, n_vocab]
    std::optional<outcome> result_;
};

// Pages of a private kv_cache: copy-on-write is a memcpy, nothing is persisted.
class local_store final : public page_store {
public:
    explicit local_store(kv_cache& kv) : kv_(kv) {}
    void published(int32_t, uint64_t, uint64_t, std::span<const int32_t>) override {}
    void cleared(int32_t) override {}
    void copy_page(int32_t src, int32_t dst) override {
        const int64_t pb = kv_.layout().page_bytes();
        std::memcpy(kv_.base() + dst * pb, kv_.base() + src * pb, size_t(pb));
    }

private:
    kv_cache& kv_;
};

} // namespace

std::unique_ptr<page_store> make_local_store(kv_cache& kv) { return std::make_unique<local_store>(kv); }

namespace {

// The local engine owns its page pool, store and runner alongside the engine.
class local_engine final : public engine {
public:
    local_engine(model& mdl, const tokenizer& tok, const engine_options& opts, std::unique_ptr<runner> r) {
        const auto& c = mdl.config();
        const engine_options o = resolve_options(opts, c);
        kv_ = std::make_unique<kv_cache>(mdl.make_kv_layout(o.sched.page_size), o.sched.n_pages);
        store_ = make_local_store(*kv_);
        r->prepare(o.sched.step_tokens, o.sched.max_logits); // a resident engine's memory stops growing once it is up
        engine_parts parts;
        parts.executors.push_back(std::make_unique<inproc_executor>(std::move(r), *kv_, c.n_vocab));
        parts.store = store_.get();
        impl_ = make_engine(c, tok, o, std::move(parts));
    }
    ~local_engine() override { impl_.reset(); }
    submit_result submit(engine_request req, engine_sink sink) override { return impl_->submit(std::move(req), std::move(sink)); }
    void cancel(uint64_t id) override { impl_->cancel(id); }
    engine_stats stats() const override { return impl_->stats(); }
    void stop() override { impl_->stop(); }

private:
    std::unique_ptr<kv_cache> kv_;
    std::unique_ptr<page_store> store_;
    std::unique_ptr<engine> impl_;
};

} // namespace

std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts) {
    return make_local_engine(mdl, tok, opts, make_cpu_runner(mdl, std::max(1, opts.n_threads)));
}

std::unique_ptr<engine> make_local_engine(model& mdl, const tokenizer& tok, const engine_options& opts,
                                          std::unique_ptr<runner> r) {
    return std::make_unique<local_engine>(mdl, tok, opts, std::move(r));
}

} // namespace tandem
