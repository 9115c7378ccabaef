// Included before any Boost.Asio header: Boost 1.74's awaitable.hpp uses std::exchange
// without including <utility>, which GCC 12 rejects in C++20 coroutine code; and clang
// needs co_await support switched on by hand.
#pragma once

#include <utility>

// Boost 1.74 enables co_await on clang only with <experimental/coroutine> (libc++); clang 14
// with libstdc++ 12 has C++20 <coroutine>, which Asio's std-coroutine path already uses.
#if defined(__clang__) && !defined(BOOST_ASIO_HAS_CO_AWAIT) && defined(__cpp_impl_coroutine) && \
    __has_include(<coroutine>)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#endif
