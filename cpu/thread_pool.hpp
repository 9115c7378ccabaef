// A fixed pool of worker threads that run one parallel loop at a time (fork-join).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem::cpu {

class thread_pool {
public:
    // n_threads counts the calling thread, which takes part in every loop.
    explicit thread_pool(int n_threads);
    ~thread_pool();
    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    int n_threads() const { return n_threads_; }

    // Calls fn(begin, end) over [0, n) split into one contiguous range per thread, each
    // range a multiple of `grain` (but the last); returns when all are done.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

    // Calls fn(ith, nth) once on each of the nth threads.
    void run(const std::function<void(int, int)>& fn);

private:
    void worker(int ith);

    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable start_cv_, done_cv_;
    const std::function<void(int, int)>* job_ = nullptr;
    uint64_t generation_ = 0;
    int n_pending_ = 0;
    bool stop_ = false;
};

} // namespace tandem::cpu
