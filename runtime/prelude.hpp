// Included before any Boost.Asio header: Boost 1.74's awaitable.hpp uses std::exchange
// without including <utility>, which GCC 12 rejects in C++20 coroutine code.
#pragma once

#include <utility>
