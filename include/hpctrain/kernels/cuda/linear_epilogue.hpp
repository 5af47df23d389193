// Which activation the CUDA backend folds into the products of the linear layers around it (issue 15, item 9), as
// pure functions (host-only, tested on the CPU in tests/unit/cuda_host_logic_test.cpp).
//
// Forward: linear (bias or not) then relu or gelu(approximate = "tanh") in one product, cuBLASLt's RELU[_AUX][_BIAS] /
// GELU_AUX[_BIAS] epilogues. cuBLASLt's GELU is the tanh form, so the decks' default gelu (the exact erf form,
// PyTorch's default) is never folded: folding it would change results. tanh and leaky_relu have no epilogue.
// Backward: the activation's derivative multiplied into the next linear layer's input-gradient product (DRELU /
// DGELU), reading the "aux" matrix the forward epilogue wrote into the pre-activation's buffer:
// - relu: a bit mask, one bit per pre-activation (1 where it is > 0), column-major as cuBLASLt's output, i.e. per
//   row of ours `aux_ld` bits with aux_ld a multiple of 128 (cuBLASLt's rule) >= the layer's width. It is written
//   only when a row of bits fits in a row of the pre-activation buffer (width >= 8 for 16-bit, >= 4 for fp32);
//   otherwise RELU[_BIAS] without a mask and relu's backward on its output (exact: output > 0 where input > 0).
// - gelu(tanh): the pre-activation itself in the output's dtype (the buffer the model's unfused backward reads too),
//   leading dimension = the width, which cuBLASLt wants a multiple of 8; other widths compose the two operations.
// The bias gradient is not taken from DRELU_BGRAD / DGELU_BGRAD: that vector has the input gradient's dtype (bf16 on
// 16-bit models, where the CPU sums in fp32) and is overwritten (no accumulation); the weight-gradient product of the
// layer before already carries it in fp32 (BGRADB).
#pragma once

#include <cstddef>
#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

enum class LinearEpilogue : std::uint8_t {
  none,  // keep the two operations apart
  relu,
  relu_bias,
  relu_aux,  // relu with its bit mask written
  relu_aux_bias,
  gelu_aux,  // gelu(tanh) with its input written
  gelu_aux_bias,
};
enum class ActivationGradientEpilogue : std::uint8_t { none, drelu, dgelu };

// The forward epilogue for linear (bias or not, `width` outputs of `element_bytes` each) followed by `kind`, and the
// layout of what it writes into the pre-activation buffer.
struct EpilogueChoice {
  LinearEpilogue epilogue = LinearEpilogue::none;
  std::int64_t aux_ld = 0;            // aux leading dimension: bits for relu's mask, elements for gelu; 0: no aux
  std::size_t aux_bytes_per_row = 0;  // bytes of aux per row of ours (<= width * element_bytes)
};

constexpr std::int64_t relu_mask_ld(std::int64_t width) { return (width + 127) / 128 * 128; }

constexpr EpilogueChoice linear_epilogue(Activation kind, bool has_bias, std::int64_t width,
                                         std::size_t element_bytes) {
  if (width <= 0) return {};
  const auto row_bytes = static_cast<std::size_t>(width) * element_bytes;
  if (kind == Activation::relu) {
    const std::int64_t ld = relu_mask_ld(width);
    const auto mask_bytes = static_cast<std::size_t>(ld / 8);
    if (mask_bytes <= row_bytes)
      return {has_bias ? LinearEpilogue::relu_aux_bias : LinearEpilogue::relu_aux, ld, mask_bytes};
    return {has_bias ? LinearEpilogue::relu_bias : LinearEpilogue::relu, 0, 0};
  }
  if (kind == Activation::gelu_tanh && width % 8 == 0)
    return {has_bias ? LinearEpilogue::gelu_aux_bias : LinearEpilogue::gelu_aux, width, row_bytes};
  return {};
}

// Whether the backend folds `kind` into the forward product at all (for some widths): relu and gelu(tanh).
constexpr bool folds_activation(Activation kind) { return kind == Activation::relu || kind == Activation::gelu_tanh; }

// The backward epilogue of the product dx = dy W that feeds `kind`'s backward, given the forward's choice; none: the
// product, then the activation's backward kernel (relu on its output, gelu on the pre-activation).
constexpr ActivationGradientEpilogue activation_gradient_epilogue(LinearEpilogue forward) {
  switch (forward) {
    case LinearEpilogue::relu_aux:
    case LinearEpilogue::relu_aux_bias:
      return ActivationGradientEpilogue::drelu;
    case LinearEpilogue::gelu_aux:
    case LinearEpilogue::gelu_aux_bias:
      return ActivationGradientEpilogue::dgelu;
    default:
      return ActivationGradientEpilogue::none;
  }
}

}  // namespace hpctrain::cuda
