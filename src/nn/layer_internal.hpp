// Helpers shared by the layer source files of src/nn (not part of the public headers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/nn/layer.hpp"

namespace hpctrain::nn_detail {

inline TensorView matrix(void* data, DType dtype, std::int64_t rows, std::int64_t cols) {
  return {data, dtype, rows, cols};
}

// A batch of (rows, positions * width) activations seen as (rows * positions, width): the view a layer acting on the
// last axis of a sequence works on (the same view when positions is 1).
inline TensorView last_axis(const TensorView& view, std::int64_t width) {
  return {view.data, view.dtype, view.rows * (view.cols / width), width};
}

// PyTorch's default initialisation of linear and conv layers: kaiming_uniform(a = sqrt(5)) for the weight and
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias are both U(-bound, bound) with bound = 1/sqrt(fan_in). Parameter p
// of layer `layer_index` draws from its own counter-based stream, so the values do not depend on the rank count.
void fill_uniform(float* host_master, const std::vector<ParameterSpec>& parameters, std::uint64_t seed,
                  std::uint32_t layer_index, std::int64_t fan_in);

// normal(0, std) by Box-Muller on pairs of the counter-based uniforms of stream `stream` (`count` values), the same
// values on every rank count.
void fill_normal(float* values, std::int64_t count, std::uint64_t seed, std::uint32_t stream, double std);
// The stream of parameter p of layer `layer_index` (each tensor its own).
constexpr std::uint32_t init_stream(std::uint32_t layer_index, std::size_t parameter) {
  return layer_index * 8 + static_cast<std::uint32_t>(parameter);
}

// conv2d/3d, max/avg pooling 2d/3d, global_avgpool, flatten, groupnorm; null for other types.
std::unique_ptr<Layer> make_spatial_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                          const std::string& deck_location, SpatialLayout layout);

// to_sequence (to_sequence_layer.cpp): a (C, H, W) or (C, D, H, W) map in `layout` order to a (T, C) sequence.
std::unique_ptr<Layer> make_to_sequence_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                              const std::string& deck_location, SpatialLayout layout, bool sequence);

// Multi-head self-attention (attention_layer.cpp): on a sequence only (sequence: as make_layer's).
std::unique_ptr<Layer> make_attention_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                            const std::string& deck_location, bool sequence);

}  // namespace hpctrain::nn_detail
