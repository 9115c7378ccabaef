// Stand-in for the CUDA toolkit's cuda_fp16.h in the emulated build (see cuda_emu.hpp): __half
// and its conversions are there.
#pragma once

#include "cuda_emu.hpp"
