// precision.* of the deck -> the activation dtype and the loss scaler, for training and for predict/evaluate.
#pragma once

#include <string>

#include "hpctrain/config/run_config.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain {

// precision.mode: "bf16" and "fp16" store activations in 16 bits, anything else in fp32.
DType activation_dtype_of(const std::string& mode);

// precision.loss_scale ("auto": dynamic for fp16, none otherwise) -> the scaler's settings and its first scale.
LossScalerConfig scaler_config_of(const PrecisionSection& precision, float* initial_scale);

}  // namespace hpctrain
