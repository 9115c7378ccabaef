// One weight: reading a row back as F32.
#include "runtime/weight.hpp"

#include <cstring>

namespace tandem {

void weight::row_f32(int64_t i, float* out) const {
    if (!is_i8()) {
        std::memcpy(out, row(i), size_t(n_in) * sizeof(float));
        return;
    }
    // w = scale * q, as quant/int8's dequantize (a layer above this one) has it.
    const int8_t* qi = q() + i * n_in;
    const float s = scale()[i];
    for (int64_t k = 0; k < n_in; ++k) out[k] = s * float(qi[k]);
}

} // namespace tandem
