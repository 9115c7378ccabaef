// Fills runtime/ops' CUDA slots with cuda/'s kernels (runtime/ops/op_defs.hpp).
#pragma once

namespace tandem::cuda {

// Idempotent and thread-safe; every context's constructor calls it, so an exec_ctx holding a
// context always finds the slots filled.
void register_ops();

} // namespace tandem::cuda
