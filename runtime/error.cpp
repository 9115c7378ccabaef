// Assertion failure reporting.
#include "runtime/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace tandem {

void assert_fail(const char* expr, const char* file, int line, const std::string& msg) {
    std::fprintf(stderr, "tandem: assertion failed: %s at %s:%d%s%s\n", expr, file, line,
                 msg.empty() ? "" : ": ", msg.c_str());
    std::fflush(stderr);
    std::abort();
}

} // namespace tandem
