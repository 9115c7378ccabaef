// Fork-join thread pool with spin-then-wait workers.
#include "cpu/thread_pool.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem::cpu {
namespace {

// Spinning bridges the gap between two ops of a step, but a spinning worker holds a core that
// oneDNN's OpenMP threads (between our ops) or the other process's workers may need, so it is
// bounded in time, not in pauses: a pause costs ~10 cycles on some cores and ~140 on others
// (16384 of them took 207 us on this machine's Xeon).
constexpr auto spin_limit = std::chrono::microseconds(20);
constexpr int pauses_per_clock_read = 16;

inline void cpu_relax() {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

template <class T>
void spin_then_wait(const std::atomic<T>& a, T old) {
    const auto until = std::chrono::steady_clock::now() + spin_limit;
    do {
        for (int i = 0; i < pauses_per_clock_read; ++i) {
            if (a.load(std::memory_order_acquire) != old) return;
            cpu_relax();
        }
    } while (std::chrono::steady_clock::now() < until);
    while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
}

} // namespace

thread_pool::thread_pool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

thread_pool::~thread_pool() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (auto& t : threads_) t.join();
}

void thread_pool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        spin_then_wait(generation_, seen);
        seen = generation_.load(std::memory_order_acquire);
        if (stop_.load(std::memory_order_acquire)) return;
        try {
            (*job_)(ith, n_threads_);
        } catch (...) {
            keep_error(std::current_exception());
        }
        if (n_pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) n_pending_.notify_one();
    }
}

void thread_pool::keep_error(std::exception_ptr e) {
    const std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::move(e);
}

void thread_pool::run(const std::function<void(int, int)>& fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    TANDEM_ASSERT(job_ == nullptr, "thread_pool::run is not reentrant");
    job_ = &fn;
    n_pending_.store(n_threads_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel); // publishes job_
    generation_.notify_all();
    try {
        fn(0, n_threads_);
    } catch (...) {
        keep_error(std::current_exception());
    }
    // The other threads still read job_ (and fn's captures) until they are done.
    for (int left; (left = n_pending_.load(std::memory_order_acquire)) != 0;) spin_then_wait(n_pending_, left);
    job_ = nullptr;
    std::exception_ptr e;
    {
        const std::lock_guard lock(error_mutex_);
        e = std::exchange(error_, nullptr);
    }
    if (e) std::rethrow_exception(e);
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

void thread_pool::parallel_for_dynamic(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    chunk = std::max<int64_t>(1, chunk);
    const int64_t n_chunks = (n + chunk - 1) / chunk;
    if (n_threads_ == 1 || n_chunks == 1) {
        fn(0, n);
        return;
    }
    std::atomic<int64_t> next{0};
    run([&](int, int) {
        for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < n_chunks;)
            fn(c * chunk, std::min(n, (c + 1) * chunk));
    });
}

} // namespace tandem::cpu
