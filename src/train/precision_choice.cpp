// precision.* of the deck -> the activation dtype and the loss scaler.
#include "hpctrain/train/precision_choice.hpp"

namespace hpctrain {

DType activation_dtype_of(const std::string& mode) {
  if (mode == "bf16") return DType::bf16;
  if (mode == "fp16") return DType::f16;
  return DType::f32;
}

LossScalerConfig scaler_config_of(const PrecisionSection& precision, float* initial_scale) {
  LossScalerConfig config;
  config.growth_factor = static_cast<float>(precision.growth_factor);
  config.backoff_factor = static_cast<float>(precision.backoff_factor);
  config.growth_interval = static_cast<std::int32_t>(precision.growth_interval);
  *initial_scale = 1.0f;
  const std::string& mode = precision.loss_scale;
  if (mode == "dynamic" || (mode == "auto" && precision.mode == "fp16")) {
    config.enabled = true;
    config.dynamic = true;
    *initial_scale = static_cast<float>(precision.init_scale);
  } else if (mode != "none" && mode != "auto") {
    config.enabled = true;
    config.dynamic = false;
    *initial_scale = std::stof(mode);
  }
  return config;
}

}  // namespace hpctrain
