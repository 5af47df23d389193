// The CUDA backend's convolution formats (issue 15, item 11), as pure functions (host-only, tested on the CPU in
// tests/unit/cuda_host_logic_test.cpp).
//
// - Layout: 16-bit models run their conv stacks channels-last (NHWC / NDHWC), the layout of cuDNN's tensor-core
//   kernels, so cuDNN inserts no transposes; fp32 models keep channels-first (their FMA kernels need no tensor-core
//   layout, and that path is the one checked against the CPU so far).
// - cuDNN descriptors keep the N, C, D, H, W dimension order; channels-last is expressed by the strides (C fastest),
//   and the filters by CUDNN_TENSOR_NHWC (K, R, S, C: the weights transposed from PyTorch's (K, C, R, S) on each call;
//   they are small).
// - Weight gradients of 16-bit data: 16-bit x and dy with an fp32 filter gradient first (no widened copies); where
//   cuDNN refuses that mix, fp32 on widened copies as before.
// - Bias: fused into the forward (cudnnConvolutionBiasActivationForward with the identity activation) when the plan's
//   algorithm is IMPLICIT_PRECOMP_GEMM, the only one cuDNN allows with an identity activation; otherwise broadcast
//   into y and accumulated onto.
#pragma once

#include <array>
#include <cstdint>

#include "hpctrain/core/tensor.hpp"
#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

constexpr SpatialLayout convolution_layout(DType activations) {
  return activations == DType::bf16 || activations == DType::f16 ? SpatialLayout::channels_last
                                                                 : SpatialLayout::channels_first;
}

// Whether a 16-bit weight gradient tries the 16-bit inputs with an fp32 output before widened copies.
constexpr bool mixed_weight_gradient(DType storage) { return storage == DType::bf16 || storage == DType::f16; }

// Strides of a (rows, channels, spatial...) tensor in cuDNN's N, C, D, H, W dimension order (2 + dimensions of
// them), for the data stored in `layout`.
constexpr std::array<std::int64_t, 5> tensor_strides(SpatialLayout layout, std::int64_t channels,
                                                     const std::array<std::int64_t, 3>& spatial, int dimensions) {
  std::array<std::int64_t, 5> strides{};
  std::int64_t positions = 1;
  for (int axis = 0; axis < dimensions; ++axis) positions *= spatial[static_cast<std::size_t>(axis)];
  if (layout == SpatialLayout::channels_first) {
    std::int64_t stride = 1;
    for (int axis = dimensions - 1; axis >= 0; --axis) {
      strides[static_cast<std::size_t>(2 + axis)] = stride;
      stride *= spatial[static_cast<std::size_t>(axis)];
    }
    strides[1] = positions;
    strides[0] = positions * channels;
  } else {
    std::int64_t stride = channels;
    for (int axis = dimensions - 1; axis >= 0; --axis) {
      strides[static_cast<std::size_t>(2 + axis)] = stride;
      stride *= spatial[static_cast<std::size_t>(axis)];
    }
    strides[1] = 1;
    strides[0] = positions * channels;
  }
  return strides;
}

}  // namespace hpctrain::cuda
