// TANDEM_ISA: the level each value picks on each CPU level; a typo gets the default, never more.
#include "cpu/isa.hpp"

#include <doctest/doctest.h>

using tandem::cpu::isa;
using tandem::cpu::isa_from_env;

TEST_CASE("TANDEM_ISA unset or empty: the detected level, AMX included") {
    CHECK(isa_from_env("", isa::scalar) == isa::scalar);
    CHECK(isa_from_env("", isa::avx2) == isa::avx2);
    CHECK(isa_from_env("", isa::avx512) == isa::avx512);
    CHECK(isa_from_env("", isa::amx) == isa::amx);
}

TEST_CASE("TANDEM_ISA known values: that level, never above the CPU's") {
    CHECK(isa_from_env("scalar", isa::amx) == isa::scalar);
    CHECK(isa_from_env("avx2", isa::amx) == isa::avx2);
    CHECK(isa_from_env("avx512", isa::amx) == isa::avx512);
    CHECK(isa_from_env("amx", isa::amx) == isa::amx);
    CHECK(isa_from_env("amx", isa::avx512) == isa::avx512);
    CHECK(isa_from_env("avx512", isa::avx2) == isa::avx2);
    bool unknown = true;
    CHECK(isa_from_env("avx2", isa::amx, &unknown) == isa::avx2);
    CHECK_FALSE(unknown);
}

TEST_CASE("TANDEM_ISA unknown values fall back to the default and say so") {
    for (const char* v : {"AVX512", "bogus", "amx ", "Scalar", "avx-512"}) {
        CAPTURE(v);
        for (isa hw : {isa::scalar, isa::avx2, isa::avx512, isa::amx}) {
            bool unknown = false;
            CHECK(isa_from_env(v, hw, &unknown) == isa_from_env("", hw));
            CHECK(unknown);
        }
    }
}
