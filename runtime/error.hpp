// Error tiers: TANDEM_ASSERT for invariants, tandem::error for failures with context.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tandem {

// Thrown for failures a caller can report: a corrupt file, a failed backend call.
// Expected outcomes (pool full, bad request) are values, never exceptions.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw error(fmt::format(f, std::forward<Args>(args)...));
}

} // namespace tandem

// Invariant of the program itself: a failure is a bug, so it aborts with a message.
#define TANDEM_ASSERT(cond, ...)                                                               \
    do {                                                                                       \
        if (!(cond)) [[unlikely]]                                                              \
            ::tandem::assert_fail(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__));   \
    } while (0)

// A checked condition on input: a failure throws tandem::error with the formatted message.
#define TANDEM_CHECK(cond, ...)                                                                \
    do {                                                                                       \
        if (!(cond)) [[unlikely]]                                                              \
            throw ::tandem::error(::fmt::format(__VA_ARGS__));                                 \
    } while (0)
