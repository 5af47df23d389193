// Which activation the CUDA backend folds into the forward product of the linear layer before it (issue 15, item 9),
// as a pure function (host-only, tested on the CPU in tests/unit/cuda_host_logic_test.cpp).
//
// A folded activation means the pre-activation is never written: the model then runs the activation's backward on its
// output. That is exact for relu only (output > 0 exactly where input > 0, NaN and -0 included), so relu is the one
// folded (cuBLASLt's RELU_BIAS, or RELU without a bias). GELU is not folded: cuBLASLt's GELU epilogues compute the tanh
// approximation, and the decks' default gelu is the exact erf form (PyTorch's default); folding it would change
// results. The tanh form (gelu with approximate = "tanh") matches cuBLASLt's but is not folded either: its backward
// needs the pre-activation, which only the GELU_AUX epilogues write (a possible later fusion). tanh and leaky_relu have
// no epilogue. The backward epilogues (DRELU/DGELU with an aux mask or pre-activation) are not used: the relu backward
// stays its own kernel, reading the output.
#pragma once

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

enum class LinearEpilogue : std::uint8_t { none, relu, relu_bias };

// The epilogue for linear (bias or not) followed by `kind`; none: keep the two operations apart.
constexpr LinearEpilogue linear_epilogue(Activation kind, bool has_bias) {
  if (kind != Activation::relu) return LinearEpilogue::none;
  return has_bias ? LinearEpilogue::relu_bias : LinearEpilogue::relu;
}

}  // namespace hpctrain::cuda
