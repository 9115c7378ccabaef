// <immintrin.h> for the CPU kernels, with GCC 12's false warnings about it turned off: it flags
// the _mm512_undefined_* sources inside its own intrinsics as uninitialized (the pragmas hold for
// the rest of the including file).
#pragma once

#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
