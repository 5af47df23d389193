// Backend::cached_attention on the CUDA backend (cuda_cached_attention.cu): one-query attention over a key/value
// cache in device memory, for incremental decoding. Private to src/kernels/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hpctrain/kernels/backend.hpp"

namespace hpctrain::cuda {

// The contract of Backend::cached_attention: storage f32/bf16/f16 (f64 is refused, as everywhere on this backend),
// any cache length, head_dim up to 4096 (the shared memory of one block; NotSupported beyond).
void cached_attention(cudaStream_t stream, const AttentionGeometry& geometry, const TensorView& qkv, void* cache,
                      std::int64_t first, const TensorView& out);

}  // namespace hpctrain::cuda
