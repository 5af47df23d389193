// Helpers shared by the layer source files of src/nn (not part of the public headers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hpctrain/nn/layer.hpp"

namespace hpctrain::nn_detail {

// PyTorch's default initialisation of linear and conv layers: kaiming_uniform(a = sqrt(5)) for the weight and
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias are both U(-bound, bound) with bound = 1/sqrt(fan_in). Parameter p
// of layer `layer_index` draws from its own counter-based stream, so the values do not depend on the rank count.
void fill_uniform(float* host_master, const std::vector<ParameterSpec>& parameters, std::uint64_t seed,
                  std::uint32_t layer_index, std::int64_t fan_in);

// conv2d/3d, max/avg pooling 2d/3d, global_avgpool, flatten, groupnorm; null for other types.
std::unique_ptr<Layer> make_spatial_layer(const LayerSpec& spec, const SampleShape& input_shape,
                                          const std::string& deck_location, SpatialLayout layout);

// Incremental decoding of a causal attention on host memory: new position first + i (row i of qkv, (count, 3C): q,
// k, v) attends to positions [0, first + i] of `cache` ((T, 2C) in qkv's dtype: each position's k then v, the new
// positions' rows already written); out (count, C). Scores and softmax in fp32 (fp64 for f64), as the fused kernel.
void cached_attention(const AttentionGeometry& geometry, const TensorView& qkv, const void* cache, std::int64_t first,
                      const TensorView& out);

}  // namespace hpctrain::nn_detail
