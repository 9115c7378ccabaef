// The int8 peak loops (cpu/peak): the operations each claims are the multiply-adds the hardware
// did (the accumulators' sum is macs * a * b), at every level this CPU runs; the timed run on
// every thread counts what it ran.
#include "cpu/peak.hpp"
#include "cpu/thread_pool.hpp"

#include <doctest/doctest.h>

#include <cstdint>

using namespace tandem::cpu;

TEST_CASE("int8 peak loops: the counted operations are the multiply-adds done, at every level this CPU runs") {
    CHECK(peak_macs_per_iteration(isa::scalar) == 0);
    for (isa level : {isa::avx2, isa::avx512, isa::amx}) {
        CAPTURE(name_of(level));
        if (level > detect_isa()) {
            MESSAGE("skipped: this CPU has no " << name_of(level) << " (its loop only compiles here)");
            continue;
        }
        CHECK(peak_macs_per_iteration(level) > 0);
        struct operands {
            uint8_t a;
            int8_t b;
        };
        for (const operands op : {operands{1, 1}, operands{3, -2}, operands{200, 5}, operands{17, -128}}) {
            for (int64_t n_iter : {0, 1, 7, 1000}) {
                CAPTURE(int(op.a));
                CAPTURE(int(op.b));
                CAPTURE(n_iter);
                const int8_peak r = run_int8_peak(level, n_iter, op.a, op.b);
                const int64_t macs = n_iter * peak_macs_per_iteration(level);
                CHECK(r.ops == doctest::Approx(2.0 * double(macs)));
                CHECK(r.checksum == macs * int64_t(op.a) * int64_t(op.b));
                CHECK(r.seconds >= 0);
            }
        }
    }
}

TEST_CASE("int8 peak measured on every thread: the rounds all threads ran, over the wall time") {
    const isa level = detect_isa();
    if (level == isa::scalar) {
        MESSAGE("skipped: no SIMD level, no peak loop");
        return;
    }
    thread_pool pool(2);
    const int8_peak r = measure_int8_peak(pool, level, 0.05);
    CHECK(r.level == level);
    CHECK(r.seconds >= 0.05);
    CHECK(r.ops > 0);
    // whole rounds of each thread: a multiple of one round's operations
    const double round = 2.0 * double(level == isa::amx ? 4096 : 1 << 16) * double(peak_macs_per_iteration(level));
    const double rounds = r.ops / round;
    CHECK(rounds == doctest::Approx(double(int64_t(rounds + 0.5))));
    CHECK(rounds >= 2); // both threads ran at least one
    CHECK(r.tops() > 0);
}
