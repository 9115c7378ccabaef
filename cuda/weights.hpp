// Device copies of a model's weights (above the engine: it reads model_weights).
#pragma once

#include "cuda/weight.hpp"
#include "runtime/weights.hpp"

#include <vector>

namespace tandem::cuda {

// A layer's weights in the order of layer_weight_fields.
using device_layer = std::vector<device_weight>;

// Every weight of a model on one device.
struct device_model_weights {
    device_weight tok_embd, output_norm, output, rope_freqs;
    std::vector<device_layer> layers;

    device_model_weights(const context& ctx, const model_weights& w);
    size_t bytes() const; // device memory they occupy
    // Every weight as its device view (device_weight::view()), for model::forward on backend::cuda.
    const model_weights& view() const { return view_; }

private:
    model_weights view_;
};

} // namespace tandem::cuda
