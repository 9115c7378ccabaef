// Fork-join thread pool.
#include "cpu/thread_pool.hpp"

#include "runtime/error.hpp"

#include <algorithm>

namespace tandem::cpu {

thread_pool::thread_pool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

thread_pool::~thread_pool() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
}

void thread_pool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int, int)>* job;
        {
            std::unique_lock lock(mutex_);
            start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
        }
        (*job)(ith, n_threads_);
        {
            std::lock_guard lock(mutex_);
            if (--n_pending_ == 0) done_cv_.notify_one();
        }
    }
}

void thread_pool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    {
        std::lock_guard lock(mutex_);
        TANDEM_ASSERT(job_ == nullptr, "thread_pool::run is not reentrant");
        job_ = &fn;
        n_pending_ = n_threads_ - 1;
        ++generation_;
    }
    start_cv_.notify_all();
    fn(0, n_threads_);
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return n_pending_ == 0; });
    job_ = nullptr;
}

void thread_pool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    const int64_t n_chunks = (n + grain - 1) / grain;
    if (n_threads_ == 1 || n_chunks == 1) {
        fn(0, n);
        return;
    }
    run([&](int ith, int nth) {
        const int64_t per = (n_chunks + nth - 1) / nth;
        const int64_t b = std::min(n, ith * per * grain);
        const int64_t e = std::min(n, (ith + 1) * per * grain);
        if (b < e) fn(b, e);
    });
}

} // namespace tandem::cpu
