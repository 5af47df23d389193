// Mixed precision's storage and compute types: which dtype each kind of data is kept in for a precision mode, the same
// for training and for predict/evaluate (docs/mixed-precision.md has the table per operation). Arithmetic is fp32
// whatever the storage: products and convolutions accumulate in fp32, norms, softmax, losses and the optimizer run in
// fp32, and 16-bit results are rounded once.
#pragma once

#include <string_view>

#include "hpctrain/config/choices.hpp"
#include "hpctrain/core/dtype.hpp"

namespace hpctrain {

struct PrecisionPolicy {
  PrecisionMode mode = PrecisionMode::fp32;
  DType activations = DType::f32;  // activations, their gradients and the parameters' working copy the products read
  DType master = DType::f32;       // parameters, gradients and optimizer state

  // fp32: everything fp32; bf16 / fp16: 16-bit activations and working weights over fp32 master state.
  static PrecisionPolicy of(PrecisionMode mode);
  [[nodiscard]] bool mixed() const { return activations != master; }
  [[nodiscard]] std::string_view name() const { return word_of(mode); }
};

}  // namespace hpctrain
