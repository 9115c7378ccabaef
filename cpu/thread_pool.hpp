// A fixed pool of worker threads that run one parallel loop at a time (fork-join).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::cpu {

// Workers spin briefly on a generation counter before sleeping on it (C++20 atomic wait), so
// the many small loops of a decode step cost no system call each while the step is running.
class thread_pool {
public:
    // n_threads counts the calling thread, which takes part in every loop.
    explicit thread_pool(int n_threads);
    ~thread_pool();
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    int n_threads() const { return n_threads_; }

    // Work below about this many multiply-adds runs on one thread: waking a thread and
    // joining it costs more than a few microseconds of arithmetic.
    static constexpr int64_t min_parallel_work = 1 << 15;

    // A grain (items per chunk) of at least `grain` that gives each chunk enough work,
    // for items of `work_per_item` multiply-adds each.
    static int64_t grain_for(int64_t work_per_item, int64_t grain = 1) {
        const int64_t g = min_parallel_work / (work_per_item > 0 ? work_per_item : 1);
        return g > grain ? (g + grain - 1) / grain * grain : grain;
    }

    // Calls fn(begin, end) over [0, n) split into one contiguous range per thread, each
    // range a multiple of `grain` (but the last); returns when all are done.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

    // Calls fn(begin, end) over [0, n) in chunks of `chunk` items handed out one at a time to
    // whichever thread is free: on shared cores a thread that loses its core for a while
    // does fewer chunks instead of holding up the join.
    void parallel_for_dynamic(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn);

    // Calls fn(ith, nth) once on each of the nth threads. An exception thrown by fn on any
    // thread (an allocation failing inside a parallel region) waits for the other threads to
    // finish their part, then leaves run() on the calling thread: the first one thrown, the
    // others dropped. The pool stays usable.
    void run(const std::function<void(int, int)>& fn);

private:
    void worker(int ith);
    void keep_error(std::exception_ptr e);

    int n_threads_;
    std::vector<std::thread> threads_;
    const std::function<void(int, int)>* job_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> n_pending_{0};
    std::atomic<bool> stop_{false};
    std::mutex error_mutex_;
    std::exception_ptr error_; // the first exception of the current run
};

} // namespace tandem::cpu
