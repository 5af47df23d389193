// Precision mode -> storage types.
#include "hpctrain/precision/policy.hpp"

namespace hpctrain {

PrecisionPolicy PrecisionPolicy::of(PrecisionMode mode) {
  PrecisionPolicy policy;
  policy.mode = mode;
  switch (mode) {
    case PrecisionMode::fp32:
      policy.activations = DType::f32;
      break;
    case PrecisionMode::bf16:
      policy.activations = DType::bf16;
      break;
    case PrecisionMode::fp16:
      policy.activations = DType::f16;
      break;
  }
  return policy;
}

}  // namespace hpctrain
