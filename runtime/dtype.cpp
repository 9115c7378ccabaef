// Element type traits and GGML type names.
#include "runtime/dtype.hpp"

namespace tandem {

std::optional<dtype_traits> traits_of(uint32_t t) {
    switch (dtype(t)) {
    case dtype::f32: return dtype_traits{1, 4};
    case dtype::f16: return dtype_traits{1, 2};
    case dtype::bf16: return dtype_traits{1, 2};
    case dtype::q4_0: return dtype_traits{32, 18};
    case dtype::q4_1: return dtype_traits{32, 20};
    case dtype::q5_0: return dtype_traits{32, 22};
    case dtype::q5_1: return dtype_traits{32, 24};
    case dtype::q8_0: return dtype_traits{q8_0_block, q8_0_block_bytes};
    case dtype::q2_k: return dtype_traits{256, 84};
    case dtype::q3_k: return dtype_traits{256, 110};
    case dtype::q4_k: return dtype_traits{256, 144};
    case dtype::q5_k: return dtype_traits{256, 176};
    case dtype::q6_k: return dtype_traits{256, 210};
    case dtype::iq4_nl: return dtype_traits{32, 18};
    case dtype::iq4_xs: return dtype_traits{256, 136};
    case dtype::i8: return dtype_traits{1, 1};
    }
    return std::nullopt;
}

std::string_view ggml_type_name(uint32_t t) {
    static constexpr std::string_view names[] = {
        "F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0",    "Q5_1",    "Q8_0",    "Q8_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S",
        "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32",  "I64",     "F64",     "IQ1_M",
        "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
    };
    if (t < std::size(names)) return names[t];
    return "unknown";
}

} // namespace tandem
