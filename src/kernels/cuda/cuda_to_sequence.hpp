// A conv feature map turned into a sequence on the CUDA backend (a vision transformer's patch tokens), with the
// contracts of Backend::to_sequence_forward/backward. Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// class_token: null or f32 (channels); positions: null or f32 (sequence, channels).
void to_sequence_forward(cudaStream_t stream, std::int64_t channels, SpatialLayout layout, const TensorView& x,
                         const float* class_token, const float* positions, const TensorView& y);
// dclass_token: null or f32 (channels); dpositions: null or f32 (sequence, channels); dx.data may be null.
void to_sequence_backward(cudaStream_t stream, std::int64_t channels, SpatialLayout layout, const TensorView& dy,
                          const TensorView& dx, float* dclass_token, float* dpositions, bool accumulate);

}  // namespace hpctrain::cuda
